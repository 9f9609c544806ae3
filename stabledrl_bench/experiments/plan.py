"""What a preset would cost on a cluster, by arithmetic: memory per GPU, disk per checkpoint, hours (``check-model``).

Estimates, not measurements: parameter, gradient and optimizer bytes follow from the parameter count and each
launch config's sharding; activations use the standard per-layer count for transformer training with fused
attention (about 34 bytes x tokens x hidden size per layer in 16-bit, Korthikanti et al. 2022); logits are
16-bit logits plus float32 log-probabilities and their gradient; time is forward/backward FLOPs (2 x parameters
per token forward, twice that backward, once more when recomputing) divided by an assumed sustained throughput
per GPU (``--tflops``, default 400 TFLOP/s, about 40% of an H100's dense bf16 peak). What each number assumes is
printed beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stabledrl_bench.core.baseline import build_baseline, training_estimator
from stabledrl_bench.core.estimators import Estimator, TraceReplay
from stabledrl_bench.core.models import DiffusionLM

GiB = 2**30
CONFIGS = ("ddp", "fsdp", "deepspeed_zero2")
ACTIVATION_BYTES_PER_LAYER_TOKEN_HIDDEN = 34  # 16-bit activations of one transformer layer, fused attention


@dataclass(frozen=True)
class Shape:
    """What the arithmetic needs to know of a model."""

    parameters: int
    layers: int
    hidden: int
    vocab: int

    @classmethod
    def of(cls, dlm: DiffusionLM) -> Shape:
        embedding = dlm.model.get_input_embeddings().weight
        return cls(
            parameters=sum(p.numel() for p in dlm.model.parameters()),
            layers=len(dlm.decoder_blocks()),
            hidden=int(embedding.shape[1]),
            vocab=dlm.vocab_size,
        )


def rows_per_sequence(estimator: Estimator, diffusion_steps: int) -> int:
    """Forward rows a likelihood estimate makes per completion (Monte-Carlo samples, replayed steps)."""
    if isinstance(estimator, TraceReplay):
        return math.ceil(diffusion_steps / estimator.shrink)
    return int(getattr(estimator, "num_mc", 1)) * (2 if getattr(estimator, "reduce_var", False) else 1)


def plan(dlm: DiffusionLM, preset, *, processes: int, baseline: str, tflops: float) -> dict:
    """Memory per GPU under each shipped config, disk, and time of one ``baseline`` run of ``preset`` on
    ``processes`` GPUs (the baselines differ in their likelihood passes and reference model)."""
    shape, budget = Shape.of(dlm), preset.budget
    p = shape.parameters
    completions = budget.prompts_per_step * budget.num_generations
    tokens = budget.max_prompt_length + budget.max_completion_length  # a row's length at most
    micro_rows = preset.per_device_prompts * budget.num_generations
    method = build_baseline(baseline)
    estimator = training_estimator(method, dlm, block_length=budget.block_length)
    rows = rows_per_sequence(estimator, budget.diffusion_steps)
    needs_ref = method.needs_ref
    compute_bytes = 2 if preset.bf16 else 4

    def activations(checkpointing: bool) -> float:
        per_layer = ACTIVATION_BYTES_PER_LAYER_TOKEN_HIDDEN * micro_rows * rows * tokens * shape.hidden
        if not checkpointing:
            return shape.layers * per_layer
        return shape.layers * compute_bytes * micro_rows * rows * tokens * shape.hidden + per_layer

    logits = micro_rows * rows * budget.max_completion_length * shape.vocab * (compute_bytes + 8)
    configs = {}
    for config in CONFIGS:
        state = {  # fp32 master weights, fp32 gradients and AdamW's two fp32 moments: 16 bytes per parameter
            "ddp": 16 * p,
            "fsdp": 16 * p / processes,
            "deepspeed_zero2": compute_bytes * p + 14 * p / processes,  # 16-bit weights in full, the rest sharded
        }[config]
        extra = {
            "rollout replica (unsharded)": compute_bytes * p if config == "fsdp" else 0,
            "reference model": 0 if not needs_ref else (4 * p / processes if config == "fsdp" else compute_bytes * p),
        }
        rows_of_config = {"weights, gradients, AdamW": state, **extra}
        rows_of_config["activations, checkpointing on"] = activations(True)
        rows_of_config["activations, checkpointing off"] = activations(False)
        rows_of_config["logits (16-bit, fp32 log-probs and grad)"] = logits
        total = state + sum(extra.values()) + activations(preset.gradient_checkpointing) + logits
        rows_of_config["total with the preset's checkpointing"] = total
        configs[config] = {name: value / GiB for name, value in rows_of_config.items()}

    forward = 2 * p * tokens * completions  # FLOPs of one forward row per completion
    rollout = forward * budget.diffusion_steps
    likelihood = forward * rows
    backward = (2 + (1 if preset.gradient_checkpointing else 0)) * likelihood  # backward (+ recomputation)
    per_phase = rollout + likelihood + budget.num_iterations * (likelihood + backward)
    if needs_ref:
        per_phase += budget.num_iterations * likelihood  # the reference policy's estimates
    seconds_per_phase = per_phase / (processes * tflops * 1e12)
    phases = budget.max_steps // budget.num_iterations
    return {
        "shape": shape.__dict__,
        "assumptions": {
            "baseline": f"{baseline} ({estimator.name} estimator)",
            "processes": processes,
            "rows per micro-batch": micro_rows,
            "forward rows per completion (estimator)": rows,
            "tokens per row (prompt + canvas, at most)": tokens,
            "compute dtype": "bf16" if preset.bf16 else "float32",
            "sustained TFLOP/s per GPU": tflops,
        },
        "memory per GPU (GiB)": configs,
        "disk (GiB)": {
            "checkpoint (fp32 weights + AdamW, all shards)": 12 * p / GiB,
            "final export (compute dtype)": compute_bytes * p / GiB,
        },
        "time (estimate)": {
            "seconds per rollout phase": seconds_per_phase,
            "sampling share": rollout / per_phase,
            "hours per run": seconds_per_phase * phases / 3600,
            "tasks": len(preset.tasks),
        },
    }


def format_plan(report: dict) -> list[str]:
    """The plan as printable lines (numbers rounded; every one is an estimate)."""
    lines = ["plan (estimates by arithmetic, see stabledrl_bench/experiments/plan.py):"]
    lines.append("  " + ", ".join(f"{k}: {v}" for k, v in report["assumptions"].items()))
    for config, rows in report["memory per GPU (GiB)"].items():
        lines.append(f"  memory per GPU, configs/accelerate/{config}.yaml:")
        lines.extend(f"    {name:42s} {value:8.1f} GiB" for name, value in rows.items())
    lines.append("  disk:")
    lines.extend(f"    {name:42s} {value:8.1f} GiB" for name, value in report["disk (GiB)"].items())
    time = report["time (estimate)"]
    lines.append(
        f"  time: {time['seconds per rollout phase']:.0f} s per rollout phase ({100 * time['sampling share']:.0f}% "
        f"sampling), {time['hours per run']:.1f} h per run of this baseline; the table trains every baseline and a "
        f"frozen control on each of {time['tasks']} tasks (check the others with --baseline)"
    )
    return lines
