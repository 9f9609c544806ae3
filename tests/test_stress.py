"""Stability experiments: definitions (hand-computed), the convex-hull property (independent slow loops), the CI
regression on the tiny model, the leaderboard section, and one end-to-end run of every command at toy size.

CI regression thresholds (``test_ci_regression_gap_*``), measured with this file's ``_gap_statistics`` on seeds
0-19 (random-init 2-layer width-32 tiny model, 2 groups x 4 random completions of 16 tokens, 6 repeats, drift level
0, exploding noise = default ``ExplodingNoise``: Cauchy, scale 1, every ratio); statistic r = largest update norm
under ``exploding`` / median update norm under ``normal`` of the same variant:

* StableDRL: r in [1.23, 3.66] over the 20 seeds (seed 0: 1.23)   -> must stay <= 10   (2.7x margin above the max);
* GRPO:      r = inf (non-finite update) on 18 seeds, 1.3e6 and 3.2e19 on the other two -> must be >= 1e3.

The gap disappears (test fails) if StableDRL's update grows with the noise or GRPO's stops doing so.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from stabledrl_bench.baselines.grpo import grpo_loss
from stabledrl_bench.baselines.spg import sandwich_bound
from stabledrl_bench.baselines.stabledrl import stabledrl_loss
from stabledrl_bench.core.estimators import Estimate, SequenceBatch, build_estimator
from stabledrl_bench.core.models import build_tiny, save_diffusion_lm
from stabledrl_bench.errors import UserError
from stabledrl_bench.experiments.presets import presets
from stabledrl_bench.experiments.runner import ensure_warm_start
from stabledrl_bench.experiments.stress import hull as hull_mod
from stabledrl_bench.experiments.stress import main, stability_section
from stabledrl_bench.experiments.stress.common import (
    Definitions,
    ExplodingNoise,
    NoiseInjection,
    collapse_analysis,
    running_mean,
    spike_steps,
    stress_warm_start,
)
from stabledrl_bench.experiments.stress.recheck import recheck
from stabledrl_bench.experiments.stress.sweep import add_costs, analyze, change_over_runs
from stabledrl_bench.experiments.stress.tables import _setting_line
from stabledrl_bench.experiments.stress.update_norms import log_weight_noise, measure_update_norms
from stabledrl_bench.training.runlog import read_log
from stabledrl_bench.training.trainer import SampledBatch

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
STABLEDRL_MAX_GAP = 10.0
GRPO_MIN_GAP = 1e3


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ---------------------------------------------------------------------------------------------- definitions
def test_spike_steps_hand_computed():
    d = Definitions(spike_k=5.0, spike_window=3, spike_min_history=2)
    steps = list(range(1, 9))
    norms = [1.0, 20.0, 1.0, 2.0, None, 11.0, 12.0, float("nan")]
    # step 2: only 1 finite value before it (< min history) -> no spike despite 20x;
    # step 3: median(1, 20) = 10.5 -> 1 is not a spike; step 4: median(1, 20, 1) = 1 -> 2 < 5;
    # step 5: non-finite -> spike (and not part of the history); step 6: median(20, 1, 2) = 2 -> 11 > 10 spike;
    # step 7: median(1, 2, 11) = 2 -> 12 > 10 spike; step 8: NaN -> spike.
    assert spike_steps(steps, norms, d) == [5, 6, 7, 8]


def test_running_mean_skips_missing_values():
    assert running_mean([1.0, None, 3.0, 5.0, float("nan")], 2) == [1.0, 1.0, 2.0, 4.0, 4.0]
    assert running_mean([None, 2.0], 3) == [None, 2.0]


def test_collapse_analysis_hand_computed():
    d = Definitions(reward_window=2, collapse_fraction=0.5, confirm_steps=4, ignore_tail=0.1)
    steps = [1, 3, 5, 7, 9, 11, 13]  # mu = 2: rollout k serves steps k, k + 1
    frozen = dict.fromkeys(steps, 0.4)  # the control's running mean is 0.4 -> threshold 0.2
    # running means (window 2): .4 .4 .3 .15 .05 0 0 -> below from rollout 3 (step 7) to the end (step 14): 8 steps.
    rewards = [0.4, 0.4, 0.2, 0.1, 0.0, 0.0, 0.0]
    run = {"last_step": 14, "planned_steps": 14, "diverged_at": None, "d": d}
    out = collapse_analysis(steps, rewards, frozen, **run)
    assert out == {
        "collapse_step": 7,
        "collapse_kind": "reward",
        "transient_collapses": 0,
        "below_steps": 8,
        "zero_reward_steps": 6,  # rollouts at steps 9, 11, 13, two steps each
    }
    # The same drop judged against a control that fell as far is no collapse: the prompts got harder, not the policy.
    falling = dict(zip(steps, rewards, strict=True))
    assert collapse_analysis(steps, rewards, falling, **run)["collapse_step"] is None
    # Confirmation: a stretch of 8 steps is not confirmed under confirm_steps = 9 ...
    assert (
        collapse_analysis(steps, rewards, frozen, **{**run, "d": replace(d, confirm_steps=9)})["collapse_step"] is None
    )
    # ... nor one that starts in the ignored tail (step 7 > 0.9 x 7 planned steps).
    late = collapse_analysis(steps, rewards, frozen, **{**run, "planned_steps": 7})
    assert late["collapse_step"] is None and late["below_steps"] == 8
    # A recovery makes it transient: below at rollouts 3-5 (steps 7..12, 6 steps), then 0.9 lifts the mean.
    recovered = collapse_analysis(steps, [*rewards[:-1], 0.9], frozen, **run)
    assert recovered["collapse_step"] is None and recovered["transient_collapses"] == 1
    assert recovered["below_steps"] == 6 and recovered["zero_reward_steps"] == 4
    # A non-finite stop is always a collapse, at the step of the stop.
    stopped = collapse_analysis(steps[:2], rewards[:2], frozen, **{**run, "last_step": 3, "diverged_at": 3})
    assert (stopped["collapse_step"], stopped["collapse_kind"]) == (3, "nonfinite")


def test_log_weight_noise_hand_computed():
    log_ratio = torch.tensor([0.0, math.log(2.0), math.log(10.0), 0.0])
    out = log_weight_noise(log_ratio, torch.tensor([0, 0, 1, 1]), clip_high=math.log(5.0))
    assert out["log_weight_std"] == pytest.approx(float(log_ratio.double().std(unbiased=False)))
    assert out["at_clip"] == 0.25  # only rho = 10 is above C = 5
    # group 0: w = (1/3, 2/3), ESS = 1 / (1/9 + 4/9) = 9/5 of G = 2; group 1: rho = (5 after the clip, 1), w = (5/6,
    # 1/6), ESS = 36/26 of 2.
    assert out["ess"] == pytest.approx((9 / 5 / 2 + 36 / 26 / 2) / 2)


def test_exploding_noise_scales_to_each_methods_log_ratio():
    noise = ExplodingNoise(df=1.0, scale=0.5, probability=0.25)
    assert noise.injection("espo", 40).scale == pytest.approx(20.0)  # ESPO's log-ratio is Delta ELBO / L
    for baseline in ("grpo", "stabledrl", "stabledrl_clip_only"):
        injection = noise.injection(baseline, 40)
        assert (injection.df, injection.scale, injection.probability) == (1.0, 0.5, 0.25)
    with pytest.raises(UserError):
        ExplodingNoise(scale=0.0)
    with pytest.raises(UserError):
        ExplodingNoise(probability=1.5)


# ----------------------------------------------------------------------------------------------- convex hull
def test_noise_injection_is_heavy_tailed_and_seeded():
    old = Estimate(elbo=torch.zeros(20000))
    noise = NoiseInjection(df=1.0, scale=1.0)
    a = noise(old, torch.Generator().manual_seed(0)).elbo
    b = noise(old, torch.Generator().manual_seed(0)).elbo
    assert torch.equal(a, b)
    # Cauchy: median |x| = 1, but the largest of 20000 draws is in the thousands (a normal's would be ~4).
    assert abs(a.abs().median().item() - 1.0) < 0.1
    assert a.abs().max().item() > 100
    none = NoiseInjection(df=1.0, scale=1.0, probability=0.0)(old, torch.Generator()).elbo
    assert torch.equal(none, old.elbo)


def _slow_stabledrl_update(x: hull_mod.HullInputs, clip: float) -> torch.Tensor:
    """Independent loop: per group, w_i = min(rho_i, C) / sum_j min(rho_j, C); u = -(1/G) sum_i w_i A_i grad b_i."""
    groups = x.num_groups
    update = torch.zeros(x.elbo_vec.shape[1], dtype=torch.float64)
    for g in range(groups):
        members = [i for i in range(len(x.group_ids)) if int(x.group_ids[i]) == g]
        top = max(min(float(x.log_ratio[i]), math.log(clip)) for i in members)
        clipped = {i: math.exp(min(float(x.log_ratio[i]), math.log(clip)) - top) for i in members}
        total = sum(clipped.values())
        for i in members:
            a = float(x.advantages[i])
            grad_bound = x.elbo_vec[i] if a > 0 else 0.5 * x.eubo_vec[i] + 0.5 * x.elbo_vec[i]
            update -= clipped[i] / total * a * grad_bound / groups
    return update


def _slow_grpo_update(x: hull_mod.HullInputs, eps: float = 0.5) -> torch.Tensor:
    """Independent loop: u = -(1/N) sum_ik rho_ik A_i grad log pi_ik over the entries whose PPO min is unclipped."""
    n, k, dim = x.token_vec.shape
    update = torch.zeros(dim, dtype=torch.float64)
    for i in range(n):
        a = float(x.advantages[i])
        for j in range(k):
            log_rho = float(x.token_log_ratio[i, j])
            rho = math.exp(log_rho) if log_rho < 700 else math.inf
            clipped = (rho > 1 + eps and a > 0) or (rho < 1 - eps and a < 0)
            if not clipped:
                update -= rho * a * x.token_vec[i, j] / (n * k)
    return update


@pytest.mark.parametrize("scale", [0.3, 3.0])
def test_hull_updates_match_slow_loops(scale):
    generator = torch.Generator().manual_seed(7)
    for _ in range(5):
        x = hull_mod.draw_inputs(generator, scale)
        u = hull_mod.updates(x, clip_threshold=5.0)
        slow = _slow_stabledrl_update(x, 5.0)
        assert torch.allclose(u["stabledrl"], slow, rtol=1e-5, atol=1e-7 * float(slow.norm()))
        slow_grpo = _slow_grpo_update(x)
        if torch.isfinite(u["grpo"]).all():
            assert torch.allclose(u["grpo"], slow_grpo, rtol=1e-4, atol=1e-6 * float(slow_grpo.norm()))
        else:  # float64 inputs: only rho |A| beyond float64's range (about e^709.8) may overflow
            assert float(x.token_log_ratio.max()) > 700


def test_hull_bound_holds_for_stabledrl_and_not_for_grpo():
    records = hull_mod.run_hull(150, [0.3, 3.0, 30.0], seed=0)
    rows = {(r["variant"], r["scale"]): r for r in hull_mod.summarize(records, [0.3, 3.0, 30.0])}
    for variant in ("stabledrl", "selfnorm_only"):
        assert rows[(variant, "all")]["fraction_above_1"] == 0
        assert rows[(variant, "all")]["ratio_max"] <= 1 + hull_mod.TOLERANCE
    assert rows[("clip_only", "all")]["ratio_max"] <= 5.0 + hull_mod.TOLERANCE  # bounded by C, not by 1
    assert rows[("stabledrl", "all")]["residual_max"] < 1e-5
    assert rows[("stabledrl", "all")]["weight_sum_error_max"] < 1e-5
    # GRPO: the update leaves the bound, more often and further as the ratios get heavier.
    assert rows[("grpo", 30.0)]["fraction_above_1"] > rows[("grpo", 0.3)]["fraction_above_1"]
    assert rows[("grpo", "all")]["fraction_above_1"] > 0.3


# ------------------------------------------------------------------------------------- tiny model (CI regression)
def _random_rollout(dlm, generator, groups=2, size=4, prompt=8, length=16) -> SampledBatch:
    """Random prompts and completions (EOS-terminated), rewards U[0, 1]: the mechanics need no trained model."""
    rows = groups * size
    vocab = dlm.model.config.vocab_size
    prompt_ids = torch.randint(10, vocab, (rows, prompt), generator=generator)
    completion = torch.randint(10, vocab, (rows, length), generator=generator)
    stop = torch.randint(length // 2, length, (rows,), generator=generator)
    completion = torch.where(torch.arange(length)[None] >= stop[:, None], dlm.eos_id, completion)
    batch = SequenceBatch(
        prompt_ids, torch.ones_like(prompt_ids, dtype=torch.bool), completion, dlm.completion_mask(completion)
    )
    rewards = torch.rand(rows, generator=generator)
    group_ids = torch.arange(groups).repeat_interleave(size)
    return SampledBatch(batch, rewards, (rewards > 0.5).float(), group_ids, components={}, nfe=0, unit=0)


def test_ci_regression_stabledrl_gradient_within_analytic_bound_on_tiny_model():
    """||grad L|| <= (1/G) sum_g max_{i in g} ||A_i grad bound_i||, and grad L equals the explicit convex combination
    (per-sample gradients from a slow loop), under exploding noise on the real tiny model and estimator."""
    dlm = build_tiny(seed=0, **SMALL)
    generator = torch.Generator().manual_seed(0)
    rollout = _random_rollout(dlm, generator)
    estimator = build_estimator("spg_block", block_length=8)
    params = [p for p in dlm.model.parameters()]
    with torch.no_grad():
        old = estimator.evaluate(dlm, rollout.batch, estimator.draw(rollout.batch, generator))
    old = ExplodingNoise(scale=3.0).injection("stabledrl", 16)(old, generator)
    new = estimator.evaluate(dlm, rollout.batch, estimator.draw(rollout.batch, generator))
    advantages = rollout.rewards - rollout.rewards.view(2, 4).mean(1).repeat_interleave(4)
    loss, _ = stabledrl_loss(new.elbo, new.eubo, old.elbo, advantages, rollout.group_ids)
    grad = torch.cat([g.flatten() for g in torch.autograd.grad(loss, params, retain_graph=True)]).double()
    bound = sandwich_bound(new.elbo, new.eubo, advantages)
    per_sample = [
        torch.cat([g.flatten() for g in torch.autograd.grad(bound[i], params, retain_graph=True)]).double()
        for i in range(len(bound))
    ]
    log_ratio = [float(new.elbo[i].detach() - old.elbo[i]) for i in range(len(bound))]
    expected = torch.zeros_like(grad)
    analytic = 0.0
    for g in range(2):
        members = range(4 * g, 4 * g + 4)
        clipped = {i: min(math.exp(log_ratio[i]), 5.0) for i in members}
        for i in members:
            expected -= clipped[i] / sum(clipped.values()) * float(advantages[i]) * per_sample[i] / 2
        analytic += max(abs(float(advantages[i])) * float(per_sample[i].norm()) for i in members) / 2
    assert max(abs(x) for x in log_ratio) > math.log(5.0)  # the noise did push some ratios past the clip
    assert torch.allclose(grad, expected, rtol=1e-4, atol=1e-6 * float(expected.norm()))
    assert float(grad.norm()) <= analytic * (1 + 1e-5)


def _gap_statistics(seed: int) -> dict[str, float]:
    """Per variant: largest update norm under exploding noise / median update norm under normal (6 repeats)."""
    dlm = build_tiny(seed=seed, **SMALL)
    rollout = _random_rollout(dlm, torch.Generator().manual_seed(seed))
    records = measure_update_norms(
        dlm, [rollout], ["grpo", "stabledrl"], [0.0], 6, ["normal", "exploding"], ExplodingNoise(), seed=seed,
        block_length=8,
    )  # fmt: skip
    out = {}
    for variant in ("grpo", "stabledrl"):
        median = statistics.median(r["variants"][variant]["normal"]["norm"] for r in records)
        exploding = [r["variants"][variant]["exploding"]["norm"] for r in records]
        out[variant] = max(math.inf if x is None else x / median for x in exploding)
    return out


def test_ci_regression_gap_between_grpo_and_stabledrl_under_exploding_noise():
    gap = _gap_statistics(0)
    assert gap["stabledrl"] <= STABLEDRL_MAX_GAP
    assert gap["grpo"] >= GRPO_MIN_GAP


def test_measure_update_norms_restores_the_policy_and_is_deterministic():
    dlm = build_tiny(seed=1, **SMALL)
    before = {k: v.clone() for k, v in dlm.model.state_dict().items()}
    rollout = _random_rollout(dlm, torch.Generator().manual_seed(1))
    args = (dlm, [rollout], ["stabledrl", "clip_only"], [0.0, 0.2], 2, ["normal"], ExplodingNoise())
    first = measure_update_norms(*args, seed=3, block_length=8)
    second = measure_update_norms(*args, seed=3, block_length=8)
    assert first == second
    assert all(torch.equal(before[k], v) for k, v in dlm.model.state_dict().items())
    drifts = {r["level"]: r["policy_drift"] for r in first}
    assert drifts[0.0] == 0.0 and drifts[0.2] > 0


def test_grpo_update_leaves_the_per_token_bound_under_exploding_noise():
    """Reference point for the gap: GRPO's gradient exceeds its largest per-token term when a ratio explodes."""
    logp = torch.zeros(2, 3, requires_grad=True)
    advantages = torch.tensor([-1.0, 1.0])
    old = torch.tensor([[-4.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # log rho = 4 on one token of the A < 0 sample
    loss, _ = grpo_loss(logp, old, None, torch.ones(2, 3, dtype=torch.bool), advantages, beta=0.0)
    (grad,) = torch.autograd.grad(loss, logp)
    # d/dlogp of -min(rho A, clip(rho) A) / 6: A < 0, rho = e^4 unclipped -> e^4 / 6; A > 0, rho = 1 -> -1/6.
    expected = torch.tensor([[math.exp(4) / 6, 1 / 6, 1 / 6], [-1 / 6, -1 / 6, -1 / 6]])
    assert torch.allclose(grad, expected, rtol=1e-5)
    assert grad.abs().max() > 1.0  # per-token terms |A| * 1 = 1: the update is outside their hull


# ------------------------------------------------------------------------------------------- leaderboard section
def _summary(
    label, condition, collapsed, steps, seeds=3, initial=0.4, final=0.5, spikes=0.0, above=None, verdict="gained"
):
    def b(v):
        return {"mean": v, "min": v, "max": v, "n": seeds}

    change = final - initial
    runs = {"mean": change, "low": change - 0.05, "high": change + 0.05, "runs": seeds, "verdict": verdict}

    return {
        "label": label,
        "condition": condition,
        "seeds": seeds,
        "collapsed": collapsed,
        "collapse_steps": steps,
        "collapse_kinds": ["reward"] if collapsed else [],
        "transient_collapses": 0,
        "zero_reward_steps": b(0.0),
        "above_frozen": seeds if above is None else above,
        "spikes": b(spikes),
        "nonfinite_steps": b(0.0),
        "initial_reward": b(initial),
        "final_reward": b(final),
        "final_vs_frozen": b(final - initial),
        "final_vs_frozen_runs": runs,
        "grad_norm_median": b(1.0),
        "grad_norm_max": b(2.0),
        "shared_with_normal": label == "spg" and condition == "exploding",
    }


def _write(folder: Path, name: str, record: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    base = {"schema": "stabledrl-bench/stability/v1", "experiment": name, "seeds": [0, 1, 2], "runtime_s": 1.0}
    (folder / f"{name}.json").write_text(json.dumps({**base, **record}))


def test_stability_section_is_none_without_records(tmp_path):
    assert stability_section(tmp_path) is None


def test_stability_section_verdicts_come_from_the_numbers(tmp_path):
    folder = tmp_path / "stability"
    budget = {"max_steps": 80, "prompts_per_step": 4, "num_generations": 8, "max_completion_length": 40}
    budget |= {"diffusion_steps": 10, "num_iterations": 2}
    summary = [
        _summary("stabledrl", "normal", 0, []),
        _summary("stabledrl", "exploding", 0, []),
        _summary("espo", "normal", 0, []),
        _summary("espo", "exploding", 3, [5, 9, 13]),  # all collapsed, median 9 <= 20: "immediately"
        _summary("spg", "normal", 1, [60]),
        _summary("spg", "exploding", 1, [60]),
        _summary("grpo", "normal", 0, [], spikes=4.0),
        _summary("grpo", "exploding", 3, [3, 3, 3], spikes=3.0),
    ]
    _write(folder, "exploding", {"title": "Exploding", "budget": budget, "budget_hash": "abc", "summary": summary})
    clip = [
        _summary("C=1", "exploding", 0, []),
        _summary("C=5", "exploding", 0, []),
        _summary("C=100", "exploding", 0, []),
        _summary("C=1000", "exploding", 2, [30, 50]),
    ]
    _write(folder, "clip", {"budget": budget, "budget_hash": "abc", "summary": clip, "thresholds": [1, 5, 100, 1000]})
    text = stability_section(tmp_path)
    assert text.startswith("## Stability")
    assert f"]({tmp_path.as_posix()}/stability/" not in text  # no plots recorded, so no image links
    lines = {line.split("paper: ")[1].split(" (")[0]: line for line in text.splitlines() if "paper: " in line}
    assert lines["StableDRL improves stably under Normal and Exploding"].startswith("* **agrees**")
    assert lines["ESPO collapses immediately under Exploding"].startswith("* **agrees**")
    spg_line = lines["SPG collapses under both Normal and Exploding, from off-policy bias"]
    assert spg_line.startswith("* **partly agrees**") and "1/3 collapsed at step(s) 60 (reward)" in spg_line
    grpo_line = next(line for key, line in lines.items() if key.startswith("with estimated ratios GRPO"))
    assert grpo_line.startswith("* **agrees**")
    clip_line = lines["C in {1, 5} is stable, C in {100, 1000} collapses"]
    assert clip_line.startswith("* **partly agrees**") and "C=100: exploding 0/3 collapsed" in clip_line
    assert "not run (`python -m stabledrl_bench stress drift`)" in text
    assert "| stabledrl | exploding | 0/3 |" in text
    assert "+0.100 [+0.050, +0.150] gained (3 runs); seeds 0.1, 3/3 above |" in text


def test_a_gain_that_the_runs_do_not_resolve_is_no_improvement(tmp_path):
    """StableDRL stable under both conditions, every seed above the frozen control, but the exploding condition's
    interval over runs includes 0: the claim "improves stably" is only partly met."""
    budget = {"max_steps": 80, "prompts_per_step": 4, "num_generations": 8, "max_completion_length": 40}
    budget |= {"diffusion_steps": 10, "num_iterations": 2}
    summary = [
        _summary("stabledrl", "normal", 0, []),
        _summary("stabledrl", "exploding", 0, [], verdict="not resolved"),
    ]
    _write(tmp_path / "stability", "exploding", {"budget": budget, "budget_hash": "abc", "summary": summary})
    (line,) = [line for line in stability_section(tmp_path).splitlines() if "StableDRL improves stably" in line]
    assert line.startswith("* **partly agrees**") and "no gain resolved over runs" in line
    assert "exploding 0/3 collapsed, last − frozen +0.100 [+0.050, +0.150] over 3 runs (not resolved)" in line


def test_the_change_over_runs_pairs_each_runs_last_rollouts_with_its_control():
    """A run's last ``reward_window`` rollouts with a finite reward, each minus the frozen control's reward at the
    same step; then the runs' mean with its interval over runs, and a verdict only where it excludes 0."""
    steps = [1, 2, 3, 4]
    curves = {"step": steps, "grad_norm": [1.0] * 4, "reward_step": steps, "reward_mean": [0.1, 0.5, 0.6, None]}
    run = {"curves": curves, "last_step": 4, "diverged_at": None}
    frozen = {"reward_step": steps, "reward_mean": [0.2, 0.2, 0.4, 0.5]}
    changes = analyze(run, frozen, Definitions(reward_window=2), planned_steps=4)["final_changes"]
    assert changes == pytest.approx([0.5 - 0.2, 0.6 - 0.4])  # step 4 has no reward: steps 2 and 3

    both = change_over_runs([[0.2, 0.4], [0.1, 0.1], []])  # the run without rollouts is left out
    assert both["mean"] == pytest.approx((0.3 + 0.1) / 2) and both["runs"] == 2 and both["verdict"] == "gained"
    assert both["low"] <= both["mean"] <= both["high"]
    assert change_over_runs([[0.2, 0.4]])["verdict"] == "not resolved"  # one run: its rollouts only
    assert change_over_runs([[0.3, -0.2], [-0.1, 0.2]])["verdict"] == "not resolved"
    assert change_over_runs([[], []]) is None


@pytest.mark.parametrize(
    ("stabledrl", "grpo", "change", "verdict"),
    [
        ((0, []), (2, [300, 500]), "gained", "agrees"),
        ((0, []), (0, []), "gained", "disagrees"),
        ((1, [400]), (2, [300, 500]), "gained", "disagrees"),
        # Every seed ended above the frozen control, but the interval over runs includes 0: nothing is learned that
        # the runs resolve, so stability is not tested.
        ((0, []), (2, [300, 500]), "not resolved", "not tested"),
    ],
)
def test_long_run_verdict_comes_from_the_numbers(tmp_path, stabledrl, grpo, change, verdict):
    budget = {"max_steps": 500, "prompts_per_step": 4, "num_generations": 8, "max_completion_length": 48}
    budget |= {"diffusion_steps": 12, "num_iterations": 2}
    summary = [
        _summary("grpo", "normal", *grpo, seeds=2, verdict=change),
        _summary("stabledrl", "normal", *stabledrl, seeds=2, verdict=change),
    ]
    record = {"budget": budget, "budget_hash": "abc", "summary": summary}
    optimizer = {"learning_rate": 3e-5, "max_grad_norm": 0.2, "weight_decay": 0.1, "lr_scheduler_type": "linear"}
    record |= {"optimizer": optimizer, "learning_rate_source": "stability/lrsweep.json"}
    record |= {
        "methods": {"grpo": {"effective": {"beta": 0.0}}, "stabledrl": {"effective": {"beta": 0.0, "num_mc": 2}}}
    }
    record |= {"title": "Long run", "seeds": [0, 1]}
    _write(tmp_path / "stability", "longrun", record)
    text = stability_section(tmp_path)
    (line,) = [line for line in text.splitlines() if "StableDRL trains stably for 1000+" in line]
    assert line.startswith(f"* **{verdict}**") and "500 steps, mu = 2, G = 8, lr 3e-05, num_mc 2, beta 0" in line
    assert f"grpo {grpo[0]}/2 collapsed" in line and "### Long run" in text
    assert "lr 3e-05 from the learning-rate sweep (linear schedule), weight decay 0.1, grad clip 0.2" in text
    assert "per method: grpo beta 0; stabledrl beta 0, num_mc 2" in text


def test_a_training_experiment_runs_on_a_presets_task(tmp_path):
    """``--preset P --task T``: the preset's data, rewards, budget (``--steps`` long) and precision, with the
    experiment's knobs, e.g. the paper's on a real checkpoint; the rate must come from a sweep of the same settings."""
    results, runs, model = tmp_path / "results", tmp_path / "runs", tmp_path / "model"
    save_diffusion_lm(build_tiny(seed=0, **SMALL), model)
    common = ["--results", str(results), "--runs", str(runs), "--no-leaderboard", "--warm-start", str(model)]
    run = ["--methods", "stabledrl", "--seeds", "0", "--steps", "2", "--jobs", "1", *common]
    with pytest.raises(UserError, match="needs --task, one of"):
        main(["longrun", "--preset", "smoke", *run])
    with pytest.raises(UserError, match="--task needs --preset"):
        main(["longrun", "--task", "gsm8k", *run])
    with pytest.raises(UserError, match="--preset nope: unknown"):
        main(["longrun", "--preset", "nope", "--task", "gsm8k", *run])
    with pytest.raises(UserError, match="trains a given model: pass --warm-start"):
        main(["longrun", "--preset", "paper", "--task", "gsm8k", *run[:-2]])
    with pytest.raises(UserError, match="run `stress lrsweep` first"):
        main(["longrun", "--preset", "smoke", "--task", "sudoku", *run])
    main(["longrun", "--preset", "smoke", "--task", "sudoku", "--lr", "1e-4", *run])
    record = json.loads((results / "stability" / "longrun.json").read_text())
    smoke = presets("table1")["smoke"]
    assert record["preset"] == "smoke" and record["task"]["name"] == "sudoku"
    assert record["budget"] == {**smoke.budget.to_dict(), "max_steps": 2}
    assert record["task"]["protocol"] == smoke.prompt_protocol and record["optimizer"]["max_grad_norm"] == 0.2
    stress_sweep = {"schema": "stabledrl-bench/stability/v1", "experiment": "lrsweep", "preset": None}
    stress_sweep |= {"task": {"name": "sudoku_hard"}, "chosen_lr": 1e-4}
    (results / "stability" / "lrsweep.json").write_text(json.dumps(stress_sweep))
    with pytest.raises(UserError, match="swept the stress settings: run `stress lrsweep` with the same settings"):
        main(["longrun", "--preset", "smoke", "--task", "sudoku", *run])


def test_a_record_from_an_older_version_is_one_line(tmp_path):
    """A training record without the fields this version reports (e.g. transient collapses) names its file."""
    summary = [_summary("stabledrl", "normal", 0, [])]
    del summary[0]["transient_collapses"]
    budget = {"max_steps": 80, "prompts_per_step": 4, "num_generations": 8, "max_completion_length": 40}
    budget |= {"diffusion_steps": 10, "num_iterations": 2}
    _write(tmp_path / "stability", "exploding", {"budget": budget, "budget_hash": "abc", "summary": summary})
    with pytest.raises(UserError, match=r"exploding\.json: no field 'transient_collapses' .* run `stress exploding`"):
        stability_section(tmp_path)


def test_stability_section_rejects_a_foreign_record(tmp_path):
    (tmp_path / "stability").mkdir()
    (tmp_path / "stability" / "hull.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(UserError, match=r"hull\.json"):
        stability_section(tmp_path)


# --------------------------------------------------------------------------------------------- command line
def test_command_line_errors_are_user_errors(tmp_path):
    common = ["--results", str(tmp_path), "--runs", str(tmp_path / "runs"), "--no-leaderboard"]
    with pytest.raises(UserError, match="--methods"):
        main(["exploding", "--methods", "grpo,nope", *common])
    with pytest.raises(UserError, match="--conditions"):
        main(["clip", "--conditions", "stormy", *common])
    with pytest.raises(UserError, match="--variants"):
        main(["drift", "--variants", "ppo", *common])
    with pytest.raises(UserError, match="exploding noise"):
        main(["drift", "--noise-scale", "-1", *common])
    with pytest.raises(UserError, match="--scales"):
        main(["hull", "--scales", "a,b", *common])


def test_cached_warm_start_built_with_other_settings_is_refused(tmp_path):
    folder = tmp_path / "sft"
    folder.mkdir()
    (folder / "warm_start.json").write_text(json.dumps({"spec_hash": "something-else"}))
    with pytest.raises(UserError, match="other settings"):
        ensure_warm_start(stress_warm_start(), folder)
    with pytest.raises(UserError, match="not a model folder"):
        ensure_warm_start(stress_warm_start(), folder, override=str(tmp_path))


def test_every_command_end_to_end_at_toy_size(tmp_path):
    """Both training commands, drift and hull write records and plots; runs are shared; the section renders."""
    results, runs, model = tmp_path / "results", tmp_path / "runs", tmp_path / "model"
    save_diffusion_lm(build_tiny(seed=0, **SMALL), model)
    common = ["--results", str(results), "--runs", str(runs), "--no-leaderboard", "--warm-start", str(model)]
    toy = ["--prompts", "2", "--generations", "2", "--diffusion-steps", "6", "--seeds", "0"]
    train = [*toy, "--steps", "2", "--jobs", "1", "--conditions", "exploding"]
    with pytest.raises(UserError, match="run `stress lrsweep` first"):  # the rate comes from the recorded sweep,
        main(["exploding", "--methods", "spg", *train, *common[:-2]])  # checked before a warm start is built
    assert not (runs / "sft").exists()
    main(["lrsweep", "--methods", "grpo,stabledrl", "--lrs", "1e-4,1e-3", *toy, "--steps", "4", "--jobs", "1", *common])
    main(["exploding", "--methods", "spg,stabledrl", *train, *common])
    main(["clip", "--thresholds", "5", *train, *common])
    main(["drift", "--levels", "0,0.1", "--repeats", "1", "--rollouts", "1", *toy, *common])
    main(["hull", "--trials", "10", *common[:-2]])
    main(["longrun", "--methods", "grpo,stabledrl", *toy, "--steps", "4", "--jobs", "1", *common])
    main(["attribution", "--methods", "stabledrl,stabledrl_anchor", *train, *common])
    main(["anchored", "--methods", "grpo_anchor,stabledrl_anchor", *toy, "--steps", "4", "--jobs", "1", *common])
    records = {p.stem: json.loads(p.read_text()) for p in (results / "stability").glob("*.json")}
    assert set(records) == {"lrsweep", "exploding", "clip", "drift", "hull", "longrun", "attribution", "anchored"}
    chosen = records["lrsweep"]["chosen_lr"]
    assert chosen in (1e-4, 1e-3) and set(records["lrsweep"]["by_lr"]) == {"0.0001", "0.001"}
    longrun = records["longrun"]
    knobs = ("learning_rate", "weight_decay", "lr_scheduler_type", "max_grad_norm")
    assert [longrun["optimizer"][k] for k in knobs] == [chosen, 0.1, "linear", 0.2]  # the official knobs
    assert longrun["budget"]["num_iterations"] == 2 and longrun["learning_rate_source"] == "stability/lrsweep.json"
    effective = {name: m["effective"] for name, m in longrun["methods"].items()}
    assert effective["grpo"]["beta"] == 0.0 and effective["stabledrl"]["beta"] == 0.0
    assert effective["stabledrl"]["num_mc"] == 2
    exploding = records["exploding"]
    assert exploding["budget_hash"] and exploding["environment"]["hardware"]
    assert exploding["warm_start"] == {"path": str(model), "source": "user"}
    assert list(exploding["frozen"]) == ["0"] and len(exploding["frozen"]["0"]["reward_mean"]) == 1
    assert records["drift"]["budget"]["max_steps"] == 2  # one rollout phase: rollout, then inner step mu = 2
    start = records["drift"]["start_noise"]
    assert set(start) == {"clip_only", "selfnorm_only", "stabledrl", "stabledrl_mc1"}  # the StableDRL family
    assert start["stabledrl"]["log_weight_std"]["mean"] > 0 and 0 < start["stabledrl"]["ess"]["mean"] <= 1
    (spg,) = [r for r in exploding["runs"] if r["label"] == "spg"]
    assert spg["shared_with_normal"] and "-normal-" in Path(spg["run_dir"]).name  # no ratio: the normal run
    # StableDRL with C = 5 is the same configuration in both sweeps: one run folder, trained once.
    (stable,) = [r for r in exploding["runs"] if r["label"] == "stabledrl"]
    (clip5,) = records["clip"]["runs"]
    assert stable["run_dir"] == clip5["run_dir"]
    # 4 sweep runs (2 methods x 2 rates) + 2 exploding; the long run at the chosen rate is the sweep's own runs;
    # the attribution's unchanged StableDRL is the exploding test's run, its anchored variant one more.
    # The anchored long run: two runs of its own (the anchor is part of a run's identity), the control shared.
    assert len(list((runs / "train").iterdir())) == 4 + 2 + 1 + 2 and longrun["jobs"]["jobs_reused"] == 3
    assert records["anchored"]["jobs"] == {**records["anchored"]["jobs"], "jobs": 3, "jobs_reused": 1}
    for record in (longrun, records["lrsweep"], records["anchored"]):  # every run, reused or not, by this code
        codes = record["jobs"]["training_code"]
        assert len(codes) == 1 and sum(codes.values()) == record["jobs"]["jobs"]
    attribution = records["attribution"]
    assert attribution["jobs"]["jobs_reused"] == 2  # the control and the unchanged StableDRL
    effective = {name: m["effective"] for name, m in attribution["methods"].items()}
    assert effective["stabledrl"]["anchor_beta"] == 0.0 and effective["stabledrl_anchor"]["anchor_beta"] == 0.04
    assert effective["stabledrl_anchor"]["beta"] == 0.0  # the method's own KL stays off
    (anchored,) = [r for r in attribution["runs"] if r["label"] == "stabledrl_anchor"]
    assert "anchor_kl" in read_log(Path(anchored["run_dir"]) / "log.jsonl")[-1]
    for name, record in records.items():
        for plot in record["plots"].values():
            assert (results / "stability" / plot).is_file()
        assert recheck(results / "stability" / f"{name}.json") == ([], [])  # its summary follows from its data
    # The run folders are here: their logs are read again, so a record whose curves are not its runs' fails.
    log = Path(longrun["runs"][0]["run_dir"]) / "log.jsonl"
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    steps[0]["grad_norm"] = 123.0
    log.write_text("".join(json.dumps(step) + "\n" for step in steps))
    problems, _ = recheck(results / "stability" / "longrun.json")
    assert any(line.startswith("runs[0].curves.grad_norm[0]: stored") for line in problems), problems
    text = stability_section(results)
    assert "### What we observed" in text and "not run (`python" not in text
    assert "* **observation** — learning-rate sweep:" in text and "### Learning-rate sweep" in text
    assert "per method: grpo beta 0; stabledrl beta 0, num_mc 2" in text  # the sweep's effective options
    assert "stabledrl_anchor beta 0, num_mc 2, shared anchor 0.04" in text
    assert "* **attribution** — stabledrl under exploding: unchanged 0/1 collapsed" in text
    assert "beta 0 plus one shared KL anchor 0.04 for every method, no injected noise: " in text
    assert f"![exploding reward]({results.as_posix()}/stability/exploding_reward.png)" in text


def test_every_label_of_a_sweep_gets_its_own_colour_in_its_plots(tmp_path, monkeypatch):
    """Eleven labels (the attribution experiment has nine) are eleven series, no two of one colour: a palette
    shorter than the labels once dropped the ninth from the plot without a word."""
    from stabledrl_bench.experiments.stress import sweep as sweep_mod

    drawn = []

    def record(ax, series, color, log=False):
        drawn.append((series.label, color))
        ax.plot([0], [1], color=color, label=series.label)  # as the real one draws: the legend has its entries
        return True

    monkeypatch.setattr(sweep_mod, "seed_band", record)
    labels = [f"variant{i}" for i in range(11)]
    curves = {"reward_step": [1, 3], "reward_mean": [0.5, 0.6], "step": [1, 2, 3, 4], "grad_norm": [1.0] * 4}
    rows = [{"label": label, "condition": "normal", "curves": curves, "diverged_at": None} for label in labels]
    frozen = {0: {"reward_step": [1, 3], "reward_mean": [0.5, 0.5]}}
    sweep_mod.plot_sweep(rows, frozen, labels, ["normal"], tmp_path, "toy", "Toy", window=2)
    reward = [(label, color) for label, color in drawn[: len(labels)]]
    assert [label for label, _ in reward] == labels
    assert len({str(color) for _, color in reward}) == len(labels)
    assert len(drawn) == 2 * len(labels) + 1  # reward and grad-norm panels, and the frozen start once


def test_records_say_when_their_runs_were_trained_by_several_code_versions():
    one = {"jobs": 2, "jobs_reused": 1, "worker_cpu_seconds": 3.0, "training_code": {"abc1234": 2}}
    two = {"jobs": 3, "jobs_reused": 3, "worker_cpu_seconds": 1.0, "training_code": {"unknown": 2, "abc1234": 1}}
    total = add_costs(add_costs({}, one), two)
    counts = {"jobs": 5, "jobs_reused": 4, "worker_cpu_seconds": 4.0}
    assert total == {**counts, "training_code": {"abc1234": 3, "unknown": 2}}
    assert _setting_line({"jobs": one}).endswith("runs trained by code abc1234 (2).")
    mixed = _setting_line({"jobs": total})
    assert "**runs trained by 2 code versions** (runs each: abc1234 (3), unknown (2); unknown = trained before" in mixed
    assert "code not recorded" in _setting_line({"jobs": {"training_code": {"unknown": 4}}})
    assert "trained by" not in _setting_line({"jobs": {"jobs": 1}})  # records written before runs recorded code
