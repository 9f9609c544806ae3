"""The leaderboard's Stability section, generated from ``results/stability/*.json`` (never from hand-written numbers).

Every verdict in "What we observed" is computed from the records and compared with the paper's qualitative claims
as docs/published-numbers.md states them (§1.4-1.5 and §5, the section numbers the claims below cite; grade S, i.e.
from a secondary note, since the stress-test figures' numbers are not available). A claim whose experiment has not
been run is said to be untested.
Plot links are relative to the leaderboard file, which sits at the repository root next to ``results/``.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stabledrl_bench.errors import UserError
from stabledrl_bench.experiments.stress.common import read_record, stability_dir
from stabledrl_bench.reporting.markdown import MISSING, markdown_rows
from stabledrl_bench.reporting.results import STABILITY_DIR, hardware_label

IMMEDIATE_FRACTION = 0.25  # "collapses immediately": within the first quarter of the run


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
    return "Settings: " + "; ".join(parts) + "."


def _definitions_lines(record: Mapping[str, Any]) -> list[str]:
    lines = []
    noise = record.get("noise") or {}
    conditions = {entry.get("condition") for entry in record.get("summary") or []}
    if noise.get("text") and "exploding" in conditions:  # a long run records the noise it never injects
        lines.append(f"* exploding condition: {noise['text']};")
    for key, text in ((record.get("definitions") or {}).get("text") or {}).items():
        lines.append(f"* {key}: {text};")
    return lines


def _training_block(record: Mapping[str, Any], link_base: str, label_name: str) -> str:
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
                f"{fmt_band(s.get('final_vs_frozen'))}; {s['above_frozen']}/{s['seeds']} above",
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
            "the last rollouts with the never-updated warm start on the same prompts (positive = learned something); "
            "grad norms are pre-clip.",
            " ".join(_image(link_base, plots.get(k), f"{record['experiment']} {k}") for k in ("reward", "gradnorm")),
        ]
    )


def _lrsweep_block(record: Mapping[str, Any], link_base: str) -> str:
    rates = list(record["by_lr"])
    labels = list(dict.fromkeys(label for methods in record["by_lr"].values() for label in methods))

    def cell(m: Mapping[str, Any] | None) -> str:
        if not m or m.get("change") is None:
            return MISSING
        mark = " (below)" if m["falls_below"] else (" (gains)" if m["gains"] else "")
        return f"{m['change']:+.3f} [{m['low']:+.3f}, {m['high']:+.3f}]{mark}"

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


def _drift_block(record: Mapping[str, Any], link_base: str) -> str:
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


def _hull_block(record: Mapping[str, Any], link_base: str) -> str:
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


# ------------------------------------------------------------------------------------------- observations
def _entry(record: Mapping[str, Any] | None, label: str, condition: str) -> Mapping[str, Any] | None:
    if record is None:
        return None
    return next((s for s in record["summary"] if s["label"] == label and s["condition"] == condition), None)


def _collapse_text(entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return "not run"
    steps = f" at step(s) {', '.join(str(x) for x in entry['collapse_steps'])}" if entry["collapse_steps"] else ""
    kinds = f" ({', '.join(entry['collapse_kinds'])})" if entry["collapse_kinds"] else ""
    versus = entry.get("final_vs_frozen") or {}
    change = f", last − frozen {fmt_band(versus)}" if versus.get("mean") is not None else ""
    return f"{entry['collapsed']}/{entry['seeds']} collapsed{steps}{kinds}{change}"


def _all(entry: Mapping[str, Any] | None) -> bool:
    return entry is not None and entry["collapsed"] == entry["seeds"]


def _none(entry: Mapping[str, Any] | None) -> bool:
    return entry is not None and entry["collapsed"] == 0


def _claim(text: str, verdict: str, evidence: str) -> str:
    return f"* **{verdict}** — paper: {text} Here: {evidence}."


def _exploding_claims(record: Mapping[str, Any] | None) -> list[str]:
    if record is None:
        return ["* Exploding-weight stress test: not run (`python -m stabledrl_bench stress exploding`)."]
    steps = record["budget"]["max_steps"]
    out = []
    s_n, s_e = _entry(record, "stabledrl", "normal"), _entry(record, "stabledrl", "exploding")
    if s_n or s_e:
        stable = _none(s_n) and _none(s_e)
        gains = [
            e["final_vs_frozen"]["mean"]
            for e in (s_n, s_e)
            if e and e.get("final_vs_frozen") and e["final_vs_frozen"]["mean"] is not None
        ]
        improves = bool(gains) and all(g > 0 for g in gains)
        verdict = "agrees" if stable and improves else ("partly agrees" if stable else "disagrees")
        out.append(
            _claim(
                "StableDRL improves stably under Normal and Exploding (§1.4).",
                verdict,
                f"normal {_collapse_text(s_n)}, exploding {_collapse_text(s_e)}; last rollouts minus the frozen warm "
                f"start on the same prompts: {', '.join(fmt(g) for g in gains) or MISSING} (stable"
                f"{', improving' if improves else ', not improving'})",
            )
        )
    e_e = _entry(record, "espo", "exploding")
    if e_e:
        immediate = _all(e_e) and statistics.median(e_e["collapse_steps"]) <= IMMEDIATE_FRACTION * steps
        verdict = "agrees" if immediate else ("partly agrees" if e_e["collapsed"] else "disagrees")
        note = (
            "" if immediate or not e_e["collapsed"] else f" (immediately = by step {int(IMMEDIATE_FRACTION * steps)})"
        )
        out.append(
            _claim(
                "ESPO collapses immediately under Exploding (§1.4).",
                verdict,
                f"exploding {_collapse_text(e_e)}{note}; normal {_collapse_text(_entry(record, 'espo', 'normal'))}",
            )
        )
    p_n = _entry(record, "spg", "normal")
    if p_n:
        verdict = "agrees" if _all(p_n) else ("partly agrees" if p_n["collapsed"] else "disagrees")
        out.append(
            _claim(
                "SPG collapses under both Normal and Exploding, from off-policy bias (§1.4).",
                verdict,
                f"{_collapse_text(p_n)} (SPG has no ratio, so its exploding run is its normal run) within {steps} "
                f"steps at mu = {record['budget']['num_iterations']}",
            )
        )
    g_e, g_n = _entry(record, "grpo", "exploding"), _entry(record, "grpo", "normal")
    if g_e and s_e:
        verdict = "agrees" if _all(g_e) and _none(s_e) else ("partly agrees" if g_e["collapsed"] else "disagrees")
        rates = ", ".join(
            f"{name} {condition} {fmt_band(e.get('spike_rate'))}"
            for name, condition, e in (
                ("GRPO", "normal", g_n),
                ("GRPO", "exploding", g_e),
                ("StableDRL", "normal", s_n),
                ("StableDRL", "exploding", s_e),
            )
            if e
        )
        out.append(
            _claim(
                "with estimated ratios GRPO's conditional clip is bypassed, giving spikes and reward collapse "
                "(abstract, §5.2).",
                verdict,
                f"GRPO exploding {_collapse_text(g_e)}, non-finite steps {fmt_band(g_e['nonfinite_steps'])} per run; "
                f"GRPO normal {_collapse_text(g_n)}; spikes per step: {rates}",
            )
        )
    for label, claim in (
        ("clip_only", "without self-normalisation (clip only) training eventually collapses (§1.5)."),
        ("selfnorm_only", "without clipping (self-normalisation only) training collapses quickly (§1.5)."),
    ):
        n, e = _entry(record, label, "normal"), _entry(record, label, "exploding")
        if n or e:
            any_collapse = (n and n["collapsed"]) or (e and e["collapsed"])
            verdict = "agrees" if (_all(n) or _all(e)) else ("partly agrees" if any_collapse else "disagrees")
            out.append(_claim(claim, verdict, f"normal {_collapse_text(n)}, exploding {_collapse_text(e)}"))
    return out


def _per_threshold(record: Mapping[str, Any], condition: str, key: str) -> str:
    """``C=1 x, C=5 y, ...``: the seed mean of one summary statistic per clip threshold."""
    values = []
    for c in record["thresholds"]:
        entry = _entry(record, f"C={c:g}", condition) or {}
        values.append(f"C={c:g} {fmt((entry.get(key) or {}).get('mean'))}")
    return ", ".join(values)


def _clip_claims(record: Mapping[str, Any] | None) -> list[str]:
    if record is None:
        return ["* Clip-threshold ablation: not run (`python -m stabledrl_bench stress clip`)."]
    conditions = list(dict.fromkeys(s["condition"] for s in record["summary"]))
    expected_stable = {1.0, 5.0}
    per_c, matches = [], []
    for c in record["thresholds"]:
        entries = [_entry(record, f"C={c:g}", cond) for cond in conditions]
        collapsed = any(e and e["collapsed"] for e in entries)
        matches.append(collapsed != (c in expected_stable))
        per_c.append(
            f"C={c:g}: " + ", ".join(f"{cond} {_collapse_text(e)}" for cond, e in zip(conditions, entries, strict=True))
        )
    verdict = "agrees" if all(matches) else ("partly agrees" if any(matches) else "disagrees")
    trend = "; ".join(
        f"{cond}: spikes per run {_per_threshold(record, cond, 'spikes')}, max grad norm "
        f"{_per_threshold(record, cond, 'grad_norm_max')}"
        for cond in conditions
    )
    return [
        _claim(
            "C in {1, 5} is stable, C in {100, 1000} collapses (§1.5, Fig. 7).",
            verdict,
            "; ".join(per_c) + f". Trend with C ({trend})",
        )
    ]


def _drift_claims(record: Mapping[str, Any] | None) -> list[str]:
    if record is None:
        return ["* Spike probability vs drift: not run (`python -m stabledrl_bench stress drift`)."]
    summary = record["summary"]
    condition = "normal" if any(r["condition"] == "normal" for r in summary) else summary[0]["condition"]
    low, high = min(record["levels"]), max(record["levels"])

    def p(variant: str, level: float) -> float | None:
        row = next(
            (r for r in summary if r["variant"] == variant and r["condition"] == condition and r["level"] == level),
            None,
        )
        return None if row is None else row["spike_probability"]["mean"]

    conditional = [v for v in ("grpo", "espo") if p(v, high) is not None and p(v, low) is not None]
    stable = p("stabledrl", high)
    claim = (
        "drift from the rollout policy makes spikes more likely under conditional clipping (the self-reinforcing "
        "loop), while StableDRL's update stays bounded (§5.2-5.5)."
    )
    if not conditional:
        return [
            _claim(claim, "not tested", "no spike probabilities for GRPO / ESPO (variant not run, or zero updates)")
        ]
    rising = [v for v in conditional if p(v, high) > p(v, low) and (stable is None or p(v, high) > stable)]
    verdict = "agrees" if len(rising) == len(conditional) else ("partly agrees" if rising else "disagrees")
    evidence = "; ".join(
        f"{v} {fmt(p(v, low))} → {fmt(p(v, high))}" for v in (*conditional, "stabledrl") if p(v, low) is not None
    )
    return [
        _claim(
            claim,
            verdict,
            f"spike probability ({condition} condition) from the smallest to the largest drift level: {evidence}",
        )
    ]


def _hull_claims(record: Mapping[str, Any] | None) -> list[str]:
    if record is None:
        return ["* Convex-hull property: not run (`python -m stabledrl_bench stress hull`)."]
    rows = {(r["variant"], r["scale"]): r for r in record["summary"]}
    stable, grpo = rows[("stabledrl", "all")], rows.get(("grpo", "all"))
    bounded = stable["fraction_above_1"] == 0 and stable["nonfinite"] == 0
    grpo_max = [rows[("grpo", s)]["ratio_max"] for s in record["scales"]] if grpo else []
    evidence = f"StableDRL max ‖u‖/B = {fmt(stable['ratio_max'])} over {stable['trials']} trials"
    if grpo:
        evidence += (
            f"; GRPO max ‖u‖/B per noise scale {', '.join(fmt(x) for x in grpo_max)}, above 1 in "
            f"{fmt(grpo['fraction_above_1'])} of trials, non-finite in {grpo['nonfinite']}"
        )
    return [
        _claim(
            "StableDRL's update is a convex combination of the per-sample terms, so its norm is bounded by the "
            "largest of them whatever the ratios; GRPO's is not (§5.2, §5.5).",
            "agrees" if bounded and grpo and grpo["fraction_above_1"] > 0 else "disagrees",
            evidence,
        )
    ]


def _lrsweep_observations(record: Mapping[str, Any] | None) -> list[str]:
    """Not a paper claim: which methods first fall below the frozen control as the rate grows (the tolerance of
    each method to the step size, under one setting for all)."""
    if record is None:
        return ["* Learning-rate sweep: not run (`python -m stabledrl_bench stress lrsweep`)."]
    for rate, methods in record["by_lr"].items():  # increasing rates
        below = [name for name, m in methods.items() if m.get("falls_below")]
        if below:
            gaining = [name for name, m in methods.items() if m.get("gains")]
            still = f"; {', '.join(gaining)} still gain(s)" if gaining else ""
            return [
                f"* **observation** — learning-rate sweep: the first swept rate at which a method falls below the "
                f"frozen control is {rate}: {', '.join(below)}{still} (second half of {record['budget']['max_steps']}"
                " steps, 95% intervals)."
            ]
    return ["* **observation** — learning-rate sweep: no method falls below the frozen control at any swept rate."]


def _longrun_claims(record: Mapping[str, Any] | None) -> list[str]:
    if record is None:
        return ["* Long run without injected noise: not run (`python -m stabledrl_bench stress longrun`)."]
    budget, effective = record["budget"], [m["effective"] for m in (record.get("methods") or {}).values()]
    num_mc = sorted({e["num_mc"] for e in effective if "num_mc" in e})
    betas = sorted({e["beta"] for e in effective})
    setting = (
        f"{budget['max_steps']} steps, mu = {budget['num_iterations']}, G = {budget['num_generations']}, lr "
        f"{fmt(record['optimizer']['learning_rate'])}, num_mc {'/'.join(map(str, num_mc))}, beta "
        f"{'/'.join(fmt(b) for b in betas)} for every method, no injected noise"
    )
    others = [e for label in ("grpo", "espo", "spg", "trado") if (e := _entry(record, label, "normal"))]
    stable = _entry(record, "stabledrl", "normal")
    if not others or stable is None:
        return []
    evidence = "; ".join(f"{e['label']} {_collapse_text(e)}" for e in [*others, stable])
    claim = "GRPO-style baselines collapse after a few hundred steps, StableDRL trains stably for 1000+ (§1.4-1.5)."
    if not any(e["above_frozen"] == e["seeds"] for e in [*others, stable]):
        # Stability is only tested where something is learned: otherwise every method sits at or below the start.
        return [
            _claim(
                claim, "not tested", f"{setting}: no method ended above the frozen control on every seed; {evidence}"
            )
        ]
    collapsed = [e for e in others if e["collapsed"]]
    verdict = (
        "agrees"
        if _none(stable) and collapsed and all(_all(e) for e in collapsed)
        else ("partly agrees" if _none(stable) and collapsed else "disagrees")
    )
    return [_claim(claim, verdict, f"{setting}: {evidence}")]


def _generic_block(record: Mapping[str, Any], link_base: str) -> str:
    """A plugin experiment's record without a report of its own: title, settings and plots."""
    plots = " ".join(
        _image(link_base, name, f"{record['experiment']} {key}") for key, name in record.get("plots", {}).items()
    )
    return "\n\n".join(
        p for p in (f"### {record.get('title', record['experiment'])}", _setting_line(record), plots) if p
    )


# The built-in experiments' blocks and observations (an Experiment's own ``report``/``observations`` come first).
BUILTIN: dict[str, tuple[Callable[[Mapping[str, Any], str], str], Callable[[Mapping[str, Any] | None], list[str]]]] = {
    "lrsweep": (_lrsweep_block, _lrsweep_observations),
    "exploding": (functools.partial(_training_block, label_name="method"), _exploding_claims),
    "clip": (functools.partial(_training_block, label_name="clip threshold"), _clip_claims),
    "drift": (_drift_block, _drift_claims),
    "hull": (_hull_block, _hull_claims),
    "longrun": (functools.partial(_training_block, label_name="method"), _longrun_claims),
}


def stability_section(results_dir: Path | str) -> str | None:
    """Markdown of the Stability section, or None when no stability record exists: one block per registered
    experiment that has a record (plugins included), then every experiment's observations."""
    from stabledrl_bench.experiments.stress.options import EXPERIMENTS, in_order

    results_dir = Path(results_dir)
    folder = stability_dir(results_dir)
    names = in_order()
    records = {name: read_record(folder / f"{name}.json") for name in names if (folder / f"{name}.json").is_file()}
    if not records:
        return None

    def rendering(name: str) -> tuple[Callable, Callable | None]:
        experiment = EXPERIMENTS.get(name)
        block, observations = BUILTIN.get(name, (_generic_block, None))
        return experiment.report or block, experiment.observations or observations

    link_base = f"{results_dir.as_posix()}/{STABILITY_DIR}"
    model = next((r["model"] for r in records.values() if r.get("model")), None)
    warm = next((r["warm_start"] for r in records.values() if r.get("warm_start")), None)
    intro = (
        f"Measured by `python -m stabledrl_bench stress {{{','.join(names)}}}` (one command each; records in "
        f"`{link_base}/`). These experiments test the paper's *mechanism* (estimated ratios, conditional vs "
        "unconditional clipping, self-normalisation) on a tiny model on CPU, not its 8B accuracy numbers"
    )
    if model:
        intro += f"; model: {model.get('name')} ({model.get('parameters')} parameters)"
    if warm and warm.get("spec"):
        sft = warm["spec"]["sft"]  # the runner's WarmStart.identity()
        intro += (
            f", warm start: {sft['max_steps']} masked-diffusion SFT steps on generated {sft['task']} "
            f"(`{sft['protocol']}` protocol), shared by every run"
        )

    def rendered(name: str, part: int) -> Any:
        """Block (0) or observations (1) of ``name``; a record missing a field is one line naming the file."""
        try:
            render = rendering(name)[part]
            if part == 0:
                return render(records[name], link_base)
            return render(records.get(name)) if render else []
        except KeyError as exc:
            raise UserError(
                f"{folder / f'{name}.json'}: no field {exc} (written by an older version of this harness); "
                f"run `stress {name}` again"
            ) from None

    parts = ["## Stability (stress tests on a tiny model)", intro + "."]
    parts += [rendered(name, 0) for name in records]
    observed = [line for name in names for line in rendered(name, 1)]
    parts.append(
        "### What we observed\n\nEach paper claim (§ numbers refer to [docs/published-numbers.md]"
        "(docs/published-numbers.md); the stress-test claims are grade S, qualitative only) against this run's "
        "numbers; verdicts are computed from the records above.\n\n" + "\n".join(observed)
    )
    return "\n\n".join(p for p in parts if p) + "\n"
