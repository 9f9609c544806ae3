"""``reproduce table1|table2``: warm start, train every baseline under one budget, evaluate, rebuild the board.

Presets (``--preset``):

* ``paper`` - the official StableDRL settings on real weights (``--model`` = LLaDA-8B-Instruct for Table 1,
  SDAR-8B for Table 2): full-parameter RL, 32 prompts x 16 completions per step, mu = 2, 2000 steps, lr 2e-6
  (GSM8K, MATH) / 1e-6 (Countdown, Sudoku), bf16, gradient checkpointing; launch under ``accelerate launch``
  with one of the configs in ``configs/accelerate/``. Evaluates with the d1 protocol at 128/256/512 (Table 1)
  or TraceRL's static/dynamic protocol (Table 2).
* ``tiny`` - the built-in tiny model on a laptop CPU: masked-diffusion SFT warm start, then RL for every
  baseline, on the tasks a tiny model can learn; lengths are scaled down and labelled as such.
* ``smoke`` - minutes: a few steps of everything, used by CI to prove the pipeline end to end.

The presets are declared in ``configs/presets/table1.yaml`` and ``table2.yaml``. The paper presets reuse the
StableDRL GPU recipe (``configs/recipes/stabledrl/``) for the budget, optimizer, prompts, rewards and per-task
train split and learning rate, so the paper's settings are written in one place.

``--pass-k N`` adds a sampled evaluation of every checkpoint: each test problem decoded N times at
``--temperature`` under every protocol of the preset (protocol ``<name>-n<N>-t<T>``), reported as pass@k and maj@k
in their own leaderboard block with a pass@k plot.

``auto`` (the default) picks ``paper`` when a GPU and ``--model`` are present, else ``tiny``. Everything is
resumable: finished trainings and evaluations are skipped, interrupted trainings resume from their checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.config import configs_dir, deep_merge, from_dict, read_mapping, read_recipe
from stabledrl_bench.core.baseline import BASELINES
from stabledrl_bench.core.models.backends import TINY_SPECS, load_model_spec
from stabledrl_bench.core.models.probes import require_conventions
from stabledrl_bench.errors import INT64_LIMIT, UserError, comma_list
from stabledrl_bench.evaluation.native import evaluate_and_record, model_record
from stabledrl_bench.evaluation.protocols import EvalProtocol, get_protocol, sampled_protocol
from stabledrl_bench.experiments.runner import (
    CONTROL_BASELINE,
    TrainJob,
    WarmStart,
    control_config,
    ensure_warm_start,
    run_training,
)
from stabledrl_bench.experiments.stages import Stages
from stabledrl_bench.processes import barrier, is_main_process
from stabledrl_bench.reporting.leaderboard import write_leaderboard
from stabledrl_bench.reporting.naming import ResultKey
from stabledrl_bench.reporting.training import (
    CONTROL_RUN,
    TRAINING_COLUMNS,
    TRAINING_WINDOW,
    read_training,
    training_changes,
    training_path,
)
from stabledrl_bench.training.budget import Budget
from stabledrl_bench.training.optim import OptimConfig
from stabledrl_bench.training.runlog import read_log
from stabledrl_bench.training.sft import SFTConfig
from stabledrl_bench.training.trainer import TrainConfig

TABLE_BASELINES = ("grpo", "spg", "espo", "trado", "stabledrl")


@dataclass
class TaskRecipe:
    """Per-task settings of a preset (data split, learning rate, generator options for RL and for SFT)."""

    train_split: str = "train"
    learning_rate: float = 1e-6
    generator_options: dict[str, Any] = field(default_factory=dict)
    sft_generator_options: dict[str, Any] | None = None  # None: same puzzles as RL
    sft: dict[str, Any] = field(default_factory=dict)  # this task's changes to the preset's SFT warm start
    default: bool = True  # run by a plain `reproduce`; False: only when named with --tasks (a costly extra column)


@dataclass
class Preset:
    name: str
    description: str
    model: str | None  # None: the user must pass --model
    tasks: dict[str, TaskRecipe]
    budget: Budget
    protocols: tuple[str, ...]  # evaluation protocol(s); Table 2 has a static and a dynamic one
    prompt_protocol: str  # training prompts
    reward_profile: str  # training rewards
    lengths: dict[int, int]  # nominal length (table column) -> tokens actually decoded
    optim: OptimConfig = field(default_factory=OptimConfig)
    sft: SFTConfig | None = None  # warm start (tiny / smoke); None: RL starts from the given model
    per_device_prompts: int = 1
    dtype: str = "float32"  # the trained (master) weights
    bf16: bool = False  # bf16 mixed precision
    gradient_checkpointing: bool = False
    eval_limit: int | None = None
    eval_batch_size: int = 64
    save_every: int = 0
    seeds: tuple[int, ...] = (0,)

    def task_sft(self, task: str) -> SFTConfig | None:
        """The warm start of ``task``: the preset's SFT with the task's own changes (its ``sft:`` entry)."""
        recipe = self.tasks[task]
        if self.sft is None:
            if recipe.sft:
                raise UserError(f"preset {self.name!r}: task {task} changes an SFT warm start the preset does not have")
            return None
        merged = deep_merge(dataclasses.asdict(self.sft), recipe.sft)
        return from_dict(SFTConfig, merged, where=f"preset {self.name}: tasks.{task}.sft")

    def default_tasks(self) -> list[str]:
        return [task for task, recipe in self.tasks.items() if recipe.default]


# What a preset takes from a GPU recipe (recipe key -> preset key). The rest of a recipe (its baseline, seed,
# baseline options) belongs to a single-method run, not to a comparison of methods.
_FROM_RECIPE = {
    "protocol": "prompt_protocol",
    "reward_profile": "reward_profile",
    "budget": "budget",
    "optim": "optim",
    "per_device_prompts": "per_device_prompts",
    "dtype": "dtype",
    "bf16": "bf16",
    "gradient_checkpointing": "gradient_checkpointing",
    "save_every": "save_every",
}
# Keys a derived preset replaces instead of merging into its base: they list what is compared, not settings.
_REPLACED = ("tasks", "lengths", "protocols")


def presets_dir() -> Path:
    return configs_dir() / "presets"


def presets(table: str) -> dict[str, Preset]:
    """The presets of ``table``, read from ``configs/presets/<table>.yaml`` (see the comments there)."""
    path = presets_dir() / f"{table}.yaml"
    names = read_mapping(path)
    return {name: _build_preset(name, _raw_preset(path, name, ()), f"{path.name}: {name}") for name in names}


def _raw_preset(path: Path, name: str, seen: tuple[str, ...]) -> dict[str, Any]:
    """One preset's mapping with its ``base:`` preset and ``recipe:`` merged under it (own keys win)."""
    where = f"{path.name}:{name}"
    if where in seen:
        raise UserError(f"{where}: presets include each other in a cycle ({' -> '.join((*seen, where))})")
    entries = read_mapping(path)
    if not isinstance(entries.get(name), dict):
        raise UserError(f"{path}: no preset {name!r} (presets: {', '.join(entries)})")
    entry = dict(entries[name])
    merged: dict[str, Any] = {}
    base = entry.pop("base", None)
    if base is not None:
        file, _, ref = str(base).rpartition(":")
        merged = _raw_preset(path.parent / file if file else path, ref, (*seen, where))
    recipe = entry.pop("recipe", None)
    if recipe is not None:
        data = read_recipe(recipe)
        merged = deep_merge(merged, {ours: data[theirs] for theirs, ours in _FROM_RECIPE.items() if theirs in data})
    merged = deep_merge(merged, entry)
    merged.update({key: entry[key] for key in _REPLACED if key in entry})
    return merged


def _task_recipe(task: str, entry: Any, where: str) -> TaskRecipe:
    """A preset's task entry: its own keys over those of its ``recipe:`` (train split, learning rate, generator)."""
    if not isinstance(entry, dict):
        raise UserError(f"{where}.tasks.{task}: expected a mapping, got {entry!r}")
    entry = dict(entry)
    recipe = entry.pop("recipe", None)
    fields: dict[str, Any] = {}
    if recipe is not None:
        data = read_recipe(recipe)
        fields = {"train_split": data.get("train_split", "train"), "learning_rate": data["optim"]["learning_rate"]}
        if "generator_options" in data:
            fields["generator_options"] = data["generator_options"]
    return from_dict(TaskRecipe, {**fields, **entry}, where=f"{where}.tasks.{task}")


def _build_preset(name: str, data: dict[str, Any], where: str) -> Preset:
    data = dict(data)
    data["tasks"] = {task: _task_recipe(task, entry, where) for task, entry in dict(data.get("tasks") or {}).items()}
    preset = from_dict(Preset, {"name": name, **data}, where=where)
    for task in preset.tasks:
        preset.task_sft(task)  # a bad per-task SFT key fails when the preset is read, not an hour into the job
    return preset


def choose_preset(table: str, requested: str, model: str | None) -> Preset:
    available = presets(table)
    if requested == "auto":
        requested = "paper" if (torch.cuda.is_available() and model) else "tiny"
    if requested not in available:
        raise UserError(f"unknown preset {requested!r} for {table}; choose auto, {', '.join(available)}")
    preset = available[requested]
    if preset.model is None and not model:
        raise UserError(f"--preset paper needs --model /path/to/weights ({preset.description})")
    return preset


@dataclass(frozen=True)
class SampledEval:
    """``--pass-k``: every test problem also decoded ``samples`` times at ``temperature`` (pass@k, maj@k) at the
    nominal ``lengths`` (empty: every length of the preset)."""

    samples: int
    temperature: float = 1.0
    lengths: tuple[int, ...] = ()


@dataclass(frozen=True)
class Comparison:
    """One ``reproduce`` command: every baseline trained under the preset's budget on every task and seed, each
    checkpoint evaluated under every protocol and length. Built from the command line once (:func:`comparison`)."""

    table: str
    preset: Preset
    model: str  # the start: a checkpoint, or the preset's built-in model
    baselines: tuple[str, ...]
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    runs_root: Path  # --runs; this comparison's runs go to runs_root/<name>
    results: Path
    leaderboard: Path
    limit: int | None = None  # evaluate the first N test items only (None: the preset's eval_limit)
    force: bool = False
    check_model: bool = True
    sampled: SampledEval | None = None

    @property
    def name(self) -> str:
        return f"{self.table}-{self.preset.name}"

    @property
    def runs(self) -> Path:
        return self.runs_root / self.name

    @property
    def eval_limit(self) -> int | None:
        return self.limit if self.limit is not None else self.preset.eval_limit

    def evaluations(self) -> list[tuple[EvalProtocol, dict[int, int]]]:
        """Every (protocol, nominal -> decoded length) a checkpoint is evaluated under: the preset's protocols at
        every length, and with ``--pass-k`` each of them sampled (:func:`sampled_protocol`) at its lengths."""
        evaluations = [(get_protocol(name), self.preset.lengths) for name in self.preset.protocols]
        if self.sampled is None:
            return evaluations
        lengths = {n: self.preset.lengths[n] for n in self.sampled.lengths or self.preset.lengths}
        sampled = [
            (sampled_protocol(name, self.sampled.samples, self.sampled.temperature), lengths)
            for name in self.preset.protocols
        ]
        return evaluations + sampled


@dataclass(frozen=True)
class Replicate:
    """One training seed of one task of a comparison: warm start, every baseline, the frozen control."""

    comparison: Comparison
    task: str
    seed: int

    @property
    def runs(self) -> Path:
        return self.comparison.runs / self.task / f"s{self.seed}"

    @property
    def where(self) -> str:
        return f"{self.task} seed {self.seed}"

    def result_key(self, baseline: str, protocol: EvalProtocol, length: int, model: dict[str, Any]) -> ResultKey:
        table = self.comparison.table
        return ResultKey(
            comparison=self.comparison.name,
            table=table,
            preset=self.comparison.preset.name,
            baseline=baseline,
            task=self.task,
            length=length,
            sampling=None if table == "table1" else protocol.sampling,
            protocol=protocol.name,
            seed=self.seed,
            model=model,
        )


def comparison(
    table: str,
    *,
    preset: str = "auto",
    model: str | None = None,
    baselines: str | None = None,
    tasks: str | None = None,
    seeds: str | None = None,
    runs: str = "runs",
    results: str = "results",
    leaderboard: str = "leaderboard.md",
    limit: int | None = None,
    force: bool = False,
    check_model: bool = True,
    pass_k: int | None = None,
    temperature: float = 1.0,
    pass_k_lengths: str | None = None,
) -> Comparison:
    """The :class:`Comparison` the ``reproduce`` options ask for (the command line's text, checked here): every
    bad option is one line before anything runs, not after the first warm start."""
    chosen = choose_preset(table, preset, model)
    sampled = None
    if pass_k:
        lengths = ()
        if pass_k_lengths:
            known = [str(n) for n in chosen.lengths]
            lengths = tuple(comma_list(pass_k_lengths, "--pass-k-lengths", kind=int, choices=known, what="length"))
        sampled = SampledEval(pass_k, temperature, lengths)
    built = Comparison(
        table=table,
        preset=chosen,
        model=model or str(chosen.model),
        baselines=tuple(
            comma_list(baselines, "--baselines", choices=BASELINES.entries(), what="baseline")
            if baselines
            else TABLE_BASELINES
        ),
        tasks=tuple(
            comma_list(tasks, "--tasks", choices=chosen.tasks, what="task") if tasks else chosen.default_tasks()
        ),
        seeds=_seeds(seeds, chosen.seeds),
        runs_root=Path(runs),
        results=Path(results),
        leaderboard=Path(leaderboard),
        limit=limit,
        force=force,
        check_model=check_model,
        sampled=sampled,
    )
    built.evaluations()  # a sampled protocol that cannot be built (e.g. --pass-k 1) fails now
    return built


def _banner(run: Comparison) -> None:
    preset = run.preset
    print(f"reproduce {run.table}: preset '{preset.name}' - {preset.description}")
    if preset.name != "paper":
        needs = "LLaDA-8B-Instruct" if run.table == "table1" else "SDAR-8B-Chat"
        print(
            f"  (the paper preset needs {needs} weights (--model PATH), GPUs, and `accelerate launch`; see docs/gpu.md)"
        )
    print(f"  model: {run.model}; tasks: {', '.join(run.tasks)}; budget {preset.budget.hash()}")
    extra = [task for task in preset.tasks if task not in run.tasks]
    if extra:
        print(f"  (also in this preset, not run now: {', '.join(extra)}; name them with --tasks)")


def reproduce(run: Comparison) -> None:
    """Entry point of ``python -m stabledrl_bench reproduce`` (see the module docstring)."""
    _banner(run)
    stages = Stages(_plan(run))
    for task in run.tasks:
        for seed in run.seeds:
            _replicate(Replicate(run, task, seed), stages)
        _training_summary(run, task)
    from stabledrl_bench.experiments.stress import stability_section

    if is_main_process():
        path = write_leaderboard(
            run.results, run.leaderboard, plots_dir=run.results / "plots", extra_sections=[stability_section]
        )
        print(f"leaderboard: {path}")
    barrier()


def _plan(run: Comparison) -> list[str]:
    """The stage kinds :func:`_replicate` runs, in order (for the overall progress line)."""
    one = [*(["sft"] if run.preset.sft is not None else []), "eval", *(["train", "eval"] * len(run.baselines)), "train"]
    return [f"{task}:{kind}" for task in run.tasks for _ in run.seeds for kind in one]


def _replicate(replicate: Replicate, stages: Stages) -> None:
    """One training seed of one task: warm start, every baseline, the frozen control, and their evaluations."""
    run, where = replicate.comparison, replicate.where
    start = run.model
    if run.preset.sft is not None:
        stages.begin(f"{where}: warm start (SFT)")
        path, built = _warm_start(replicate)
        stages.end(reused=not built)
        start = str(path)
    reference = "sft" if run.preset.sft is not None else "base"
    stages.begin(f"{where}: evaluate the start")
    stages.end(reused=_evaluate_all(replicate, reference, start, None))
    for baseline in run.baselines:
        config = _train_config(replicate, baseline, start)
        stages.begin(f"{where}: train {baseline}")
        final, cached = _train(config, force=run.force)
        stages.end(reused=cached)
        stages.begin(f"{where}: evaluate {baseline}")
        stages.end(reused=_evaluate_all(replicate, baseline, str(final), run.preset.budget.to_dict()))
    control = _train_config(replicate, CONTROL_BASELINE, start, folder=CONTROL_RUN)
    stages.begin(f"{where}: frozen control (learning rate 0)")
    stages.end(reused=_train(control_config(control, control.output_dir), force=run.force)[1])


def _seeds(requested: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    """``--seeds 0,1,2`` (default: the preset's): every seed repeats the whole pipeline, warm start included."""
    if not requested:
        return default
    seeds = tuple(comma_list(requested, "--seeds", kind=int, what="seed"))
    if min(seeds) < 0 or max(seeds) >= INT64_LIMIT:
        raise UserError(f"--seeds: expected integers from 0 to 2**63 - 1, got {requested!r}")
    return seeds


def _training_summary(run: Comparison, task: str) -> None:
    """Store every run's per-rollout training reward with the frozen control's, print the paired change, plot.

    Why a control: the reward of a rollout depends on which prompts were drawn and on the sampling noise. The
    frozen run (learning rate 0) draws the same prompts with the same random numbers, so the per-rollout
    difference isolates what training changed (:func:`training_changes`). The evaluation-side signal (each RL
    row minus the start on the test set, paired by item) is in the leaderboard next to it.
    """
    logs = {
        (seed, name): Replicate(run, task, seed).runs / name / "log.jsonl"
        for seed in run.seeds
        for name in (*run.baselines, CONTROL_RUN)
    }
    rows = [
        (task, seed, name, r["step"], r["reward_mean"])
        for (seed, name), log in logs.items()
        if log.is_file()
        for r in _rollout_records(log)
    ]
    rewards = pd.DataFrame(rows, columns=list(TRAINING_COLUMNS))
    path = training_path(run.results, run.name, task)
    if path.is_file():  # a seed trained earlier (e.g. `--seeds 2` after `--seeds 0,1`) keeps its rollouts
        earlier = read_training(path)
        rewards = pd.concat([earlier[~earlier["seed"].isin(rewards["seed"])], rewards], ignore_index=True)
        rewards = rewards.sort_values("seed", kind="stable", ignore_index=True)
    if is_main_process():
        atomic_write_text(path, rewards.to_csv(index=False))
    barrier()
    pooled = ", ".join(map(str, sorted(rewards["seed"].unique())))
    print(f"  [{task}] training reward of the last {TRAINING_WINDOW} rollouts vs the frozen start on the same ones")
    print(f"  (rollouts of seeds {pooled} pooled):")
    for row in training_changes(rewards).itertuples():
        print(f"    {row.run:<12} {row.reward:.3f} vs {row.frozen:.3f}: {row.change.text('+.3f', scale=1.0)}")
    print(f"  [{task}] training rewards: {path} (the leaderboard plots them)")


def _rollout_records(log: Path) -> list[dict[str, Any]]:
    """One record per rollout phase: the phase's first optimizer step carries the reward of its rollout."""
    return [r for r in read_log(log) if r.get("phase_iteration") == 0 and r.get("reward_mean") is not None]


def warm_start_spec(preset: Preset, task: str, model: str, seed: int) -> WarmStart:
    """The SFT warm start ``preset`` gives ``task`` on training seed ``seed`` (the stress experiments reuse one)."""
    recipe = preset.tasks[task]
    generator_options = (
        recipe.generator_options if recipe.sft_generator_options is None else recipe.sft_generator_options
    )
    task_sft = preset.task_sft(task)
    if task_sft is None:
        raise UserError(f"preset {preset.name!r} has no warm start for {task}")
    return WarmStart(
        dataclasses.replace(task_sft, task=task, model=model, seed=seed, generator_options=generator_options)
    )


def _warm_start(replicate: Replicate) -> tuple[Path, bool]:
    run = replicate.comparison
    spec = warm_start_spec(run.preset, replicate.task, run.model, replicate.seed)
    final, info = ensure_warm_start(spec, replicate.runs / "sft", force=run.force)
    return final, info["built_now"]


def _train_config(replicate: Replicate, baseline: str, start: str, folder: str | None = None) -> TrainConfig:
    """The RL run of ``baseline`` from ``start`` in ``replicate`` (its folder: ``folder``, else the baseline's)."""
    preset, task, seed = replicate.comparison.preset, replicate.task, replicate.seed
    recipe = preset.tasks[task]
    out = replicate.runs / (folder or baseline)
    return TrainConfig(
        baseline=baseline,
        task=task,
        model=start,
        protocol=preset.prompt_protocol,
        reward_profile=preset.reward_profile,
        train_split=recipe.train_split,
        generator_options=recipe.generator_options,
        budget=preset.budget,
        optim=dataclasses.replace(preset.optim, learning_rate=recipe.learning_rate),
        per_device_prompts=preset.per_device_prompts,
        seed=seed,
        dtype=preset.dtype,
        bf16=preset.bf16,
        gradient_checkpointing=preset.gradient_checkpointing,
        output_dir=str(out),
        save_every=preset.save_every,
        check_model=replicate.comparison.check_model,
    )


def _train(config: TrainConfig, *, force: bool) -> tuple[Path, bool]:
    """Train (or reuse, or resume) one run through the experiment runner; a run that diverged stops the job.
    Returns the final checkpoint and whether the finished run was reused."""
    out = Path(config.output_dir)
    print(f"  [{config.task}] {out.name}: {config.budget.max_steps} steps -> {out}")
    summary = run_training(TrainJob(config), force=force)
    if summary["cached"]:
        print(f"  [{config.task}] {out.name}: trained, reused ({summary['final']})")
    if summary["final"] is None:
        raise UserError(summary["stopped"] or f"{out}: the run stopped before its last step")
    return Path(summary["final"]), bool(summary["cached"])


def _eval_device() -> tuple[str | None, torch.dtype | None]:
    """This process's GPU (``LOCAL_RANK`` under ``accelerate launch``) in bf16, or the CPU as loaded."""
    if not torch.cuda.is_available():
        return None, None
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}", torch.bfloat16


def _evaluate_all(replicate: Replicate, baseline: str, checkpoint: str, budget: dict[str, Any] | None) -> bool:
    """Evaluate one checkpoint under every protocol and length; True when every result was reused."""
    run = replicate.comparison
    reused = True
    device, dtype = _eval_device() if run.preset.bf16 else (None, None)
    dlm = load_model_spec(checkpoint, seed=replicate.seed, device=device, dtype=dtype)
    if checkpoint not in TINY_SPECS and run.check_model:
        require_conventions(dlm, checkpoint, train=False)  # before any decoding: a broken call wastes GPU hours
    model = model_record(dlm, checkpoint)  # hashes the weights once per checkpoint
    for protocol, lengths in run.evaluations():
        for nominal, actual in lengths.items():
            recorded = evaluate_and_record(
                dlm,
                results_dir=run.results,
                key=replicate.result_key(baseline, protocol, nominal, model).to_dict(),
                max_completion_length=actual,
                budget=budget,
                limit=run.eval_limit,
                batch_size=run.preset.eval_batch_size,
                skip_existing=not run.force,
            )
            reused = reused and recorded.reused
            acc = json.loads(recorded.path.read_text())["metrics"]
            how = "reused: same weights and settings" if recorded.reused else f"measured ({recorded.note})"
            print(
                f"  [{replicate.task}] {baseline} @ {nominal} ({actual} tokens, {protocol.name}): accuracy "
                f"{100 * acc['accuracy']:.1f}%, score {acc.get('score_mean', float('nan')):.3f} [{how}]"
            )
    return reused
