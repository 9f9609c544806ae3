"""AGRPO's ``importance_sampling: entropy`` (``probablyabot/agrpo`` at ``98f1182``): the ``token_entropies`` rollout
against a slow recomputation of every entropy it records (``generate.py`` lines 65-84), the entropy step rule against
values worked out by hand and against a transcription of ``agrpo_trainer.py`` lines 256-280, the importance weights in
the loss (lines 336-342), and how the method and the trainer wire them.
"""

from __future__ import annotations

import math

import pytest
import test_egspo
import torch
from conftest import small_budget
from test_egspo import PROMPTS, TINY, _gen
from test_losses import close

from stabledrl_bench.baselines.agrpo import agrpo_loss
from stabledrl_bench.config import read_recipe
from stabledrl_bench.core.baseline import build_baseline
from stabledrl_bench.core.estimators import SequenceBatch, TraceSample, entropy_steps
from stabledrl_bench.core.models import build_tiny, save_diffusion_lm
from stabledrl_bench.core.rollouts import Independent, TokenEntropies
from stabledrl_bench.core.sampling import BlockDecode, FullDecode
from stabledrl_bench.errors import UserError
from stabledrl_bench.training.config import TrainConfig
from stabledrl_bench.training.optim import OptimConfig
from stabledrl_bench.training.trainer import RLTrainer

L = 12
model = test_egspo.model  # the fixture of EGSPO's tests: the tiny full-attention model in float64


def _settings(temperature: float) -> FullDecode:
    """12 tokens in blocks of 4, 2 steps per block: every step commits 2 tokens (the official C / sampling_steps)."""
    return FullDecode(max_completion_length=L, block_length=4, steps=6, temperature=temperature)


# ------------------------------------------------------------------------------------------------- rollout
def _slow_entropies(dlm, prompt_ids, prompt_mask, out, temperature: float) -> torch.Tensor:
    """Per row and position, from the final unmask order: the state before the step that committed it, one forward
    of it alone, the entropy of softmax(l / tau) (softmax(l) at tau = 0) at the position, MASK excluded, as
    ``generate.py`` lines 71-76: -sum where(isfinite(logp), exp(logp) logp, 0)."""
    rows, length = out.completion_ids.shape
    prompt_len = prompt_ids.shape[1]
    entropy = torch.zeros(rows, length, dtype=torch.float64)
    for b in range(rows):
        for k in range(length):
            hidden = out.unmask_step[b] >= out.unmask_step[b, k]
            completion = out.completion_ids[b].masked_fill(hidden, dlm.mask_id)
            x = torch.cat((prompt_ids[b], completion))[None]
            key_valid = torch.cat((prompt_mask[b].bool(), torch.ones(length, dtype=torch.bool)))[None]
            logits = dlm.logits(x, attention_mask=key_valid)[0, prompt_len + k].double()
            logits[dlm.mask_id] = float("-inf")
            logps = torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)
            entropy[b, k] = -torch.where(logps.isfinite(), logps.exp() * logps, 0.0).sum()
    return entropy


@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.0])
def test_token_entropies_records_what_the_sampler_drew_from(model, temperature: float) -> None:
    ids, mask = model.encode_prompts(PROMPTS, chat_template=False)
    settings = _settings(temperature)
    with torch.no_grad():
        out = TokenEntropies().sample(model, ids, mask, settings, _gen(5))
        plain = Independent().sample(model, ids, mask, settings, _gen(5))
        slow = _slow_entropies(model, ids, mask, out, temperature)
    # recording changes nothing the sampler draws
    assert torch.equal(out.completion_ids, plain.completion_ids) and torch.equal(out.unmask_step, plain.unmask_step)
    assert out.nfe == plain.nfe and set(out.records) == {"token_entropy"}
    assert out.records["token_entropy"].dtype == torch.float64
    torch.testing.assert_close(out.records["token_entropy"], slow, rtol=0, atol=1e-10)
    assert bool((slow > 0).all())


def test_token_entropies_refuses_what_it_cannot_record() -> None:
    with pytest.raises(UserError, match="full-attention"):
        TokenEntropies().check(BlockDecode(max_completion_length=8, block_length=4, steps=4))
    with pytest.raises(UserError, match="exact decoding"):
        TokenEntropies().check(FullDecode(max_completion_length=8, block_length=4, steps=4, cache="dual"))


# ------------------------------------------------------------------------------------------------ step rule
# One sequence, T = 4 steps, last non-EOS step 2 (lines 267-280). Token entropies per step: 0.5 (step 0), 1.0 + 0.5
# (step 1), 0 (step 2, e.g. a certain token), 2.0 (step 3, after the last step: zeroed). H = (0.5 + 1e-8, 1.5 + 1e-8,
# 1e-8, 0), sum 2 + 3e-8; p = H / sum; cdf = (p0, p0 + p1, 1). u = 0.1 and 0.25 - 1e-9 fall in step 0 (p0 = 0.25 +
# 1.25e-9), 0.3 in step 1; 1 - 1e-10 is past p0 + p1 = 1 - 5e-9 (up to rounding): step 2, whose 1e-8 alone makes it
# drawable, with a huge weight; 1.5 is past the end of the cdf: step 2 (the last step). Weight: (1 / 3) / p_s.
def test_entropy_rule_hand_values() -> None:
    token_entropy = torch.tensor([[0.5, 1.0, 0.5, 0.0, 2.0, 0.0]], dtype=torch.float64)
    token_step = torch.tensor([[0, 1, 1, 2, 3, 3]])
    u = torch.tensor([[0.1, 0.25 - 1e-9, 0.3, 1 - 1e-10, 1.5]], dtype=torch.float64)
    steps, weight = entropy_steps(token_entropy, token_step, 4, torch.tensor([2]), u)
    assert steps.tolist() == [[0, 0, 1, 2, 2]]
    total = 2 + 3e-8
    p = [(0.5 + 1e-8) / total, (1.5 + 1e-8) / total, 1e-8 / total]
    want = [1 / 3 / p[0], 1 / 3 / p[0], 1 / 3 / p[1], 1 / 3 / p[2], 1 / 3 / p[2]]
    for got, expected in zip(weight[0].tolist(), want, strict=True):
        assert close(got, expected, 1e-12)
    assert close(weight[0, 0].item(), 4 / 3, 1e-7) and close(weight[0, 2].item(), 4 / 9, 1e-7)
    assert close(weight[0, 3].item(), 2 / 3 * 1e8, 1e-6)


def _official_rule(completion_ids, unmask_steps, entropies, u, steps: int, stop: torch.Tensor):
    """``agrpo_trainer.py`` lines 256-280, transcribed (float64; the uniforms given; every stop token of the model
    counts as the official ``eos_token_id``, as in the uniform rule here)."""
    non_eos_step = unmask_steps.masked_fill(torch.isin(completion_ids, stop), -1)
    last_step = torch.max(non_eos_step, dim=1, keepdim=True)[0]
    step_entropies = torch.full((completion_ids.shape[0], steps), 1e-8, dtype=torch.float64)
    step_entropies.scatter_add_(1, unmask_steps, entropies)
    step_indices = torch.arange(steps).unsqueeze(0)
    step_entropies[step_indices > last_step] = 0.0
    step_probs = step_entropies / step_entropies.sum(dim=1, keepdim=True)
    step_cdf = step_probs.cumsum(dim=1)
    mc_steps = torch.searchsorted(step_cdf, u)
    sampled_probs = step_probs.gather(1, mc_steps)
    importance_weights = (1.0 / (last_step + 1)) / sampled_probs
    return mc_steps, importance_weights


@pytest.mark.parametrize("seed", [3, 4])
def test_trace_sample_entropy_rule_equals_the_official_lines(model, seed: int) -> None:
    """Rows replay the steps the official inverse-CDF draw gives, with its weights, on the same uniforms; each row's
    targets are the tokens its step committed (``unmask_positions = step == unmask_steps``, line 287)."""
    ids, mask = model.encode_prompts(PROMPTS, chat_template=False)
    settings = _settings(1.0)
    with torch.no_grad():
        out = TokenEntropies().sample(model, ids, mask, settings, _gen(seed))
        batch = SequenceBatch(
            ids, mask, out.completion_ids, model.completion_mask(out.completion_ids), out.unmask_step, dict(out.records)
        )
        estimator = TraceSample(num_mc=7, importance_sampling="entropy")
        noise = estimator.draw(batch, _gen(seed))
        got = estimator.evaluate(model, batch, noise)
        uniform = TraceSample(num_mc=7).evaluate(model, batch, noise)
    stop = torch.tensor(model.stop_ids)
    steps, weights = _official_rule(
        out.completion_ids, out.unmask_step, out.records["token_entropy"], noise.u, settings.steps, stop
    )
    assert got.row_to_seq.tolist() == [i for i in range(3) for _ in range(7)]
    targets = torch.stack([out.unmask_step[i] == int(steps[i, j]) for i in range(3) for j in range(7)])
    assert torch.equal(got.token_mask, targets)
    # the official 1.0 / (last_step + 1) is float32 (here float64): the weights agree to float32's precision
    torch.testing.assert_close(got.row_weight, weights.flatten(), rtol=1e-7, atol=0)
    assert uniform.row_weight is None  # the uniform rule: unweighted rows, as before


def test_trace_sample_entropy_rule_needs_the_records(model) -> None:
    ids, mask = model.encode_prompts(PROMPTS, chat_template=False)
    with torch.no_grad():
        out = Independent().sample(model, ids, mask, _settings(1.0), _gen(0))
    batch = SequenceBatch(ids, mask, out.completion_ids, model.completion_mask(out.completion_ids), out.unmask_step)
    estimator = TraceSample(num_mc=2, importance_sampling="entropy")
    with pytest.raises(UserError, match="token_entropies"):
        estimator.evaluate(model, batch, estimator.draw(batch, _gen(0)))
    with pytest.raises(UserError, match="importance_sampling"):
        TraceSample(importance_sampling="low_confidence")


# ---------------------------------------------------------------------------------------------------- loss
# test_further_methods' AGRPO rows (A = 1, 1, -2, -2; row objectives 1.1051709 + 1.2, 0.9048374, -2.4428055, -1.6)
# weighted (2, 1, 0.5, 1) (lines 336-339: per_token_loss * iw): loss = -(2 (2.3051709) + 0.9048374 - 0.5 (2.4428055)
# - 1.6) / 4 = -(4.6103418 + 0.9048374 - 1.2214028 - 1.6) / 4 = -0.6734441.
def test_agrpo_loss_weighs_each_row() -> None:
    mask = torch.tensor([[True, True], [True, False], [True, False], [True, False]])
    log_ratio = torch.tensor([[0.1, 0.3], [-0.1, 5.0], [0.2, 5.0], [-0.4, 5.0]])
    logp = torch.full((4, 2), -0.5)
    adv = torch.tensor([1.0, 1.0, -2.0, -2.0])
    weight = torch.tensor([2.0, 1.0, 0.5, 1.0], dtype=torch.float64)
    loss, _ = agrpo_loss(logp, logp - log_ratio, None, mask, adv, epsilon=0.2, row_weight=weight)
    assert close(loss.item(), -0.6734441)
    plain, _ = agrpo_loss(logp, logp - log_ratio, None, mask, adv, epsilon=0.2)
    assert close(plain.item(), 0.2081993)


# -------------------------------------------------------------------------------------------------- wiring
def test_defaults_options_and_recipe() -> None:
    agrpo = build_baseline("agrpo")
    assert agrpo.config.importance_sampling == "uniform"  # agrpo_config.py lines 27-30
    assert agrpo.rollout() == Independent() and agrpo.estimator() == TraceSample(num_mc=24, low_discrepancy=True)
    entropy = build_baseline("agrpo", importance_sampling="entropy")
    assert entropy.rollout() == TokenEntropies()
    assert entropy.estimator() == TraceSample(num_mc=24, importance_sampling="entropy")
    with pytest.raises(UserError, match="importance_sampling"):
        build_baseline("agrpo", importance_sampling="random").estimator()
    recipe = read_recipe("agrpo/gsm8k.yaml")
    assert recipe["baseline_options"]["importance_sampling"] == "entropy"  # train.yaml


def test_the_trainer_trains_on_entropy_drawn_steps(tmp_path) -> None:
    path = tmp_path / "tiny"
    save_diffusion_lm(build_tiny(attention="full", seed=1, **TINY), path)
    budget = small_budget(max_steps=1, num_iterations=1, diffusion_steps=8, max_completion_length=16)
    cfg = TrainConfig(
        baseline="agrpo",
        baseline_options={"importance_sampling": "entropy", "num_mc": 3},
        task="sudoku",
        model=str(path),
        protocol="tiny",
        budget=budget,
        optim=OptimConfig(learning_rate=1e-3, max_grad_norm=1.0),
        output_dir=str(tmp_path / "run"),
        progress=False,
        per_device_prompts=2,
    )
    trainer = RLTrainer(cfg)
    micro_batches, _ = trainer.rollout()
    (mb,) = micro_batches
    rows = budget.prompts_per_step * budget.num_generations
    assert mb.batch.records["token_entropy"].shape == (rows, 16)
    loss, _ = trainer._micro_loss(mb, 0)
    assert math.isfinite(loss.item())
