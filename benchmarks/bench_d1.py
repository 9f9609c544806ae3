"""One RL step of the official d1 trainer (diffu-GRPO) against this harness's ``grpo``, at identical settings on
the same tiny LLaDA-layout checkpoint on CPU: wall time of each part, in interleaved runs.

Opt-in: it needs a checkout of ``dllm-reasoning/d1`` and a separate environment with the versions d1 pins
(``env.yml``: transformers 4.49.0, accelerate 1.4.0, peft 0.15.1, datasets 3.3.2, TRL at commit 0f88c17;
huggingface-hub below 1.0), e.g. ``/tmp/d1-venv`` whose other packages (torch) come from this environment:

    python3 -m venv /tmp/d1-venv
    echo "$(python -c 'import site; print(site.getsitepackages()[0])')" \\
        > /tmp/d1-venv/lib/python3.11/site-packages/this_env.pth
    /tmp/d1-venv/bin/pip install --no-deps transformers==4.49.0 accelerate==1.4.0 peft==0.15.1 \\
        tokenizers==0.21.0 datasets==3.3.2 huggingface-hub==0.29.3 /path/to/trl-at-0f88c17
    nice -n 10 python benchmarks/bench_d1.py --d1 /path/to/d1 --d1-python /tmp/d1-venv/bin/python \\
        --out benchmarks/reports/d1_side_by_side

Nothing of d1 is copied: its trainer is imported from the checkout and run with these shims, applied at run time
only (the report lists them): a stand-in ``wandb`` module (d1 imports it at the top; no run logs to it); the policy
is this package's native LLaDA network built from the checkpoint folder (d1 loads LLaDA's Hub remote code, which
cannot be downloaded here; both compute the same function, ``tests/test_native_models.py``); the trainer gets the
CPU through ``use_cpu`` (its ``torch.cuda`` calls, ``empty_cache`` and a disabled autocast, do nothing on CPU).

Both sides train d1's LoRA (d1's trainer takes its reference as the policy with the adapter disabled, so it cannot
train without one), run one prompt x ``generations`` completions, d1's sampler settings (diffusion steps, block
length, temperature, low-confidence remasking), two inner iterations (mu = 2: d1's trainer fails at mu = 1 with
beta > 0), beta 0.04 (a reference pass), one thread, and time the same parts of the phase's first optimizer step:
sampling (``generate``), the likelihood passes (d1's ``_get_per_token_logps`` and the harness's estimator; no-grad
passes, i.e. the rollout policy's and the reference's, apart from the policy's pass with gradients), the backward
pass, and the whole step (sampling, scoring, estimates, loss, backward, optimizer step). Each side runs in its own
process; the two alternate ``--repeats`` times and the report gives the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {
    "generations": 4,
    "max_completion_length": 32,
    "diffusion_steps": 16,
    "block_length": 8,
    "temperature": 0.9,
    "beta": 0.04,
    "num_iterations": 2,  # d1's trainer needs mu > 1 with a KL term (its reference pass reads the mu-expanded batch)
    "epsilon": 0.5,
    "p_mask_prompt": 0.15,
    "learning_rate": 1e-6,
}
MODEL = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 704}
# Two output vocabularies on the same small body: the tiny tokenizer's (the body's matrix products dominate, as in a
# large model's blocks) and LLaDA's 126,464 (the output head and whatever a sampler does over the whole vocabulary
# dominate). An 8B model lies between: its head is about 7% of a position's multiply-adds (4096 x 126,464 of 7.5B).
VOCABULARIES = {"tiny tokenizer's vocabulary (112)": None, "LLaDA's vocabulary (126,464)": 126_464}
# d1's LoRA (diffu_grpo_train.py, slurm_scripts/train.yaml): r 128, alpha 64, dropout 0.05 on q/k/v/o/up/down/gate
# projections, of which LLaDA's blocks have q_proj, k_proj, v_proj and up_proj. d1's trainer needs LoRA: its
# reference is the policy with the adapter disabled.
LORA = {"r": 128, "alpha": 64, "dropout": 0.05, "target_modules": ["q_proj", "k_proj", "v_proj", "up_proj"]}
PARTS = ("sampling", "likelihood, no grad", "likelihood, with grad", "backward", "step")


class Clock:
    """Seconds spent in wrapped functions, by part (a wrapped call inside another counts in both)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, owner: object, name: str, part: Callable[..., str] | str) -> None:
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            import torch

            key = part if isinstance(part, str) else part(torch.is_grad_enabled())
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[key] += time.perf_counter() - start

        setattr(owner, name, timed)


def likelihood_part(grad: bool) -> str:
    return "likelihood, with grad" if grad else "likelihood, no grad"


# --------------------------------------------------------------------------------------------------- d1's side
def d1_step(d1: Path, checkpoint: Path, prompt_tokens: int) -> dict[str, float]:
    """One step of d1's DiffuGRPOTrainer (its own process, d1's environment)."""
    import importlib.machinery
    import types

    stub = types.ModuleType("wandb")  # shim 1: d1 imports wandb at the top; nothing here logs to it
    stub.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    sys.modules["wandb"] = stub
    sys.path.insert(0, str(d1 / "diffu-grpo"))
    sys.path.insert(0, str(REPO))
    import diffu_grpo_trainer
    import torch
    from datasets import Dataset
    from diffu_grpo_config import DiffuGRPOConfig
    from diffu_grpo_trainer import DiffuGRPOTrainer
    from peft import LoraConfig
    from transformers import PreTrainedTokenizerFast

    from stabledrl_bench.core.models.llada import LLaDANativeModel

    # shim 5: d1 seeds its masks with a one-element tensor, which Python 3.11's random.seed refuses (3.10 took it)
    seed_everything = diffu_grpo_trainer.set_seed
    diffu_grpo_trainer.set_seed = lambda seed, *args, **kwargs: seed_everything(int(seed), *args, **kwargs)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # shim 4: the folder's tokenizer class is transformers 5's name; transformers 4.49 reads the same tokenizer.json
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    special = {key: config[key] for key in ("eos_token", "mask_token", "pad_token", "unk_token")}
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(checkpoint / "tokenizer.json"), **special)
    model = LLaDANativeModel.from_pretrained(checkpoint)  # shim 2: the native network, not the Hub's remote code
    s = SETTINGS
    with tempfile.TemporaryDirectory() as tmp:
        args = DiffuGRPOConfig(
            output_dir=tmp,
            use_cpu=True,  # shim 3: CPU
            report_to=[],
            per_device_train_batch_size=s["generations"],
            num_generations=s["generations"],
            generation_batch_size=s["generations"],
            max_prompt_length=prompt_tokens,
            max_completion_length=s["max_completion_length"],
            diffusion_steps=s["diffusion_steps"],
            block_length=s["block_length"],
            temperature=s["temperature"],
            num_iterations=s["num_iterations"],
            beta=s["beta"],
            epsilon=s["epsilon"],
            p_mask_prompt=s["p_mask_prompt"],
            learning_rate=s["learning_rate"],
            mask_id=tokenizer.mask_token_id,
            max_steps=1,
            save_strategy="no",
            logging_steps=1,
            bf16=False,
        )
        prompt = "7" * prompt_tokens  # the harness's prompt length, one character per token
        trainer = DiffuGRPOTrainer(
            model=model,
            reward_funcs=[lambda prompts, completions, **kw: [float(len(c) % 3) for c in completions]],
            args=args,
            train_dataset=Dataset.from_list([{"prompt": prompt}] * 8),
            processing_class=tokenizer,
            peft_config=LoraConfig(
                r=LORA["r"],
                lora_alpha=LORA["alpha"],
                lora_dropout=LORA["dropout"],
                target_modules=LORA["target_modules"],
                task_type="CAUSAL_LM",
            ),
        )
        clock = Clock()
        clock.wrap(DiffuGRPOTrainer, "generate", "sampling")
        clock.wrap(DiffuGRPOTrainer, "_get_per_token_logps", likelihood_part)
        clock.wrap(trainer.accelerator, "backward", "backward")
        trainer.create_optimizer()
        inputs = next(iter(trainer.get_train_dataloader()))
        start = time.perf_counter()
        trainer.training_step(trainer.model, inputs)
        trainer.optimizer.step()
        clock.seconds["step"] = time.perf_counter() - start
    return dict(clock.seconds)


# ------------------------------------------------------------------------------------------- the harness's side
def harness_step(checkpoint: Path) -> dict[str, float]:
    """One step of the harness's ``grpo`` at the same settings (its own process, this environment)."""
    import torch

    import stabledrl_bench.core.rollouts as rollouts_module
    from stabledrl_bench.core.budget import Budget
    from stabledrl_bench.core.estimators import D1OneStep
    from stabledrl_bench.training.config import LoraSettings, TrainConfig
    from stabledrl_bench.training.optim import OptimConfig
    from stabledrl_bench.training.trainer import RLTrainer

    torch.set_num_threads(1)
    s = SETTINGS
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(
            baseline="grpo",
            baseline_options={"beta": s["beta"], "epsilon": s["epsilon"], "p_mask_prompt": s["p_mask_prompt"]},
            task="countdown",
            model=str(checkpoint),
            protocol="tiny",
            train_split="generated",
            budget=Budget(
                max_steps=s["num_iterations"],
                prompts_per_step=1,
                num_generations=s["generations"],
                num_iterations=s["num_iterations"],
                max_completion_length=s["max_completion_length"],
                diffusion_steps=s["diffusion_steps"],
                block_length=s["block_length"],
                temperature=s["temperature"],
                max_prompt_length=64,
            ),
            optim=OptimConfig(learning_rate=s["learning_rate"], max_grad_norm=1.0),
            lora=LoraSettings(**LORA),
            output_dir=tmp,
            progress=False,
            check_model=False,
        )
        trainer = RLTrainer(cfg)
        clock = Clock()
        clock.wrap(rollouts_module, "generate", "sampling")  # the default rollout scheme samples through it
        clock.wrap(D1OneStep, "evaluate", likelihood_part)
        clock.wrap(trainer.acc, "backward", "backward")
        start = time.perf_counter()
        micro_batches, _ = trainer.rollout()
        trainer.optimizer_step(micro_batches, 0)
        clock.seconds["step"] = time.perf_counter() - start
        clock.seconds["prompt tokens"] = micro_batches[0].batch.prompt_ids.shape[1]
    return dict(clock.seconds)


# ------------------------------------------------------------------------------------------------ the driver
def run_side(python: str, side: str, *args: str) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([python, __file__, "--side", side, *args], capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"error: the {side} side failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d1", type=Path, help="a checkout of dllm-reasoning/d1")
    parser.add_argument("--d1-python", default="/tmp/d1-venv/bin/python", help="python of d1's environment")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="report path without suffix (.json and .md are written)")
    parser.add_argument("--side", choices=["d1", "harness"], help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--prompt-tokens", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "d1":
        print(json.dumps(d1_step(args.d1, args.checkpoint, args.prompt_tokens)))
        return 0
    if args.side == "harness":
        print(json.dumps(harness_step(args.checkpoint)))
        return 0
    if args.d1 is None or not (args.d1 / "diffu-grpo" / "diffu_grpo_trainer.py").is_file():
        raise SystemExit("error: --d1 must be a checkout of dllm-reasoning/d1 (diffu-grpo/diffu_grpo_trainer.py)")
    if not args.out:
        raise SystemExit("error: --out is required")
    from stabledrl_bench.atomic import atomic_write_text

    runs: dict[str, dict[str, list[dict[str, float]]]] = {name: {"d1": [], "harness": []} for name in VOCABULARIES}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoints = {name: _checkpoint(Path(tmp) / name, size) for name, size in VOCABULARIES.items()}
        for _ in range(args.repeats):  # interleaved: a load change hits both sides and both models alike
            for name, checkpoint in checkpoints.items():
                runs[name]["harness"].append(run_side(sys.executable, "harness", "--checkpoint", str(checkpoint)))
                tokens = str(int(runs[name]["harness"][-1]["prompt tokens"]))
                d1_args = ("--d1", str(args.d1), "--checkpoint", str(checkpoint), "--prompt-tokens", tokens)
                runs[name]["d1"].append(run_side(args.d1_python, "d1", *d1_args))
    text = _report(runs, args.repeats, load_before, os.getloadavg())
    atomic_write_text(f"{args.out}.json", json.dumps({"settings": SETTINGS, "model": MODEL, "runs": runs}, indent=1))
    atomic_write_text(f"{args.out}.md", text)
    print(text)
    return 0


def _checkpoint(folder: Path, vocab_size: int | None) -> Path:
    """The random-weight LLaDA-layout checkpoint both sides load (the tiny char tokenizer; a larger output
    vocabulary only widens the head: its extra ids never come out of the tokenizer)."""
    from stabledrl_bench.core.models import build_tiny
    from stabledrl_bench.core.models.convert import save_tiny_as

    extra = {} if vocab_size is None else {"vocab_size": vocab_size}
    return save_tiny_as(build_tiny(seed=0, **MODEL, **extra), "llada", folder)


def _report(runs: dict, repeats: int, load_before: tuple[float, ...], load_after: tuple[float, ...]) -> str:
    """Markdown: per vocabulary, the medians of each part and the step ratio of every interleaved pair."""
    loads = " / ".join(f"{x:.2f}" for x in load_before), " / ".join(f"{x:.2f}" for x in load_after)
    lines = [
        "# One RL step: d1's diffu-GRPO trainer against this harness's grpo",
        "",
        f"Written by `benchmarks/bench_d1.py` on {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC: "
        f"{platform.machine()} CPU ({os.cpu_count()} cores), one thread per side; load average {loads[0]} before and "
        f"{loads[1]} after; {repeats} interleaved pairs of runs per model, each side in a fresh process (seconds, "
        "medians).",
        f"Model: a random-weight LLaDA-layout checkpoint {MODEL}, once with the tiny tokenizer's vocabulary and once "
        f"with LLaDA's; settings {SETTINGS}.",
    ]
    for name, sides in runs.items():
        median = {side: {p: statistics.median(r.get(p, 0.0) for r in rs) for p in PARTS} for side, rs in sides.items()}
        lines += ["", f"## {name}", "", "| part | d1 | harness | d1 / harness |", "|---|---:|---:|---:|"]
        for part in PARTS:
            d, h = median["d1"][part], median["harness"][part]
            lines.append(f"| {part} | {d:.3f} | {h:.3f} | {d / h:.2f} |" if h else f"| {part} | {d:.3f} | - | - |")
        ratios = [d["step"] / h["step"] for d, h in zip(sides["d1"], sides["harness"], strict=True)]
        lines += ["", "Step ratio (d1 / harness) of each pair, in order: " + ", ".join(f"{r:.2f}" for r in ratios)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
