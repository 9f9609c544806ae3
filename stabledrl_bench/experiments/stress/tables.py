"""The Stability section's block of each experiment: the settings line, the definitions and the markdown table of
its record, and the number formats the verdicts (:mod:`.observations`) share.

Each built-in experiment names its block as its :class:`~.options.Experiment`'s ``report``; :func:`generic_block` is
what a plugin experiment without one gets. Plot links are relative to the leaderboard file, which sits at the
repository root next to ``results/``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from stabledrl_bench.reporting.markdown import MISSING, markdown_rows
from stabledrl_bench.reporting.provenance import hardware_label
from stabledrl_bench.reporting.stats import Interval


# ------------------------------------------------------------------------------------------------ formatting
def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return MISSING
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-3):
        return f"{value:.2g}"
    return f"{value:.{digits}g}"


def fmt_band(b: Mapping[str, Any] | None) -> str:
    if not b or b.get("mean") is None:
        return MISSING
    if b.get("n", 0) <= 1 or b["min"] == b["max"]:
        return fmt(b["mean"])
    return f"{fmt(b['mean'])} [{fmt(b['min'])}, {fmt(b['max'])}]"


def fmt_interval(mean: float, low: float, high: float) -> str:
    """``+0.175 [+0.124, +0.239]``: a change with its interval, as every stability table and verdict writes one."""
    return Interval(mean, low, high).text("+.3f", scale=1.0)


def fmt_change(entry: Mapping[str, Any]) -> str:
    """The last rollouts' change from the frozen control: over runs with its interval and verdict where the record
    has it (``final_vs_frozen_runs``), the seeds' [min, max] band and how many seeds ended above."""
    runs = entry.get("final_vs_frozen_runs")
    seeds = f"{entry['above_frozen']}/{entry['seeds']} above"
    if not runs:  # a record written before the change over runs was stored
        return f"{fmt_band(entry.get('final_vs_frozen'))}; {seeds}"
    return (
        f"{fmt_interval(runs['mean'], runs['low'], runs['high'])} {runs['verdict']} ({runs['runs']} runs); "
        f"seeds {fmt_band(entry.get('final_vs_frozen'))}, {seeds}"
    )


def _image(link_base: str, name: str | None, alt: str) -> str:
    return f"![{alt}]({link_base}/{name})" if name else ""


# ------------------------------------------------------------------------------------------------- blocks
def _setting_line(record: Mapping[str, Any]) -> str:
    budget = record.get("budget") or {}
    parts = []
    if budget:
        steps = (
            "each measurement = one rollout, then the off-policy inner step"
            if record.get("experiment") == "drift"
            else f"mu = {budget['num_iterations']}, {budget['max_steps']} optimizer steps"
        )
        parts.append(
            f"budget `{record.get('budget_hash')}`: {budget['prompts_per_step']} prompts x {budget['num_generations']}"
            f" completions, L = {budget['max_completion_length']}, {budget['diffusion_steps']} denoising steps, {steps}"
        )
    if record.get("optimizer"):
        opt = record["optimizer"]
        source = " from the learning-rate sweep" if record.get("learning_rate_source", "").endswith(".json") else ""
        rate = f"lr {fmt(opt['learning_rate'])}{source}" if "learning_rate" in opt else "lr per column"
        parts.append(
            f"AdamW {rate} ({opt['lr_scheduler_type']} schedule), weight decay "
            f"{fmt(opt['weight_decay'])}, grad clip {fmt(opt['max_grad_norm'])}"
        )
    task = record.get("task") or {}
    if task.get("name"):
        options = ", ".join(f"{k} {v}" for k, v in (task.get("generator_options") or {}).items())
        parts.append(f"task {task['name']}" + (f" ({options})" if options else ""))
    methods = record.get("methods") or {}
    if methods and all("effective" in m for m in methods.values()):  # the sweep of 847549f recorded only options
        knobs = [
            f"{name} beta {fmt(m['effective'].get('beta'))}"
            + (f", num_mc {m['effective']['num_mc']}" if "num_mc" in m["effective"] else "")
            + (f", shared anchor {fmt(m['effective']['anchor_beta'])}" if m["effective"].get("anchor_beta") else "")
            for name, m in methods.items()
        ]
        parts.append("per method: " + "; ".join(knobs))
    elif methods:
        parts.append(
            "per method, options over the defaults: "
            + "; ".join(
                f"{name} {', '.join(f'{k} {fmt(v)}' for k, v in m['options'].items()) or 'none'}"
                for name, m in methods.items()
            )
        )
    parts.append(f"seeds {', '.join(str(s) for s in record.get('seeds', []))}")
    runtime = f"{hardware_label(record.get('environment') or {})}: {fmt(record.get('runtime_s'))} s wall"
    jobs = record.get("jobs") or {}
    if jobs.get("jobs_reused"):
        runtime += f" ({jobs['jobs_reused']} of {jobs['jobs']} runs reused from the cache)"
    if record.get("estimated_free_cores_s") is not None:
        load = record.get("load_average") or [None]
        runtime += (
            f"; from scratch on {record.get('cores')} free core(s) ≈ {fmt(record['estimated_free_cores_s'])} s "
            f"(CPU-time estimate; 1-min load average at the end {fmt(load[0])})"
        )
    parts.append(runtime)
    if jobs.get("training_code"):
        parts.append(_training_code(jobs["training_code"]))
    return "Settings: " + "; ".join(parts) + "."


def _training_code(counts: Mapping[str, int]) -> str:
    """Which code trained the record's runs. The run cache is keyed by settings, not code, so a record may mix runs
    of several code versions: said in words, because a change between them would go unnoticed."""
    listed = ", ".join(f"{label} ({n})" for label, n in counts.items())
    if list(counts) == ["unknown"]:
        return "runs' code not recorded (trained before runs recorded it)"
    if len(counts) == 1:
        return f"runs trained by code {listed}"
    unknown = "; unknown = trained before runs recorded their code" if "unknown" in counts else ""
    return f"**runs trained by {len(counts)} code versions** (runs each: {listed}{unknown})"


def _definitions_lines(record: Mapping[str, Any]) -> list[str]:
    lines = []
    noise = record.get("noise") or {}
    conditions = {entry.get("condition") for entry in record.get("summary") or []}
    if noise.get("text") and "exploding" in conditions:  # a long run records the noise it never injects
        lines.append(f"* exploding condition: {noise['text']};")
    for key, text in ((record.get("definitions") or {}).get("text") or {}).items():
        lines.append(f"* {key}: {text};")
    return lines


def training_block(record: Mapping[str, Any], link_base: str, label_name: str = "method") -> str:
    """A training experiment's block: one row per label (``label_name``: method, clip threshold) x condition."""
    rows = []
    for s in record["summary"]:
        condition = s["condition"] + (" (= normal run: no ratio)" if s.get("shared_with_normal") else "")
        collapsed = f"{s['collapsed']}/{s['seeds']}"
        if s["collapse_kinds"]:
            collapsed += f" ({', '.join(s['collapse_kinds'])})"
        rows.append(
            [
                s["label"],
                condition,
                collapsed,
                ", ".join(str(x) for x in s["collapse_steps"]) or MISSING,
                str(s["transient_collapses"]),
                fmt_band(s["zero_reward_steps"]),
                f"{fmt_band(s['spikes'])} ({fmt_band(s.get('spike_rate'))})",
                fmt_band(s["nonfinite_steps"]),
                f"{fmt_band(s['initial_reward'])} → {fmt_band(s['final_reward'])}",
                fmt_change(s),
                fmt_band(s["grad_norm_median"]),
                fmt_band(s["grad_norm_max"]),
            ]
        )
    header = [
        label_name,
        "condition",
        "collapsed",
        "collapse step(s)",
        "transient collapses",
        "steps at reward 0",
        "spikes (per step)",
        "non-finite steps",
        "reward first → last",
        "last − frozen",
        "median grad norm",
        "max grad norm",
    ]
    plots = record.get("plots") or {}
    return "\n\n".join(
        [
            f"### {record.get('title', record['experiment'])}",
            _setting_line(record),
            "\n".join(_definitions_lines(record)),
            markdown_rows(header, rows),
            "Spikes and non-finite steps are counts per run (mean [min, max] over seeds); rewards are the mean of the "
            "first and of the last rollouts (see the collapse definition for the windows); *last − frozen* compares "
            "the last rollouts with the never-updated warm start on the same prompts (positive = learned something): "
            "the mean over runs with its 95% interval over runs (seeds resampled, then their last rollouts), *gained* "
            "or *lost* only where that interval excludes 0, then the seeds' mean [min, max] and how many ended above; "
            "grad norms are pre-clip.",
            " ".join(_image(link_base, plots.get(k), f"{record['experiment']} {k}") for k in ("reward", "gradnorm")),
        ]
    )


def lrsweep_block(record: Mapping[str, Any], link_base: str) -> str:
    rates = list(record["by_lr"])
    labels = list(dict.fromkeys(label for methods in record["by_lr"].values() for label in methods))

    def cell(m: Mapping[str, Any] | None) -> str:
        if not m or m.get("change") is None:
            return MISSING
        mark = " (below)" if m["falls_below"] else (" (gains)" if m["gains"] else "")
        return f"{fmt_interval(m['change'], m['low'], m['high'])}{mark}"

    rows = [[label, *(cell(record["by_lr"][lr].get(label)) for lr in rates)] for label in labels]
    # Every setting but the rate is shared; the rate is the column.
    shared = {**record, "optimizer": {k: v for k, v in record["optimizer"].items() if k != "learning_rate"}}
    chosen = fmt(record["chosen_lr"]) if record.get("chosen_lr") is not None else "none"
    return "\n\n".join(
        [
            f"### {record['title']}",
            _setting_line(shared),
            f"Rule: {record['rule']}. Chosen: **{chosen}** ({record['choice']}).",
            markdown_rows(["method", *(f"lr {lr}" for lr in rates)], rows),
            _image(link_base, (record.get("plots") or {}).get("sweep"), "learning-rate sweep"),
        ]
    )


def drift_block(record: Mapping[str, Any], link_base: str) -> str:
    summary = record["summary"]
    levels = record["levels"]
    drift_at = {lvl: statistics.fmean(r["policy_drift"] for r in summary if r["level"] == lvl) for lvl in levels}
    header = ["variant", "clipping", "normalisation", "condition"] + [
        f"σ={fmt(lvl)} (drift {fmt(drift_at[lvl])})" for lvl in levels
    ]
    keys = list(dict.fromkeys((r["variant"], r["condition"]) for r in summary))
    rows = []
    for variant, condition in keys:
        at = {r["level"]: r for r in summary if r["variant"] == variant and r["condition"] == condition}
        first = next(iter(at.values()))
        rows.append(
            [variant, first["clipping"], first["normalisation"], condition]
            + [fmt_band(at[lvl]["spike_probability"]) for lvl in levels]
        )
    return "\n\n".join(
        [
            f"### {record.get('title', 'Spike probability vs drift')}",
            _setting_line(record),
            "\n".join(_definitions_lines(record)),
            "Cells: probability that the update norm is a spike (mean [min, max] over seeds) at parameter-noise "
            "level σ; the measured policy drift of each level is in the column header.",
            markdown_rows(header, rows),
            _start_noise_lines(record.get("start_noise") or {}),
            _image(link_base, (record.get("plots") or {}).get("spikes"), "spike probability vs drift"),
        ]
    )


def _start_noise_lines(noise: Mapping[str, Any]) -> str:
    """The log-weight noise at the start (no drift: every true ratio is 1), per StableDRL-family variant."""
    if not noise:
        return ""
    rows = [[v, fmt_band(n["log_weight_std"]), fmt_band(n["at_clip"]), fmt_band(n["ess"])] for v, n in noise.items()]
    header = ["variant", "std of log ρ (nats)", "fraction of ρ above C", "ESS / G of the clipped weights"]
    return (
        "Log-weight noise at the start (σ = 0: the policy is the rollout policy, so every true ratio is 1 and this "
        "is estimator noise alone); mean [min, max] over seeds and repeats:\n\n" + markdown_rows(header, rows)
    )


def hull_block(record: Mapping[str, Any], link_base: str) -> str:
    summary = record["summary"]
    scales = record["scales"]
    header = ["variant"] + [f"max ‖u‖/B, scale {fmt(s)}" for s in scales] + ["fraction > 1", "non-finite updates"]
    rows = []
    for variant in dict.fromkeys(r["variant"] for r in summary):
        at = {r["scale"]: r for r in summary if r["variant"] == variant}
        total = at["all"]
        rows.append(
            [variant]
            + [fmt(at[s]["ratio_max"]) for s in scales]
            + [fmt(total["fraction_above_1"]), f"{total['nonfinite']}/{total['trials']}"]
        )
    stable = next(r for r in summary if r["variant"] == "stabledrl" and r["scale"] == "all")
    check = (
        f"StableDRL's update rebuilt as an explicit convex combination of the per-sample terms matches autograd to a "
        f"relative {fmt(stable['residual_max'])} (max over trials); its weights are >= {fmt(stable['weight_min'])} and "
        f"sum to 1 per group within {fmt(stable['weight_sum_error_max'])}."
    )
    return "\n\n".join(
        [
            f"### {record.get('title', 'Convex-hull property')}",
            f"{record['summary'][0]['trials'] * len(scales)} random trials (seed {record['seeds'][0]}), log-ratios = "
            "scale x Cauchy; B = mean over groups of the largest per-sample term ‖A_i ∇bound_i‖ (StableDRL family) or "
            "the largest per-sample / per-token term (ESPO, GRPO). ‖u‖/B <= 1 is the convex-hull bound "
            f"(rounding tolerance {fmt(record.get('tolerance'))}).",
            markdown_rows(header, rows),
            check,
            _image(link_base, (record.get("plots") or {}).get("hull"), "convex hull"),
        ]
    )


def generic_block(record: Mapping[str, Any], link_base: str) -> str:
    """A plugin experiment's record without a report of its own: title, settings and plots."""
    plots = " ".join(
        _image(link_base, name, f"{record['experiment']} {key}") for key, name in record.get("plots", {}).items()
    )
    return "\n\n".join(
        p for p in (f"### {record.get('title', record['experiment'])}", _setting_line(record), plots) if p
    )


# The built-in experiments' blocks and observations (an Experiment's own ``report``/``observations`` come first).
