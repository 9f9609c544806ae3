"""The prepared GPU check: one unattended command (a few minutes on one GPU, no internet, no weights) -> a JSON report.

    accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 1 \\
        benchmarks/gpu_check.py --out benchmarks/reports/gpu_check.json

On CUDA it runs, in bf16 mixed precision under the launch's backend (FSDP2 above): one RL rollout phase (two
optimizer steps) of every Table 1 baseline with activation checkpointing, on the tiny model and on a
random-weight model of the tiny architecture at about 0.9 B parameters; peak GPU memory and seconds of each;
and decoding throughput of the d1 protocol's exact sampler against its Fast-dLLM-style fast mode on the large
model. Every loss must be finite and every step must change the weights (a check, recorded per run). The report
records the hardware, the software versions and each setting, so it can be committed as measured.

``--quick`` runs the same code on whatever device there is with a small model (CI runs it on the CPU so the script
cannot rot); its numbers mean nothing about a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from timing import timed

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.core.budget import Budget
from stabledrl_bench.core.models import build_tiny, save_diffusion_lm
from stabledrl_bench.core.sampling import DECODE_MODES, FullDecode, generate
from stabledrl_bench.experiments.comparison import TABLE_BASELINES
from stabledrl_bench.processes import is_main_process
from stabledrl_bench.training.config import TrainConfig
from stabledrl_bench.training.optim import OptimConfig
from stabledrl_bench.training.trainer import RLTrainer

SIZES = {
    "tiny": {},  # the tiny preset's model (~0.8 M parameters)
    "0.9B": {"hidden_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 16, "intermediate_size": 5632},
    "quick": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64},
}


def _hardware() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), gpus=torch.cuda.device_count())
    else:
        info.update(gpu=None, cpu=platform.processor() or platform.machine())
    return info


def _peak_reset() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if torch.cuda.is_available() else None


def rl_phase(checkpoint: Path, baseline: str, out: Path, *, canvas: int, bf16: bool) -> dict:
    """One rollout phase (two optimizer steps) of ``baseline``; seconds, peak memory, losses, weights changed."""
    budget = Budget(
        max_steps=2,
        prompts_per_step=2 * _world(),
        num_generations=8,
        num_iterations=2,
        max_completion_length=canvas,
        diffusion_steps=canvas // 2,
        block_length=min(32, canvas // 2),  # SPG draws its 2 Monte-Carlo blocks from at least 2
        temperature=0.9,
        max_prompt_length=64,
    )
    cfg = TrainConfig(
        baseline=baseline,
        task="countdown",
        model=str(checkpoint),
        protocol="tiny",
        train_split="generated",
        budget=budget,
        optim=OptimConfig(learning_rate=1e-4, max_grad_norm=1.0),
        per_device_prompts=1,
        bf16=bf16,
        gradient_checkpointing=True,
        output_dir=str(out),
        progress=False,
        check_model=False,
    )
    _peak_reset()
    trainer = RLTrainer(cfg)
    before = [p.detach().float().clone() for p in trainer.dlm.model.parameters()][:4]
    seconds, _ = timed(trainer.train)
    if trainer.replica is not None:
        trainer.replica.refresh(trainer.train_dlm.model)
    after = [p.detach().float() for p in trainer.dlm.model.parameters()][:4]
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()] if is_main_process() else []
    losses = [r["loss"] for r in log]
    return {
        "baseline": baseline,
        "seconds": round(seconds, 3),
        "peak_gib": _peak_gib(),
        "losses": losses,
        "grad_norms": [r["grad_norm"] for r in log],
        "finite": all(map(_finite, losses)),
        "weights_changed": any(not torch.equal(a, b) for a, b in zip(before, after, strict=True)),
        "distributed": trainer.run_info()["distributed"],
    }


def decoding(size: str, *, canvas: int, batch: int, device: str) -> dict:
    """Tokens per second of exact d1 decoding and of the fast mode, on random prompts (greedy)."""
    dlm = build_tiny(seed=0, **SIZES[size])
    dlm.model.to(device=device, dtype=torch.bfloat16 if device.startswith("cuda") else torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, dlm.vocab_size - 10, (batch, 64), generator=gen).to(device)
    mask = torch.ones_like(ids, dtype=torch.bool)
    base = FullDecode(max_completion_length=canvas, block_length=32, steps=canvas // 2)
    rows = {}
    for name, fields in (("exact", {}), ("fast", DECODE_MODES["fast"])):
        settings = dataclasses.replace(base, **fields)
        generate(dlm, ids[:1], mask[:1], settings)  # warm-up
        _peak_reset()
        with torch.no_grad():
            seconds, out = timed(lambda s=settings: generate(dlm, ids, mask, s))
        rows[name] = {
            "seconds": round(seconds, 3),
            "tokens_per_s": round(batch * canvas / seconds, 1),
            "nfe": out.nfe,
            "peak_gib": _peak_gib(),
        }
    rows["fast_speedup"] = round(rows["exact"]["seconds"] / rows["fast"]["seconds"], 2)
    return {"model": size, "canvas": canvas, "batch": batch, **rows}


def _world() -> int:
    from stabledrl_bench.processes import process_state

    return process_state().num_processes


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON report path")
    parser.add_argument("--quick", action="store_true", help="small model, short canvas: a check of the script")
    args = parser.parse_args()
    started = time.perf_counter()
    cuda = torch.cuda.is_available()
    device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    sizes = ["quick"] if args.quick else ["tiny", "0.9B"]
    canvas = 32 if args.quick else 256
    report: dict = {"hardware": _hardware(), "command": " ".join(sys.argv), "quick": args.quick, "rl": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            checkpoint = Path(tmp) / size
            if is_main_process():
                save_diffusion_lm(build_tiny(seed=0, **SIZES[size]), checkpoint)
            from stabledrl_bench.processes import barrier

            barrier()
            params = sum(p.numel() for p in build_tiny(seed=0, **SIZES[size]).model.parameters())
            runs = [
                rl_phase(checkpoint, baseline, Path(tmp) / f"{size}-{baseline}", canvas=canvas, bf16=cuda)
                for baseline in TABLE_BASELINES
            ]
            report["rl"][size] = {"parameters": params, "canvas": canvas, "bf16": cuda, "runs": runs}
        report["decoding"] = decoding(sizes[-1], canvas=canvas, batch=8 if args.quick else 16, device=device)
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["ok"] = all(run["finite"] and run["weights_changed"] for r in report["rl"].values() for run in r["runs"])
    if is_main_process():
        atomic_write_text(args.out, json.dumps(report, indent=2))
        print(f"gpu check: {'ok' if report['ok'] else 'FAILED'} in {report['seconds']} s -> {args.out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
