"""GDPO, Group Diffusion Policy Optimization (NVIDIA NeMo RL ``research/gdpo``: ``configs/gdpo_llada_8b.yaml`` with
``nemo_rl/algorithms/loss/loss_functions.py: ClippedPGLossFn`` under ``sequence_level_importance_ratios: true``,
``token_level_loss: false``; the masks of ``gdpo/elbo.py`` and ``gdpo/worker.py``).

A GSPO-shaped sequence-level PPO on the ``sdmc_elbo`` estimate (docs/methods.md#gdpo)::

    rho_i = exp((E_theta_i - E_old_i) / (l_i + 1e-8))      (l_i = scored completion tokens; the same masks)
    L     = -(1/(B + 1e-8)) sum_i l_i / (l_i + 1e-8) min(rho_i A_i, clip(rho_i, 1 - eps, 1 + eps) A_i)
    A_i   = r_i - mean_group(r)                              (Dr.GRPO: no std division)

The 1e-8 and the factor l_i / (l_i + 1e-8) are NeMo RL's ``masked_mean`` taken twice (per sequence, then over the
B sequences, ``core/losses.py: masked_sequence_mean``): a completion with no scored token counts in B and adds 0.
The masks of a sequence are drawn from a generator seeded by a hash of its own tokens (``mask_seed: content``,
``core/estimators.py: content_seeds``), so its old, reference and current ELBOs, at every inner iteration, share
them; ``mask_seed="stream"`` draws them from the trainer's random stream instead (fresh masks each iteration).

Official settings: eps = 0.5 on both sides, no KL (``reference_policy_kl_penalty: 0``), Gauss-Legendre quadrature
with 3 nodes and one mask draw per node, no prompt masking, AdamW lr 3e-7 with weight decay 0.1 and clipping 0.2,
G = 6, LoRA r 128, and one optimizer step per rollout (``train_global_batch_size`` = 32 prompts x 6): the ratio is
then 1 and the clip idle. Here the number of optimizer steps per rollout is the budget's ``num_iterations``, the same
for every method of a comparison (``num_iterations: 1`` gives the official schedule); docs/methods.md#gdpo says why.

Where it departs from ESPO (``espo.py``), whose loss has the same shape: the ELBO is a fixed quadrature over t
instead of stratified random counts, the log-ratio is normalised by each completion's own length instead of the
canvas, eps is 0.5, the advantage is r - mean instead of leave-one-out, and there is no KL. Where it departs from
GRPO: one ratio per sequence instead of per token, on an ELBO instead of d1's one-step estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch

from stabledrl_bench.core.advantages import compute_dtype
from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import SDMCElbo
from stabledrl_bench.core.losses import masked_sequence_mean, need, sequence_ppo


def gdpo_loss(
    elbo: torch.Tensor,
    old_elbo: torch.Tensor,
    lengths: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon: float = 0.5,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GDPO's loss (module docstring); all tensors [B], ``lengths`` = scored tokens per completion (0 allowed).
    In ``compute_dtype`` of the inputs; ``conditional_clip`` keeps the clipped branch and A = 0 finite."""
    dtype = compute_dtype(elbo, old_elbo, advantages)
    lengths = lengths.to(dtype)
    log_ratio = (elbo.to(dtype) - old_elbo.to(dtype)) / (lengths + 1e-8)
    return sequence_ppo(log_ratio, advantages.to(dtype), epsilon, partial(masked_sequence_mean, lengths=lengths))


@dataclass
class GDPOConfig(BaselineConfig):
    epsilon: float = 0.5  # ratio_clip_min = ratio_clip_max = 0.5
    nodes: int = 3  # Gauss-Legendre points of the SDMC ELBO ("gauss-3")
    mc_samples: int = 1  # mask draws per node
    mask_seed: str = "content"  # masks keyed by each sequence's tokens (official); "stream": the trainer's stream


@register_baseline("gdpo")
class GDPO(Baseline):
    """GDPO: sequence-level PPO clip (eps 0.5) on a Gauss-Legendre (SDMC) ELBO, length-normalised ratio, no KL."""

    description: ClassVar[str] = "GDPO: sequence PPO clip (eps 0.5) on exp(dELBO / l), Gauss-quadrature ELBO, no KL"
    Config: ClassVar[type[BaselineConfig]] = GDPOConfig
    advantage: ClassVar[str] = "group_mean"
    needs_old: ClassVar[bool] = True
    config: GDPOConfig

    def estimator(self) -> SDMCElbo:
        return SDMCElbo(nodes=self.config.nodes, mc_samples=self.config.mc_samples, mask_seed=self.config.mask_seed)

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        return gdpo_loss(
            need(inputs.new, "elbo", self.name),
            need(inputs.old, "elbo", self.name),
            inputs.completion_mask.sum(-1),
            inputs.advantages,
            epsilon=self.config.epsilon,
        )
