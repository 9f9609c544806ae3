"""wd1 (``xiaohangt/wd1``, ``wd1/trainers/rev_grpo_trainer.py: compute_loss``; ``trainer_type: wll_d1_neg``, the
setting of its ``run/wll_*`` scripts).

Ratio-free weighted likelihood on d1's one-step mean-field likelihood (docs/methods.md#wd1)::

    A_i   = r_i - mean_group(r)                                   (no std division)
    w+_i  = softmax_{j in g(i)}(A_j)_i,   w-_i = softmax_{j in g(i)}(-A_j)_i            (no gradient)
    l_i   = sum_k c_ik log pi_theta(y_i^k)                        (d1 one-step estimate, summed over tokens)
    L     = (1 / #groups) sum_g sum_{i in g} (w-_i - w+_i) l_i

Completions above their group's mean reward gain likelihood, those below lose it, each group's push and pull
weighted by a softmax of its advantages. There is no importance ratio and no rollout-policy estimate at all: every
inner iteration re-weights the same rollouts with fresh masks, so nothing can blow up through a ratio, and nothing
keeps the update near the rollout policy either (the optimiser's step size and clipping do).

Where it departs from GRPO (``grpo.py``): no ratio and no clip; sequence weights from a group softmax of the
advantages instead of per-token ratio x advantage; the sequence log-likelihood summed over tokens, not a token mean;
no KL term (``train.yaml`` sets beta = 0.04, which this trainer's ``compute_loss`` never reads).

Official settings (``wd1/train.yaml``, ``run/wll_NP_*.sh``): p_mask_prompt = 0.15, mu = 12 inner iterations (8 on
Sudoku; ``num_iterations``: a budget setting here, shared by every method of a comparison), lr 3e-6, 6 completions per
prompt on one device per micro-batch, which is what makes the official softmax over the micro-batch a softmax over
one group; here it is taken per group explicitly, whatever the micro-batch holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from stabledrl_bench.core.advantages import compute_dtype, group_log_softmax
from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import D1OneStep
from stabledrl_bench.core.losses import mean_over_groups, need, per_row


def wd1_loss(
    logp: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    group_ids: torch.Tensor,
    row_to_seq: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """wd1's loss (module docstring): ``logp``/``mask`` [R, L] estimator rows, ``advantages``/``group_ids`` [B]
    sequences (``row_to_seq`` maps rows to sequences, None: one row each). In ``compute_dtype`` of the inputs."""
    dtype = compute_dtype(logp, advantages)
    advantages = advantages.to(dtype).detach()
    positive = group_log_softmax(advantages, group_ids).exp()
    negative = group_log_softmax(-advantages, group_ids).exp()
    coefficient = per_row(negative - positive, row_to_seq)
    sequence_logp = torch.where(mask.bool(), logp.to(dtype), 0.0).sum(-1)
    loss = mean_over_groups(coefficient * sequence_logp, per_row(group_ids, row_to_seq))
    metrics = {
        "loss": loss.item(),
        "weight_max": positive.max().item(),
        "adv_abs_mean": advantages.abs().mean().item(),
    }
    return loss, metrics


@dataclass
class WD1Config(BaselineConfig):
    p_mask_prompt: float = 0.15  # prompt-token masking probability of the one-step estimator (wd1 train.yaml)


@register_baseline("wd1")
class WD1(Baseline):
    """wd1: ratio-free likelihood weighted by group softmaxes of the advantages (+ for A, - for -A), no KL."""

    description: ClassVar[str] = "wd1: ratio-free weighted likelihood, softmax(A) up and softmax(-A) down per group"
    Config: ClassVar[type[BaselineConfig]] = WD1Config
    advantage: ClassVar[str] = "group_mean"
    needs_old: ClassVar[bool] = False
    config: WD1Config

    def estimator(self) -> D1OneStep:
        return D1OneStep(p_mask_prompt=self.config.p_mask_prompt)

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        new = inputs.new
        return wd1_loss(
            need(new, "token_logp", self.name),
            need(new, "token_mask", self.name),
            inputs.advantages,
            inputs.group_ids,
            new.row_to_seq,
        )
