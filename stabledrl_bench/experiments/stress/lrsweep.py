"""``lrsweep``: the learning rate of the stability experiments, chosen by a recorded sweep instead of by hand.

A stability verdict means something only at a learning rate where the methods can learn without being pushed off
the start by the step size alone: at too large a rate every method falls below the frozen control and "collapse"
says nothing about the estimators; at too small a rate nothing moves and "stable" says nothing either. So every
method of the long run trains ``--steps`` (default 100) steps at each rate of ``--lrs`` on ``--seeds``, from the
stress warm start under the stress settings, and each run is compared with the frozen control on the same rollouts:

    change(method, lr) = mean over the seeds of each run's mean, over the rollouts of the second half of the run
                         (steps > steps / 2), of (the run's rollout reward - the frozen control's reward on the same
                         prompts),

with a two-level percentile-bootstrap 95% interval over runs: the seeds resampled, then the rollouts within each
drawn seed (:func:`~stabledrl_bench.reporting.runlevel.two_level_bootstrap`), so that the spread between training
runs, not only between one run's rollouts, decides a verdict. A method *falls below* at a rate when the whole
interval is below 0, and *gains* when it is above 0 (with one seed the interval covers that run's rollouts only).
The chosen rate is the largest swept rate at which no method falls below (:func:`choose`); the record says which
methods gain there. ``longrun``, ``exploding`` and ``clip`` read it (``--lr`` overrides).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabledrl_bench.errors import comma_list
from stabledrl_bench.experiments.stress.common import (
    LRSWEEP,
    colors,
    figure,
    runtime,
    save_figure,
    stability_dir,
    write_record,
)
from stabledrl_bench.experiments.stress.observations import lrsweep_observations
from stabledrl_bench.experiments.stress.options import (
    EXPERIMENTS,
    Experiment,
    StressOptions,
    SweepOptions,
    TrainingOptions,
    check_positive,
    option,
    recorded_settings,
)
from stabledrl_bench.experiments.stress.settings import TrainSettings, train_settings, warm_start
from stabledrl_bench.experiments.stress.sweep import RunSpec, add_costs, reanalyse, run_sweep
from stabledrl_bench.experiments.stress.tables import lrsweep_block
from stabledrl_bench.experiments.stress.training import METHODS, effective_options
from stabledrl_bench.reporting.curves import finite
from stabledrl_bench.reporting.runlevel import two_level_bootstrap

LEARNING_RATES = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3)


def second_half_change(run: Mapping[str, Any], frozen: Mapping[str, Any], steps: int) -> list[float]:
    """Reward minus frozen reward on each rollout of the run's second half (steps > ``steps`` / 2)."""
    frozen_at = dict(zip(frozen["reward_step"], frozen["reward_mean"], strict=True))
    curves = run["curves"]
    return [
        reward - frozen_at[step]
        for step, reward in zip(curves["reward_step"], curves["reward_mean"], strict=True)
        if step > steps / 2 and finite(reward) and finite(frozen_at.get(step))
    ]


def summarise(rows: Sequence[Mapping[str, Any]], frozen: Mapping[int, Any], steps: int) -> dict[str, Any]:
    """Per method: the second-half change over runs with its two-level interval, per-seed means, how many runs and
    rollouts it rests on, and falls-below / gains."""

    out = {}
    for label in dict.fromkeys(r["label"] for r in rows):
        runs = [second_half_change(r, frozen[r["seed"]], steps) for r in rows if r["label"] == label]
        per_seed = [sum(diffs) / len(diffs) if diffs else None for diffs in runs]
        measured = [[diffs] for diffs in runs if diffs]  # each run one cell of its rollouts' changes
        if not measured:
            out[label] = {"change": None, "low": None, "high": None, "per_seed": per_seed, "runs": 0, "rollouts": 0}
            continue
        interval = two_level_bootstrap(measured)
        out[label] = {
            "change": interval.mean,
            "low": interval.low,
            "high": interval.high,
            "per_seed": per_seed,
            "runs": interval.runs,
            "rollouts": sum(len(diffs) for diffs in runs),
        }
        out[label].update(flags(out[label]))
    return out


def flags(change: Mapping[str, Any]) -> dict[str, bool]:
    """``falls_below`` / ``gains``: the whole interval below / above 0."""
    return {"falls_below": change["high"] < 0, "gains": change["low"] > 0}


def choose(by_lr: Mapping[float, Mapping[str, Mapping[str, Any]]]) -> tuple[float | None, str]:
    """The largest rate at which no method falls below the frozen control, and why (None when every rate fails)."""
    safe = [lr for lr, methods in by_lr.items() if not any(m.get("falls_below") for m in methods.values())]
    if not safe:
        return None, "every swept rate has a method that falls below the frozen control"
    lr = max(safe)
    gaining = [name for name, m in by_lr[lr].items() if m.get("gains")]
    learns = f"{', '.join(gaining)} gain(s) there" if gaining else "no method gains there"
    return lr, f"largest swept rate at which no method falls below the frozen control; {learns}"


def _rederive(record: Mapping[str, Any]) -> dict[str, Any]:
    """Every run's analysis, each rate's changes with their intervals and flags, and the rate chosen from them,
    recomputed from the runs' curves and the frozen controls of every rate (re-read from the run folders where
    they are on this machine, :func:`~.sweep.reread`). A record written before the controls were stored (no
    ``frozen``) gets its flags and choice recomputed from its stored intervals only."""
    if "frozen" not in record:
        by_lr = {
            float(rate): {m: {**c, **flags(c)} if c["change"] is not None else c for m, c in methods.items()}
            for rate, methods in record["by_lr"].items()
        }
        derived = {}
    else:
        by_lr, runs, controls = {}, [], {}
        for rate, frozen in record["frozen"].items():
            rows, controls[rate] = reanalyse(
                record, [r for r in record["runs"] if f"{r['learning_rate']:g}" == rate], frozen
            )
            by_seed = {int(seed): control for seed, control in controls[rate].items()}
            by_lr[float(rate)] = summarise(rows, by_seed, record["budget"]["max_steps"])
            runs += rows
        derived = {"runs": runs, "frozen": controls}
    lr, why = choose(by_lr)
    by_rate = {f"{rate:g}": methods for rate, methods in by_lr.items()}
    return {**derived, "by_lr": by_rate, "chosen_lr": lr, "choice": why}


def _plot(by_lr: Mapping[float, Mapping[str, Mapping[str, Any]]], results_dir: Path, chosen: float | None) -> str:
    fig, (ax,) = figure(1, width=6.0, height=3.6)
    rates = sorted(by_lr)
    labels = list(dict.fromkeys(label for methods in by_lr.values() for label in methods))
    for color, label in zip(colors(len(labels)), labels, strict=True):
        points = [(lr, by_lr[lr][label]) for lr in rates if by_lr[lr].get(label, {}).get("change") is not None]
        xs = [lr for lr, _ in points]
        ax.plot(xs, [m["change"] for _, m in points], "o-", color=color, lw=1.2, ms=3, label=label)
        ax.fill_between(xs, [m["low"] for _, m in points], [m["high"] for _, m in points], color=color, alpha=0.15)
    ax.axhline(0.0, color="black", lw=0.8)
    if chosen is not None:
        ax.axvline(chosen, color="gray", ls="--", lw=1.0, label=f"chosen {chosen:g}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate", fontsize=8)
    ax.set_ylabel("reward - frozen control, 2nd half", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    return save_figure(fig, stability_dir(results_dir) / f"{LRSWEEP}.png", "Learning-rate sweep (95% intervals)")


@dataclass(frozen=True)
class LrSweepOptions:
    """``stress lrsweep``: which methods at which rates, and the training sweep's options (100 steps, 2 seeds)."""

    methods: str = option(",".join(METHODS), f"subset of {', '.join(METHODS)}")
    lrs: str = option(",".join(f"{lr:g}" for lr in LEARNING_RATES), "learning rates to sweep")
    sweep: SweepOptions = field(default=SweepOptions(training=TrainingOptions(steps=100, seeds="0,1")))


def _run(stress: StressOptions, options: LrSweepOptions) -> Path:
    start = (time.perf_counter(), time.process_time())
    sweep, training = options.sweep, options.sweep.training
    chosen_methods = comma_list(options.methods, "--methods", choices=METHODS, what="method")
    rates = sorted(comma_list(options.lrs, "--lrs", kind=float, what="learning rate"))
    check_positive(**{f"lrs ({lr:g})": lr for lr in rates})
    seeds = comma_list(training.seeds, "--seeds", kind=int, what="seed")
    definitions = sweep.definitions.definitions()
    base = train_settings(stress, sweep, learning_rate=rates[0])
    path, info, model = warm_start(sweep.model, stress.runs)
    base = dataclasses.replace(base, warm_start=str(path))
    by_lr, frozen_by_lr, runs, cost = {}, {}, [], {}
    for lr in rates:
        lr_settings: TrainSettings = dataclasses.replace(base, learning_rate=lr)
        specs = [
            RunSpec(m, METHODS[m][0], tuple(sorted(METHODS[m][1].items())), "normal", seed)
            for m in chosen_methods
            for seed in seeds
        ]
        rows, frozen, spent = run_sweep(
            specs, lr_settings, Path(stress.runs), definitions, training.jobs, f"lr {lr:g}", lambda _: False
        )
        by_lr[lr] = summarise(rows, frozen, lr_settings.budget.max_steps)
        frozen_by_lr[f"{lr:g}"] = frozen
        runs += [{**row, "learning_rate": lr} for row in rows]
        cost = add_costs(cost, spent)
    lr, why = choose(by_lr)
    payload = {
        "title": "Learning-rate sweep",
        "settings": recorded_settings(LRSWEEP, options),
        "seeds": seeds,
        "methods": {
            m: {"baseline": METHODS[m][0], "options": METHODS[m][1], "effective": effective_options(*METHODS[m])}
            for m in chosen_methods
        },
        "warm_start": info,
        "model": model,
        **base.describe(),
        "definitions": {**definitions.to_dict(), "text": definitions.describe()},
        "rule": (
            "change = mean over seeds of each run's second-half mean of reward - frozen control reward; falls below: "
            "its 95% interval over runs (seeds resampled, then rollouts) < 0; gains: > 0; chosen: the largest rate "
            "where none falls below"
        ),
        "by_lr": {f"{rate:g}": methods for rate, methods in by_lr.items()},
        "chosen_lr": lr,
        "choice": why,
        "runs": runs,
        "frozen": frozen_by_lr,
        "plots": {"sweep": _plot(by_lr, Path(stress.results), lr)},
        "jobs": cost,
        **runtime(start, training.jobs, info, cost["worker_cpu_seconds"]),
    }
    return write_record(stress.results, LRSWEEP, payload)


EXPERIMENTS.register(
    LRSWEEP,
    Experiment(
        LRSWEEP,
        "every long-run method at several learning rates: which rate the other tests use",
        LrSweepOptions,
        _run,
        report=lrsweep_block,
        observations=lrsweep_observations,
        rederive=_rederive,
    ),
)
