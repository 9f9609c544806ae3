"""Full-attention decoding modes against exact decoding: tokens/s, NFE, speedup and agreement, in one process.

Not a test. Each mode is one of ``DECODE_MODES`` (or a cache alone) applied to the d1 protocol's decoder (block
32, two tokens per step); exact decoding is the LLaDA reference sampler. The variants are timed interleaved
(exact, prefix, dual, ..., exact, prefix, ...) with a fixed thread count, so a load change on a shared machine
hits every variant alike; the table reports median times and the load average before and after.

Agreement with exact decoding (greedy, same prompts): ``rows`` is the fraction of completions whose text up to
the first stop token is identical; ``tokens`` the fraction of positions up to exact decoding's first stop token
that hold the same token. Random weights never emit EOS, so the EOS stop saves nothing there; pass
``--checkpoint`` (a trained tiny model) to see it.

    python benchmarks/bench_decoding.py --config 26M --max-completion-length 256 --batch 16 --threads 2
    python benchmarks/bench_decoding.py --rl-step --max-completion-length 128   # one RL step, fast vs exact rollouts
    python benchmarks/bench_decoding.py --config 26M --family llada            # the same on the native LLaDA
    python benchmarks/bench_decoding.py --config 26M --upstream DIR --modes exact,prefix   # native vs remote code

``--sft-steps N`` trains the random weights of ``--config`` on ``--task`` first (16 rows per step on canvases of 48-128
tokens, so the model pads with EOS at any length; AdamW at a constant 3e-4 after 20 warm-up steps, no weight decay,
gradients clipped at 0.2), so that the confidence threshold and the EOS stop fire on a model large enough for
compute to dominate; ``--out PATH`` writes the table with the command, commit, machine and date to PATH:

    python benchmarks/bench_decoding.py --config 26M --family llada --task sudoku --sft-steps 300 \
        --max-completion-length 256 --batch 16 --repeats 1 --out benchmarks/reports/decoding_26M_trained.md

``--upstream DIR`` (a folder holding LLaDA's published ``configuration_llada.py`` and ``modeling_llada.py``, e.g.
dLLM-RL's ``models/llada``; transformers 4.52-4.53, the ``remote-code`` extra) writes the same weights as one
LLaDA folder with those files beside them and times the native implementation against the published file
(``--trust-remote-code``), interleaved, mode by mode; agreement is the remote path's against the native one's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from timing import timed

from stabledrl_bench.core.models import DiffusionLM, build_tiny, load_diffusion_lm, save_diffusion_lm
from stabledrl_bench.core.models.convert import save_tiny_as
from stabledrl_bench.core.sampling import DECODE_MODES, FullDecode, GenerationOutput, generate

CONFIGS = {
    "default": {},  # the tiny preset's size
    "26M": {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "intermediate_size": 1408},
}
MODES = {
    "exact": {},
    "prefix": {"cache": "prefix"},
    "dual": {"cache": "dual"},
    **{name: fields for name, fields in DECODE_MODES.items() if name != "exact"},
}


def agreement(model: DiffusionLM, out: GenerationOutput, exact: GenerationOutput) -> tuple[float, float]:
    """(identical rows up to the first stop token, identical tokens up to exact decoding's first stop token)."""
    ref = model.completion_mask(exact.completion_ids)
    rows = [
        a[ka].tolist() == b[kb].tolist()
        for a, b, ka, kb in zip(
            out.completion_ids, exact.completion_ids, model.completion_mask(out.completion_ids), ref, strict=True
        )
    ]
    same = (out.completion_ids == exact.completion_ids) & ref
    return sum(rows) / len(rows), float(same.sum() / ref.sum())


def _trained(args: argparse.Namespace) -> str:
    """``--sft-steps``: the random weights of ``--config`` after that many SFT steps on ``--task``, built as any warm
    start is (:func:`~stabledrl_bench.experiments.runner.ensure_warm_start`); returns the final model folder. In
    ``--sft-dir`` (default: a temporary folder) a finished start of the same settings is reused, an interrupted one
    resumes from its last checkpoint."""
    from stabledrl_bench.experiments.runner import WarmStart, ensure_warm_start
    from stabledrl_bench.training.optim import OptimConfig
    from stabledrl_bench.training.sft import SFTConfig

    optim = OptimConfig(learning_rate=3e-4, weight_decay=0.0, lr_scheduler_type="constant_with_warmup", warmup_steps=20)
    sft = SFTConfig(
        task=args.task,
        max_steps=args.sft_steps,
        batch_size=16,
        max_completion_length=128,
        min_completion_length=48,
        optim=optim,
        save_every=100,
    )
    spec = WarmStart(sft=sft, init={"attention": "full", "seed": 0, **CONFIGS[args.config]})
    final, _ = ensure_warm_start(spec, args.sft_dir or tempfile.mkdtemp(prefix="bench-sft-"))
    return str(final)


def _model(args: argparse.Namespace) -> DiffusionLM:
    """The tiny model (random weights of ``--config``, ``--checkpoint``, or the ``--sft-steps`` run's); with
    ``--family llada|dream`` the same weights as that family's folder, run by the native implementation
    (``core/models/convert.py``)."""
    dlm = (
        load_diffusion_lm(args.checkpoint)
        if args.checkpoint
        else build_tiny(attention="full", seed=0, **CONFIGS[args.config])
    )
    if args.family == "tiny":
        return dlm
    folder = Path(tempfile.mkdtemp(prefix=f"bench-{args.family}-")) / args.family
    return load_diffusion_lm(save_tiny_as(dlm, args.family, folder))


def _prompts(model: DiffusionLM, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts: the task's first test questions in the ``tiny`` protocol, else random tokens."""
    if args.task:
        from stabledrl_bench.tasks import get_task

        task = get_task(args.task)
        specs = [task.prompt(doc, "tiny") for doc in task.eval_docs(limit=args.batch)]
        ids, mask = model.encode_prompts(
            [spec.messages for spec in specs], chat_template=specs[0].chat_template, prefill=specs[0].prefill
        )
        return ids.to(args.device), mask.to(args.device)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, model.vocab_size - 10, (args.batch, args.prompt_len), generator=gen).to(args.device)
    return ids, torch.ones_like(ids, dtype=torch.bool)


def _base_settings(args: argparse.Namespace) -> FullDecode:
    """d1's decoder at the benchmark's canvas (two tokens per step); each mode replaces some of its fields."""
    return FullDecode(
        max_completion_length=args.max_completion_length,
        block_length=args.block_length,
        steps=args.max_completion_length // 2,
    )


Run = tuple[DiffusionLM, FullDecode]


def _interleaved(
    runs: dict[Any, Run], ids: torch.Tensor, mask: torch.Tensor, repeats: int
) -> tuple[dict[Any, list[float]], dict[Any, GenerationOutput], str]:
    """Every run decoded once untimed (first-call allocations, kernel selection), then ``repeats`` rounds of all of
    them in turn (A B C ... A B C ...), so a load change hits every variant alike. Returns the times, the last
    outputs and the load average before and after, as one line."""
    for model, settings in runs.values():
        generate(model, ids[:1], mask[:1], settings)
    times: dict[Any, list[float]] = {key: [] for key in runs}
    outs: dict[Any, GenerationOutput] = {}
    before = os.getloadavg()
    for _ in range(repeats):
        for key, (model, settings) in runs.items():
            seconds, outs[key] = timed(lambda m=model, s=settings: generate(m, ids, mask, s))
            times[key].append(seconds)
            print(f"  {key}: {seconds:.2f} s", file=sys.stderr, flush=True)
    after = os.getloadavg()
    load = (
        f"load average (1/5/15 min) before: {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, "
        f"after: {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}"
    )
    return times, outs, load


def bench_decoding(args: argparse.Namespace) -> None:
    model = _model(args)
    model.model.to(args.device).eval()
    ids, mask = _prompts(model, args)
    base = _base_settings(args)
    names = args.modes.split(",")
    times, outs, load = _interleaved(
        {name: (model, dataclasses.replace(base, **MODES[name])) for name in names}, ids, mask, args.repeats
    )
    params = sum(p.numel() for p in model.model.parameters())
    source = f"config {args.config} after {args.sft_steps} SFT steps" if args.sft_steps else None
    source = source or args.checkpoint or f"random weights, config {args.config}"
    source += f", {args.task} prompts" if args.task else ", random prompts"
    source += f", as a {args.family} folder on the native {type(model).__name__}" if args.family != "tiny" else ""
    lines = [
        f"model: {source} ({params / 1e6:.1f}M parameters); L={args.max_completion_length} B={args.batch} "
        f"prompt={ids.shape[1]} block={args.block_length} steps={base.steps}; threads={torch.get_num_threads()} "
        f"device={args.device}; median of {args.repeats} interleaved runs",
        load,
        "",
        "| mode | settings | s (median) | tokens/s | NFE | vs exact | rows agree | tokens agree |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    exact_time = statistics.median(times["exact"]) if "exact" in times else None
    for name in names:
        seconds = statistics.median(times[name])
        fields = ", ".join(f"{k}={v}" for k, v in MODES[name].items()) or "reference sampler"
        ratio = f"{exact_time / seconds:.2f}x" if exact_time else "-"
        rows, tokens = agreement(model, outs[name], outs["exact"]) if "exact" in outs else (float("nan"),) * 2
        tok_s = args.batch * args.max_completion_length / seconds
        lines.append(
            f"| {name} | {fields} | {seconds:.2f} | {tok_s:.0f} | {outs[name].nfe} | {ratio} | {rows:.2f} | "
            f"{tokens:.3f} |"
        )
    print("\n".join(lines))
    if args.out:
        _write_report(args, lines)


def _write_report(args: argparse.Namespace, lines: list[str]) -> None:
    """``--out``: the table under a line naming the command, the commit, the machine and the date."""
    import platform
    import time

    from stabledrl_bench.reporting.provenance import cpu_model, git_state

    command = " ".join(["python", "benchmarks/bench_decoding.py", *sys.argv[1:]])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    head = (
        f"# Decoding modes against exact decoding\n\nWritten by `{command}` on {when}"
        f" at commit {(git_state()['commit'] or 'unknown')[:10]}, {cpu_model() or platform.processor()} "
        f"({os.cpu_count()} cores). Times are of one process decoding the batch, the modes interleaved."
    )
    Path(args.out).write_text("\n\n".join([head, "\n".join(lines)]) + "\n")


def bench_implementations(args: argparse.Namespace) -> None:
    """The native LLaDA against the published modeling file on the same weights, per mode, interleaved."""
    weights = load_diffusion_lm(args.checkpoint) if args.checkpoint else build_tiny(seed=0, **CONFIGS[args.config])
    folder = save_tiny_as(weights, "llada", Path(tempfile.mkdtemp(prefix="bench-remote-")) / "llada")
    for name in ("configuration_llada.py", "modeling_llada.py"):
        shutil.copy(Path(args.upstream) / name, folder / name)
    models = {
        "native": load_diffusion_lm(folder, implementation="native"),
        "remote": load_diffusion_lm(folder, implementation="remote", trust_remote_code=True),
    }
    for model in models.values():
        model.model.to(args.device).eval()
    ids, mask = _prompts(models["native"], args)
    base = _base_settings(args)
    names = args.modes.split(",")
    times, outs, load = _interleaved(
        {
            (impl, name): (model, dataclasses.replace(base, **MODES[name]))
            for name in names
            for impl, model in models.items()
        },
        ids,
        mask,
        args.repeats,
    )
    params = sum(p.numel() for p in models["native"].model.parameters())
    print(
        f"model: {args.checkpoint or f'random weights, config {args.config}'} as one LLaDA folder "
        f"({params / 1e6:.1f}M parameters): native {type(models['native']).__name__} vs the published file at "
        f"{args.upstream} ({type(models['remote']).__name__}, pad_free={models['remote'].pad_free}); "
        f"L={args.max_completion_length} B={args.batch} prompt={ids.shape[1]} block={args.block_length} "
        f"steps={base.steps}; threads={torch.get_num_threads()} device={args.device}; median of {args.repeats} "
        "interleaved runs"
    )
    print(load)
    print("| mode | native s | remote s | remote / native time | remote rows agree | remote tokens agree |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        native, remote = (statistics.median(times[impl, name]) for impl in models)
        rows, tokens = agreement(models["native"], outs["remote", name], outs["native", name])
        print(f"| {name} | {native:.2f} | {remote:.2f} | {remote / native:.2f}x | {rows:.2f} | {tokens:.3f} |")


def bench_rl_step(args: argparse.Namespace) -> None:
    """Wall time of RL steps (rollout + loss + update) with exact vs fast rollouts, interleaved."""
    from stabledrl_bench.core.budget import Budget
    from stabledrl_bench.training.config import TrainConfig
    from stabledrl_bench.training.optim import OptimConfig
    from stabledrl_bench.training.trainer import RLTrainer

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint
        if not checkpoint:
            checkpoint = str(Path(tmp) / "model")
            save_diffusion_lm(_model(args), checkpoint)

        def run(mode: str, index: int) -> float:
            budget = Budget(
                max_steps=1,
                prompts_per_step=args.batch // 4,
                num_generations=4,
                num_iterations=1,
                max_completion_length=args.max_completion_length,
                diffusion_steps=args.max_completion_length // 2,
                block_length=args.block_length,
                temperature=0.9,
                max_prompt_length=args.prompt_len,
                rollout_decode=mode,
            )
            cfg = TrainConfig(
                baseline="stabledrl",
                task=args.task or "countdown",
                model=checkpoint,
                protocol="tiny",
                train_split="generated",
                budget=budget,
                optim=OptimConfig(learning_rate=1e-5),
                per_device_prompts=budget.prompts_per_step,
                output_dir=str(Path(tmp) / f"{mode}-{index}"),
                progress=False,
            )
            trainer = RLTrainer(cfg)
            seconds, _ = timed(trainer.train)
            return seconds

        modes = args.rollout_modes.split(",")
        load_before = os.getloadavg()
        times = {mode: [] for mode in modes}
        for index in range(args.repeats):
            for mode in modes:
                times[mode].append(run(mode, index))
        load_after = os.getloadavg()
    print(
        f"RL step (stabledrl, {args.task or 'countdown'}, {args.batch} rollouts, L={args.max_completion_length}, "
        f"threads={torch.get_num_threads()}, median of {args.repeats} interleaved runs of train(): rollout, "
        "likelihoods, update, checkpoint)"
    )
    print(f"load average before: {load_before[0]:.2f}, after: {load_after[0]:.2f}")
    exact = statistics.median(times["exact"])
    for mode in modes:
        seconds = statistics.median(times[mode])
        print(f"| {mode} | {seconds:.2f} s | {exact / seconds:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=tuple(CONFIGS), default="default")
    parser.add_argument("--checkpoint", help="a trained full-attention tiny checkpoint instead of random weights")
    parser.add_argument(
        "--family",
        choices=("tiny", "llada", "dream"),
        default="tiny",
        help="run the weights as this family's folder on its native implementation (e.g. the dual cache on LLaDA)",
    )
    parser.add_argument(
        "--task",
        help="prompts from this task's test set (tiny protocol), e.g. for --checkpoint; --rl-step: the task trained "
        "on (default countdown)",
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-completion-length", type=int, default=256)
    parser.add_argument("--block-length", type=int, default=32)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--upstream", help="folder with LLaDA's published modeling files: native vs remote code")
    parser.add_argument(
        "--sft-steps", type=int, help="train the random weights of --config on --task for this many SFT steps first"
    )
    parser.add_argument(
        "--sft-dir", help="--sft-steps: its warm start's folder (a finished one is reused; default: a new one)"
    )
    parser.add_argument("--out", help="also write the table, with the command, commit and machine, to this file")
    parser.add_argument("--rl-step", action="store_true", help="time RL steps with exact vs fast rollouts instead")
    parser.add_argument("--rollout-modes", default="exact,fast", help=f"--rl-step: from {', '.join(DECODE_MODES)}")
    args = parser.parse_args()
    if args.sft_steps and (args.checkpoint or not args.task):
        parser.error("--sft-steps trains --config's random weights on --task: give --task, not --checkpoint")
    torch.set_num_threads(args.threads)
    if args.sft_steps:
        args.checkpoint = _trained(args)
    if args.rl_step:
        bench_rl_step(args)
    elif args.upstream:
        bench_implementations(args)
    else:
        bench_decoding(args)


if __name__ == "__main__":
    main()
