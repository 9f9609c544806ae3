"""Log-probabilities of chosen tokens without a float32 log-softmax over the whole vocabulary at once.

Every estimator needs log p(y_k) at each scored position k, a single number out of the vocabulary's V logits
(126,464 for LLaDA). Taken as ``log_softmax(logits.float()).gather(...)``, a forward pass holds the float32
log-softmax of every position of the micro-batch, and autograd keeps it (log-softmax's backward reads its
output) until the backward pass: 4 bytes per position and vocabulary entry, twice the bf16 logits themselves; the
backward then makes two more float32 tensors of that size (the scattered incoming gradient and log-softmax's).

:func:`chosen_token_logps` computes the same numbers a span of positions at a time, keeping only the logits (in
their own dtype) for the backward pass, which recomputes each span's log-softmax. Peers do the same: TRL's
``selective_log_softmax`` (``trl/trainer/utils.py``) loops over rows to avoid the full log-softmax, and SDAR's
fused linear cross-entropy goes further, never keeping the logits at all.

Why a span's ``log_softmax`` and not ``gather(logits) - logsumexp(logits)``: log-softmax is computed row by row, so
cutting the rows into spans gives every value and gradient bitwise what the whole tensor gives, whereas
``logsumexp`` sums in another order (and rounds ``x - (max + log s)`` where log-softmax rounds ``(x - max) - log s``),
which would move every pinned number by a few units in the last place.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

# Values (positions x vocabulary) per piece: one piece's float32 log-softmax is at most 2^24 x 4 B = 64 MiB, and its
# backward holds about three such tensors at once. A bound in values, not positions, because the cost is the
# vocabulary's: LLaDA's 126,464 entries give one piece per 128-token row (132 positions fit), the tiny tokenizer's
# 112 a whole micro-batch in one piece (as fast as the whole-tensor log-softmax: many small pieces cost time).
SPAN_VALUES = 1 << 24


def span_positions(vocab: int) -> int:
    """Positions one piece may hold at a vocabulary of ``vocab`` entries (:data:`SPAN_VALUES`), at least one."""
    return max(1, SPAN_VALUES // vocab)


def log_prob_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for low-precision models (as every official code does), float64 for float64 models."""
    return torch.promote_types(dtype, torch.float32)


def _spans(rows: int, length: int, span: int) -> Iterator[tuple[slice, slice]]:
    """(rows, positions) pieces covering [rows, length], at most ``span`` positions each: whole rows together when a
    row fits in a span (a short canvas costs a few pieces, not one per row), else pieces of one row. Log-softmax is
    computed per position, so any cut gives the same numbers."""
    if length <= span:
        per = span // length
        for start in range(0, rows, per):
            yield slice(start, min(start + per, rows)), slice(0, length)
        return
    for row in range(rows):
        for start in range(0, length, span):
            yield slice(row, row + 1), slice(start, min(start + span, length))


def largest_piece(rows: int, length: int, vocab: int) -> int:
    """Positions in the largest piece :func:`chosen_token_logps` cuts [rows, length] into by default (what the
    memory plan counts one piece's float32 tensors by)."""
    return max((r.stop - r.start) * (c.stop - c.start) for r, c in _spans(rows, length, span_positions(vocab)))


def _span_logps(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[targets] of one piece [r, n, V] -> [r, n], in :func:`log_prob_dtype` of the logits."""
    logp = torch.log_softmax(logits.to(log_prob_dtype(logits.dtype)), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


class _ChosenTokenLogps(torch.autograd.Function):
    """Forward: each span's log-probabilities, its log-softmax freed at once. Saved: the logits and targets.
    Backward: each span's log-softmax recomputed and differentiated by autograd itself (the same gather,
    log-softmax and cast backward kernels as the whole tensor's graph, so the gradient is bitwise the same)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, span: int) -> torch.Tensor:
        out = torch.empty(targets.shape, dtype=log_prob_dtype(logits.dtype), device=logits.device)
        for rows, cols in _spans(*targets.shape, span):
            out[rows, cols] = _span_logps(logits[rows, cols], targets[rows, cols])
        if ctx.needs_input_grad[0]:  # a column slice of longer logits would keep them all alive: keep what is read
            ctx.save_for_backward(logits.contiguous(), targets)
        ctx.span = span
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, targets = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)
        for rows, cols in _spans(*targets.shape, ctx.span):
            with torch.enable_grad():
                piece = logits[rows, cols].detach().requires_grad_()
                (grad_piece,) = torch.autograd.grad(_span_logps(piece, targets[rows, cols]), piece, grad[rows, cols])
            grad_logits[rows, cols] = grad_piece
        return grad_logits, None, None


def chosen_token_logps(logits: torch.Tensor, targets: torch.Tensor, span: int | None = None) -> torch.Tensor:
    """log softmax(logits)[targets]: [R, L] from logits [R, L, V] (any strides) and targets [R, L] (int64).

    Bitwise ``torch.log_softmax(logits.to(log_prob_dtype(logits.dtype)), -1).gather(-1, targets[..., None])[..., 0]``
    and its gradient, at a fraction of the memory: at most ``span`` positions' float32 log-softmax exist at a time
    (forward and backward; by default :func:`span_positions` of the vocabulary), and the backward pass keeps the
    logits in their dtype instead of the float32 log-softmax (module docstring).
    """
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(f"logits [R, L, V] and targets [R, L], got {tuple(logits.shape)} and {tuple(targets.shape)}")
    if span is None:
        span = span_positions(logits.shape[-1])
    if span < 1:
        raise ValueError(f"span must be a positive number of positions, got {span}")
    return _ChosenTokenLogps.apply(logits, targets, span)
