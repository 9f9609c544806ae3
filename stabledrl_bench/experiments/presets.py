"""The presets ``reproduce`` runs: read from ``configs/presets/table1.yaml`` and ``table2.yaml`` into typed
:class:`Preset` values, each with its per-task :class:`TaskRecipe`.

The paper presets reuse the StableDRL GPU recipe (``configs/recipes/stabledrl/``) for the budget, optimizer,
prompts, rewards and per-task train split and learning rate, so the paper's settings are written in one place; a
preset may also derive from another (``base:``) and change only what differs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stabledrl_bench.config import configs_dir, deep_merge, from_dict, read_mapping, read_recipe
from stabledrl_bench.core.budget import Budget
from stabledrl_bench.errors import UserError
from stabledrl_bench.experiments.runner import WarmStart
from stabledrl_bench.training.config import TrainConfig
from stabledrl_bench.training.optim import OptimConfig
from stabledrl_bench.training.sft import SFTConfig
from stabledrl_bench.training.validation import ValidationConfig


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
class PresetValidation:
    """Checkpoint selection in a comparison (``reproduce --eval-every N`` turns it on; ``every`` 0: off): each run
    is evaluated every N steps on ``items`` validation docs of its task at the nominal ``lengths`` (default: all of
    the preset's, SPG's rule: the best average over the lengths), and its best checkpoint is evaluated on the test
    set beside its final one."""

    every: int = 0
    items: int = 64
    lengths: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        ValidationConfig(every=self.every, items=self.items)  # the same checks as a run's, when the preset is read


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
    lengths: dict[int, int]  # nominal length (table column) -> max_completion_length (tokens decoded)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sft: SFTConfig | None = None  # warm start (tiny / smoke); None: RL starts from the given model
    per_device_prompts: int = 1
    dtype: str = "float32"  # the trained (master) weights
    bf16: bool = False  # bf16 mixed precision
    gradient_checkpointing: bool = False
    eval_limit: int | None = None
    eval_batch_size: int = 64
    save_every: int | None = None  # TrainConfig.save_every (None: every tenth of a run)
    seeds: tuple[int, ...] = (0,)
    validation: PresetValidation = field(default_factory=PresetValidation)

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

    def train_config(self, task: str, **run: Any) -> TrainConfig:
        """An RL run of ``task`` under this preset (``run``: the run's own fields, e.g. baseline, model, seed,
        output_dir). A task the preset does not list trains on its ``train`` split at the preset's learning rate."""
        recipe = self.tasks.get(task) or TaskRecipe(learning_rate=self.optim.learning_rate)
        return TrainConfig(
            task=task,
            protocol=self.prompt_protocol,
            reward_profile=self.reward_profile,
            train_split=recipe.train_split,
            generator_options=recipe.generator_options,
            budget=self.budget,
            optim=dataclasses.replace(self.optim, learning_rate=recipe.learning_rate),
            per_device_prompts=self.per_device_prompts,
            dtype=self.dtype,
            bf16=self.bf16,
            gradient_checkpointing=self.gradient_checkpointing,
            save_every=self.save_every,
            **run,
        )


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


# The preset `train` takes its settings from when it is given no config and a built-in tiny model: the StableDRL
# recipe's budget (TrainConfig's default) would take hours per step on a CPU.
TINY_MODEL_PRESETS = {"tiny": "table1", "tiny-block": "table2"}


def tiny_model_settings(model: Any, task: Any) -> TrainConfig | None:
    """The tiny preset's run of ``task`` for a built-in tiny ``model`` (None for any other model)."""
    table = TINY_MODEL_PRESETS.get(model) if isinstance(model, str) else None
    return None if table is None else presets(table)["tiny"].train_config(str(task), model=model)


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
