"""The peak memory of one RL step with LLaDA's vocabulary, before and after the chosen-token log-probabilities were
computed span by span (``stabledrl_bench/core/logprobs.py``).

    nice -n 10 python benchmarks/bench_memory.py --before 1582c18 --out benchmarks/reports/logits_memory

``bench_plan.py`` measures the plan on the char tokenizer's 105 entries, where the logits are negligible. Here the
model has LLaDA's 126,464 (its decoder blocks are one of ``bench_plan``'s sizes, the embedding and output head at
that vocabulary), and each side runs in a fresh process with one thread:

- *before*: the package at ``--before``, checked out into a temporary git worktree, installed from it (``pip
  install --target``, no dependencies) into a temporary folder and put first on ``PYTHONPATH`` (this script runs
  unchanged against it: it uses only what both versions have). An install and not the worktree itself: ``baselines/``,
  ``tasks/`` and ``configs/`` are imported as ``stabledrl_bench.baselines`` and so on, names that only an install
  maps; with the worktree alone they would come from this checkout's editable install;
- *after*: this checkout.

Each process builds the model from the same seed, draws random prompts and completions, and takes two optimizer
steps of GRPO's loss path as ``RLTrainer.optimizer_step`` takes it: the training estimator on the policy (forward
with gradients), the GRPO loss against rollout and reference estimates made beforehand without gradients, backward,
gradient clipping, AdamW. Torch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``: every tensor storage
made or freed, filed as parameter, gradient, optimizer state, activation or temporary) runs around the second step,
when AdamW's moments exist as in every later step; the report gives its peak by category and the loss and gradient
norm of both steps (the same on both sides: the change moves no number). The plan's logits row
(``experiments/plan.py``) is printed beside the measured difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "stabledrl_bench"  # what a side measures: the code under it
VOCAB = 126_464  # LLaDA-8B's vocabulary
CATEGORIES = ("PARAM", "GRAD", "OPT", "ACT", "TEMP")


# ------------------------------------------------------------------------------------------ one side (a process)
def measure(sizes: dict[str, int], rows: int, prompt: int, length: int, checkpointing: bool, bf16: bool) -> dict:
    """Two optimizer steps of GRPO's loss path on decoder blocks of ``sizes`` (a ``bench_plan.SIZES`` entry, passed
    by the driver: the package measured as 'before' may not have what bench_plan imports); the MemTracker peak of
    the second (module docstring)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    import stabledrl_bench
    from stabledrl_bench.core.baseline import LossInputs, build_baseline, training_estimator
    from stabledrl_bench.core.estimators import SequenceBatch
    from stabledrl_bench.core.models.backends import _wrap_tiny
    from stabledrl_bench.core.models.checkpointing import enable_activation_checkpointing
    from stabledrl_bench.core.models.tiny import TinyDLM, TinyDLMConfig
    from stabledrl_bench.core.models.tokenizer import build_char_tokenizer

    torch.set_num_threads(1)
    tokenizer = build_char_tokenizer()
    config = TinyDLMConfig(
        vocab_size=VOCAB,
        mask_token_id=tokenizer.mask_token_id,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **sizes,
    )
    torch.manual_seed(0)
    dlm = _wrap_tiny(TinyDLM(config), tokenizer, name="bench")
    if checkpointing:
        enable_activation_checkpointing(dlm.decoder_blocks())
    gen = torch.Generator().manual_seed(0)
    batch = SequenceBatch(
        prompt_ids=torch.randint(0, VOCAB, (rows, prompt), generator=gen),
        prompt_mask=torch.ones(rows, prompt, dtype=torch.bool),
        completion_ids=torch.randint(0, VOCAB, (rows, length), generator=gen),
        completion_mask=torch.ones(rows, length, dtype=torch.bool),
    )
    baseline = build_baseline("grpo")
    estimator = training_estimator(baseline, dlm)
    with torch.no_grad():
        fixed = estimator.evaluate(dlm, batch, estimator.draw(batch, gen))
    advantages = torch.randn(rows, generator=gen)
    params = [p for p in dlm.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)

    def step(after_backward: Callable[[], None] = lambda: None) -> tuple[float, float]:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # as accelerate's autocast in a bf16 run
            new = estimator.evaluate(dlm, batch, estimator.draw(batch, torch.Generator().manual_seed(1)))
        inputs = LossInputs(
            new=new,
            old=fixed,
            ref=fixed,
            advantages=advantages,
            completion_mask=batch.completion_mask,
            group_ids=torch.zeros(rows, dtype=torch.long),
        )
        loss, _ = baseline.loss(inputs)
        loss.backward()
        after_backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss), float(norm)

    def by_category() -> dict[str, int]:
        (peak,) = tracker.get_tracker_snapshot("peak").values()
        return {getattr(key, "name", str(key)): value for key, value in peak.items()}

    first = step()
    tracker = MemTracker()
    tracker.track_external(optimizer, dlm.model)
    passes: dict[str, int] = {}
    with tracker:
        second = step(lambda: passes.update(by_category()))
    return {
        "package": str(Path(stabledrl_bench.__file__).resolve().parent),
        "parameters": sum(p.numel() for p in params),
        "peak": by_category(),
        "peak_passes": passes,
        "loss": [first[0], second[0]],
        "grad_norm": [first[1], second[1]],
    }


# ------------------------------------------------------------------------------------------------ the driver
def run_side(package_root: Path, args: argparse.Namespace) -> dict:
    """``measure`` in a fresh process importing ``stabledrl_bench`` from ``package_root``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(package_root)}
    from bench_plan import SIZES

    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(SIZES[args.size][1])]
    cmd += [str(args.rows), str(args.prompt), str(args.length), str(args.checkpointing), str(args.bf16)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"error: the measurement under {package_root} failed:\n{proc.stderr[-3000:]}")
    record = json.loads(proc.stdout.splitlines()[-1])
    if Path(record["package"]) != (package_root / "stabledrl_bench").resolve():
        raise SystemExit(f"error: the measurement imported {record['package']}, not the one under {package_root}")
    return record


def planned_logits(args: argparse.Namespace) -> dict[str, float]:
    """The plan's logits row for this micro-batch (one estimator row per completion), as the plan counted it before
    the change (compute + 8 bytes per scored value) and now (``plan.logits_bytes``)."""
    from stabledrl_bench.experiments.plan import logits_bytes

    compute = 2 if args.bf16 else 4
    before = args.rows * args.length * VOCAB * (compute + 8)
    return {"before": before, "after": logits_bytes(args.rows, args.prompt + args.length, args.length, VOCAB, compute)}


def write_report(result: dict, out: str) -> str:
    """The markdown report of one before/after pair."""
    from bench_plan import when_line

    from stabledrl_bench.atomic import atomic_write_text

    args, before, after = result["args"], result["before"], result["after"]
    mib = 2**20
    compute = "the forward under bf16 autocast" if args["bf16"] else "float32 compute"
    checkpointing = "on" if args["checkpointing"] else "off"
    lines = [
        "# One RL step's peak memory with LLaDA's vocabulary, before and after chosen-token log-probs by spans",
        "",
        f"Written by `benchmarks/bench_memory.py`, measured {when_line(result['when'])}; one thread per process. "
        "Memory is counted by torch's `MemTracker` (tensor storages, not the allocator's pages), so it does not depend "
        "on the load.",
        "",
        f"Model: the LLaDA layout of `bench_plan.py`'s `{args['size']}` decoder blocks with LLaDA's vocabulary "
        f"({VOCAB:,} entries): {after['parameters']:,} parameters, float32, {compute}. One micro-batch of GRPO "
        f"(d1's one-step estimator): {args['rows']} completions of {args['length']} tokens after "
        f"{args['prompt']}-token prompts, activation checkpointing {checkpointing}; the second of two optimizer "
        "steps (forward, backward, gradient clipping, AdamW). Before: the package at "
        f"`{result['before_rev']}` (installed from a git worktree, first on `PYTHONPATH`); after: this checkout at "
        f"`{result['after_rev']}`.",
        "",
    ]
    plan = result["planned_logits"]
    for key, what in (("peak", "the step's peak"), ("peak_passes", "the peak of its forward and backward passes")):
        lines += [
            f"| {what}, by category at that moment (MiB) | before | after | after - before |",
            "|---|---:|---:|---:|",
        ]
        for category in (*CATEGORIES, "Total"):
            b, a = before[key].get(category, 0), after[key].get(category, 0)
            lines.append(f"| {category} | {b / mib:.1f} | {a / mib:.1f} | {(a - b) / mib:+.1f} |")
        saved = before[key]["Total"] - after[key]["Total"]
        lines += [
            "",
            f"{what.capitalize()} falls by {saved / mib:.1f} MiB ({100 * saved / before[key]['Total']:.1f}%).",
            "",
        ]
    lines += [
        "The passes' peak is taken when the backward pass has ended, before gradient clipping and AdamW; where the "
        "step's peak is higher, it is the optimizer's (parameters, gradients, both moments and AdamW's temporaries) "
        "and the logits cannot move it. "
        f"The plan's logits row: {plan['before'] / mib:.1f} MiB before, {plan['after'] / mib:.1f} MiB now "
        f"({(plan['after'] - plan['before']) / mib:+.1f} MiB).",
        "",
        "| both steps | before | after |",
        "|---|---|---|",
        f"| loss | {before['loss']} | {after['loss']} |",
        f"| gradient norm | {before['grad_norm']} | {after['grad_norm']} |",
        "",
        "Same losses and gradient norms: "
        + ("yes, bitwise." if (before["loss"], before["grad_norm"]) == (after["loss"], after["grad_norm"]) else "NO.")
        + "",
    ]
    text = "\n".join(lines) + "\n"
    atomic_write_text(f"{out}.md", text)
    return text


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def main() -> int:
    from bench_plan import SIZES, when

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit to measure as 'before' (e.g. 1582c18)")
    parser.add_argument("--size", default="20M", choices=SIZES, help="bench_plan's decoder-block sizes (default 20M)")
    parser.add_argument("--rows", type=int, default=8, help="completions in the micro-batch")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    parser.add_argument("--length", type=int, default=128, help="completion tokens (the scored positions)")
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing on")
    parser.add_argument("--bf16", action="store_true", help="the forward under bf16 autocast (a bf16 run's logits)")
    parser.add_argument("--out", required=True, help="report path without suffix (.json and .md are written)")
    args = parser.parse_args()
    from stabledrl_bench.atomic import atomic_write_text

    with tempfile.TemporaryDirectory() as tmp:
        worktree, site = Path(tmp) / "before", Path(tmp) / "site"
        git("worktree", "add", "--detach", str(worktree), args.before)
        try:
            pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
            subprocess.run([*pip, "--target", str(site), str(worktree)], check=True, cwd=tmp)
            before = run_side(site, args)
        finally:
            git("worktree", "remove", "--force", str(worktree))
    after = run_side(REPO, args)
    result = {
        "args": vars(args),
        "before_rev": git("rev-parse", "--short", args.before),
        "after_rev": git("rev-parse", "--short", "HEAD")
        + ("+changes" if git("status", "--porcelain", PACKAGE) else ""),
        "before": before,
        "after": after,
        "planned_logits": planned_logits(args),
        "when": when(),
    }
    atomic_write_text(f"{args.out}.json", json.dumps(result, indent=1))
    print(write_report(result, args.out))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sizes, rows, prompt, length, on, bf16 = sys.argv[2:8]
        print(json.dumps(measure(json.loads(sizes), int(rows), int(prompt), int(length), on == "True", bf16 == "True")))
    else:
        sys.exit(main())
