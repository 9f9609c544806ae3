"""Training sweeps of the stress test: ``exploding`` (methods x {normal, exploding} x seeds) and ``clip`` (StableDRL's
clip threshold C x conditions x seeds), every run a real :class:`~stabledrl_bench.training.trainer.RLTrainer` run
from the same warm start under the same budget, learning rate and seeds.

A run is identified by its full effective configuration (baseline config, budget, optimiser, noise, warm start, seed);
its folder ``<runs>/train/<baseline>-<condition>-s<seed>-<hash>`` holds the trainer's log and a ``summary.json``.
A finished run is reused by every later command that needs the same configuration (e.g. StableDRL with C = 5 is
shared by both experiments); an unfinished one is restarted from scratch. Runs are independent, so they execute in
``--jobs`` worker processes with one intra-op thread each: for a 0.1 M-parameter model, process parallelism is what
uses two cores well.

Methods without an importance ratio (SPG) are unaffected by the noise, so their ``exploding`` row is the ``normal``
run itself (marked ``shared_with_normal``), not a second identical run. Every seed also gets a *frozen* reference: the
warm start, never updated, rolled out on the same prompt sequence (the trainer's ``PromptStream`` is seeded by the
run seed alone), so that a reward change is not confused with easier or harder prompts later in the run.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from stabledrl_bench.config import to_dict
from stabledrl_bench.core.baseline import build_baseline
from stabledrl_bench.experiments.stress.common import (
    COLORS,
    CONDITIONS,
    Definitions,
    ExplodingNoise,
    Series,
    band,
    collapse_step,
    figure,
    finite,
    running_mean,
    save_figure,
    seed_band,
    short_hash,
    spike_steps,
    stability_dir,
)
from stabledrl_bench.reporting.results import atomic_write_text
from stabledrl_bench.training.budget import Budget
from stabledrl_bench.training.runlog import read_log

# Display name -> (registered baseline, options): the methods of the stress test (paper Fig. 5 plus the two ablations).
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {}),
    "espo": ("espo", {}),
    "spg": ("spg", {}),
    "stabledrl": ("stabledrl", {}),
    "clip_only": ("stabledrl_clip_only", {}),
    "selfnorm_only": ("stabledrl_selfnorm_only", {}),
}
CURVE_KEYS = ("ratio_max", "drift", "clip_ratio", "weight_max", "loss")


@dataclass(frozen=True)
class TrainSettings:
    """What every run of a sweep shares: warm start, budget, optimiser, noise."""

    warm_start: str
    warm_start_id: str  # spec hash (built) or path (user-given): part of every run's identity
    budget: Budget
    learning_rate: float
    max_grad_norm: float
    noise: ExplodingNoise
    task: str = "sudoku"
    protocol: str = "tiny"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "budget": self.budget.to_dict(), "noise": dataclasses.asdict(self.noise)}


@dataclass(frozen=True)
class RunSpec:
    """One training run: a labelled method under one condition and seed."""

    label: str
    baseline: str
    options: tuple[tuple[str, Any], ...]
    condition: str
    seed: int


def run_job(spec: RunSpec, settings: TrainSettings, runs_dir: Path) -> dict[str, Any]:
    """The picklable description a worker needs (identity hash over the *effective* baseline config)."""
    config = to_dict(build_baseline(spec.baseline, **dict(spec.options)).config)
    noise = None
    if spec.condition == "exploding":
        noise = dataclasses.asdict(settings.noise.injection(spec.baseline, settings.budget.max_completion_length))
    identity = {
        "baseline": spec.baseline,
        "baseline_config": config,
        "condition": spec.condition,
        "noise": noise,
        "seed": spec.seed,
        "settings": {k: v for k, v in settings.to_dict().items() if k not in ("noise", "warm_start")},
    }
    key = short_hash(identity)
    folder = runs_dir / "train" / f"{spec.baseline}-{spec.condition}-s{spec.seed}-{key[:8]}"
    return {
        "kind": "train",
        "key": key,
        "folder": str(folder),
        "spec": dataclasses.asdict(spec),
        "noise": noise,
        "warm_start": settings.warm_start,
        "budget": settings.budget.to_dict(),
        "learning_rate": settings.learning_rate,
        "max_grad_norm": settings.max_grad_norm,
        "task": settings.task,
        "protocol": settings.protocol,
    }


def frozen_job(seed: int, settings: TrainSettings, runs_dir: Path) -> dict[str, Any]:
    """The reference of a seed: the warm start, never updated, rolled out on the same prompt sequence."""
    identity = {"frozen": seed, "settings": {k: v for k, v in settings.to_dict().items() if k != "noise"}}
    key = short_hash(identity)
    return {
        "kind": "frozen",
        "key": key,
        "path": str(runs_dir / "frozen" / f"s{seed}-{key[:8]}.json"),
        "seed": seed,
        "warm_start": settings.warm_start,
        "budget": settings.budget.to_dict(),
        "task": settings.task,
        "protocol": settings.protocol,
    }


def frozen_run(job: dict[str, Any]) -> dict[str, Any]:
    """Rewards of the frozen warm start at every rollout of a run with this seed (same prompts as the trainer's
    ``PromptStream``, independent samples), so that reward changes are not confused with prompt difficulty."""
    import torch

    from stabledrl_bench.core.models.backends import load_diffusion_lm
    from stabledrl_bench.experiments.stress.drift import collect_rollouts

    torch.set_num_threads(1)
    path = Path(job["path"])
    if path.is_file():
        cached = json.loads(path.read_text())
        if cached.get("key") == job["key"]:
            return {**cached, "cached": True}
    budget = Budget(**job["budget"])
    cpu_start = time.process_time()
    rollouts = collect_rollouts(
        load_diffusion_lm(job["warm_start"]),
        budget,
        task=job["task"],
        protocol=job["protocol"],
        seed=job["seed"],
        count=budget.rollout_phases,
    )
    result = {
        "key": job["key"],
        "reward_step": [i * budget.num_iterations + 1 for i in range(len(rollouts))],
        "reward_mean": [float(r.rewards.mean()) for r in rollouts],
        "cpu_seconds": time.process_time() - cpu_start,
    }
    atomic_write_text(path, json.dumps(result))
    return result


def execute(job: dict[str, Any]) -> dict[str, Any]:
    """Worker entry point: a training run or a frozen-policy reference."""
    return train_run(job) if job["kind"] == "train" else frozen_run(job)


def train_run(job: dict[str, Any]) -> dict[str, Any]:
    """Run (or reuse) one training run; returns its raw summary (curves, stop step, wall time)."""
    import torch

    from stabledrl_bench.training.optim import OptimConfig
    from stabledrl_bench.training.trainer import NoiseInjection, RLTrainer, TrainConfig, TrainingDiverged

    torch.set_num_threads(1)
    folder = Path(job["folder"])
    summary_path = folder / "summary.json"
    if summary_path.is_file():
        cached = json.loads(summary_path.read_text())
        if cached.get("key") == job["key"]:
            return {**cached, "cached": True}
    shutil.rmtree(folder, ignore_errors=True)
    spec = job["spec"]
    budget = Budget(**job["budget"])
    cfg = TrainConfig(
        baseline=spec["baseline"],
        task=job["task"],
        model=job["warm_start"],
        protocol=job["protocol"],
        reward_profile="d1",
        train_split="generated",
        budget=budget,
        optim=OptimConfig(
            learning_rate=job["learning_rate"],
            weight_decay=0.0,
            lr_scheduler_type="constant",
            max_grad_norm=job["max_grad_norm"],
        ),
        baseline_options=dict(spec["options"]),
        per_device_prompts=budget.prompts_per_step,
        seed=spec["seed"],
        log_ratio_noise=NoiseInjection(**job["noise"]) if job["noise"] else None,
        output_dir=str(folder),
        progress=False,
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    diverged = False
    try:
        RLTrainer(cfg).train()
    except TrainingDiverged:
        diverged = True
    records = read_log(folder / "log.jsonl")
    summary = {
        "key": job["key"],
        "spec": spec,
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu_start,
        "last_step": records[-1]["step"] if records else 0,
        "diverged_at": records[-1]["step"] if diverged and records else None,
        "curves": _curves(records),
    }
    atomic_write_text(summary_path, json.dumps(summary))
    return summary


def _clean(value: Any) -> float | None:
    """Finite numbers as floats, anything else (NaN, inf, missing) as None (JSON null = not finite)."""
    return float(value) if finite(value) else None


def _curves(records: list[dict[str, Any]]) -> dict[str, list]:
    rollouts = [r for r in records if r.get("phase_iteration") == 0]
    curves = {
        "step": [r["step"] for r in records],
        "grad_norm": [_clean(r.get("grad_norm")) for r in records],
        "skipped": [bool(r.get("skipped")) for r in records],
        "reward_step": [r["step"] for r in rollouts],
        "reward_mean": [_clean(r.get("reward_mean")) for r in rollouts],
    }
    for key in CURVE_KEYS:
        curves[key] = [_clean(r.get(key)) for r in records]
    return curves


def run_all(jobs: Sequence[dict[str, Any]], workers: int, desc: str) -> list[dict[str, Any]]:
    """Every job's result, in job order; ``workers`` > 1 uses spawned worker processes (one thread each)."""
    if workers <= 1 or len(jobs) <= 1:
        return [execute(job) for job in tqdm(jobs, desc=desc, dynamic_ncols=True)]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results: list[dict[str, Any] | None] = [None] * len(jobs)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {pool.submit(execute, job): i for i, job in enumerate(jobs)}
        for future in tqdm(as_completed(futures), total=len(jobs), desc=desc, dynamic_ncols=True):
            results[futures[future]] = future.result()
    return [r for r in results if r is not None]


# ------------------------------------------------------------------------------------------------ analysis
def analyze(summary: dict[str, Any], frozen: dict[str, Any], d: Definitions) -> dict[str, Any]:
    """Spike steps, collapse and reward statistics of one run (definitions in :class:`Definitions`); the final
    reward is also compared with the frozen warm start's reward on the same rollout steps (same prompts)."""
    c = summary["curves"]
    spikes = spike_steps(c["step"], c["grad_norm"], d)
    collapse, kind = collapse_step(c["reward_step"], c["reward_mean"], summary["last_step"], summary["diverged_at"], d)
    rewards = [r for r in c["reward_mean"] if finite(r)]
    norms = [g for g in c["grad_norm"] if finite(g)]
    frozen_at = dict(zip(frozen["reward_step"], frozen["reward_mean"], strict=True))
    last_steps = c["reward_step"][-d.reward_window :]
    frozen_final = band([frozen_at[step] for step in last_steps if step in frozen_at])["mean"]
    final = band(rewards[-d.reward_window :])["mean"]
    return {
        "spike_steps": spikes,
        "spike_count": len(spikes),
        "spike_rate": len(spikes) / summary["last_step"] if summary["last_step"] else None,
        "nonfinite_steps": sum(not finite(g) for g in c["grad_norm"]),
        "collapse_step": collapse,
        "collapse_kind": kind,
        "initial_reward": band(rewards[: d.initial_rollouts])["mean"],
        "final_reward": final,
        "frozen_final_reward": frozen_final,
        "final_vs_frozen": None if final is None or frozen_final is None else final - frozen_final,
        "mean_reward": band(rewards)["mean"],
        "grad_norm_median": sorted(norms)[len(norms) // 2] if norms else None,
        "grad_norm_max": max(norms) if norms else None,
    }


def aggregate(rows: list[dict[str, Any]], labels: Sequence[str], conditions: Sequence[str]) -> list[dict[str, Any]]:
    """Per label x condition: how many seeds collapsed and when, spike counts, reward bands."""
    table = []
    for label in labels:
        for condition in conditions:
            group = [r for r in rows if r["label"] == label and r["condition"] == condition]
            if not group:
                continue
            collapsed = [r["collapse_step"] for r in group if r["collapse_step"] is not None]
            table.append(
                {
                    "label": label,
                    "condition": condition,
                    "seeds": len(group),
                    "collapsed": len(collapsed),
                    "collapse_steps": collapsed,
                    "collapse_kinds": sorted({r["collapse_kind"] for r in group if r["collapse_kind"]}),
                    "spikes": band([r["spike_count"] for r in group]),
                    "spike_rate": band([r["spike_rate"] for r in group]),
                    "nonfinite_steps": band([r["nonfinite_steps"] for r in group]),
                    "initial_reward": band([r["initial_reward"] for r in group]),
                    "final_reward": band([r["final_reward"] for r in group]),
                    "final_vs_frozen": band([r["final_vs_frozen"] for r in group]),
                    "grad_norm_median": band([r["grad_norm_median"] for r in group]),
                    "grad_norm_max": band([r["grad_norm_max"] for r in group]),
                    "shared_with_normal": any(r.get("shared_with_normal") for r in group),
                }
            )
    return table


def sweep(
    specs: list[RunSpec],
    settings: TrainSettings,
    runs_dir: Path,
    definitions: Definitions,
    workers: int,
    desc: str,
    shared_normal: Callable[[RunSpec], bool],
) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]], dict[str, Any]]:
    """Train (or reuse) every run; returns one analysed row per spec, the frozen reference of every seed and the
    cost (worker CPU seconds of every distinct job, how many ran now and how many were reused).

    ``shared_normal(spec)``: the spec's ``exploding`` row is its ``normal`` run (a method without ratios).
    """
    resolved = [dataclasses.replace(s, condition="normal") if shared_normal(s) else s for s in specs]
    jobs = [run_job(s, settings, runs_dir) for s in resolved]
    seeds = sorted({s.seed for s in specs})
    frozen_jobs = {seed: frozen_job(seed, settings, runs_dir) for seed in seeds}
    unique: dict[str, dict[str, Any]] = {job["key"]: job for job in [*frozen_jobs.values(), *jobs]}
    results = dict(zip(unique, run_all(list(unique.values()), workers, desc), strict=True))
    frozen = {seed: results[job["key"]] for seed, job in frozen_jobs.items()}
    cost = {
        "jobs": len(results),
        "jobs_reused": sum(bool(r.get("cached")) for r in results.values()),
        "worker_cpu_seconds": sum(r.get("cpu_seconds") or 0.0 for r in results.values()),
    }
    rows = []
    for spec, resolved_spec, job in zip(specs, resolved, jobs, strict=True):
        summary = results[job["key"]]
        rows.append(
            {
                **dataclasses.asdict(spec),
                "options": dict(spec.options),
                "shared_with_normal": resolved_spec.condition != spec.condition,
                "run_dir": job["folder"],
                "seconds": summary["seconds"],
                "cpu_seconds": summary.get("cpu_seconds"),
                "last_step": summary["last_step"],
                "diverged_at": summary["diverged_at"],
                **analyze(summary, frozen[spec.seed], definitions),
                "curves": summary["curves"],
            }
        )
    return rows, frozen, cost


# --------------------------------------------------------------------------------------------------- plots
def plot_sweep(
    rows: list[dict[str, Any]],
    frozen: dict[int, dict[str, Any]],
    labels: Sequence[str],
    conditions: Sequence[str],
    results_dir: Path,
    experiment: str,
    title: str,
    window: int,
) -> dict[str, str]:
    """``<experiment>_reward.png`` (running mean over ``window`` rollouts, the frozen warm start on the same prompts
    in black) and ``<experiment>_gradnorm.png`` (pre-clip, log scale): one panel per condition, seed bands."""
    out = {}
    for metric, x_key, y_key in (("reward", "reward_step", "reward_mean"), ("gradnorm", "step", "grad_norm")):
        log = metric == "gradnorm"
        fig, axes = figure(len(conditions))
        for ax, condition in zip(axes, conditions, strict=True):
            drawn = False
            for color, label in zip(COLORS, labels, strict=False):
                series = Series(label)
                for r in (r for r in rows if r["label"] == label and r["condition"] == condition):
                    ys = r["curves"][y_key]
                    series.runs.append((r["curves"][x_key], ys if log else running_mean(ys, window)))
                    if r["diverged_at"] is not None:
                        series.stopped.append(r["diverged_at"])
                drawn |= seed_band(ax, series, color, log=log)
            if not log:
                runs = [(f["reward_step"], running_mean(f["reward_mean"], window)) for f in frozen.values()]
                drawn |= seed_band(ax, Series("frozen warm start", runs), "black")
            ax.set_title(condition, fontsize=9)
            ax.set_xlabel("optimizer step", fontsize=8)
            ax.set_ylabel(f"reward, mean of last {window} rollouts" if not log else "pre-clip grad norm", fontsize=8)
            if log and drawn:
                ax.set_yscale("log")
            ax.tick_params(labelsize=7)
            if drawn:
                ax.legend(fontsize=7)
        what = "reward" if not log else "pre-clip gradient norm"
        out[metric] = save_figure(
            fig,
            stability_dir(results_dir) / f"{experiment}_{metric}.png",
            f"{title}: {what} (mean, min-max over seeds; dotted = stopped on non-finite steps)",
        )
    return out


def conditions_arg(text: str) -> list[str]:
    from stabledrl_bench.errors import UserError

    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONDITIONS]
    if unknown or not names:
        raise UserError(f"--conditions: choose from {', '.join(CONDITIONS)}; got {text!r}")
    return names
