"""TraceRL / TraDo (``Gen-Verse/dLLM-RL``, ``train/rl_trado.py: forward_process``; LLaDA: ``train/rl_llada.py``).

Token-level PPO on the *exact* per-step log-probs of the decoded tokens, replayed along the sampled
trajectory: each (sequence, decoding step) is one row whose targets P_r are the tokens committed at that step
(docs/methods.md#tracerl)::

    delta_k = clamp(log p_theta(y^k | z_r) - log p_old(y^k | z_r), -10, 10)     on targets k in P_r
    L       = -(1/R) sum_r (1/N_r) sum_{k in P_r} min(e^delta_k A, clip(e^delta_k, 1 - eps, 1 + eps) A)
              + beta (1/R) sum_r (1/N_r) sum_{k in P_r} (e^{-delta_k} - 1 + delta_k)   (k3 KL vs the OLD policy)
    A       = z-score of binary correctness within the group (population std; all equal -> 0),
              groups with accuracy outside [0.2, 0.8] dropped

with N_r = L_1, the padded response length (``normalize="length"``, TraDo). ``normalize="targets"`` is the
LLaDA script instead: N_r = |P_r| for the policy term and an unnormalised sum over targets for the KL (set
``log_ratio_clamp=inf`` too, that script has no clamp). Defaults: eps 0.2, beta 0.01 (``configs/rl_trado.yaml``).
The KL is against the rollout policy, so no reference model is ever loaded (``needs_ref`` is False).
Correctness comes from the task's grader, except that an answer of length >= L_1 - 5 tokens (L_1 the canvas,
length counted before the first stop token) is counted as wrong: it was probably cut off (dLLM-RL
``reward/rl_reward.py``; ``overlong_margin=None`` turns that off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from stabledrl_bench.core.advantages import compute_dtype
from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import TraceReplay
from stabledrl_bench.core.losses import conditional_clip, k3_kl, need, per_row, ratio_metrics, row_mean
from stabledrl_bench.errors import UserError

NORMALIZATIONS = ("length", "targets")


def trado_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon: float = 0.2,
    beta: float = 0.01,
    normalize: str = "length",
    log_ratio_clamp: float = 10.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """TraceRL's replay loss (module docstring): token tensors [R, L_1] over replay rows, ``advantages`` [R].

    As in the official code the log-ratio is zeroed off the targets before the clamp and the exponential, and
    the KL uses the unclamped difference with the clamp applied inside the exponential only. Computed and
    returned in ``compute_dtype`` of the inputs. The +-10 clamp keeps rho <= e^10; with ``log_ratio_clamp=inf``
    ``conditional_clip`` behaves as for GRPO (finite except a genuinely huge rho |A| with A < 0).
    """
    dtype = compute_dtype(logp, old_logp, advantages)
    mask = mask.bool()
    rows, length = mask.shape
    advantages = advantages.to(dtype)
    raw = torch.where(mask, logp.to(dtype) - old_logp.to(dtype), 0.0)
    log_ratio = raw.clamp(-log_ratio_clamp, log_ratio_clamp)
    objective, clipped = conditional_clip(log_ratio, advantages[:, None], epsilon)
    if normalize == "length":
        policy_norm = kl_norm = torch.full((rows,), float(length), dtype=dtype, device=mask.device)
    elif normalize == "targets":
        policy_norm = mask.sum(dim=1).clamp(min=1).to(dtype)
        kl_norm = torch.ones(rows, dtype=dtype, device=mask.device)
    else:
        raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
    loss = -row_mean(objective, mask, policy_norm)
    metrics: dict[str, float] = {}
    if beta > 0:
        kl = row_mean(k3_kl(-raw, exp_clamp=log_ratio_clamp), mask, kl_norm)
        loss = loss + beta * kl
        metrics["kl"] = kl.item()
    metrics |= {
        "loss": loss.item(),
        **ratio_metrics(raw[mask]),
        "clip_ratio": clipped[mask].float().mean().item(),
        "adv_abs_mean": advantages.abs().mean().item(),
    }
    return loss, metrics


@dataclass
class TraDoConfig(BaselineConfig):
    epsilon: float = 0.2  # token-level PPO clip range
    beta: float = 0.01  # k3 KL to the rollout (old) policy, not to a frozen reference
    normalize: str = "length"  # length: / padded response length L_1 (TraDo) | targets: / |P_r| (LLaDA script)
    log_ratio_clamp: float = 10.0  # |log rho| cap (TraDo); the LLaDA script has none (inf)
    keep_range: tuple[float, float] = (0.2, 0.8)  # groups with accuracy outside are dropped
    shrink: int = 1  # decoding steps merged into one replay step (TraDo 1, LLaDA 8)
    overlong_margin: int | None = 5  # answers of >= canvas - margin tokens count as wrong (dLLM-RL); None: off

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.normalize not in NORMALIZATIONS:
            raise UserError(f"normalize must be one of {', '.join(NORMALIZATIONS)}; got {self.normalize!r}")
        if not self.log_ratio_clamp > 0:
            raise UserError(f"log_ratio_clamp must be > 0; got {self.log_ratio_clamp}")
        low, high = self.keep_range
        if not 0 <= low <= high <= 1:
            raise UserError(f"keep_range must satisfy 0 <= low <= high <= 1; got {self.keep_range}")
        if self.shrink < 1:
            raise UserError(f"shrink must be >= 1; got {self.shrink}")
        if self.overlong_margin is not None and self.overlong_margin < 0:
            raise UserError(f"overlong_margin must be >= 0 or null; got {self.overlong_margin}")


@register_baseline("trado")
class TraDo(Baseline):
    """TraceRL (TraDo): token-level PPO clip on trajectory-replay log-probs, k3 KL to the old policy, z-scores."""

    description: ClassVar[str] = "TraceRL/TraDo: trajectory-replay token PPO clip (eps 0.2), k3 KL vs old, z-score"
    Config: ClassVar[type[BaselineConfig]] = TraDoConfig
    advantage: ClassVar[str] = "group_zscore"
    needs_old: ClassVar[bool] = True
    config: TraDoConfig

    @property
    def needs_ref(self) -> bool:
        return False  # the KL term is against the rollout policy, which ``old`` already provides

    def estimator(self) -> TraceReplay:
        return TraceReplay(shrink=self.config.shrink)

    def correctness(self, correct: torch.Tensor, response_lengths: torch.Tensor, canvas: int) -> torch.Tensor:
        """The grader's flags, with answers of ``>= canvas - overlong_margin`` tokens counted as wrong."""
        if self.config.overlong_margin is None:
            return correct
        return correct * (response_lengths < canvas - self.config.overlong_margin).to(correct.dtype)

    def advantage_options(self) -> dict[str, Any]:
        return {"keep_range": self.config.keep_range}

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        new = inputs.new
        return trado_loss(
            need(new, "token_logp", self.name),
            need(inputs.old, "token_logp", self.name),
            need(new, "token_mask", self.name),
            per_row(inputs.advantages, new.row_to_seq),
            epsilon=self.config.epsilon,
            beta=self.config.beta,
            normalize=self.config.normalize,
            log_ratio_clamp=self.config.log_ratio_clamp,
        )
