"""EGSPO (``vishnutez/egspo-dllm-rl`` at ``a7d618b``, ``egspo/egspo_trainer.py``): its advantages and loss against
values worked out by hand from the official lines (derivations in the comments) and against transcriptions of those
lines written here; the ``entropy_steps`` rollout against a slow recomputation of every step it records; the
``chosen_steps`` replay against the full trajectory replay; how the trainer wires them.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import small_budget
from test_losses import close

from stabledrl_bench.baselines.egspo import egspo_advantages, egspo_loss
from stabledrl_bench.core.baseline import LossInputs, build_baseline
from stabledrl_bench.core.budget import Budget
from stabledrl_bench.core.estimators import ChosenSteps, Estimate, SequenceBatch, TraceReplay
from stabledrl_bench.core.models import build_tiny, save_diffusion_lm
from stabledrl_bench.core.rollouts import EntropySteps, Independent
from stabledrl_bench.core.sampling import BlockDecode, FullDecode, llada_generate
from stabledrl_bench.errors import UserError
from stabledrl_bench.tasks.base import RewardResult
from stabledrl_bench.training.config import TrainConfig
from stabledrl_bench.training.optim import OptimConfig
from stabledrl_bench.training.trainer import MicroBatch, RLTrainer

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
PROMPTS = ["What is 2+3?", "hi", "Count: 1 2 3"]
# 12 tokens in blocks of 4, 2 steps per block: every step commits 2 tokens, as the official setting (256 / 128)
SETTINGS = FullDecode(max_completion_length=12, block_length=4, steps=6, temperature=1.0)


@pytest.fixture(scope="module")
def model():
    dlm = build_tiny(attention="full", seed=0, initializer_range=1.0, **TINY)
    dlm.model.double().eval()
    return dlm


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------------------------- advantages
# One group of two completions, K = 2 chosen steps, lambda 0.5 (lines 906-950). Final rewards r = (1, 0); the
# one-step predictions earned r_s = ((0, 1), (0, 0)), so r - r_s = ((1, 0), (0, 0)). Returns (r + 0.5 (r - r_s)) / 1.5
# = ((1, 2/3), (0, 0)); the column means (1/2, 1/3); A = ((1/2, 1/3), (-1/2, -1/3)). Unnormalised: returns
# ((1.5, 1), (0, 0)), A = ((0.75, 0.5), (-0.75, -0.5)). standard_grpo_returns (lines 962-969): (r - mean r) = (1/2,
# -1/2) plus 0.5 (r - r_s), over 1.5: ((2/3, 1/3), (-1/3, -1/3)).
FINAL = torch.tensor([1.0, 0.0])
STEP_REWARDS = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
ONE_GROUP = torch.tensor([7, 7])


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, [[0.5, 1 / 3], [-0.5, -1 / 3]]),
        ({"normalize_returns": False}, [[0.75, 0.5], [-0.75, -0.5]]),
        ({"standard_grpo_returns": True}, [[2 / 3, 1 / 3], [-1 / 3, -1 / 3]]),
        ({"lambda1": 0.0}, [[0.5, 0.5], [-0.5, -0.5]]),  # plain GRPO's r - mean r in every column
    ],
)
def test_advantages_hand_values(options: dict, expected: list) -> None:
    got = egspo_advantages(FINAL, STEP_REWARDS, ONE_GROUP, **options)
    torch.testing.assert_close(got, torch.tensor(expected), rtol=0, atol=1e-7)


def _official_advantages(final, step_rewards, groups, lambda1, normalize, standard):
    """Lines 906-969 transcribed: rows grouped contiguously by prompt (``returns.view(-1, G, K)``)."""
    stepwise = final.unsqueeze(1) - step_rewards
    g, k = groups, step_rewards.shape[1]
    if standard:
        returns = final.unsqueeze(1)
    else:
        returns = final.unsqueeze(1) + lambda1 * stepwise
        if normalize:
            returns = returns / (1 + lambda1)
    grouped = returns.view(-1, g, returns.shape[1])
    advantages = (grouped - grouped.mean(dim=1, keepdim=True)).view(-1, returns.shape[1]).expand(-1, k)
    if standard:
        advantages = advantages + lambda1 * stepwise
        if normalize:
            advantages = advantages / (1 + lambda1)
    return advantages


@pytest.mark.parametrize("standard", [False, True])
@pytest.mark.parametrize("normalize", [False, True])
def test_advantages_equal_the_official_lines(normalize: bool, standard: bool) -> None:
    gen = _gen(3)
    final = torch.randint(0, 3, (12,), generator=gen).double()
    step_rewards = torch.randint(0, 3, (12, 4), generator=gen).double()
    groups = torch.arange(3).repeat_interleave(4)
    want = _official_advantages(final, step_rewards, 4, 0.5, normalize, standard)
    got = egspo_advantages(
        final, step_rewards, groups, lambda1=0.5, normalize_returns=normalize, standard_grpo_returns=standard
    )
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_baseline_advantages_need_the_prediction_rewards() -> None:
    egspo = build_baseline("egspo")
    advantages, keep = egspo.advantages(FINAL, ONE_GROUP, records={"prediction_rewards": STEP_REWARDS})
    assert advantages.shape == (2, 2) and keep.all()
    with pytest.raises(UserError, match="one-step predictions"):
        egspo.advantages(FINAL, ONE_GROUP)
    assert egspo.advantage_record()["rule"] == "egspo_stepwise"


# ----------------------------------------------------------------------------------------------------- loss
# Two replayed steps, eps 0.2 / eps_high 0.5, beta 0.04 (lines 106-148, ``logps_aggregation_mode="sum"``):
#   row 0 (A = +1, 2 tokens): step log-probs -1 - 0.5 = -1.5, old -1.25 - 0.5 = -1.75 -> log rho 0.25, rho = 1.2840254
#     (inside [0.8, 1.5]: above 1.2, which a symmetric eps 0.2 would clip) -> -rho A = -1.2840254; ref -1 - 1 = -2,
#     k3 = e^(-2 + 1.5) + 0.5 - 1 = 0.1065307; term (-1.2840254 + 0.04 x 0.1065307) / 2 = -0.6398821
#   row 1 (A = -1, 1 token): log rho -2 + 1 = -1, rho 0.3678794 < 0.8 with A < 0: clipped, -(0.8 x -1) = 0.8;
#     ref -2.5, k3 = e^(-0.5) + 0.5 - 1 = 0.1065307; term 0.8 + 0.0042612 = 0.8042612
#   loss = (-0.6398821 + 0.8042612) / 2 = 0.0821896; clip_ratio 1/2
LOSS_MASK = torch.tensor([[True, True, False], [True, False, False]])
LOSS_LOGP = torch.tensor([[-1.0, -0.5, -9.0], [-2.0, -9.0, -9.0]])
LOSS_OLD = torch.tensor([[-1.25, -0.5, 3.0], [-1.0, 3.0, 3.0]])
LOSS_REF = torch.tensor([[-1.0, -1.0, 5.0], [-2.5, 5.0, 5.0]])
LOSS_ADV = torch.tensor([1.0, -1.0])


def test_loss_hand_values() -> None:
    loss, m = egspo_loss(LOSS_LOGP, LOSS_OLD, LOSS_REF, LOSS_MASK, LOSS_ADV, epsilon=0.2, epsilon_high=0.5, beta=0.04)
    assert close(loss.item(), 0.0821896) and close(m["clip_ratio"], 0.5) and close(m["kl"], 0.1065307)
    assert close(m["ratio_max"], math.exp(0.25))
    # the upper clip: rho = e^0.45 = 1.568 > 1.5 with A > 0 is held at 1.5 (zero gradient)
    logp = LOSS_LOGP.clone().requires_grad_()
    old = LOSS_OLD - torch.tensor([[0.2, 0.0, 0.0], [0.0, 0.0, 0.0]])
    loss, m = egspo_loss(logp, old, None, LOSS_MASK, LOSS_ADV, epsilon=0.2, epsilon_high=0.5, beta=0.0)
    assert close(loss.item(), (-1.5 / 2 + 0.8) / 2) and close(m["clip_ratio"], 1.0)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.equal(grad, torch.zeros_like(grad))


def _official_loss(step_logp, old, ref, advantages, eps, eps_high, beta, tokens_per_step):
    """Lines 116-144 transcribed (``use_exact_kl=False``, ``logps_aggregation_mode="sum"``)."""
    k3 = torch.exp(ref - step_logp) - (ref - step_logp) - 1
    coef_1 = torch.exp(step_logp - old)
    coef_2 = torch.clamp(coef_1, 1 - eps, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages) + beta * k3
    return per_token_loss.mean() / tokens_per_step


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_equals_the_official_lines(seed: int) -> None:
    """Every step commits the same number of tokens (the official L / T): value and gradient agree."""
    gen = _gen(seed)
    rows, length, per_step = 16, 6, 2
    mask = torch.zeros(rows, length, dtype=torch.bool)
    for r in range(rows):
        mask[r, torch.randperm(length, generator=gen)[:per_step]] = True
    logp = (-torch.rand(rows, length, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    old = logp.detach() + torch.randn(rows, length, generator=gen, dtype=torch.float64) * 0.3
    ref = logp.detach() + torch.randn(rows, length, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(rows, generator=gen, dtype=torch.float64)
    loss, _ = egspo_loss(logp, old, ref, mask, adv, epsilon=0.2, epsilon_high=0.5, beta=0.04)

    def step(values):
        return torch.where(mask, values, 0.0).sum(dim=1)

    want = _official_loss(step(logp), step(old), step(ref), adv, 0.2, 0.5, 0.04, per_step)
    assert close(loss.item(), want.item(), 1e-12)
    (grad,) = torch.autograd.grad(loss, logp, retain_graph=True)
    (want_grad,) = torch.autograd.grad(want, logp)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-14)


def test_baseline_loss_reads_each_rows_chosen_step_advantage() -> None:
    """Stepwise advantages [B, K]: row r takes column ``row_column[r]`` of its sequence ``row_to_seq[r]``."""
    advantages = torch.tensor([[5.0, 1.0], [-1.0, 7.0]])  # rows: (seq 0, column 1) -> 1, (seq 1, column 0) -> -1
    new = Estimate(
        token_logp=LOSS_LOGP, token_mask=LOSS_MASK, row_to_seq=torch.tensor([0, 1]), row_column=torch.tensor([1, 0])
    )
    inputs = LossInputs(
        new, Estimate(token_logp=LOSS_OLD), Estimate(token_logp=LOSS_REF), advantages, LOSS_MASK, ONE_GROUP
    )
    loss, _ = build_baseline("egspo").loss(inputs)
    assert close(loss.item(), 0.0821896)


# ------------------------------------------------------------------------------------------------- rollout
def test_choice_of_steps() -> None:
    """high_entropy: highest first, ties to the earlier step (lines 707-713); uniform: linspace(0, T-2, K-1) then
    T-1 (lines 749-754); random: K-1 draws in [0, T-2] shared by the rows, then T-1 (lines 743-748)."""
    entropy = torch.tensor([[0.1, 0.5, 0.5, 0.2, float("-inf"), 0.4], [0.3, 0.2, 0.1, 0.0, 0.9, 0.8]])
    high = EntropySteps(num_steps=3).choose(entropy, _gen(0))
    assert high.tolist() == [[1, 2, 5], [4, 5, 0]]
    uniform = EntropySteps(num_steps=3, selection="uniform").choose(entropy, _gen(0))
    assert uniform.tolist() == [[0, 4, 5], [0, 4, 5]]
    random = EntropySteps(num_steps=4, selection="random").choose(entropy, _gen(0))
    assert torch.equal(random[0], random[1]) and random[0, -1] == 5 and bool((random[0, :-1] <= 4).all())


def _slow_records(dlm, prompt_ids, prompt_mask, out, settings):
    """Per row and step, from the final unmask order: the state before the step (tokens committed earlier clean),
    one forward of it alone; the mean entropy of its committed tokens' distributions (MASK excluded) and its
    one-step prediction (argmax, MASK excluded, on every masked position)."""
    rows, length = out.completion_ids.shape
    prompt_len = prompt_ids.shape[1]
    entropy = torch.full((rows, settings.steps), float("-inf"), dtype=torch.float64)
    predictions = torch.zeros((rows, settings.steps, length), dtype=torch.long)
    for b in range(rows):
        for s in range(settings.steps):
            hidden = out.unmask_step[b] >= s
            completion = out.completion_ids[b].masked_fill(hidden, dlm.mask_id)
            x = torch.cat((prompt_ids[b], completion))[None]
            key_valid = torch.cat((prompt_mask[b].bool(), torch.ones(length, dtype=torch.bool)))[None]
            logits = dlm.logits(x, attention_mask=key_valid)[0, prompt_len:].double()
            logits[:, dlm.mask_id] = float("-inf")
            probs = torch.softmax(logits, dim=-1)
            per_token = -(probs * torch.log(probs + 1e-8)).sum(dim=-1)
            committed = out.unmask_step[b] == s
            entropy[b, s] = per_token[committed].mean()
            predictions[b, s] = torch.where(hidden, logits.argmax(dim=-1), completion)
    return entropy, predictions


def test_entropy_steps_records_what_the_sampler_saw(model) -> None:
    ids, mask = model.encode_prompts(PROMPTS, chat_template=False)
    scheme = EntropySteps(num_steps=4)
    with torch.no_grad():
        out = scheme.sample(model, ids, mask, SETTINGS, _gen(5))
        plain = Independent().sample(model, ids, mask, SETTINGS, _gen(5))
        entropy, predictions = _slow_records(model, ids, mask, out, SETTINGS)
    # recording changes nothing the sampler draws
    assert torch.equal(out.completion_ids, plain.completion_ids) and torch.equal(out.unmask_step, plain.unmask_step)
    assert out.nfe == plain.nfe and plain.records == {}
    torch.testing.assert_close(out.records["entropy"], entropy, rtol=0, atol=1e-10)
    order = torch.argsort(entropy, dim=1, descending=True, stable=True)[:, :4]
    assert torch.equal(out.records["steps"], order)
    assert torch.equal(out.records["predictions"], predictions.gather(1, order[:, :, None].expand(-1, -1, 12)))
    # the one-step prediction of the last step's state is the final completion up to its last two tokens
    assert int(((predictions[:, -1] != out.completion_ids).sum(dim=1) <= 2).all())


def test_entropy_steps_refuses_what_it_cannot_record(model) -> None:
    scheme = EntropySteps(num_steps=4)
    with pytest.raises(UserError, match="full-attention"):
        scheme.check(BlockDecode(max_completion_length=8, block_length=4, steps=4))
    with pytest.raises(UserError, match="exact decoding"):
        scheme.check(FullDecode(max_completion_length=8, block_length=4, steps=4, cache="dual", strategy="dynamic"))
    with pytest.raises(UserError, match="exceeds"):
        EntropySteps(num_steps=8).check(FullDecode(max_completion_length=8, block_length=4, steps=4))
    with pytest.raises(UserError, match="selection"):
        EntropySteps(selection="low_confidence")
    ids, mask = model.encode_prompts(PROMPTS, chat_template=False)
    with pytest.raises(UserError, match="observer"):
        llada_generate(model, ids, mask, max_completion_length=8, block_length=4, steps=4, cache="dual", observer=print)


# ----------------------------------------------------------------------------------------------- estimator
@pytest.mark.parametrize(
    ("mu", "expected"),
    [
        (1, [[1, 2, 3, 4, 5, 6, 7, 0]]),
        (2, [[1, 2, 3, 4], [5, 6, 7, 0]]),
        (4, [[1, 2], [3, 4], [5, 6], [7, 0]]),  # the official setting: K 8, gradient accumulation 2
        (8, [[1], [2], [3], [4], [5], [6], [7], [0]]),
        (10, [[1], [2], [3], [4], [5], [6], [7], [0], [1], [2]]),
    ],
)
def test_iterations_take_the_chosen_steps_in_the_official_order(mu: int, expected: list) -> None:
    """``eval_time_step_idx = _step % K`` after ``_step`` was incremented (lines 93, 559-564): 1, ..., K-1, 0."""
    batch = SequenceBatch(
        torch.zeros(1, 2, dtype=torch.long),
        torch.ones(1, 2, dtype=torch.bool),
        torch.zeros(1, 8, dtype=torch.long),
        torch.ones(1, 8, dtype=torch.bool),
        records={"steps": torch.arange(8)[None]},
    )
    got = [ChosenSteps().draw_for(batch, _gen(0), it, mu).columns.tolist() for it in range(mu)]
    assert got == expected
    assert ChosenSteps().draw(batch, _gen(0)).columns.tolist() == list(range(8))


def test_chosen_steps_are_rows_of_the_trajectory_replay(model) -> None:
    """Row (i, k) is the state before step steps[i, k] with the tokens that step committed as targets (lines
    488-542): the trajectory replay's row of that step, when every step commits a token."""
    ids, mask = model.encode_prompts(PROMPTS, chat_template=False)
    with torch.no_grad():
        out = EntropySteps(num_steps=3).sample(model, ids, mask, SETTINGS, _gen(7))
        batch = SequenceBatch(
            ids, mask, out.completion_ids, model.completion_mask(out.completion_ids), out.unmask_step, dict(out.records)
        )
        estimator = ChosenSteps()
        chosen = estimator.evaluate(model, batch, estimator.draw_for(batch, _gen(0), 1, 2))
        full = TraceReplay(shrink=1, post_num=None).evaluate(model, batch, None)
    columns = [2, 0]  # iteration 1 of 2 with K = 3: the second half of the order 1, 2, 0
    assert chosen.row_column.tolist() == columns * 3 and chosen.row_to_seq.tolist() == [0, 0, 1, 1, 2, 2]
    replay_rows = torch.tensor(
        [b * SETTINGS.steps + int(out.records["steps"][b, k]) for b in range(3) for k in columns]
    )
    assert torch.equal(chosen.token_mask, full.token_mask[replay_rows])
    assert int(chosen.token_mask.sum(dim=1).min()) == 2
    torch.testing.assert_close(chosen.token_logp, full.token_logp[replay_rows], rtol=0, atol=1e-10)
    with pytest.raises(UserError, match="entropy_steps"):
        estimator.draw(SequenceBatch(ids, mask, out.completion_ids, batch.completion_mask), _gen(0))


# ------------------------------------------------------------------------------------------------- wiring
def test_official_defaults_and_options() -> None:
    egspo = build_baseline("egspo")
    c = egspo.config
    assert (c.beta, c.epsilon, c.epsilon_high, c.logps_eval_num_steps, c.lambda1) == (0.04, 0.2, 0.5, 8, 0.5)
    assert c.normalize_returns and not c.standard_grpo_returns and c.coupled
    assert egspo.estimator() == ChosenSteps() and egspo.rollout() == EntropySteps(num_steps=8)
    assert build_baseline("egspo", logps_eval_time_steps_mode="uniform").rollout().selection == "uniform"
    for options, match in (
        ({"coupled": False}, "coupled"),
        ({"epsilon": 1.0}, "epsilon"),
        ({"lambda1": -1.0}, "lambda1"),
        ({"logps_eval_num_steps": 0}, "num_steps"),
        ({"logps_eval_time_steps_mode": "final"}, "logps_eval_time_steps_mode"),
    ):
        with pytest.raises(UserError, match=match):
            build_baseline("egspo", **options)


def _by_length(texts, docs, profile):
    return [RewardResult(float(len(text) % 3), {}) for text in texts]


def _config(tmp_path, attention: str, budget: Budget, **overrides) -> TrainConfig:
    """A tiny EGSPO run on Sudoku with K = 4 chosen steps."""
    path = tmp_path / f"tiny-{attention}"
    save_diffusion_lm(build_tiny(attention=attention, block_size=4, seed=1, **TINY), path)
    fields = {
        "baseline": "egspo",
        "baseline_options": {"logps_eval_num_steps": 4},
        "task": "sudoku",
        "model": str(path),
        "protocol": "tiny",
        "budget": budget,
        "optim": OptimConfig(learning_rate=1e-3, max_grad_norm=1.0),
        "output_dir": str(tmp_path / "run"),
        "progress": False,
    }
    return TrainConfig(**{**fields, **overrides})


def assert_a_step_trains(cfg: TrainConfig) -> None:
    """One rollout and optimizer step of ``cfg``'s run, its texts rewarded by length: finite loss and gradient, every
    ratio 1 (iteration 0: the policy is the rollout policy), and the weights move."""
    trainer = RLTrainer(cfg)
    trainer.task.reward_many = _by_length
    micro_batches, _ = trainer.rollout()
    before = [p.detach().clone() for p in trainer.train_dlm.model.parameters() if p.requires_grad]
    metrics = trainer.optimizer_step(micro_batches, 0)
    after = [p for p in trainer.train_dlm.model.parameters() if p.requires_grad]
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"]) and not metrics["skipped"]
    assert metrics["ratio_max"] == pytest.approx(1.0)
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def recorded_rollout(cfg: TrainConfig) -> tuple[RLTrainer, MicroBatch, list[list[str]]]:
    """The first rollout of a run of one micro-batch, its texts rewarded by length; every reward call's texts kept
    (the completions first, then the predictions the rollout recorded)."""
    trainer = RLTrainer(cfg)
    scored: list[list[str]] = []

    def recording(texts, docs, profile):
        scored.append(list(texts))
        return _by_length(texts, docs, profile)

    trainer.task.reward_many = recording
    micro_batches, _ = trainer.rollout()
    (mb,) = micro_batches
    return trainer, mb, scored


def test_the_trainer_rewards_the_predictions_and_trains_on_the_chosen_steps(tmp_path) -> None:
    budget = small_budget(max_steps=2, num_iterations=2, diffusion_steps=8, max_completion_length=16)
    cfg = _config(tmp_path, "full", budget, per_device_prompts=2)
    trainer, mb, scored = recorded_rollout(cfg)
    rows = budget.prompts_per_step * budget.num_generations
    records = mb.batch.records
    assert records["steps"].shape == (rows, 4) and records["predictions"].shape == (rows, 4, 16)
    # the completions, then their K = 4 predictions each, with the same reward profile
    assert len(scored) == 2 and scored[1] == trainer.dlm.decode(records["predictions"].flatten(0, 1))
    step_rewards = torch.tensor([len(text) % 3 for text in scored[1]], dtype=torch.float32).view(rows, 4)
    torch.testing.assert_close(records["prediction_rewards"], step_rewards)
    assert mb.advantages.shape == (rows, 4)
    assert [noise.columns.tolist() for noise in mb.noises] == [[1, 2], [3, 0]]
    assert mb.old[0] is None and mb.old[1].row_column.tolist() == [3, 0] * rows
    for iteration in range(2):
        loss, metrics = trainer._micro_loss(mb, iteration)
        assert math.isfinite(loss.item()) and "kl" in metrics
    with pytest.raises(UserError, match="exceeds"):
        RLTrainer(dataclasses.replace(cfg, baseline_options={"logps_eval_num_steps": 9}))


def test_the_trainer_refuses_block_models_before_any_rollout(tmp_path) -> None:
    with pytest.raises(UserError, match="full-attention"):
        RLTrainer(_config(tmp_path, "block", small_budget(block_length=4)))
