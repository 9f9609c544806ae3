"""Chosen-token log-probabilities by spans (``core/logprobs.py``): against ``log_softmax`` + ``gather`` over the
whole tensor (values and gradients, bitwise, in this process), a value worked out by hand, and the memory it saves:
the bytes autograd keeps for the backward pass (counted with ``saved_tensors_hooks``) and the peak of a forward and
backward (torch's ``MemTracker``, which counts tensor storages: deterministic, no timing).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

from stabledrl_bench.core.logprobs import chosen_token_logps, log_prob_dtype

ROWS, CONTEXT, LENGTH, VOCAB = 3, 13, 10, 1000  # logits [3, 13, 1000], the last 10 positions read


def whole(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """What the estimators computed before: the float32 log-softmax of every position at once."""
    logp = torch.log_softmax(logits.to(log_prob_dtype(logits.dtype)), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _inputs(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits [ROWS, CONTEXT, VOCAB] of spread 4 in ``dtype``, targets and weights of the last LENGTH positions."""
    gen = torch.Generator().manual_seed(seed)
    logits = (4 * torch.randn(ROWS, CONTEXT, VOCAB, generator=gen, dtype=torch.float64)).to(dtype)
    targets = torch.randint(0, VOCAB, (ROWS, LENGTH), generator=gen)
    weights = torch.randn(ROWS, LENGTH, generator=gen, dtype=torch.float64)
    return logits, targets, weights


def _value_and_grad(fn, logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor):
    """fn's log-probs of the column slice of ``logits`` a caller reads, and the gradient of a weighted sum of them
    with respect to all the logits (through the slice, as the estimators differentiate)."""
    leaf = logits.clone().requires_grad_()
    logp = fn(leaf[:, CONTEXT - LENGTH :], targets)
    (logp * weights.to(logp.dtype)).sum().backward()
    return logp.detach(), leaf.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
# 3, 4 and 7 leave a shorter last span of a row; 20 takes two whole rows, then the last one alone; 64 all three
@pytest.mark.parametrize("span", [1, 3, 4, 7, LENGTH, 20, 64])
def test_spans_give_the_whole_tensors_values_and_gradients_bitwise(dtype, span):
    logits, targets, weights = _inputs(dtype)
    want, want_grad = _value_and_grad(whole, logits, targets, weights)
    got, got_grad = _value_and_grad(lambda x, t: chosen_token_logps(x, t, span), logits, targets, weights)
    assert got.dtype == want.dtype == log_prob_dtype(dtype)
    assert got_grad.dtype == dtype
    assert torch.equal(got, want)
    assert torch.equal(got_grad, want_grad)
    assert not got_grad[:, : CONTEXT - LENGTH].any()  # the unread columns get no gradient


def test_a_value_worked_out_by_hand():
    # logits (0, log 3, 0): p = (1, 3, 1) / 5, so log p = log(3/5) for token 1 and log(1/5) for tokens 0 and 2;
    # d log p_1 / d logit_v = 1[v = 1] - p_v = (-1/5, 2/5, -1/5)
    logits = torch.tensor([[[0.0, math.log(3.0), 0.0], [0.0, math.log(3.0), 0.0]]], dtype=torch.float64)
    logits.requires_grad_()
    logp = chosen_token_logps(logits, torch.tensor([[1, 2]]), span=1)
    assert logp[0].tolist() == pytest.approx([math.log(3 / 5), math.log(1 / 5)], rel=1e-12)
    logp[0, 0].backward()
    assert logits.grad.flatten().tolist() == pytest.approx([-0.2, 0.4, -0.2, 0.0, 0.0, 0.0], abs=1e-12)


def test_without_gradients_nothing_is_kept():
    logits, targets, _ = _inputs(torch.bfloat16)
    with torch.no_grad():
        got = chosen_token_logps(logits[:, CONTEXT - LENGTH :], targets, span=4)
    assert not got.requires_grad
    assert torch.equal(got, whole(logits[:, CONTEXT - LENGTH :], targets))


def _saved_bytes(fn, logits: torch.Tensor, targets: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd keeps for the backward pass of ``fn`` on the logits' column slice."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    leaf = logits.clone().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn(leaf[:, CONTEXT - LENGTH :], targets)
    return sum(storages.values())


def test_the_backward_pass_keeps_the_read_logits_in_their_dtype_not_the_float32_log_softmax():
    logits, targets, _ = _inputs(torch.bfloat16)
    positions, index = ROWS * LENGTH, 8 * ROWS * LENGTH
    assert _saved_bytes(whole, logits, targets) == 4 * positions * VOCAB + index  # the float32 log-softmax
    # only the read columns, copied out of the longer logits (2 bytes each), and the targets
    assert _saved_bytes(lambda x, t: chosen_token_logps(x, t, 4), logits, targets) == 2 * positions * VOCAB + index


def _peak_bytes(fn, logits: torch.Tensor, targets: torch.Tensor) -> int:
    """The largest total of live tensor bytes during ``fn``'s forward and backward on the logits' column slice."""
    leaf = logits.clone().requires_grad_()
    tracker = MemTracker()
    with tracker:
        source = leaf * 1.0  # logits made inside the tracked region, as a model makes them
        fn(source[:, CONTEXT - LENGTH :], targets).sum().backward()
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return next(value for key, value in peak.items() if getattr(key, "name", key) == "Total")


def test_the_peak_of_a_forward_and_backward_is_below_the_whole_tensors():
    logits, targets, _ = _inputs(torch.bfloat16)
    element = ROWS * LENGTH * VOCAB
    before = _peak_bytes(whole, logits, targets)
    after = _peak_bytes(lambda x, t: chosen_token_logps(x, t, 2), logits, targets)
    # at its backward the whole path holds the read logits' float32 log-softmax and two float32 tensors more of
    # that size (the scattered incoming gradient, log-softmax's gradient): 12 bytes per element; the spans hold
    # the saved copy and the gradient (2 + 2 bytes) and a few spans' float32 tensors (measured: 6.8 bytes less)
    assert before - after >= 6 * element


def test_rejects_what_it_cannot_read():
    logits, targets, _ = _inputs(torch.float32)
    with pytest.raises(ValueError, match="logits"):
        chosen_token_logps(logits[0], targets[0])
    with pytest.raises(ValueError, match="span"):
        chosen_token_logps(logits[:, CONTEXT - LENGTH :], targets, span=0)


@pytest.mark.parametrize(
    ("rows", "length", "vocab", "pieces"),
    [
        (24, 48, 112, [(slice(0, 24), slice(0, 48))]),  # the tiny preset's micro-batch: one piece, no loop cost
        (3, 128, 126_464, [(slice(r, r + 1), slice(0, 128)) for r in range(3)]),  # LLaDA: one 128-token row each
        (
            1,
            300,
            126_464,
            [(slice(0, 1), slice(0, 132)), (slice(0, 1), slice(132, 264)), (slice(0, 1), slice(264, 300))],
        ),
    ],
)
def test_a_default_piece_holds_at_most_span_values(rows, length, vocab, pieces):
    """The default cut is by values (positions x vocabulary), not positions: at LLaDA's vocabulary two 128-token rows
    in one piece doubled its float32 tensors and lifted a 20M-block step's peak back to the whole-tensor one."""
    from stabledrl_bench.core.logprobs import SPAN_VALUES, _spans, span_positions

    assert span_positions(126_464) == 132 and span_positions(10**9) == 1
    got = list(_spans(rows, length, span_positions(vocab)))
    assert got == pieces
    assert all((r.stop - r.start) * (c.stop - c.start) * vocab <= SPAN_VALUES for r, c in got)
