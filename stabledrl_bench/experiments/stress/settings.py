"""What a stress experiment's runs start from and share: the warm start, the stress budget, a Table 1 preset's task
instead of the stress task, and :class:`TrainSettings` (task, budget, optimiser, noise) with the trainer config of
one run. Every check on these options is cheap and comes before the warm start is built, so a mistake is one line,
not one line after minutes of SFT.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stabledrl_bench.core.budget import Budget
from stabledrl_bench.errors import UserError
from stabledrl_bench.experiments.stress.common import (
    STRESS_CANVAS,
    STRESS_GENERATOR,
    STRESS_PROTOCOL,
    STRESS_TASK,
    ExplodingNoise,
    chosen_lr,
    stress_warm_start,
)
from stabledrl_bench.experiments.stress.options import ModelOptions, StressOptions, SweepOptions, check_positive
from stabledrl_bench.training.optim import OptimConfig

if TYPE_CHECKING:
    from stabledrl_bench.training.config import TrainConfig

# The model and training stack (transformers) is imported where a run needs it, not when the `stress` command line is
# built: `stress --help` lists every experiment, so it imports every experiment module.

# A checkpoint every 100 steps, so a 500-step run cut short resumes instead of starting again (not part of a run's
# identity: cached runs stay valid).
SAVE_EVERY = 100


def stress_budget(model: ModelOptions, steps: int, num_iterations: int = 2) -> Budget:
    """The stress budget: the tiny Table 1 canvas (L = 48, block 8, T = 0.9) and mu = 2, the official recipe's, with
    ``--prompts`` x ``--generations`` rollouts and ``--diffusion-steps`` (an experiment with a ``--num-iterations``
    option sets mu itself)."""
    return Budget(
        max_steps=steps,
        prompts_per_step=model.prompts,
        num_generations=model.generations,
        num_iterations=num_iterations,
        max_completion_length=STRESS_CANVAS,
        diffusion_steps=model.diffusion_steps,
        block_length=8,
        temperature=0.9,
        max_prompt_length=64,
    )


def preset(name: str, task: str | None) -> Any:
    """The Table 1 preset ``name``, checked to have ``task`` (one error line otherwise)."""
    from stabledrl_bench.experiments.presets import presets

    known = presets("table1")
    if name not in known:
        raise UserError(f"--preset {name}: unknown; choose from {', '.join(known)}")
    if task not in known[name].tasks:
        raise UserError(f"--preset {name} needs --task, one of {', '.join(known[name].tasks)}")
    return known[name]


def chosen_preset(model: ModelOptions) -> Any:
    """``--preset`` checked with its ``--task`` and, for a preset without a warm start of its own, ``--warm-start``
    (None: the stress settings, which take no ``--task``)."""
    if model.preset is None:
        if model.task is not None:
            raise UserError("--task needs --preset (the stress settings have their own task)")
        return None
    chosen = preset(model.preset, model.task)
    if chosen.task_sft(model.task) is None and model.warm_start is None:
        raise UserError(f"--preset {model.preset} trains a given model: pass --warm-start /path/to/model")
    return chosen


def warm_start(model: ModelOptions, runs: str) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """Warm-start folder, its description and the model summary (parameter count etc.): ``--warm-start``, else the
    stress warm start, or with ``--preset`` that preset's warm start of ``--task`` (training seed 0), cached under
    ``runs``."""
    from stabledrl_bench.core.models.backends import load_diffusion_lm
    from stabledrl_bench.experiments.presets import warm_start_spec
    from stabledrl_bench.experiments.runner import ensure_warm_start

    chosen = chosen_preset(model)
    if chosen is None:
        spec, folder = stress_warm_start(model.sft_steps), Path(runs) / "sft"
    else:
        spec = None if model.warm_start else warm_start_spec(chosen, model.task, chosen.model, seed=0)
        folder = Path(runs) / f"sft-{model.preset}-{model.task}"
    path, info = ensure_warm_start(spec, folder, override=model.warm_start)
    return path, info, load_diffusion_lm(path).config_summary()


@dataclass(frozen=True)
class TrainSettings:
    """What every run of a sweep shares: warm start, task, budget, optimiser, noise.

    The optimiser defaults are the official StableDRL recipe's, for every method alike: AdamW with weight decay
    0.1, a linear decay of the learning rate to 0 over the run, gradient clipping at 0.2.
    """

    warm_start: str
    budget: Budget
    learning_rate: float
    noise: ExplodingNoise
    max_grad_norm: float = 0.2
    weight_decay: float = 0.1
    lr_scheduler_type: str = "linear"
    task: str = STRESS_TASK
    generator_options: tuple[tuple[str, Any], ...] = tuple(STRESS_GENERATOR.items())
    protocol: str = STRESS_PROTOCOL
    # A Table 1 preset's task instead of the stress task (``--preset paper --task gsm8k --warm-start MODEL``): its
    # data, rewards, budget and precision, with the knobs above. None: the stress settings.
    preset: str | None = None
    reward_profile: str = "d1"
    train_split: str = "generated"
    per_device_prompts: int | None = None  # None: the whole step on one micro-batch
    dtype: str = "float32"
    bf16: bool = False
    gradient_checkpointing: bool = False

    def optim(self) -> OptimConfig:
        return OptimConfig(
            learning_rate=self.learning_rate,
            weight_decay=self.weight_decay,
            lr_scheduler_type=self.lr_scheduler_type,
            max_grad_norm=self.max_grad_norm,
        )

    def describe(self) -> dict[str, Any]:
        """The record's account of these settings (the warm start is described by its builder)."""
        return {
            "preset": self.preset,
            "task": {
                "name": self.task,
                "generator_options": dict(self.generator_options),
                "protocol": self.protocol,
                "reward_profile": self.reward_profile,
                "train_split": self.train_split,
            },
            "precision": {
                "dtype": self.dtype,
                "bf16": self.bf16,
                "gradient_checkpointing": self.gradient_checkpointing,
            },
            "optimizer": dataclasses.asdict(self.optim()),
            "budget": self.budget.to_dict(),
            "budget_hash": self.budget.hash(),
            "noise": {**self.noise.__dict__, "text": self.noise.describe()},
        }

    def config(self, baseline: str, options: dict[str, Any], seed: int, anchor_beta: float = 0.0) -> TrainConfig:
        """The trainer config of one run (its folder is set by the job that runs it)."""
        from stabledrl_bench.training.config import TrainConfig

        return TrainConfig(
            baseline=baseline,
            anchor_beta=anchor_beta,
            task=self.task,
            model=self.warm_start,
            protocol=self.protocol,
            reward_profile=self.reward_profile,
            train_split=self.train_split,
            generator_options=dict(self.generator_options),
            budget=self.budget,
            optim=self.optim(),
            baseline_options=options,
            per_device_prompts=self.per_device_prompts or self.budget.prompts_per_step,
            dtype=self.dtype,
            bf16=self.bf16,
            gradient_checkpointing=self.gradient_checkpointing,
            seed=seed,
            output_dir="",
            progress=False,
            save_every=SAVE_EVERY,
        )


def train_settings(
    stress: StressOptions, sweep: SweepOptions, *, learning_rate: float | None = None, num_iterations: int = 2
) -> TrainSettings:
    """The settings of a training experiment: ``learning_rate``, else ``--lr``, else the rate the committed
    learning-rate sweep chose (:func:`~stabledrl_bench.experiments.stress.common.chosen_lr`); mu =
    ``num_iterations``. Every check is cheap and comes before the warm start is built; its folder is filled in
    afterwards (``warm_start``)."""
    model, training = sweep.model, sweep.training
    chosen_preset(model)
    if learning_rate is None:
        learning_rate = training.lr if training.lr is not None else chosen_lr(stress.results, model.preset, model.task)
    check_positive(lr=learning_rate, max_grad_norm=training.max_grad_norm, jobs=training.jobs)
    if not 0 <= training.weight_decay < 1:
        raise UserError(f"--weight-decay must be in [0, 1), got {training.weight_decay}")
    settings = TrainSettings(
        warm_start="",
        budget=stress_budget(model, training.steps, num_iterations),
        learning_rate=learning_rate,
        max_grad_norm=training.max_grad_norm,
        weight_decay=training.weight_decay,
        lr_scheduler_type=training.lr_scheduler,
        noise=sweep.noise.noise(),
    )
    return settings if model.preset is None else on_preset(settings, model.preset, model.task, training.steps)


def on_preset(settings: TrainSettings, name: str, task: str, steps: int) -> TrainSettings:
    """``settings`` moved onto a Table 1 preset's ``task``: its data, rewards, budget (``steps`` long) and
    precision, e.g. the paper's on a real checkpoint; the optimiser knobs and the rate stay the experiment's."""
    chosen = preset(name, task)
    recipe = chosen.tasks[task]
    return dataclasses.replace(
        settings,
        budget=dataclasses.replace(chosen.budget, max_steps=steps),
        task=task,
        generator_options=tuple(recipe.generator_options.items()),
        protocol=chosen.prompt_protocol,
        preset=name,
        reward_profile=chosen.reward_profile,
        train_split=recipe.train_split,
        per_device_prompts=chosen.per_device_prompts,
        dtype=chosen.dtype,
        bf16=chosen.bf16,
        gradient_checkpointing=chosen.gradient_checkpointing,
    )
