"""What the multi-process tests run: the same training and evaluation scenarios once on one process (in pytest) and
once under each shipped accelerate config on 2 CPU processes (``multiprocess_worker.py``), to compare.

Every scenario uses a small tiny model in one family's calling convention (``TinyDLMConfig.convention``), so the
family's backend, its FSDP block class and its probes are what runs, with activation checkpointing on. Rewards
and grades are a fixed function of the prompt, not of the random model's text: one of the two training prompts
has a group with mixed answers, the other only wrong ones, so every step has something to learn and a baseline
that drops uninformative groups (TraDo) drops every group of the process that got the second prompt.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
# config file -> accelerate's name for what runs on CPU processes
CONFIGS = {"ddp": "MULTI_CPU", "fsdp": "FSDP", "deepspeed_zero2": "DEEPSPEED"}

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
CONVENTIONS = ("native", "llada-hub", "llada", "dream", "sdar-chat", "sdar-trado")

# name -> (baseline, convention, prompts_per_step, per_device_prompts)
SCENARIOS: dict[str, tuple[str, str, int, int]] = {
    # a reference model, synced with the policy after step 2 (REF_SYNC); checkpoint selection (VALIDATED)
    "grpo-native": ("grpo", "native", 2, 1),
    "trado-sdar": ("trado", "sdar-trado", 2, 1),  # trajectory replay; one process drops every group
    "stabledrl-llada-hub": ("stabledrl", "llada-hub", 4, 2),  # pad-free: per-process counts of forward passes differ
    "espo-dream": ("espo", "dream", 2, 1),  # shifted logits, the Dream backend's dtype read through the wrapper
    "spg-llada": ("spg", "llada", 4, 1),  # two micro-batches per process
    "stabledrl-sdar-chat": ("stabledrl", "sdar-chat", 2, 1),  # staircase ELBO; SDAR-8B-Chat's train-mode branches
    "grpo-lora": ("grpo", "native", 2, 1),  # LoRA: the reference is the adapter-free model (the d1/SPG/ESPO recipes)
}
# The shared KL anchor (TrainConfig.anchor_beta) on two methods without a KL term of their own: a frozen reference
# under every wrapper only for it, its staircase ELBO on the block model, and a process whose groups are all dropped.
ANCHORED = {"spg-llada", "trado-sdar"}
STEPS = 4  # two rollout phases of mu = 2
# TRL's reference sync (BaselineConfig.sync_ref_model) after step 2: mixed shard into shard under FSDP2, from the
# unwrapped policy under DDP and DeepSpeed; the resumed grpo-native run must restore it from its checkpoint.
REF_SYNC = {"grpo-native": {"sync_ref_model": True, "ref_model_sync_steps": 2}}
# Validation after each rollout phase (4 generated puzzles, 16 tokens): each process decodes its share, the best
# weights are exported collectively, and the resumed run keeps the uninterrupted run's choice.
VALIDATED = {"grpo-native"}
# The log entries that must not depend on the number of processes.
LOGGED = ("loss", "grad_norm", "reward_mean", "reward_std", "accuracy", "kept_fraction", "nfe_total", "anchor_kl")
EVAL_DOCS = 6
# Every launched process runs with Python's fault handler, so a native abort prints each thread's Python stack.
LAUNCH_ENV = {"OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
# gloo can abort one process of a CPU launch as its interpreter shuts down, after the work is done and the report
# written: a gloo worker thread drops its last reference to a finished collective whose tensors own Python objects,
# needs the GIL for that, and the finalizing interpreter ends the thread, which terminates the process ("terminate
# called without an active exception"; core dump: ProcessGroupGloo::runLoop -> ~AsyncBarrierWork ->
# THPVariable_dealloc -> PyThread_exit_thread, with the main thread in Py_FinalizeEx). Seen in CI on a 2-process
# lm-eval run and on the 4-process FSDP launch, and here in 2 of 294 launches of the latter. Destroying the process
# group at exit (stabledrl_bench/processes.py) does not prevent it. Every launch here that ends in exactly this
# abort is run once more, from the folders it found (once_more_if_gloo_aborts); any other failure, or the abort
# again, fails the test.
GLOO_ABORT = "terminate called without an active exception"
# FSDP2 warns once per process and call site that a block returns a view (the tiny model's KV pair, never written
# in place); dropped from a failure's stderr so that the lines that say what failed fit in the message.
FSDP_VIEW_WARNING = ("returned a view tensor", "output = self._register_pre_backward_hook(output)")


def build_models(root: Path) -> dict[str, str]:
    """One saved checkpoint per convention, same seed (the native one full attention, sdar-trado block)."""
    from stabledrl_bench.core.models import build_tiny, save_diffusion_lm

    paths = {}
    for convention in CONVENTIONS:
        attention = "block" if convention.startswith("sdar") else "full"
        path = root / convention
        save_diffusion_lm(build_tiny(attention=attention, block_size=4, seed=5, convention=convention, **SMALL), path)
        paths[convention] = str(path)
    return paths


def two_prompts() -> list[dict[str, Any]]:
    """The training set: two generated Countdown puzzles (every step draws both, in a shuffled order)."""
    from stabledrl_bench.tasks import get_task

    return get_task("countdown").generate(2, seed=7, num_numbers=[3])


def fixed_grades(texts: list[str], docs: list[dict[str, Any]]) -> list[float]:
    """Correct on every other completion of the first prompt, never on the second (row order within a call)."""
    first = two_prompts()[0]
    return [float(doc == first and i % 2 == 0) for i, doc in enumerate(docs)]


def patch_task(monkeypatch_setattr) -> None:
    """Route the trainer's data, rewards and grades through the fixed functions above (``setattr``-like callable)."""
    from stabledrl_bench.tasks.base import GradeResult, RewardResult
    from stabledrl_bench.training import trainer as trainer_module

    def training_docs(task, split, seed, generator_options=None):
        del task, split, seed, generator_options
        return two_prompts()

    def reward_many(self, texts, docs, profile):
        del profile
        return [RewardResult.of(fixed=value) for value in fixed_grades(texts, docs)]

    def grade_many(self, texts, docs):
        return [GradeResult(correct=bool(v), score=v, extracted=None, details={}) for v in fixed_grades(texts, docs)]

    from stabledrl_bench.tasks.countdown import CountdownTask

    monkeypatch_setattr(trainer_module, "training_docs", training_docs)
    monkeypatch_setattr(CountdownTask, "reward_many", reward_many)
    monkeypatch_setattr(CountdownTask, "grade_many", grade_many)


def train_config(name: str, models: dict[str, str], out: Path, *, steps: int = STEPS, bf16: bool = False):
    from conftest import small_budget

    from stabledrl_bench.training.config import LoraSettings, TrainConfig
    from stabledrl_bench.training.optim import OptimConfig
    from stabledrl_bench.training.validation import ValidationConfig

    baseline, convention, prompts, per_device = SCENARIOS[name]
    budget = small_budget(max_steps=steps, prompts_per_step=prompts, max_prompt_length=40)
    options = {"overlong_margin": None} if baseline == "trado" else REF_SYNC.get(name, {})
    lora = LoraSettings(r=4, alpha=8, dropout=0.0, target_modules=["qkv"]) if name == "grpo-lora" else None
    return TrainConfig(
        baseline=baseline,
        task="countdown",
        model=models[convention],
        protocol="tiny" if name != "stabledrl-llada-hub" else "d1",  # d1 prompts differ in length: padding
        train_split="generated",
        budget=budget,
        optim=OptimConfig(learning_rate=3e-3, lr_scheduler_type="linear", max_grad_norm=1.0, weight_decay=0.1),
        baseline_options=options,
        anchor_beta=0.04 if name in ANCHORED else 0.0,
        per_device_prompts=per_device,
        estimator_micro_batch=3,  # chunks of 3 rows: the counts differ between processes where rows do
        gradient_checkpointing=True,
        bf16=bf16,
        lora=lora,
        validation=ValidationConfig(every=2, items=4, protocol="tiny") if name in VALIDATED else ValidationConfig(),
        output_dir=str(out),
        progress=False,
    )


def final_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def run_training(
    name: str, models: dict[str, str], out: Path, *, probe=None, bf16: bool = False, **train_kwargs
) -> dict[str, Any]:
    """Train a scenario (``bf16``: under bf16 mixed precision); returns the per-step log entries that must not depend
    on the number of processes (and what ``probe(trainer)`` returns, called before training)."""
    from stabledrl_bench.training.runlog import read_log
    from stabledrl_bench.training.trainer import VALIDATION_FILE, RLTrainer

    trainer = RLTrainer(train_config(name, models, out, bf16=bf16))
    result: dict[str, Any] = {} if probe is None else {"processes": probe(trainer)}
    trainer.train(**train_kwargs)
    result["log"] = [{k: r[k] for k in LOGGED if k in r} for r in read_log(out / "log.jsonl")]
    if (out / VALIDATION_FILE).is_file():
        validation = json.loads((out / VALIDATION_FILE).read_text())
        result["validation"] = {"best": validation["best"]["step"], "history": validation["history"]}
    return result


# name -> (convention, protocol): greedy full attention, and block diffusion sampling at T=1 (keyed per batch)
EVALUATIONS = {"greedy": ("native", "tiny"), "sampled": ("sdar-trado", "tracerl-dynamic")}


def run_evaluation(name: str, models: dict[str, str], results: Path) -> dict[str, Any]:
    """Evaluate and record one checkpoint (3 batches of 2 prompts); returns the record without its timings."""
    import json

    from stabledrl_bench.core.models.backends import load_model_spec
    from stabledrl_bench.evaluation.native import evaluate_and_record, model_record

    convention, protocol = EVALUATIONS[name]
    dlm = load_model_spec(models[convention])
    key = {
        "comparison": "multiprocess",
        "table": "table1",
        "preset": "test",
        "baseline": "base",
        "task": "countdown",
        "length": 128,  # the nominal length; 16 tokens are decoded (as the tiny presets scale them)
        "sampling": None,
        "protocol": protocol,
        "seed": 0,
        "model": model_record(dlm, models[convention]),
    }
    recorded = evaluate_and_record(
        dlm,
        results_dir=results,
        key=key,
        max_completion_length=16,
        budget=None,
        limit=EVAL_DOCS,
        batch_size=2,
        progress=False,
    )
    record = json.loads(recorded.path.read_text())
    timing = ("wall_time_s", "tokens_per_s")
    return {
        "metrics": {k: v for k, v in record["metrics"].items() if k not in timing},
        "samples_sha256": record["samples_sha256"],
        "settings": record["settings"],
        "files": sorted(p.name for p in results.rglob("*.json")),
    }


def launch(
    config: str, *args: str, timeout: int = 600, processes: int = 2, fresh: Path | None = None, **options
) -> subprocess.CompletedProcess:
    """``accelerate launch --config_file configs/accelerate/<config>.yaml`` on ``processes`` CPU processes
    (``options``: :func:`~stabledrl_bench.processes.launch_command`'s, e.g. ``mixed_precision="bf16"``). Launched
    once more if gloo aborts it (:func:`once_more_if_gloo_aborts`; ``fresh``: the folder it writes in)."""
    from stabledrl_bench.processes import launch_command

    env = {**os.environ, **LAUNCH_ENV}
    cmd = [*launch_command(config, processes, **options), *args]

    def attempt() -> list[subprocess.CompletedProcess]:
        return [subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)]

    (proc,) = once_more_if_gloo_aborts(config, attempt, [] if fresh is None else [fresh])
    return proc


def launch_nodes(
    config: str, *args: str, folders: list[Path], per_node: int = 2, timeout: int = 600, fresh: Path, **options
) -> list[str]:
    """A multi-node launch rehearsed on this host: one ``accelerate launch`` per node (``--machine_rank i``, node i
    running in ``folders[i]``, its own working folder) of ``per_node`` processes each, meeting at 127.0.0.1 on a
    free port (``options``: :func:`launch`'s). Returns every node's stdout; a node that fails fails the test with its
    stderr. Launched once more if gloo aborts it (:func:`once_more_if_gloo_aborts`; ``fresh``: the folder the run
    writes in, beside the nodes' own)."""
    import socket

    from stabledrl_bench.processes import launch_command

    env = {**os.environ, **LAUNCH_ENV}
    total = per_node * len(folders)

    def attempt() -> list[subprocess.CompletedProcess]:
        with socket.socket() as probe:  # a port free now, which both nodes are told (0 would give each its own)
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        nodes = [
            subprocess.Popen(
                [*launch_command(config, total, machines=len(folders), machine_rank=rank, port=port, **options), *args],
                cwd=folder,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank, folder in enumerate(folders)
        ]
        outputs = [node.communicate(timeout=timeout) for node in nodes]
        return [
            subprocess.CompletedProcess(node.args, node.returncode, *out)
            for node, out in zip(nodes, outputs, strict=True)
        ]

    procs = once_more_if_gloo_aborts(config, attempt, [*folders, fresh])
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, (rank, failure(proc.stderr))
    return [proc.stdout for proc in procs]


def once_more_if_gloo_aborts(
    config: str, attempt: Callable[[], list[subprocess.CompletedProcess]], fresh: list[Path]
) -> list[subprocess.CompletedProcess]:
    """``attempt()``, a launch (one process per node), and once more if every process of it that failed ended in
    gloo's abort (GLOO_ABORT), with a warning carrying the first try's stderr. The second try finds each folder of
    ``fresh`` as the first did: what the first added is removed. Any other failure, or the abort again, is left to
    the caller."""
    before = {folder: set(folder.iterdir()) if folder.exists() else None for folder in fresh}
    procs = attempt()
    failed = [proc for proc in procs if proc.returncode != 0]
    if not failed or not all(GLOO_ABORT in proc.stderr for proc in failed):
        return procs
    stderr = "\n".join(failure(proc.stderr) for proc in failed)
    warnings.warn(f"gloo aborted a process of the {config} launch; launched again:\n{stderr}", stacklevel=3)
    for folder, kept in before.items():
        if not folder.exists():
            continue
        added = [folder] if kept is None else set(folder.iterdir()) - kept  # a folder the first try made goes whole
        for path in added:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
    return attempt()


def run_on_one_process(
    models: dict[str, str],
    out: Path,
    *,
    scenarios: tuple[str, ...] = tuple(SCENARIOS),
    evaluations: tuple[str, ...] = tuple(EVALUATIONS),
    bf16: bool = False,
) -> dict[str, Any]:
    """The scenarios in this process (one thread, the fixed rewards; ``bf16``: under bf16 mixed precision)."""
    import pytest
    from accelerate.state import AcceleratorState

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch_task(patch.setattr)
            report = {name: run_training(name, models, out / name, bf16=bf16) for name in scenarios}
            report.update({name: run_evaluation(name, models, out / f"results-{name}") for name in evaluations})
    finally:
        AcceleratorState._reset_state()  # no bf16 left behind for a test that builds a plain Accelerator()
        torch.set_num_threads(threads)
    return report


def run_launched(config: str, models: dict[str, str], out: Path, *names: str, **options) -> dict[str, Any]:
    """The scenarios ``names`` (default: all, resumed and evaluations too) under ``configs/accelerate/<config>.yaml``
    (``options``: :func:`launch`'s; 2 processes in full precision by default): rank 0's report."""
    out.mkdir(parents=True, exist_ok=True)
    models_json = out / "models.json"
    models_json.write_text(json.dumps(models))
    worker = str(ROOT / "tests" / "multiprocess_worker.py")
    proc = launch(config, worker, str(models_json), str(out), *names, fresh=out, **options)
    assert proc.returncode == 0, failure(proc.stderr)
    return json.loads((out / "report.json").read_text())


def failure(stderr: str, chars: int = 4000) -> str:
    """The end of a failed launch's stderr, without FSDP2's view warnings (FSDP_VIEW_WARNING)."""
    lines = [line for line in stderr.splitlines() if not any(part in line for part in FSDP_VIEW_WARNING)]
    return "\n".join(lines)[-chars:]


def assert_same_training(ours: dict[str, Any], theirs: dict[str, Any], scenario: str) -> None:
    """Loss, gradient norm, reward and kept fraction of every step equal within 1e-5 (relative or absolute)."""
    assert len(ours["log"]) == len(theirs["log"]) == STEPS
    assert ours.get("validation") == theirs.get("validation"), scenario  # greedy decodes of the same weights
    for step, (a, b) in enumerate(zip(ours["log"], theirs["log"], strict=True), start=1):
        for key in LOGGED:
            if key in b:
                assert math.isclose(a[key], b[key], rel_tol=1e-5, abs_tol=1e-5), (scenario, step, key, a[key], b[key])


def deviation(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    """Per logged entry, the largest difference over the steps relative to the largest value ``theirs`` reached
    (loss and KL cross zero, so a step-by-step relative error would divide by nearly nothing)."""
    assert len(ours["log"]) == len(theirs["log"]) == STEPS
    found = {}
    for key in LOGGED:
        pairs = [(a[key], b[key]) for a, b in zip(ours["log"], theirs["log"], strict=True) if key in b]
        if pairs:
            scale = max(abs(b) for _, b in pairs) or 1.0
            found[key] = max(abs(a - b) for a, b in pairs) / scale
    return found
