"""The Stability section's "What we observed": each paper claim against the numbers of a record.

Every verdict is computed from the records and compared with the paper's qualitative claims as
docs/published-numbers.md states them (§1.4-1.5 and §5, the section numbers the claims below cite; grade S, i.e.
from a secondary note, since the stress-test figures' numbers are not available). A claim whose experiment has not
been run is said to be untested. Each built-in experiment names its function here as its
:class:`~.options.Experiment`'s ``observations``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from stabledrl_bench.experiments.stress.tables import fmt, fmt_band, fmt_interval

IMMEDIATE_FRACTION = 0.25  # "collapses immediately": within the first quarter of the run


def _entry(record: Mapping[str, Any] | None, label: str, condition: str) -> Mapping[str, Any] | None:
    if record is None:
        return None
    return next((s for s in record["summary"] if s["label"] == label and s["condition"] == condition), None)


def _collapse_text(entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return "not run"
    steps = f" at step(s) {', '.join(str(x) for x in entry['collapse_steps'])}" if entry["collapse_steps"] else ""
    kinds = f" ({', '.join(entry['collapse_kinds'])})" if entry["collapse_kinds"] else ""
    return f"{entry['collapsed']}/{entry['seeds']} collapsed{steps}{kinds}{_change_text(entry)}"


def _change_text(entry: Mapping[str, Any]) -> str:
    """``, last − frozen +0.175 [+0.142, +0.207] over 5 runs (gained)``; a record without the change over runs
    gives the seeds' band, which supports no verdict."""
    runs = entry.get("final_vs_frozen_runs")
    if runs:
        interval = fmt_interval(runs["mean"], runs["low"], runs["high"])
        return f", last − frozen {interval} over {runs['runs']} runs ({runs['verdict']})"
    versus = entry.get("final_vs_frozen") or {}
    if versus.get("mean") is None:
        return ""
    return f", last − frozen {fmt_band(versus)} (the seeds' band; no interval over runs)"


def _gained(entry: Mapping[str, Any] | None) -> bool:
    """The last rollouts are above the frozen control over runs: the 95% interval over runs lies above 0 (a record
    without that interval resolves nothing)."""
    runs = (entry or {}).get("final_vs_frozen_runs")
    return bool(runs) and runs["verdict"] == "gained"


def _all(entry: Mapping[str, Any] | None) -> bool:
    return entry is not None and entry["collapsed"] == entry["seeds"]


def _none(entry: Mapping[str, Any] | None) -> bool:
    return entry is not None and entry["collapsed"] == 0


def _claim(text: str, verdict: str, evidence: str) -> str:
    return f"* **{verdict}** — paper: {text} Here: {evidence}."


def exploding_claims(record: Mapping[str, Any] | None) -> list[str]:
    if record is None:
        return ["* Exploding-weight stress test: not run (`python -m stabledrl_bench stress exploding`)."]
    steps = record["budget"]["max_steps"]
    out = []
    s_n, s_e = _entry(record, "stabledrl", "normal"), _entry(record, "stabledrl", "exploding")
    if s_n or s_e:
        stable = _none(s_n) and _none(s_e)
        improves = all(_gained(e) for e in (s_n, s_e) if e)
        verdict = "agrees" if stable and improves else ("partly agrees" if stable else "disagrees")
        out.append(
            _claim(
                "StableDRL improves stably under Normal and Exploding (§1.4).",
                verdict,
                f"normal {_collapse_text(s_n)}, exploding {_collapse_text(s_e)} (stable"
                f"{', improving over runs' if improves else ', no gain resolved over runs'})",
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


def clip_claims(record: Mapping[str, Any] | None) -> list[str]:
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


def drift_claims(record: Mapping[str, Any] | None) -> list[str]:
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


def hull_claims(record: Mapping[str, Any] | None) -> list[str]:
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


def lrsweep_observations(record: Mapping[str, Any] | None) -> list[str]:
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


def longrun_claims(record: Mapping[str, Any] | None, suffix: str = "", experiment: str = "longrun") -> list[str]:
    """The central claim against a long run's record; ``suffix`` picks the labels of one KL setting (``_anchor``:
    the same anchor for every method, the ``anchored`` experiment)."""
    if record is None:
        return [f"* Long run (`{experiment}`): not run (`python -m stabledrl_bench stress {experiment}`)."]
    budget, effective = record["budget"], [m["effective"] for m in (record.get("methods") or {}).values()]
    num_mc = sorted({e["num_mc"] for e in effective if "num_mc" in e})
    betas = sorted({e["beta"] for e in effective})
    anchors = sorted({e["anchor_beta"] for e in effective if e.get("anchor_beta")})
    anchor = f" plus one shared KL anchor {'/'.join(fmt(a) for a in anchors)}" if anchors else ""
    setting = (
        f"{budget['max_steps']} steps, mu = {budget['num_iterations']}, G = {budget['num_generations']}, lr "
        f"{fmt(record['optimizer']['learning_rate'])}, num_mc {'/'.join(map(str, num_mc))}, beta "
        f"{'/'.join(fmt(b) for b in betas)}{anchor} for every method, no injected noise"
    )
    others = [e for label in ("grpo", "espo", "spg", "trado") if (e := _entry(record, label + suffix, "normal"))]
    stable = _entry(record, "stabledrl" + suffix, "normal")
    if not others or stable is None:
        return []
    evidence = "; ".join(f"{e['label']} {_collapse_text(e)}" for e in [*others, stable])
    claim = "GRPO-style baselines collapse after a few hundred steps, StableDRL trains stably for 1000+ (§1.4-1.5)."
    if not any(_gained(e) for e in [*others, stable]):
        # Stability is only tested where something is learned: otherwise every method sits at or below the start.
        return [
            _claim(
                claim,
                "not tested",
                f"{setting}: no method ended above the frozen control over runs (95% interval); {evidence}",
            )
        ]
    collapsed = [e for e in others if e["collapsed"]]
    verdict = (
        "agrees"
        if _none(stable) and collapsed and all(_all(e) for e in collapsed)
        else ("partly agrees" if _none(stable) and collapsed else "disagrees")
    )
    return [_claim(claim, verdict, f"{setting}: {evidence}")]


def anchored_claims(record: Mapping[str, Any] | None) -> list[str]:
    return longrun_claims(record, suffix="_anchor", experiment="anchored")


def _change(base: Mapping[str, Any], variant: Mapping[str, Any]) -> str:
    """What one change did to the collapse count, read against the unchanged method on the same seeds."""
    if variant["collapsed"] == base["collapsed"]:
        return "no change" if base["collapsed"] == 0 else "still collapses"
    more = "more" if variant["collapsed"] > base["collapsed"] else "fewer"
    return f"{more} collapses: {base['collapsed']} → {variant['collapsed']} of {variant['seeds']}"


def attribution_observations(record: Mapping[str, Any] | None) -> list[str]:
    """Not a paper claim: per method and condition, each one-change variant's collapses beside the unchanged
    method's (``<method>_<change>`` labels of the record), so that a collapse is assigned to what removes it."""
    if record is None:
        return ["* Attribution of collapses: not run (`python -m stabledrl_bench stress attribution`)."]
    out = []
    for base in record["summary"]:
        variants = [s for s in record["summary"] if s["condition"] == base["condition"]]
        variants = [s for s in variants if s["label"].startswith(f"{base['label']}_")]
        if not variants:
            continue
        changes = "; ".join(
            f"{v['label'].removeprefix(base['label'] + '_')} {_collapse_text(v)} ({_change(base, v)})" for v in variants
        )
        out.append(
            f"* **attribution** — {base['label']} under {base['condition']}: unchanged {_collapse_text(base)}; "
            f"{changes}."
        )
    return out
