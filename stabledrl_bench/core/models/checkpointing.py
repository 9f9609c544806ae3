"""Activation checkpointing for any model file: each decoder block is recomputed in the backward pass.

The published files disagree on how (LLaDA's has its own strategies and no ``gradient_checkpointing_enable``;
transformers' switch also turns SDAR's KV cache off in train mode), so the harness does it the same way for
every family: the block's forward runs under non-reentrant ``torch.utils.checkpoint``. Module structure,
parameter names and state dicts stay as they are, so FSDP still wraps the blocks and checkpoints load anywhere.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The block's own forward, recomputed in the backward pass instead of keeping its activations.

    Looked up on the class at call time (not captured), so a deep copy of the model runs its own weights. Without
    gradients (sampling, no-grad estimates, KV caches) nothing would be recomputed, so it runs plainly.
    """
    forward = type(self).forward.__get__(self)
    if torch.is_grad_enabled():
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return forward(*args, **kwargs)


def enable_activation_checkpointing(blocks: list[nn.Module]) -> None:
    """Recompute each block in the backward pass (non-reentrant ``torch.utils.checkpoint``, RNG state restored).
    Results equal the plain forward's (tested, and probed by ``check-model``)."""
    for block in blocks:
        block.forward = types.MethodType(_checkpointed_forward, block)


def disable_activation_checkpointing(blocks: list[nn.Module]) -> None:
    """Undo :func:`enable_activation_checkpointing` (the class's own forward again)."""
    for block in blocks:
        block.__dict__.pop("forward", None)
