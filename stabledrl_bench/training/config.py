"""What defines an RL run: :class:`TrainConfig` (field names after TRL's GRPOConfig where one exists) and its parts.

Kept apart from the trainer so that what a run *is* reads without how it runs: the experiments, the CLI and the
recipes build and check configs without importing the training loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stabledrl_bench.config import deep_merge, from_dict, read_mapping, require_positive
from stabledrl_bench.core.budget import Budget, paper_budget
from stabledrl_bench.errors import UserError
from stabledrl_bench.training.optim import OptimConfig
from stabledrl_bench.training.validation import ValidationConfig


@dataclass
class LoraSettings:
    """LoRA as the d1/SPG/ESPO recipes use it (r 128, alpha 64, dropout 0.05 on attention and MLP)."""

    r: int = 128
    alpha: int = 64
    dropout: float = 0.05
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out"]
    )


TRAIN_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
TRACKERS = ("tensorboard", "wandb")


@dataclass
class TrainConfig:
    """Everything that defines an RL run. Field names follow TRL's GRPOConfig where one exists."""

    baseline: str = "stabledrl"
    task: str = "countdown"
    model: str = "tiny"  # "tiny", "tiny-block", or a checkpoint folder / Hub id
    protocol: str = "d1"  # prompt protocol of the task
    reward_profile: str = "d1"
    train_split: str = "train"  # or "generated" (procedural Countdown / Sudoku pool)
    generator_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"num_numbers": [3]}
    budget: Budget = field(default_factory=paper_budget)  # the StableDRL recipe's
    optim: OptimConfig = field(default_factory=OptimConfig)
    baseline_options: dict[str, Any] = field(default_factory=dict)
    # The same KL anchor for every method, added to its loss: anchor_beta x k3 of the per-token sequence log-ratio
    # to the frozen start (core/losses.py: anchor_kl, on ANCHOR_ESTIMATOR's ELBO). 0: none. A method's own beta is
    # separate (it anchors in its own way, or not at all).
    anchor_beta: float = 0.0
    per_device_prompts: int = 1  # prompts per micro-batch on one process (memory knob, not budget)
    estimator_micro_batch: int | None = None  # rows per forward inside an estimator (memory knob)
    seed: int = 0
    dtype: str = "float32"  # the trained (master) weights; bf16 below is the compute precision
    bf16: bool = False  # bf16 mixed precision (autocast; FSDP2: bf16 compute over float32 masters)
    gradient_checkpointing: bool = False  # recompute each decoder block in backward (any model file)
    lora: LoraSettings | None = None
    output_dir: str = "runs/train"
    # Optimizer steps between checkpoints (rounded to rollout boundaries), so that an interrupted run resumes.
    # None: every tenth of the run (:meth:`checkpoint_every`); 0: at the end only.
    save_every: int | None = None
    keep_checkpoints: int = 2  # the newest checkpoints kept on disk (0 = all)
    log_with: list[str] = field(default_factory=list)  # accelerate trackers: "tensorboard", "wandb" (off: [])
    max_nonfinite_steps: int = 3  # consecutive non-finite steps tolerated (skipped) before stopping
    # Checkpoint selection: evaluate on validation docs every N steps, keep the best weights in <output_dir>/best
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    check_model: bool = True  # probe a loaded checkpoint's conventions first (models/probes.py)
    progress: bool = True

    def __post_init__(self) -> None:
        require_positive(
            per_device_prompts=self.per_device_prompts,
            estimator_micro_batch=self.estimator_micro_batch,
            max_nonfinite_steps=self.max_nonfinite_steps,
        )
        if not (math.isfinite(self.anchor_beta) and self.anchor_beta >= 0):
            raise UserError(f"anchor_beta must be a finite number >= 0 (0 = no anchor), got {self.anchor_beta}")
        if self.save_every is not None and self.save_every < 0:
            raise UserError(f"save_every must be >= 0 (0 = a checkpoint at the end only), got {self.save_every}")
        if self.keep_checkpoints < 0:
            raise UserError(f"keep_checkpoints must be >= 0 (0 = keep all), got {self.keep_checkpoints}")
        if self.dtype not in TRAIN_DTYPES:
            raise UserError(f"dtype must be one of {', '.join(TRAIN_DTYPES)}, got {self.dtype!r}")
        unknown = sorted(set(self.log_with) - set(TRACKERS))
        if unknown:
            raise UserError(f"log_with: unknown tracker(s) {unknown}; use any of {', '.join(TRACKERS)}")

    def checkpoint_every(self) -> int:
        """Optimizer steps between checkpoints: ``save_every``, or by default a tenth of the run rounded up to whole
        rollout phases (a 10-step run saves every phase, the paper's 2000 steps every 200): a Ctrl-C or a pre-emption
        then loses at most a tenth of the work, at ten checkpoint writes per run."""
        if self.save_every is not None:
            return self.save_every
        mu = self.budget.num_iterations
        return math.ceil(self.budget.max_steps / 10 / mu) * mu

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> TrainConfig:
        """A YAML/JSON config with ``overrides`` merged in key by key (``{"optim": {"learning_rate": 1e-6}}``
        changes that one field of the file's ``optim``)."""
        return cls.from_mapping(deep_merge(read_mapping(path), overrides), where=str(path))

    @classmethod
    def from_mapping(cls, data: dict[str, Any], where: str = "config") -> TrainConfig:
        """A config from plain data; its ``budget:`` states what differs from the StableDRL recipe's budget."""
        data = dict(data)
        if isinstance(data.get("budget"), dict):
            data["budget"] = {**paper_budget().to_dict(), **data["budget"]}
        return from_dict(cls, data, where=where)
