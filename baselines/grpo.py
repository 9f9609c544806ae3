"""d1 / diffu-GRPO (``dllm-reasoning/d1``, ``diffu-grpo/diffu_grpo_trainer.py: compute_loss``).

Token-level PPO with *conditional* clipping on the one-step mean-field likelihood (docs/methods.md#grpo)::

    rho_ik = exp(log pi_theta(y_i^k) - log pi_old(y_i^k))                      (coupled masks)
    l_ik   = -min(rho_ik A_i, clip(rho_ik, 1 - eps, 1 + eps) A_i) + beta KL3_ik
    KL3_ik = exp(log pi_ref - log pi_theta) - (log pi_ref - log pi_theta) - 1
    L      = sum_ik c_ik l_ik / sum_ik c_ik                (token mean over the micro-batch)
    A_i    = r_i - mean_group(r)                           (no std division)

Defaults from ``slurm_scripts/train.yaml``: eps = 0.5, beta = 0.04, p_mask_prompt = 0.15.

The min(.) is what StableDRL calls the conditional-clipping bypass: for A < 0 and rho >> 1 + eps the
unclipped term rho A is the smaller one, so the gradient rho |A| grad(log pi) grows without bound in rho. In
floating point it grows until rho |A| itself leaves the dtype's range, and only then becomes +inf: rho is never
formed where it would overflow on the way (``scaled_exp``), so A = 0 and the clipped branch stay exact.

The PPO pieces (``token_ppo`` on ``conditional_clip``, ``scaled_exp``, ``k3_kl``, ``ratio_metrics``) and the
``token_mean`` aggregation come from ``stabledrl_bench.core.losses``, shared with ESPO, TraceRL, CJ-GRPO, AGRPO and
JustGRPO, so the losses differ only where their papers differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import D1OneStep
from stabledrl_bench.core.losses import token_mean, token_ppo, token_ppo_metrics


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon: float = 0.5,
    beta: float = 0.04,
) -> tuple[torch.Tensor, dict[str, float]]:
    """d1's token-level clipped loss (see the module docstring); all token tensors [B, L], ``advantages`` [B].

    The per-token terms are ``core.losses.token_ppo`` (off-mask positions zeroed before the exponential, computed
    in ``compute_dtype`` of the inputs: bf16 -> float32, float64 stays float64); what makes it d1's loss is the
    token mean over the micro-batch.
    """
    terms = token_ppo(logp, old_logp, ref_logp, mask, advantages, epsilon=epsilon, beta=beta)
    loss = token_mean(terms.per_token, mask)
    return loss, token_ppo_metrics(loss, terms, mask)


@dataclass
class GRPOConfig(BaselineConfig):
    epsilon: float = 0.5  # PPO clip range (d1 train.yaml)
    beta: float = 0.04  # k3 KL to the frozen reference
    p_mask_prompt: float = 0.15  # prompt-token masking probability of the one-step estimator


@register_baseline("grpo")
class GRPO(Baseline):
    """d1 / diffu-GRPO: token-level conditional PPO clip on the one-step estimator, k3 KL, r - mean advantage."""

    description: ClassVar[str] = "d1 diffu-GRPO: token-level conditional PPO clip (eps 0.5), k3 KL (beta 0.04)"
    Config: ClassVar[type[BaselineConfig]] = GRPOConfig
    advantage: ClassVar[str] = "group_mean"
    needs_old: ClassVar[bool] = True
    config: GRPOConfig

    def estimator(self) -> D1OneStep:
        return D1OneStep(p_mask_prompt=self.config.p_mask_prompt)

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        return grpo_loss(*inputs.token_rows(self.name), epsilon=self.config.epsilon, beta=self.config.beta)
