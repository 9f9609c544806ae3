"""Where the test suite's time goes: CPU seconds per test module, not only wall seconds.

pytest's ``--durations`` lists wall time, which under ``-n auto`` says little: a test that starts processes of its
own (a launch, ``reproduce`` workers, the grader pool) shares the cores with the other pytest worker, and a wait
looks like work. With both cores busy almost throughout, the suite's time is about its CPU seconds over the cores,
so that is what this measures: the README's test command, with a plugin (this file) that records each test's wall
time, its worker's CPU time and the CPU time of the processes it waited for.

    python benchmarks/bench_suite.py --out benchmarks/reports/suite.md   # the whole suite, about 10 minutes here

Run it on an idle machine: the report records the load average before and after. ``--platform avx2`` runs the suite
under another CPU's kernels, forced as the platform study forces them (``platforms --help``): what the suite costs
and whether it passes where CI's AVX2 machines run it, as far as one machine can tell (their clock and caches are
not emulated).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
ROWS_ENV = "STABLEDRL_SUITE_ROWS"  # the folder each pytest worker writes its rows into


# ------------------------------------------------------------------------------------------------ the pytest plugin
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    """Around each test's setup, call and teardown: one row into this worker's file."""
    del nextitem
    start, before = time.monotonic(), os.times()
    yield
    after = os.times()
    row = {
        "test": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "wall": time.monotonic() - start,
        "self": after.user - before.user + after.system - before.system,
        "children": after.children_user - before.children_user + after.children_system - before.children_system,
    }
    with open(Path(os.environ[ROWS_ENV]) / f"{row['worker']}.jsonl", "a") as out:
        out.write(json.dumps(row) + "\n")


# ------------------------------------------------------------------------------------------------ the benchmark
def run_suite(rows: Path, forced: dict[str, str]) -> tuple[float, str]:
    """The README's test command with this file as a plugin, under the kernels ``forced`` names (none: this
    machine's); its wall time and last output line."""
    from stabledrl_bench.reporting.provenance import forced_environment

    env = {**forced_environment(forced), ROWS_ENV: str(rows), "PYTHONPATH": str(REPO / "benchmarks")}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "bench_suite", "-p", "no:cacheprovider"]
    start = time.monotonic()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    if done.returncode != 0:
        failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        raise SystemExit("\n".join([*failed, f"the suite failed ({last}); nothing written"]))
    return wall, last


def summary(rows: list[dict[str, Any]], wall: float, last: str) -> dict[str, Any]:
    cpu, per_worker = collections.Counter(), collections.Counter()
    for row in rows:
        cpu[row["test"].split("::")[0]] += row["self"] + row["children"]
        per_worker[row["worker"]] += row["wall"]
    slowest = sorted(rows, key=lambda row: -(row["self"] + row["children"]))[:15]
    return {
        "wall_s": round(wall, 1),
        "result": last,
        "cpu_s": round(sum(cpu.values()), 1),
        "workers_wall_s": {worker: round(seconds, 1) for worker, seconds in sorted(per_worker.items())},
        "modules": [{"module": m, "cpu_s": round(s, 1)} for m, s in cpu.most_common()],
        "tests": [
            {"test": row["test"], "cpu_s": round(row["self"] + row["children"], 1), "wall_s": round(row["wall"], 1)}
            for row in slowest
        ],
    }


def report(document: dict[str, Any]) -> str:
    meta = document["measured"]
    forced = f", under {meta['platform']}" if meta.get("platform") else ""
    lines = [
        "# The test suite's time, by CPU seconds",
        "",
        f"`{meta['command']}` -- the README's test command with a plugin that records each test's CPU seconds "
        "(its pytest worker's and those of the processes it waited for).",
        "",
        f"Measured {meta['date']} at commit {meta['commit']} on {meta['machine']} ({meta['cores']} cores){forced}; "
        f"load average before {meta['load_before']}, after {meta['load_after']}.",
        "",
        f"- result: {document['result']}",
        f"- wall time of the command: {document['wall_s']:.0f} s; the tests' CPU time: {document['cpu_s']:.0f} s "
        f"(over {meta['cores']} cores: at least {document['cpu_s'] / meta['cores']:.0f} s of wall time)",
        "- each pytest worker's tests, wall time: "
        + ", ".join(f"{w} {s:.0f} s" for w, s in document["workers_wall_s"].items()),
        "",
        "| module | CPU s | share |",
        "|---|---:|---:|",
    ]
    for module in document["modules"][:15]:
        lines.append(f"| `{module['module']}` | {module['cpu_s']:.0f} | {module['cpu_s'] / document['cpu_s']:.0%} |")
    lines += ["", "The 15 tests with the most CPU seconds:", "", "| test | CPU s | wall s |", "|---|---:|---:|"]
    lines += [f"| `{t['test']}` | {t['cpu_s']:.1f} | {t['wall_s']:.1f} |" for t in document["tests"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    from stabledrl_bench.experiments.platforms import PLATFORMS, REFERENCE
    from stabledrl_bench.reporting.provenance import cpu_numerics, git_state

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the report here (and its JSON beside it)")
    parser.add_argument(
        "--platform",
        choices=[name for name in PLATFORMS if name != REFERENCE],
        help="run the suite under this emulated platform's kernels (default: this machine's)",
    )
    args = parser.parse_args()
    emulated = PLATFORMS[args.platform] if args.platform else None
    forced = {"platform": f"`{emulated.name}`'s kernels, emulated ({emulated.description})"} if emulated else {}

    git = git_state()  # the tree the suite runs, taken before it runs
    commit = (git["commit"] or "unknown")[:7] + (" (with uncommitted changes)" if git["dirty"] else "")
    load_before = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="suite-rows-") as tmp:
        wall, last = run_suite(Path(tmp), dict(emulated.env) if emulated else {})
        rows = [json.loads(line) for path in Path(tmp).glob("*.jsonl") for line in path.read_text().splitlines()]
    document = summary(rows, wall, last)
    document["measured"] = {
        "command": "python -m pytest -q",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "machine": "{cpu} ({capability}), ".format(**cpu_numerics()) + platform.machine(),
        "cores": os.cpu_count(),
        **forced,
        "load_before": load_before,
        "load_after": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    text = report(document)
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
