"""Dream written here: loads the published Dream-v0 (7B Base / Instruct) weights without running their code.

Dream (arXiv:2508.15487) is a Qwen2.5 network run bidirectionally as a masked diffusion model, initialised from an
autoregressive model, so its logits at position i predict the token at i + 1 (the backend shifts them). The
published ``modeling_dream.py`` runs only as remote code on a pinned transformers; this is the same network with the
published parameter names, so the safetensors load unchanged:

    model.embed_tokens                                   token embedding
    model.layers.<i>.input_layernorm                     RMSNorm before attention
    model.layers.<i>.self_attn.{q,k,v}_proj (+ bias)     attention projections (grouped-query)
    model.layers.<i>.self_attn.o_proj                    attention output, no bias
    model.layers.<i>.post_attention_layernorm            RMSNorm before the MLP
    model.layers.<i>.mlp.{gate,up,down}_proj             SiLU-gated MLP
    model.norm, lm_head                                  final norm and output head (tied when configured)

RoPE is applied in the model's dtype, as Qwen2 does; explicit ``position_ids``, a boolean or additive [B, 1, Q, K]
mask and keys cached after RoPE, as the LLaDA implementation (:mod:`.llada`). Only the published structure is
built (SiLU, no RoPE scaling, no sliding window); another setting is one error line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from stabledrl_bench.core.models.layers import KVCache, RMSNorm, attend, key_mask, rope
from stabledrl_bench.errors import UserError

SUPPORTED = {
    "hidden_act": ("silu",),
    "rope_scaling": (None,),
    "use_sliding_window": (False, None),
    "attention_dropout": (0.0, None),
}


class DreamNativeConfig(PretrainedConfig):
    """The fields of Dream's ``config.json`` this implementation reads (the file's other fields are kept)."""

    model_type = "dream_native"

    def __init__(
        self,
        vocab_size: int = 152064,
        hidden_size: int = 3584,
        intermediate_size: int = 18944,
        num_hidden_layers: int = 28,
        num_attention_heads: int = 28,
        num_key_value_heads: int | None = 4,
        max_position_embeddings: int = 131072,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 1000000.0,
        tie_word_embeddings: bool = False,
        mask_token_id: int = 151666,
        **kwargs: Any,
    ) -> None:
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.max_position_embeddings, self.rms_norm_eps, self.rope_theta = (
            max_position_embeddings,
            rms_norm_eps,
            rope_theta,
        )
        self.mask_token_id = mask_token_id
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        for key, allowed in SUPPORTED.items():
            if kwargs.get(key, allowed[0]) not in allowed:
                raise UserError(f"native Dream: {key}={kwargs[key]!r} is not built here (supported: {allowed[0]!r})")
        if hidden_size % num_attention_heads or num_attention_heads % self.num_key_value_heads:
            raise UserError(
                f"native Dream: hidden {hidden_size}, heads {num_attention_heads}/{self.num_key_value_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass
class DreamOutput(ModelOutput):
    logits: torch.Tensor | None = None
    past_key_values: KVCache | None = None


class DreamAttention(nn.Module):
    def __init__(self, config: DreamNativeConfig) -> None:
        super().__init__()
        self.config = config
        d, kv = config.hidden_size, config.num_key_value_heads * config.head_dim
        self.q_proj = nn.Linear(d, d, bias=True)
        self.k_proj = nn.Linear(d, kv, bias=True)
        self.v_proj = nn.Linear(d, kv, bias=True)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x, mask, positions, past):
        cfg = self.config
        batch, length, _ = x.shape

        def heads(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.view(batch, length, n, cfg.head_dim).transpose(1, 2)

        q = rope(heads(self.q_proj(x), cfg.num_attention_heads), positions, cfg.rope_theta, float32=False)
        k = rope(heads(self.k_proj(x), cfg.num_key_value_heads), positions, cfg.rope_theta, float32=False)
        attended, present = attend(q, k, heads(self.v_proj(x), cfg.num_key_value_heads), mask, past)
        return self.o_proj(attended), present


class DreamMLP(nn.Module):
    def __init__(self, config: DreamNativeConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DreamDecoderLayer(nn.Module):
    def __init__(self, config: DreamNativeConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DreamAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DreamMLP(config)

    def forward(self, x, mask, positions, past):
        attended, present = self.self_attn(self.input_layernorm(x), mask, positions, past)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), present


class DreamBody(nn.Module):
    def __init__(self, config: DreamNativeConfig) -> None:
        super().__init__()
        # the published file gives the embedding a padding row (its gradient is zero), so this does too
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.layers = nn.ModuleList(DreamDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DreamNativeModel(PreTrainedModel):
    """Dream's network under the published parameter names (``model.layers...``, ``lm_head``)."""

    config_class = DreamNativeConfig
    base_model_prefix = "model"
    _no_split_modules: ClassVar[list[str]] = ["DreamDecoderLayer"]
    _tied_weights_keys: ClassVar[list[str]] = ["lm_head.weight"]
    supports_gradient_checkpointing = True

    def __init__(self, config: DreamNativeConfig) -> None:
        super().__init__(config)
        self.model = DreamBody(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.gradient_checkpointing = False
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    def _set_gradient_checkpointing(self, enable: bool = True, gradient_checkpointing_func: Any = None) -> None:
        self.gradient_checkpointing = enable

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        **_: Any,
    ) -> DreamOutput:
        """Logits [B, Q, V] for ``input_ids`` [B, Q] (unshifted: position i predicts token i + 1); arguments as
        :meth:`stabledrl_bench.core.models.llada.LLaDANativeModel.forward`."""
        batch, length = input_ids.shape
        past_len = past_key_values[0][0].shape[2] if past_key_values else 0
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + length, device=input_ids.device).expand(batch, length)
        mask = key_mask(attention_mask)
        x = self.model.embed_tokens(input_ids)
        present: KVCache = []
        for i, layer in enumerate(self.model.layers):
            past = past_key_values[i] if past_key_values else None
            if self.gradient_checkpointing and self.training:
                x, kv = checkpoint(layer, x, mask, position_ids, past, use_reentrant=False)
            else:
                x, kv = layer(x, mask, position_ids, past)
            present.append(kv)
        logits = self.lm_head(self.model.norm(x))
        return DreamOutput(logits=logits, past_key_values=present if use_cache else None)


__all__ = ["DreamDecoderLayer", "DreamNativeConfig", "DreamNativeModel", "DreamOutput"]
