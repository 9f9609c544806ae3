"""SPG, Sandwiched Policy Gradient (``facebookresearch/SPG``, ``spg/spg_trainer.py: compute_loss``).

REINFORCE on a *sandwiched* likelihood bound, with no ratio, no clip and no KL (docs/methods.md#spg)::

    bound_i = E_i                              if A_i > 0   (ELBO: a lower bound, safe to push up)
              omega U_i + (1 - omega) E_i      if A_i <= 0  (EUBO mixture: an upper bound, safe to push down)
    L       = -sum_i A_i bound_i l_i / sum_i l_i           (l_i = valid completion length: length_weighted)
    A_i     = r_i - mean_group(r)                          (no std division)

E_i / U_i are the ``spg_block`` estimator's per-token-averaged ELBO / Renyi EUBO (order ``eubo_beta``).
``logp_estimation`` picks the A <= 0 branch as the SPG code names it: ``mix`` (above), ``elbo`` (E_i),
``eubo`` (U_i) or ``zero`` (0). Defaults from ``spg_mix/*.sbatch``: omega 0.5, eubo_beta 1.5, num_mc 2 (num_t there),
p_mask_prompt 0.15, block 32. A = 0 goes to the negative branch but contributes nothing.

StableDRL reuses ``sandwich_bound`` and ``SPGConfig`` unchanged: it is SPG plus detached importance weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from stabledrl_bench.core.advantages import compute_dtype
from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import SPGBlock
from stabledrl_bench.core.losses import length_weighted, need
from stabledrl_bench.errors import UserError

LOGP_ESTIMATIONS = ("mix", "elbo", "eubo", "zero")


def sandwich_bound(
    elbo: torch.Tensor,
    eubo: torch.Tensor | None,
    advantages: torch.Tensor,
    *,
    omega: float = 0.5,
    logp_estimation: str = "mix",
) -> torch.Tensor:
    """Per-sequence bound [B] with gradient: E_i where A_i > 0, else the ``logp_estimation`` branch.

    In ``compute_dtype`` of the ELBO and EUBO (a loss passes the ELBO already in its own compute dtype, which
    includes the EUBO's, so the bound comes back in that dtype).
    """
    dtype = compute_dtype(elbo, eubo)
    elbo, eubo = elbo.to(dtype), None if eubo is None else eubo.to(dtype)
    if logp_estimation == "elbo":
        negative = elbo
    elif logp_estimation == "zero":
        negative = torch.zeros_like(elbo)
    elif eubo is None:
        raise ValueError(f"logp_estimation={logp_estimation!r} needs the EUBO, which the estimator did not return")
    elif logp_estimation == "eubo":
        negative = eubo
    elif logp_estimation == "mix":
        negative = omega * eubo + (1 - omega) * elbo
    else:
        raise ValueError(f"logp_estimation must be one of {LOGP_ESTIMATIONS}, got {logp_estimation!r}")
    return torch.where(advantages > 0, elbo, negative)


def spg_loss(
    elbo: torch.Tensor,
    eubo: torch.Tensor | None,
    advantages: torch.Tensor,
    lengths: torch.Tensor,
    *,
    omega: float = 0.5,
    logp_estimation: str = "mix",
) -> tuple[torch.Tensor, dict[str, float]]:
    """SPG's length-weighted REINFORCE loss (module docstring); NaN/inf propagate (SPG only warns).

    Computed and returned in ``compute_dtype`` of the inputs. There is no ratio, hence no exponential to overflow.
    """
    dtype = compute_dtype(elbo, eubo, advantages)
    advantages = advantages.to(dtype)
    bound = sandwich_bound(elbo.to(dtype), eubo, advantages, omega=omega, logp_estimation=logp_estimation)
    loss = length_weighted(-(advantages * bound), lengths)
    return loss, {"loss": loss.item(), "adv_abs_mean": advantages.abs().mean().item()}


@dataclass
class SPGConfig(BaselineConfig):
    omega: float = 0.5  # mixture weight of the EUBO in the A <= 0 bound (spg_omega / mix_weight)
    eubo_beta: float = 1.5  # Renyi order of the EUBO (spg_beta)
    logp_estimation: str = "mix"  # A <= 0 branch: mix | elbo | eubo | zero
    num_mc: int = 2  # MC mask samples per sequence (the official code's num_t)
    p_mask_prompt: float = 0.15  # masking probability of prompt and earlier completion blocks
    block_length: int | None = None  # SPG masking block; None = the rollout block (StableDRL's block_size is both)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.logp_estimation not in LOGP_ESTIMATIONS:
            raise UserError(
                f"logp_estimation must be one of {', '.join(LOGP_ESTIMATIONS)}; got {self.logp_estimation!r}"
            )
        if self.beta != 0:
            raise UserError(f"{type(self).__name__}: beta must be 0 (the SPG bound has no KL term); got {self.beta}")


@register_baseline("spg")
class SPG(Baseline):
    """SPG: REINFORCE on the ELBO (A > 0) / EUBO-mixture (A <= 0) sandwich, length-weighted, no ratio."""

    description: ClassVar[str] = "SPG: sandwiched ELBO/EUBO REINFORCE, length-weighted, no ratio/clip/KL"
    Config: ClassVar[type[BaselineConfig]] = SPGConfig
    advantage: ClassVar[str] = "group_mean"
    needs_old: ClassVar[bool] = False
    config: SPGConfig

    def estimator(self) -> SPGBlock:
        c = self.config
        return SPGBlock(
            num_mc=c.num_mc, eubo_beta=c.eubo_beta, p_mask_prompt=c.p_mask_prompt, block_length=c.block_length
        )

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        return spg_loss(
            need(inputs.new, "elbo", self.name),
            inputs.new.eubo,
            inputs.advantages,
            inputs.completion_mask.sum(dim=1),
            omega=self.config.omega,
            logp_estimation=self.config.logp_estimation,
        )
