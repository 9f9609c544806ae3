"""IGPO (``facebookresearch/igpo`` at ``e85eaea``; ``trainer_igpo.py`` and ``utils/generate.py``): the hint
placement, the all-wrong trigger and the replacement of the ``hint_injection`` rollout worked out by hand from the
official lines; the hinted decode against the slow LLaDA reference started from the hinted canvas; a rollout with
no all-wrong group bitwise the plain one; the ``igpo_one_step`` estimate against one forward per row and its
entropy filter by hand; the loss by hand and against a transcription of the official lines; how the trainer wires
them, one RL step on the tiny model included.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import small_budget
from test_egspo import PROMPTS, TINY, _gen
from test_egspo import _config as egspo_config
from test_sampling import ref_llada

from stabledrl_bench.baselines.igpo import igpo_loss
from stabledrl_bench.core.baseline import LossInputs, build_baseline
from stabledrl_bench.core.estimators import Estimate, IGPOOneStep, SequenceBatch, kept_hints
from stabledrl_bench.core.models import build_tiny
from stabledrl_bench.core.rollouts import Feedback, HintInjection, Independent, all_wrong_groups, place_chunks
from stabledrl_bench.core.sampling import BlockDecode, FullDecode, generate
from stabledrl_bench.errors import UserError
from stabledrl_bench.training.trainer import RLTrainer

# 40 tokens in blocks of 8, 2 steps per block: the last 30 positions never hold a hint, so 10 may
SETTINGS = FullDecode(max_completion_length=40, block_length=8, steps=10, temperature=1.0)
SOLUTION = list(range(40, 50))  # a worked solution of 10 tokens


@pytest.fixture(scope="module")
def model():
    dlm = build_tiny(attention="full", seed=0, initializer_range=1.0, **TINY)
    dlm.model.double().eval()
    return dlm


# -------------------------------------------------------------------------------------------------- hints
# scale_chunk_positions (generate.py lines 671-724): chunks (0, 3) and (6, 9) of a solution, stretch 1.5: the first
# at int(0 * 1.5) = 0; the gap 6 - 3 = 3 stretched to int(4.5) = 4, so the second starts at 3 + 4 = 7.
@pytest.mark.parametrize(
    ("shown", "usable", "stretch", "spacing", "expected"),
    [
        ([(0, 3), (6, 9)], 20, 1.5, 100, [(0, 3), (7, 10)]),
        ([(0, 3), (6, 9)], 20, 1.5, 2, [(0, 3), (5, 8)]),  # the gap capped at max_spacing
        ([(0, 3), (6, 9)], 9, 1.5, 100, [(0, 3), (7, 9)]),  # cut at the usable end
        ([(0, 3), (6, 9), (9, 12)], 9, 1.5, 100, [(0, 3), (7, 9)]),  # the next one would start at 9: dropped
        ([(3, 6), (6, 9)], 20, 1.5, 100, [(4, 7), (7, 10)]),  # a first chunk at 3 starts at int(4.5)
        ([(2, 5)], 20, 1.0, 100, [(2, 5)]),
    ],
)
def test_chunk_placement_by_hand(shown, usable, stretch, spacing, expected) -> None:
    assert place_chunks(shown, usable, stretch, spacing) == expected


def test_chunks_cover_the_solution_in_order() -> None:
    """Consecutive chunks of randint(min, max) tokens from position 0; a remainder shorter than min is dropped
    (lines 552-564)."""
    assert HintInjection(min_chunk_size=4, max_chunk_size=4).chunks(10, _gen(0)) == [(0, 4), (4, 8)]
    scheme = HintInjection(min_chunk_size=2, max_chunk_size=3)
    for seed in range(20):
        chunks = scheme.chunks(17, _gen(seed))
        assert chunks[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
        assert all(2 <= hi - lo <= 3 for lo, hi in chunks) and 17 - chunks[-1][1] < 2


# A 10-token solution (tokens 40..49) on a 40-token canvas: 10 usable positions, stretch min(1.5, max(1, 10 / 10))
# = 1; chunks of 3: (0, 3), (3, 6), (6, 9), the last token dropped. Ratio 0.5: int(3 * 0.5) = 1 chunk hidden:
#   chunk 0 hidden: (3, 6) at int(3 * 1) = 3, then (6, 9) right after: tokens 43..48 at 3..8
#   chunk 1 hidden: (0, 3) at 0, then (6, 9) at 3 + 3 = 6: tokens 40..42 at 0..2 and 46..48 at 6..8
#   chunk 2 hidden: the last chunk is revealed all the same: 40..48 at 0..8; without reveal_last_chunk 0..5
def _expected(positions: dict[int, int]) -> list[int]:
    return [positions.get(k, -1) for k in range(40)]


OUTCOMES = {
    0: _expected({k: 40 + k for k in range(3, 9)}),
    1: _expected({**{k: 40 + k for k in range(3)}, **{k: 40 + k for k in range(6, 9)}}),
    2: _expected({k: 40 + k for k in range(9)}),
}


@pytest.mark.parametrize("reveal_last", [True, False])
def test_hint_canvas_on_a_tiny_example(reveal_last: bool) -> None:
    scheme = HintInjection(min_chunk_size=3, max_chunk_size=3, reveal_last_chunk=reveal_last)
    outcomes = dict(OUTCOMES)
    if not reveal_last:
        outcomes[2] = _expected({k: 40 + k for k in range(6)})
    seen = set()
    for seed in range(24):
        tokens, hint = scheme.hint_canvas(SOLUTION, 40, 0.5, -1, _gen(seed))
        matches = [k for k, want in outcomes.items() if tokens.tolist() == want]
        assert len(matches) == 1, tokens.tolist()
        seen.add(matches[0])
        assert torch.equal(hint, tokens != -1) and not bool(hint[10:].any())
    assert seen == {0, 1, 2}  # each chunk is the hidden one for some seed


def test_hint_canvas_stretches_a_short_solution_and_keeps_the_free_tail() -> None:
    """20 usable positions for a 10-token solution: stretch min(1.5, 20 / 10) = 1.5. Ratio 1: nothing hidden, so
    (0, 3), (3, 6), (6, 9) with gaps 0 go to 0..8; a canvas of 30 or fewer tokens gets no hint (lines 501-515)."""
    scheme = HintInjection(min_chunk_size=3, max_chunk_size=3)
    tokens, hint = scheme.hint_canvas(SOLUTION, 50, 1.0, -1, _gen(0))
    assert tokens[:9].tolist() == SOLUTION[:9] and int(hint.sum()) == 9
    # hidden middle chunk (ratio 0.5, a seed that hides chunk 1): (6, 9) lands at 3 + int(3 * 1.5) = 7
    placements = {
        tuple(scheme.hint_canvas(SOLUTION, 50, 0.5, -1, _gen(s))[1].nonzero().flatten().tolist()) for s in range(24)
    }
    assert (0, 1, 2, 7, 8, 9) in placements
    for length in (30, 12):
        assert not bool(scheme.hint_canvas(SOLUTION, length, 0.9, -1, _gen(0))[1].any())
    assert not bool(scheme.hint_canvas([], 50, 0.9, -1, _gen(0))[1].any())


def test_ratios_are_sorted_uniform_draws() -> None:
    """One group's ratios: G draws of U[low, high) in float32, ascending (lines 1459-1470)."""
    scheme = HintInjection(ratio_low=0.2, ratio_high=0.6)
    want = (torch.rand(5, generator=_gen(3)) * (0.6 - 0.2) + 0.2).sort().values.tolist()
    assert scheme.ratios(5, _gen(3)) == want and want == sorted(want) and all(0.2 <= r < 0.6 for r in want)


def test_all_wrong_groups_and_replacements() -> None:
    """The trigger: every completion of the group rejected (lines 1281-1286); replacements: the accepted hinted
    rows, at most max_replacements, a random choice when there are more (lines 1573-1585)."""
    correct = torch.tensor([0, 0, 0, 1, 0, 0, 0, 0, 0], dtype=torch.bool)
    assert all_wrong_groups(correct, 3).tolist() == [0, 2]
    assert all_wrong_groups(torch.ones(4, dtype=torch.bool), 2).tolist() == []
    accepted = torch.tensor([True, False, True, True])
    assert HintInjection(max_replacements=4).replacements(accepted, _gen(0)) == [0, 2, 3]
    assert HintInjection(max_replacements=3).replacements(accepted, _gen(0)) == [0, 2, 3]
    pick = torch.tensor([0, 2, 3])[torch.randperm(3, generator=_gen(5))[:2]].tolist()
    assert HintInjection(max_replacements=2).replacements(accepted, _gen(5)) == pick
    assert HintInjection().replacements(torch.zeros(4, dtype=torch.bool), _gen(0)) == []


def test_options_are_checked() -> None:
    for options in (
        {"ratio_low": 0.0},
        {"ratio_low": 0.6, "ratio_high": 0.5},
        {"ratio_high": 1.5},
        {"min_chunk_size": 0},
        {"min_chunk_size": 5, "max_chunk_size": 4},
        {"max_replacements": 0},
        {"max_spacing": -1},
    ):
        with pytest.raises(UserError, match="hint_injection"):
            HintInjection(**options)


# ------------------------------------------------------------------------------------------------ rollout
def _feedback(verdicts, reference=None) -> tuple[Feedback, list[torch.Tensor]]:
    """A feedback whose i-th grading returns ``verdicts[i]`` (rows in the order asked); the rows asked are kept."""
    asked: list[torch.Tensor] = []

    def correct(rows: torch.Tensor, completion_ids: torch.Tensor) -> torch.Tensor:
        assert completion_ids.shape[0] == len(rows)
        asked.append(rows.clone())
        return torch.tensor(verdicts[len(asked) - 1], dtype=torch.bool)

    def no_reference(row: int) -> list[int]:
        raise AssertionError("no group is all wrong: the worked solutions are never needed")

    return Feedback(2, correct, reference or no_reference), asked


def test_a_rollout_without_an_all_wrong_group_is_the_plain_one(model) -> None:
    ids, mask = model.encode_prompts([p for p in PROMPTS for _ in range(2)], chat_template=False)
    feedback, asked = _feedback([[True, False, False, True, True, True]])
    with torch.no_grad():
        out = HintInjection().sample_with_feedback(model, ids, mask, SETTINGS, _gen(4), feedback)
        plain = Independent().sample(model, ids, mask, SETTINGS, _gen(4))
    assert torch.equal(out.completion_ids, plain.completion_ids) and torch.equal(out.unmask_step, plain.unmask_step)
    assert out.nfe == plain.nfe and len(asked) == 1
    assert not bool(out.records["hint_mask"].any()) and not bool(out.records["hinted"].any())


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_all_wrong_group_is_decoded_again_with_its_hints(model, temperature: float) -> None:
    """Group 1 (rows 2, 3) all wrong: both rows decoded from hinted canvases (the official ``generate_inpainting``:
    LLaDA with the hints fixed, each block's quota from its MASK count), both hinted rows accepted, one replaces
    row 2; every other row is the plain decode's."""
    settings = dataclasses.replace(SETTINGS, temperature=temperature)
    ids, mask = model.encode_prompts([p for p in PROMPTS for _ in range(2)], chat_template=False)
    references = {2: SOLUTION, 3: [5, 6, 7, 8, 9, 10, 11, 12]}
    feedback, asked = _feedback([[True, False, False, False, False, True], [True, True]], references.__getitem__)
    scheme = HintInjection(min_chunk_size=2, max_chunk_size=3)
    with torch.no_grad():
        out = scheme.sample_with_feedback(model, ids, mask, settings, _gen(6), feedback)
        # the same draws, one at a time: the plain decode, the group's ratios and canvases, the hinted decode
        gen = _gen(6)
        plain = generate(model, ids, mask, settings, generator=gen)
        ratios = scheme.ratios(2, gen)
        canvases = [
            scheme.hint_canvas(references[row], 40, r, model.mask_id, gen)
            for row, r in zip((2, 3), ratios, strict=True)
        ]
        canvas = torch.stack([c for c, _ in canvases])
        slow, slow_steps = ref_llada(
            model,
            ids[2:4],
            mask[2:4],
            max_completion_length=40,
            block_length=8,
            steps=10,
            temperature=temperature,
            generator=gen,
            canvas=canvas,
        )
        choice = scheme.replacements(torch.tensor([True, True]), gen)
    assert [rows.tolist() for rows in asked] == [list(range(6)), [2, 3]]
    assert len(choice) == 1
    keep = [0, 1, 3, 4, 5]
    assert torch.equal(out.completion_ids[keep], plain.completion_ids[keep])
    assert torch.equal(out.unmask_step[keep], plain.unmask_step[keep])
    source = choice[0]
    prompt_len = ids.shape[1]
    assert out.completion_ids[2].tolist() == slow[source, prompt_len:].tolist()
    assert out.unmask_step[2].tolist() == slow_steps[source].tolist()
    hint = canvases[source][1]
    assert torch.equal(out.records["hint_mask"][2], hint) and bool(hint.any())
    assert torch.equal(out.completion_ids[2][hint], canvas[source][hint]) and bool(
        (out.unmask_step[2][hint] == -1).all()
    )
    assert out.records["hinted"].tolist() == [False, False, True, False, False, False]
    assert out.nfe == 2 * plain.nfe and not bool(out.records["hint_mask"][keep].any())


def test_no_accepted_hinted_completion_leaves_the_group_as_decoded(model) -> None:
    ids, mask = model.encode_prompts([p for p in PROMPTS for _ in range(2)], chat_template=False)
    feedback, _ = _feedback([[False] * 6, [False] * 6], lambda row: SOLUTION)
    with torch.no_grad():
        out = HintInjection().sample_with_feedback(model, ids, mask, SETTINGS, _gen(2), feedback)
        plain = Independent().sample(model, ids, mask, SETTINGS, _gen(2))
    assert torch.equal(out.completion_ids, plain.completion_ids) and not bool(out.records["hinted"].any())
    assert out.nfe == 2 * plain.nfe


def test_the_rollout_refuses_what_it_cannot_draw(model) -> None:
    scheme = HintInjection()
    with pytest.raises(UserError, match="full-attention"):
        scheme.check(BlockDecode(max_completion_length=8, steps=4))
    with pytest.raises(UserError, match="exact decoding"):
        scheme.check(dataclasses.replace(SETTINGS, cache="prefix"))
    ids, mask = model.encode_prompts(PROMPTS[:1], chat_template=False)
    with pytest.raises(UserError, match="feedback"):
        scheme.sample(model, ids, mask, SETTINGS, _gen(0))


# ---------------------------------------------------------------------------------------------- estimator
def test_kept_hints_by_hand() -> None:
    """Of a row's n hint positions the max(1, int(n * ratio)) of highest entropy (lines 1797-1826; ties: the
    earlier position); every other position counts."""
    entropy = torch.tensor([[0.5, 0.9, 0.1, 0.9, 0.3], [0.5, 0.9, 0.1, 0.9, 0.3]])
    hint = torch.tensor([[True, True, True, True, False], [False] * 5])
    assert kept_hints(hint, entropy, 0.5).tolist() == [[False, True, False, True, True], [True] * 5]
    assert kept_hints(hint, entropy, 0.2).tolist() == [[False, True, False, False, True], [True] * 5]  # int(0.8) -> 1
    assert kept_hints(hint, entropy, 1.0).tolist() == [[True] * 5, [True] * 5]


def _batch(model, hint_mask=None) -> SequenceBatch:
    ids, mask = model.encode_prompts(PROMPTS, chat_template=False)
    completion = torch.randint(0, model.mask_id, (3, 12), generator=_gen(1))
    records = {} if hint_mask is None else {"hint_mask": hint_mask}
    return SequenceBatch(ids, mask.bool(), completion, torch.ones_like(completion, dtype=torch.bool), records=records)


def test_the_estimate_is_one_forward_of_the_all_mask_canvas(model) -> None:
    """z = [x, M^L] (t = T: ratio 1, lines 988-1025), log p of every position, all L counted; the hint filter by the
    entropy -sum p log(p + 1e-8) of each position (lines 1119-1125), recomputed here one row at a time."""
    hint = torch.zeros(3, 12, dtype=torch.bool)
    hint[0, 2:7] = True  # 5 hints: keep 1
    hint[2, :10] = True  # 10 hints: keep 2
    batch = _batch(model, hint)
    estimator = IGPOOneStep()
    with torch.no_grad():
        estimate = estimator.evaluate(model, batch, estimator.draw(batch, _gen(0)))
    prompt_len = batch.prompt_ids.shape[1]
    assert bool(estimate.token_mask.all())
    for r in range(3):
        x = torch.cat((batch.prompt_ids[r], torch.full((12,), model.mask_id)))[None]
        key_valid = torch.cat((batch.prompt_mask[r], torch.ones(12, dtype=torch.bool)))[None]
        with torch.no_grad():
            logp = torch.log_softmax(model.logits(x, attention_mask=key_valid)[0, prompt_len:].double(), dim=-1)
        want = logp.gather(-1, batch.completion_ids[r, :, None])[:, 0]
        torch.testing.assert_close(estimate.token_logp[r], want, rtol=0, atol=1e-10)
        entropy = [-sum(p * math.log(p + 1e-8) for p in row.exp().tolist()) for row in logp]
        hints = hint[r].nonzero().flatten().tolist()
        keep = sorted(hints, key=lambda k: (-entropy[k], k))[: max(1, int(len(hints) * 0.2))] if hints else []
        weight = [1.0 if k not in hints or k in keep else 0.0 for k in range(12)]
        assert estimate.token_weight[r].tolist() == weight
    plain = estimator.evaluate(model, _batch(model), None)
    assert plain.token_weight is None and torch.equal(plain.token_logp, estimate.token_logp)


# ---------------------------------------------------------------------------------------------------- loss
# Two rows of two tokens, A = (1, -1), eps_low 0.2, eps_high 0.28 (lines 668-686):
#   row 0: rho = (1.5, 1): 1.5 > 1.28 with A > 0 is clipped -> 1.28; 1 -> 1          losses -1.28, -1
#   row 1: rho = (0.5, 1): 0.5 < 0.8 with A < 0 is clipped -> -0.8; 1 -> -1          losses 0.8, 1
#   token mean: (-1.28 - 1 + 0.8 + 1) / 4 = -0.12; without the filtered position (0, 1): 0.52 / 3
# GSPO (lines 651-665): rho_0 = exp((log 1.5 + 0) / 2) = sqrt(1.5) = 1.2247 < 1.28: unclipped, -sqrt(1.5) twice;
#   rho_1 = sqrt(0.5) = 0.7071 < 0.8 with A < 0: clipped, 0.8 twice; mean (0.8 - sqrt(1.5)) / 2
# KL (lines 633-639): ref - logp = log 2 at (0, 0): 2 - log 2 - 1; beta 0.5 adds 0.5 (1 - log 2) / 4 to the mean
LOGP = torch.tensor([[math.log(1.5), 0.0], [math.log(0.5), 0.0]], dtype=torch.float64)
OLD = torch.zeros(2, 2, dtype=torch.float64)
ADV = torch.tensor([1.0, -1.0], dtype=torch.float64)
ALL = torch.ones(2, 2, dtype=torch.bool)


def test_loss_hand_values() -> None:
    loss, metrics = igpo_loss(LOGP, OLD, None, ALL, ADV, beta=0.0)
    assert loss.item() == pytest.approx(-0.12, abs=1e-12) and metrics["clip_ratio"] == pytest.approx(0.5)
    filtered = torch.tensor([[True, False], [True, True]])
    assert igpo_loss(LOGP, OLD, None, filtered, ADV, beta=0.0)[0].item() == pytest.approx(0.52 / 3, abs=1e-12)
    gspo = igpo_loss(LOGP, OLD, None, ALL, ADV, beta=0.0, sequence_ratio=True)[0]
    assert gspo.item() == pytest.approx((0.8 - math.sqrt(1.5)) / 2, abs=1e-12)
    ref = LOGP.clone()
    ref[0, 0] += math.log(2.0)
    with_kl = igpo_loss(LOGP, OLD, ref, ALL, ADV, beta=0.5)[0]
    assert with_kl.item() == pytest.approx(-0.12 + 0.5 * (1 - math.log(2.0)) / 4, abs=1e-12)
    assert igpo_loss(LOGP, OLD, None, torch.zeros_like(ALL), ADV, beta=0.0)[0].item() == 0.0  # lines 681-683


def _official_loss(logp, old, ref, token_mask, advantages, eps_low, eps_high, beta, use_gspo):
    """``compute_loss`` lines 633-686 transcribed (token_mask: the filtered masked-token mask)."""
    if beta != 0.0:
        per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1
    if use_gspo:
        ratio = (
            torch.exp(logp.sum(dim=1) / logp.size(1) - old.sum(dim=1) / old.size(1))
            .unsqueeze(1)
            .expand(-1, logp.size(1))
        )
    else:
        ratio = torch.exp(logp - old)
    coef_2 = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(ratio * advantages.unsqueeze(1), coef_2 * advantages.unsqueeze(1))
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    denom = token_mask.sum()
    if denom == 0:
        return per_token_loss.new_tensor(0.0)
    return (per_token_loss * token_mask).sum() / denom


@pytest.mark.parametrize("use_gspo", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_equals_the_official_lines(use_gspo: bool, seed: int) -> None:
    g = _gen(seed)
    logp = (-torch.rand(4, 6, generator=g, dtype=torch.float64) * 3).requires_grad_()
    old = logp.detach() + (torch.rand(4, 6, generator=g, dtype=torch.float64) - 0.5) * 0.8
    ref = logp.detach() + (torch.rand(4, 6, generator=g, dtype=torch.float64) - 0.5)
    counted = torch.rand(4, 6, generator=g) < 0.7
    advantages = torch.randn(4, generator=g, dtype=torch.float64)
    loss, _ = igpo_loss(
        logp, old, ref, counted, advantages, epsilon_low=0.2, epsilon_high=0.28, beta=0.04, sequence_ratio=use_gspo
    )
    (grad,) = torch.autograd.grad(loss, logp)
    want = _official_loss(logp, old, ref, counted, advantages, 0.2, 0.28, 0.04, use_gspo)
    (want_grad,) = torch.autograd.grad(want, logp)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)


def test_the_baseline_averages_over_the_rollout_policys_filter() -> None:
    """The loss counts the positions the ``old`` estimate's weights keep (the filter computed once, at the
    rollout), whatever the current estimate's weights say."""
    method = build_baseline("igpo", beta=0.0)
    new = Estimate(token_logp=LOGP.clone(), token_mask=ALL, token_weight=torch.ones(2, 2, dtype=torch.float64))
    old = Estimate(token_logp=OLD, token_mask=ALL, token_weight=torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
    loss, _ = method.loss(LossInputs(new, old, None, ADV, ALL, torch.tensor([0, 0])))
    assert loss.item() == pytest.approx(0.52 / 3, abs=1e-12)


def test_official_defaults_and_options() -> None:
    igpo = build_baseline("igpo")
    c = igpo.config
    assert (c.beta, c.epsilon_low, c.epsilon_high, c.use_gspo, c.entropy_clipping_ratio_inpaint) == (
        0.04,
        0.2,
        0.28,
        False,
        0.2,
    )
    assert igpo.estimator() == IGPOOneStep(hint_keep_ratio=0.2)
    assert igpo.rollout() == HintInjection() and igpo.advantage == "group_mean"
    custom = build_baseline(
        "igpo", inpaint_chunk_ratio_low=0.2, inpaint_chunk_high_initial_ratio=0.6, max_replacements=4
    )
    assert custom.rollout() == HintInjection(ratio_low=0.2, ratio_high=0.6, max_replacements=4)
    for options, match in (
        ({"epsilon_low": 1.0}, "epsilon"),
        ({"entropy_clipping_ratio_inpaint": 1.5}, "hint_keep_ratio"),
        ({"min_chunk_size": 0}, "min_chunk_size"),
    ):
        with pytest.raises(UserError, match=match):
            build_baseline("igpo", **options)


# -------------------------------------------------------------------------------------------------- wiring
def _config(tmp_path, budget, **overrides):
    """A tiny IGPO run on GSM8K (its training answers carry worked solutions), the tiny protocol."""
    options = {"baseline": "igpo", "task": "gsm8k", "baseline_options": {"beta": 0.0}, **overrides}
    return egspo_config(tmp_path, "full", budget, **options)


def _grader(pattern):
    """A grade_many whose i-th call accepts nothing or everything by ``pattern[i % len(pattern)]``."""
    calls = []

    def grade_many(texts, docs):
        calls.append(len(texts))
        accept = pattern[(len(calls) - 1) % len(pattern)]
        return [SimpleNamespace(correct=accept) for _ in texts]

    return grade_many, calls


def test_a_training_step_on_the_tiny_model(tmp_path) -> None:
    """Every group all wrong, every hinted completion accepted: row 0 of each group (max_replacements 1) is a
    hinted completion; both inner iterations train on the filtered hints."""
    budget = small_budget(
        max_steps=2, num_iterations=2, diffusion_steps=10, max_completion_length=40, max_prompt_length=400
    )
    trainer = RLTrainer(_config(tmp_path, budget, per_device_prompts=2))
    # per micro-batch: the rollout's two gradings (all rejected, then all hinted rows accepted), then the trainer's
    trainer.task.grade_many, calls = _grader([False, True, False])
    micro_batches, _ = trainer.rollout()
    (mb,) = micro_batches
    rows = budget.prompts_per_step * budget.num_generations
    assert calls == [rows, rows, rows]
    hinted = mb.batch.records["hinted"]
    assert hinted.tolist() == ([True] + [False] * (budget.num_generations - 1)) * budget.prompts_per_step
    assert bool(mb.batch.records["hint_mask"][hinted].any(dim=1).all())
    assert mb.old[1] is not None and mb.old[1].token_weight is not None
    before = [p.detach().clone() for p in trainer.train_dlm.model.parameters() if p.requires_grad]
    record = trainer.optimizer_step(micro_batches, 0)
    assert math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"])
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.train_dlm.model.parameters(), strict=False))
    loss, _ = trainer._micro_loss(mb, 1)
    assert math.isfinite(loss.item())


def test_the_trainer_refuses_a_task_without_worked_solutions(tmp_path) -> None:
    with pytest.raises(UserError, match="worked solutions"):
        RLTrainer(egspo_config(tmp_path, "full", small_budget(), baseline="igpo", baseline_options={}))  # Sudoku


def test_a_prompt_without_a_worked_solution_is_refused(tmp_path) -> None:
    trainer = RLTrainer(_config(tmp_path, small_budget(max_prompt_length=400)))
    doc = {"doc_id": "gsm8k/x/0", "question": "1 + 1?", "answer": "2"}  # no '####': no worked solution
    with pytest.raises(UserError, match="gsm8k/x/0 carries no worked solution"):
        trainer._feedback([doc]).reference(0)
    solved = {"question": "1 + 1?", "answer": "One and one make two.\n#### 2"}
    assert (
        trainer._feedback([solved]).reference(0)
        == trainer.dlm.tokenizer(trainer.task.target_completion(solved, "tiny"), add_special_tokens=False)["input_ids"]
    )


def test_the_trainer_refuses_block_models_before_any_rollout(tmp_path) -> None:
    budget = small_budget(block_length=4, max_prompt_length=400)
    cfg = egspo_config(tmp_path, "block", budget, baseline="igpo", task="gsm8k", baseline_options={})
    with pytest.raises(UserError, match="full-attention"):
        RLTrainer(cfg)
