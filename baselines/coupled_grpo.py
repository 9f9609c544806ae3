"""Coupled-GRPO (DiffuCoder, ``apple/ml-diffucoder``, ``src/open_r1/coupled_grpo.py: compute_loss`` with
``recipes/config_coupled_code.yaml``).

d1's token-level PPO loss (``grpo.py: grpo_loss``, unchanged) on a lower-variance likelihood estimate: the
``coupled_pair`` estimator scores every completion token under a fully masked completion and under one of two
complementary partial masks (t and 1 - t), and averages the two (docs/methods.md#coupled-grpo)::

    log pi^(y^k) = (p0_k + (p1_k / t if u_k < t else p2_k / (1 - t))) / 2,   t ~ U(0.2, 0.8) per draw
    l_ik         = -min(rho_ik A_i, clip(rho_ik, 1 - eps, 1 + eps) A_i) + beta KL3_ik      (as GRPO)
    A_i          = r_i - mean_group(r)                                  (``scale_rewards: false``)

Official settings: eps = 0.5 (both sides), beta = 0.01 (k3 to the reference), no prompt masking, masks shared by the
old and new estimates of an iteration, mu = 2, G = 10, lr 1e-6. Where it departs from GRPO: only the estimator
(three forward passes instead of one, no prompt masking) and beta.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from stabledrl_bench.core.baseline import BaselineConfig, register_baseline
from stabledrl_bench.core.estimators import CoupledPair

from .grpo import GRPO


@dataclass
class CoupledGRPOConfig(BaselineConfig):
    epsilon: float = 0.5  # PPO clip range (epsilon in config_coupled_code.yaml)
    beta: float = 0.01  # k3 KL to the frozen reference
    t_min: float = 0.2  # mask ratio range of the coupled pair (forward_process: random.uniform(0.2, 0.8))
    t_max: float = 0.8
    p_mask_prompt: float = 0.0  # the official recipe masks no prompt token


@register_baseline("coupled_grpo")
class CoupledGRPO(GRPO):
    """Coupled-GRPO: d1's token PPO on the complementary-mask (coupled) likelihood estimate, k3 KL (beta 0.01)."""

    description: ClassVar[str] = "DiffuCoder coupled-GRPO: d1 token PPO (eps 0.5) on complementary-mask estimates"
    Config: ClassVar[type[BaselineConfig]] = CoupledGRPOConfig
    config: CoupledGRPOConfig

    def estimator(self) -> CoupledPair:
        return CoupledPair(t_min=self.config.t_min, t_max=self.config.t_max, p_mask_prompt=self.config.p_mask_prompt)
