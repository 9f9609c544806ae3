"""The pieces every policy loss is built from: PPO's clipped surrogate, KL estimators, ratio diagnostics, and the
named ways a loss reduces its per-token or per-sequence terms to one number.

The losses in ``baselines/`` import these, so two methods differ only where their papers differ. Aggregation
is one of the real differences between the methods, so each one has a name here and each loss calls its own
by name instead of hiding a ``.sum() / ...`` in the middle of its formula:

========================  =====================================================  =================================
aggregation               L = ...                                                used by
========================  =====================================================  =================================
``token_mean``            sum_ik c_ik l_ik / sum_ik c_ik (all valid tokens)      d1/GRPO
``token_mean_per_step``   (1/S) sum_s [sum_{r in s, k} c l / sum_{r in s, k} c]  CJ-GRPO (rows of replay step s)
``row_mean``              (1/R) sum_r (1/N_r) sum_k c_rk l_rk                    TraceRL/TraDo (N_r = L or |P_r|),
                                                                                 AGRPO (N_r = 1)
``sequence_mean``         (1/B) sum_i l_i                                        ESPO
``masked_sequence_mean``  (1/(B + 1e-8)) sum_i l_i |y_i| / (|y_i| + 1e-8)        GDPO (NeMo RL's masked means)
``length_weighted``       sum_i |y_i| l_i / sum_i |y_i|                          SPG
``mean_over_groups``      (1/#groups) sum_i l_i (a sum inside each group)        StableDRL (and its ablations)
========================  =====================================================  =================================

Precision: every function computes in ``compute_dtype`` of its inputs (promote_types(inputs, float32)), and
exponentials of log-ratios never overflow into inf x 0 (:func:`scaled_exp`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from stabledrl_bench.core.advantages import compute_dtype, group_index

if TYPE_CHECKING:
    from stabledrl_bench.core.estimators import Estimate


# ====================================================================================== PPO pieces
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
    log_ratio: torch.Tensor, advantages: torch.Tensor, epsilon: float, epsilon_high: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO surrogate min(rho A, clip(rho, 1-eps, 1+eps) A) and where its clipped branch is active.

    ``epsilon_high`` (None: ``epsilon``) is the upper bound's own range, clip(rho, 1 - eps, 1 + eps_high) (DAPO's
    clip-higher, EGSPO's ``epsilon_high``); everything below holds with 1 + eps_high in place of 1 + eps.

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
    high = epsilon if epsilon_high is None else epsilon_high
    ratio = torch.exp(log_ratio.detach())
    clipped = ((ratio > 1 + high) & (advantages > 0)) | ((ratio < 1 - epsilon) & (advantages < 0))
    bounded = torch.where(advantages > 0, advantages * (1 + high), advantages * (1 - epsilon))
    objective = torch.where(clipped, bounded, scaled_exp(torch.where(clipped, 0.0, log_ratio), advantages))
    return objective, clipped


def k3_kl(log_ratio: torch.Tensor, exp_clamp: float = float("inf")) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi_theta || q) from x = log q - log pi_theta: exp(x) - x - 1 >= 0.

    ``exp_clamp`` bounds x inside the exponential only (dLLM-RL's TraDo loss clamps it to +-10). In
    ``compute_dtype``; +inf (never NaN) where exp(x) - x - 1 itself exceeds the range (x > ~88.7 in float32).
    """
    log_ratio = log_ratio.to(compute_dtype(log_ratio))
    return torch.exp(log_ratio.clamp(-exp_clamp, exp_clamp)) - log_ratio - 1


def k2_kl(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k2 estimator 0.5 (log pi_theta - log q)^2 (ESPO applies it to sequence ELBOs)."""
    return 0.5 * log_ratio.to(compute_dtype(log_ratio)) ** 2


def anchor_kl(elbo: torch.Tensor, ref_elbo: torch.Tensor, length: int) -> torch.Tensor:
    """The same KL anchor for every method: (1/B) sum_i k3((E_ref_i - E_theta_i) / L).

    ``elbo`` [B] (with grad) and ``ref_elbo`` [B] are sequence ELBOs of the current and the frozen reference
    policy on the same masks, summed over the L canvas positions; dividing by L puts the log-ratio on the per-token
    scale that GRPO's token-level k3 penalty uses, so one beta means about the same pull for a sequence-level
    estimate as for d1's token-level one. The trainer adds ``anchor_beta`` times this to any method's loss
    (``TrainConfig.anchor_beta``), which is what lets a comparison give every method one anchor: the methods' own
    KL terms differ in estimator, reference and scale, and SPG and StableDRL have none.
    """
    dtype = compute_dtype(elbo)
    return k3_kl((ref_elbo.to(dtype) - elbo.to(dtype)) / length).mean()


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


def samples_of(estimate: Estimate | None, baseline: str) -> torch.Tensor:
    """The per-Monte-Carlo-sample values [B, K] of a sequence estimate (``elbo_samples``); an estimator that keeps
    only their mean (``elbo`` [B]) counts as one sample. For the losses that take every sample on its own (GDSD,
    BGPO)."""
    if estimate is not None and estimate.elbo_samples is not None:
        return estimate.elbo_samples
    return need(estimate, "elbo", baseline)[:, None]


def per_row(values: torch.Tensor, row_to_seq: torch.Tensor | None) -> torch.Tensor:
    """Per-sequence values [B] broadcast to estimator rows [R] (trajectory replay has several rows per sequence)."""
    return values if row_to_seq is None else values[row_to_seq]


@dataclass
class TokenPPO:
    """The per-token terms of d1's token-level PPO loss, before any aggregation (:func:`token_ppo`)."""

    per_token: torch.Tensor  # [R, L] -min(rho A, clip(rho) A) + beta KL3 (0 off the mask)
    log_ratio: torch.Tensor  # [R, L] log rho (0 off the mask)
    clipped: torch.Tensor  # [R, L] bool, the clip is active (zero gradient)
    kl: torch.Tensor | None  # [R, L] the KL term before beta (None when beta = 0)
    advantages: torch.Tensor  # [R] in the compute dtype


def token_ppo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon: float,
    beta: float = 0.0,
    kl_times_ratio: bool = False,
) -> TokenPPO:
    """d1's token-level PPO terms on any token-level estimate: rows [R, L], one advantage per row [R].

    l_rk = -min(rho_rk A_r, clip(rho_rk, 1 - eps, 1 + eps) A_r) + beta KL3_rk with rho = exp(logp - old_logp) and
    KL3 = exp(ref - logp) - (ref - logp) - 1 (Schulman's k3 to the reference). ``kl_times_ratio`` multiplies KL3 by
    rho (with its gradient), AGRPO's importance-sampling correction of the KL estimate. Off-mask positions are
    zeroed *before* the exponential so that garbage there cannot reach the gradient. The methods built on it
    (GRPO, CJ-GRPO, AGRPO, JustGRPO) differ in their rows and in how they aggregate ``per_token``. Computed in
    ``compute_dtype`` of the inputs; see ``conditional_clip`` for what stays finite when rho overflows.
    """
    dtype = compute_dtype(logp, old_logp, ref_logp, advantages)
    mask = mask.bool()
    advantages = advantages.to(dtype)
    log_ratio = torch.where(mask, logp.to(dtype) - old_logp.to(dtype), 0.0)
    objective, clipped = conditional_clip(log_ratio, advantages[:, None], epsilon)
    per_token, kl = -objective, None
    if beta > 0:
        if ref_logp is None:
            raise ValueError("a KL term (beta > 0) needs the reference log-probs")
        kl = k3_kl(torch.where(mask, ref_logp.to(dtype) - logp.to(dtype), 0.0))
        if kl_times_ratio:
            kl = scaled_exp(log_ratio, kl)
        per_token = per_token + beta * kl
    return TokenPPO(per_token, log_ratio, clipped, kl, advantages)


def token_ppo_metrics(loss: torch.Tensor, terms: TokenPPO, mask: torch.Tensor) -> dict[str, float]:
    """The shared metrics of a :func:`token_ppo` loss over the entries of ``mask``."""
    mask = mask.bool()
    metrics = {"kl": terms.kl[mask].mean().item()} if terms.kl is not None else {}
    return metrics | {
        "loss": loss.item(),
        **ratio_metrics(terms.log_ratio[mask]),
        "clip_ratio": terms.clipped[mask].float().mean().item(),
        "adv_abs_mean": terms.advantages.abs().mean().item(),
    }


# ====================================================================================== aggregations
def token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Every valid token of the micro-batch weighs the same: sum_ik c_ik l_ik / sum_ik c_ik (d1/GRPO).

    Long completions therefore weigh more than short ones. Off-mask entries are dropped with ``where`` (not
    multiplied by 0), so an inf there cannot become NaN.
    """
    mask = mask.bool()
    return torch.where(mask, values, 0.0).sum() / mask.sum().clamp(min=1)


def token_mean_per_step(values: torch.Tensor, mask: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """(1/S) sum_s [sum_{r: step_r = s} sum_k c_rk l_rk / sum_{r: step_r = s} sum_k c_rk]: a token mean over the
    micro-batch for each replay step, then the mean over the S steps present (CJ-GRPO).

    ``values`` / ``mask`` [R, L] over replay rows, ``step`` [R] the step of each row (``estimators.replay_rounds``).
    Every step weighs the same, however many tokens it committed; a step with no counted token is not one of the S.
    """
    mask = mask.bool()
    steps, index = torch.unique(step, return_inverse=True)
    sums = values.new_zeros(steps.shape[0]).index_add(0, index, torch.where(mask, values, 0.0).sum(dim=1))
    counts = values.new_zeros(steps.shape[0]).index_add(0, index, mask.sum(dim=1).to(values.dtype))
    present = counts > 0
    return (sums[present] / counts[present]).sum() / present.sum().clamp(min=1)


def row_mean(values: torch.Tensor, mask: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """(1/R) sum_r (1/N_r) sum_k c_rk l_rk: each row normalised by its own ``norm`` [R], then rows averaged.

    TraceRL's replay rows: N_r is the padded length (TraDo) or the number of targets of the row (dLLM-RL's
    LLaDA script).
    """
    return (torch.where(mask.bool(), values, 0.0).sum(dim=1) / norm).sum() / mask.shape[0]


def sequence_mean(values: torch.Tensor) -> torch.Tensor:
    """(1/B) sum_i l_i: every sequence weighs the same, whatever its length (ESPO)."""
    return values.mean()


def masked_sequence_mean(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """NeMo RL's sequence-level loss reduction: (1/(B + 1e-8)) sum_i l_i |y_i| / (|y_i| + 1e-8) (GDPO).

    Why not :func:`sequence_mean`: ``ClippedPGLossFn`` (``token_level_loss: false``) first takes each row's masked
    mean of a value repeated over its scored tokens, ``sum / (|y_i| + 1e-8)`` (``nemo_rl/algorithms/utils.py:
    masked_mean``), then the mean over the rows with the same 1e-8. A completion with no scored token therefore
    counts in B and adds exactly 0, whatever its value; every other row gets the factor |y_i| / (|y_i| + 1e-8),
    which is 1 in float32 and 1 - 1e-8 / |y_i| in float64. ``values`` and ``lengths`` (scored tokens) are [B].
    """
    lengths = lengths.to(values.dtype)
    return (values * lengths / (lengths + 1e-8)).sum() / (values.shape[0] + 1e-8)


def sequence_ppo(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    epsilon: float,
    aggregate: Callable[[torch.Tensor], torch.Tensor] = sequence_mean,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``aggregate`` (default (1/B) sum_i) of -min(rho_i A_i, clip(rho_i, 1 - eps, 1 + eps) A_i) for one log-ratio
    per sequence [B], with the ratio diagnostics: the part ESPO and GDPO share (they differ in the ELBO, its
    normaliser, the reduction over the sequences and ESPO's KL)."""
    objective, clipped = conditional_clip(log_ratio, advantages, epsilon)
    loss = aggregate(-objective)
    metrics = {
        "loss": loss.item(),
        **ratio_metrics(log_ratio),
        "clip_ratio": clipped.float().mean().item(),
        "adv_abs_mean": advantages.abs().mean().item(),
    }
    return loss, metrics


def length_weighted(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """sum_i |y_i| l_i / sum_i |y_i|: sequences weighted by their valid length (SPG's per-token average)."""
    weight = lengths.to(values.dtype)
    return (values * weight).sum() / weight.sum().clamp(min=1e-8)


def mean_over_groups(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(1/#groups) sum_i l_i: a sum inside each group (the weights already sum to 1 there), groups averaged.

    StableDRL's self-normalised weights put each group on the simplex, so the per-group sum is a convex
    combination and the mean over groups keeps one group's update from outweighing another's.
    """
    _, num_groups = group_index(group_ids)
    return values.sum() / num_groups
