"""Layers the native model implementations share (LLaDA, Dream): the published files' numerics, written once.

Both families are Llama-style transformers run bidirectionally; they differ in parameter names, biases and where
RoPE is computed (LLaDA in float32, Dream in the model's dtype), which the arguments below say.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from stabledrl_bench.errors import UserError

KVCache = list[tuple[torch.Tensor, torch.Tensor]]


def require_supported(family: str, settings: Mapping[str, Any], supported: Mapping[str, tuple[Any, ...]]) -> None:
    """One error line for a ``config.json`` structural setting a native implementation does not build (absent
    settings take the published value, the first allowed one)."""
    for key, allowed in supported.items():
        if settings.get(key, allowed[0]) not in allowed:
            raise UserError(f"native {family}: {key}={settings[key]!r} is not built here (supported: {allowed[0]!r})")


@dataclass
class NativeOutput:
    """What a native model returns: logits [B, Q, V] and, when asked, each block's (rotated keys, values).

    A plain dataclass, not transformers' ``ModelOutput``, whose field handling changes between releases."""

    logits: torch.Tensor
    past_key_values: KVCache | None = None


class RMSNorm(nn.Module):
    """x / rms(x) in float32, cast back, then scaled: the published order (weight applied in the model's dtype)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return self.weight * normed


def rope(t: torch.Tensor, positions: torch.Tensor, theta: float, *, float32: bool = True) -> torch.Tensor:
    """Rotary embedding of ``t`` [B, H, Q, D] at ``positions`` [B, Q] (halves rotated, as both families do).

    The angles are always computed in float32; ``float32`` rotates in float32 too (LLaDA's
    ``rope_full_precision``), else in ``t``'s dtype with cos/sin cast to it (Dream, Qwen2).
    """
    dim = t.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=t.device, dtype=torch.float) / dim))
    angles = positions.float()[..., None] * inv_freq  # [B, Q, D/2]
    angles = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, Q, D]
    x = t.float() if float32 else t
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x.chunk(2, dim=-1)
    return (x * cos + torch.cat((-second, first), dim=-1) * sin).to(t.dtype)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    past: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Bidirectional SDPA of rotated ``q`` [B, H, Q, D] over the cached and new keys (grouped-query heads
    repeated); returns [B, Q, H * D] and the (keys, values) to cache."""
    if past is not None:  # cached keys are already rotated at their own positions
        k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
    present = (k, v)
    if k.shape[1] != q.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    if mask is not None and mask.is_floating_point():
        mask = mask.to(q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    batch, heads, length, dim = out.shape
    return out.transpose(1, 2).reshape(batch, length, heads * dim), present


def key_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """A [B, K] key-padding mask as the [B, 1, 1, K] boolean SDPA broadcasts; 4-D patterns pass through."""
    if attention_mask is not None and attention_mask.dim() == 2:
        return attention_mask.bool()[:, None, None, :]
    return attention_mask


def without_attention_choice(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A published ``config.json``'s fields minus ``attn_implementation``, for a native config's ``__init__``.

    The native networks always run :func:`attention` (torch SDPA). The published files' choice of kernel (SDAR-8B-
    Chat's config asks for ``flex_attention``) is theirs; kept, transformers would refuse to build these classes.
    """
    kwargs.pop("attn_implementation", None)
    return kwargs


class NativeDiffusionModel(PreTrainedModel):
    """What the native implementations share: initialisation, per-block activation checkpointing, and running the
    blocks over positions that default to those after the cache. Subclasses build their modules and embed/head."""

    supports_gradient_checkpointing = True
    _supports_sdpa = True  # what :func:`attention` runs, whatever the checkpoint's config asked for

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    def _set_gradient_checkpointing(self, enable: bool = True, gradient_checkpointing_func: Any = None) -> None:
        self.gradient_checkpointing = enable

    def run_blocks(
        self,
        x: torch.Tensor,
        blocks: nn.ModuleList,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        past_key_values: KVCache | None,
    ) -> tuple[torch.Tensor, KVCache]:
        """``x`` [B, Q, D] through every block (each ``block(x, mask, positions, past) -> (x, (k, v))``)."""
        batch, length = x.shape[:2]
        past_len = past_key_values[0][0].shape[2] if past_key_values else 0
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + length, device=x.device).expand(batch, length)
        mask = key_mask(attention_mask)
        present: KVCache = []
        for i, block in enumerate(blocks):
            past = past_key_values[i] if past_key_values else None
            if getattr(self, "gradient_checkpointing", False) and self.training:
                x, kv = checkpoint(block, x, mask, position_ids, past, use_reentrant=False)
            else:
                x, kv = block(x, mask, position_ids, past)
            present.append(kv)
        return x, present
