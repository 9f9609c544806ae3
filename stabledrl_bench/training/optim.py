"""AdamW and learning-rate schedules shared by SFT and RL (the official recipes' choices by name)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from stabledrl_bench.config import require_finite
from stabledrl_bench.errors import UserError

SCHEDULES = ("constant", "constant_with_warmup", "linear", "cosine")


@dataclass
class OptimConfig:
    """AdamW + schedule. Defaults: the StableDRL recipe's (AdamW (0.9, 0.99), wd 0.1, linear decay);
    tests/test_configs.py checks that they still agree with ``configs/recipes/stabledrl/_base.yaml``."""

    learning_rate: float = 2e-6
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    adam_epsilon: float = 1e-8
    weight_decay: float = 0.1
    lr_scheduler_type: str = "linear"
    warmup_steps: int = 0
    max_grad_norm: float = 0.2

    def __post_init__(self) -> None:
        if self.lr_scheduler_type not in SCHEDULES:
            raise UserError(f"lr_scheduler_type must be one of {', '.join(SCHEDULES)}, got {self.lr_scheduler_type!r}")
        # learning_rate 0 is allowed on purpose: it is the frozen-policy control run (same prompts, same random
        # numbers, no learning) that `reproduce` compares the RL runs' training reward with. max_grad_norm may be
        # inf (never clip); NaN is refused where any config is read.
        require_finite(
            learning_rate=self.learning_rate,
            adam_beta1=self.adam_beta1,
            adam_beta2=self.adam_beta2,
            adam_epsilon=self.adam_epsilon,
            weight_decay=self.weight_decay,
        )
        if self.learning_rate < 0 or not self.max_grad_norm > 0:
            raise UserError("learning_rate must be >= 0 and max_grad_norm positive")
        if not (0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1 and self.adam_epsilon > 0):
            raise UserError("adam_beta1 and adam_beta2 must lie in [0, 1) and adam_epsilon be positive")
        if self.weight_decay < 0 or self.warmup_steps < 0:
            raise UserError("weight_decay and warmup_steps must be >= 0")


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only: norms and biases are not decayed (standard practice)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise UserError("the model has no trainable parameters")
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=cfg.learning_rate,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_epsilon,
        foreach=False,
    )


def lr_factor(step: int, total: int, cfg: OptimConfig) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based) of ``total``."""
    if cfg.lr_scheduler_type == "constant":
        return 1.0
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_scheduler_type == "constant_with_warmup":
        return 1.0
    progress = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    if cfg.lr_scheduler_type == "linear":  # StableDRL: max(0, 1 - step / total_steps)
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, cfg: OptimConfig):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, cfg))
