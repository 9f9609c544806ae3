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

The PPO pieces (``conditional_clip``, ``scaled_exp``, ``k3_kl``, ``ratio_metrics``) and the ``token_mean``
aggregation come from ``stabledrl_bench.core.losses``, shared with ESPO and TraceRL, so the three losses differ
only where their papers differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from stabledrl_bench.core.advantages import compute_dtype
from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import D1OneStep
from stabledrl_bench.core.losses import conditional_clip, k3_kl, need, per_row, ratio_metrics, token_mean


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

    Off-mask positions are zeroed *before* the exponential so that garbage there cannot reach the gradient.
    Computed and returned in ``compute_dtype`` of the inputs (bf16 -> float32, float64 stays float64); see
    ``conditional_clip`` for what stays finite when rho overflows (everything but a genuinely huge rho |A|, A < 0).
    """
    dtype = compute_dtype(logp, old_logp, ref_logp, advantages)
    mask = mask.bool()
    advantages = advantages.to(dtype)
    log_ratio = torch.where(mask, logp.to(dtype) - old_logp.to(dtype), 0.0)
    objective, clipped = conditional_clip(log_ratio, advantages[:, None], epsilon)
    per_token = -objective
    metrics: dict[str, float] = {}
    if beta > 0:
        if ref_logp is None:
            raise ValueError("grpo with beta > 0 needs the reference log-probs")
        kl = k3_kl(torch.where(mask, ref_logp.to(dtype) - logp.to(dtype), 0.0))
        per_token = per_token + beta * kl
        metrics["kl"] = kl[mask].mean().item()
    loss = token_mean(per_token, mask)
    metrics |= {
        "loss": loss.item(),
        **ratio_metrics(log_ratio[mask]),
        "clip_ratio": clipped[mask].float().mean().item(),
        "adv_abs_mean": advantages.abs().mean().item(),
    }
    return loss, metrics


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
        new = inputs.new
        return grpo_loss(
            need(new, "token_logp", self.name),
            need(inputs.old, "token_logp", self.name),
            inputs.ref.token_logp if inputs.ref is not None else None,
            need(new, "token_mask", self.name),
            per_row(inputs.advantages, new.row_to_seq),
            epsilon=self.config.epsilon,
            beta=self.config.beta,
        )
