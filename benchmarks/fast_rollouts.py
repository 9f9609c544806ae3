"""Fast rollouts judged by what they do to learning: one comparison trained twice, with exact rollouts and with
Fast-dLLM's (dual cache, confidence threshold 0.9, EOS stop), on the same seeds, warm starts and budget.

Why: on a GPU the rollout is most of an RL step, and fast decoding is the largest speed lever users have, but d1's
authors report that Fast-dLLM-style decoding inside online RL was unstable because the logits became overconfident
(d1 issues 11 and 25). A fast rollout changes only which tokens are sampled (the estimators still score them under
the old policy), so the question is empirical: does a method learn the same thing from them?

    python benchmarks/fast_rollouts.py --run --seeds 0,1,2,3,4 --out benchmarks/reports/fast_rollouts

``--run`` first runs ``reproduce table1 --preset tiny`` and ``--preset tiny-fast`` (the same preset with
``budget.rollout_decode: fast``; finished stages are reused, and the fast comparison starts from the exact one's warm
starts, copied, since their settings are the same). Then, per method and test length, the report gives

* each mode's change from its start over runs (the leaderboard's run-level intervals and verdicts) and the
  difference fast - exact, paired by seed and test item: a verdict "fast rollouts change what is learned" is
  stated only where that interval excludes 0;
* from the runs' logs, medians over the seeds: the training reward at the end, the KL to the reference, the
  importance-ratio statistics (variance, largest ratio, fraction clipped) and the drift, the quantities through
  which an overconfident sampler would show;
* the step time of each mode in the same runs (median seconds per optimizer step) and the speed-up;
* a PNG of the training reward curves, each mode's mean over the seeds.

Records go to the usual results folder (the leaderboard shows the fast comparison as its own block).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.errors import UserError, comma_list
from stabledrl_bench.experiments.comparison import TABLE_BASELINES
from stabledrl_bench.reporting.curves import plot_runs
from stabledrl_bench.reporting.frame import check_consistency, records_frame
from stabledrl_bench.reporting.leaderboard import Block, measured_blocks
from stabledrl_bench.reporting.markdown import markdown_rows
from stabledrl_bench.reporting.measured import MeasuredRow, run_change, starting_points
from stabledrl_bench.reporting.provenance import cpu_model, git_state
from stabledrl_bench.reporting.results import load_results
from stabledrl_bench.reporting.runlevel import MIN_RUNS, RunInterval
from stabledrl_bench.training.runlog import read_log

# What the logs are summarised by: (log field, how the steps of one run are reduced, label).
LOG_STATISTICS = (
    ("kl", "mean", "KL to the reference, mean over steps"),
    ("ratio_var", "mean", "variance of the importance ratios, mean over steps"),
    ("ratio_max", "max", "largest importance ratio"),
    ("clip_ratio", "mean", "fraction clipped, mean over steps"),
    ("drift", "mean", "mean |log ratio| between the policy and the rollout policy, mean over steps"),
)
FINAL_STEPS = 10  # the training reward "at the end": the mean of the last rollout steps' rewards


def _reproduce(args: argparse.Namespace, preset: str) -> None:
    command = [
        sys.executable,
        "-m",
        "stabledrl_bench",
        "reproduce",
        args.table,
        "--preset",
        preset,
        "--tasks",
        ",".join(args.tasks),
        "--seeds",
        ",".join(map(str, args.seeds)),
        "--baselines",
        ",".join(args.baselines),
        "--runs",
        str(args.runs),
        "--results",
        str(args.results),
        "--leaderboard",
        str(args.runs / "fast_rollouts_leaderboard.md"),
    ]
    if args.workers:
        command += ["--workers", str(args.workers)]
    print("+ " + " ".join(command), flush=True)
    if subprocess.run(command, check=False).returncode:
        raise SystemExit(f"error: reproduce --preset {preset} failed")


def share_warm_starts(runs: Path, exact: str, fast: str, tasks: Sequence[str], seeds: Sequence[int]) -> list[Path]:
    """Copy each finished warm start of the exact comparison to the fast one's folder where it has none yet: the
    two presets' warm starts have the same settings (``reproduce`` checks the copied spec and reuses it, or refuses
    it in one line if they differ), so building them twice would only cost time. Returns the folders copied."""
    copied = []
    for task in tasks:
        for seed in seeds:
            source = runs / exact / task / f"s{seed}" / "sft"
            target = runs / fast / task / f"s{seed}" / "sft"
            if (source / "warm_start.json").is_file() and not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(source, target)
                copied.append(target)
    return copied


def log_statistics(log: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """One run's log reduced to :data:`LOG_STATISTICS`, the first and the final training reward, whether any rollout
    earned a reward (``rewarded``: 1 or 0; a run whose rollouts never do has all-zero advantages and learns nothing,
    so its KL and ratio statistics stay at their no-update values) and the median step time."""
    out: dict[str, float] = {}
    for key, how, _ in LOG_STATISTICS:
        values = [float(r[key]) for r in log if isinstance(r.get(key), int | float)]
        if values:
            out[key] = max(values) if how == "max" else float(np.mean(values))
    rewards = [float(r["reward_mean"]) for r in log if "reward_std" in r]  # rollout steps only
    if rewards:
        out["first_reward"] = rewards[0]
        out["final_reward"] = float(np.mean(rewards[-FINAL_STEPS:]))
        out["rewarded"] = float(max(rewards) > 0)
    seconds = [float(r["seconds"]) for r in log if isinstance(r.get("seconds"), int | float)]
    if seconds:
        out["seconds"] = statistics.median(seconds)
    return out


def run_logs(runs: Path, comparison: str, task: str, baseline: str, seeds: Sequence[int]) -> dict[int, list[dict]]:
    """The log of ``baseline``'s run on each seed that has one."""
    paths = {seed: runs / comparison / task / f"s{seed}" / baseline / "log.jsonl" for seed in seeds}
    return {seed: read_log(path) for seed, path in paths.items() if path.is_file()}


def run_speedup(exact: Mapping[str, float], fast: Mapping[str, float]) -> float | None:
    """One seed's exact / fast step time (:func:`log_statistics`' ``seconds``), None where either run lacks it."""
    return exact["seconds"] / fast["seconds"] if exact.get("seconds") and fast.get("seconds") else None


def mean_curve(logs: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, float]]:
    """The training reward at each rollout step, averaged over the runs that logged that step."""
    by_step: dict[int, list[float]] = {}
    for log in logs:
        for record in log:
            if "reward_std" in record:
                by_step.setdefault(int(record["step"]), []).append(float(record["reward_mean"]))
    return [{"step": step, "reward_mean": float(np.mean(values))} for step, values in sorted(by_step.items())]


def _final_row(block: Block, baseline: str) -> MeasuredRow | None:
    rows = [row for row in block.rows if row.info["Baseline"] == baseline and row.info["Checkpoint"] == "final"]
    return rows[0] if rows else None


def _interval(interval: RunInterval | None) -> dict[str, Any] | None:
    if interval is None:
        return None
    return {"estimate": interval.mean, "low": interval.low, "high": interval.high, "runs": interval.runs}


def analyse(
    results: Path,
    runs: Path,
    table: str,
    exact: str,
    fast: str,
    tasks: Sequence[str],
    seeds: Sequence[int],
    baselines: Sequence[str],
) -> dict[str, Any]:
    """Everything the report shows, as plain data (also written as JSON)."""
    names = {"exact": f"{table}-{exact}", "fast": f"{table}-{fast}"}
    records = [
        record
        for record in load_results(results)
        if record["comparison"] in names.values() and record["task"] in tasks and int(record["seed"]) in seeds
    ]
    if not records:
        raise UserError(f"{results}: no records of {' or '.join(names.values())} for these tasks and seeds")
    frame = records_frame(records)
    check_consistency(frame)
    blocks = {block.comparison: block for block in measured_blocks(table, frame, records) if not block.approximate}
    missing = [name for name in names.values() if name not in blocks]
    if missing:
        raise UserError(f"{results}: no greedy evaluations of {', '.join(missing)}; run with --run first")
    methods = []
    for baseline in baselines:
        rows = {mode: _final_row(blocks[name], baseline) for mode, name in names.items()}
        if None in rows.values():
            continue
        starts = {mode: starting_points(blocks[name].rows).get(rows[mode].protocols) for mode, name in names.items()}
        columns = []
        for column in blocks[names["exact"]].columns:  # the table's: those of the study's tasks have values
            changes = {
                **{
                    f"{mode} change": _interval(run_change(rows[mode], starts[mode], column))
                    for mode in names
                    if starts[mode] is not None
                },
                "fast - exact": _interval(run_change(rows["fast"], rows["exact"], column)),
            }
            if any(changes.values()):
                columns.append({"column": column.header, **changes})
        logs = {
            mode: {task: run_logs(runs, name, task, baseline, seeds) for task in tasks} for mode, name in names.items()
        }
        per_run = {
            mode: {
                f"{task} s{seed}": log_statistics(log)
                for task, by_seed in by_task.items()
                for seed, log in by_seed.items()
            }
            for mode, by_task in logs.items()
        }
        per_mode = {}
        for mode, by_run in per_run.items():
            stats = list(by_run.values())
            per_mode[mode] = {
                key: statistics.median(s[key] for s in stats if key in s)
                for key in ("final_reward", "seconds", *(k for k, _, _ in LOG_STATISTICS))
                if any(key in s for s in stats)
            } | {"runs": len(stats), "rewarded_runs": int(sum(s.get("rewarded", 0.0) for s in stats))}
        speedups = [
            ratio
            for run, exact in per_run["exact"].items()
            if (ratio := run_speedup(exact, per_run["fast"].get(run, {}))) is not None
        ]
        curves = {
            f"{baseline} {mode}": mean_curve([log for by_seed in by_task.values() for log in by_seed.values()])
            for mode, by_task in logs.items()
        }
        methods.append(
            {
                "baseline": baseline,
                "columns": columns,
                "logs": per_mode,
                "runs": per_run,
                "speedup": statistics.median(speedups) if speedups else None,
                "curves": curves,
            }
        )
    git = git_state()
    return {
        "table": table,
        "comparisons": names,
        "tasks": list(tasks),
        "seeds": list(seeds),
        "methods": methods,
        "machine": f"{cpu_model()} ({os.cpu_count()} cores)",
        "commit": f"{(git.get('commit') or 'unknown')[:7]}{' (dirty)' if git.get('dirty') else ''}",
        "load_average": list(os.getloadavg()),
    }


def _cell(entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return "-"
    resolved = entry["runs"] >= MIN_RUNS and (entry["low"] > 0 or entry["high"] < 0)
    text = f"{100 * entry['estimate']:+.1f} [{100 * entry['low']:+.1f}, {100 * entry['high']:+.1f}]"
    return text + ("" if resolved else " (not resolved)")


def _rewards(stats: Mapping[str, float]) -> str:
    if "final_reward" not in stats:
        return "-"
    return f"{stats['first_reward']:.2f} -> {stats['final_reward']:.2f}" + ("" if stats["rewarded"] else " (never)")


def report(document: Mapping[str, Any], plot: Path | None) -> str:
    """Markdown of :func:`analyse`'s document."""
    names = document["comparisons"]
    lines = [
        "# Fast rollouts judged by what they do to learning",
        "",
        f"Written by `benchmarks/fast_rollouts.py`: `{names['exact']}` (exact rollouts) against `{names['fast']}` "
        f"(Fast-dLLM rollouts: dual cache, threshold 0.9, EOS stop), tasks {', '.join(document['tasks'])}, seeds "
        f"{', '.join(map(str, document['seeds']))}. Changes are test points with the two-level interval over runs "
        '(seeds, then test items); a cell marked "not resolved" has an interval that includes 0 (always, with one '
        "run).",
        "",
        f"Machine: {document['machine']}; code at {document['commit']}; load average when the report was written: "
        + " / ".join(f"{x:.2f}" for x in document["load_average"])
        + ". Step times come from the runs themselves (two workers side by side, one thread each).",
        "",
        "## Test accuracy",
        "",
    ]
    rows = []
    for method in document["methods"]:
        for column in method["columns"]:
            rows.append(
                [
                    method["baseline"],
                    column["column"],
                    _cell(column.get("exact change")),
                    _cell(column.get("fast change")),
                    _cell(column["fast - exact"]),
                ]
            )
    lines.append(markdown_rows(["method", "column", "exact: change from start", "fast: change", "fast - exact"], rows))
    lines += ["", "## Training, from the runs' logs (medians over runs)", ""]
    keys = ("final_reward", *(key for key, _, _ in LOG_STATISTICS), "seconds")
    header = ["method", "mode", "runs", "rewarded runs", *keys, "speed-up (exact / fast seconds per step)"]
    rows = []
    for method in document["methods"]:
        logs = method["logs"]
        speed = "-" if method["speedup"] is None else f"{method['speedup']:.2f}"
        for mode in ("exact", "fast"):
            values = [f"{logs[mode][key]:.4g}" if key in logs[mode] else "-" for key in keys]
            counts = [logs[mode]["runs"], logs[mode]["rewarded_runs"]]
            rows.append([method["baseline"], mode, *counts, *values, speed if mode == "fast" else ""])
    lines.append(markdown_rows(header, rows))
    lines += [""] + [f"- `{key}`: {label}" for key, _, label in LOG_STATISTICS]
    lines.append("- `rewarded runs`: runs in which some rollout earned a reward (the others learned nothing)")
    lines.append(f"- `final_reward`: mean training reward of the last {FINAL_STEPS} rollout steps")
    lines.append("- `seconds`: median wall time of an optimizer step (rollout steps and reuse steps together)")
    lines.append("- speed-up: the median over runs of each run's exact / fast step time, paired by seed")
    lines += ["", "## Per run: training reward at the first and the last rollout steps, and step time", ""]
    rows = []
    for method in document["methods"]:
        for run, exact in method["runs"]["exact"].items():
            fast = method["runs"]["fast"].get(run, {})
            ratio = run_speedup(exact, fast)
            rows.append(
                [method["baseline"], run]
                + [_rewards(stats) for stats in (exact, fast)]
                + [f"{stats['seconds']:.3g}" if "seconds" in stats else "-" for stats in (exact, fast)]
                + ["-" if ratio is None else f"{ratio:.2f}"]
            )
    header = ["method", "run", "exact: first -> last reward", "fast: first -> last reward"]
    lines.append(markdown_rows([*header, "exact s/step", "fast s/step", "speed-up"], rows))
    if plot is not None:
        lines += ["", f"![training reward, exact and fast rollouts]({plot.name})"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default="table1")
    parser.add_argument("--exact-preset", default="tiny")
    parser.add_argument("--fast-preset", default="tiny-fast")
    parser.add_argument("--tasks", default="sudoku")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--baselines", default=",".join(TABLE_BASELINES))
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--results", type=Path, default=Path("runs/results"))
    parser.add_argument("--workers", type=int, default=0, help="reproduce --workers (default: reproduce's)")
    parser.add_argument("--run", action="store_true", help="run (or resume) both comparisons first")
    parser.add_argument("--out", required=True, help="report path without suffix (.md, .json and .png are written)")
    args = parser.parse_args()
    try:
        args.tasks, args.baselines = comma_list(args.tasks, "--tasks"), comma_list(args.baselines, "--baselines")
        args.seeds = comma_list(args.seeds, "--seeds", kind=int)
        if args.run:
            _reproduce(args, args.exact_preset)
            exact, fast = f"{args.table}-{args.exact_preset}", f"{args.table}-{args.fast_preset}"
            for folder in share_warm_starts(args.runs, exact, fast, args.tasks, args.seeds):
                print(f"  warm start shared: {folder}")
            _reproduce(args, args.fast_preset)
        document = analyse(
            args.results,
            args.runs,
            args.table,
            args.exact_preset,
            args.fast_preset,
            args.tasks,
            args.seeds,
            args.baselines,
        )
    except UserError as error:
        raise SystemExit(f"error: {error}") from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    curves = {label: curve for method in document["methods"] for label, curve in method["curves"].items()}
    plot = plot_runs(curves, out.with_suffix(".png"), window=5, title="training reward, mean over runs")
    atomic_write_text(out.with_suffix(".json"), json.dumps(document, indent=1))
    text = report(document, plot)
    atomic_write_text(out.with_suffix(".md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
