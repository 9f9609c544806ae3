"""Likelihood estimators against independent slow loop implementations written here.

The slow references build every masked input by hand, one sequence / MC sample / block at a time, with the
prompt *unpadded* (so they also check that left padding never changes a result: RoPE is relative and pad keys
are masked), run separate forward passes, and aggregate with plain Python arithmetic. Models are tiny and run
in float64 so agreement is checked to 1e-5 (observed < 1e-6: the tiny model computes RoPE angles in float32,
and the unpadded references shift every position).
"""

from __future__ import annotations

import math

import pytest
import torch

from stabledrl_bench.core.estimators import (
    ESTIMATORS,
    CoupledNoise,
    ESPONoise,
    SequenceBatch,
    build_estimator,
    content_seeds,
    trace_replay_plan,
)
from stabledrl_bench.core.masks import block_causal_mask
from stabledrl_bench.core.models import build_tiny
from stabledrl_bench.errors import UserError

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
BLOCK = 4
P, L = 6, 8
PROMPT_LENGTHS = (6, 4, 2)
EOS_AT = (None, 5, 1)  # first EOS index per sequence (None: no EOS, all 8 tokens valid)
TOL = 1e-5


def _model(attention: str):
    model = build_tiny(attention=attention, block_size=BLOCK, seed=0, **TINY)
    model.model.double().eval()
    return model


@pytest.fixture(scope="module")
def full_model():
    return _model("full")


@pytest.fixture(scope="module")
def block_model():
    return _model("block")


@pytest.fixture(scope="module", params=["full", "block"])
def any_model(request, full_model, block_model):
    return full_model if request.param == "full" else block_model


def make_batch(model, seed: int = 0, unmask_step: torch.Tensor | None = None) -> SequenceBatch:
    """3 sequences with prompts of lengths 6/4/2 (left-padded to 6) and completions with EOS at None/5/1."""
    gen = torch.Generator().manual_seed(seed)
    first_regular = 8  # ids 0..7 are special tokens of the char tokenizer
    prompt_ids = torch.full((len(PROMPT_LENGTHS), P), model.pad_id, dtype=torch.long)
    prompt_mask = torch.zeros(len(PROMPT_LENGTHS), P, dtype=torch.bool)
    completion_ids = torch.randint(first_regular, model.vocab_size, (len(PROMPT_LENGTHS), L), generator=gen)
    for i, (p_len, eos) in enumerate(zip(PROMPT_LENGTHS, EOS_AT, strict=True)):
        prompt_ids[i, P - p_len :] = torch.randint(first_regular, model.vocab_size, (p_len,), generator=gen)
        prompt_mask[i, P - p_len :] = True
        if eos is not None:
            completion_ids[i, eos:] = model.eos_id
    return SequenceBatch(prompt_ids, prompt_mask, completion_ids, model.completion_mask(completion_ids), unmask_step)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ====================================================================================== slow references
def slow_logps(model, context: list[int], tail: list[int], targets: list[int]) -> list[float]:
    """log p(targets) at the ``tail`` positions of one unpadded row [context | tail], one forward pass.

    Full models attend everything (there is no padding); block models get the block-causal mask with blocks
    aligned to the end of ``context`` minus the clean blocks it holds (callers pass the true prompt length).
    """
    ids = torch.tensor([context + tail])
    logits = model.logits(ids)[0, len(context) :]
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[k, t].item() for k, t in enumerate(targets)]


def slow_logps_block(model, prompt: list[int], body: list[int], targets: list[int], read_from: int) -> list[float]:
    """Like :func:`slow_logps` for a block model: row [prompt | body] under block_causal_mask."""
    ids = torch.tensor([prompt + body])
    mask = block_causal_mask(torch.ones(1, ids.shape[1], dtype=torch.bool), len(prompt), BLOCK)
    logits = model.logits(ids, mask)[0, len(prompt) + read_from :]
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[k, t].item() for k, t in enumerate(targets)]


def context_logps(model, prompt: list[int], completion: list[int], targets: list[int]) -> list[float]:
    """log p(targets) over the completion of [prompt | completion] with the model's own attention pattern."""
    if model.attention == "block":
        return slow_logps_block(model, prompt, completion, targets, 0)
    return slow_logps(model, prompt, completion, targets)


def real_prompt(batch: SequenceBatch, i: int, masked: torch.Tensor | None, mask_id: int) -> list[int]:
    out = []
    for p in range(P):
        if batch.prompt_mask[i, p]:
            out.append(mask_id if masked is not None and bool(masked[p]) else int(batch.prompt_ids[i, p]))
    return out


def slow_spg_bounds(logps, members, valid_len: int, beta: float) -> tuple[float, float]:
    """SPG ELBO / EUBO of one sequence from per-sample lists of log-probs and member flags (plain Python)."""
    m = len(logps)
    elbo = (
        sum(
            sum(lp for lp, mem in zip(lps, mems, strict=True) if mem) / sum(mems)
            for lps, mems in zip(logps, members, strict=True)
        )
        / m
    )
    ts = [sum(mems) / valid_len for mems in members]
    q = [sum(math.exp(beta * logps[j][k]) / ts[j] for j in range(m) if members[j][k]) / m for k in range(L)]
    kept = [math.log(v) for v in q if v > 0]
    return elbo, sum(kept) / len(kept) / beta


def slow_d1(model, batch, noise):
    out = torch.zeros(3, L, dtype=torch.float64)
    for i in range(3):
        prompt = real_prompt(batch, i, noise.prompt_masked[i], model.mask_id)
        lps = context_logps(model, prompt, [model.mask_id] * L, batch.completion_ids[i].tolist())
        for k in range(L):
            out[i, k] = lps[k] if batch.completion_mask[i, k] else 0.0
    return out


def slow_coupled(model, batch, noise):
    """Coupled-GRPO's estimate one sequence and one version at a time, combined with plain Python floats."""
    out = torch.zeros(3, L, dtype=torch.float64)
    for i in range(3):
        prompt = real_prompt(batch, i, noise.prompt_masked[i], model.mask_id)
        clean, t, u = batch.completion_ids[i].tolist(), float(noise.t[i]), noise.u[i].tolist()
        full = context_logps(model, prompt, [model.mask_id] * L, clean)
        first = context_logps(model, prompt, [model.mask_id if u[k] < t else clean[k] for k in range(L)], clean)
        second = context_logps(model, prompt, [model.mask_id if u[k] > t else clean[k] for k in range(L)], clean)
        for k in range(L):
            pair = first[k] / t if u[k] < t else second[k] / (1 - t)
            out[i, k] = (full[k] + pair) / 2 if batch.completion_mask[i, k] else 0.0
    return out


def slow_spg(model, batch, noise, beta):
    elbos, eubos, tokens = [], [], []
    for i in range(3):
        logps, members = [], []
        for j in range(noise.completion_masked.shape[1]):
            prompt = real_prompt(batch, i, noise.prompt_masked[i, j], model.mask_id)
            completion = [
                model.mask_id if noise.completion_masked[i, j, k] else int(batch.completion_ids[i, k]) for k in range(L)
            ]
            lps = context_logps(model, prompt, completion, batch.completion_ids[i].tolist())
            mems = [bool(noise.completion_masked[i, j, k] and batch.completion_mask[i, k]) for k in range(L)]
            logps.append(lps)
            members.append(mems)
            tokens.append([lp if mem else 0.0 for lp, mem in zip(lps, mems, strict=True)])
        elbo, eubo = slow_spg_bounds(logps, members, int(batch.completion_mask[i].sum()), beta)
        elbos.append(elbo)
        eubos.append(eubo)
    return torch.tensor(elbos), torch.tensor(eubos), torch.tensor(tokens)


def slow_espo(model, batch, noise, reduce_var):
    elbos = []
    for i in range(3):
        prompt = real_prompt(batch, i, None, model.mask_id)
        clean = batch.completion_ids[i].tolist()
        total = 0.0
        k_mc = noise.masked.shape[1]
        for j in range(k_mc):
            n = int(noise.count[i, j])
            t = n / (L + 1)
            masked = [bool(v) for v in noise.masked[i, j]]
            lps = context_logps(
                model, prompt, [model.mask_id if mk else c for mk, c in zip(masked, clean, strict=True)], clean
            )
            value = sum(lps[k] / t for k in range(L) if masked[k])
            if reduce_var:
                comp = context_logps(
                    model, prompt, [c if mk else model.mask_id for mk, c in zip(masked, clean, strict=True)], clean
                )
                value = (value + sum(comp[k] / (L / (L + 1) - t) for k in range(L) if not masked[k])) / 2
            total += value
        elbos.append(total / k_mc)
    return torch.tensor(elbos)


def slow_sdmc(model, batch, noise, nodes: int, draws: int):
    """GDPO's ELBO one sequence and one masked row at a time, with the textbook Gauss-Legendre weights."""
    points = {1: ([0.5], [1.0]), 2: ([0.5 - 0.5 / math.sqrt(3), 0.5 + 0.5 / math.sqrt(3)], [0.5, 0.5])}
    points[3] = ([0.5 - 0.5 * math.sqrt(0.6), 0.5, 0.5 + 0.5 * math.sqrt(0.6)], [5 / 18, 8 / 18, 5 / 18])
    times, weights = points[nodes]
    rows = [(t, w) for t, w in zip(times, weights, strict=True) for _ in range(draws)]
    elbos = []
    for i in range(3):
        prompt = real_prompt(batch, i, None, model.mask_id)
        clean = batch.completion_ids[i].tolist()
        total = 0.0
        for j, (t, w) in enumerate(rows):
            masked = [bool(v) for v in noise.masked[i, j]]
            lps = context_logps(
                model, prompt, [model.mask_id if m else c for m, c in zip(masked, clean, strict=True)], clean
            )
            total += w / (t * draws) * sum(lps[k] for k in range(L) if masked[k])
        elbos.append(total)
    return torch.tensor(elbos)


def staircase_block_logps(model, prompt, clean, noisy_block, b):
    """log p(clean block b) from a separate pass of [prompt | clean blocks < b | noisy block b] (block-causal)."""
    start = b * BLOCK
    targets = clean[start : start + BLOCK]
    return slow_logps_block(model, prompt, clean[:start] + noisy_block, targets, start)


def slow_staircase(model, batch, noise, scale, beta):
    elbos, eubos, tokens = [], [], []
    for i in range(3):
        prompt = real_prompt(batch, i, None, model.mask_id)
        clean = batch.completion_ids[i].tolist()
        valid = [bool(v) for v in batch.completion_mask[i]]
        logps, members, total_sum = [], [], 0.0
        for j in range(noise.masked.shape[1]):
            lps = [0.0] * L
            mems = [bool(noise.masked[i, j, k]) and valid[k] for k in range(L)]
            for b in range(L // BLOCK):
                block = range(b * BLOCK, (b + 1) * BLOCK)
                v_b = sum(valid[k] for k in block)
                if v_b == 0:
                    continue
                noisy = [model.mask_id if noise.masked[i, j, k] else clean[k] for k in block]
                block_lps = staircase_block_logps(model, prompt, clean, noisy, b)
                count = sum(mems[k] for k in block)
                for off, k in enumerate(block):
                    lps[k] = block_lps[off]
                    if mems[k]:
                        total_sum += block_lps[off] * v_b / count  # (1/t_b) log p, t_b = count / v_b
            logps.append(lps)
            members.append(mems)
            tokens.append([lp if mem else 0.0 for lp, mem in zip(lps, mems, strict=True)])
        elbo, eubo = slow_spg_bounds(logps, members, sum(valid), beta)
        elbos.append(total_sum / len(logps) if scale == "sum" else elbo)
        eubos.append(eubo)
    return torch.tensor(elbos), torch.tensor(eubos), torch.tensor(tokens)


def slow_trace_plan(steps, lengths, shrink, post_num, block_size):
    """Replay rows (seq, masked, targets) computed with lists: groups of `shrink` unique eligible steps per block."""
    rows = []
    for i, s in enumerate(steps):
        eligible = [k < lengths[i] + post_num for k in range(L)]
        width = block_size or L
        blocks = [list(range(b, min(b + width, L))) for b in range(0, L, width)]
        groups = []
        for pos in blocks:
            uniq = sorted({s[k] for k in pos if eligible[k]})
            groups.append([uniq[g : g + shrink] for g in range(0, len(uniq), shrink)])
        for r in range(max(len(g) for g in groups)):
            masked, targets = [False] * L, [False] * L
            for pos, grp in zip(blocks, groups, strict=True):
                if r < len(grp):
                    for k in pos:
                        masked[k] = s[k] >= grp[r][0]
                        targets[k] = eligible[k] and s[k] in grp[r]
            rows.append((i, masked, targets))
    return rows


def slow_trace(model, batch, shrink, post_num):
    block = BLOCK if model.attention == "block" else None
    lengths = batch.completion_mask.sum(-1).tolist()
    out = []
    for i, masked, targets in slow_trace_plan(batch.unmask_step.tolist(), lengths, shrink, post_num, block):
        prompt = real_prompt(batch, i, None, model.mask_id)
        clean = batch.completion_ids[i].tolist()
        state = [model.mask_id if mk else c for mk, c in zip(masked, clean, strict=True)]
        row = [0.0] * L
        if block is None:
            lps = slow_logps(model, prompt, state, clean)
            row = [lp if tg else 0.0 for lp, tg in zip(lps, targets, strict=True)]
        else:
            for b in range(L // BLOCK):
                if any(targets[b * BLOCK : (b + 1) * BLOCK]):
                    lps = staircase_block_logps(model, prompt, clean, state[b * BLOCK : (b + 1) * BLOCK], b)
                    for off in range(BLOCK):
                        if targets[b * BLOCK + off]:
                            row[b * BLOCK + off] = lps[off]
        out.append(row)
    return torch.tensor(out)


# ====================================================================================== estimator vs slow loop
def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=TOL, rtol=0)


def test_d1_matches_slow_loop(any_model):
    batch = make_batch(any_model)
    est = build_estimator("d1_one_step", p_mask_prompt=0.5)
    noise = est.draw(batch, gen(1))
    assert noise.prompt_masked.any()
    out = est.evaluate(any_model, batch, noise)
    assert torch.equal(out.token_mask, batch.completion_mask)
    assert close(out.token_logp, slow_d1(any_model, batch, noise))


def test_coupled_pair_matches_slow_loop(any_model):
    batch = make_batch(any_model)
    est = build_estimator("coupled_pair", p_mask_prompt=0.5)
    noise = est.draw(batch, gen(1))
    assert noise.prompt_masked.any() and 0.2 <= float(noise.t[0]) <= 0.8 and bool((noise.t == noise.t[0]).all())
    out = est.evaluate(any_model, batch, noise)
    assert torch.equal(out.token_mask, batch.completion_mask)
    assert close(out.token_logp, slow_coupled(any_model, batch, noise))


def test_coupled_pair_hand_computed_weights():
    """With a model whose every log-prob is the same number c, the estimate is (c + c / t) / 2 on the u < t
    positions and (c + c / (1 - t)) / 2 on the others: the official 1/t and 1/(1 - t) weights."""

    class Constant:
        mask_id, attention = 0, "full"

        def context_attention(self, prompt_mask, length):
            return torch.ones(prompt_mask.shape[0], prompt_mask.shape[1] + length, dtype=torch.bool)

        def agreed_passes(self, passes):
            return passes

        def logits(self, ids, attention, positions, keep=None):
            return torch.zeros(*ids.shape, 4)[:, keep]  # log p = log(1/4) for every token

    batch = SequenceBatch(
        prompt_ids=torch.tensor([[1, 2]]),
        prompt_mask=torch.ones(1, 2, dtype=torch.bool),
        completion_ids=torch.tensor([[1, 2, 3]]),
        completion_mask=torch.ones(1, 3, dtype=torch.bool),
    )
    noise = CoupledNoise(
        prompt_masked=torch.zeros(1, 2, dtype=torch.bool), t=torch.tensor([0.25]), u=torch.tensor([[0.1, 0.9, 0.5]])
    )
    out = build_estimator("coupled_pair").evaluate(Constant(), batch, noise)
    c = math.log(0.25)
    expected = torch.tensor([[(c + c / 0.25) / 2, (c + c / 0.75) / 2, (c + c / 0.75) / 2]])
    torch.testing.assert_close(out.token_logp.double(), expected.double())


@pytest.mark.parametrize(("nodes", "draws"), [(3, 1), (2, 2)])
def test_sdmc_matches_slow_loop(full_model, nodes, draws):
    batch = make_batch(full_model)
    est = build_estimator("sdmc_elbo", nodes=nodes, mc_samples=draws)
    noise = est.draw(batch, gen(2))
    lengths = batch.completion_mask.sum(-1)
    times = [t for t in est.quadrature()[0] for _ in range(draws)]
    for j, t in enumerate(times):  # exactly max(1, floor(t l)) scored positions, and nothing else, per row
        assert torch.equal(noise.masked[:, j].sum(-1), torch.clamp(torch.floor(lengths * t).long(), min=1))
    assert not (noise.masked & ~batch.completion_mask.unsqueeze(1)).any()
    out = est.evaluate(full_model, batch, noise)
    assert close(out.elbo, slow_sdmc(full_model, batch, noise, nodes, draws))


def test_content_seeds_are_the_official_hash_of_the_unpadded_tokens():
    """sum_p p * token_p mod (2^31 - 1) over the real prompt tokens then the scored completion tokens (positions
    1, 2, ...): padding on the left and tokens after the first EOS are left out."""
    batch = SequenceBatch(
        prompt_ids=torch.tensor([[0, 50_000, 70_000], [11, 12, 13]]),
        prompt_mask=torch.tensor([[False, True, True], [True, True, True]]),
        completion_ids=torch.tensor([[3, 2, 9], [4, 5, 6]]),
        completion_mask=torch.tensor([[True, True, False], [True, True, True]]),
    )
    first = (1 * 50_000 + 2 * 70_000 + 3 * 3 + 4 * 2) % (2**31 - 1)
    second = 1 * 11 + 2 * 12 + 3 * 13 + 4 * 4 + 5 * 5 + 6 * 6
    assert content_seeds(batch).tolist() == [first, second]
    big = SequenceBatch(  # the sum passes the modulus (2^31 - 1 = 2147483647)
        torch.tensor([[126_336] * 200]),
        torch.ones(1, 200, dtype=torch.bool),
        torch.tensor([[7]]),
        torch.ones(1, 1, dtype=torch.bool),
    )
    assert content_seeds(big).tolist() == [(126_336 * 200 * 201 // 2 + 201 * 7) % (2**31 - 1)]


def _rows(batch: SequenceBatch, rows: list[int], pad: int, pad_id: int) -> SequenceBatch:
    """``rows`` of ``batch`` in that order, their prompts left-padded by ``pad`` more positions."""
    extra = torch.full((len(rows), pad), pad_id, dtype=torch.long)
    return SequenceBatch(
        torch.cat((extra, batch.prompt_ids[rows]), dim=1),
        torch.cat((torch.zeros_like(extra, dtype=torch.bool), batch.prompt_mask[rows]), dim=1),
        batch.completion_ids[rows],
        batch.completion_mask[rows],
    )


def test_sdmc_content_masks_follow_the_sequence_not_the_batch_or_the_stream(full_model):
    """``mask_seed="content"`` (GDPO's official masks): the same sequence gets the same masks whatever generator is
    passed, whichever batch it is in and however it is padded; another sequence gets other masks, still exactly
    max(1, floor(t l)) scored positions per node. The stream default draws from the generator as before."""
    batch = make_batch(full_model)
    content = build_estimator("sdmc_elbo", mask_seed="content")
    masks = content.draw(batch, gen(1)).masked
    assert torch.equal(masks, content.draw(batch, gen(2)).masked)
    moved = content.draw(_rows(batch, [2, 0], pad=3, pad_id=full_model.pad_id), gen(3)).masked
    assert torch.equal(moved, masks[[2, 0]])
    lengths = batch.completion_mask.sum(-1)
    for j, t in enumerate(content.quadrature()[0]):
        assert torch.equal(masks[:, j].sum(-1), torch.clamp(torch.floor(lengths * t).long(), min=1))
    other = make_batch(full_model, seed=1)
    assert not torch.equal(content.draw(other, gen(1)).masked, masks)
    stream = build_estimator("sdmc_elbo")
    assert stream.mask_seed == "stream"
    assert not torch.equal(stream.draw(batch, gen(1)).masked, stream.draw(batch, gen(2)).masked)
    with pytest.raises(UserError, match="mask_seed must be one of stream, content"):
        build_estimator("sdmc_elbo", mask_seed="hash")


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_sdmc_quadrature_is_exact_for_polynomials_of_degree_2n_minus_1(nodes):
    """Gauss-Legendre with n points integrates t^d exactly on [0, 1] for d <= 2n - 1, and its weights sum to 1."""
    times, weights = build_estimator("sdmc_elbo", nodes=nodes).quadrature()
    for degree in range(2 * nodes):
        integral = sum(w * t**degree for t, w in zip(times, weights, strict=True))
        assert integral == pytest.approx(1 / (degree + 1), abs=1e-12)


def test_spg_matches_slow_loop(any_model):
    batch = make_batch(any_model)
    est = build_estimator("spg_block", num_mc=2, p_mask_prompt=0.3, block_length=BLOCK, eubo_beta=1.5)
    noise = est.draw(batch, gen(2))
    out = est.evaluate(any_model, batch, noise)
    elbo, eubo, tokens = slow_spg(any_model, batch, noise, 1.5)
    assert close(out.elbo, elbo)
    assert close(out.eubo, eubo)
    assert close(out.token_logp, tokens)
    assert torch.equal(out.row_to_seq, torch.tensor([0, 0, 1, 1, 2, 2]))


@pytest.mark.parametrize("reduce_var", [True, False])
def test_espo_matches_slow_loop(any_model, reduce_var):
    batch = make_batch(any_model)
    est = build_estimator("espo_elbo", num_mc=2, reduce_var=reduce_var)
    noise = est.draw(batch, gen(3))
    out = est.evaluate(any_model, batch, noise)
    assert close(out.elbo, slow_espo(any_model, batch, noise, reduce_var))


@pytest.mark.parametrize("scale", ["mean", "sum"])
def test_staircase_matches_separate_block_passes(block_model, scale):
    batch = make_batch(block_model)
    est = build_estimator("staircase_elbo", num_mc=2, scale=scale, eubo_beta=1.5).bind(block_model)
    assert est.block_length == BLOCK
    noise = est.draw(batch, gen(4))
    out = est.evaluate(block_model, batch, noise)
    elbo, eubo, tokens = slow_staircase(block_model, batch, noise, scale, 1.5)
    assert close(out.elbo, elbo)
    assert close(out.eubo, eubo)
    assert close(out.token_logp, tokens)


def test_staircase_on_full_attention_model_with_explicit_block(full_model):
    batch = make_batch(full_model)
    est = build_estimator("staircase_elbo", num_mc=1, block_length=BLOCK, scale="sum")
    noise = est.draw(batch, gen(5))
    out = est.evaluate(full_model, batch, noise)
    assert close(out.elbo, slow_staircase(full_model, batch, noise, "sum", 1.5)[0])


TRACE_STEPS = torch.tensor(
    [
        [0, 0, 1, 2, 2, 3, 4, 5],
        [3, 1, 0, 2, 5, 4, 6, 7],  # valid length 6: steps 6, 7 are post-EOS
        [1, 0, 2, 2, 3, 3, 3, 3],  # valid length 2
    ]
)


@pytest.mark.parametrize(("shrink", "post_num"), [(1, 0), (2, 0), (3, 1)])
def test_trace_replay_matches_slow_loop(any_model, shrink, post_num):
    batch = make_batch(any_model, unmask_step=TRACE_STEPS)
    est = build_estimator("trace_replay", shrink=shrink, post_num=post_num)
    out = est.evaluate(any_model, batch, est.draw(batch, gen(0)))
    block = BLOCK if any_model.attention == "block" else None
    rows = slow_trace_plan(TRACE_STEPS.tolist(), batch.completion_mask.sum(-1).tolist(), shrink, post_num, block)
    assert out.row_to_seq.tolist() == [r[0] for r in rows]
    assert out.token_mask.tolist() == [r[2] for r in rows]
    assert close(out.token_logp, slow_trace(any_model, batch, shrink, post_num))


# ====================================================================================== trace replay plans
def test_trace_plan_hand_computed_full():
    steps = torch.tensor([[0, 0, 1, 2, 2, 3, 4, 5]])
    cm = torch.ones(1, L, dtype=torch.bool)
    plan = trace_replay_plan(steps, cm, shrink=1, post_num=0, block_size=None)
    assert plan.row_to_seq.tolist() == [0] * 6
    assert plan.masked[2].tolist() == [False, False, False, True, True, True, True, True]
    assert plan.targets[2].tolist() == [False, False, False, True, True, False, False, False]
    plan = trace_replay_plan(steps, cm, shrink=2, post_num=0, block_size=None)  # groups {0,1} {2,3} {4,5}
    assert plan.masked.tolist() == [[True] * 8, [False] * 3 + [True] * 5, [False] * 6 + [True] * 2]
    assert plan.targets.int().tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 1, 1]]


def test_trace_plan_hand_computed_blocks():
    steps = torch.tensor([[0, 0, 1, 2, 3, 5, 4, 3]])  # block 0: {0,1,2}, block 1: {3,4,5}
    cm = torch.ones(1, L, dtype=torch.bool)
    plan = trace_replay_plan(steps, cm, shrink=1, post_num=0, block_size=4)
    assert plan.masked.int().tolist() == [[1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 1, 1, 0], [0, 0, 0, 1, 0, 1, 0, 0]]
    assert plan.targets.int().tolist() == [[1, 1, 0, 0, 1, 0, 0, 1], [0, 0, 1, 0, 0, 0, 1, 0], [0, 0, 0, 1, 0, 1, 0, 0]]


@pytest.mark.parametrize("block_size", [None, 4, 3])
@pytest.mark.parametrize(("shrink", "post_num"), [(1, 0), (2, 0), (4, 2)])
def test_trace_plan_covers_each_target_once(block_size, shrink, post_num):
    g = gen(7)
    steps = torch.randint(0, 12, (4, L), generator=g)
    cm = torch.arange(L) < torch.tensor([[8], [5], [1], [3]])
    plan = trace_replay_plan(steps, cm, shrink=shrink, post_num=post_num, block_size=block_size)
    eligible = torch.arange(L) < cm.sum(-1, keepdim=True) + post_num
    coverage = torch.zeros(4, L, dtype=torch.long).index_add_(0, plan.row_to_seq, plan.targets.long())
    assert torch.equal(coverage, eligible.long())
    rows = slow_trace_plan(steps.tolist(), cm.sum(-1).tolist(), shrink, post_num, block_size)
    assert plan.row_to_seq.tolist() == [r[0] for r in rows]
    assert plan.masked.tolist() == [r[1] for r in rows]
    assert plan.targets.tolist() == [r[2] for r in rows]


def test_trace_replay_needs_unmask_step(full_model):
    est = build_estimator("trace_replay")
    batch = make_batch(full_model)
    with pytest.raises(UserError, match="unmask_step"):
        est.evaluate(full_model, batch, est.draw(batch, gen(0)))


# ====================================================================================== draw semantics
def test_spg_draw_structure_and_count_bounds():
    """Chosen block, count bounds, later/post-EOS masking, pads never masked, p-masking rate."""
    n_rep, length, bl, p = 100, 16, 8, 0.3
    valid = torch.tensor([16, 11, 3, 8] * n_rep)
    cm = torch.arange(length) < valid.unsqueeze(1)
    prompt_mask = torch.ones(len(valid), 5, dtype=torch.bool)
    prompt_mask[:, :2] = False
    batch = SequenceBatch(torch.zeros(len(valid), 5, dtype=torch.long), prompt_mask, torch.zeros_like(cm).long(), cm)
    est = build_estimator("spg_block", num_mc=2, p_mask_prompt=p, block_length=bl, min_t=0.25, max_t=0.75)
    noise = est.draw(batch, gen(8))
    blk = torch.arange(length) // bl
    seen = set()
    for i in range(len(valid)):
        n_valid = (int(valid[i]) - 1) // bl + 1
        chosen = noise.block[i].tolist()
        if n_valid == 2:
            assert sorted(chosen) == [0, 1]  # a permutation of the 2 blocks
        for j, c in enumerate(chosen):
            assert 0 <= c < n_valid
            m_len = min(bl, int(valid[i]) - bl * c)
            low, high = max(math.floor(m_len * 0.25), 1), min(math.floor(m_len * 0.75), m_len)
            count = int(noise.count[i, j])
            assert low <= count <= high
            seen.add((m_len, count))
            masked = noise.completion_masked[i, j]
            assert int((masked & cm[i] & (blk == c)).sum()) == count
            assert masked[blk > c].all() and masked[~cm[i]].all()
    assert {(8, c) for c in range(2, 7)} <= seen  # every allowed count of a full block occurs
    assert not noise.prompt_masked[:, :, :2].any()
    assert abs(noise.prompt_masked[:, :, 2:].double().mean().item() - p) < 0.03
    earlier = (blk.unsqueeze(0) < noise.block.unsqueeze(-1)).expand_as(noise.completion_masked)
    assert abs(noise.completion_masked[earlier].double().mean().item() - p) < 0.05


def test_spg_full_range_counts():
    """Default t range: counts U{1..m_len}; a 3-token final block gives exactly 1..3."""
    cm = (torch.arange(8) < 7).repeat(200, 1)  # blocks of 4: second block has 3 valid tokens
    batch = SequenceBatch(torch.zeros(200, 1, dtype=torch.long), torch.ones(200, 1, dtype=torch.bool), cm.long(), cm)
    noise = build_estimator("spg_block", num_mc=2, block_length=4).draw(batch, gen(9))
    second = noise.count[noise.block == 1]
    first = noise.count[noise.block == 0]
    assert set(second.tolist()) == {1, 2, 3}
    assert set(first.tolist()) == {1, 2, 3, 4}


def test_espo_draw_is_stratified(full_model):
    batch = make_batch(full_model)
    noise = build_estimator("espo_elbo", num_mc=3).draw(batch, gen(10))
    for j, kappa in enumerate(noise.kappa.tolist()):
        assert 0 <= kappa <= L
        for i in range(3):
            assert int(noise.count[i, j]) == round(kappa + i * (L + 1) / 3) % (L + 1)
    assert torch.equal(noise.masked.sum(-1), noise.count)


def test_staircase_draw_counts(block_model):
    batch = make_batch(block_model)
    noise = build_estimator("staircase_elbo", num_mc=50, block_length=BLOCK).draw(batch, gen(11))
    cm = batch.completion_mask
    valid = cm.view(3, 2, BLOCK).sum(-1)  # v_b per (sequence, block)
    per_block = (noise.masked & cm.unsqueeze(1)).view(3, 50, 2, BLOCK).sum(-1)
    assert torch.equal(per_block, noise.count)
    assert (noise.count >= valid.unsqueeze(1).clamp(max=1)).all() and (noise.count <= valid.unsqueeze(1)).all()
    assert noise.masked[~cm.unsqueeze(1).expand_as(noise.masked)].all()
    assert set(noise.count[0, :, 0].tolist()) == {1, 2, 3, 4}


@pytest.mark.parametrize(
    "name",
    sorted(
        set(ESTIMATORS)
        - {"trace_replay", "ar_replay", "chosen_steps", "advantage_steps", "tree_transitions", "igpo_one_step"}
    ),
)  # no draws
def test_draw_deterministic_per_seed(full_model, name):
    batch = make_batch(full_model)
    est = build_estimator(name, **({"block_length": BLOCK} if name in ("spg_block", "staircase_elbo") else {}))
    a, b, c = est.draw(batch, gen(12)), est.draw(batch, gen(12)), est.draw(batch, gen(13))
    fields = [f for f in vars(a) if isinstance(getattr(a, f), torch.Tensor)]
    assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields)
    assert any(not torch.equal(getattr(a, f), getattr(c, f)) for f in fields)


# ====================================================================================== ESPO edge cases
@pytest.mark.parametrize("reduce_var", [True, False])
def test_espo_empty_sets_are_finite(full_model, reduce_var):
    batch = make_batch(full_model)
    count = torch.tensor([[0, L], [L, 0], [3, 5]])
    masked = torch.arange(L).view(1, 1, L) < count.unsqueeze(-1)
    noise = ESPONoise(masked=masked, count=count, kappa=torch.tensor([0, 0]))
    out = build_estimator("espo_elbo", num_mc=2, reduce_var=reduce_var).evaluate(full_model, batch, noise)
    assert torch.isfinite(out.elbo).all()
    assert close(out.elbo, slow_espo(full_model, batch, noise, reduce_var))


# ====================================================================================== coupling, chunking, grads
ALL_CASES = [
    ("d1_one_step", {}),
    ("coupled_pair", {}),
    ("sdmc_elbo", {}),
    ("spg_block", {"block_length": BLOCK}),
    ("espo_elbo", {}),
    ("trace_replay", {"shrink": 2}),
    ("staircase_elbo", {"block_length": BLOCK, "num_mc": 2}),
    ("denoise_pair", {"num_mc": 2}),
    ("stratified_elbo", {"num_mc": 2}),
    ("trace_sample", {"num_mc": 2}),
    ("ar_replay", {}),
]


def _tensors(est):
    return {k: v for k, v in vars(est).items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize(("name", "kwargs"), ALL_CASES)
def test_coupled_identical_and_independent_differs(any_model, name, kwargs):
    batch = make_batch(any_model, unmask_step=TRACE_STEPS)
    est = build_estimator(name, **kwargs)
    noise = est.draw(batch, gen(14))
    with torch.no_grad():
        old = est.evaluate(any_model, batch, noise)
    new = est.evaluate(any_model, batch, noise)
    for key, value in _tensors(old).items():
        assert torch.equal(value, _tensors(new)[key].detach()), key
    if name not in ("trace_replay", "ar_replay"):  # deterministic: there is nothing to draw independently
        other = est.evaluate(any_model, batch, est.draw(batch, gen(15)))
        main = "token_logp" if name in ("d1_one_step", "coupled_pair", "trace_sample") else "elbo"
        assert not torch.equal(_tensors(old)[main], _tensors(other)[main].detach())


@pytest.mark.parametrize(("name", "kwargs"), ALL_CASES)
def test_chunked_equals_unchunked(any_model, name, kwargs):
    batch = make_batch(any_model, unmask_step=TRACE_STEPS)
    whole = build_estimator(name, **kwargs)
    chunked = build_estimator(name, micro_batch_size=2, **kwargs)
    noise = whole.draw(batch, gen(16))
    with torch.no_grad():
        a, b = whole.evaluate(any_model, batch, noise), chunked.evaluate(any_model, batch, noise)
    for key, value in _tensors(a).items():
        other = _tensors(b)[key]
        assert torch.equal(value, other) if value.dtype in (torch.bool, torch.long) else close(value, other), key


@pytest.mark.parametrize(("name", "kwargs"), ALL_CASES)
def test_gradients_flow(any_model, name, kwargs):
    batch = make_batch(any_model, unmask_step=TRACE_STEPS)
    est = build_estimator(name, **kwargs)
    out = est.evaluate(any_model, batch, est.draw(batch, gen(17)))
    for field in ("elbo", "eubo", "token_logp"):
        value = getattr(out, field)
        if value is None:
            continue
        any_model.model.zero_grad()
        value.sum().backward(retain_graph=True)
        grads = [p.grad for p in any_model.model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads), field
        assert any(g.abs().sum() > 0 for g in grads), field
    any_model.model.zero_grad()


def test_float32_model_gives_float32_logps():
    model = build_tiny(attention="full", seed=0, **TINY)
    batch = make_batch(model)
    est = build_estimator("d1_one_step")
    assert est.evaluate(model, batch, est.draw(batch, gen(0))).token_logp.dtype == torch.float32


# ====================================================================================== bad input
@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("nope", {}, "unknown estimator"),
        ("d1_one_step", {"num_mc": 2}, "no option"),
        ("d1_one_step", {"p_mask_prompt": 1.5}, "p_mask_prompt"),
        ("coupled_pair", {"t_min": 0.9, "t_max": 0.5}, "t_min"),
        ("coupled_pair", {"t_max": 1.0}, "t_max"),
        ("sdmc_elbo", {"nodes": 7}, "nodes"),
        ("sdmc_elbo", {"mc_samples": 0}, "mc_samples"),
        ("spg_block", {"num_mc": 0}, "num_mc"),
        ("spg_block", {"min_t": 0.8, "max_t": 0.2}, "min_t"),
        ("spg_block", {"eubo_beta": 0}, "eubo_beta"),
        ("espo_elbo", {"reduce_var": "yes"}, "reduce_var"),
        ("espo_elbo", {"num_mc": 1.5}, "num_mc"),
        ("trace_replay", {"shrink": 0}, "shrink"),
        ("trace_replay", {"post_num": -1}, "post_num"),
        ("trace_sample", {"num_mc": 0}, "num_mc"),
        ("trace_sample", {"low_discrepancy": 1}, "low_discrepancy"),
        ("denoise_pair", {"inverse_t": "no"}, "inverse_t"),
        ("stratified_elbo", {"num_mc": 0}, "num_mc"),
        ("staircase_elbo", {"scale": "median"}, "scale"),
        ("staircase_elbo", {"block_length": 0}, "block_length"),
        ("d1_one_step", {"micro_batch_size": 0}, "micro_batch_size"),
    ],
)
def test_bad_options_raise_user_error(name, kwargs, match):
    with pytest.raises(UserError, match=match):
        build_estimator(name, **kwargs)


def test_bad_shapes_for_batch_raise_user_error(full_model):
    batch = make_batch(full_model)
    with pytest.raises(UserError, match="num_mc"):
        build_estimator("spg_block", num_mc=3, block_length=BLOCK).draw(batch, gen(0))
    with pytest.raises(UserError, match="bind"):
        build_estimator("staircase_elbo").draw(batch, gen(0))
    with pytest.raises(UserError, match="block_size"):
        build_estimator("staircase_elbo").bind(full_model)
