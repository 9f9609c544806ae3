"""Spike probability vs policy drift: the paper's self-reinforcing loop, measured without a training loop.

The loop (docs/published-numbers.md §5.2-5.4): a gradient spike moves the policy away from the rollout policy; the
larger the drift, the wider the spread of the estimated ratios at the next step; with a conditional clip a wide spread
lets more outliers through (rho A for A < 0 is never clipped), so spikes become more likely. This experiment
measures the middle link directly, for each update rule, on the real stress model and the real estimators and
losses:

1. the warm-start model is the rollout policy theta_0; rollout batches are sampled from it and rewarded by the
   trainer's own sampler (:func:`~stabledrl_bench.experiments.runner.sample_rollouts`: the frozen control's rollouts);
2. a drifted policy theta = theta_0 + sigma * rms(W) * N(0, 1) per parameter tensor W, for each drift level sigma;
3. for every variant (:mod:`.update_norms`, which measures 2 and 3), its loss and the norm of its gradient;
4. a *spike* is an update norm above ``k`` x the median norm of the same variant at the smallest drift level in
   the ``normal`` condition (k = ``--spike-k``); the spike probability per level is the fraction of repeats.

The x axis is the measured policy drift: mean |E_theta - E_theta0| per completion, StableDRL's per-token ELBO on
the same masks (so estimator noise is excluded).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabledrl_bench.errors import UserError, comma_list, positive_int
from stabledrl_bench.experiments.stress.common import (
    CONDITIONS,
    Definitions,
    band,
    colors,
    figure,
    runtime,
    save_figure,
    stability_dir,
    write_record,
)
from stabledrl_bench.experiments.stress.observations import drift_claims
from stabledrl_bench.experiments.stress.options import (
    EXPERIMENTS,
    Experiment,
    ModelOptions,
    NoiseOptions,
    StressOptions,
    check_positive,
    option,
    recorded_settings,
)
from stabledrl_bench.experiments.stress.settings import TrainSettings, on_preset, stress_budget, warm_start
from stabledrl_bench.experiments.stress.tables import drift_block
from stabledrl_bench.experiments.stress.update_norms import CLIPPING, VARIANTS, measure_update_norms


def start_noise(records_by_seed: dict[int, list[dict[str, Any]]], variants: Sequence[str]) -> dict[str, Any]:
    """Per StableDRL-family variant: :func:`log_weight_noise` at the smallest drift level (normally 0, the start),
    mean and min/max over seeds and repeats."""
    out = {}
    for v in variants:
        at_start = [
            x["variants"][v]["normal"]["noise"]
            for records in records_by_seed.values()
            for x in records
            if x["level"] == min(r["level"] for r in records) and "noise" in x["variants"][v].get("normal", {})
        ]
        if at_start:
            out[v] = {key: band([n[key] for n in at_start]) for key in at_start[0]}
    return out


def summarize(
    records_by_seed: dict[int, list[dict[str, Any]]],
    variants: Sequence[str],
    levels: Sequence[float],
    conditions: Sequence[str],
    spike_k: float,
) -> list[dict[str, Any]]:
    """Per variant x condition x level: spike probability (per seed, then mean and min/max over seeds), median and
    max update norm relative to the reference, measured drift. A non-finite norm counts as a spike."""
    reference_condition = "normal" if "normal" in conditions else conditions[0]
    low = min(levels)
    rows = []
    for v in variants:
        reference = {}
        for s, records in records_by_seed.items():
            norms = [
                x["variants"][v][reference_condition]["norm"]
                for x in records
                if x["level"] == low and x["variants"][v][reference_condition]["norm"] is not None
            ]
            reference[s] = statistics.median(norms) if norms else math.nan
        for condition in conditions:
            for level in levels:
                per_seed, rel_median, rel_max, drifts, ratio_max = [], [], [], [], []
                for s, records in records_by_seed.items():
                    at = [x for x in records if x["level"] == level]
                    norms = [x["variants"][v][condition]["norm"] for x in at]
                    ref = reference[s]
                    if ref > 0:  # a zero reference (e.g. every advantage 0) leaves spikes undefined for the seed
                        relative = [math.inf if n is None else n / ref for n in norms]
                        per_seed.append(sum(rel > spike_k for rel in relative) / len(relative))
                        rel_median.append(statistics.median(relative))
                        rel_max.append(max(relative))
                    drifts.extend(x["policy_drift"] for x in at)
                    ratio_max.extend(
                        x["variants"][v][condition]["ratio_max"]
                        for x in at
                        if x["variants"][v][condition]["ratio_max"] is not None
                    )
                rows.append(
                    {
                        "variant": v,
                        "clipping": CLIPPING[v][0],
                        "normalisation": CLIPPING[v][1],
                        "condition": condition,
                        "level": level,
                        "policy_drift": statistics.fmean(drifts),
                        "spike_probability": band(per_seed),
                        "relative_norm_median": band(rel_median),
                        "relative_norm_max": max(rel_max) if rel_max else None,
                        "ratio_max_median": statistics.median(ratio_max) if ratio_max else None,
                        "reference_norm": band(list(reference.values())),
                    }
                )
    return rows


def plot(rows: list[dict[str, Any]], variants: Sequence[str], conditions: Sequence[str], results_dir, k: float) -> str:
    """``drift_spikes.png``: spike probability vs measured policy drift, one panel per condition, seed bands."""
    fig, axes = figure(len(conditions))
    for ax, condition in zip(axes, conditions, strict=True):
        for color, v in zip(colors(len(variants)), variants, strict=True):
            pts = sorted(
                (
                    (r["policy_drift"], r["spike_probability"])
                    for r in rows
                    if r["variant"] == v and r["condition"] == condition and r["spike_probability"]["mean"] is not None
                ),
                key=lambda p: p[0],
            )
            xs = [p[0] for p in pts]
            ax.plot(xs, [p[1]["mean"] for p in pts], marker="o", ms=3, color=color, lw=1.3, label=v)
            ax.fill_between(xs, [p[1]["min"] for p in pts], [p[1]["max"] for p in pts], color=color, alpha=0.18)
        ax.set_title(condition, fontsize=9)
        ax.set_xlabel("policy drift: mean |E_theta - E_theta0| (per-token ELBO, same masks)", fontsize=8)
        ax.set_ylabel(f"P(update norm > {k:g} x reference)", fontsize=8)
        ax.set_ylim(-0.03, 1.03)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
    return save_figure(
        fig,
        stability_dir(results_dir) / "drift_spikes.png",
        "Spike probability vs drift from the rollout policy (mean, min-max over seeds)",
    )


# ----------------------------------------------------------------------------------------------- command
@dataclass(frozen=True)
class DriftOptions:
    """``stress drift``: which variants, conditions and drift levels, how many repeats, rollouts and seeds, the
    model and noise, and the spike threshold."""

    variants: str = option(",".join(VARIANTS), f"subset of {', '.join(VARIANTS)}")
    conditions: str = option(",".join(CONDITIONS), f"subset of {', '.join(CONDITIONS)}")
    levels: str = option("0,0.02,0.05,0.1,0.2,0.3", "relative parameter-noise levels sigma")
    repeats: int = option(16, "drift directions and mask draws per level and seed", parse=positive_int)
    rollouts: int = option(4, "rollout batches per seed (cycled over repeats)", parse=positive_int)
    seeds: str = option("0,1,2", "comma-separated seeds (rollouts, directions, masks)")
    model: ModelOptions = field(default=ModelOptions())
    noise: NoiseOptions = field(default=NoiseOptions())
    spike_k: float = option(Definitions.spike_k, "spike: norm > k x reference median")


def _rederive(record: Mapping[str, Any]) -> dict[str, Any]:
    """The summary and start noise recomputed from the stored per-seed measurements (:func:`summarize`)."""
    records_by_seed = {int(seed): records for seed, records in record["records"].items()}
    variants = list(record["variants"])
    conditions = comma_list(record["settings"]["conditions"], "conditions", choices=CONDITIONS, what="condition")
    return {
        "summary": summarize(records_by_seed, variants, record["levels"], conditions, record["definitions"]["spike_k"]),
        "start_noise": start_noise(records_by_seed, variants),
    }


def _run_drift(stress: StressOptions, options: DriftOptions) -> Path:
    start = (time.perf_counter(), time.process_time())
    variants = comma_list(options.variants, "--variants", choices=VARIANTS, what="variant")
    conditions = comma_list(options.conditions, "--conditions", choices=CONDITIONS, what="condition")
    levels = sorted(comma_list(options.levels, "--levels", kind=float, what="level"))
    if levels[0] < 0:
        raise UserError("--levels must be >= 0")
    seeds = comma_list(options.seeds, "--seeds", kind=int, what="seed")
    check_positive(repeats=options.repeats, rollouts=options.rollouts, spike_k=options.spike_k)
    noise = options.noise.noise()
    path, info, model = warm_start(options.model, stress.runs)
    budget = stress_budget(options.model, 2)  # one rollout phase: the rollout, then the off-policy inner step mu = 2
    train = TrainSettings(warm_start=str(path), budget=budget, learning_rate=0.0, max_grad_norm=1.0, noise=noise)
    if options.model.preset is not None:
        train = on_preset(train, options.model.preset, options.model.task, budget.max_steps)
        budget = train.budget
    from stabledrl_bench.experiments.runner import control_config, sample_rollouts  # the training stack: on call

    records_by_seed = {}
    for seed in seeds:
        control = control_config(train.config("stabledrl", {}, seed), Path(stress.runs) / "drift")
        dlm, rollouts = sample_rollouts(control, options.rollouts)
        records_by_seed[seed] = measure_update_norms(
            dlm,
            rollouts,
            variants,
            levels,
            options.repeats,
            conditions,
            noise,
            seed=seed,
            block_length=budget.block_length,
        )
    summary = summarize(records_by_seed, variants, levels, conditions, options.spike_k)
    figure_name = plot(summary, variants, conditions, Path(stress.results), options.spike_k)
    payload = {
        "title": "Spike probability vs drift",
        "settings": recorded_settings("drift", options),
        "seeds": seeds,
        "levels": levels,
        "variants": {v: {"baseline": VARIANTS[v][0], "options": VARIANTS[v][1]} for v in variants},
        "noise": {**noise.__dict__, "text": noise.describe()},
        "definitions": {
            "spike_k": options.spike_k,
            "text": {
                "spike": f"update norm > {options.spike_k:g} x the variant's median norm at the smallest drift level "
                "(normal condition), per seed; non-finite norms count as spikes",
                "drift": "mean |E_theta - E_theta0| per completion (StableDRL's per-token ELBO, same masks)",
                "policy": "theta = theta0 + sigma * rms(W) * N(0, 1) per parameter tensor W",
            },
        },
        "warm_start": info,
        "model": model,
        "budget": budget.to_dict(),
        "budget_hash": budget.hash(),
        "records": records_by_seed,
        "summary": summary,
        "start_noise": start_noise(records_by_seed, variants),
        "plots": {"spikes": figure_name},
        **runtime(start, 1, info),
    }
    return write_record(stress.results, "drift", payload)


EXPERIMENTS.register(
    "drift",
    Experiment(
        "drift",
        "spike probability of each update rule vs drift from the rollout policy",
        DriftOptions,
        _run_drift,
        report=drift_block,
        observations=drift_claims,
        rederive=_rederive,
    ),
)
