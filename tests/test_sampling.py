"""Samplers against slow loop references written here (one row, one step, one position at a time).

The tiny models run in float64 so that batched, cached, padded and per-row computations agree to ~1e-15 and
argmax / confidence orderings are never decided by rounding. ``initializer_range=1.0`` makes their predictions
peaked enough that confidence thresholds (dynamic decoding) actually matter.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from stabledrl_bench.core.models import build_tiny
from stabledrl_bench.core.sampling import (
    RECORD_FIELDS,
    SETTINGS_TYPES,
    BlockDecode,
    DecodeSettingsError,
    FullDecode,
    _FullContext,
    _select_by_factor,
    _with_completion,
    block_diffusion_generate,
    filter_logits,
    generate,
    llada_generate,
    recorded_decode,
    transfer_schedule,
)
from stabledrl_bench.errors import UserError

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
PROMPTS = ["What is 2+3?", "hi", "Count: 1 2 3"]
NEG_INF = float("-inf")
REPO = Path(__file__).resolve().parents[1]


def _tiny(attention: str, seed: int = 0):
    model = build_tiny(attention=attention, block_size=4, seed=seed, initializer_range=1.0, **TINY)
    model.model.double().eval()
    return model


@pytest.fixture(scope="module")
def full_model():
    return _tiny("full")


@pytest.fixture(scope="module")
def block_model():
    return _tiny("block")


def _prompts(model, texts=PROMPTS):
    return model.encode_prompts(texts, chat_template=False)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------- references
def _schedule(masked: int, steps: int) -> list[int]:
    base, extra = divmod(masked, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


def _pick(candidates: list[tuple[float, int]], count: int) -> list[int]:
    """The ``count`` positions of highest confidence; equal confidence -> lower position first."""
    return [pos for _, pos in sorted(candidates, key=lambda c: (-c[0], c[1]))[:count]]


def _draw(logit: list[float], temperature: float, u: torch.Tensor | None) -> int:
    """LLaDA's token at one position: the argmax at tau = 0, else the argmax of its Gumbel-max form
    exp(l) / (-log u)^tau with ``u`` [V] the position's uniforms (a -inf logit, MASK's, never wins)."""
    if temperature == 0:
        return max(range(len(logit)), key=lambda v: logit[v])
    weights = [
        0.0 if lv == NEG_INF else math.exp(lv) / (-math.log(u[v].item())) ** temperature for v, lv in enumerate(logit)
    ]
    return max(range(len(weights)), key=lambda v: weights[v])


def _proposals(model, row, row_logits, lo, width, temperature, u) -> dict[int, tuple[int, float]]:
    """Every masked position of ``row[lo : lo + width]`` with the token drawn there (``u`` [width, V] its uniforms)
    and that token's probability under the untempered distribution, MASK excluded."""
    found = {}
    for k in range(width):
        if row[lo + k] != model.mask_id:
            continue
        logit = row_logits[lo + k].tolist()
        logit[model.mask_id] = NEG_INF
        token = _draw(logit, temperature, None if u is None else u[k])
        found[lo + k] = (token, _probability(logit, token))
    return found


def _probability(values: list[float], index: int) -> float:
    """softmax(values)[index] in plain Python (values may hold -inf)."""
    top = max(values)
    total = sum(math.exp(v - top) for v in values if v != NEG_INF)
    return math.exp(values[index] - top) / total


def ref_llada(
    model,
    ids,
    valid,
    *,
    max_completion_length,
    block_length,
    steps,
    temperature=0.0,
    remasking="low_confidence",
    cfg_scale=0.0,
    generator=None,
    canvas=None,
):
    """LLaDA generate.py, one row and one position at a time.

    Randomness is drawn per step for the whole batch in the sampler's order (Gumbel uniforms [B, block, V],
    then random confidences [B, block]), and the Gumbel-max uses LLaDA's own form exp(l) / (-log u)^tau.
    ``canvas`` [B, L]: a completion canvas whose non-MASK tokens stay fixed (IGPO's ``generate_inpainting``, whose
    schedule counts the block's MASK positions only, as this one always does); all MASK by default.
    """
    batch, plen = ids.shape
    start = [[model.mask_id] * max_completion_length] * batch if canvas is None else canvas.tolist()
    rows = [ids[r].tolist() + list(start[r]) for r in range(batch)]
    keys = [valid[r].tolist() + [True] * max_completion_length for r in range(batch)]
    steps_of = [[-1] * max_completion_length for _ in range(batch)]
    n_blocks = max_completion_length // block_length
    n = steps // n_blocks
    for j in range(n_blocks):
        lo = plen + j * block_length
        todo = [_schedule(sum(t == model.mask_id for t in row[lo : lo + block_length]), n) for row in rows]
        for i in range(n):
            u = rnd = None
            if temperature > 0:
                u = torch.rand((batch, block_length, model.vocab_size), generator=generator, dtype=torch.float64)
            if remasking == "random":
                rnd = torch.rand((batch, block_length), generator=generator, dtype=torch.float64)
            for r in range(batch):
                row_logits = _row_logits_full(model, rows[r], keys[r], plen, valid[r], cfg_scale)
                uniforms = None if u is None else u[r]
                proposal = _proposals(model, rows[r], row_logits, lo, block_length, temperature, uniforms)
                random = remasking == "random"
                candidates = [(rnd[r, pos - lo].item() if random else p, pos) for pos, (_, p) in proposal.items()]
                for pos in _pick(candidates, todo[r][i]):
                    rows[r][pos] = proposal[pos][0]
                    steps_of[r][pos - plen] = j * n + i
    return torch.tensor(rows), torch.tensor(steps_of)


def _row_logits_full(model, row, keys, plen, prompt_valid, cfg_scale):
    """Logits [T, V] of one row under key padding; with CFG two separate forwards combined by hand."""
    cond = model.logits(torch.tensor([row]), attention_mask=torch.tensor([keys]))[0]
    if cfg_scale == 0:
        return cond
    uncond_row = [model.mask_id if p < plen and prompt_valid[p] else t for p, t in enumerate(row)]
    uncond = model.logits(torch.tensor([uncond_row]), attention_mask=torch.tensor([keys]))[0]
    return uncond + (cfg_scale + 1) * (cond - uncond)


def _filtered(logit: list[float], top_k: int, top_p: float) -> list[float]:
    """SDAR's filters in plain Python: keep scores >= the k-th largest, then the nucleus up to mass p."""
    out = list(logit)
    if 0 < top_k < len(out):
        kth = sorted(out, reverse=True)[top_k - 1]
        out = [v if v >= kth else NEG_INF for v in out]
    if top_p < 1.0:
        order = sorted(range(len(out)), key=lambda v: -out[v])
        mass = 0.0
        for v in order:
            p = _probability(out, v) if out[v] != NEG_INF else 0.0
            if mass > top_p:
                out[v] = NEG_INF
            mass += p
    return out


def ref_block(
    model,
    ids,
    valid,
    *,
    max_completion_length,
    steps_per_block,
    strategy="static",
    threshold=0.9,
    top_k=0,
    top_p=1.0,
    stop_at_eos=False,
):
    """Greedy SDAR block diffusion for one row at a time, recomputing everything under a hand-built mask."""
    batch, plen = ids.shape
    bs = model.block_size
    out_rows, out_steps = [], []
    for r in range(batch):
        row = ids[r].tolist() + [model.mask_id] * max_completion_length
        keys = valid[r].tolist() + [True] * max_completion_length
        steps_of = [-1] * max_completion_length
        for j in range(max_completion_length // bs):
            lo, hi = plen + j * bs, plen + (j + 1) * bs
            quota = _schedule(bs, steps_per_block)
            for i in range(steps_per_block):
                masked = [p for p in range(lo, hi) if row[p] == model.mask_id]
                if not masked:
                    break
                allowed = [[keys[k] and (k - plen) // bs <= (q - plen) // bs for k in range(hi)] for q in range(hi)]
                logits = model.logits(
                    torch.tensor([row[:hi]]),
                    torch.tensor([[allowed]]),
                    torch.arange(hi)[None],
                )[0]
                candidates, proposal = [], {}
                for pos in masked:
                    logit = logits[pos].tolist()
                    logit[model.mask_id] = NEG_INF
                    logit = _filtered(logit, top_k, top_p)
                    token = max(range(len(logit)), key=lambda v: logit[v])
                    candidates.append((_probability(logit, token), pos))
                    proposal[pos] = token
                count = min(quota[i], len(masked))
                chosen = [pos for conf, pos in candidates if conf > threshold]
                if strategy == "static" or len(chosen) < count:
                    chosen = _pick(candidates, count)
                for pos in chosen:
                    row[pos] = proposal[pos]
                    steps_of[pos - plen] = j * steps_per_block + i
            if stop_at_eos and any(t in model.stop_ids for t in row[lo:hi]):
                row[hi:] = [model.eos_id] * (len(row) - hi)
                break
        out_rows.append(row)
        out_steps.append(steps_of)
    return torch.tensor(out_rows), torch.tensor(out_steps)


# ---------------------------------------------------------------------------------------------- helpers
def _count_forwards(monkeypatch, model) -> list[int]:
    """Record the batch size of every model forward."""
    calls: list[int] = []
    original = model._forward

    def counting(input_ids, *args, **kwargs):
        calls.append(input_ids.shape[0])
        return original(input_ids, *args, **kwargs)

    monkeypatch.setattr(model, "_forward", counting)
    return calls


def _check_trajectory(out, steps_per_block: int, block: int) -> None:
    steps = out.unmask_step
    assert bool((steps >= 0).all()), "every completion token has an unmask step"
    first = torch.arange(steps.shape[1]) // block * steps_per_block
    assert bool(((steps >= first) & (steps < first + steps_per_block)).all()), "steps stay in their block's range"


def _replay(model, out, prompt_mask, plen: int, block_causal: bool, only=None) -> None:
    """Mask every position committed at step >= s, predict: the argmax at the step-s positions is the token.

    ``only``: the steps to check (default every step).
    """
    seq, steps = out.sequences, out.unmask_step
    keys = torch.cat((prompt_mask, torch.ones_like(steps, dtype=torch.bool)), dim=1)
    for s in only if only is not None else sorted(set(steps.flatten().tolist()) - {-1}):
        state = seq.clone()
        state[:, plen:][steps >= s] = model.mask_id
        if block_causal:
            total = seq.shape[1]
            blk = (torch.arange(total) - plen).div(model.block_size, rounding_mode="floor")
            mask = (blk[None, :] <= blk[:, None])[None, None] & keys[:, None, None, :]
        else:
            mask = keys
        logits = model.logits(state, mask).double()
        logits[..., model.mask_id] = NEG_INF
        pred = logits.argmax(-1)[:, plen:]
        now = steps == s
        assert torch.equal(pred[now], seq[:, plen:][now]), f"replay differs at step {s}"


# ---------------------------------------------------------------------------------------------- unit pieces
def test_transfer_schedule_hand_values():
    got = transfer_schedule(torch.tensor([8, 5, 3, 0]), 4)
    assert got.tolist() == [[2, 2, 2, 2], [2, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0]]


def test_filter_logits_hand_values():
    scores = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64).log()
    top2 = filter_logits(scores, 2, 1.0)
    assert torch.equal(top2[:2], scores[:2]) and bool(torch.isinf(top2[2:]).all())
    # mass before each token: 0, 0.5, 0.8, 0.95 -> top_p 0.7 keeps 2 tokens, 0.85 keeps 3, 0.4 keeps 1
    for top_p, kept in ((0.7, 2), (0.85, 3), (0.4, 1)):
        assert int(torch.isfinite(filter_logits(scores, 0, top_p)).sum()) == kept
    assert torch.equal(filter_logits(scores, 3, 0.85), filter_logits(scores, 0, 0.85))
    # ties at the k-th value are all kept
    assert int(torch.isfinite(filter_logits(torch.tensor([1.0, 2.0, 2.0, 0.0]), 1, 1.0)).sum()) == 2


# ---------------------------------------------------------------------------------------------- LLaDA sampler
@pytest.mark.parametrize(
    ("max_completion_length", "block_length", "steps", "cfg_scale"),
    [(12, 4, 9, 0.0), (8, 8, 8, 0.0), (8, 4, 4, 0.5)],
)
def test_llada_greedy_matches_reference(full_model, max_completion_length, block_length, steps, cfg_scale):
    ids, mask = _prompts(full_model)
    kwargs = {
        "max_completion_length": max_completion_length,
        "block_length": block_length,
        "steps": steps,
        "cfg_scale": cfg_scale,
    }
    out = llada_generate(full_model, ids, mask, **kwargs)
    seq, steps_of = ref_llada(full_model, ids, mask, **kwargs)
    assert torch.equal(out.sequences, seq)
    assert torch.equal(out.unmask_step, steps_of)
    assert torch.equal(out.completion_ids, seq[:, ids.shape[1] :])
    assert out.nfe == steps * (2 if cfg_scale else 1)


@pytest.mark.parametrize(("temperature", "remasking"), [(2.0, "low_confidence"), (0.0, "random"), (1.3, "random")])
def test_llada_sampled_matches_reference_with_shared_generator(full_model, temperature, remasking):
    ids, mask = _prompts(full_model)
    kwargs = {
        "max_completion_length": 8,
        "block_length": 4,
        "steps": 6,
        "temperature": temperature,
        "remasking": remasking,
    }
    out = llada_generate(full_model, ids, mask, generator=_gen(11), **kwargs)
    seq, steps_of = ref_llada(full_model, ids, mask, generator=_gen(11), **kwargs)
    assert torch.equal(out.sequences, seq)
    assert torch.equal(out.unmask_step, steps_of)


def test_llada_left_padded_batch_equals_single_rows(full_model):
    ids, mask = _prompts(full_model)
    assert not bool(mask.all()), "the batch must actually be padded"
    out = llada_generate(full_model, ids, mask, max_completion_length=8, block_length=4, steps=4)
    for r in range(ids.shape[0]):
        alone = ids[r][mask[r]][None]
        single = llada_generate(full_model, alone, None, max_completion_length=8, block_length=4, steps=4)
        assert torch.equal(single.completion_ids[0], out.completion_ids[r])
        assert torch.equal(single.unmask_step[0], out.unmask_step[r])


def test_llada_trajectory_schedule_and_replay(full_model):
    ids, mask = _prompts(full_model)
    out = llada_generate(full_model, ids, mask, max_completion_length=12, block_length=4, steps=9)
    _check_trajectory(out, steps_per_block=3, block=4)
    per_step = torch.stack([(out.unmask_step == s).sum(1) for s in range(9)], dim=1)
    assert per_step.tolist() == [[2, 1, 1] * 3] * 3
    assert not bool((out.completion_ids == full_model.mask_id).any())
    _replay(full_model, out, mask, ids.shape[1], block_causal=False)


def test_llada_cfg_first_step_by_hand(full_model):
    ids, mask = _prompts(full_model)
    scale = 1.5
    out = llada_generate(full_model, ids, mask, max_completion_length=4, block_length=4, steps=2, cfg_scale=scale)
    plen = ids.shape[1]
    x = torch.cat((ids, torch.full((3, 4), full_model.mask_id)), dim=1)
    keys = torch.cat((mask, torch.ones(3, 4, dtype=torch.bool)), dim=1)
    uncond = x.clone()
    uncond[:, :plen] = torch.where(mask, full_model.mask_id, ids)
    cond_l, uncond_l = full_model.logits(x, keys), full_model.logits(uncond, keys)
    logits = (uncond_l + (scale + 1) * (cond_l - uncond_l))[:, plen:].double()
    logits[..., full_model.mask_id] = NEG_INF
    tokens = logits.argmax(-1)
    conf = logits.softmax(-1).gather(-1, tokens[..., None])[..., 0]
    first = conf.topk(2, dim=1).indices
    for r in range(3):
        assert sorted(first[r].tolist()) == sorted((out.unmask_step[r] == 0).nonzero()[:, 0].tolist())
        assert torch.equal(out.completion_ids[r, first[r]], tokens[r, first[r]])
    assert out.nfe == 4


def test_llada_nfe_counts_forwards(monkeypatch):
    model = _tiny("full")
    ids, mask = _prompts(model)
    calls = _count_forwards(monkeypatch, model)
    assert llada_generate(model, ids, mask, max_completion_length=8, block_length=4, steps=6).nfe == len(calls) == 6
    calls.clear()
    out = llada_generate(model, ids, mask, max_completion_length=8, block_length=4, steps=6, cfg_scale=0.3)
    assert calls == [6] * 6 and out.nfe == 12  # both CFG halves in one forward of 2B rows


# ---------------------------------------------------------------------------------------------- block diffusion
@pytest.mark.parametrize(
    ("strategy", "steps_per_block", "top_k", "top_p", "use_cache"),
    [
        ("static", 4, 0, 1.0, True),
        ("static", 3, 0, 1.0, False),
        ("static", 2, 5, 0.8, True),
        ("dynamic", 4, 0, 1.0, True),
        ("dynamic", 2, 0, 0.9, False),
        ("dynamic", 6, 4, 1.0, True),
    ],
)
def test_block_greedy_matches_reference(block_model, strategy, steps_per_block, top_k, top_p, use_cache):
    ids, mask = _prompts(block_model)
    kwargs = {"max_completion_length": 12, "steps_per_block": steps_per_block, "strategy": strategy, "threshold": 0.6}
    kwargs |= {"top_k": top_k, "top_p": top_p}
    out = block_diffusion_generate(block_model, ids, mask, use_cache=use_cache, **kwargs)
    seq, steps_of = ref_block(block_model, ids, mask, **kwargs)
    assert torch.equal(out.sequences, seq)
    assert torch.equal(out.unmask_step, steps_of)
    assert not bool((out.completion_ids == block_model.mask_id).any())
    _check_trajectory(out, steps_per_block=steps_per_block, block=4)


def test_block_dynamic_is_faster_and_static_follows_quota(block_model):
    ids, mask = _prompts(block_model)
    static = block_diffusion_generate(block_model, ids, mask, max_completion_length=16, steps_per_block=4)
    dynamic = block_diffusion_generate(
        block_model, ids, mask, max_completion_length=16, steps_per_block=4, strategy="dynamic", threshold=0.6
    )
    assert dynamic.nfe < static.nfe == 1 + 16 + 3
    per_step = torch.stack([(static.unmask_step == s).sum(1) for s in range(16)], dim=1)
    assert bool((per_step == 1).all())
    uneven = block_diffusion_generate(block_model, ids, mask, max_completion_length=8, steps_per_block=3)
    per_step = torch.stack([(uneven.unmask_step == s).sum(1) for s in range(6)], dim=1)
    assert per_step.tolist() == [[2, 1, 1] * 2] * 3


def test_block_cache_equals_no_cache_when_sampling(block_model):
    ids, mask = _prompts(block_model)
    kwargs = {"max_completion_length": 12, "steps_per_block": 3, "temperature": 0.8, "top_k": 20, "top_p": 0.95}
    cached = block_diffusion_generate(block_model, ids, mask, use_cache=True, generator=_gen(5), **kwargs)
    plain = block_diffusion_generate(block_model, ids, mask, use_cache=False, generator=_gen(5), **kwargs)
    assert torch.equal(cached.sequences, plain.sequences)
    assert torch.equal(cached.unmask_step, plain.unmask_step)
    assert (cached.nfe, plain.nfe) == (1 + 9 + 2, 9)


def test_block_left_padded_batch_equals_single_rows(block_model):
    ids, mask = _prompts(block_model)
    out = block_diffusion_generate(
        block_model, ids, mask, max_completion_length=8, steps_per_block=2, strategy="dynamic"
    )
    for r in range(ids.shape[0]):
        single = block_diffusion_generate(
            block_model, ids[r][mask[r]][None], None, max_completion_length=8, steps_per_block=2, strategy="dynamic"
        )
        assert torch.equal(single.completion_ids[0], out.completion_ids[r])
        assert torch.equal(single.unmask_step[0], out.unmask_step[r])


@pytest.mark.parametrize("strategy", ["static", "dynamic"])
def test_block_trajectory_replay(block_model, strategy):
    ids, mask = _prompts(block_model)
    out = block_diffusion_generate(
        block_model, ids, mask, max_completion_length=12, steps_per_block=3, strategy=strategy, threshold=0.6
    )
    _replay(block_model, out, mask, ids.shape[1], block_causal=True)


@pytest.mark.parametrize("use_cache", [True, False])
def test_block_nfe_counts_forwards(monkeypatch, use_cache):
    model = _tiny("block")
    ids, mask = _prompts(model)
    calls = _count_forwards(monkeypatch, model)
    out = block_diffusion_generate(model, ids, mask, max_completion_length=12, steps_per_block=2, use_cache=use_cache)
    assert out.nfe == len(calls) == (1 + 6 + 2 if use_cache else 6)


@pytest.mark.parametrize("use_cache", [True, False])
def test_block_stop_at_eos(monkeypatch, use_cache):
    model = _tiny("block")
    ids, mask = _prompts(model)
    kwargs = {"max_completion_length": 16, "steps_per_block": 2, "use_cache": use_cache}
    free = block_diffusion_generate(model, ids, mask, **kwargs)
    comp = free.completion_ids
    # a stop token that appears in row 0's second block only: row 0 stops after block 1, the others never stop
    later = set(comp[1:].flatten().tolist()) | set(comp[0, :4].tolist())
    stop = sorted(set(comp[0, 4:8].tolist()) - later)
    assert stop, "test setup: need a token unique to row 0's second block"
    monkeypatch.setattr(model, "stop_ids", (*model.stop_ids, stop[0]))
    seq, steps_of = ref_block(model, ids, mask, max_completion_length=16, steps_per_block=2, stop_at_eos=True)
    calls = _count_forwards(monkeypatch, model)
    out = block_diffusion_generate(model, ids, mask, stop_at_eos=True, **kwargs)
    assert torch.equal(out.sequences, seq) and torch.equal(out.unmask_step, steps_of)
    assert torch.equal(out.completion_ids[0, :8], comp[0, :8]) and torch.equal(out.completion_ids[1:], comp[1:])
    assert bool((out.completion_ids[0, 8:] == model.eos_id).all()) and bool((out.unmask_step[0, 8:] == -1).all())
    assert out.nfe == len(calls) == free.nfe
    # every row stops after block 0: three blocks (and their store passes) are skipped
    monkeypatch.setattr(model, "stop_ids", tuple(range(model.vocab_size)))
    calls.clear()
    out = block_diffusion_generate(model, ids, mask, stop_at_eos=True, **kwargs)
    assert out.nfe == len(calls) == (1 + 2 if use_cache else 2)
    assert torch.equal(out.completion_ids[:, :4], comp[:, :4])
    assert bool((out.completion_ids[:, 4:] == model.eos_id).all())


@pytest.mark.parametrize("attention", ["full", "block"])
def test_mask_token_is_never_committed(monkeypatch, attention):
    """A model that prefers MASK everywhere still gets every position filled with a real token."""
    model = _tiny(attention)
    ids, mask = _prompts(model)
    original = model._forward

    def mask_loving(*args, **kwargs):
        logits, cache = original(*args, **kwargs)
        return logits.index_add(-1, torch.tensor([model.mask_id]), torch.full_like(logits[..., :1], 100.0)), cache

    monkeypatch.setattr(model, "_forward", mask_loving)
    out = generate(model, ids, mask, SETTINGS_TYPES[attention](max_completion_length=8, block_length=4, steps=4))
    assert not bool((out.completion_ids == model.mask_id).any()) and bool((out.unmask_step >= 0).all())


# ---------------------------------------------------------------------------------------------- randomness
@pytest.mark.parametrize("attention", ["full", "block"])
def test_sampling_is_deterministic_given_the_generator(full_model, block_model, attention):
    model = full_model if attention == "full" else block_model
    ids, mask = _prompts(model)
    settings = SETTINGS_TYPES[attention](max_completion_length=16, block_length=4, steps=8, temperature=1.0)
    first = generate(model, ids, mask, settings, _gen(1)).sequences
    assert torch.equal(first, generate(model, ids, mask, settings, _gen(1)).sequences)
    assert not torch.equal(first, generate(model, ids, mask, settings, _gen(2)).sequences)
    greedy = generate(
        model, ids, mask, SETTINGS_TYPES[attention](max_completion_length=16, block_length=4, steps=8)
    ).sequences
    assert not torch.equal(first, greedy)


# ---------------------------------------------------------------------------------------------- dispatch, errors
def test_generate_dispatches_on_attention(full_model, block_model):
    ids, mask = _prompts(full_model)
    settings = FullDecode(max_completion_length=8, block_length=4, steps=4, strategy="static")
    assert settings.to_dict()["steps"] == 4 and recorded_decode(settings.to_dict(), "full") == settings
    full = generate(full_model, ids, mask, settings)
    direct = llada_generate(full_model, ids, mask, max_completion_length=8, block_length=4, steps=4)
    assert torch.equal(full.sequences, direct.sequences) and full.nfe == 4
    block_settings = BlockDecode(max_completion_length=8, steps=6, strategy="dynamic", threshold=0.6)
    assert block_settings.steps_per_block == 3 and recorded_decode(block_settings.to_dict(), "block") == block_settings
    block = generate(block_model, ids, mask, block_settings)
    direct = block_diffusion_generate(
        block_model, ids, mask, max_completion_length=8, steps_per_block=3, strategy="dynamic", threshold=0.6
    )
    assert torch.equal(block.sequences, direct.sequences) and torch.equal(block.unmask_step, direct.unmask_step)


@pytest.mark.parametrize(
    ("attention", "kwargs", "message"),
    [
        ("full", {"max_completion_length": 10, "block_length": 4, "steps": 4}, "divide"),
        ("full", {"max_completion_length": 8, "block_length": 4, "steps": 3}, "multiple of the number of blocks"),
        ("full", {"max_completion_length": 8, "block_length": 4, "steps": 0}, "positive"),
        ("full", {"max_completion_length": 8, "block_length": 4, "steps": 4, "remasking": "entropy"}, "remasking"),
        ("full", {"max_completion_length": 8, "block_length": 4, "steps": 4, "temperature": 0.5}, "Generator"),
        ("full", {"max_completion_length": 8, "block_length": 4, "steps": 4, "remasking": "random"}, "Generator"),
        ("full", {"max_completion_length": 8, "block_length": 4, "steps": 4, "temperature": -1.0}, "temperature"),
        ("full", {"max_completion_length": 8, "block_length": 4, "steps": 4, "cfg_scale": -1.0}, "cfg_scale"),
        ("block", {"max_completion_length": 10, "steps_per_block": 2}, "multiple of the block size"),
        ("block", {"max_completion_length": 8, "steps_per_block": 2, "strategy": "fast"}, "strategy"),
        ("block", {"max_completion_length": 8, "steps_per_block": 2, "top_p": 0.0}, "top_p"),
        ("block", {"max_completion_length": 8, "steps_per_block": 2, "top_k": -1}, "top_k"),
        ("block", {"max_completion_length": 8, "steps_per_block": 2, "threshold": 1.5}, "threshold"),
        ("block", {"max_completion_length": 8, "steps_per_block": 2, "temperature": 1.0}, "Generator"),
    ],
)
def test_bad_settings_raise(full_model, block_model, attention, kwargs, message):
    model = full_model if attention == "full" else block_model
    sampler = llada_generate if attention == "full" else block_diffusion_generate
    ids, mask = _prompts(model)
    with pytest.raises(ValueError, match=message) as info:
        sampler(model, ids, mask, **kwargs)
    assert isinstance(info.value, UserError)


@pytest.mark.parametrize(
    ("kind", "kwargs", "message"),
    [
        (FullDecode, {"max_completion_length": 10, "block_length": 4}, "divide"),
        (FullDecode, {"max_completion_length": 8, "block_length": 4, "steps": 3}, "multiple of the number of blocks"),
        (FullDecode, {"strategy": "dynamic", "remasking": "random"}, "remasking='low_confidence'"),
        (FullDecode, {"cache": "dual", "cfg_scale": 1.0}, "classifier-free guidance"),
        (FullDecode, {"cache": "full"}, "cache must be one of"),
        (FullDecode, {"strategy": "factor", "factor": 0.0}, "factor must be > 0"),
        (BlockDecode, {"max_completion_length": 10}, "multiple of the block size"),
        (BlockDecode, {"strategy": "factor"}, "strategy must be one of"),
        (BlockDecode, {"top_p": 0.0}, "top_p"),
        (BlockDecode, {"block_length": 0}, "block_length must be positive"),
        (BlockDecode, {"steps": 0}, "positive"),
    ],
)
def test_settings_are_checked_when_built(kind, kwargs, message):
    """A bad setting fails where it is written (a config, a protocol), not deep inside a decode."""
    with pytest.raises(DecodeSettingsError, match=message) as info:
        kind(**kwargs)
    assert "\n" not in str(info.value)


def test_every_committed_record_reads_back_as_its_settings_type():
    """The two types write the one flat form results always had: every committed record's settings read back as
    its model's type and write the same fields, values and order again (so records stay byte-identical)."""
    seen = set()
    for path in sorted((REPO / "results").rglob("*.json")):
        record = json.loads(path.read_text())
        settings = record.get("settings") if isinstance(record, dict) else None
        if not isinstance(settings, dict) or "protocol" not in settings:
            continue
        attention = settings["protocol"]["attention"]
        decode = recorded_decode(settings, attention)
        assert isinstance(decode, SETTINGS_TYPES[attention]), path
        assert list(decode.to_dict().items()) == [(name, settings[name]) for name in RECORD_FIELDS], path
        seen.add(attention)
    assert seen == {"full", "block"}  # the committed results hold both kinds


def test_wrong_model_kind_and_bad_prompts_raise(full_model, block_model):
    ids, mask = _prompts(full_model)
    with pytest.raises(ValueError, match="full-attention"):
        llada_generate(block_model, ids, mask, max_completion_length=8, block_length=4, steps=4)
    with pytest.raises(ValueError, match="block-attention"):
        block_diffusion_generate(full_model, ids, mask, max_completion_length=8, steps_per_block=2)
    with pytest.raises(ValueError, match="left-padded"):
        llada_generate(full_model, ids, mask.flip(1), max_completion_length=8, block_length=4, steps=4)
    with pytest.raises(
        DecodeSettingsError, match=r"BlockDecode settings cannot decode .* full-attention model: give FullDecode"
    ):
        generate(full_model, ids, mask, BlockDecode(max_completion_length=8, steps=4, top_k=5))
    with pytest.raises(
        DecodeSettingsError, match=r"FullDecode settings cannot decode .* block-attention model: give BlockDecode"
    ):
        generate(block_model, ids, mask, FullDecode(max_completion_length=8, block_length=4, steps=4, cfg_scale=1.0))
    with pytest.raises(DecodeSettingsError, match=r"block_length 8 is not the block size of .* \(4\)"):
        generate(block_model, ids, mask, BlockDecode(max_completion_length=8, block_length=8, steps=4))


# ---------------------------------------------------------------------------------------------- fast full attention
# Fast-dLLM's approximations of the LLaDA sampler (cache, threshold, EOS stop), through the tiny model's own
# backend and through its emulation of Dream's (shifted logits) convention; LLaDA's published file has no cache.
CACHED = [("native", "prefix"), ("native", "dual"), ("dream", "prefix"), ("dream", "dual")]


@pytest.fixture(scope="module")
def conventions():
    models = {}
    for convention in ("native", "llada", "llada-hub", "dream"):
        model = build_tiny(attention="full", seed=0, initializer_range=1.0, convention=convention, **TINY)
        model.model.double().eval()
        models[convention] = model
    return models


def _record_inputs(monkeypatch, model) -> list[torch.Tensor]:
    """Record the input ids of every model forward."""
    inputs: list[torch.Tensor] = []
    original = model._forward

    def recording(input_ids, *args, **kwargs):
        inputs.append(input_ids.clone())
        return original(input_ids, *args, **kwargs)

    monkeypatch.setattr(model, "_forward", recording)
    return inputs


@pytest.mark.parametrize(("convention", "cache"), CACHED)
def test_cached_forward_equals_full_forward_before_commits(conventions, convention, cache):
    """Right after a block's refresh nothing changed, so the cached forward must give the full forward's logits:
    this pins the cached positions, the masks over cached + new keys, the position ids and Dream's shift."""
    model = conventions[convention]
    ids, mask = _prompts(model)
    if model.pad_free:  # that model only ever decodes unpadded groups
        ids, mask = ids[:1], mask[:1]
    x, key_valid = _with_completion(ids, mask, 12, model.mask_id)
    x[:, ids.shape[1] : ids.shape[1] + 4] = torch.tensor([20, 21, 22, 23])  # block 0 finished
    ctx = _FullContext(model, x, key_valid, mask, cache, 0.0)
    span = slice(ids.shape[1] + 4, ids.shape[1] + 8)
    full = ctx.block_logits(span, first_step=True)
    cached = ctx.block_logits(span, first_step=False)
    assert torch.allclose(cached, full, rtol=0, atol=1e-10)
    exact = model.logits(x, key_valid)[:, span]
    assert torch.allclose(full, exact, rtol=0, atol=1e-10) and ctx.nfe == 2


@pytest.mark.parametrize(("convention", "cache"), CACHED)
def test_cache_refreshed_every_step_equals_exact_decoding(conventions, convention, cache):
    """With one step per block every step is a block's refresh forward: token for token the exact sampler."""
    model = conventions[convention]
    ids, mask = _prompts(model)
    kwargs = {"max_completion_length": 12, "block_length": 4, "steps": 3}
    exact = llada_generate(model, ids, mask, **kwargs)
    out = llada_generate(model, ids, mask, cache=cache, **kwargs)
    assert torch.equal(out.sequences, exact.sequences) and torch.equal(out.unmask_step, exact.unmask_step)
    assert out.nfe == exact.nfe == 3


@pytest.mark.parametrize(("convention", "cache"), CACHED)
def test_cached_decoding_is_valid(monkeypatch, conventions, convention, cache):
    """Several steps per block: no MASK left, schedule kept, committed tokens never change, NFE unchanged, every
    forward after a block's first one is shorter, and each block's first step is exact (replayed)."""
    model = conventions[convention]
    ids, mask = _prompts(model)
    inputs = _record_inputs(monkeypatch, model)
    out = llada_generate(model, ids, mask, max_completion_length=12, block_length=4, steps=9, cache=cache)
    assert not bool((out.completion_ids == model.mask_id).any())
    _check_trajectory(out, steps_per_block=3, block=4)
    assert out.nfe == 9
    if model.pad_free:  # one unpadded group per prompt length
        assert len(inputs) == 9 * len(mask.sum(dim=1).unique())
        return
    full = [x for x in inputs if x.shape[1] == out.sequences.shape[1]]
    assert len(full) == 3 and len(inputs) == 9
    for before, after in zip(full, [*full[1:], out.sequences], strict=True):
        decided = before != model.mask_id
        assert torch.equal(after[decided], before[decided])
    _replay(model, out, mask, ids.shape[1], block_causal=False, only=[0, 3, 6])


@pytest.mark.parametrize("convention", ["llada", "llada-hub"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_llada_remote_code_has_no_cache(conventions, convention, cache):
    """LLaDA's published LLaDAModelLM drops past_key_values and use_cache, so every cache is refused in one line."""
    model = conventions[convention]
    ids, mask = _prompts(model)
    with pytest.raises(
        DecodeSettingsError, match=rf"llada backend cannot decode with cache='{cache}' \(its cache modes: none\)"
    ) as info:
        generate(model, ids, mask, FullDecode(max_completion_length=8, block_length=4, steps=4, cache=cache))
    assert "\n" not in str(info.value)


def test_bad_cache_settings_are_refused(conventions):
    ids, mask = _prompts(conventions["native"])
    with pytest.raises(DecodeSettingsError, match="classifier-free guidance"):
        llada_generate(
            conventions["native"],
            ids,
            mask,
            max_completion_length=8,
            block_length=4,
            steps=4,
            cache="prefix",
            cfg_scale=1.0,
        )
    with pytest.raises(DecodeSettingsError, match="cache must be one of"):
        llada_generate(conventions["native"], ids, mask, max_completion_length=8, block_length=4, steps=4, cache="full")
    with pytest.raises(DecodeSettingsError, match="remasking='low_confidence'"):
        llada_generate(
            conventions["native"],
            ids,
            mask,
            max_completion_length=8,
            block_length=4,
            steps=4,
            strategy="dynamic",
            remasking="random",
            generator=_gen(0),
        )


@pytest.mark.parametrize(("temperature", "cache"), [(0.0, "none"), (1.5, "none"), (0.0, "dual"), (1.5, "prefix")])
def test_threshold_disabled_equals_static_decoding(full_model, temperature, cache):
    """threshold=1 never beats the quota: dynamic decoding is static decoding, draws included."""
    ids, mask = _prompts(full_model)
    kwargs = {"max_completion_length": 12, "block_length": 4, "steps": 6, "temperature": temperature, "cache": cache}
    static = llada_generate(full_model, ids, mask, generator=_gen(3), **kwargs)
    dynamic = llada_generate(full_model, ids, mask, generator=_gen(3), strategy="dynamic", threshold=1.0, **kwargs)
    assert torch.equal(dynamic.sequences, static.sequences) and torch.equal(dynamic.unmask_step, static.unmask_step)
    if cache == "none":
        seq, steps_of = ref_llada(full_model, ids, mask, generator=_gen(3), **{k: kwargs[k] for k in list(kwargs)[:4]})
        assert torch.equal(dynamic.sequences, seq) and torch.equal(dynamic.unmask_step, steps_of)


def test_threshold_commits_confident_tokens_in_fewer_forwards(monkeypatch, full_model):
    ids, mask = _prompts(full_model)
    kwargs = {"max_completion_length": 16, "block_length": 8, "steps": 16}
    static = llada_generate(full_model, ids, mask, **kwargs)
    calls = _count_forwards(monkeypatch, full_model)
    dynamic = llada_generate(full_model, ids, mask, strategy="dynamic", threshold=0.6, **kwargs)
    assert dynamic.nfe == len(calls) < static.nfe == 16
    assert not bool((dynamic.completion_ids == full_model.mask_id).any())
    _check_trajectory(dynamic, steps_per_block=8, block=8)
    per_step = torch.stack([(dynamic.unmask_step == s).sum(1) for s in range(16)], dim=1)
    assert bool((per_step.amax(dim=1) > 1).any()), "some step commits several confident tokens"
    # greedy dynamic decoding uses exact logits: every committed token is the argmax of its step's state
    _replay(full_model, dynamic, mask, ids.shape[1], block_causal=False)


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_stop_at_eos_keeps_the_text_and_skips_the_rest(monkeypatch, cache):
    model = _tiny("full")
    ids, mask = _prompts(model)
    kwargs = {"max_completion_length": 16, "block_length": 4, "steps": 8, "cache": cache}
    free = llada_generate(model, ids, mask, **kwargs)
    comp = free.completion_ids
    # a stop token that appears in row 0's second block only: row 0 stops there, the others never stop
    later = set(comp[1:].flatten().tolist()) | set(comp[0, :4].tolist())
    stop = sorted(set(comp[0, 4:8].tolist()) - later)
    assert stop, "test setup: need a token unique to row 0's second block"
    monkeypatch.setattr(model, "stop_ids", (*model.stop_ids, stop[0]))
    calls = _count_forwards(monkeypatch, model)
    out = llada_generate(model, ids, mask, stop_at_eos=True, **kwargs)
    first = (comp[0] == stop[0]).nonzero()[0, 0]
    assert torch.equal(out.completion_ids[0, : first + 1], comp[0, : first + 1])
    assert torch.equal(out.completion_ids[1:], comp[1:]) and torch.equal(out.unmask_step[1:], free.unmask_step[1:])
    assert bool((out.completion_ids[0, 8:] == model.eos_id).all()) and bool((out.unmask_step[0, 8:] == -1).all())
    assert not bool((out.completion_ids == model.mask_id).any())
    assert out.nfe == len(calls) == free.nfe and calls[-1] == 2  # row 0 left the batch
    # every token stops: each row stops in block 0, as soon as its first committed token has no MASK before it
    monkeypatch.setattr(model, "stop_ids", tuple(t for t in range(model.vocab_size) if t != model.mask_id))
    calls.clear()
    out = llada_generate(model, ids, mask, stop_at_eos=True, **kwargs)
    assert out.nfe == len(calls) <= 2 < free.nfe
    decided = out.unmask_step >= 0
    assert torch.equal(out.completion_ids[decided], comp[decided]) and bool(decided[:, 0].all())
    assert bool((out.completion_ids[~decided] == model.eos_id).all())


FAST_MODES = [
    {"cache": "prefix"},
    {"cache": "dual"},
    {"strategy": "dynamic", "threshold": 0.6},
    {"stop_at_eos": True},
    {"cache": "dual", "strategy": "dynamic", "threshold": 0.6, "stop_at_eos": True},
]


@pytest.mark.parametrize("convention", ["native", "llada-hub", "dream"])
@pytest.mark.parametrize("mode", FAST_MODES)
def test_fast_modes_left_padded_batch_equals_single_rows(conventions, convention, mode):
    model = conventions[convention]
    if mode.get("cache", "none") not in (*model.full_cache_modes, "none"):  # e.g. LLaDA's file: no cache at all
        mode = {**mode, "cache": next(c for c in ("prefix", "none") if c in (*model.full_cache_modes, "none"))}
    ids, mask = _prompts(model)
    assert not bool(mask.all()), "the batch must actually be padded"
    settings = FullDecode(max_completion_length=12, block_length=4, steps=6, **mode)
    out = generate(model, ids, mask, settings)
    for r in range(ids.shape[0]):
        single = generate(model, ids[r][mask[r]][None], None, settings)
        assert torch.equal(single.completion_ids[0], out.completion_ids[r])
        assert torch.equal(single.unmask_step[0], out.unmask_step[r])


def test_exact_decoding_is_the_default():
    settings = FullDecode()
    assert (settings.cache, settings.strategy, settings.stop_at_eos) == ("none", "static", False)
    assert not settings.approximate
    assert all(FullDecode(**mode).approximate for mode in FAST_MODES)
    old = {k: v for k, v in settings.to_dict().items() if k not in ("cache", "factor")}  # written before them
    assert recorded_decode(old, "full") == settings


def test_factor_rule_hand_values():
    confidence = torch.tensor([[0.99, 0.5, 0.8, 0.7], [0.99, 0.5, 0.8, 0.7]], dtype=torch.float64)
    masked = torch.tensor([[True, True, True, True], [True, True, False, True]])
    # factor 1: c_(i) >= 1 - 1/(i+1) = 0.5, 0.667, 0.75, 0.8 -> ranked 0.99, 0.8 pass, 0.7 fails: two tokens;
    # row 1 has its 0.8 position committed already: ranked 0.99, 0.7 pass, 0.5 fails
    got = _select_by_factor(confidence, masked, 1, 1.0)
    assert got.tolist() == [[True, False, True, False], [True, False, False, True]]
    # a tiny factor accepts nothing beyond the quota; a huge one commits every masked position
    assert _select_by_factor(confidence, masked, 1, 1e-3).sum(dim=1).tolist() == [1, 1]
    assert torch.equal(_select_by_factor(confidence, masked, 1, 100.0), masked)


def test_factor_decoding_is_valid_and_faster(full_model):
    ids, mask = _prompts(full_model)
    kwargs = {"max_completion_length": 16, "block_length": 8, "steps": 16}
    static = llada_generate(full_model, ids, mask, **kwargs)
    assert torch.equal(
        llada_generate(full_model, ids, mask, strategy="factor", factor=1e-9, **kwargs).sequences, static.sequences
    )
    out = generate(full_model, ids, mask, FullDecode(strategy="factor", factor=2.0, **kwargs))
    assert out.nfe < static.nfe and not bool((out.completion_ids == full_model.mask_id).any())
    _replay(full_model, out, mask, ids.shape[1], block_causal=False)
    with pytest.raises(DecodeSettingsError, match="factor must be > 0"):
        llada_generate(full_model, ids, mask, strategy="factor", factor=0.0, **kwargs)
