"""What a preset would cost on a cluster, by arithmetic: memory per GPU, disk, hours (``check-model``); and the
relative cost of each stage of ``reproduce`` (its progress estimate). The one cost model of the package.

Estimates by arithmetic, checked against a measured RL step at several sizes (``benchmarks/bench_plan.py``, its
report in ``benchmarks/reports/``): parameter, gradient and optimizer bytes follow from the parameter count and each
launch config's sharding (under DDP the gradients are views into its all-reduce buckets, no second copy:
``gradient_as_bucket_view``), and, under FSDP, the decoder blocks gathered at a time (the one computing, the one
prefetched, and part of a third: 2.8 as measured at 100M-400M parameters); activations count
what a pre-norm, SiLU-gated decoder block (LLaDA, Dream, SDAR) saves for its backward pass, 11 x hidden + 4 x MLP
width values per token in the compute dtype (attention by a fused kernel, so no tokens x tokens term; SDAR's
per-head query/key norms add theirs), and 3 x hidden outside the blocks; logits are those of every position of a
row, which the model computes, and a copy of the scored positions' that the chosen tokens' log-probabilities keep for
the backward pass, in the compute dtype, plus one span's float32 log-softmax and its backward
(:func:`logits_bytes`); time is forward/backward FLOPs (2 x parameters per token forward, twice that backward, once
more when recomputing; a block model samples with its key cache) divided by an assumed sustained throughput per GPU
(``--tflops``, default 400 TFLOP/s, about 40% of an H100's dense bf16 peak).
What each number assumes is printed beside it.

Work is counted in *token-forwards* (one token through one forward pass; a backward pass counts two): sampling,
likelihood estimates, optimizer steps and evaluation decoding are all multiples of it, so the same counts give
a cluster's hours (x 2 x parameters FLOPs each) and ``reproduce``'s estimate of the stages it has not run yet
(x the seconds per token-forward it measured on the stages it has run).

A model's shape comes from loaded weights (:meth:`Shape.of`), from a ``config.json`` of a family implemented here
(:meth:`Shape.from_config`), or from a published model's name (:data:`SHAPES`), so a cluster can be planned before
the weights are downloaded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stabledrl_bench.core.baseline import build_baseline
from stabledrl_bench.core.budget import Budget
from stabledrl_bench.core.estimators import Estimator, TraceReplay
from stabledrl_bench.core.logprobs import largest_piece
from stabledrl_bench.core.models import DiffusionLM
from stabledrl_bench.errors import UserError
from stabledrl_bench.evaluation.protocols import EvalProtocol, get_protocol
from stabledrl_bench.experiments.comparison import TABLE_BASELINES
from stabledrl_bench.tasks import get_task
from stabledrl_bench.training.config import TrainConfig

GiB = 2**30
CONFIGS = ("ddp", "fsdp", "deepspeed_zero2")
# Values saved per token for the backward pass, in units of the hidden size and the MLP width, counted for a
# pre-norm, SiLU-gated block (LLaDA, Dream, SDAR) and measured by benchmarks/bench_plan.py: in each decoder block the
# input and its normalised copy, query/key/value after RoPE, the attention output, the second norm's input and output
# (11 x hidden), and the gate, the up projection, SiLU(gate) and their product (4 x MLP width); outside the blocks
# the embedding output and the final norm's input and output (3 x hidden).
ACTIVATION_VALUES_PER_HIDDEN = 11
ACTIVATION_VALUES_PER_MLP = 4
ACTIVATION_VALUES_OUTSIDE_BLOCKS = 3
LOGITS_ROW = "logits (all + scored copy, by spans)"
# Float32 tensors of one span that the backward of the log-probabilities holds at once (core/logprobs.py): its
# log-softmax, the scattered incoming gradient and log-softmax's gradient.
SPAN_FLOAT32_TENSORS = 3
# FSDP2 holds the block it computes unsharded, and around its forward peak the next block's all-gather output and
# its copy into the unsharded parameters (up to 3 blocks). Measured on 2 processes (benchmarks/bench_plan.py), with
# / without activation checkpointing: LLaDA-20M 2.51 / 2.18, SDAR-20M 2.53 / 2.02, LLaDA-100M 2.76 / 2.60,
# LLaDA-400M 2.84 / 2.73 blocks: it grows with the model towards 3, so the plan counts the larger models' 2.8 (the
# smallest ones hold fewer: this row over-plans them by up to 28%, a few MiB).
GATHERED_BLOCKS = 2.8
CONTROL = "frozen control"  # the table's extra run per task: GRPO at learning rate 0 (experiments/runner.py)

# Published models planned by name (``check-model --shape NAME``, no weights needed): the structural fields of their
# config.json files, built on the meta device, so the parameter count is exact (tests/test_native_models.py checks
# the same shapes against the published parameter names and totals).
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "llada-8b": (  # GSAI-ML/LLaDA-8B-Instruct (and -Base, LLaDA-1.5): Table 1's model
        "llada",
        {
            "d_model": 4096,
            "n_heads": 32,
            "n_kv_heads": 32,
            "n_layers": 32,
            "mlp_hidden_size": 12288,
            "vocab_size": 126464,
            "embedding_size": 126464,
            "rope_theta": 500000.0,
            "block_type": "llama",
            "layer_norm_type": "rms",
            "activation_type": "silu",
        },
    ),
    "dream-7b": (  # Dream-org/Dream-v0-Instruct-7B (Qwen2.5-7B's shape)
        "dream",
        {
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "vocab_size": 152064,
            "tie_word_embeddings": False,
        },
    ),
    "sdar-8b": (  # JetAstra/SDAR-8B-Chat (Qwen3-8B's shape, block 4): Table 2's model
        "sdar",
        {
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
            "tie_word_embeddings": False,
            "block_size": 4,
        },
    ),
}


@dataclass(frozen=True)
class Shape:
    """What the arithmetic needs to know of a model."""

    parameters: int
    layers: int
    hidden: int
    vocab: int
    attention: str = "full"  # "full" (LLaDA, Dream) or "block" (SDAR): which estimators and protocols apply
    mlp: int = 0  # the MLP's inner width (0: 4 x hidden, a plain transformer's)
    qk_norm: int = 0  # query + key width normalised per head (Qwen3's, so SDAR's), 0 without such norms
    block: int = 0  # a block model's decoding block (its sampler caches keys), 0 under full attention

    def block_activation_values(self) -> int:
        """Values one decoder block saves per token for its backward pass (:data:`ACTIVATION_VALUES_PER_HIDDEN`;
        a per-head query/key norm saves its input and output too)."""
        mlp = self.mlp or 4 * self.hidden
        return ACTIVATION_VALUES_PER_HIDDEN * self.hidden + ACTIVATION_VALUES_PER_MLP * mlp + 2 * self.qk_norm

    @classmethod
    def of(cls, dlm: DiffusionLM) -> Shape:
        embedding = dlm.model.get_input_embeddings().weight
        blocks = dlm.decoder_blocks()
        return cls(
            parameters=sum(p.numel() for p in dlm.model.parameters()),
            layers=len(blocks),
            hidden=int(embedding.shape[1]),
            vocab=dlm.vocab_size,
            attention=dlm.attention,
            **_block_widths(blocks),
            block=int(dlm.block_size or 0) if dlm.attention == "block" else 0,
        )

    @classmethod
    def from_config(cls, path: str | Path) -> Shape:
        """The shape a ``config.json`` of a family implemented here describes (LLaDA, Dream, SDAR), built on the
        meta device: no weights are read or allocated."""
        where = f"--config {path}"
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise UserError(f"{where}: not a readable config.json ({type(exc).__name__}: {exc})") from None
        if not isinstance(data, dict):
            raise UserError(f"{where}: expected a JSON object")
        settings = {key: value for key, value in data.items() if key not in ("auto_map", "architectures")}
        return _built(str(settings.pop("model_type", "")).lower(), settings, where)

    @classmethod
    def named(cls, name: str) -> Shape:
        if name not in SHAPES:
            raise UserError(f"--shape {name}: unknown; known: {', '.join(SHAPES)}")
        family, settings = SHAPES[name]
        return _built(family, settings, f"--shape {name}")


def _built(family: str, settings: Mapping[str, Any], where: str) -> Shape:
    """The shape of a native ``family`` network with these config fields, counted on the meta device."""
    import torch

    from stabledrl_bench.core.models.backends import MODEL_FAMILIES, NATIVE

    native = NATIVE.get(family)
    if native is None:
        raise UserError(f"{where}: model_type {family or 'missing'!r}; the plan knows {', '.join(NATIVE)}")
    try:
        config = native.config(**settings)
        with torch.device("meta"):
            model = native.model(config)
    except (UserError, TypeError, ValueError) as exc:
        raise UserError(f"{where}: not a config this package builds ({exc})") from None
    backend = MODEL_FAMILIES.get(native.backend)
    wanted = set(backend.block_classes)
    blocks = [m for m in model.modules() if type(m).__name__ in wanted]
    return Shape(
        parameters=sum(p.numel() for p in model.parameters()),
        layers=len(blocks),
        hidden=int(model.get_input_embeddings().weight.shape[1]),
        vocab=int(config.vocab_size),
        attention=backend.default_attention,
        **_block_widths(blocks),
        block=int(getattr(config, "block_size", 0) or 0) if backend.default_attention == "block" else 0,
    )


def _block_widths(blocks: Sequence) -> dict[str, int]:
    """A decoder block's MLP width (its widest linear layer's input: the down projection's, whether the gate and up
    projections are one fused layer or two) and the query + key width its per-head norms see, if it has them."""
    import torch

    if not blocks:
        return {}
    layers = dict(blocks[0].named_modules())
    mlp = max((m.in_features for m in layers.values() if isinstance(m, torch.nn.Linear)), default=0)
    if not any(name.endswith(("q_norm", "k_norm")) for name in layers):
        return {"mlp": mlp}
    projections = [m for name, m in layers.items() if name.endswith(("q_proj", "k_proj"))]
    return {"mlp": mlp, "qk_norm": sum(m.out_features for m in projections)}


# ------------------------------------------------------------------------------------------------ work counts
def rows_per_sequence(estimator: Estimator, diffusion_steps: int) -> int:
    """Forward rows a likelihood estimate makes per completion (Monte-Carlo samples, replayed steps)."""
    if isinstance(estimator, TraceReplay):
        return math.ceil(diffusion_steps / estimator.shrink)
    return int(getattr(estimator, "num_mc", 1)) * (2 if getattr(estimator, "reduce_var", False) else 1)


@dataclass(frozen=True)
class Method:
    """What one baseline's run costs beyond the budget: its likelihood rows per completion and reference model."""

    name: str
    estimator: str
    rows: int
    needs_ref: bool

    @classmethod
    def of(cls, baseline: str, budget: Budget, attention: str) -> Method:
        method = build_baseline(baseline)
        estimator = method.estimator().for_attention(attention)
        return cls(baseline, estimator.name, rows_per_sequence(estimator, budget.diffusion_steps), method.needs_ref)


def sampling_forwards(budget: Budget, block: int = 0) -> float:
    """Whole-row forward passes that sampling one completion costs. Under full attention every denoising step is one;
    a block model decodes with an exact key cache: the prompt once, then each step only its block, and each finished
    block once more to store its keys, (prompt + canvas + steps x block) tokens in all (measured:
    ``benchmarks/bench_plan.py``)."""
    if not block:
        return budget.diffusion_steps
    tokens = budget.max_prompt_length + budget.max_completion_length
    return (tokens + budget.diffusion_steps * block) / tokens


def phase_forwards(budget: Budget, method: Method, *, recompute: bool, block: int = 0) -> float:
    """Forward passes per completion in one rollout phase (a backward pass counts two, recomputation one more):
    sampling (:func:`sampling_forwards`), the rollout policy's likelihood estimate, then ``num_iterations``
    optimizer steps, each a forward and a backward over the estimator's rows (plus the reference model's forward
    when the method has one)."""
    likelihood = method.rows
    per_step = likelihood + (2 + int(recompute)) * likelihood + (likelihood if method.needs_ref else 0)
    return sampling_forwards(budget, block) + likelihood + budget.num_iterations * per_step


def train_work(budget: Budget, method: Method, *, recompute: bool, block: int = 0) -> float:
    """Token-forwards of one RL run (every row at the budget's longest: prompt + canvas)."""
    tokens = budget.max_prompt_length + budget.max_completion_length
    forwards = phase_forwards(budget, method, recompute=recompute, block=block)
    per_phase = budget.completions_per_step * tokens * forwards
    return budget.rollout_phases * per_phase


def sft_work(steps: int, batch_size: int, tokens: int) -> float:
    """Token-forwards of an SFT warm start: one forward and one backward of every row."""
    return 3.0 * steps * batch_size * tokens


def decode_forwards(protocol: EvalProtocol, length: int) -> int:
    """Forward passes that decode one problem on a ``length``-token canvas (its denoising steps; a block model's
    count when its block is a multiple of the protocol's tokens per step), times the protocol's repeats. An upper
    bound for confidence-threshold decoding, which may unmask several tokens in one step."""
    return max(1, length // protocol.tokens_per_step) * protocol.repeats


def eval_work(
    evaluations: Iterable[tuple[EvalProtocol, Mapping[int, int]]], problems: int, prompt_tokens: int
) -> float:
    """Token-forwards of evaluating one checkpoint on ``problems`` test problems under each (protocol, nominal ->
    decoded length) pair; every forward is over the prompt and the whole canvas."""
    return float(
        sum(
            problems * decode_forwards(protocol, decoded) * (prompt_tokens + decoded)
            for protocol, lengths in evaluations
            for decoded in lengths.values()
        )
    )


def logits_bytes(rows: int, tokens: int, scored: int, vocab: int, compute_bytes: int) -> int:
    """The logits' peak bytes in one forward and backward pass over ``rows`` rows of ``tokens`` positions whose last
    ``scored`` are read (``core/logprobs.py``, measured by ``benchmarks/bench_memory.py``).

    At the end of the forward pass the model's logits of every position (the prompt's too) and the copy of the scored
    positions' kept for the backward pass exist together, in the compute dtype; in the backward pass that copy and its
    gradient, then the gradient of every position, hold as much or less. One piece's float32 tensors (its
    positions: :func:`~stabledrl_bench.core.logprobs.largest_piece`, whole rows where a row fits) come on top.
    Before the spans, the scored positions' float32 log-softmax and its gradient were kept instead: compute + 8
    bytes per scored value, and the backward's peak (12 bytes per scored value) above the forward's.
    """
    span = SPAN_FLOAT32_TENSORS * 4 * largest_piece(rows, scored, vocab) * vocab
    return rows * (tokens + scored) * vocab * compute_bytes + span


# ------------------------------------------------------------------------------------------------- the plans
def plan(shape: Shape, preset, *, processes: int, baseline: str, tflops: float) -> dict:
    """Memory per GPU under each shipped config, disk, and time of one ``baseline`` run of ``preset`` on
    ``processes`` GPUs (the baselines differ in their likelihood passes and reference model)."""
    p, budget = shape.parameters, preset.budget
    tokens = budget.max_prompt_length + budget.max_completion_length  # a row's length at most
    micro_rows = preset.per_device_prompts * budget.num_generations
    method = Method.of(baseline, budget, shape.attention)
    rows = method.rows
    compute_bytes = 2 if preset.bf16 else 4

    per_value = compute_bytes * micro_rows * rows * tokens  # bytes of one value per token of the micro-batch
    block_bytes = per_value * shape.block_activation_values()
    outside = per_value * ACTIVATION_VALUES_OUTSIDE_BLOCKS * shape.hidden

    def activations(checkpointing: bool) -> float:
        if not checkpointing:
            return shape.layers * block_bytes + outside
        # each block's input, then one block recomputed at a time in the backward pass
        return shape.layers * per_value * shape.hidden + block_bytes + outside

    logits = logits_bytes(micro_rows * rows, tokens, budget.max_completion_length, shape.vocab, compute_bytes)
    configs = {}
    for config in CONFIGS:
        sharded = processes if config == "fsdp" else 1
        state = {  # fp32 master weights, fp32 gradients, AdamW's two fp32 moments
            "weights (fp32 masters)": 4 * p / sharded,
            "gradients": 4 * p / (processes if config != "ddp" else 1),  # fp32 (ZeRO-2: 16-bit, below)
            "AdamW moments (fp32)": 8 * p / (processes if config != "ddp" else 1),
        }
        if config == "deepspeed_zero2":  # 16-bit weights in full, fp32 masters sharded with the rest
            state["weights (fp32 masters)"] = compute_bytes * p + 4 * p / processes
            state["gradients"] = compute_bytes * p / processes
        extra = {
            "rollout replica (unsharded)": compute_bytes * p if config == "fsdp" else 0,
            "FSDP gathered blocks (unsharded)": (
                GATHERED_BLOCKS * compute_bytes * p / shape.layers if config == "fsdp" and shape.layers else 0
            ),
            "reference model": 0
            if not method.needs_ref
            else (4 * p / processes if config == "fsdp" else compute_bytes * p),
        }
        rows_of_config = {**state, **extra}
        rows_of_config["activations, checkpointing on"] = activations(True)
        rows_of_config["activations, checkpointing off"] = activations(False)
        rows_of_config[LOGITS_ROW] = logits
        total = sum(state.values()) + sum(extra.values()) + activations(preset.gradient_checkpointing) + logits
        rows_of_config["total with the preset's checkpointing"] = total
        configs[config] = {name: value / GiB for name, value in rows_of_config.items()}

    recompute = preset.gradient_checkpointing
    work = train_work(budget, method, recompute=recompute, block=shape.block)
    seconds_per_phase = _seconds(work, p, processes, tflops)
    seconds_per_phase /= budget.rollout_phases
    return {
        "shape": asdict(shape),
        "assumptions": {
            "baseline": f"{baseline} ({method.estimator} estimator)",
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
            "sampling share": sampling_forwards(budget, shape.block)
            / phase_forwards(budget, method, recompute=recompute, block=shape.block),
            "hours per run": seconds_per_phase * budget.rollout_phases / 3600,
        },
    }


def _seconds(work: float, parameters: int, processes: int, tflops: float) -> float:
    """Seconds ``work`` token-forwards take at 2 x ``parameters`` FLOPs each on ``processes`` GPUs."""
    return work * 2 * parameters / (processes * tflops * 1e12)


def table_plan(
    shape: Shape,
    preset,
    *,
    processes: int,
    tflops: float,
    gpu_memory: float | None = None,
    baselines: Sequence[str] = TABLE_BASELINES,
) -> dict:
    """The whole table ``reproduce`` runs with ``preset`` on ``processes`` GPUs: every baseline's run and the frozen
    control on each of the preset's tasks and seeds, each checkpoint evaluated under the preset's protocols and
    lengths, the disk all runs hold at the end (``keep_checkpoints`` each, as TrainConfig keeps them, plus the final
    model), and, given ``gpu_memory`` (GiB), which launch config fits which run."""
    evaluations = [(get_protocol(name), preset.lengths) for name in preset.protocols]
    problems = {task: len(get_task(task).eval_docs(limit=preset.eval_limit)) for task in preset.default_tasks()}
    seeds, keep_checkpoints = len(preset.seeds), TrainConfig.keep_checkpoints
    runs = {name: plan(shape, preset, processes=processes, baseline=name, tflops=tflops) for name in baselines}
    runs[CONTROL] = plan(shape, preset, processes=processes, baseline="grpo", tflops=tflops)  # GRPO at lr 0
    methods = {
        name: {
            "hours per run": report["time (estimate)"]["hours per run"],
            "memory per GPU (GiB)": {
                config: rows["total with the preset's checkpointing"]
                for config, rows in report["memory per GPU (GiB)"].items()
            },
        }
        for name, report in runs.items()
    }
    prompt = preset.budget.max_prompt_length
    evaluation = {
        task: _seconds(eval_work(evaluations, n, prompt), shape.parameters, processes, tflops) / 3600
        for task, n in problems.items()
    }
    disk = runs[CONTROL]["disk (GiB)"]
    checkpoint, final = disk["checkpoint (fp32 weights + AdamW, all shards)"], disk["final export (compute dtype)"]
    count = len(runs) * len(problems) * seeds
    checkpoints_evaluated = (len(baselines) + 1) * seeds  # every baseline and the start, per task
    hours = sum(m["hours per run"] for m in methods.values()) * len(problems) * seeds
    hours += sum(evaluation.values()) * checkpoints_evaluated
    report: dict[str, Any] = {
        "methods": methods,
        "evaluation hours per checkpoint": evaluation,
        "evaluation": {
            "protocols": [protocol.name for protocol, _ in evaluations],
            "lengths": sorted({n for _, lengths in evaluations for n in lengths}),
            "test problems": dict(problems),
            "checkpoints per task": checkpoints_evaluated,
        },
        "disk at the peak (GiB)": {
            "runs": count,
            "keep_checkpoints": keep_checkpoints,
            "total": count * (keep_checkpoints * checkpoint + final),
            "total with keep_checkpoints 1": count * (checkpoint + final),
        },
        "hours (all runs and evaluations, one after another)": hours,
    }
    if gpu_memory is not None:
        report["fits (GiB per GPU)"] = {
            "gpu memory": gpu_memory,
            **{
                config: {name: m["memory per GPU (GiB)"][config] <= gpu_memory for name, m in methods.items()}
                for config in CONFIGS
            },
        }
    return report


def format_plan(report: dict) -> list[str]:
    """One method's plan as printable lines (numbers rounded; every one is an estimate)."""
    lines = ["plan (estimates by arithmetic, see stabledrl_bench/experiments/plan.py):"]
    lines.append("  " + ", ".join(f"{k}: {v}" for k, v in report["assumptions"].items()))
    for config, rows in report["memory per GPU (GiB)"].items():
        lines.append(f"  memory per GPU, configs/accelerate/{config}.yaml:")
        lines.extend(f"    {name:44s} {value:8.1f} GiB" for name, value in rows.items())
    lines.append("  disk:")
    lines.extend(f"    {name:44s} {value:8.1f} GiB" for name, value in report["disk (GiB)"].items())
    time = report["time (estimate)"]
    lines.append(
        f"  time: {time['seconds per rollout phase']:.0f} s per rollout phase ({100 * time['sampling share']:.0f}% "
        f"sampling), {time['hours per run']:.1f} h per run of this baseline"
    )
    return lines


def format_table_plan(report: dict) -> list[str]:
    """The whole table's plan as printable lines: per method, evaluation, disk at the peak, the fit verdicts."""
    fits = report.get("fits (GiB per GPU)")
    head = f"  {'':22s} {'hours/run':>9s}   GiB per GPU: " + " / ".join(CONFIGS)
    lines = ["the whole table (every baseline, the frozen control, evaluation; estimates):", head]
    for name, method in report["methods"].items():
        memory = method["memory per GPU (GiB)"]
        cells = " / ".join(f"{memory[config]:.0f}" + _fit_mark(fits, config, name) for config in CONFIGS)
        lines.append(f"  {name:22s} {method['hours per run']:9.1f}   {cells}")
    if fits is not None:
        lines.append(f"  (* does not fit {fits['gpu memory']:g} GiB per GPU)")
        for config in CONFIGS:
            failing = [name for name, ok in fits[config].items() if not ok]
            verdict = "every run fits" if not failing else f"does not fit: {', '.join(failing)}"
            lines.append(f"  {config}.yaml on {fits['gpu memory']:g} GiB GPUs: {verdict}")
    evaluation = report["evaluation"]
    lines.append(
        f"  evaluation at {'/'.join(map(str, evaluation['lengths']))} ({', '.join(evaluation['protocols'])}) of "
        f"{evaluation['checkpoints per task']} checkpoints per task (every baseline and the start), each:"
    )
    lines.extend(
        f"    {task:20s} {evaluation['test problems'][task]:>6,} problems {hours:6.1f} h"
        for task, hours in report["evaluation hours per checkpoint"].items()
    )
    disk = report["disk at the peak (GiB)"]
    lines.append(
        f"  disk at the peak: {disk['runs']} runs keeping {disk['keep_checkpoints']} checkpoints and a final model "
        f"each need {disk['total'] / 1024:.1f} TiB, or {disk['total with keep_checkpoints 1'] / 1024:.1f} TiB with "
        "keep_checkpoints: 1"
    )
    hours = report["hours (all runs and evaluations, one after another)"]
    lines.append(f"  time: {hours:,.0f} h for the whole table, one run after another ({hours / 24:,.0f} days)")
    return lines


def _fit_mark(fits: dict | None, config: str, name: str) -> str:
    return "" if fits is None or fits[config][name] else "*"
