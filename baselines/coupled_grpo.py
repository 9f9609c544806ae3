"""Coupled-GRPO (DiffuCoder, ``apple/ml-diffucoder``, ``src/open_r1/coupled_grpo.py: compute_loss`` with
``recipes/config_coupled_code.yaml``).

d1's token-level PPO loss (``grpo.py: grpo_loss``, unchanged) on a lower-variance likelihood estimate: the
``coupled_pair`` estimator scores every completion token under a fully masked completion and under one of two
complementary partial masks (t and 1 - t), and averages the two (docs/methods.md#coupled-grpo)::

    log pi^(y^k) = (p0_k + (p1_k / t if u_k < t else p2_k / (1 - t))) / 2,   t ~ U(0.2, 0.8) per draw
    l_ik         = -min(rho_ik A_i, clip(rho_ik, 1 - eps, 1 + eps) A_i) + beta KL3_ik      (as GRPO)
    A_i          = r_i - (sum_{j in g} r_j - r_i) / (G - 1)        (leave-one-out, lines 545 and 557-561)

Official settings: eps = 0.5 (both sides), beta = 0.01 (k3 to the reference), the reference mixed with the policy
every 64 optimizer steps (``sync_ref_model: True``, ``ref_model_sync_steps: 64``; TRL's ``ref_model_mixup_alpha``
0.6: ref <- 0.4 ref + 0.6 policy), no prompt masking, masks shared by the old and new estimates of an iteration,
mu = 2, G = 10, lr 1e-6. ``scale_rewards: false`` only drops the std division; the leave-one-out baseline is
hard-coded (``leave_one_out = True``). Where it departs from GRPO: the estimator (three forward passes instead of
one, no prompt masking), the advantage's baseline (the other completions' mean), beta, and the reference sync.
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
    beta: float = 0.01  # k3 KL to the reference
    t_min: float = 0.2  # mask ratio range of the coupled pair (forward_process: random.uniform(0.2, 0.8))
    t_max: float = 0.8
    p_mask_prompt: float = 0.0  # the official recipe masks no prompt token
    sync_ref_model: bool = True  # config_coupled_code.yaml lines 11-12 (False: a frozen reference)
    ref_model_sync_steps: int = 64


@register_baseline("coupled_grpo")
class CoupledGRPO(GRPO):
    """Coupled-GRPO: d1's token PPO on the complementary-mask (coupled) likelihood estimate, leave-one-out
    advantages, k3 KL (beta 0.01) to a reference synced every 64 steps."""

    description: ClassVar[str] = (
        "DiffuCoder coupled-GRPO: d1 token PPO (eps 0.5) on complementary-mask estimates, leave-one-out A"
    )
    Config: ClassVar[type[BaselineConfig]] = CoupledGRPOConfig
    advantage: ClassVar[str] = "leave_one_out"
    config: CoupledGRPOConfig

    def estimator(self) -> CoupledPair:
        return CoupledPair(t_min=self.config.t_min, t_max=self.config.t_max, p_mask_prompt=self.config.p_mask_prompt)
