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

This module also holds the PPO pieces that ESPO and TraceRL reuse (``conditional_clip``, ``scaled_exp``,
``k3_kl``, ``ratio_metrics``) so the three losses differ only where their papers differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from stabledrl_bench.core.advantages import compute_dtype, group_mean_advantage
from stabledrl_bench.core.estimators import Estimate
from stabledrl_bench.core.registry import Baseline, BaselineConfig, LossInputs, register_baseline


def scaled_exp(log_scale: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """factor * exp(log_scale), finite wherever the product is, although exp(log_scale) alone may overflow.

    Where exp(log_scale) is finite this is the plain product (the same rounding as ``exp(x) * a``); where it
    overflows (log_scale > log(max) of the dtype: ~88.7 in float32, ~709.8 in float64) it is evaluated in log
    space as sign(factor) exp(log_scale + log|factor|), so that e.g. e^100 x 1e-30 stays 2.7e13 in float32 and
    factor = 0 gives exactly 0 instead of inf x 0 = NaN. The result (and its gradient, which is the result
    itself for d/d log_scale) is +-inf only where |factor| e^log_scale really exceeds the dtype's range. Every
    branch torch.where discards is fed harmless arguments, so no NaN reaches the gradient either.
    """
    overflow = torch.isinf(torch.exp(log_scale.detach()))
    direct = torch.exp(torch.where(overflow, 0.0, log_scale)) * factor
    wide = overflow & (factor != 0)
    log_product = torch.where(wide, log_scale, 0.0) + torch.where(wide, factor, 1.0).abs().log()
    return torch.where(overflow, torch.sign(factor) * torch.exp(log_product), direct)


def conditional_clip(
    log_ratio: torch.Tensor, advantages: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO surrogate min(rho A, clip(rho, 1-eps, 1+eps) A) and where its clipped branch is active.

    ``clipped`` marks the entries whose gradient the min zeroes: rho > 1+eps with A > 0, or rho < 1-eps with
    A < 0 (the definition of TRL's ``clip_ratio/region``). The other two cases pass the raw ratio through. So

        min(rho A, clip(rho) A) = (1 + eps) A   if clipped and A > 0,   (1 - eps) A   if clipped and A < 0,
                                  rho A         otherwise (A = 0 included: exactly 0),

    which is how it is evaluated: rho A with ``scaled_exp`` (no exp overflow where rho A is finite), the clipped
    constant without ever forming rho, so a clipped entry stays finite with zero gradient however large rho is.
    Computed in ``compute_dtype`` of the inputs. Where the unclipped rho A itself exceeds the range (A < 0 and
    log rho > log(max / |A|): the "exploding weights" of the conditional-clipping bypass), the objective and its
    gradient are -inf, which is the method's maths, not a rounding artefact; nothing is clamped.
    """
    dtype = compute_dtype(log_ratio, advantages)
    log_ratio, advantages = log_ratio.to(dtype), advantages.to(dtype)
    ratio = torch.exp(log_ratio.detach())
    clipped = ((ratio > 1 + epsilon) & (advantages > 0)) | ((ratio < 1 - epsilon) & (advantages < 0))
    bounded = torch.where(advantages > 0, advantages * (1 + epsilon), advantages * (1 - epsilon))
    objective = torch.where(clipped, bounded, scaled_exp(torch.where(clipped, 0.0, log_ratio), advantages))
    return objective, clipped


def k3_kl(log_ratio: torch.Tensor, exp_clamp: float = float("inf")) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi_theta || q) from x = log q - log pi_theta: exp(x) - x - 1 >= 0.

    ``exp_clamp`` bounds x inside the exponential only (dLLM-RL's TraDo loss clamps it to +-10). In
    ``compute_dtype``; +inf (never NaN) where exp(x) - x - 1 itself exceeds the range (x > ~88.7 in float32).
    """
    log_ratio = log_ratio.to(compute_dtype(log_ratio))
    return torch.exp(log_ratio.clamp(-exp_clamp, exp_clamp)) - log_ratio - 1


@torch.no_grad()
def ratio_metrics(log_ratio: torch.Tensor) -> dict[str, float]:
    """Shared diagnostics of the (unclipped) importance ratios rho = exp(log_ratio) of the entries that count.

    ``drift`` = mean |log rho|: per token for token-level methods, mean |Delta ELBO| (per-token scale) for the
    sequence-level ones. Computed in float64 so that log-ratios up to ~700 still give finite numbers.
    """
    x = log_ratio.detach().double()
    ratio = torch.exp(x)
    return {
        "ratio_mean": ratio.mean().item(),
        "ratio_max": ratio.max().item(),
        "ratio_var": ratio.var(unbiased=False).item(),
        "drift": x.abs().mean().item(),
    }


def need(estimate: Estimate | None, field: str, baseline: str) -> torch.Tensor:
    """``estimate.<field>``, or a clear error naming what the trainer failed to provide."""
    value = getattr(estimate, field, None) if estimate is not None else None
    if value is None:
        raise ValueError(f"baseline {baseline!r} needs Estimate.{field}, which the trainer did not provide")
    return value


def per_row(values: torch.Tensor, row_to_seq: torch.Tensor | None) -> torch.Tensor:
    """Per-sequence values [B] broadcast to estimator rows [R] (trajectory replay has several rows per sequence)."""
    return values if row_to_seq is None else values[row_to_seq]


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
    count = mask.sum().clamp(min=1)
    loss = torch.where(mask, per_token, 0.0).sum() / count
    metrics |= {
        "loss": loss.item(),
        **ratio_metrics(log_ratio[mask]),
        "clip_frac": clipped[mask].float().mean().item(),
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
    estimator: ClassVar[str] = "d1_one_step"
    needs_old: ClassVar[bool] = True
    config: GRPOConfig

    def estimator_kwargs(self) -> dict[str, Any]:
        return {"p_mask_prompt": self.config.p_mask_prompt}

    def advantages(
        self, rewards: torch.Tensor, group_ids: torch.Tensor, correct: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return group_mean_advantage(rewards, group_ids), torch.ones_like(group_ids, dtype=torch.bool)

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
