"""The platform study: does a comparison's verdict survive a change of machine?

Why: a CPU of another kind rounds differently, because other kernels run (other vector widths in torch's own
kernels, other code paths in the BLAS and oneDNN). From the first optimizer step on, that acts like another seed: on
the tiny preset a method's change from its start flips sign in about half the cells between two kinds of CPU. A
verdict a user can trust must hold on their machine too, so this study measures it: the same comparison
(``reproduce`` with the same options) once per platform, with the environment variables that force another
platform's kernels on this machine (:data:`PLATFORMS`; ``regress --measure-tolerance`` uses the same switches), each
into its own folders, and then every comparison over runs the leaderboard reports
(:func:`~stabledrl_bench.reporting.leaderboard.measured_blocks`) on each platform:

* per platform, over its own seeds: the estimate and the verdict;
* pooled, every platform's runs treated as further runs (a platform's seed is another run);
* how far a change of platform moves one seed's change from its start, beside how far a change of seed moves it.

A verdict *holds* when it was measured on every platform and its estimate has the same sign on each. The report
(``<results>/platforms/<comparison>__<tasks>.md`` and ``.json``, one per study) lists every verdict resolved on some
platform and whether it holds; the docs state only verdicts that are resolved on this machine's kernels and hold.

    python -m stabledrl_bench platforms table1 --tasks sudoku --seeds 0,1,2,3,4

runs ``reproduce table1 --tasks sudoku --seeds 0,1,2,3,4`` on this machine's kernels (into the usual ``--runs`` and
``--results`` folders, so the comparison's own runs are reused) and under every emulated platform (into
``<runs>/platforms/<name>`` and ``<results>/platforms/<name>``, which the leaderboard does not read). Every
emulated platform trains its own SFT warm starts (``--train-starts``), so the study measures what a change of
machine does to the whole pipeline; a user who starts from the committed starts (:mod:`.starts`) sees only the RL
part of that difference.

``native`` is always the study's reference. Left out of ``--platforms``, it is not run again: its records are the
comparison's as they are in ``--results`` (the committed ones, say, measured with the committed starts), and the
report says which commits measured them. That is how a study is added to a comparison measured earlier without
spending its hours twice.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.errors import UserError, on_interrupt
from stabledrl_bench.experiments.comparison import Comparison
from stabledrl_bench.reporting.frame import check_consistency, records_frame
from stabledrl_bench.reporting.leaderboard import Block, measured_blocks
from stabledrl_bench.reporting.markdown import markdown_table, task_label
from stabledrl_bench.reporting.measured import MeasuredRow, run_change, shared_seeds, starting_points
from stabledrl_bench.reporting.overruns import CONTROL, START, Finding, measured_findings
from stabledrl_bench.reporting.provenance import code_label, cpu_model, forced_environment, git_state
from stabledrl_bench.reporting.results import PLATFORMS_DIR, load_results
from stabledrl_bench.reporting.runlevel import NOT_RESOLVED
from stabledrl_bench.reporting.training import read_training, training_changes, training_path


@dataclass(frozen=True)
class Platform:
    """One platform of the study: what it emulates and the environment that forces its kernels."""

    name: str
    description: str
    env: Mapping[str, str]


PLATFORMS = {
    platform.name: platform
    for platform in (
        Platform("native", "this machine's kernels", {}),
        Platform(
            "avx2",
            "an AVX2 machine: torch's kernels, MKL and oneDNN at AVX2",
            {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
        ),
        Platform(
            "scalar",
            "torch's kernels without vectorisation, MKL at SSE4.2, oneDNN at SSE4.1",
            {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
        ),
        Platform(
            "blas-sse42",
            "MKL at SSE4.2, oneDNN at SSE4.1",
            {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
        ),
    )
}
DEFAULT_PLATFORMS = ("native", "avx2", "scalar")
REFERENCE = "native"


def report_path(run: Comparison) -> Path:
    """The study's report, without its suffix (``.md`` and ``.json``): one per comparison and set of tasks."""
    return run.results / PLATFORMS_DIR / f"{run.name}__{'+'.join(run.tasks)}"


def folders(run: Comparison, platform: str) -> tuple[Path, Path]:
    """A platform's runs and results folders: the comparison's own for this machine's kernels."""
    if platform == "native":
        return run.runs_root, run.results
    return run.runs_root / PLATFORMS_DIR / platform, run.results / PLATFORMS_DIR / platform


def run_study(run: Comparison, reproduce_argv: Sequence[str], platforms: Sequence[str]) -> Path:
    """Run the comparison on every platform named (each in its own process, its kernels forced by its environment),
    then write and return the report. ``native`` is analysed first whether named or not (not named: its records in
    ``--results`` as they are, checked before anything runs)."""
    studied = [REFERENCE, *(name for name in platforms if name != REFERENCE)]
    if REFERENCE not in platforms:
        print(f"[platform native] not run: the comparison's records in {run.results} as they are", flush=True)
        measure(run, run.results)  # fails now, not after hours of the other platforms, if they are not there
    for k, name in enumerate(platforms, 1):
        platform = PLATFORMS[name]
        runs, results = folders(run, name)
        forced = " ".join(f"{key}={value}" for key, value in platform.env.items()) or "nothing forced"
        print(f"[platform {k}/{len(platforms)}] {name}: {platform.description} ({forced})", flush=True)
        board = run.leaderboard if name == "native" else runs / "leaderboard.md"
        command = [sys.executable, "-m", "stabledrl_bench", "reproduce", *reproduce_argv]
        command += ["--runs", str(runs), "--results", str(results), "--leaderboard", str(board)]
        command += ["--train-starts"]  # each platform trains its own starts: the whole pipeline's difference
        with on_interrupt(lambda: "re-run the same command: finished platforms and stages are reused"):
            done = subprocess.run(command, env=forced_environment(platform.env))
        if done.returncode != 0:
            raise UserError(f"the comparison on platform {name} failed (exit code {done.returncode}); see above")
    document = analyse(run, studied, rerun=platforms)
    document["command"] = " ".join(["python -m stabledrl_bench platforms", *reproduce_argv])
    if list(platforms) != list(DEFAULT_PLATFORMS):
        document["command"] += f" --platforms {','.join(platforms)}"
    out = report_path(run)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out.with_suffix(".json"), json.dumps(document, indent=1) + "\n")
    atomic_write_text(out.with_suffix(".md"), report(document))
    print(f"platform study: {out.with_suffix('.md')}")
    return out.with_suffix(".md")


# ------------------------------------------------------------------------------------------------ analysis
@dataclass
class Measured:
    """One platform's measurement of the comparison: its blocks (rows and columns) and its training rewards."""

    blocks: list[Block]
    training: dict[str, pd.DataFrame]  # task -> rewards of the study's seeds and runs
    commits: list[str]  # the code that measured the records (provenance.code_label of each)


def measure(run: Comparison, results: Path) -> Measured:
    """The comparison's records in ``results``, restricted to the study's tasks, seeds and methods."""
    keep = {"sft", "base", *run.baselines}
    records = [
        record
        for record in load_results(results)
        if record["comparison"] == run.name
        and record["task"] in run.tasks
        and int(record["seed"]) in run.seeds
        and record["baseline"] in keep
    ]
    if not records:
        raise UserError(f"{results}: no records of {run.name} for the study's tasks and seeds")
    starts = ("sft", "base")
    found = {(r["task"], int(r["seed"]), "start" if r["baseline"] in starts else r["baseline"]) for r in records}
    missing = [
        f"{task} seed {seed} {name}"
        for task in run.tasks
        for seed in run.seeds
        for name in ("start", *run.baselines)
        if (task, seed, name) not in found
    ]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise UserError(f"{results}: no records of {run.name} for {shown}")
    frame = records_frame(records)
    check_consistency(frame)
    training = {}
    for task in run.tasks:
        path = training_path(results, run.name, task)
        if path.is_file():
            rewards = read_training(path)
            training[task] = rewards[rewards["seed"].isin(run.seeds) & rewards["run"].isin([*run.baselines, "frozen"])]
    commits = sorted({code_label(r.get("environment", {})) for r in records})
    return Measured(measured_blocks(run.table, frame, records), training, commits)


def findings_of(measured: Measured, comparison: str) -> list[Finding]:
    """Every comparison over runs of one platform (greedy decoding and training rewards)."""
    found = [finding for block in measured.blocks for finding in block.found]
    for task, rewards in measured.training.items():
        for change in training_changes(rewards).itertuples():
            found.append(
                Finding(comparison, "training reward", change.run, CONTROL, task_label(task), change.over_runs)
            )
    return found


def pooled(measurements: Sequence[Measured], comparison: str) -> list[Finding]:
    """Every comparison over runs with the platforms' runs pooled: platform k's seed s is run (k, s). Only blocks and
    tasks every platform measured: one platform's runs alone are no pool."""
    found: list[Finding] = []
    for label in dict.fromkeys(block.label for block in measurements[0].blocks):
        blocks = [block for measured in measurements for block in measured.blocks if block.label == label]
        if len(blocks) < len(measurements):
            continue
        rows: dict[tuple, MeasuredRow] = {}
        for k, block in enumerate(blocks):
            for row in block.rows:
                key = (row.info["Baseline"], row.info["Checkpoint"], row.protocols)
                merged = rows.setdefault(key, MeasuredRow(row.info, {}, {}, {}, row.protocols))
                merged.per_seed |= {_run_id(k, seed): cells for seed, cells in row.per_seed.items()}
        merged_rows = list(rows.values())
        found += measured_findings(label, merged_rows, starting_points(merged_rows), blocks[0].columns)
    for task in measurements[0].training:
        if not all(task in m.training for m in measurements):
            continue
        frames = [
            m.training[task].assign(seed=m.training[task]["seed"].map(lambda s, k=k: _run_id(k, s)))
            for k, m in enumerate(measurements)
        ]
        for change in training_changes(pd.concat(frames, ignore_index=True)).itertuples():
            found.append(
                Finding(comparison, "training reward", change.run, CONTROL, task_label(task), change.over_runs)
            )
    return found


def _run_id(platform: int, seed: int) -> int:
    return platform * 1_000_000_000 + int(seed)


def seed_changes(measured: Measured) -> dict[tuple[str, str], dict[int, float]]:
    """Each (method, column)'s change from its start on each seed (points), over the greedy blocks."""
    changes: dict[tuple[str, str], dict[int, float]] = {}
    for block in measured.blocks:
        starts = starting_points(block.rows)
        for row in block.rows:
            start = starts.get(row.protocols)
            if start is None or row is start:
                continue
            for column in block.columns:
                for seed in shared_seeds(row, start, column):
                    one = run_change(_only(row, seed), _only(start, seed), column)
                    if one is not None:
                        changes.setdefault((row.info["Baseline"], column.header), {})[seed] = 100 * one.mean
    return changes


def _only(row: MeasuredRow, seed: int) -> MeasuredRow:
    return MeasuredRow(row.info, {}, {}, {seed: row.per_seed[seed]}, row.protocols)


def analyse(run: Comparison, platforms: Sequence[str], rerun: Sequence[str] | None = None) -> dict[str, Any]:
    """Findings on every platform and pooled, which verdicts hold, and how far platforms and seeds move a run.

    ``rerun``: the platforms the study ran (default: all); the others' records were there before it. A comparison
    missing on some platform does not hold (``holds`` None: not measured everywhere)."""
    measurements = {name: measure(run, folders(run, name)[1]) for name in platforms}
    per_platform = {name: {_key(f): f for f in findings_of(m, run.name)} for name, m in measurements.items()}
    together = {_key(f): f for f in pooled(list(measurements.values()), run.name)}
    keys = list(dict.fromkeys(key for found in per_platform.values() for key in found))
    rows = []
    for key in keys:
        entry: dict[str, Any] = {"comparison": list(key)}
        for name in platforms:
            finding = per_platform[name].get(key)
            entry[name] = None if finding is None else _entry(finding)
        entry["pooled"] = _entry(together[key]) if key in together else None
        if any(entry[name] is None for name in platforms):
            entry["holds"] = None
        else:
            signs = {np.sign(entry[name]["mean"]) for name in platforms}
            entry["holds"] = len(signs) == 1 and 0 not in signs
        rows.append(entry)
    spread = _spread({name: seed_changes(m) for name, m in measurements.items()})
    first = platforms[0]
    resolved = [row for row in rows if row[first] and row[first]["verdict"] != NOT_RESOLVED]
    return {
        "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": git_state()["commit"],
        "cpu": cpu_model(),
        "comparison": run.name,
        "tasks": list(run.tasks),
        "seeds": list(run.seeds),
        "baselines": list(run.baselines),
        "platforms": {
            name: {
                "description": PLATFORMS[name].description,
                "env": dict(PLATFORMS[name].env),
                "rerun": rerun is None or name in rerun,
                "commits": measurements[name].commits,
            }
            for name in platforms
        },
        "findings": rows,
        "summary": {
            "comparisons": len(rows),
            f"resolved on {first}": len(resolved),
            f"resolved on {first} that hold on every platform": sum(bool(row["holds"]) for row in resolved),
            "resolved on every platform": sum(
                all(row[name] and row[name]["verdict"] != NOT_RESOLVED for name in platforms) for row in rows
            ),
            "resolved pooled": sum(bool(row["pooled"]) and row["pooled"]["verdict"] != NOT_RESOLVED for row in rows),
        },
        "spread": spread,
    }


def _key(finding: Finding) -> tuple[str, str, str, str]:
    return (finding.block, finding.subject, finding.other, finding.column)


def _entry(finding: Finding) -> dict[str, Any]:
    interval = finding.interval
    return {
        "mean": interval.mean,
        "low": interval.low,
        "high": interval.high,
        "runs": interval.runs,
        "verdict": finding.verdict,
    }


def _spread(changes: Mapping[str, Mapping[tuple[str, str], Mapping[int, float]]]) -> dict[str, Any]:
    """How far a change of platform moves one seed's change from its start (the range over platforms, per method,
    column and seed), beside how far a change of seed moves it (the range over seeds, per platform): medians and
    maxima over all of them, in points."""
    platforms = list(changes)
    by_platform, by_seed = [], []
    for key in changes[platforms[0]]:
        seeds = sorted(set.intersection(*(set(changes[name].get(key, {})) for name in platforms)))
        for seed in seeds:
            values = [changes[name][key][seed] for name in platforms]
            by_platform.append(max(values) - min(values))
        for name in platforms:
            values = [changes[name][key][seed] for seed in seeds]
            if len(values) > 1:
                by_seed.append(max(values) - min(values))
    flips = sum(  # a seed's change of another sign on some platform
        1
        for key in changes[platforms[0]]
        for seed, value in changes[platforms[0]][key].items()
        if any(np.sign(changes[name].get(key, {}).get(seed, value)) != np.sign(value) for name in platforms[1:])
    )
    cells = sum(len(values) for values in changes[platforms[0]].values())
    return {
        "platform range": _stats(by_platform),
        "seed range": _stats(by_seed),
        "seed changes whose sign a platform flips": [flips, cells],
    }


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {"median": float(np.median(values)), "max": float(np.max(values)), "count": len(values)} if values else {}


# ------------------------------------------------------------------------------------------------ stated verdicts
# A verdict as the leaderboard's verdict lists and the docs word it (Finding.sentence): "<subject> is <verdict>
# <other> in <column>: <estimate> [<low>, <high>]".
STATED = re.compile(
    r"^- `?(?P<subject>[\w.()-]+)`? is (?P<verdict>above|below|better|worse) (?:than `?(?P<method>[\w.()-]+)`?|"
    r"(?P<other>its start|the frozen control)) in (?P<column>[^:]+): "
    r"(?P<interval>[+-][\d.]+ \[[+-][\d.]+, [+-][\d.]+\])",
    re.MULTILINE,
)


def stated_problems(text: str, studies: Sequence[Mapping[str, Any]], where: str) -> list[str]:
    """Every verdict ``text`` states (bullets worded as the verdict lists word them) that the platform studies do not
    back: not one of their comparisons, another verdict or interval on this machine's kernels, or not holding on
    every platform. Empty when each stated verdict is resolved here and holds everywhere. (A column names its task,
    so each comparison is in one study.)"""
    rows = {tuple(row["comparison"][1:]): row for study in studies for row in study["findings"]}  # subject, other, col
    problems = []
    for match in STATED.finditer(text):
        other = match["method"] or match["other"]
        row = rows.get((match["subject"], other, match["column"]))
        said = f"{where}: {match.group(0)[2:]}"
        if row is None:
            problems.append(f"{said}: not a comparison of the platform study")
            continue
        native = row[REFERENCE]
        scale, spec = (1.0, "+.3f") if row["comparison"][0] == "training reward" else (100.0, "+.1f")
        interval = f"{scale * native['mean']:{spec}} [{scale * native['low']:{spec}}, {scale * native['high']:{spec}}]"
        if native["verdict"] != match["verdict"] or interval != match["interval"]:
            problems.append(f"{said}: the study has {native['verdict']} {interval} on {REFERENCE}")
        elif row["holds"] is None:
            problems.append(f"{said}: not measured on every platform of the study")
        elif not row["holds"]:
            problems.append(f"{said}: does not hold on every platform of the study")
    return problems


# ------------------------------------------------------------------------------------------------ the report
def report(document: Mapping[str, Any]) -> str:
    platforms = list(document["platforms"])
    first = platforms[0]
    summary, spread = document["summary"], document["spread"]
    lines = [
        f"# Platform study: `{document['comparison']}`",
        "",
        f"Written by `{document['command']}` at commit {str(document['commit'])[:10]} on {document['cpu']}, "
        f"{document['measured']}. Tasks: {', '.join(document['tasks'])}; seeds: "
        f"{', '.join(map(str, document['seeds']))}; methods: {', '.join(document['baselines'])}.",
        "",
        "Platforms (each the whole comparison, every seed, in its own process):",
        "",
        *[
            f"- `{name}`: {info['description']}"
            + (f" (`{' '.join(f'{k}={v}' for k, v in info['env'].items())}`)" if info["env"] else "")
            + (
                ""
                if info.get("rerun", True)
                else f"; not run by this study: the comparison's records as they were, measured at commit(s) "
                f"{', '.join(info['commits'])}"
            )
            for name, info in document["platforms"].items()
        ],
        "",
        "## How far a platform moves a run",
        "",
        "Each method's change from its start (points), per column and seed: its range over the platforms (the same "
        "seed on other kernels), beside its range over the seeds (one platform).",
        "",
        "| range | median | largest | of |",
        "| --- | --- | --- | --- |",
        *[
            f"| over {what} | {spread[key]['median']:.1f} | {spread[key]['max']:.1f} | {spread[key]['count']} |"
            for what, key in (("platforms, one seed", "platform range"), ("seeds, one platform", "seed range"))
            if spread[key]
        ],
        "",
        f"A seed's change has another sign on some platform in {spread['seed changes whose sign a platform flips'][0]}"
        f" of {spread['seed changes whose sign a platform flips'][1]} (method, column, seed) cells.",
        "",
        "## Verdicts",
        "",
        f"{summary['comparisons']} comparisons over runs (each method against its start per column, against every "
        f"other method per task, against the frozen control per task). Resolved on `{first}`: "
        f"{summary[f'resolved on {first}']}, of which {summary[f'resolved on {first} that hold on every platform']} "
        f"hold (the estimate has that sign on every platform). Resolved on every platform: "
        f"{summary['resolved on every platform']}; resolved with the platforms' runs pooled: "
        f"{summary['resolved pooled']}.",
        "",
        "Every comparison resolved on some platform or pooled (estimate [95% interval over runs] and verdict; "
        "points, rewards for the control; holds n/a: not measured on every platform):",
        "",
    ]
    table = []
    for row in document["findings"]:
        shown = [row[name] for name in platforms] + [row["pooled"]]
        if not any(entry and entry["verdict"] != NOT_RESOLVED for entry in shown):
            continue
        block, subject, other, column = row["comparison"]
        scale, spec = (1.0, "+.3f") if block == "training reward" else (100.0, "+.1f")
        what = f"{subject} vs {'its start' if other == START else other} ({column})"
        table.append(
            {"comparison": what}
            | {name: _cell(row[name], scale, spec) for name in platforms}
            | {"pooled": _cell(row["pooled"], scale, spec), "holds": HOLDS[row["holds"]]}
        )
    lines.append(markdown_table(pd.DataFrame(table)) if table else "none\n")
    return "\n".join(lines)


HOLDS = {True: "yes", False: "NO", None: "n/a"}


def _cell(entry: Mapping[str, Any] | None, scale: float, spec: str) -> str:
    if entry is None:
        return "–"
    low, high = scale * entry["low"], scale * entry["high"]
    return f"{scale * entry['mean']:{spec}} [{low:{spec}}, {high:{spec}}] {entry['verdict']}"
