"""LLaDA written here: loads the published LLaDA-8B-Instruct / -Base / LLaDA-1.5 weights without running their code.

The published checkpoints ship an OLMo-derived ``modeling_llada.py`` that only runs as remote code, pins an old
transformers, takes no KV cache through its ``LLaDAModelLM`` (which drops ``past_key_values``) and has no gradient
checkpointing of its own. This module is the same network in ~200 lines, written from the architecture (LLaDA,
arXiv:2502.09992; a Llama-style bidirectional transformer), with the published parameter names so the safetensors
load unchanged:

    model.transformer.wte                      token embedding [embedding_size, d_model]
    model.transformer.blocks.<i>.attn_norm     RMSNorm before attention (float32 statistics)
    model.transformer.blocks.<i>.{q,k,v}_proj  attention projections (grouped-query when n_kv_heads < n_heads)
    model.transformer.blocks.<i>.attn_out      attention output projection
    model.transformer.blocks.<i>.ff_norm       RMSNorm before the MLP
    model.transformer.blocks.<i>.{ff,up}_proj  SwiGLU: silu(ff_proj x) * up_proj x
    model.transformer.blocks.<i>.ff_out        MLP output projection
    model.transformer.ln_f                     final RMSNorm
    model.transformer.ff_out                   output head (absent when weight_tying: the embedding is reused)

What it adds: explicit ``position_ids`` (RoPE at any position, so a dual cache works), a boolean or additive
attention mask of any [B, 1, Q, K] pattern, keys cached after RoPE, and per-block activation checkpointing
(:data:`LLaDANativeModel._no_split_modules` names the block class FSDP wraps). Only the structure the published
LLaDA checkpoints use is built (llama blocks, RMSNorm, SiLU-gated MLP, RoPE, no ALiBi, no block groups); any other
setting in a ``config.json`` is one error line naming it.
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

# config.json settings of the published checkpoints this module implements; anything else is refused.
SUPPORTED = {
    "block_type": ("llama",),
    "layer_norm_type": ("rms",),
    "activation_type": ("silu",),
    "rope": (True,),
    "alibi": (False, None),
    "block_group_size": (1, None),
    "attention_layer_norm": (False, None),
    "multi_query_attention": (False, None),
    "input_emb_norm": (False, None),
    "include_bias": (False, None),
    "include_qkv_bias": (False, None),
    "bias_for_layer_norm": (False, None),
    "layer_norm_with_affine": (True, None),
    "rope_full_precision": (True, None),
    "attention_dropout": (0.0, None),
    "residual_dropout": (0.0, None),
    "embedding_dropout": (0.0, None),
}


class LLaDANativeConfig(PretrainedConfig):
    """The fields of LLaDA's ``config.json`` this implementation reads (the file's other fields are kept)."""

    # the published name, so a saved checkpoint (a trained policy) is a LLaDA folder again; never registered with
    # transformers' AutoConfig, so it cannot shadow the checkpoint's own code for `implementation="remote"`
    model_type = "llada"

    def __init__(
        self,
        d_model: int = 4096,
        n_heads: int = 32,
        n_kv_heads: int | None = None,
        n_layers: int = 32,
        mlp_hidden_size: int | None = None,
        mlp_ratio: int = 4,
        vocab_size: int = 126464,
        embedding_size: int | None = None,
        max_sequence_length: int = 4096,
        rms_norm_eps: float = 1e-5,
        rope_theta: float = 10000.0,
        weight_tying: bool = False,
        scale_logits: bool = False,
        mask_token_id: int = 126336,
        **kwargs: Any,
    ) -> None:
        self.d_model, self.n_heads, self.n_layers = d_model, n_heads, n_layers
        self.n_kv_heads = n_kv_heads or n_heads
        self.mlp_hidden_size = mlp_hidden_size or mlp_ratio * d_model
        self.mlp_ratio = mlp_ratio
        self.embedding_size = embedding_size or vocab_size
        self.max_sequence_length = max_sequence_length
        self.rms_norm_eps, self.rope_theta = rms_norm_eps, rope_theta
        self.weight_tying, self.scale_logits = weight_tying, scale_logits
        self.mask_token_id = mask_token_id
        kwargs.pop("tie_word_embeddings", None)  # a saved config repeats weight_tying under transformers' name
        super().__init__(vocab_size=vocab_size, tie_word_embeddings=weight_tying, **without_attention_choice(kwargs))
        require_supported("LLaDA", kwargs, SUPPORTED)
        if d_model % n_heads or n_heads % self.n_kv_heads:
            raise UserError(f"native LLaDA: d_model {d_model}, n_heads {n_heads}, n_kv_heads {self.n_kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class LLaDALlamaBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + ff_out(silu(ff_proj(.)) * up_proj(.)) of norm of that."""

    def __init__(self, config: LLaDANativeConfig) -> None:
        super().__init__()
        self.config = config
        d, kv = config.d_model, config.n_kv_heads * config.head_dim
        self.attn_norm = RMSNorm(d, config.rms_norm_eps)
        self.ff_norm = RMSNorm(d, config.rms_norm_eps)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv, bias=False)
        self.v_proj = nn.Linear(d, kv, bias=False)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_proj = nn.Linear(d, config.mlp_hidden_size, bias=False)
        self.up_proj = nn.Linear(d, config.mlp_hidden_size, bias=False)
        self.ff_out = nn.Linear(config.mlp_hidden_size, d, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        positions: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        cfg = self.config
        batch, length, _ = x.shape
        h = self.attn_norm(x)

        def heads(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.view(batch, length, n, cfg.head_dim).transpose(1, 2)

        q = rope(heads(self.q_proj(h), cfg.n_heads), positions, cfg.rope_theta)
        k = rope(heads(self.k_proj(h), cfg.n_kv_heads), positions, cfg.rope_theta)
        attended, present = attend(q, k, heads(self.v_proj(h), cfg.n_kv_heads), mask, past)
        x = x + self.attn_out(attended)
        h = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h)), present


class LLaDATransformer(nn.Module):
    def __init__(self, config: LLaDANativeConfig) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.embedding_size, config.d_model),
                "blocks": nn.ModuleList(LLaDALlamaBlock(config) for _ in range(config.n_layers)),
                "ln_f": RMSNorm(config.d_model, config.rms_norm_eps),
            }
        )
        if not config.weight_tying:
            self.transformer["ff_out"] = nn.Linear(config.d_model, config.embedding_size, bias=False)


class LLaDANativeModel(NativeDiffusionModel):
    """LLaDA's network under the published parameter names (``model.transformer...``), see the module docstring."""

    config_class = LLaDANativeConfig
    base_model_prefix = "model"
    _no_split_modules: ClassVar[list[str]] = ["LLaDALlamaBlock"]

    def __init__(self, config: LLaDANativeConfig) -> None:
        super().__init__(config)
        self.model = LLaDATransformer(config)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.transformer["wte"]

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.transformer["wte"] = value

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
        """Logits [B, Q, V] for ``input_ids`` [B, Q] (``logits_to_keep``: of those positions only).

        ``attention_mask``: None (every query sees every key), a [B, K] key-padding mask, or a [B, 1, Q, K] pattern
        (boolean, True = attend, or additive); K counts cached keys first. ``position_ids`` [B, Q] default to the
        positions after the cache. With ``use_cache`` the output carries each block's (rotated keys, values).
        """
        transformer = self.model.transformer
        x, present = self.run_blocks(
            transformer["wte"](input_ids), transformer["blocks"], attention_mask, position_ids, past_key_values
        )
        x = transformer["ln_f"](x if logits_to_keep is None else x[:, logits_to_keep])
        head = transformer["wte"].weight if self.config.weight_tying else transformer["ff_out"].weight
        logits = F.linear(x, head)
        if self.config.scale_logits:
            logits = logits / self.config.d_model**0.5
        return NativeOutput(logits=logits, past_key_values=present if use_cache else None)


__all__ = ["LLaDALlamaBlock", "LLaDANativeConfig", "LLaDANativeModel", "rope"]
