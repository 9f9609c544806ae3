"""GDSD, Guided Denoiser Self-Distillation (``GaryBall/GDSD``, arXiv 2605.29398;
``gdsd/trainers/gdsd_trainer_batchll.py`` at ``3fb6780``: ``compute_loss`` lines 155-231, advantages lines 734-757;
``scripts/train_gdsd.yaml``).

RL as a regression: the change of the denoising log-probability over the rollout policy is pulled towards the
scaled advantage, ``Delta D / L -> psi A``, with no importance ratio in the objective. A trust region comes from
clamping the change (docs/methods.md#gdsd)::

    D_ij     = denoising log-probability of completion i under Monte-Carlo mask pair j (``denoise_pair``)
    Delta_ij = clamp(D_ij - D_old_ij, log(1 - eps), log(1 + eps))                  (masks shared by old and new)
    L        = (1/B) sum_i sum_j (Delta_ij / L - psi A_i)^2  +  beta (1/(B K L)) sum_ij 0.5 (D_ij - D_ref_ij)^2
    A_i      = r_i - mean_{j != i} r_j                                              (leave-one-out, no std)

L is the canvas. The clamp bounds the change of the *summed* log-probability (not a per-token one) and cuts the
gradient outside it; with the official eps = 4e-4 the update only moves D a little away from D_old, at the pace the
advantage asks for. At the first inner step (D = D_old) the gradient is that of REINFORCE with weight 2 psi A_i / L.
With A = 0 the term still pulls Delta D back towards 0: a completion that is neither better nor worse than its
group is distilled to stay where it was.

``tlc=True`` is GDSD-TLC (``gdsd_trainer_tlc.py``): the same loss on 1/t-weighted passes (ESPO's ELBO per sample);
its logit centralisation is invisible to a log-softmax (``denoise_pair``). Official settings: eps 4e-4 on both
sides, psi 1 (10 in the GSM8K / MATH scripts), beta 1e-3, one mask pair per iteration (``num_mc`` 1; 2 for GSM8K),
mu 8, G 6, lr 3e-6, LoRA r 128, and TRL's reference sync every 64 steps (``train_gdsd.yaml`` lines 15-16), the
default here too (``BaselineConfig.sync_ref_model``; under the recipe's LoRA TRL has no reference model to mix, and
neither does the trainer here).

Where it departs from ESPO (``espo.py``), whose estimator it shares: a squared distance to the advantage instead of a
clipped ratio times the advantage, every Monte-Carlo sample its own term, no 1/t weights (GDSD; TLC keeps them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from stabledrl_bench.core.advantages import compute_dtype
from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import DenoisePair
from stabledrl_bench.core.losses import k2_kl, ratio_metrics, samples_of
from stabledrl_bench.errors import UserError


def gdsd_loss(
    samples: torch.Tensor,
    old_samples: torch.Tensor,
    ref_samples: torch.Tensor | None,
    advantages: torch.Tensor,
    *,
    canvas: int,
    epsilon: float = 4e-4,
    psi: float = 1.0,
    beta: float = 1e-3,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GDSD's loss (module docstring): ``samples`` [B, K] with gradient, ``old`` / ``ref`` [B, K], ``advantages`` [B],
    ``canvas`` = L. In ``compute_dtype`` of the inputs; the clamp keeps every term finite whatever the change."""
    dtype = compute_dtype(samples, old_samples, ref_samples, advantages)
    samples, advantages = samples.to(dtype), advantages.to(dtype)
    n_seq = samples.shape[0]
    change = samples - old_samples.to(dtype)
    clamped = change.clamp(math.log(1 - epsilon), math.log(1 + epsilon))
    loss = ((clamped / canvas - psi * advantages[:, None]) ** 2).sum() / n_seq
    metrics: dict[str, float] = {}
    if beta > 0:
        if ref_samples is None:
            raise ValueError("gdsd with beta > 0 needs the reference estimate")
        kl = k2_kl(samples - ref_samples.to(dtype)).sum() / (samples.numel() * canvas)
        loss = loss + beta * kl
        metrics["kl"] = kl.item()
    out_of_range = (change.detach() < math.log(1 - epsilon)) | (change.detach() > math.log(1 + epsilon))
    return loss, metrics | {
        "loss": loss.item(),
        **ratio_metrics(change / canvas),
        "clip_ratio": out_of_range.float().mean().item(),
        "adv_abs_mean": advantages.abs().mean().item(),
    }


@dataclass
class GDSDConfig(BaselineConfig):
    epsilon: float = 4e-4  # clamp of the change of D (epsilon, both sides; train_gdsd.yaml)
    psi: float = 1.0  # scale of the advantage target (psi; 10 in the GSM8K / MATH scripts)
    beta: float = 1e-3  # k2 KL to the reference
    num_mc: int = 1  # mask pairs per iteration (num_mc)
    tlc: bool = False  # GDSD-TLC: 1/t-weighted passes
    sync_ref_model: bool = True  # train_gdsd.yaml lines 15-16: TRL's reference sync every 64 steps
    ref_model_sync_steps: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.epsilon < 1:
            raise UserError(f"epsilon must be in (0, 1); got {self.epsilon}")


@register_baseline("gdsd")
class GDSD(Baseline):
    """GDSD: squared distance of the clamped change of D / L to psi A, k2 KL, leave-one-out advantage."""

    description: ClassVar[str] = "GDSD: denoiser self-distillation, (clamp(dD) / L - psi A)^2, leave-one-out"
    Config: ClassVar[type[BaselineConfig]] = GDSDConfig
    advantage: ClassVar[str] = "leave_one_out"
    needs_old: ClassVar[bool] = True
    config: GDSDConfig

    def estimator(self) -> DenoisePair:
        return DenoisePair(num_mc=self.config.num_mc, inverse_t=self.config.tlc)

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        return gdsd_loss(
            samples_of(inputs.new, self.name),
            samples_of(inputs.old, self.name),
            samples_of(inputs.ref, self.name) if inputs.ref is not None else None,
            inputs.advantages,
            canvas=inputs.completion_mask.shape[1],
            epsilon=self.config.epsilon,
            psi=self.config.psi,
            beta=self.config.beta,
        )
