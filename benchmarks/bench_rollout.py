"""The default rollout scheme against the sampler as it was before rollout schemes existed: time per rollout.

Not a test. Issue 53 asks that the rollout plug-in point cost the default rollout nothing measurable (within 2 %):
the trainer now draws every rollout through ``Independent().sample``, whose sampler also takes a step observer. The
"before" sampler is ``stabledrl_bench/core/sampling.py`` as it was at the commit before the observer was added
(``BEFORE``), read from git and loaded in this process beside today's, so both run the same model, inputs and thread
count. Variants alternate within every repeat, and the report gives medians and the load average. The recording
schemes (EGSPO's, AGRPO's, MDPO's) are timed too, as what a method pays for its records.

    python benchmarks/bench_rollout.py --repeats 15 --out benchmarks/reports/rollout_schemes
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
BEFORE = "8a3cdb8"  # the last commit whose sampler had no step observer (the next, 311b1eb, added it)
# The tiny preset's rollout: 3 prompts x 8 completions per micro-batch, 48 tokens in 24 steps, blocks of 8, T 0.9.
ROWS, PROMPT, CANVAS, STEPS, BLOCK, TEMPERATURE = 24, 64, 48, 24, 8, 0.9


def sampler_before() -> ModuleType:
    """``core/sampling.py`` at :data:`BEFORE`, loaded as a module of its own (its imports are today's package)."""
    source = subprocess.run(
        ["git", "show", f"{BEFORE}:stabledrl_bench/core/sampling.py"], cwd=REPO, capture_output=True, text=True
    )
    if source.returncode != 0:
        raise SystemExit(f"cannot read the sampler at {BEFORE}: {source.stderr.strip()}")
    spec = importlib.util.spec_from_loader("sampling_before_observer", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while they are built
    exec(compile(source.stdout, f"sampling.py@{BEFORE}", "exec"), module.__dict__)
    return module


def variants(dlm: Any, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Callable[[int], Any]]:
    """Each variant decodes the same batch with a generator seeded by the repeat: name -> fn(seed)."""
    from stabledrl_bench.core.rollouts import EntropySteps, Independent, StepPredictions, TokenEntropies
    from stabledrl_bench.core.sampling import FullDecode

    before = sampler_before()
    settings = FullDecode(max_completion_length=CANVAS, block_length=BLOCK, steps=STEPS, temperature=TEMPERATURE)
    old_settings = before.FullDecode(
        max_completion_length=CANVAS, block_length=BLOCK, steps=STEPS, temperature=TEMPERATURE
    )

    def scheme(kind: Any) -> Callable[[int], Any]:
        return lambda seed: kind.sample(dlm, ids, mask, settings, torch.Generator().manual_seed(seed)).completion_ids

    return {
        "sampler before the observer": lambda seed: (
            before.generate(dlm, ids, mask, old_settings, generator=torch.Generator().manual_seed(seed)).completion_ids
        ),
        "independent (the default scheme)": scheme(Independent()),
        "token_entropies (AGRPO's entropy rule)": scheme(TokenEntropies()),
        "entropy_steps (EGSPO)": scheme(EntropySteps(num_steps=8)),
        "step_predictions (MDPO)": scheme(StepPredictions(train_steps=8)),
    }


def measure(repeats: int) -> dict[str, Any]:
    from stabledrl_bench.core.models import build_tiny

    torch.set_num_threads(1)
    dlm = build_tiny()
    dlm.model.eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, dlm.vocab_size, (ROWS, PROMPT), generator=gen)
    mask = torch.ones_like(ids, dtype=torch.bool)
    runs = variants(dlm, ids, mask)
    times: dict[str, list[float]] = {name: [] for name in runs}
    outputs: dict[str, torch.Tensor] = {}
    load_before = os.getloadavg()
    with torch.no_grad():
        for name, fn in runs.items():  # one warm-up decode each, not counted
            outputs[name] = fn(0)
        for repeat in range(repeats):
            order = list(runs) if repeat % 2 == 0 else list(reversed(runs))  # alternate who goes first
            for name in order:
                start = time.perf_counter()
                runs[name](repeat + 1)
                times[name].append(time.perf_counter() - start)
    reference = outputs["sampler before the observer"]
    return {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(),
        "machine": f"{platform.machine()} {_cpu()} ({os.cpu_count()} cores), torch {torch.__version__}, 1 thread",
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "settings": {
            "rows": ROWS,
            "prompt": PROMPT,
            "canvas": CANVAS,
            "steps": STEPS,
            "block": BLOCK,
            "temperature": TEMPERATURE,
            "repeats": repeats,
            "before": BEFORE,
        },
        "seconds": times,
        "median": {name: statistics.median(values) for name, values in times.items()},
        "same_tokens": {name: bool(torch.equal(out, reference)) for name, out in outputs.items()},
    }


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True)
    return out.stdout.strip() + (" (dirty)" if dirty.stdout.strip() else "")


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def report(doc: dict[str, Any]) -> str:
    base = doc["median"]["sampler before the observer"]
    s = doc["settings"]
    lines = [
        "# The default rollout scheme against the sampler before rollout schemes",
        "",
        f"Written by `benchmarks/bench_rollout.py` on {doc['when']} at commit {doc['commit']}: {doc['machine']}; "
        f"load average {' / '.join(f'{x:.2f}' for x in doc['load_average']['before'])} before, "
        f"{' / '.join(f'{x:.2f}' for x in doc['load_average']['after'])} after. One micro-batch of the tiny preset's "
        f"rollout ({s['rows']} rows, {s['prompt']}-token prompts, {s['canvas']} tokens in {s['steps']} steps, blocks "
        f"of {s['block']}, temperature {s['temperature']}) on the built-in tiny model; medians of {s['repeats']} "
        f"decodes per variant, the variants alternating in every repeat (one warm-up each not counted). The "
        f"sampler before is `core/sampling.py` at {s['before']}, loaded in the same process.",
        "",
        "| variant | median (s) | / before | same tokens as before |",
        "| --- | ---: | ---: | --- |",
    ]
    for name, median in doc["median"].items():
        same = "yes" if doc["same_tokens"][name] else "no"
        lines.append(f"| {name} | {median:.4f} | {median / base:.3f} | {same} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", help="write OUT.md and OUT.json")
    args = parser.parse_args()
    doc = measure(args.repeats)
    text = report(doc)
    print(text, end="")
    if args.out:
        Path(f"{args.out}.md").write_text(text)
        Path(f"{args.out}.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
