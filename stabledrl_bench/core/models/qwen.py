"""Dream and SDAR written here: the published Dream-v0 (7B) and SDAR / TraDo weights load without running their code.

Both are Qwen networks run as masked diffusion models. **Dream** (arXiv:2508.15487) is Qwen2.5 run bidirectionally,
initialised from an autoregressive model, so its logits at position i predict the token at i + 1 (its backend
shifts them). **SDAR** (SDAR-8B-Chat, TraDo; github.com/JetAstra/SDAR) is Qwen3 (per-head RMSNorm of queries and
keys, an explicit head size) run block-causally for block diffusion. The published ``modeling_dream.py`` and
``modeling_sdar.py`` run only as remote code on a pinned transformers (SDAR's imports are gone from 4.54 on); this
is the same network with the published parameter names, so the safetensors load unchanged:

    model.embed_tokens                                   token embedding
    model.layers.<i>.input_layernorm                     RMSNorm before attention
    model.layers.<i>.self_attn.{q,k,v}_proj              attention projections (grouped-query; Dream: with bias)
    model.layers.<i>.self_attn.{q,k}_norm                SDAR: RMSNorm of each query / key head before RoPE
    model.layers.<i>.self_attn.o_proj                    attention output, no bias
    model.layers.<i>.post_attention_layernorm            RMSNorm before the MLP
    model.layers.<i>.mlp.{gate,up,down}_proj             SiLU-gated MLP
    model.norm, lm_head                                  final norm and output head (tied when configured)

RoPE is applied in the model's dtype, as Qwen does; explicit ``position_ids``, a boolean or additive [B, 1, Q, K]
mask (SDAR's block-causal pattern comes from the sampler and estimators) and keys cached after RoPE, as the LLaDA
implementation (:mod:`.llada`). Only the published structure is built (SiLU, no RoPE scaling, no sliding window);
another setting is one error line naming it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from stabledrl_bench.core.models.layers import (
    KVCache,
    NativeDiffusionModel,
    NativeOutput,
    RMSNorm,
    attend,
    require_supported,
    rope,
    without_attention_choice,
)
from stabledrl_bench.errors import UserError

SUPPORTED = {
    "hidden_act": ("silu",),
    "rope_scaling": (None,),
    "use_sliding_window": (False, None),
    "attention_dropout": (0.0, None),
}


class QwenDiffusionConfig(PretrainedConfig):
    """The fields of a Dream / SDAR ``config.json`` this implementation reads (the file's other fields are kept).
    Subclasses fix the family's structure: ``qkv_bias`` (Dream) and ``qk_norm`` (SDAR)."""

    model_type = "qwen_diffusion_native"
    family = "Qwen"
    qkv_bias = False
    qk_norm = False

    def __init__(
        self,
        vocab_size: int = 152064,
        hidden_size: int = 3584,
        intermediate_size: int = 18944,
        num_hidden_layers: int = 28,
        num_attention_heads: int = 28,
        num_key_value_heads: int | None = 4,
        head_dim: int | None = None,
        max_position_embeddings: int = 131072,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 1000000.0,
        tie_word_embeddings: bool = False,
        mask_token_id: int = 151666,
        pad_token_id: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.pad_token_id = pad_token_id  # a field of its own: transformers 5's base config no longer has one
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.max_position_embeddings, self.rms_norm_eps = max_position_embeddings, rms_norm_eps
        self.rope_theta, self.mask_token_id = rope_theta, mask_token_id
        # not named head_dim (transformers 5 gives that name a meaning of its own on configs), and set before the
        # base __init__, which is what transformers 5 keeps
        self.head_size = head_dim or hidden_size // num_attention_heads
        super().__init__(tie_word_embeddings=tie_word_embeddings, **without_attention_choice(kwargs))
        require_supported(self.family, kwargs, SUPPORTED)
        if num_attention_heads % self.num_key_value_heads:
            raise UserError(f"native {self.family}: {num_attention_heads} heads, {self.num_key_value_heads} kv heads")


class DreamNativeConfig(QwenDiffusionConfig):
    model_type = "Dream"  # the published name (see LLaDANativeConfig.model_type)
    family = "Dream"
    qkv_bias = True

    def __init__(self, **kwargs: Any) -> None:
        # its own __init__, though it only delegates: transformers 5 turns a config class without one into a
        # dataclass whose generated __init__ skips the parent's, so head_size and the checks would be lost
        super().__init__(**kwargs)


class SDARNativeConfig(QwenDiffusionConfig):
    model_type = "sdar"  # the published name
    family = "SDAR"
    qk_norm = True

    def __init__(
        self, attention_bias: bool = False, block_size: int | None = None, mask_token_id: int = 151669, **kwargs: Any
    ) -> None:
        self.qkv_bias = attention_bias
        self.block_size = block_size or kwargs.get("block_length") or 4  # the published files name it either way
        super().__init__(mask_token_id=mask_token_id, **kwargs)


class QwenAttention(nn.Module):
    def __init__(self, config: QwenDiffusionConfig) -> None:
        super().__init__()
        self.config = config
        d, head = config.hidden_size, config.head_size
        q, kv = config.num_attention_heads * head, config.num_key_value_heads * head
        self.q_proj = nn.Linear(d, q, bias=config.qkv_bias)
        self.k_proj = nn.Linear(d, kv, bias=config.qkv_bias)
        self.v_proj = nn.Linear(d, kv, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q, d, bias=False)
        self.q_norm = RMSNorm(head, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(head, config.rms_norm_eps) if config.qk_norm else None

    def forward(self, x, mask, positions, past):
        cfg = self.config
        batch, length, _ = x.shape

        def heads(t: torch.Tensor, n: int, norm: nn.Module | None = None) -> torch.Tensor:
            t = t.view(batch, length, n, cfg.head_size)
            return (t if norm is None else norm(t)).transpose(1, 2)

        q = rope(heads(self.q_proj(x), cfg.num_attention_heads, self.q_norm), positions, cfg.rope_theta, float32=False)
        k = rope(heads(self.k_proj(x), cfg.num_key_value_heads, self.k_norm), positions, cfg.rope_theta, float32=False)
        attended, present = attend(q, k, heads(self.v_proj(x), cfg.num_key_value_heads), mask, past)
        return self.o_proj(attended), present


class QwenMLP(nn.Module):
    def __init__(self, config: QwenDiffusionConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class QwenDecoderLayer(nn.Module):
    def __init__(self, config: QwenDiffusionConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = QwenAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = QwenMLP(config)

    def forward(self, x, mask, positions, past):
        attended, present = self.self_attn(self.input_layernorm(x), mask, positions, past)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), present


class QwenBody(nn.Module):
    def __init__(self, config: QwenDiffusionConfig) -> None:
        super().__init__()
        # the published files give the embedding a padding row (its gradient is zero), so this does too
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.layers = nn.ModuleList(QwenDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class QwenDiffusionModel(NativeDiffusionModel):
    """The Dream / SDAR network under the published parameter names (``model.layers...``, ``lm_head``)."""

    config_class = QwenDiffusionConfig
    base_model_prefix = "model"
    _no_split_modules: ClassVar[list[str]] = ["QwenDecoderLayer"]
    # target -> source, the form transformers 5 requires (4.5x iterates the keys)
    _tied_weights_keys: ClassVar[dict[str, str]] = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: QwenDiffusionConfig) -> None:
        super().__init__(config)
        self.model = QwenBody(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.gradient_checkpointing = False
        self.post_init()

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
        logits_to_keep: slice | None = None,
        **_: Any,
    ) -> NativeOutput:
        """Logits [B, Q, V] for ``input_ids`` [B, Q] (Dream's unshifted: position i predicts token i + 1);
        arguments as :meth:`stabledrl_bench.core.models.llada.LLaDANativeModel.forward`."""
        x, present = self.run_blocks(
            self.model.embed_tokens(input_ids), self.model.layers, attention_mask, position_ids, past_key_values
        )
        logits = self.lm_head(self.model.norm(x if logits_to_keep is None else x[:, logits_to_keep]))
        return NativeOutput(logits=logits, past_key_values=present if use_cache else None)


class DreamNativeModel(QwenDiffusionModel):
    config_class = DreamNativeConfig


class SDARNativeModel(QwenDiffusionModel):
    config_class = SDARNativeConfig


__all__ = [
    "DreamNativeConfig",
    "DreamNativeModel",
    "QwenDecoderLayer",
    "QwenDiffusionModel",
    "SDARNativeConfig",
    "SDARNativeModel",
]
