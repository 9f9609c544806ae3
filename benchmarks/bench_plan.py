"""``check-model``'s plan against a measured RL step: memory per process by category, and FLOPs per step.

    nice -n 10 python benchmarks/bench_plan.py --sizes 20M 100M sdar-20M --out benchmarks/reports/plan_vs_measured

Not a test (``tests/test_bench_plan.py`` runs the smallest size and checks the agreement). For each model size and
launch config (``configs/accelerate/ddp.yaml``, ``fsdp.yaml``) it launches 2 CPU processes (gloo, 1 thread each)
that each build an :class:`~stabledrl_bench.training.trainer.RLTrainer` on a random-weight checkpoint of that size
and run one real rollout phase of GRPO (a rollout, then one optimizer step), once with activation checkpointing and
once without. Every process measures:

- memory, with torch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``: a ``TorchDispatchMode`` that sees
  every tensor storage created or freed in its context, and files it as parameter, gradient, optimizer state,
  activation (made in a forward pass or an activation-checkpointing recomputation) or temporary (made in the
  backward pass)). It runs around the optimizer step; the policy, its optimizer, the reference model and FSDP's
  rollout replica are registered with it beforehand. The peak is the largest live total during the step, split
  by category at that moment. The parameters of each module are counted apart (policy, reference, replica), from
  the tensors themselves.
- FLOPs, with ``torch.utils.flop_counter.FlopCounterMode`` around the whole phase (sampling, the rollout and
  reference estimates, the forward and backward of the step).

The plan is :func:`stabledrl_bench.experiments.plan.plan` on the same shape and budget, at the compute dtype the
step ran in (float32 here). The script writes a JSON record and a markdown report (hardware, torch version,
threads, date, load average) and prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.core.budget import Budget
from stabledrl_bench.core.models import build_tiny, load_diffusion_lm
from stabledrl_bench.core.models.convert import save_tiny_as
from stabledrl_bench.experiments.plan import (
    ACTIVATION_VALUES_OUTSIDE_BLOCKS,
    LOGITS_ROW,
    Method,
    Shape,
    phase_forwards,
    plan,
)
from stabledrl_bench.experiments.presets import presets
from stabledrl_bench.processes import process_state
from stabledrl_bench.reporting.provenance import cpu_model
from stabledrl_bench.training.config import TrainConfig
from stabledrl_bench.training.optim import OptimConfig
from stabledrl_bench.training.trainer import RLTrainer

REPO = Path(__file__).resolve().parents[1]
PROCESSES = 2
TOLERANCE = 0.15  # the agreement asked of the plan
BASELINE = "grpo"  # the plan's richest case: a reference model beside the policy
# name -> (family written, tiny-model sizes); the tiny model is LLaDA's architecture (tests/test_native_models.py)
SIZES: dict[str, tuple[str, dict[str, int]]] = {
    "quick": ("llada", {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 176}),
    "2M": ("llada", {"hidden_size": 192, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 512}),
    "20M": ("llada", {"hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8, "intermediate_size": 1376}),
    "100M": (
        "llada",
        {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16, "intermediate_size": 2816},
    ),
    "400M": (
        "llada",
        {"hidden_size": 1536, "num_hidden_layers": 14, "num_attention_heads": 16, "intermediate_size": 4096},
    ),
    "sdar-20M": (
        "sdar",
        {"hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8, "intermediate_size": 1376},
    ),
}
CONFIGS = ("ddp", "fsdp")


def budget() -> Budget:
    """One rollout phase of two optimizer steps (the second runs with AdamW's moments, as every later step does):
    1 prompt x 4 completions per process, on a canvas of 32 tokens."""
    return Budget(
        max_steps=2,
        prompts_per_step=PROCESSES,
        num_generations=4,
        num_iterations=2,
        max_completion_length=32,
        diffusion_steps=8,
        block_length=8,
        temperature=0.9,
        max_prompt_length=48,
    )


# ------------------------------------------------------------------------------------------ one process (launched)
def local_bytes(tensors) -> int:
    """Bytes this process holds of ``tensors`` (its shard of a DTensor)."""
    from torch.distributed.tensor import DTensor

    return sum((t.to_local() if isinstance(t, DTensor) else t).untyped_storage().nbytes() for t in tensors)


def measure(checkpoint: Path, out: Path, *, checkpointing: bool) -> dict:
    """One rollout phase of GRPO on this process: the memory of its second optimizer step, the FLOPs of the phase."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils.flop_counter import FlopCounterMode

    cfg = TrainConfig(
        baseline=BASELINE,
        task="countdown",
        model=str(checkpoint),
        protocol="tiny",
        train_split="generated",
        budget=budget(),
        optim=OptimConfig(learning_rate=1e-4, max_grad_norm=1.0),
        per_device_prompts=1,
        gradient_checkpointing=checkpointing,
        output_dir=str(out),
        progress=False,
        check_model=False,
    )
    trainer = RLTrainer(cfg)
    policy = trainer.train_dlm.model
    modules = {"policy": policy, "reference": trainer.ref_dlm.model if trainer.ref_dlm else None}
    modules["replica"] = trainer.replica.module if trainer.replica is not None else None
    flops = FlopCounterMode(display=False)
    with flops:
        micro_batches, _ = trainer.rollout()
        trainer.optimizer_step(micro_batches, 0)
        tracker = MemTracker()
        tracker.track_external(trainer.optimizer.optimizer, *(m for m in modules.values() if m is not None))
        with tracker:
            trainer.optimizer_step(micro_batches, 1)
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    stats = tracker.memory_tracking[policy]
    states = {state.name: [_named(next(iter(s.values()))) for s in snaps] for state, snaps in stats.snapshots.items()}
    rows = [(*mb.batch.prompt_ids.shape, mb.batch.completion_ids.shape[1]) for mb in micro_batches]
    return {
        "checkpointing": checkpointing,
        "peak": _named(peak),
        "states": states,
        "weights": {name: local_bytes(m.parameters()) if m is not None else 0 for name, m in modules.items()},
        "optimizer_state": local_bytes(
            t for state in trainer.optimizer.state.values() for t in state.values() if t.dim() > 0
        ),
        "ddp_buckets": _ddp_bucket_bytes(policy),
        "flops": flops.get_total_flops(),
        "rows": rows,
    }


def _named(snapshot: dict) -> dict[str, int]:
    return {getattr(key, "name", str(key)): value for key, value in snapshot.items()}


def _ddp_bucket_bytes(model) -> int:
    """Bytes of DDP's gradient buckets, allocated when the model is wrapped (before the tracker starts)."""
    data = model._get_ddp_logging_data() if hasattr(model, "_get_ddp_logging_data") else {}
    return sum(int(size) for size in str(data.get("bucket_sizes", "") or "0").split(", "))


def worker(checkpoint: Path, out: Path, settings: tuple[bool, ...] = (True, False)) -> None:
    """Each checkpointing setting on this process; each process writes its own record."""
    torch.set_num_threads(1)
    records = [measure(checkpoint, out / f"run-{on}", checkpointing=on) for on in settings]
    rank = process_state().process_index
    atomic_write_text(out / f"rank{rank}.json", json.dumps(records, indent=1))


# ------------------------------------------------------------------------------------------------ the driver
def write_checkpoint(size: str, folder: Path) -> Path:
    """A random-weight checkpoint of ``size`` in its family's published layout (native LLaDA or SDAR)."""
    family, sizes = SIZES[size]
    tiny = build_tiny(seed=0, attention="block" if family == "sdar" else "full", **sizes)
    return save_tiny_as(tiny, family, folder)


@functools.cache
def shape_of(size: str) -> Shape:
    """The plan's view of ``size``: the shape of its checkpoint, as ``check-model --model`` reads it."""
    with tempfile.TemporaryDirectory() as tmp:
        return Shape.of(load_diffusion_lm(write_checkpoint(size, Path(tmp) / size)))


def launched(config: str, checkpoint: Path, out: Path, settings: list[str]) -> list[list[dict]]:
    """Both processes' records of one launch under ``configs/accelerate/<config>.yaml``."""
    from stabledrl_bench.processes import launch_command

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [*launch_command(config), str(Path(__file__).resolve()), "--worker", str(checkpoint), str(out), *settings]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"error: {config} launch failed:\n{proc.stderr[-3000:]}")
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(PROCESSES)]


def predicted(shape: Shape, config: str, checkpointing: bool, tokens: int) -> dict:
    """The plan's rows for ``config`` at this budget (prompts of ``tokens`` tokens), in bytes, and its FLOPs."""
    preset = dataclasses.replace(
        presets("table1")["tiny"],
        budget=dataclasses.replace(budget(), max_prompt_length=tokens),
        per_device_prompts=1,
        bf16=False,
        gradient_checkpointing=checkpointing,
    )
    report = plan(shape, preset, processes=PROCESSES, baseline=BASELINE, tflops=1.0)
    rows = {name: value * 2**30 for name, value in report["memory per GPU (GiB)"][config].items()}
    method = Method.of(BASELINE, preset.budget, shape.attention)
    forwards = phase_forwards(preset.budget, method, recompute=checkpointing, block=shape.block)
    per_process = preset.budget.completions_per_step // PROCESSES * (tokens + preset.budget.max_completion_length)
    return {"memory": rows, "flops": 2 * shape.parameters * per_process * forwards}


def _snapshot(record: dict, state: str) -> dict[str, int]:
    return record["states"][state][-1]


def forward_peak(record: dict) -> int:
    """Activation bytes at the policy's forward peak, less DDP's gradient buckets, which DDP rebuilds at the start
    of the second step's forward pass (so the tracker files them as made in a forward)."""
    return _snapshot(record, "PEAK_FW")["ACT"] - record["ddp_buckets"]


def block_activation_bytes(result: dict) -> float:
    """The plan's bytes of one decoder block's saved values for this run's micro-batch (fp32 here)."""
    planned, shape = result["plan"]["memory"], Shape(**result["shape"])
    off = planned["activations, checkpointing off"]
    return (
        off
        * shape.block_activation_values()
        / (shape.layers * shape.block_activation_values() + ACTIVATION_VALUES_OUTSIDE_BLOCKS * shape.hidden)
    )


def compared(result: dict, forward_peak_ddp: float | None) -> list[tuple[str, float, float]]:
    """(row, planned bytes, measured bytes) of one run on rank 0, category by category (module docstring)."""
    planned, record = result["plan"]["memory"], result["measured"][0]
    on = record["checkpointing"]
    saved = _snapshot(record, "POST_FW")["ACT"] - _snapshot(record, "PRE_FW")["ACT"] - record["ddp_buckets"]
    grads = _snapshot(record, "POST_BW")["GRAD"]  # every gradient, in its final (sharded) form
    if result["config"] == "ddp":  # views into DDP's buckets (gradient_as_bucket_view), made before the tracker
        grads += record["ddp_buckets"]
    logits = planned[LOGITS_ROW]
    activations = planned["activations, checkpointing on" if on else "activations, checkpointing off"]
    if on:  # the forward pass saves the blocks' inputs; the one block recomputed in backward is not seen there
        activations -= block_activation_bytes(result)
    rows = [
        ("weights (fp32 masters)", planned["weights (fp32 masters)"], record["weights"]["policy"]),
        ("gradients", planned["gradients"], grads),
        ("AdamW moments (fp32)", planned["AdamW moments (fp32)"], record["optimizer_state"]),
        ("reference model", planned["reference model"], record["weights"]["reference"]),
        ("rollout replica", planned["rollout replica (unsharded)"], record["weights"]["replica"]),
    ]
    if result["config"] == "fsdp" and forward_peak_ddp is not None:
        gathered = forward_peak(record) - forward_peak_ddp
        rows.append(("FSDP gathered blocks", planned["FSDP gathered blocks (unsharded)"], gathered))
    if result["config"] == "ddp":
        label = "saved by the forward (block inputs) + logits" if on else "activations + logits (forward)"
        rows.append((label, activations + logits, saved))
    rows.append(("peak per process (total)", planned["total with the preset's checkpointing"], record["peak"]["Total"]))
    return rows


def _ddp_twin(results: list[dict], result: dict) -> dict | None:
    """The DDP run of the same size and checkpointing (its forward peak has no gathered FSDP blocks)."""
    on = result["measured"][0]["checkpointing"]
    return next(
        (
            r
            for r in results
            if r["size"] == result["size"] and r["config"] == "ddp" and r["measured"][0]["checkpointing"] == on
        ),
        None,
    )


def when() -> dict:
    """When and where a measurement was made (a report may gather measurements of several days: --from-json)."""
    return {
        "utc": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}",
        "machine": f"{platform.machine()} CPU ({os.cpu_count()} cores{', ' + cpu_model() if cpu_model() else ''})",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load": [round(value, 2) for value in os.getloadavg()],
    }


def when_line(stamp: dict) -> str:
    load = " / ".join(f"{value:.2f}" for value in stamp["load"])
    return (
        f"{stamp['utc']} UTC on an {stamp['machine']}, Python {stamp['python']}, torch {stamp['torch']}, load average "
        f"{load} (1 / 5 / 15 min) when it ended"
    )


def write_report(results: list[dict], out: str) -> str:
    """The markdown report: conditions, then per size, config and checkpointing the plan against the measurement."""
    stamps = {when_line(result["when"]): None for result in results}
    lines = [
        "# check-model's plan against a measured RL step",
        "",
        f"Written by `benchmarks/bench_plan.py` on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{PROCESSES} processes (gloo) with 1 thread each; measured {'; '.join(stamps)} (each section says which).",
        "",
        "Per process (rank 0); the ratio is measured / planned. Memory and FLOP counts do not depend on the machine's "
        "load (only wall time would, and none is reported).",
        "",
        "How each row is measured, in one GRPO rollout phase (a rollout, then two optimizer steps; the memory is that "
        "of the second step, when AdamW's moments exist as in every later step):",
        "",
        "- weights, reference model, rollout replica: the bytes of each module's parameters on this process (its "
        "shards under FSDP); AdamW moments: the bytes of the optimizer's state tensors after the step; gradients under "
        "DDP: the bucket sizes DDP reports (`_get_ddp_logging_data`), which the gradients are views into "
        "(`gradient_as_bucket_view`).",
        "- everything else with torch's `MemTracker` (`torch.distributed._tools.mem_tracker`), a dispatch mode that "
        "sees every tensor storage made or freed and files it as parameter, gradient, optimizer state, activation "
        "(made in a forward pass or a checkpointing recomputation) or temporary (made in backward). Gradients (FSDP): "
        "its gradient bytes when the policy's backward pass ends. Activations the forward saves: its activation bytes "
        "after the policy's forward less those before (and less DDP's buckets, which DDP rebuilds at the start of "
        "the second forward); with checkpointing this is the blocks' inputs, and the plan's one recomputed block is "
        "left out of that row. FSDP's gathered blocks: the activation bytes at FSDP's forward peak less DDP's (same "
        "rows, same model). The peak: the largest live total during the step, every category together.",
        "- FLOPs with `torch.utils.flop_counter.FlopCounterMode` around the whole phase (sampling, the rollout and "
        "reference estimates, both steps' forward and backward); planned: 2 x parameters per token-forward "
        "(plan.phase_forwards).",
        "- Plan: `stabledrl_bench.experiments.plan.plan` on the checkpoint's shape, this budget and the prompt's "
        "measured length, at float32 compute.",
        "",
    ]
    worst, outside = 0.0, []
    for result in results:
        shape = result["shape"]
        on = "on" if result["measured"][0]["checkpointing"] else "off"
        lines.append(
            f"## {result['size']} ({shape['parameters']:,} parameters, {shape['layers']} layers, hidden "
            f"{shape['hidden']}, MLP {shape['mlp']}, {shape['attention']} attention), {result['config']}, "
            f"checkpointing {on}"
        )
        lines += ["", f"Measured {when_line(result['when'])}.", ""]
        if result["config"] == "fsdp" and _ddp_twin(results, result) is None:
            lines += ["No DDP run of this size and checkpointing to subtract, so no gathered-blocks row.", ""]
        lines += ["| | planned | measured | measured / planned |", "|---|---:|---:|---:|"]
        for name, planned, measured in result["rows"]:
            unit, scale = ("GFLOP", 1e9) if name.startswith("FLOPs") else ("MiB", 2**20)
            ratio = f"{measured / planned:.3f}" if planned else ("-" if measured == 0 else "not planned")
            if planned:
                worst = max(worst, abs(measured / planned - 1))
                if abs(measured / planned - 1) > TOLERANCE:
                    outside.append(
                        f"{result['size']} {result['config']} checkpointing {on}: {name} {measured / planned:.3f}"
                    )
            lines.append(f"| {name} ({unit}) | {planned / scale:.2f} | {measured / scale:.2f} | {ratio} |")
        lines.append("")
    lines.append(f"Largest disagreement: {100 * worst:.1f}%.")
    lines.append(f"Outside {100 * TOLERANCE:.0f}%: " + ("; ".join(outside) if outside else "none") + ".")
    text = "\n".join(lines) + "\n"
    atomic_write_text(f"{out}.md", text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["20M", "100M", "sdar-20M"], choices=SIZES)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--checkpointing", nargs="+", default=["on", "off"], choices=["on", "off"])
    parser.add_argument("--out", required=True, help="report path without suffix (.json and .md are written)")
    parser.add_argument("--from-json", type=Path, help="rewrite the report of these measurements (no runs)")
    args = parser.parse_args()
    results = json.loads(args.from_json.read_text()) if args.from_json else []
    with tempfile.TemporaryDirectory() as tmp:
        for size in [] if args.from_json else args.sizes:
            checkpoint = write_checkpoint(size, Path(tmp) / size)
            shape = shape_of(size)
            for config in args.configs:
                ranks = launched(config, checkpoint, Path(tmp) / f"{size}-{config}", args.checkpointing)
                for run in range(len(args.checkpointing)):
                    records = [ranks[rank][run] for rank in range(PROCESSES)]
                    results.append(
                        {
                            "size": size,
                            "config": config,
                            "shape": dataclasses.asdict(shape),
                            "measured": records,
                            "when": when(),
                        }
                    )
                    print(f"measured {size} {config} checkpointing {args.checkpointing[run]}", flush=True)
    for result in results:  # the plan as plan.py makes it now, so --from-json shows a changed plan
        record = result["measured"][0]
        tokens = record["rows"][0][1]  # the prompt's length
        shape = shape_of(result["size"])
        result["shape"] = dataclasses.asdict(shape)
        result["plan"] = predicted(shape, result["config"], record["checkpointing"], tokens)
    for result in results:
        ddp = _ddp_twin(results, result)
        result["rows"] = compared(result, forward_peak(ddp["measured"][0]) if ddp else None)
        result["rows"].append(("FLOPs of the phase", result["plan"]["flops"], result["measured"][0]["flops"]))
    atomic_write_text(f"{args.out}.json", json.dumps(results, indent=1))
    print(write_report(results, args.out))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(Path(sys.argv[2]), Path(sys.argv[3]), tuple(s == "on" for s in sys.argv[4:]) or (True, False))
    else:
        sys.exit(main())
