"""The sandbox's throughput and its grading under load (docs/sandbox.md).

1. **Programs per second**: ``--programs`` small correct programs (a HumanEval-sized function and its asserts), run
   one at a time and then ``--concurrency`` at a time, alternating ``--repeats`` times; medians.
2. **Grading under load**: correct programs, each with its own expected output, interleaved with hostile ones (fork
   bombs, memory bombs, busy loops, huge outputs, programs that never exit) and run ``--concurrency`` at a time:
   every correct program must pass with exactly its output, every hostile one must fail.

    python benchmarks/bench_sandbox.py --out benchmarks/reports/sandbox

Run on an otherwise idle machine; the report records the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stabledrl_bench.reporting.provenance import cpu_model
from stabledrl_bench.tasks.graders.sandbox import Limits, run_program

PROGRAM = """
def running_max(numbers):
    best, out = None, []
    for n in numbers:
        best = n if best is None or n > best else best
        out.append(best)
    return out

assert running_max([3, 1, 4, 1, 5]) == [3, 3, 4, 4, 5]
assert running_max([]) == []
print(sum(running_max(list(range({i})))))
"""
HOSTILE = {
    "fork bomb": "import os\nwhile True: os.fork()",
    "memory bomb": "x = bytearray(8 << 30)",
    "busy loop": "while True: pass",
    "huge output": "while True: print('x' * 4096)",
    "never exits": "import time\ntime.sleep(10**6)",
}
LIMITS = Limits(cpu_seconds=2, wall_seconds=3.0)


def throughput(count: int, concurrency: int) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        outcomes = list(pool.map(lambda i: run_program(PROGRAM.format(i=i)), range(count)))
    seconds = time.perf_counter() - start
    assert all(outcome.passed for outcome in outcomes)
    return count / seconds


def under_load(correct: int, concurrency: int) -> dict[str, object]:
    jobs = []
    names = list(HOSTILE)
    for i in range(correct):
        jobs.append((PROGRAM.format(i=i), f"{sum(range(i)) if i else 0}\n", None))
        name = names[i % len(names)]
        jobs.append((HOSTILE[name], None, name))
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        outcomes = list(pool.map(lambda job: run_program(job[0], limits=LIMITS), jobs))
    wrong = [
        (name or "correct", outcome.status)
        for (_, expected, name), outcome in zip(jobs, outcomes, strict=True)
        if (expected is not None and not (outcome.passed and outcome.stdout == expected))
        or (expected is None and outcome.passed)
    ]
    statuses: dict[str, list[str]] = {}
    for (_, _, name), outcome in zip(jobs, outcomes, strict=True):
        statuses.setdefault(name or "correct", []).append(outcome.status)
    return {
        "programs": len(jobs),
        "seconds": time.perf_counter() - start,
        "wrong": wrong,
        "statuses": {name: sorted(set(found)) for name, found in statuses.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="write <out>.json and <out>.md")
    args = parser.parse_args()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rates: dict[str, list[float]] = {"1 at a time": [], f"{args.concurrency} at a time": []}
    for _ in range(args.repeats):
        rates["1 at a time"].append(throughput(args.programs, 1))
        rates[f"{args.concurrency} at a time"].append(throughput(args.programs, args.concurrency))
    load = under_load(24, args.concurrency)
    document = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "uid": os.geteuid(),
        "programs": args.programs,
        "rates": rates,
        "under_load": load,
        "load_before": load_before,
        "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    lines = [
        "# The sandbox: throughput and grading under load",
        "",
        f"Written by `benchmarks/bench_sandbox.py` on {document['date']}, {document['cpu']} "
        f"({document['cores']} cores), as uid {document['uid']}; load average before {load_before}, after "
        f"{document['load_after']}.",
        "",
        f"| programs run | programs per second (median of {args.repeats}) | each |",
        "| --- | --- | --- |",
        *[
            f"| {name} | {statistics.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |"
            for name, values in rates.items()
        ],
        "",
        f"Under load: {load['programs']} programs, {args.concurrency} at a time, correct ones interleaved with "
        f"hostile ones, in {load['seconds']:.1f} s; wrongly graded: {len(load['wrong'])}"
        + (f" ({load['wrong']})" if load["wrong"] else "")
        + ". How each kind ended: "
        + "; ".join(f"{name}: {', '.join(found)}" for name, found in load["statuses"].items())
        + ".",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).with_suffix(".json").write_text(json.dumps(document, indent=1) + "\n")
        Path(args.out).with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
