"""ESPO, ELBO-based Sequence-level Policy Optimization (``ML-GSAI/ESPO``, ``espo/espo_trainer.py: compute_loss``).

Sequence-level PPO on the summed ELBO, normalised per token by the *maximum* generation length
(docs/methods.md#espo)::

    rho_i = exp((E_theta_i - E_old_i) / L)                         (L = completion_mask.shape[1], coupled masks)
    L     = -(1/b) sum_i min(rho_i A_i, clip(rho_i, 1 - eps, 1 + eps) A_i)
            + beta (1/(b L)) sum_i 0.5 (E_theta_i - E_ref_i)^2      (k2 KL on the ELBO difference)
    A_i   = r_i - mean_{j != i} r_j                                 (leave-one-out, no std)

Defaults from ``recipes/``: eps = 0.2, beta = 1e-3 (gsm8k/math; 3e-3 countdown, 1e-2 sudoku), num_mc = 2,
reduce_var (antithetic complement mask) on. The ELBO counts post-EOS padding too (docs/estimators.md#espo_elbo):
that is the ``espo_elbo`` estimator's business, not the loss's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from stabledrl_bench.core.advantages import compute_dtype
from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import ESPOElbo
from stabledrl_bench.core.losses import k2_kl, need, sequence_ppo


def espo_loss(
    elbo: torch.Tensor,
    old_elbo: torch.Tensor,
    ref_elbo: torch.Tensor | None,
    advantages: torch.Tensor,
    *,
    max_completion_length: int,
    epsilon: float = 0.2,
    beta: float = 1e-3,
) -> tuple[torch.Tensor, dict[str, float]]:
    """ESPO's sequence-level clipped loss (module docstring); all tensors [B], ``max_completion_length`` = L.

    Computed and returned in ``compute_dtype`` of the inputs; ``conditional_clip`` keeps the clipped branch and
    A = 0 finite for any finite Delta ELBO, and rho_i A_i is -inf only where it truly exceeds the dtype's range.
    """
    dtype = compute_dtype(elbo, old_elbo, ref_elbo, advantages)
    elbo, advantages = elbo.to(dtype), advantages.to(dtype)
    log_ratio = (elbo - old_elbo.to(dtype)) / max_completion_length
    loss, metrics = sequence_ppo(log_ratio, advantages, epsilon)
    if beta > 0:
        if ref_elbo is None:
            raise ValueError("espo with beta > 0 needs the reference ELBO")
        kl = k2_kl(elbo - ref_elbo.to(dtype)).sum() / (elbo.numel() * max_completion_length)
        loss = loss + beta * kl
        metrics |= {"kl": kl.item(), "loss": loss.item()}
    return loss, metrics


@dataclass
class ESPOConfig(BaselineConfig):
    epsilon: float = 0.2  # sequence-level PPO clip range
    beta: float = 1e-3  # k2 KL on the ELBO difference to the reference
    num_mc: int = 2  # independent mask seeds per ELBO
    reduce_var: bool = True  # antithetic complement mask


@register_baseline("espo")
class ESPO(Baseline):
    """ESPO: sequence-level conditional PPO clip on ELBO ratios normalised by L, k2 KL, leave-one-out advantage."""

    description: ClassVar[str] = "ESPO: sequence-level PPO clip (eps 0.2) on exp(dELBO / L), k2 KL, leave-one-out"
    Config: ClassVar[type[BaselineConfig]] = ESPOConfig
    advantage: ClassVar[str] = "leave_one_out"
    needs_old: ClassVar[bool] = True
    config: ESPOConfig

    def estimator(self) -> ESPOElbo:
        return ESPOElbo(num_mc=self.config.num_mc, reduce_var=self.config.reduce_var)

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        return espo_loss(
            need(inputs.new, "elbo", self.name),
            need(inputs.old, "elbo", self.name),
            inputs.ref.elbo if inputs.ref is not None else None,
            inputs.advantages,
            max_completion_length=inputs.completion_mask.shape[1],
            epsilon=self.config.epsilon,
            beta=self.config.beta,
        )
