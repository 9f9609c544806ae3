"""How long the command line takes to answer commands that do no work: ``--help``, ``list``, ``stress --help``.

Not a test. Each command runs in a fresh interpreter, interleaved with the others ``--repeats`` times, so a load
change on a shared machine hits every command alike; the table gives the median wall and CPU seconds (the CPU time
is what an idle machine's wall time would be, about) and the heavy libraries the command imported. What makes a
command slow is an import: ``python -X importtime -m stabledrl_bench <command>`` shows which.

    python benchmarks/bench_startup.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

COMMANDS = (["--help"], ["list", "baselines"], ["list", "tasks"], ["stress", "--help"], ["check-model", "--help"])
HEAVY = ("torch", "transformers", "pandas", "matplotlib", "datasets", "accelerate", "sympy", "lm_eval")

# Runs one command inside the child and reports its CPU seconds and heavy imports (stdout goes to a buffer).
CHILD = """
import contextlib, io, json, resource, sys
argv = json.loads(sys.argv[1])
from stabledrl_bench.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(argv)
    except SystemExit:
        pass
usage = resource.getrusage(resource.RUSAGE_SELF)
heavy = [name for name in json.loads(sys.argv[2]) if name in sys.modules]
print(json.dumps({"cpu": usage.ru_utime + usage.ru_stime, "heavy": heavy}))
"""


def run_once(argv: list[str]) -> tuple[float, float, list[str]]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(argv), json.dumps(HEAVY)], capture_output=True, text=True, check=True
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return time.perf_counter() - start, report["cpu"], report["heavy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each command, interleaved (default 3)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    times: dict[str, list[tuple[float, float]]] = {}
    heavy: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for argv in COMMANDS:
            wall, cpu, imported = run_once(argv)
            times.setdefault(" ".join(argv), []).append((wall, cpu))
            heavy[" ".join(argv)] = imported
    print(f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; median of {args.repeats} runs")
    print(f"{'command':22s} {'wall s':>7s} {'cpu s':>7s}  heavy imports")
    for name, runs in times.items():
        wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
        print(f"{name:22s} {wall:7.2f} {cpu:7.2f}  {', '.join(heavy[name]) or '-'}")


if __name__ == "__main__":
    main()
