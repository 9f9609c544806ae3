"""BGPO, Boundary-Guided Policy Optimization (arXiv 2510.11683; authors' repository ``THU-KEG/BGPO``), as ported to
DARE (``yjyddq/DARE`` at ``83ae8a3``: ``verl/trainer/ppo/dllm_core_algos.py: compute_policy_loss_bgpo`` lines 77-150
and ``_forward_process_bgpo`` lines 593-631, ``verl/workers/actor/llada_dp_actor_bgpo.py`` lines 93-124 and 313-363,
``recipe/llada/run_bgpo_llada_8b_instruct.sh``). The authors' repository could not be read here; DARE's port is
the code this file follows.

A PPO objective that is *linear* in each Monte-Carlo sample of the ELBO, so that every sample's gradient can be
accumulated on its own and the sample count is bounded by time, not memory: for A > 0 the ratio is replaced by its
first-order lower bound 1 + dl (a tangent of exp), for A < 0 it stays exp(dl), which is linear in each sample's
term after the expectation (docs/methods.md#bgpo)::

    l_ij   = E_ij / L                       (E_ij: ``stratified_elbo`` sample j, 1/t-weighted sum; L = canvas)
    dl_ij  = l_ij - l_old_ij                (masks shared by old and new)
    r_ij   = 1 + dl_ij  if A_i > 0,   exp(dl_ij)  otherwise
    pg_ij  = -A_i min(r_ij, 1 + eps_high)                     A_i > 0   (PPO's clip; r below 1 - eps passes)
             -A_i clamp(r_ij, 1 - eps_low, c)                 A_i < 0   (PPO's clip and the dual clip c = 3)
    L      = (1/K) sum_j  sum_i l_i pg_ij / sum_i l_i        (verl's token mean of a per-sequence term: the
                                                              completions weighted by their valid length l_i)
    A_i    = (r_i - mean_group(r)) / (std_group(r) + 1e-6)   (verl's GRPO estimator, sample std)

Official settings (DARE's recipe): K = ``mc_num`` 16 samples, eps 0.2 on both sides, c = 3, no KL, one optimizer
step per rollout, G 8, 16 prompts per step, lr 5e-7, weight decay 0.01, gradient clip 1, full-parameter FSDP,
rollout temperature 0.6, block 32, canvas 256 with 128 steps (Sudoku, Countdown) or 512 with 256 (math).

Where it departs from ESPO (``espo.py``): one ratio per Monte-Carlo sample instead of one on the averaged ELBO, the
linearised ratio for A > 0, the dual clip for A < 0, counts stratified over one sequence's samples (not over the
batch) in 1..l_i and only over its valid tokens, the length-weighted mean, a z-scored advantage, no KL. Also here:
where 1 + dl <= 0 (A > 0), DARE's ``log(1 + dl)`` is NaN; this code keeps the linear term, whose value and gradient
are finite; A = 0 contributes exactly 0 (DARE: -0 exp(dl), NaN where exp overflows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from stabledrl_bench.core.advantages import compute_dtype
from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import StratifiedElbo
from stabledrl_bench.core.losses import length_weighted, ratio_metrics, samples_of
from stabledrl_bench.errors import UserError


def bgpo_loss(
    samples: torch.Tensor,
    old_samples: torch.Tensor,
    advantages: torch.Tensor,
    lengths: torch.Tensor,
    *,
    canvas: int,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """BGPO's loss (module docstring): ``samples`` [B, K] with gradient, ``old_samples`` [B, K], ``advantages`` and
    ``lengths`` (valid tokens) [B], ``canvas`` = L. In ``compute_dtype`` of the inputs.

    Evaluated piecewise, as the min / max of the official code reduce to: A > 0 gives -A min(1 + dl, 1 + eps_high),
    A < 0 gives -A exp(clamp(dl, log(1 - eps_low), log c)), so exp never sees a change beyond the clip and every
    term and gradient is finite.
    """
    dtype = compute_dtype(samples, old_samples, advantages)
    advantages = advantages.to(dtype)[:, None]
    change = (samples.to(dtype) - old_samples.to(dtype)) / canvas  # [B, K]
    rising = -advantages * torch.minimum(1 + change, torch.full_like(change, 1 + epsilon_high))
    falling = -advantages * torch.exp(change.clamp(math.log(1 - epsilon_low), math.log(clip_ratio_c)))
    per_sample = torch.where(advantages > 0, rising, torch.where(advantages < 0, falling, 0.0))
    loss = length_weighted(per_sample.mean(dim=1), lengths)
    fixed = change.detach()
    clipped = ((advantages > 0) & (fixed > epsilon_high)) | ((advantages < 0) & (fixed < math.log(1 - epsilon_low)))
    dual = (advantages < 0) & (fixed > math.log(clip_ratio_c))
    return loss, {
        "loss": loss.item(),
        **ratio_metrics(fixed),
        "clip_ratio": clipped.float().mean().item(),
        "clip_ratio_dual": dual.float().mean().item(),
        "adv_abs_mean": advantages.abs().mean().item(),
    }


@dataclass
class BGPOConfig(BaselineConfig):
    epsilon_low: float = 0.2  # clip_ratio_low (verl ppo_trainer.yaml)
    epsilon_high: float = 0.2  # clip_ratio_high
    clip_ratio_c: float = 3.0  # dual clip for A < 0
    num_mc: int = 16  # ELBO samples per completion (mc_num)
    std_epsilon: float = 1e-6  # added to the group std of the advantage (verl's GRPO estimator)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta != 0:
            raise UserError(f"BGPO: beta must be 0 (the recipe has no KL term); got {self.beta}")
        if not (0 < self.epsilon_low < 1 and self.epsilon_high > 0):
            raise UserError(
                f"need 0 < epsilon_low < 1 and epsilon_high > 0; got {self.epsilon_low} and {self.epsilon_high}"
            )
        if not self.clip_ratio_c > 1:
            raise UserError(f"clip_ratio_c must be > 1 (the dual clip caps -A rho for A < 0); got {self.clip_ratio_c}")


@register_baseline("bgpo")
class BGPO(Baseline):
    """BGPO: per-sample PPO with the ratio linearised for A > 0 and dual-clipped for A < 0, z-scored advantages."""

    description: ClassVar[str] = "BGPO: PPO linear in each of 16 ELBO samples (1 + dl for A > 0), dual clip, z-score"
    Config: ClassVar[type[BaselineConfig]] = BGPOConfig
    advantage: ClassVar[str] = "reward_zscore"
    needs_old: ClassVar[bool] = True
    config: BGPOConfig

    def estimator(self) -> StratifiedElbo:
        return StratifiedElbo(num_mc=self.config.num_mc)

    def advantage_options(self) -> dict[str, Any]:
        return {"epsilon": self.config.std_epsilon}

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        c = self.config
        return bgpo_loss(
            samples_of(inputs.new, self.name),
            samples_of(inputs.old, self.name),
            inputs.advantages,
            inputs.completion_mask.sum(dim=1),
            canvas=inputs.completion_mask.shape[1],
            epsilon_low=c.epsilon_low,
            epsilon_high=c.epsilon_high,
            clip_ratio_c=c.clip_ratio_c,
        )
