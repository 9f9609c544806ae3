"""Running a sweep of training runs and reading it back: each :class:`RunSpec` (a labelled method under one
condition and seed) becomes a job of the experiment runner (:mod:`..runner`), every seed gets its frozen control,
and each finished run is analysed (spikes, collapse, reward against the control), aggregated over seeds and plotted.

A run is identified by its runner key (trainer config, effective baseline config, noise hook); its folder
``<runs>/train/<baseline>-<condition>-s<seed>-<key>`` holds the trainer's log and the runner's ``summary.json``. A
finished run is reused by every later command that needs the same configuration (e.g. StableDRL with C = 5 is shared
by ``exploding`` and ``clip``); an interrupted one resumes. Runs are independent, so they execute in ``--jobs`` worker
processes with one intra-op thread each: for a 0.1 M-parameter model, process parallelism is what uses two cores
well. Every seed's frozen control (``<runs>/control/s<seed>-<key>``) is the warm start trained with learning rate
0, which draws the same prompts with the same random numbers as every run of that seed, so that a reward change is
not confused with easier or harder prompts later in the run.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stabledrl_bench.experiments.stress.common import (
    Definitions,
    Series,
    band,
    collapse_analysis,
    colors,
    figure,
    finite,
    running_mean,
    save_figure,
    seed_band,
    spike_steps,
    stability_dir,
)
from stabledrl_bench.experiments.stress.settings import TrainSettings
from stabledrl_bench.reporting.provenance import code_counts
from stabledrl_bench.reporting.runlevel import two_level_bootstrap
from stabledrl_bench.training.runlog import read_log

if TYPE_CHECKING:  # the runner (the training stack) is imported where jobs are made: see settings.py
    from stabledrl_bench.experiments.runner import TrainJob

CURVE_KEYS = ("ratio_max", "drift", "clip_ratio", "weight_max", "loss")


@dataclass(frozen=True)
class RunSpec:
    """One training run: a labelled method under one condition and seed.

    ``options`` are the baseline's config fields plus, optionally, the trainer's ``anchor_beta`` (the anchor every
    method can be given alike, ``TrainConfig.anchor_beta``): a method table names a run in one place.
    """

    label: str
    baseline: str
    options: tuple[tuple[str, Any], ...]
    condition: str
    seed: int


def split_options(options: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> tuple[dict[str, Any], float]:
    """A method table's options (a mapping, or a run spec's pairs) as ``(baseline options, the trainer's
    anchor_beta)``."""
    rest = dict(options)
    return rest, float(rest.pop("anchor_beta", 0.0))


def _in_folder(job: TrainJob, parent: Path, name: str) -> TrainJob:
    """``job`` writing to ``parent/<name>-<first 8 digits of its key>`` (the key ignores the folder)."""
    folder = parent / f"{name}-{job.key()[:8]}"
    return dataclasses.replace(job, config=dataclasses.replace(job.config, output_dir=str(folder)))


def train_job(spec: RunSpec, settings: TrainSettings, runs_dir: Path) -> TrainJob:
    """The runner job of ``spec``; the exploding condition is the trainer hook :class:`NoiseInjection`."""
    from stabledrl_bench.experiments.runner import TrainJob

    hook = None
    if spec.condition == "exploding":
        hook = settings.noise.injection(spec.baseline, settings.budget.max_completion_length)
    options, anchor_beta = split_options(spec.options)
    job = TrainJob(settings.config(spec.baseline, options, spec.seed, anchor_beta=anchor_beta), hook)
    return _in_folder(job, runs_dir / "train", f"{spec.baseline}-{spec.condition}-s{spec.seed}")


def control_job(seed: int, settings: TrainSettings, runs_dir: Path) -> TrainJob:
    """The frozen control of a seed (:func:`~stabledrl_bench.experiments.runner.control_config`)."""
    from stabledrl_bench.experiments.runner import CONTROL_BASELINE, TrainJob, control_config

    job = TrainJob(control_config(settings.config(CONTROL_BASELINE, {}, seed), ""))
    return _in_folder(job, runs_dir / "control", f"s{seed}")


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


def run_curves(folder: str | Path) -> dict[str, list]:
    """The per-step curves a record stores of the run in ``folder``, read from its log."""
    return _curves(read_log(Path(folder) / "log.jsonl"))


# ------------------------------------------------------------------------------------------------ analysis
def analyze(summary: dict[str, Any], frozen: dict[str, Any], d: Definitions, planned_steps: int) -> dict[str, Any]:
    """Spike steps, collapse and reward statistics of one run (definitions in :class:`Definitions`); collapse and
    the final reward are judged against the frozen warm start's reward on the same rollout steps (same prompts)."""
    c = summary["curves"]
    spikes = spike_steps(c["step"], c["grad_norm"], d)
    frozen_at = dict(zip(frozen["reward_step"], frozen["reward_mean"], strict=True))
    collapse = collapse_analysis(
        c["reward_step"],
        c["reward_mean"],
        frozen_at,
        last_step=summary["last_step"],
        planned_steps=planned_steps,
        diverged_at=summary["diverged_at"],
        d=d,
    )
    rewarded = [(step, r) for step, r in zip(c["reward_step"], c["reward_mean"], strict=True) if finite(r)]
    rewards = [r for _, r in rewarded]
    norms = [g for g in c["grad_norm"] if finite(g)]
    last_steps = c["reward_step"][-d.reward_window :]
    frozen_final = band([frozen_at[step] for step in last_steps if step in frozen_at])["mean"]
    final = band(rewards[-d.reward_window :])["mean"]
    final_changes = [r - frozen_at[step] for step, r in rewarded[-d.reward_window :] if finite(frozen_at.get(step))]
    return {
        "spike_steps": spikes,
        "spike_count": len(spikes),
        "spike_rate": len(spikes) / summary["last_step"] if summary["last_step"] else None,
        "nonfinite_steps": sum(not finite(g) for g in c["grad_norm"]),
        **collapse,
        "initial_reward": band(rewards[: d.initial_rollouts])["mean"],
        "final_reward": final,
        "frozen_final_reward": frozen_final,
        "final_vs_frozen": None if final is None or frozen_final is None else final - frozen_final,
        "final_changes": final_changes,
        "mean_reward": band(rewards)["mean"],
        "grad_norm_median": sorted(norms)[len(norms) // 2] if norms else None,
        "grad_norm_max": max(norms) if norms else None,
    }


def change_over_runs(runs: Sequence[Sequence[float]]) -> dict[str, Any] | None:
    """The last rollouts' change from the frozen control over runs: the mean over runs of each run's mean of its
    paired per-rollout differences, with the two-level 95% interval (runs resampled, then their last rollouts;
    :func:`~stabledrl_bench.reporting.runlevel.two_level_bootstrap`) and the verdict it supports: ``gained`` or
    ``lost`` where the interval excludes 0, else ``not resolved`` (always with one run). None without a run that
    has one. The seeds' [min, max] band beside it says how far runs spread, not how sure the mean is."""
    measured = [[list(changes)] for changes in runs if changes]
    if not measured:
        return None
    interval = two_level_bootstrap(measured)
    return {
        "mean": interval.mean,
        "low": interval.low,
        "high": interval.high,
        "runs": interval.runs,
        "verdict": interval.verdict("gained", "lost"),
    }


def aggregate(rows: list[dict[str, Any]], labels: Sequence[str], conditions: Sequence[str]) -> list[dict[str, Any]]:
    """Per label x condition: how many seeds collapsed and when, spike counts, reward bands, and the change from the
    frozen control over runs (:func:`change_over_runs`), the one a stability verdict reads."""
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
                    "transient_collapses": sum(r["transient_collapses"] for r in group),
                    "zero_reward_steps": band([r["zero_reward_steps"] for r in group]),
                    "above_frozen": sum(finite(r["final_vs_frozen"]) and r["final_vs_frozen"] > 0 for r in group),
                    "spikes": band([r["spike_count"] for r in group]),
                    "spike_rate": band([r["spike_rate"] for r in group]),
                    "nonfinite_steps": band([r["nonfinite_steps"] for r in group]),
                    "initial_reward": band([r["initial_reward"] for r in group]),
                    "final_reward": band([r["final_reward"] for r in group]),
                    "final_vs_frozen": band([r["final_vs_frozen"] for r in group]),
                    "final_vs_frozen_runs": change_over_runs([r["final_changes"] for r in group]),
                    "grad_norm_median": band([r["grad_norm_median"] for r in group]),
                    "grad_norm_max": band([r["grad_norm_max"] for r in group]),
                    "shared_with_normal": any(r.get("shared_with_normal") for r in group),
                }
            )
    return table


def reread(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A stored run row or frozen control with its curves read again from its run folder's log where that folder is
    on this machine (the run cache), as stored otherwise: ``verify`` then also compares the stored curves with the
    runs they name."""
    if not (Path(entry["run_dir"]) / "log.jsonl").is_file():
        return dict(entry)
    curves = run_curves(entry["run_dir"])
    if "curves" in entry:
        return {**entry, "curves": curves}
    return {**entry, "reward_step": curves["reward_step"], "reward_mean": curves["reward_mean"]}


def reanalyse(
    record: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], frozen: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """``rows`` of ``record`` and their seeds' frozen controls (``frozen``, keyed by seed as stored), each
    :func:`reread`, with the rows' analysis recomputed under the record's definitions and budget (:func:`analyze`)."""
    d = Definitions(**{key: value for key, value in record["definitions"].items() if key != "text"})
    controls = {seed: reread(control) for seed, control in frozen.items()}
    runs = []
    for row in rows:
        run = reread(row)
        runs.append({**run, **analyze(run, controls[str(run["seed"])], d, record["budget"]["max_steps"])})
    return runs, controls


def rederive(record: Mapping[str, Any]) -> dict[str, Any]:
    """A training record's per-run analysis and its summary recomputed from its runs' curves and frozen controls
    (:func:`reanalyse`, :func:`aggregate`); for ``verify``."""
    runs, frozen = reanalyse(record, record["runs"], record["frozen"])
    labels = list(dict.fromkeys(r["label"] for r in runs))
    conditions = list(dict.fromkeys(r["condition"] for r in runs))
    return {"runs": runs, "frozen": frozen, "summary": aggregate(runs, labels, conditions)}


def run_sweep(
    specs: list[RunSpec],
    settings: TrainSettings,
    runs_dir: Path,
    definitions: Definitions,
    workers: int,
    desc: str,
    shared_normal: Callable[[RunSpec], bool],
) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]], dict[str, Any]]:
    """Train (or reuse) every run and the frozen control of every seed through the experiment runner; returns one
    analysed row per spec, the control's rollout rewards per seed and the cost (worker CPU seconds of every distinct
    job, how many ran now and how many were reused).

    ``shared_normal(spec)``: the spec's ``exploding`` row is its ``normal`` run (a method without ratios).
    """
    from stabledrl_bench.experiments.runner import run_jobs

    resolved = [dataclasses.replace(s, condition="normal") if shared_normal(s) else s for s in specs]
    jobs = [train_job(s, settings, runs_dir) for s in resolved]
    seeds = sorted({s.seed for s in specs})
    controls = [control_job(seed, settings, runs_dir) for seed in seeds]
    summaries = run_jobs([*controls, *jobs], workers, desc)
    unique = {s["key"]: s for s in summaries}
    cost = {
        "jobs": len(unique),
        "jobs_reused": sum(bool(s["cached"]) for s in unique.values()),
        "worker_cpu_seconds": sum(s.get("cpu_seconds") or 0.0 for s in unique.values()),
        "training_code": code_counts(s.get("code") for s in unique.values()),
    }
    frozen = {}
    for seed, summary in zip(seeds, summaries, strict=False):
        curves = run_curves(summary["folder"])
        frozen[seed] = {
            "key": summary["key"],
            "run_dir": summary["folder"],
            "reward_step": curves["reward_step"],
            "reward_mean": curves["reward_mean"],
            "cpu_seconds": summary["cpu_seconds"],
        }
    rows = []
    for spec, resolved_spec, summary in zip(specs, resolved, summaries[len(controls) :], strict=True):
        run = {**summary, "curves": run_curves(summary["folder"])}
        rows.append(
            {
                **dataclasses.asdict(spec),
                "options": dict(spec.options),
                "shared_with_normal": resolved_spec.condition != spec.condition,
                "run_dir": summary["folder"],
                "seconds": summary["seconds"],
                "cpu_seconds": summary.get("cpu_seconds"),
                "last_step": summary["last_step"],
                "diverged_at": summary["diverged_at"],
                **analyze(run, frozen[spec.seed], definitions, settings.budget.max_steps),
                "curves": run["curves"],
            }
        )
    return rows, frozen, cost


def add_costs(total: Mapping[str, Any], spent: Mapping[str, Any]) -> dict[str, Any]:
    """Two :func:`run_sweep` costs added up (run counts, CPU seconds, runs per training code)."""
    codes = Counter(total.get("training_code") or {}) + Counter(spent.get("training_code") or {})
    return {
        **{key: total.get(key, 0) + spent[key] for key in ("jobs", "jobs_reused", "worker_cpu_seconds")},
        "training_code": dict(codes.most_common()),
    }


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
            for color, label in zip(colors(len(labels)), labels, strict=True):
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
