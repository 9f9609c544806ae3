"""The experiment runner: one warm start, one cache keyed by the job's hash, one frozen control, one rollout path."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import small_warm_start

from stabledrl_bench.core.budget import Budget
from stabledrl_bench.errors import UserError
from stabledrl_bench.experiments import runner
from stabledrl_bench.experiments.runner import (
    TrainJob,
    control_config,
    ensure_warm_start,
    run_jobs,
    run_training,
    sample_rollouts,
)
from stabledrl_bench.experiments.stress.common import NoiseInjection
from stabledrl_bench.training.config import TrainConfig
from stabledrl_bench.training.optim import OptimConfig
from stabledrl_bench.training.runlog import read_log

BUDGET = Budget(
    max_steps=4,
    prompts_per_step=2,
    num_generations=2,
    num_iterations=2,
    max_completion_length=16,
    diffusion_steps=4,
    block_length=8,
    temperature=0.9,
    max_prompt_length=64,
)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    folder = tmp_path_factory.mktemp("warm") / "sft"
    final, info = ensure_warm_start(small_warm_start(), folder)
    return final, info


def _config(model, out, **changes) -> TrainConfig:
    cfg = TrainConfig(
        baseline="stabledrl",
        task="sudoku",
        model=str(model),
        protocol="tiny",
        train_split="generated",
        budget=BUDGET,
        optim=OptimConfig(learning_rate=1e-3, lr_scheduler_type="constant", weight_decay=0.0),
        per_device_prompts=2,
        output_dir=str(out),
        progress=False,
    )
    return dataclasses.replace(cfg, **changes)


def test_warm_start_is_built_once_and_keyed_by_its_spec(start, tmp_path):
    final, info = start
    assert (final / "config.json").is_file() and info["built_now"] and info["sft_cpu_seconds"] > 0
    again, cached = ensure_warm_start(small_warm_start(), final.parent)
    assert again == final and not cached["built_now"] and cached["spec_hash"] == info["spec_hash"]
    with pytest.raises(UserError, match="other settings"):
        ensure_warm_start(small_warm_start(steps=3), final.parent)
    # the folder is never where the identity comes from: the same spec elsewhere has the same hash
    assert small_warm_start().hash() == info["spec_hash"] != small_warm_start(steps=3).hash()


def test_job_key_ignores_where_and_how_loudly_but_not_what(tmp_path):
    base = TrainJob(_config("m", tmp_path / "a"))
    assert base.key() == TrainJob(_config("m", tmp_path / "b", progress=True, check_model=False)).key()
    assert base.key() == TrainJob(_config("m", tmp_path / "a", baseline_options={"clip_threshold": 5.0})).key()
    for other in (
        TrainJob(_config("m", tmp_path / "a", seed=1)),
        TrainJob(_config("m", tmp_path / "a", baseline_options={"clip_threshold": 6.0})),
        TrainJob(_config("m", tmp_path / "a"), hook=NoiseInjection(scale=2.0)),
        TrainJob(_config("other", tmp_path / "a")),
    ):
        assert other.key() != base.key()
    fast = dataclasses.replace(BUDGET, rollout_decode="fast")
    assert TrainJob(_config("m", tmp_path / "a", budget=fast)).key() != base.key()
    # "never clip" is a setting like any other (the self-normalisation-only ablation's threshold is inf)
    never = TrainJob(_config("m", tmp_path / "a", baseline="stabledrl_selfnorm_only"))
    assert never.key() != TrainJob(_config("m", tmp_path / "a", baseline_options={"clip_threshold": 1e308})).key()


def test_finished_runs_are_reused_and_other_settings_are_refused(start, tmp_path, monkeypatch):
    final, _ = start
    job = TrainJob(_config(final, tmp_path / "run"))
    code = {"commit": "0123456789abcdef", "dirty": False}
    monkeypatch.setattr(runner, "git_state", lambda: code)
    first = run_training(job)
    assert not first["cached"] and first["last_step"] == BUDGET.max_steps and first["final"]
    log = (tmp_path / "run" / "log.jsonl").read_text()
    monkeypatch.setattr(runner, "git_state", lambda: {"commit": "fedcba9876543210", "dirty": True})
    second = run_training(job)
    assert second["cached"] and second["final"] == first["final"]
    assert first["code"] == second["code"] == code  # the code that trained it, not the code that reused it
    assert (tmp_path / "run" / "log.jsonl").read_text() == log  # nothing ran again
    with pytest.raises(UserError, match=r"other settings \(config\.seed: 0 -> 1\); delete it"):  # names what differs
        run_training(TrainJob(_config(final, tmp_path / "run", seed=1)))
    assert (tmp_path / "run" / "summary.json").is_file()  # refused, not overwritten
    assert run_training(TrainJob(_config(final, tmp_path / "run", seed=1)), force=True)["cached"] is False


def test_interrupted_run_resumes_to_the_same_log(start, tmp_path):
    from stabledrl_bench.training.trainer import RLTrainer

    final, _ = start
    whole = run_training(TrainJob(_config(final, tmp_path / "whole")))
    job = TrainJob(_config(final, tmp_path / "cut"))
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "job.json").write_text(json.dumps({"key": job.key()}))
    RLTrainer(job.config).train(stop_after=2)  # as if pre-empted after the first rollout phase
    resumed = run_training(job)
    assert resumed["last_step"] == whole["last_step"]
    steps = [(r["step"], r["reward_mean"], r["loss"]) for r in read_log(tmp_path / "cut" / "log.jsonl")]
    assert steps == [(r["step"], r["reward_mean"], r["loss"]) for r in read_log(tmp_path / "whole" / "log.jsonl")]


def test_frozen_control_keeps_the_start_and_shares_every_rollout(start, tmp_path):
    """Learning rate 0: the parameters never move, so every rollout is the start model's on the run's prompts and
    random numbers; the first rollout (before any update) equals the trained run's, later ones need not."""
    final, _ = start
    run_cfg = _config(final, tmp_path / "run", optim=OptimConfig(learning_rate=3e-2, lr_scheduler_type="constant"))
    control = control_config(run_cfg, tmp_path / "control")
    assert control.optim.learning_rate == 0.0 and control.seed == run_cfg.seed and control.budget == run_cfg.budget
    run, frozen = run_jobs([TrainJob(run_cfg), TrainJob(control)], workers=1, desc="test")
    rewards = {
        name: [r["reward_mean"] for r in read_log(tmp_path / name / "log.jsonl") if r["phase_iteration"] == 0]
        for name in ("run", "control")
    }
    assert rewards["run"][0] == rewards["control"][0]
    from stabledrl_bench.core.models import load_diffusion_lm

    before, after = load_diffusion_lm(final).model.state_dict(), load_diffusion_lm(frozen["final"]).model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    moved = load_diffusion_lm(run["final"]).model.state_dict()
    assert any(not torch.equal(before[k], moved[k]) for k in before)


def test_sampled_rollouts_are_the_control_runs_rollouts(start, tmp_path):
    """One rollout path: rollouts taken without training are exactly those of the frozen control."""
    final, _ = start
    control = control_config(_config(final, tmp_path / "control"), tmp_path / "control")
    run_training(TrainJob(control))
    logged = [r["reward_mean"] for r in read_log(tmp_path / "control" / "log.jsonl") if r["phase_iteration"] == 0]
    _, batches = sample_rollouts(control_config(_config(final, tmp_path / "x"), tmp_path / "x"), len(logged))
    assert [pytest.approx(float(b.rewards.mean())) for b in batches] == logged


def test_interrupted_warm_start_resumes_to_the_same_weights(start, tmp_path, monkeypatch):
    """SFT checkpoints every ``save_every`` steps; a build killed after one resumes there (not at step 0) and ends
    with exactly the weights of the uninterrupted build."""
    from safetensors.torch import load_file

    from stabledrl_bench.training import sft as sft_module

    spec = dataclasses.replace(
        small_warm_start(steps=5), sft=dataclasses.replace(small_warm_start(steps=5).sft, save_every=2)
    )
    whole, _ = ensure_warm_start(spec, tmp_path / "whole")
    calls, original = [], sft_module.sft_loss

    def crash_at_step_four(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt  # killed after the checkpoint of step 2
        return original(*args, **kwargs)

    monkeypatch.setattr(sft_module, "sft_loss", crash_at_step_four)
    with pytest.raises(KeyboardInterrupt):
        ensure_warm_start(spec, tmp_path / "cut")
    monkeypatch.setattr(sft_module, "sft_loss", original)
    losses = []
    monkeypatch.setattr(sft_module, "sft_loss", lambda *a, **k: losses.append(1) or original(*a, **k))
    resumed, info = ensure_warm_start(spec, tmp_path / "cut")
    assert len(losses) == 3 and info["built_now"]  # steps 3..5 only
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in read_log(tmp_path / "cut" / "log.jsonl")] == [1, 2, 3, 4, 5]
    assert spec.hash() == small_warm_start(steps=5).hash()  # how often it saves is not what it builds


def test_sft_refuses_checkpoints_of_other_settings(tmp_path):
    from stabledrl_bench.training.sft import run_sft

    cfg = dataclasses.replace(small_warm_start(steps=3).sft, save_every=2, model="tiny", output_dir=str(tmp_path))
    run_sft(cfg)
    with pytest.raises(UserError, match="other settings"):
        run_sft(dataclasses.replace(cfg, seed=1))
