"""A tiny LLaDA-like masked-diffusion transformer, written for CPU tests and the `tiny` preset.

Same ingredients as LLaDA-8B (bidirectional attention, RoPE, RMSNorm, SwiGLU, no causal mask), a few hundred
thousand parameters instead of eight billion, so every code path of the harness (samplers, estimators, the RL
trainer) runs on a laptop exactly as it would on the real model.

The model itself is mask-agnostic: the caller passes the attention pattern. Full attention is a key-padding
mask; block diffusion (SDAR-style) passes a block-causal 4-D mask built by :mod:`stabledrl_bench.core.masks`. The
config's ``attention_kind`` and ``block_size`` only tell samplers and estimators which pattern to build.

An optional KV cache (post-RoPE keys and values of earlier positions) makes block-diffusion decoding exact
and cheap: finished blocks never attend to later ones, so their keys and values never change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from stabledrl_bench.core.models.conventions import emulate

KVCache = list[tuple[torch.Tensor, torch.Tensor]]

# "native" is the model's own convention; the others emulate published families (models/conventions.py).
CONVENTIONS = ("native", "llada-hub", "llada", "dream", "sdar-chat", "sdar-trado", "broken")


class TinyDLMConfig(PretrainedConfig):
    """Configuration of :class:`TinyDLM`; field names follow Llama/LLaDA conventions.

    ``convention`` makes the model speak a published family's calling convention instead of its own (see
    :mod:`stabledrl_bench.core.models.conventions`), so every backend can be tested without downloading that family.
    """

    model_type = "stabledrl_tiny_dlm"

    def __init__(
        self,
        vocab_size: int = 112,
        hidden_size: int = 128,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        intermediate_size: int = 352,
        max_position_embeddings: int = 2048,
        rope_theta: float = 10000.0,
        rms_norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        mask_token_id: int = 3,
        attention_kind: str = "full",
        block_size: int = 4,
        convention: str = "native",
        **kwargs,
    ) -> None:
        if attention_kind not in ("full", "block"):
            raise ValueError(f"attention_kind must be 'full' or 'block', got {attention_kind!r}")
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {', '.join(CONVENTIONS)}, got {convention!r}")
        if hidden_size % num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.mask_token_id = mask_token_id
        self.attention_kind = attention_kind
        self.block_size = block_size
        self.convention = convention
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)


@dataclass
class TinyDLMOutput(ModelOutput):
    """Logits for every input position, plus the updated KV cache when ``use_cache`` was set."""

    logits: torch.Tensor | None = None
    kv_cache: KVCache | None = None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_tables(position_ids: torch.Tensor, dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """cos/sin tables [B or 1, 1, Q, D] for integer positions [B, Q]; computed once per forward for all layers.

    Rows with identical positions (the usual case) share one table, so the cost does not grow with the batch.
    """
    if position_ids.shape[0] > 1 and bool((position_ids == position_ids[:1]).all()):
        position_ids = position_ids[:1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=position_ids.device, dtype=torch.float32) / dim))
    freqs = position_ids.to(torch.float32)[..., None] * inv_freq  # [B, Q, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, Q, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` [B, H, Q, D] with precomputed tables (see :func:`rope_tables`)."""
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, config: TinyDLMConfig) -> None:
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, q_len, _ = x.shape
        q, k, v = self.qkv(x).view(b, q_len, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q = apply_rope(q, *rope)
        k = apply_rope(k, *rope)
        if past is not None:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # bool (True = attend) or additive float
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1)), (k, v)


class SwiGLU(nn.Module):
    def __init__(self, config: TinyDLMConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: TinyDLMConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x, rope, mask, past):
        h, kv = self.attn(self.attn_norm(x), rope, mask, past)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), kv


def _expand_mask(
    attention_mask: torch.Tensor | None, batch: int, q_len: int, k_len: int, device: torch.device
) -> torch.Tensor | None:
    """Boolean [B, 1, Q, K] mask (True = attend) from a [B, K] key-padding mask or a [B, 1|H, Q, K] mask.

    A query row with no visible key would give NaN; such rows (only left-pad queries can have them) are
    allowed to see every key instead, which keeps them finite and never affects real positions.
    """
    if attention_mask is None:
        return None
    mask = attention_mask.to(device=device, dtype=torch.bool)
    if mask.dim() == 2:
        if mask.shape != (batch, k_len):
            raise ValueError(f"2-D attention_mask must be [batch, keys]=[{batch}, {k_len}], got {tuple(mask.shape)}")
        mask = mask[:, None, None, :].expand(batch, 1, q_len, k_len)
    elif mask.dim() != 4 or mask.shape[-2:] != (q_len, k_len):
        raise ValueError(f"4-D attention_mask must end in [queries, keys]=[{q_len}, {k_len}], got {tuple(mask.shape)}")
    return mask | ~mask.any(dim=-1, keepdim=True)


class TinyDLM(PreTrainedModel):
    """Bidirectional masked-diffusion transformer: logits for every position given a partially masked input."""

    config_class = TinyDLMConfig
    base_model_prefix = "tiny_dlm"
    # Activation checkpointing is the harness's, for every family alike (training/distributed.py), not the model's.
    supports_gradient_checkpointing = False
    _no_split_modules: ClassVar[list[str]] = ["Block"]

    def __init__(self, config: TinyDLMConfig) -> None:
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed = value

    def forward(self, input_ids: torch.Tensor, **kwargs: object) -> TinyDLMOutput:
        """Logits for ``input_ids`` [B, Q] in the configured convention (``native``: :meth:`native_forward`)."""
        if self.config.convention == "native":
            return self.native_forward(input_ids, **kwargs)  # type: ignore[arg-type]
        return emulate(self, input_ids, **kwargs)

    def native_forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        use_cache: bool = False,
        logits_to_keep: slice | None = None,
        **_: object,
    ) -> TinyDLMOutput:
        """Logits [B, Q, V] for ``input_ids`` [B, Q] (``logits_to_keep``: of those positions only).

        ``attention_mask`` covers every key (cached ones first): [B, K] key padding or [B, 1, Q, K] boolean.
        ``position_ids`` default to positions following the cache. With ``use_cache`` the returned cache holds
        the keys/values of the cached positions plus these ones.
        """
        past_len = kv_cache[0][0].shape[2] if kv_cache else 0
        batch, q_len = input_ids.shape
        mask = _expand_mask(attention_mask, batch, q_len, past_len + q_len, input_ids.device)
        logits, cache = self.run(input_ids, mask, position_ids, kv_cache, logits_to_keep)
        return TinyDLMOutput(logits=logits, kv_cache=cache if use_cache else None)

    def run(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        kv_cache: KVCache | None = None,
        logits_to_keep: slice | None = None,
    ) -> tuple[torch.Tensor, KVCache]:
        """The network itself: logits (of the ``logits_to_keep`` positions only, when given) and every layer's
        keys/values (cached ones included).

        ``mask`` is what SDPA takes, [B, 1, Q, K]: boolean (True = attend), additive float, or None.
        """
        batch, q_len = input_ids.shape
        past_len = kv_cache[0][0].shape[2] if kv_cache else 0
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + q_len, device=input_ids.device).expand(batch, q_len)
        if int(position_ids.max()) >= self.config.max_position_embeddings:
            raise ValueError(
                f"position {int(position_ids.max())} exceeds max_position_embeddings="
                f"{self.config.max_position_embeddings}"
            )
        h = self.embed(input_ids)
        head_dim = self.config.hidden_size // self.config.num_attention_heads
        rope = rope_tables(position_ids, head_dim, self.config.rope_theta, h.dtype)
        if mask is not None and mask.is_floating_point():
            mask = mask.to(h.dtype)
        new_cache: KVCache = []
        for i, layer in enumerate(self.layers):
            past = kv_cache[i] if kv_cache else None
            h, kv = layer(h, rope, mask, past)
            new_cache.append(kv)
        return self.lm_head(self.norm(h if logits_to_keep is None else h[:, logits_to_keep])), new_cache

    def num_parameters_human(self) -> str:
        n = sum(p.numel() for p in self.parameters())
        return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def default_tiny_config(
    vocab_size: int,
    mask_token_id: int,
    pad_token_id: int,
    eos_token_id: int,
    attention_kind: str = "full",
    block_size: int = 4,
    **overrides,
) -> TinyDLMConfig:
    """The default tiny size: ~0.8M parameters, several optimizer steps per second on 2 CPU cores."""
    return TinyDLMConfig(
        vocab_size=vocab_size,
        mask_token_id=mask_token_id,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        attention_kind=attention_kind,
        block_size=block_size,
        **overrides,
    )


AutoConfig.register(TinyDLMConfig.model_type, TinyDLMConfig, exist_ok=True)
AutoModel.register(TinyDLMConfig, TinyDLM, exist_ok=True)
AutoModelForMaskedLM.register(TinyDLMConfig, TinyDLM, exist_ok=True)

__all__ = ["KVCache", "TinyDLM", "TinyDLMConfig", "TinyDLMOutput", "default_tiny_config"]
