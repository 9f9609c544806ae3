"""Grading throughput on MATH500 answers: one answer at a time (how the trainer graded) vs one batch on the pool.

Not a test. math-verify runs in a pool of worker processes (two by default); graded one after another, all
workers but one are idle. ``grade_many`` / ``reward_many`` submit the whole batch. The script reports samples/s
of both, measured in the same process on the same answers, and checks that they give identical results.

Answers: the repository has no MATH500 model completions (``results/`` holds Sudoku samples only), so each of
the first ``--answers`` MATH500 test problems gets its worked solution written as a d1 completion (reasoning,
then ``<answer>\\boxed{..}</answer>``): with its own final answer for every third problem and the next problem's
answer otherwise, about the accuracy of a 7-8B model. Wrong answers are the slower case for math-verify.

Method: fixed thread counts (one BLAS/OpenMP thread per process, ``--workers`` math-verify workers), fresh
started workers before every timed call (their caches would otherwise remember the answers of earlier rounds),
``--rounds`` rounds that alternate the order of the variants (ABBA), medians, and the load average before and
after; a shared machine makes single rounds noisy.

    python benchmarks/bench_grading.py --answers 200 --rounds 6
"""

from __future__ import annotations

import os

# Before numpy (imported with the tasks, also in each worker) starts its thread pools.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import argparse  # noqa: E402  (the environment above must be set first)
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, NamedTuple  # noqa: E402

from stabledrl_bench.tasks.graders import mathverify  # noqa: E402
from stabledrl_bench.tasks.graders.isolation import shared_pool  # noqa: E402
from stabledrl_bench.tasks.math500 import Math500Task  # noqa: E402


def math500_answers(task: Math500Task, n: int) -> tuple[list[str], list[dict[str, Any]]]:
    """``n`` completions and their docs: the gold answer for every third problem, the next problem's otherwise."""
    docs = task.load("test", n)
    completions = []
    for i, doc in enumerate(docs):
        source = doc if i % 3 == 0 else {**doc, "answer": docs[(i + 1) % n]["answer"]}
        completions.append(task.target_completion(source, "d1"))
    return completions, docs


def fresh_workers(size: int) -> None:
    """Replace the math-verify workers by new, started ones: every timed call starts from the same state.

    Why: sympy and math-verify cache what they have parsed, so a worker that has seen these answers in an
    earlier round checks them several times faster than a trainer, which grades new completions every step.
    """
    shared_pool(mathverify.__name__).close()
    shared_pool(mathverify.__name__, size=size).wait_until_ready()


def workers_cpu_s() -> float:
    """CPU seconds used so far by this process's live child processes (the math-verify workers); Linux only.

    Why: divided by the wall time it says how many cores the workers got. On a machine whose cores are busy
    with other work, two workers may get no more CPU than one, and the batch can then not be faster.
    """
    total, tick, me = 0.0, os.sysconf("SC_CLK_TCK"), os.getpid()
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may contain spaces
        if len(fields) > 12 and int(fields[1]) == me:  # ppid; then utime and stime in clock ticks
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


class Measured(NamedTuple):
    seconds: list[float]
    cores: list[float]  # worker CPU seconds per wall second, per call
    output: Any


def interleaved(variants: dict[str, Callable[[], Any]], rounds: int, workers: int) -> dict[str, Measured]:
    """Each variant ``rounds`` times, the order reversed every other round, on fresh workers (start-up untimed)."""
    measured = {name: Measured([], [], None) for name in variants}
    for r in range(rounds):
        for name in list(variants)[:: 1 if r % 2 == 0 else -1]:
            fresh_workers(workers)
            cpu, start = workers_cpu_s(), time.perf_counter()
            output = variants[name]()
            seconds = time.perf_counter() - start
            measured[name].seconds.append(seconds)
            measured[name].cores.append((workers_cpu_s() - cpu) / seconds)
            measured[name] = measured[name]._replace(output=output)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=200, help="MATH500 answers per round (at most 500)")
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds of each variant")
    parser.add_argument("--workers", type=int, default=2, help="math-verify worker processes")
    args = parser.parse_args()

    task = Math500Task()
    completions, docs = math500_answers(task, args.answers)
    pairs = list(zip(completions, docs, strict=True))
    compared = {
        "grade": {
            "one by one": lambda: [task.grade(c, d) for c, d in pairs],
            "batch": lambda: task.grade_many(completions, docs),
        },
        "StableDRL reward": {
            "one by one": lambda: [task.reward(c, d, "stabledrl") for c, d in pairs],
            "batch": lambda: task.reward_many(completions, docs, "stabledrl"),
        },
    }
    load_before = os.getloadavg()
    print(
        f"{len(pairs)} MATH500 answers, {args.workers} math-verify workers, {os.cpu_count()} CPUs, "
        f"{args.rounds} interleaved rounds (medians); load average before {load_before[0]:.2f}"
    )
    print(f"{'':17s} {'samples/s':>20s} {'':6s} {'worker cores':>14s}")
    print(f"{'what':17s} {'one by one':>10s} {'batch':>9s} {'ratio':>6s} {'one':>6s} {'batch':>7s}  round ratios  same")
    summary = {}
    for what, variants in compared.items():
        runs = interleaved(variants, args.rounds, args.workers)
        one, batch = runs["one by one"], runs["batch"]
        rate_one, rate_batch = (
            len(pairs) / statistics.median(one.seconds),
            len(pairs) / statistics.median(batch.seconds),
        )
        cores_one, cores_batch = statistics.median(one.cores), statistics.median(batch.cores)
        ratios = " ".join(f"{a / b:.2f}" for a, b in zip(one.seconds, batch.seconds, strict=True))
        same = one.output == batch.output
        print(
            f"{what:17s} {rate_one:10.1f} {rate_batch:9.1f} {rate_batch / rate_one:5.2f}x {cores_one:6.2f} "
            f"{cores_batch:7.2f}  {ratios}  {same}"
        )
        summary[what] = {
            "one_by_one_per_s": round(rate_one, 2),
            "batch_per_s": round(rate_batch, 2),
            "ratio": round(rate_batch / rate_one, 3),
            "worker_cores": [round(cores_one, 2), round(cores_batch, 2)],
            "same_results": same,
        }
    load_after = os.getloadavg()
    print(f"load average after {load_after[0]:.2f} (1 min), {load_after[1]:.2f} (5 min)")
    record = {"answers": len(pairs), "workers": args.workers, "cpus": os.cpu_count(), **summary}
    print(json.dumps({**record, "load_before": load_before, "load_after": load_after}))


if __name__ == "__main__":
    main()
