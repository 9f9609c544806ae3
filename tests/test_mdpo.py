"""MDPO (``autonomousvision/mdpo`` at ``e6ae439``, ``src/open_r1/mdpo/mdpo_trainer.py``): its advantages and loss
against values worked out by hand from the official lines (derivations in the comments) and against transcriptions
of those lines written here; the ``step_predictions`` rollout against a slow recomputation of every step it records;
the ``advantage_steps`` replay against one forward per chosen step; how the trainer wires them.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import small_budget
from test_egspo import PROMPTS, TINY, _gen, assert_a_step_trains, recorded_rollout
from test_egspo import _config as egspo_config
from test_losses import close

from stabledrl_bench.baselines.mdpo import mdpo_advantages, mdpo_loss
from stabledrl_bench.core.baseline import LossInputs, build_baseline
from stabledrl_bench.core.estimators import AdvantageSteps, Estimate, SequenceBatch
from stabledrl_bench.core.models import build_tiny
from stabledrl_bench.core.rollouts import Independent, StepPredictions
from stabledrl_bench.core.sampling import BlockDecode, FullDecode
from stabledrl_bench.errors import UserError
from stabledrl_bench.training.config import TrainConfig
from stabledrl_bench.training.trainer import RLTrainer

# 12 tokens in blocks of 4, 2 steps per block (every step commits 2 tokens); and one block, MDPO's default
SETTINGS = FullDecode(max_completion_length=12, block_length=4, steps=6, temperature=1.0)
ONE_BLOCK = FullDecode(max_completion_length=12, block_length=12, steps=6, temperature=0.5)


@pytest.fixture(scope="module")
def model():
    dlm = build_tiny(attention="full", seed=0, initializer_range=1.0, **TINY)
    dlm.model.double().eval()
    return dlm


# ----------------------------------------------------------------------------------------------- advantages
# One group of two completions, T = 3 steps (lines 849-858). Step rewards r_A = (0, 1, 1), r_B = (1, 0, 0).
#   adv-v3 (line 849): D = (r_0, r_1 - r_0, r_2 - r_1) + 1: D_A = (1, 2, 1), D_B = (2, 0, 1)
#   adv-v4 (line 851): + (mean(r_1, r_2), mean(r_2), r_2): A: (1, 1, 1), B: (0, 0, 0)
#     -> S_A = (2, 3, 2), S_B = (2, 0, 1)
#   per step over the group, (S - mean) / (sample std + 1e-4) (lines 856-858):
#     step 0: (2, 2) -> 0, 0;  step 1: (3, 0) -> +-1.5 / (sqrt(4.5) + 1e-4);
#     step 2: (2, 1) -> +-0.5 / (sqrt(0.5) + 1e-4)
STEP_REWARDS = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
ONE_GROUP = torch.tensor([7, 7])


def test_advantages_hand_values() -> None:
    a1, a2 = 1.5 / (math.sqrt(4.5) + 1e-4), 0.5 / (math.sqrt(0.5) + 1e-4)
    got = mdpo_advantages(STEP_REWARDS, ONE_GROUP)
    torch.testing.assert_close(got, torch.tensor([[0.0, a1, a2], [0.0, -a1, -a2]]), rtol=0, atol=1e-7)


def _official_advantages(all_step_rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Lines 849-858 transcribed (rows grouped contiguously by prompt, ``view(-1, G, T)``)."""
    diffusion_steps = all_step_rewards.shape[1]
    r = all_step_rewards
    all_step_advantages = torch.cat([r[:, 0:1], r[:, 1:] - r[:, :-1]], dim=-1) + 1
    all_step_advantages += torch.cat(
        [(r[:, 1:].flip(dims=(-1,)).cumsum(dim=-1) / torch.arange(1, diffusion_steps).unsqueeze(0)).flip(dims=(-1,)),
         r[:, -1:]],
        dim=-1,
    )  # fmt: skip
    gathered = all_step_advantages.view(-1, num_generations, diffusion_steps)
    mean_grouped_advantages = gathered.mean(dim=1)
    std_grouped_advantages = gathered.std(dim=1)
    mean = mean_grouped_advantages.repeat_interleave(num_generations, dim=0)
    std = std_grouped_advantages.repeat_interleave(num_generations, dim=0)
    return (all_step_advantages - mean) / (std + 1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_advantages_equal_the_official_lines(dtype: torch.dtype) -> None:
    gen = _gen(3)
    rewards = torch.randint(0, 3, (12, 9), generator=gen).to(dtype) * 0.5
    groups = torch.arange(3).repeat_interleave(4)
    want = _official_advantages(rewards, 4)
    got = mdpo_advantages(rewards, groups)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=1e-6)


def test_baseline_advantages_need_the_prediction_rewards() -> None:
    mdpo = build_baseline("mdpo")
    advantages, keep = mdpo.advantages(
        torch.tensor([1.0, 0.0]), ONE_GROUP, records={"prediction_rewards": STEP_REWARDS}
    )
    assert advantages.shape == (2, 3) and keep.all()
    with pytest.raises(UserError, match="every step's prediction"):
        mdpo.advantages(torch.tensor([1.0, 0.0]), ONE_GROUP)
    assert mdpo.advantage_record()["rule"] == "mdpo_stepwise"
    records = mdpo.estimator_records({"x": STEP_REWARDS}, advantages)
    assert records["advantages"] is advantages and records["x"] is STEP_REWARDS


# ----------------------------------------------------------------------------------------------------- loss
# Two replayed steps of one sequence on a canvas of L = 4, eps 0.2, beta 0.04 (lines 1491-1532):
#   row 0 (A = +1, 3 masked positions, confidences 0.5, 0.25, 1): rho = 1 on every token (old = new), so
#     -min(rho A, clip A) = -1; lambda = 4 / (3 + 1e-4); ref - logp = (-0.5, 0, 0.5) -> k2 = (0.125, 0, 0.125);
#     per token -lambda + 0.04 k2; sum of c x per token = -1.75 lambda + 0.04 (0.0625 + 0.125) = -1.75 lambda + 0.0075;
#     over 3 + 1e-4.
#   row 1 (A = -1, 1 masked position, confidence 0.5): log rho = -1, rho = e^-1 < 0.8 with A < 0: clipped, the
#     term is -(0.8 x -1) = 0.8 (zero gradient); lambda = 4 / (1 + 1e-4); k2 = 0; 0.5 x 0.8 lambda / (1 + 1e-4).
#   loss = (row 0 + row 1) / 1 sequence; clip ratio 1/4 (one of the four masked tokens).
MASK = torch.tensor([[True, True, False, True], [False, True, False, False]])
LOGP = torch.tensor([[-1.0, -0.5, -9.0, -2.0], [-9.0, -2.0, -9.0, -9.0]], dtype=torch.float64)
OLD = torch.tensor([[-1.0, -0.5, 3.0, -2.0], [3.0, -1.0, 3.0, 3.0]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -0.5, 5.0, -1.5], [5.0, -2.0, 5.0, 5.0]], dtype=torch.float64)
WEIGHT = torch.tensor([[0.5, 0.25, 7.0, 1.0], [7.0, 0.5, 7.0, 7.0]], dtype=torch.float64)
ADV = torch.tensor([1.0, -1.0], dtype=torch.float64)


def _hand_loss() -> float:
    lam0, lam1 = 4 / (3 + 1e-4), 4 / (1 + 1e-4)
    return (-1.75 * lam0 + 0.0075) / (3 + 1e-4) + 0.5 * 0.8 * lam1 / (1 + 1e-4)


def test_loss_hand_values() -> None:
    loss, m = mdpo_loss(LOGP, OLD, REF, MASK, WEIGHT, ADV, 1, epsilon=0.2, beta=0.04)
    assert close(loss.item(), _hand_loss(), 1e-12) and close(m["clip_ratio"], 0.25)
    assert close(m["kl"], 0.25 / 4, 1e-12) and loss.dtype == torch.float64
    # without weights every confidence is 1; two sequences halve the loss
    plain, _ = mdpo_loss(LOGP, OLD, REF, MASK, None, ADV, 2, beta=0.0)
    lam0, lam1 = 4 / (3 + 1e-4), 4 / (1 + 1e-4)
    assert close(plain.item(), (-3 * lam0 / (3 + 1e-4) + 0.8 * lam1 / (1 + 1e-4)) / 2, 1e-12)


def _official_compute_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, mask, conf, advantage, eps, beta):
    """``compute_loss`` lines 1494-1532 transcribed for one micro-batch of one row (one chosen step)."""
    logr = ref_per_token_logps - per_token_logps
    per_token_kl = logr**2 / 2
    completion_mask = mask
    max_completion_length = mask.shape[-1]
    lambda_t = max_completion_length / (completion_mask.sum(dim=-1, keepdim=True) + 1e-4)
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    coef_2 = torch.clamp(coef_1, 1 - eps, 1 + eps)
    per_token_loss1 = coef_1 * advantage
    per_token_loss2 = coef_2 * advantage
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2) * lambda_t
    per_token_loss = per_token_loss + beta * per_token_kl
    return (per_token_loss * completion_mask * conf).sum() / (completion_mask.sum() + 1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_equals_the_official_lines(seed: int) -> None:
    """Each row is one official ``compute_loss`` call, one chosen step of one prompt (per-device batch 1); the
    trainer sums a prompt's K calls and averages the prompts (gradient accumulation): value and gradient agree."""
    gen = _gen(seed)
    sequences, k, length = 3, 4, 8
    rows = sequences * k
    mask = torch.rand(rows, length, generator=gen) < 0.6
    mask[:, 0] = True
    logp = (-torch.rand(rows, length, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    old = logp.detach() + torch.randn(rows, length, generator=gen, dtype=torch.float64) * 0.3
    ref = logp.detach() + torch.randn(rows, length, generator=gen, dtype=torch.float64) * 0.3
    conf = torch.rand(rows, length, generator=gen, dtype=torch.float64)
    adv = torch.randn(rows, generator=gen, dtype=torch.float64)
    loss, _ = mdpo_loss(logp, old, ref, mask, conf, adv, sequences, epsilon=0.2, beta=0.04)
    want = 0.0
    for i in range(sequences):
        for j in range(k):
            r = i * k + j
            want = want + _official_compute_loss(
                logp[r : r + 1], old[r : r + 1], ref[r : r + 1], mask[r : r + 1], conf[r : r + 1], adv[r], 0.2, 0.04
            )
    want = want / sequences
    # the official counts are float32 (an integer sum + 1e-4), ours are in the loss's dtype, float64 here
    assert close(loss.item(), want.item(), 1e-6)
    (grad,) = torch.autograd.grad(loss, logp, retain_graph=True)
    (want_grad,) = torch.autograd.grad(want, logp)
    torch.testing.assert_close(grad, want_grad, rtol=1e-6, atol=1e-9)


def test_baseline_loss_reads_each_rows_step_advantage_and_weights() -> None:
    """Per-step advantages [B, T]: row r takes column ``row_column[r]`` (the step) of its sequence."""
    advantages = torch.tensor([[5.0, 1.0, 3.0], [-1.0, 7.0, 2.0]], dtype=torch.float64)
    new = Estimate(
        token_logp=LOGP,
        token_mask=MASK,
        row_to_seq=torch.tensor([0, 1]),
        row_column=torch.tensor([1, 0]),
        token_weight=WEIGHT,
    )
    inputs = LossInputs(new, Estimate(token_logp=OLD), Estimate(token_logp=REF), advantages, MASK, ONE_GROUP)
    loss, _ = build_baseline("mdpo").loss(inputs)
    assert close(loss.item(), _hand_loss() / 2, 1e-12)  # two sequences


# ------------------------------------------------------------------------------------------------- rollout
def _slow_records(dlm, prompt_ids, prompt_mask, out, settings):
    """Per row and step, from the final unmask order: the state before the step, one forward of it alone; MASK
    excluded, the distribution softmax(logits / tau) over every masked position, its argmax, and the tokens the
    step committed (the sampler's draws)."""
    rows, length = out.completion_ids.shape
    prompt_len = prompt_ids.shape[1]
    steps = settings.steps
    scores = torch.zeros((rows, steps, length, dlm.vocab_size), dtype=torch.float64)
    hidden = torch.zeros((rows, steps, length), dtype=torch.bool)
    for b in range(rows):
        for s in range(steps):
            hidden[b, s] = out.unmask_step[b] >= s
            completion = out.completion_ids[b].masked_fill(hidden[b, s], dlm.mask_id)
            x = torch.cat((prompt_ids[b], completion))[None]
            key_valid = torch.cat((prompt_mask[b].bool(), torch.ones(length, dtype=torch.bool)))[None]
            logits = dlm.logits(x, attention_mask=key_valid)[0, prompt_len:].double()
            logits[:, dlm.mask_id] = float("-inf")
            scores[b, s] = logits / settings.temperature if settings.temperature > 0 else logits
    return scores, hidden


@pytest.mark.parametrize("settings", [SETTINGS, ONE_BLOCK, dataclasses.replace(SETTINGS, temperature=0.0)])
def test_step_predictions_records_what_the_sampler_saw(model, settings: FullDecode) -> None:
    ids, mask = model.encode_prompts(PROMPTS, chat_template=False)
    with torch.no_grad():
        out = StepPredictions().sample(model, ids, mask, settings, _gen(5))
        plain = Independent().sample(model, ids, mask, settings, _gen(5))
        scores, hidden = _slow_records(model, ids, mask, out, settings)
    # recording changes nothing the sampler draws
    assert torch.equal(out.completion_ids, plain.completion_ids) and torch.equal(out.unmask_step, plain.unmask_step)
    predictions, confidence = out.records["predictions"], out.records["confidence"]
    rows, steps, length = predictions.shape
    assert (rows, steps, length) == (3, settings.steps, 12)
    completions = out.completion_ids[:, None].expand(-1, steps, -1)
    # committed positions kept; the tokens a step commits are its predictions there; the last one is the completion
    assert torch.equal(predictions[~hidden], completions[~hidden])
    committed = out.unmask_step[:, None] == torch.arange(steps)[None, :, None]
    assert torch.equal(predictions[committed], completions[committed])
    assert torch.equal(predictions[:, -1], out.completion_ids)
    # beyond the current block: the argmax (the draw itself at temperature 0, everywhere)
    block = torch.arange(length) // settings.block_length
    current = torch.arange(steps) // (settings.steps // settings.num_blocks)
    beyond = hidden & (block[None, None] > current[None, :, None])
    if settings.temperature == 0:
        beyond = hidden
    assert torch.equal(predictions[beyond], scores.argmax(dim=-1)[beyond])
    # the probability of every prediction under softmax(logits / tau); 0 off the masked positions
    probs = torch.softmax(scores, dim=-1).gather(-1, predictions[..., None])[..., 0]
    torch.testing.assert_close(confidence[hidden], probs[hidden], rtol=1e-9, atol=1e-12)
    assert bool((confidence[~hidden] == 0).all())


def test_step_predictions_refuses_what_it_cannot_record() -> None:
    with pytest.raises(UserError, match="full-attention"):
        StepPredictions().check(BlockDecode(max_completion_length=8, block_length=4, steps=4))
    with pytest.raises(UserError, match="exact decoding"):
        StepPredictions().check(FullDecode(max_completion_length=8, block_length=4, steps=4, cache="dual"))
    with pytest.raises(UserError, match="exceeds"):
        StepPredictions(train_steps=5).check(FullDecode(max_completion_length=8, block_length=4, steps=4))
    with pytest.raises(UserError, match="train_steps"):
        StepPredictions(train_steps=0)


# ----------------------------------------------------------------------------------------------- estimator
def _batch(ids, mask, out, model, advantages) -> SequenceBatch:
    records = {**out.records, "advantages": advantages}
    return SequenceBatch(
        ids, mask, out.completion_ids, model.completion_mask(out.completion_ids), out.unmask_step, records
    )


def test_steps_of_largest_advantage_ties_to_the_earlier_step() -> None:
    """``torch.topk(|A|, k)`` (line 922): largest |A| first; ties (left unspecified there) to the earlier step."""
    advantages = torch.tensor([[0.1, -0.5, 0.5, 0.2, 0.0, -0.4], [0.3, 0.2, -0.1, 0.0, -0.9, 0.8]])
    batch = SequenceBatch(
        torch.zeros(2, 1, dtype=torch.long),
        torch.ones(2, 1, dtype=torch.bool),
        torch.zeros(2, 3, dtype=torch.long),
        torch.ones(2, 3, dtype=torch.bool),
        records={"advantages": advantages},
    )
    estimator = AdvantageSteps(num_steps=3)
    assert estimator._chosen(batch).tolist() == [[1, 2, 5], [4, 5, 0]]
    # every inner iteration replays all K steps
    assert [estimator.draw_for(batch, _gen(0), it, 3).columns.tolist() for it in range(3)] == [[0, 1, 2]] * 3
    with pytest.raises(UserError, match="exceeds"):
        AdvantageSteps(num_steps=7)._chosen(batch)
    with pytest.raises(UserError, match="advantages"):
        estimator._chosen(dataclasses.replace(batch, records={}))


def test_replay_rows_are_the_states_before_the_chosen_steps(model) -> None:
    """Row (i, k): the state before step s = steps[i, k] (every token committed before s clean) with the step's
    prediction as targets on every masked position (``all_steps_input_ids[s]``, ``all_steps_completion_ids[s]``),
    weighted by its confidence; one forward of that state alone gives the same log-probs."""
    ids, mask = model.encode_prompts(PROMPTS, chat_template=False)
    with torch.no_grad():
        out = StepPredictions().sample(model, ids, mask, SETTINGS, _gen(7))
        advantages = torch.randn(3, SETTINGS.steps, generator=_gen(1), dtype=torch.float64)
        batch = _batch(ids, mask, out, model, advantages)
        estimator = AdvantageSteps(num_steps=2)
        estimate = estimator.evaluate(model, batch, estimator.draw(batch, _gen(0)))
    steps = torch.argsort(advantages.abs(), dim=1, descending=True, stable=True)[:, :2]
    assert estimate.row_to_seq.tolist() == [0, 0, 1, 1, 2, 2]
    assert estimate.row_column.tolist() == steps.flatten().tolist()
    prompt_len = ids.shape[1]
    for r, (b, s) in enumerate(zip(estimate.row_to_seq.tolist(), estimate.row_column.tolist(), strict=True)):
        hidden = out.unmask_step[b] >= s
        assert torch.equal(estimate.token_mask[r], hidden)
        state = out.completion_ids[b].masked_fill(hidden, model.mask_id)
        x = torch.cat((ids[b], state))[None]
        key_valid = torch.cat((mask[b].bool(), torch.ones(12, dtype=torch.bool)))[None]
        with torch.no_grad():
            logp = torch.log_softmax(model.logits(x, attention_mask=key_valid)[0, prompt_len:].double(), dim=-1)
        target = out.records["predictions"][b, s]
        want = torch.where(hidden, logp.gather(-1, target[:, None])[:, 0], 0.0)
        torch.testing.assert_close(estimate.token_logp[r], want, rtol=0, atol=1e-10)
        torch.testing.assert_close(estimate.token_weight[r], torch.where(hidden, out.records["confidence"][b, s], 0.0))
    with pytest.raises(UserError, match="step_predictions"):
        estimator.evaluate(model, dataclasses.replace(batch, records={"advantages": advantages}), None)


# ------------------------------------------------------------------------------------------------- wiring
def test_official_defaults_and_options() -> None:
    mdpo = build_baseline("mdpo")
    c = mdpo.config
    assert (c.beta, c.epsilon, c.sample_train_steps, c.coupled) == (0.04, 0.2, 16, True)
    assert mdpo.estimator() == AdvantageSteps(num_steps=16) and mdpo.rollout() == StepPredictions(train_steps=16)
    assert mdpo.needs_ref and not build_baseline("mdpo", beta=0.0).needs_ref
    for options, match in (
        ({"coupled": False}, "coupled"),
        ({"epsilon": 1.0}, "epsilon"),
        ({"sample_train_steps": 0}, "num_steps"),
    ):
        with pytest.raises(UserError, match=match):
            build_baseline("mdpo", **options)


def _config(tmp_path, attention: str, budget, **overrides) -> TrainConfig:
    """A tiny MDPO run on Sudoku with K = 3 trained steps (EGSPO's tiny run, another method)."""
    options = {"baseline": "mdpo", "baseline_options": {"sample_train_steps": 3}, **overrides}
    return egspo_config(tmp_path, attention, budget, **options)


def test_the_trainer_rewards_every_prediction_and_trains_on_the_steps_of_largest_advantage(tmp_path) -> None:
    budget = small_budget(max_steps=2, num_iterations=2, diffusion_steps=8, max_completion_length=16)
    cfg = _config(tmp_path, "full", budget, per_device_prompts=2)
    trainer, mb, scored = recorded_rollout(cfg)
    rows = budget.prompts_per_step * budget.num_generations
    records = mb.batch.records
    assert records["predictions"].shape == (rows, 8, 16) and records["confidence"].shape == (rows, 8, 16)
    # the completions, then their T = 8 predictions each, with the same reward profile
    assert len(scored) == 2 and scored[1] == trainer.dlm.decode(records["predictions"].flatten(0, 1))
    step_rewards = torch.tensor([len(text) % 3 for text in scored[1]], dtype=torch.float32).view(rows, 8)
    torch.testing.assert_close(records["prediction_rewards"], step_rewards)
    group_ids = torch.arange(budget.prompts_per_step).repeat_interleave(budget.num_generations)
    torch.testing.assert_close(mb.advantages.cpu(), mdpo_advantages(step_rewards, group_ids))
    assert torch.equal(records["advantages"], mb.advantages.cpu())
    assert [noise.columns.tolist() for noise in mb.noises] == [[0, 1, 2]] * 2
    chosen = torch.argsort(mb.advantages.cpu().abs(), dim=1, descending=True, stable=True)[:, :3]
    assert mb.old[0] is None and mb.old[1].row_column.tolist() == chosen.flatten().tolist()
    for iteration in range(2):
        loss, metrics = trainer._micro_loss(mb, iteration)
        assert math.isfinite(loss.item()) and "kl" in metrics
    with pytest.raises(UserError, match="exceeds"):
        RLTrainer(dataclasses.replace(cfg, baseline_options={"sample_train_steps": 9}))


def test_a_training_step_on_the_tiny_model(tmp_path) -> None:
    budget = small_budget(max_steps=1, num_iterations=1, diffusion_steps=8, max_completion_length=16)
    assert_a_step_trains(_config(tmp_path, "full", budget, baseline_options={"sample_train_steps": 4, "beta": 0.0}))


def test_the_trainer_refuses_block_models_before_any_rollout(tmp_path) -> None:
    with pytest.raises(UserError, match="full-attention"):
        RLTrainer(_config(tmp_path, "block", small_budget(block_length=4)))
