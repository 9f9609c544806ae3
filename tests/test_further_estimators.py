"""The estimators of the further methods against slow loops written here, on the batches and helpers of
``test_estimators`` (unpadded prompts, one forward pass per masked input, plain Python sums):
``denoise_pair`` (GDSD), ``stratified_elbo`` (BGPO), ``trace_sample`` (AGRPO), ``ar_replay`` (JustGRPO), the replay of
every committed token (``post_num=None``, CJ-GRPO) and the staircase ELBO's per-sample values."""

from __future__ import annotations

import pytest
import test_estimators
import torch
from test_estimators import (
    BLOCK,
    TRACE_STEPS,
    L,
    _model,
    close,
    context_logps,
    gen,
    make_batch,
    real_prompt,
    slow_logps,
    slow_trace,
    staircase_block_logps,
)

from stabledrl_bench.core.estimators import ESPONoise, StratifiedNoise, build_estimator, replay_rounds

# the same model fixtures (pytest finds fixtures among a module's attributes)
full_model, block_model, any_model = (
    test_estimators.full_model,
    test_estimators.block_model,
    test_estimators.any_model,
)


def masked_logps(model, batch, i: int, masked: list[bool]) -> list[float]:
    """log p of every clean completion token of sequence i with the ``masked`` positions replaced by the mask."""
    clean = batch.completion_ids[i].tolist()
    completion = [model.mask_id if m else c for m, c in zip(masked, clean, strict=True)]
    return context_logps(model, real_prompt(batch, i, None, model.mask_id), completion, clean)


# ---------------------------------------------------------------------------------------------- GDSD
def slow_denoise_pair(model, batch, noise, inverse_t: bool, reduce_var: bool) -> torch.Tensor:
    out = []
    for i in range(3):
        row = []
        for j in range(noise.masked.shape[1]):
            masked = [bool(v) for v in noise.masked[i, j]]
            t = int(noise.count[i, j]) / (L + 1)
            lps = masked_logps(model, batch, i, masked)
            value = sum(lps[k] for k in range(L) if masked[k])
            if inverse_t:  # an empty pass (t = 0, or the complement of a full mask) contributes 0
                value = value / t if t > 0 else 0.0
            if reduce_var:
                comp = masked_logps(model, batch, i, [not m for m in masked])
                rest = sum(comp[k] for k in range(L) if not masked[k])
                if inverse_t:
                    rest = rest / (L / (L + 1) - t) if t < L / (L + 1) else 0.0
                value = (value + rest) / 2
            row.append(value)
        out.append(row)
    return torch.tensor(out)


@pytest.mark.parametrize(("inverse_t", "reduce_var"), [(False, True), (True, True), (False, False)])
def test_denoise_pair_matches_slow_loop(any_model, inverse_t, reduce_var):
    batch = make_batch(any_model)
    est = build_estimator("denoise_pair", num_mc=2, inverse_t=inverse_t, reduce_var=reduce_var)
    noise = est.draw(batch, gen(21))
    out = est.evaluate(any_model, batch, noise)
    expected = slow_denoise_pair(any_model, batch, noise, inverse_t, reduce_var)
    assert close(out.elbo_samples, expected) and close(out.elbo, expected.mean(-1))


def test_denoise_pair_with_inverse_t_is_espo_per_sample(full_model):
    """GDSD-TLC's samples average to ESPO's ELBO on the same masks (the draw is ESPO's)."""
    batch = make_batch(full_model)
    count = torch.tensor([[0, 3], [8, 5], [2, 7]])
    masked = torch.arange(L).view(1, 1, L) < count.unsqueeze(-1)
    noise = ESPONoise(masked=masked, count=count, kappa=torch.tensor([0, 3]))
    tlc = build_estimator("denoise_pair", num_mc=2, inverse_t=True).evaluate(full_model, batch, noise)
    espo = build_estimator("espo_elbo", num_mc=2).evaluate(full_model, batch, noise)
    assert torch.isfinite(tlc.elbo_samples).all() and close(tlc.elbo, espo.elbo)


# ---------------------------------------------------------------------------------------------- BGPO
def test_stratified_draw_counts(full_model):
    """Counts of one sequence are ((round(kappa + j l / K) - 1) mod l) + 1 for one kappa in 1..l, the masks exact
    subsets of the valid tokens; with K = l every count 1..l appears once."""
    batch = make_batch(full_model)  # valid lengths 8, 6, 2
    lengths = batch.completion_mask.sum(-1).tolist()
    for k_mc in (3, 8):
        noise = build_estimator("stratified_elbo", num_mc=k_mc).draw(batch, gen(22))
        assert torch.equal(noise.masked.sum(-1), noise.count)
        assert not (noise.masked & ~batch.completion_mask.unsqueeze(1)).any()
        for i, length in enumerate(lengths):
            counts = noise.count[i].tolist()
            candidates = [
                [(round(kappa + j * length / k_mc) - 1) % length + 1 for j in range(k_mc)]
                for kappa in range(1, length + 1)
            ]
            assert counts in candidates
    noise = build_estimator("stratified_elbo", num_mc=8).draw(batch, gen(23))
    assert sorted(noise.count[0].tolist()) == list(range(1, 9))


def test_stratified_elbo_matches_slow_loop(full_model):
    batch = make_batch(full_model)
    est = build_estimator("stratified_elbo", num_mc=3)
    noise = est.draw(batch, gen(24))
    out = est.evaluate(full_model, batch, noise)
    lengths = batch.completion_mask.sum(-1).tolist()
    expected = []
    for i in range(3):
        row = []
        for j in range(3):
            masked = [bool(v) for v in noise.masked[i, j]]
            lps = masked_logps(full_model, batch, i, masked)
            row.append(sum(lps[k] for k in range(L) if masked[k]) * lengths[i] / sum(masked))
        expected.append(row)
    assert close(out.elbo_samples, torch.tensor(expected)) and close(out.elbo, torch.tensor(expected).mean(-1))


def test_stratified_elbo_hand_count():
    """One fixed mask: E = (l / n) sum of the masked log-probs, whatever the draw would have been."""
    model = _model("full")
    batch = make_batch(model)
    masked = torch.zeros(3, 1, L, dtype=torch.bool)
    masked[:, 0, 0] = True
    out = build_estimator("stratified_elbo", num_mc=1).evaluate(
        model, batch, StratifiedNoise(masked=masked, count=torch.ones(3, 1, dtype=torch.long))
    )
    first = [masked_logps(model, batch, i, [k == 0 for k in range(L)])[0] for i in range(3)]
    assert close(out.elbo, torch.tensor([8 * first[0], 6 * first[1], 2 * first[2]]))


# ---------------------------------------------------------------------------------------------- CJ-GRPO, AGRPO
def test_replay_of_every_committed_token_is_the_uncut_plan(any_model):
    """``post_num=None`` (CJ-GRPO's targets) is the plan with no EOS cut: every decoded position once."""
    batch = make_batch(any_model, unmask_step=TRACE_STEPS)
    every = build_estimator("trace_replay", post_num=None)
    out = every.evaluate(any_model, batch, every.draw(batch, gen(0)))
    uncut = build_estimator("trace_replay", post_num=L)
    assert torch.equal(out.token_mask, uncut.evaluate(any_model, batch, uncut.draw(batch, gen(0))).token_mask)
    assert close(out.token_logp, slow_trace(any_model, batch, 1, L))
    per_seq = torch.zeros(3, L, dtype=torch.long).index_add(0, out.row_to_seq, out.token_mask.long())
    assert (per_seq == 1).all()
    assert replay_rounds(out.row_to_seq).tolist() == [r for n in torch.bincount(out.row_to_seq) for r in range(n)]


def test_trace_sample_draw_is_stratified(full_model):
    batch = make_batch(full_model)
    noise = build_estimator("trace_sample", num_mc=4).draw(batch, gen(25))
    assert noise.u.shape == (3, 4)
    assert sorted(torch.floor(noise.u.flatten() * 12).long().tolist()) == list(range(12))
    plain = build_estimator("trace_sample", num_mc=4, low_discrepancy=False).draw(batch, gen(25))
    assert sorted(torch.floor(plain.u.flatten() * 12).long().tolist()) != list(range(12))


def test_trace_sample_matches_slow_loop(any_model):
    """The rows replayed are those of the steps floor(u (T + 1)), T the last step with a non-stop target."""
    batch = make_batch(any_model, unmask_step=TRACE_STEPS)
    est = build_estimator("trace_sample", num_mc=5)
    noise = est.draw(batch, gen(26))
    out = est.evaluate(any_model, batch, noise)
    full = build_estimator("trace_replay", post_num=None)
    every = full.evaluate(any_model, batch, full.draw(batch, gen(0)))
    stop = set(any_model.stop_ids)
    expected_rows = []
    for i in range(3):
        rows = [r for r in range(every.row_to_seq.shape[0]) if int(every.row_to_seq[r]) == i]
        content = [
            n
            for n, r in enumerate(rows)
            if any(every.token_mask[r, k] and int(batch.completion_ids[i, k]) not in stop for k in range(L))
        ]
        last = max(content, default=0)
        expected_rows += [rows[min(int(u * (last + 1)), last)] for u in noise.u[i].tolist()]
    assert out.row_to_seq.tolist() == [i for i in range(3) for _ in range(5)]
    assert torch.equal(out.token_mask, every.token_mask[expected_rows])
    assert close(out.token_logp, every.token_logp[expected_rows])


def test_trace_sample_skips_steps_that_only_write_stop_tokens(full_model):
    """Sequence 2 (EOS from position 1) commits only EOS after step 2: its draws never go past that step."""
    batch = make_batch(full_model, unmask_step=TRACE_STEPS)  # sequence 2: steps [1, 0, 2, 2, 3, 3, 3, 3]
    est = build_estimator("trace_sample", num_mc=40, low_discrepancy=False)
    out = est.evaluate(full_model, batch, est.draw(batch, gen(27)))
    rows = out.token_mask[out.row_to_seq == 2]
    committed_steps = {int(TRACE_STEPS[2][k]) for r in rows for k in range(L) if r[k]}
    assert committed_steps == {0, 1}  # token 0 (step 1) is the only non-EOS token: steps 0..1 are drawn


# ---------------------------------------------------------------------------------------------- JustGRPO
def slow_ar(model, batch) -> torch.Tensor:
    """log p(y_t | x, y_<t, masks) for every position t, one pass per position (per block position on block models)."""
    out = torch.zeros(3, L, dtype=torch.float64)
    for i in range(3):
        prompt = real_prompt(batch, i, None, model.mask_id)
        clean = batch.completion_ids[i].tolist()
        for t in range(L):
            if model.attention == "block":
                b, off = divmod(t, BLOCK)
                noisy = [c if n < off else model.mask_id for n, c in enumerate(clean[b * BLOCK : (b + 1) * BLOCK])]
                out[i, t] = staircase_block_logps(model, prompt, clean, noisy, b)[off]
            else:
                out[i, t] = slow_logps(model, prompt, clean[:t] + [model.mask_id] * (L - t), clean)[t]
    return out


def test_ar_replay_matches_slow_loop(any_model):
    batch = make_batch(any_model)  # no unmask_step: the order is left to right, whatever was sampled
    est = build_estimator("ar_replay")
    out = est.evaluate(any_model, batch, est.draw(batch, gen(0)))
    rows_per_seq = BLOCK if any_model.attention == "block" else L
    assert out.row_to_seq.tolist() == [i for i in range(3) for _ in range(rows_per_seq)]
    logp = torch.zeros(3, L, dtype=torch.float64).index_add(0, out.row_to_seq, out.token_logp.double())
    assert close(logp, slow_ar(any_model, batch))
    assert (out.token_mask.sum(-1) == L // rows_per_seq).all()


# ---------------------------------------------------------------------------------------------- staircase
def test_staircase_keeps_its_samples_on_the_sum_scale(block_model):
    batch = make_batch(block_model)
    est = build_estimator("staircase_elbo", num_mc=3, scale="sum").bind(block_model)
    out = est.evaluate(block_model, batch, est.draw(batch, gen(28)))
    assert out.elbo_samples.shape == (3, 3) and close(out.elbo_samples.mean(-1), out.elbo)
    mean_scale = build_estimator("staircase_elbo", num_mc=3).bind(block_model)
    assert mean_scale.evaluate(block_model, batch, mean_scale.draw(batch, gen(28))).elbo_samples is None
