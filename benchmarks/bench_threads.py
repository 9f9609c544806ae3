"""Threads and workers on a CPU: what ``reproduce``'s thread policy rests on, and what ``--workers`` buys.

1. **Load.** One stage of the tiny preset (``--steps`` steps of its Sudoku SFT warm start, 0.8M parameters) on an
   idle machine and with one other busy process beside it (a pure-Python loop that keeps one core busy), at one
   intra-op thread (the policy for a model this size) and at torch's default (every core: what ``reproduce`` ran at
   before the policy). The ratio busy / idle is the slow-down a user sees when something else runs.
2. **Size.** The same stage idle at one thread and at every core for larger tiny models (wider and deeper): where a
   second thread starts to pay, which sets ``SMALL_MODEL_PARAMETERS`` (``stabledrl_bench/processes.py``).
3. **The front door.** ``reproduce table1`` (the tiny preset's default: Sudoku, seed 0, five methods, the frozen
   control, 18 evaluations) into an empty runs folder, so no run or record is reused: at ``--workers 1`` and at the
   default (as many workers as the cores hold), wall time each and when the warm start, which runs alone, ended,
   and whether it was copied from the committed starts or trained (``--parts front-door``; ``--front-door-workers
   default`` measures only the default).

Every measurement runs in a fresh process (its thread count set before any work), the variants of a part alternate
``--repeats`` times, and the report gives medians, each run's time, and the load averages before and after. Run it
on an otherwise idle machine from a fresh clone (after the README's install):

    python benchmarks/bench_threads.py --parts load,size,front-door --out benchmarks/reports/threads_and_workers

The report's figures are ratios of runs made in the same invocation on the same machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BUSY = "while True: pass"
SIZES = {  # build_tiny overrides -> a model of about this many parameters
    "0.8M (the tiny preset)": {},
    "6M": {"hidden_size": 384, "num_hidden_layers": 4, "num_attention_heads": 6, "intermediate_size": 1024},
    "25M": {"hidden_size": 640, "num_hidden_layers": 6, "num_attention_heads": 10, "intermediate_size": 1792},
}


def one_stage(steps: int, threads: int, size: dict[str, Any]) -> dict[str, float]:
    """Seconds per step of the tiny preset's Sudoku warm start on a model of ``size`` (in this process): a run of one
    step, then a run of ``steps`` steps; their difference over ``steps - 1`` leaves out what a run spends outside
    its steps (building the model and the puzzles, saving). A first one-step run, not counted, pays what happens once
    per process (lazy initialisation of torch's kernels and allocator): counted, it made the tiny model's per-step
    time at two threads come out negative."""
    import torch

    torch.set_num_threads(threads)
    from stabledrl_bench.core.models import build_tiny, save_diffusion_lm
    from stabledrl_bench.experiments.presets import presets, warm_start_spec
    from stabledrl_bench.training.sft import run_sft

    spec = warm_start_spec(presets("table1")["tiny"], "sudoku", "tiny", 0).sft
    seconds = {}
    with tempfile.TemporaryDirectory() as tmp:
        dlm = build_tiny(**size)
        parameters = sum(p.numel() for p in dlm.model.parameters())
        save_diffusion_lm(dlm, Path(tmp) / "init")
        model = str(Path(tmp) / "init")
        for k, count in enumerate((1, 1, steps)):
            out = Path(tmp) / f"run{k}"
            config = dataclasses.replace(
                spec, model=model, max_steps=count, output_dir=str(out), save_every=0, progress=False
            )
            start = time.perf_counter()
            run_sft(config)
            seconds[count] = time.perf_counter() - start
    per_step = (seconds[steps] - seconds[1]) / (steps - 1)
    return {"seconds": seconds[steps], "per_step": per_step, "parameters": parameters, "threads": threads}


def _measure(steps: int, threads: int, size: str, busy: bool, pair: bool = False) -> dict[str, Any]:
    """One measurement in a fresh process, with a busy loop beside it (``busy``) or the same stage (``pair``: two
    workers; the first one's time is reported)."""
    loop = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
    command = [sys.executable, __file__, "--one", json.dumps({"steps": steps, "threads": threads, "size": size})]
    try:
        time.sleep(0.5 if busy else 0.0)
        twin = (
            subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO) if pair else None
        )
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=True)
        if twin is not None:
            twin.wait()
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def load_part(steps: int, repeats: int) -> dict[str, Any]:
    """Each variant: (threads, beside it). Beside: nothing (idle), a busy loop, or the same stage (two workers)."""
    variants = [(threads, beside) for threads in (1, _cores()) for beside in ("idle", "busy")] + [(1, "paired")]
    runs: dict[str, list[float]] = {f"{t} thread(s), {b}": [] for t, b in variants}
    for repeat in range(repeats):
        for threads, beside in variants:
            measured = _measure(steps, threads, "0.8M (the tiny preset)", beside == "busy", beside == "paired")
            runs[f"{threads} thread(s), {beside}"].append(measured["per_step"])
            print(f"load {repeat + 1}/{repeats}: {threads} thread(s), {beside}: {measured['per_step']:.3f} s/step")
    return runs


def size_part(steps: int, repeats: int) -> dict[str, Any]:
    runs: dict[str, dict[str, list[float]]] = {}
    parameters: dict[str, int] = {}
    for repeat in range(repeats):
        for size in SIZES:
            for threads in (1, _cores()):
                measured = _measure(steps, threads, size, False)
                runs.setdefault(size, {}).setdefault(f"{threads}", []).append(measured["per_step"])
                parameters[size] = int(measured["parameters"])
                print(f"size {repeat + 1}/{repeats}: {size} at {threads} thread(s): {measured['per_step']:.3f} s/step")
    return {"runs": runs, "parameters": parameters}


VARIANTS = {"1": ("--workers 1", ["--workers", "1"]), "default": ("default --workers", [])}
_SECOND_STAGE = re.compile(r"^\[stage 2/\d+ \| (?:(\d+)h)?(?:(\d+)m)?(\d+)?s? ?elapsed", re.MULTILINE)


def _elapsed(match: re.Match) -> float:
    hours, minutes, seconds = (int(group or 0) for group in match.groups())
    return 3600 * hours + 60 * minutes + seconds


def front_door(repeats: int, variants: list[str]) -> dict[str, Any]:
    """Wall time of each variant and, from its progress lines, when its second stage began: the warm start runs
    alone before it (every other stage needs it), so that is the part no number of workers shortens."""
    runs: dict[str, list[float]] = {VARIANTS[v][0]: [] for v in variants}
    warm_start: dict[str, list[float]] = {VARIANTS[v][0]: [] for v in variants}
    how: dict[str, list[str]] = {VARIANTS[v][0]: [] for v in variants}  # the start copied (results/starts) or trained
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for repeat in range(repeats):
        for name, extra in (VARIANTS[v] for v in variants):
            with tempfile.TemporaryDirectory(prefix="front-door-") as tmp:
                command = [sys.executable, "-m", "stabledrl_bench", "reproduce", "table1", "--runs", tmp, *extra]
                start = time.perf_counter()
                done = subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, text=True)
                runs[name].append(time.perf_counter() - start)
            second = _SECOND_STAGE.search(done.stdout)
            if second:
                warm_start[name].append(_elapsed(second))
            how[name].append("copied" if "warm start: copied from the committed start" in done.stdout else "trained")
            print(f"front door {repeat + 1}/{repeats}: {name}: {runs[name][-1]:.0f} s (warm start {how[name][-1]})")
    return {"runs": runs, "warm_start": warm_start, "start": how}


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _when(part: dict[str, Any]) -> str:
    meta = part["measured"]
    return (
        f"Measured {meta['date']} at commit {meta['commit']}, {meta['repeats']} interleaved repeats (medians), each "
        f"run in a fresh process; load average before {meta['load_before']}, after {meta['load_after']}."
    )


def report(document: dict[str, Any]) -> str:
    cores = document["cores"]
    lines = [
        "# Threads and workers on a CPU",
        "",
        f"Written by `benchmarks/bench_threads.py` on {document['machine']} ({cores} cores). Each part says when it "
        "was measured; every ratio compares runs of one invocation on one machine.",
        "",
    ]
    load = document.get("load")
    if load:
        runs = load["runs"]
        one_idle, one_busy = _median(runs["1 thread(s), idle"]), _median(runs["1 thread(s), busy"])
        all_idle, all_busy = _median(runs[f"{cores} thread(s), idle"]), _median(runs[f"{cores} thread(s), busy"])
        paired = _median(runs["1 thread(s), paired"])
        lines += [
            f"## One stage under load ({load['steps']} SFT steps of the tiny preset's Sudoku warm start, their time "
            "per step without what a run spends outside its steps)",
            "",
            _when(load),
            "",
            "| intra-op threads | idle (s/step) | one busy process beside it (s/step) | busy / idle |",
            "| --- | --- | --- | --- |",
            f"| 1 (the policy for the tiny model) | {one_idle:.3f} | {one_busy:.3f} | {one_busy / one_idle:.2f} |",
            f"| {cores} (torch's default, before the policy) | {all_idle:.3f} | {all_busy:.3f} | "
            f"{all_busy / all_idle:.2f} |",
            "",
            f"Idle, one thread takes {one_idle / all_idle:.2f} times the time of {cores}. Two one-thread stages side "
            f"by side (two workers) take {paired:.3f} s/step each: together they do {2 * all_idle / paired:.2f} times "
            f"the work of one {cores}-thread stage in the same time. Each run (s/step): "
            + "; ".join(f"{name}: {', '.join(f'{v:.3f}' for v in values)}" for name, values in runs.items()),
            "",
        ]
    size = document.get("size")
    if size:
        lines += [
            f"## Where a second thread pays (idle; {size['steps']} SFT steps per measurement, their time per step "
            "without what a run spends outside its steps)",
            "",
            _when(size),
            "",
            f"| model | parameters | 1 thread (s/step) | {cores} threads (s/step) | 1 / {cores} |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name, runs in size["runs"].items():
            one, every = _median(runs["1"]), _median(runs[str(cores)])
            lines.append(f"| {name} | {size['parameters'][name]:,} | {one:.3f} | {every:.3f} | {one / every:.2f} |")
        lines.append("")
    door = document.get("front_door")
    if door:
        lines += [
            "## `reproduce table1` into an empty runs folder (the tiny preset's default run)",
            "",
            _when(door),
            "",
            "| workers | wall time | each run (s) | the warm start, alone before every other stage (s; copied from "
            "results/starts or trained) |",
            "| --- | --- | --- | --- |",
        ]
        medians = {}
        for name, runs in door["runs"].items():
            medians[name] = _median(runs)
            label = "1" if name == "--workers 1" else f"default ({door['default_workers']})"
            starts = door.get("warm_start", {}).get(name) or []
            how = door.get("start", {}).get(name) or ["trained"] * len(runs)  # reports before starts were committed
            lines.append(
                f"| {label} | {medians[name]:.0f} s ({medians[name] / 60:.1f} min) | "
                f"{', '.join(f'{v:.0f}' for v in runs)} | "
                f"{', '.join(f'{v:.0f} ({h})' for v, h in zip(starts, how, strict=False)) or '?'} |"
            )
        lines.append("")
        if len(medians) == 2:
            lines += [
                f"The default workers take {medians['default --workers'] / medians['--workers 1']:.2f} of the "
                "time of one.",
                "",
            ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="SFT steps per measured stage (default 40)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--parts",
        default="load,size",
        help="comma-separated parts to measure: load, size, front-door (about 30 minutes); default load,size",
    )
    parser.add_argument("--front-door-repeats", type=int, default=1)
    parser.add_argument(
        "--front-door-workers",
        default="1,default",
        help="comma-separated --workers variants of the front door: 1, default (the machine's choice)",
    )
    parser.add_argument("--size-steps", type=int, default=6, help="SFT steps per measurement of the size part")
    parser.add_argument("--out", help="write <out>.json and <out>.md (parts measured before are kept)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a measurement, in its own process
    args = parser.parse_args()
    if args.one:
        spec = json.loads(args.one)
        print(json.dumps(one_stage(spec["steps"], spec["threads"], SIZES[spec["size"]])))
        return
    from stabledrl_bench.processes import threads_for
    from stabledrl_bench.reporting.provenance import cpu_model, git_state

    parts = set(args.parts.split(","))
    unknown = parts - {"load", "size", "front-door"}
    if unknown:
        parser.error(f"--parts: unknown {', '.join(sorted(unknown))}")
    earlier = Path(args.out).with_suffix(".json") if args.out else None
    document: dict[str, Any] = json.loads(earlier.read_text()) if earlier and earlier.is_file() else {}
    document |= {"machine": cpu_model() or platform.processor(), "cores": _cores()}

    def measured() -> dict[str, Any]:
        return {
            "date": time.strftime("%Y-%m-%d"),
            "commit": (git_state()["commit"] or "unknown")[:10],
            "repeats": args.repeats,
            "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        }

    if "load" in parts:
        meta = measured()
        document["load"] = {"runs": load_part(args.steps, args.repeats), "steps": args.steps, "measured": meta}
    if "size" in parts:
        meta = measured()
        found = size_part(args.size_steps, args.repeats)
        document["size"] = {**found, "steps": args.size_steps, "measured": meta}
    if "front-door" in parts:
        meta = {**measured(), "repeats": args.front_door_repeats}
        workers = max(1, _cores() // threads_for(830_848))
        document["front_door"] = {
            **front_door(args.front_door_repeats, args.front_door_workers.split(",")),
            "default_workers": workers,
            "measured": meta,
        }
    for name in ("load", "size", "front_door"):
        if name in document and "load_after" not in document[name]["measured"]:
            document[name]["measured"]["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    text = report(document)
    print(text)
    if args.out:
        Path(args.out).with_suffix(".json").write_text(json.dumps(document, indent=1) + "\n")
        Path(args.out).with_suffix(".md").write_text(text + "\n")


if __name__ == "__main__":
    main()
