"""StableDRL (``JianyuanZhong/StableDRL``, ``networks/llada_svpo.py: compute_loss_spg``, the ``use_snis`` path).

SPG's sandwiched REINFORCE with *unconditionally clipped, self-normalised, detached* sequence importance
weights (docs/methods.md#stabledrl; the convex-hull claim: docs/published-numbers.md#55-the-convex-hull-bound)::

    lambda_i = sg(E_theta_i - E_old_i)                            (per-token-averaged ELBO difference = log rho_i)
    w_i      = softmax_{j in g(i)}(clamp(lambda_j, clip_low, clip_high))_i
             = clip(rho_i) / sum_{j in g(i)} clip(rho_j)          (on the simplex of each group, no gradient)
    L_g      = -sum_{i in g} w_i A_i bound_i                      (bound_i: SPG's sandwich, with gradient)
    L        = mean over groups of L_g                            (mean_over_groups)
    A_i      = r_i - mean_group(r)                                (no std division)

so grad L_g = -sum_i w_i A_i grad(bound_i) is a convex combination of the per-sample terms A_i grad(bound_i):
its norm never exceeds max_i |A_i| ||grad bound_i||, whatever the ratios (the paper's "convex hull" claim).
Compare GRPO, where min(rho A, clip(rho) A) lets rho A through for A < 0 and the update scales with rho.

Clip range, in log space (``StableDRLConfig.clip_low`` / ``clip_high``):

* ``mode="official"`` (default, the code): upper-only, clip(rho) = min(rho, C), C = ``clip_threshold`` = 5
  (``ais_clip_iw``): (clip_low, clip_high) = (-inf, log C). The paper's epsilon ablation is
  ``clip_threshold`` in {1, 5, 100, 1000}; C = 1 makes every clipped weight equal.
* ``mode="paper"`` (third-party summary of the paper): two-sided, clip(rho) in [1 - eps, 1 + eps], eps = 0.2:
  (clip_low, clip_high) = (log(1 - eps), log(1 + eps)).

Official-code details kept: the old ELBO comes from an *independent* mask draw (``coupled=False``); NaN/inf in
the estimates are replaced by 0 (the code does so for the bound and E_theta; we also do it for E_old so that a
broken old estimate cannot turn every weight of its group into NaN; and a non-finite EUBO does not zero the
bound of an A > 0 sample, which uses the ELBO only); the official code holds exactly one group
per rank per micro-step, so its rank-local softmax is our per-group softmax. With coupled masks at the first
inner step (E_theta == E_old) every w_i = 1/G and the loss is SPG with per-group mean aggregation; with the
official independent draw the weights differ from 1/G even there (docs/methods.md#pitfalls-in-the-reference-code,
item 10).
Ablations (``baselines/ablations.py``) reuse ``log_importance_weights`` with one of its two ingredients removed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from stabledrl_bench.core.advantages import compute_dtype, group_index, group_log_softmax
from stabledrl_bench.core.baseline import BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.losses import mean_over_groups, need, ratio_metrics, scaled_exp
from stabledrl_bench.errors import UserError

from .spg import SPG, SPGConfig, sandwich_bound

MODES = ("official", "paper")


def log_importance_weights(
    log_ratio: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    clip_low: float = -math.inf,
    clip_high: float = math.log(5.0),
    self_normalize: bool = True,
) -> torch.Tensor:
    """Detached log sequence weights [B]: log w_i = clamp(log rho_i, clip_low, clip_high) - log Z_g(i).

    ``self_normalize=True``: Z_g = sum_{j in g} clip(rho_j), a group log-softmax computed stably around the group
    max. ``False`` (the clip-only ablation): Z_g = G, the fixed group size. Kept in log space so that the loss can
    form w_i A_i without overflow (``scaled_exp``); in ``compute_dtype`` of ``log_ratio``.
    """
    clipped = log_ratio.detach().to(compute_dtype(log_ratio)).clamp(clip_low, clip_high)
    if self_normalize:
        return group_log_softmax(clipped, group_ids)
    index, num_groups = group_index(group_ids)
    return clipped - torch.bincount(index, minlength=num_groups)[index].to(clipped.dtype).log()


def importance_weights(
    log_ratio: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    clip_low: float = -math.inf,
    clip_high: float = math.log(5.0),
    self_normalize: bool = True,
) -> torch.Tensor:
    """Detached sequence weights [B]: exp(clamp(log rho, clip_low, clip_high)) normalised per group.

    ``self_normalize=True``: divide by the group's sum of clipped ratios (a group softmax, each group's weights
    on the simplex). ``False`` (the clip-only ablation): divide by the fixed group size G instead. The exponential
    of ``log_importance_weights``, in ``compute_dtype`` of ``log_ratio``.
    """
    return torch.exp(
        log_importance_weights(
            log_ratio, group_ids, clip_low=clip_low, clip_high=clip_high, self_normalize=self_normalize
        )
    )


def stabledrl_loss(
    elbo: torch.Tensor,
    eubo: torch.Tensor | None,
    old_elbo: torch.Tensor,
    advantages: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    omega: float = 0.5,
    logp_estimation: str = "mix",
    clip_low: float = -math.inf,
    clip_high: float = math.log(5.0),
    self_normalize: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """StableDRL's loss (module docstring): per-sequence tensors [B]; ``elbo``/``eubo`` carry the gradient.

    Computed and returned in ``compute_dtype`` of the inputs. The detached coefficient w_i A_i is formed from
    log w_i with ``scaled_exp``: exactly 0 for A_i = 0 and finite whenever w_i A_i is. Self-normalised weights are
    <= 1 and clipped ones <= C / G, so nothing can overflow there; only the clip-only ablation with C beyond the
    dtype's range (plain unnormalised importance sampling, w_i = rho_i / G) can meet a w_i A_i that truly exceeds
    the range. Its term is then +-inf, as that method's maths says, except on a bound that is exactly 0 (a zeroed
    non-finite estimate, or ``logp_estimation="zero"`` for A_i <= 0: constants), where it is the exact 0 rather
    than inf x 0 = NaN; the gradient of such a term is 0, exact for those constant bounds (a live ELBO of exactly
    0 would lose its infinite gradient the same way).
    """
    finite = {"nan": 0.0, "posinf": 0.0, "neginf": 0.0}  # the official code's nan_to_num
    dtype = compute_dtype(elbo, eubo, old_elbo, advantages)
    elbo, advantages = elbo.to(dtype), advantages.to(dtype)
    bound = sandwich_bound(elbo, eubo, advantages, omega=omega, logp_estimation=logp_estimation)
    bound = torch.nan_to_num(bound, **finite)
    log_ratio = (torch.nan_to_num(elbo, **finite) - torch.nan_to_num(old_elbo.to(dtype), **finite)).detach()
    log_weights = log_importance_weights(
        log_ratio, group_ids, clip_low=clip_low, clip_high=clip_high, self_normalize=self_normalize
    )
    coefficient = scaled_exp(log_weights, advantages)
    coefficient = torch.where(coefficient.isinf() & (bound == 0), 0.0, coefficient)
    loss = mean_over_groups(-(coefficient * bound), group_ids)
    stats = ratio_metrics(log_ratio)
    metrics = {
        "loss": loss.item(),
        **stats,
        "iw_mean": stats["ratio_mean"],  # the official code's log names for the unclipped ratio
        "iw_max": stats["ratio_max"],
        "clip_ratio": ((log_ratio < clip_low) | (log_ratio > clip_high)).float().mean().item(),
        "weight_max": log_weights.max().exp().item(),
        "adv_abs_mean": advantages.abs().mean().item(),
    }
    return loss, metrics


@dataclass
class StableDRLConfig(SPGConfig):
    coupled: bool = False  # official: E_old from an independent mask draw at rollout time
    mode: str = "official"  # official (upper-only clip at C) | paper (two-sided [1 - eps, 1 + eps])
    clip_threshold: float = 5.0  # C = ais_clip_iw, official mode
    epsilon: float = 0.2  # paper mode

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in MODES:
            raise UserError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if not self.clip_threshold > 0:
            raise UserError(f"clip_threshold must be > 0; got {self.clip_threshold}")
        if not 0 < self.epsilon < 1:
            raise UserError(f"epsilon must be in (0, 1); got {self.epsilon}")

    @property
    def clip_low(self) -> float:
        """Lower clip of log rho: -inf (official) or log(1 - eps) (paper)."""
        return math.log(1 - self.epsilon) if self.mode == "paper" else -math.inf

    @property
    def clip_high(self) -> float:
        """Upper clip of log rho: log C (official) or log(1 + eps) (paper)."""
        return math.log(1 + self.epsilon) if self.mode == "paper" else math.log(self.clip_threshold)


@register_baseline("stabledrl")
class StableDRL(SPG):
    """StableDRL: SPG's sandwich weighted by clipped, group-self-normalised, detached ELBO importance ratios.

    Inherits SPG's estimator (``spg_block``), its estimator options and its r - mean advantages.
    """

    description: ClassVar[str] = "StableDRL: SPG bound x detached clipped self-normalised IS weights (C = 5)"
    Config: ClassVar[type[BaselineConfig]] = StableDRLConfig
    needs_old: ClassVar[bool] = True
    self_normalize: ClassVar[bool] = True  # False only in the clip-only ablation
    config: StableDRLConfig

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        return stabledrl_loss(
            need(inputs.new, "elbo", self.name),
            inputs.new.eubo,
            need(inputs.old, "elbo", self.name),
            inputs.advantages,
            inputs.group_ids,
            omega=self.config.omega,
            logp_estimation=self.config.logp_estimation,
            clip_low=self.config.clip_low,
            clip_high=self.config.clip_high,
            self_normalize=self.self_normalize,
        )
