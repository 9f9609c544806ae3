"""AGRPO, Amortized Group Relative Policy Optimization (``probablyabot/agrpo``, arXiv 2510.04019; ``agrpo_trainer.py``
at ``98f1182``: ``compute_loss`` lines 231-363, advantages lines 186-188; ``agrpo_config.py``; ``train.yaml``).

Token-level PPO on the exact per-step log-probs of the sampled trajectory, like CJ-GRPO and TraceRL, but on a
Monte-Carlo sample of the denoising steps instead of all of them: each sequence replays ``num_mc`` steps drawn
uniformly (low-discrepancy) from its steps up to the last one that committed a non-EOS token, which gives an
unbiased estimate of the policy gradient of the whole trajectory at a fraction of its cost (the ``trace_sample``
estimator; docs/methods.md#agrpo)::

    rho_jk = exp(log p_theta(y^k | z_{s_j}) - log p_old(y^k | z_{s_j}))        tokens k committed at sampled step s_j
    l_jk   = -min(rho_jk A_i, clip(rho_jk, 1 - eps, 1 + eps) A_i) + beta rho_jk KL3_jk
    L      = (1 / (K B)) sum_i sum_{j <= K} sum_{k} l_ijk                          (a sum over each step's tokens)
    A_i    = r_i - mean_group(r)                                                   (no std division)

The KL (off in the recipe, beta 0) is k3 to the reference multiplied by rho, the importance-sampling correction the
official code takes from DeepSeek-V3.2. Official settings (``train.yaml``): K = ``mc_samples`` 24, low-discrepancy
step draws, eps 0.2 on both sides, beta 0, one optimizer step per rollout, G 8, lr 5e-6 (cosine), LoRA r 64.

Where it departs from CJ-GRPO (``cj_grpo.py``), which replays every step: K sampled steps per sequence, each
step's tokens summed rather than averaged, sequences averaged over the micro-batch, eps 0.2, no KL by default. The
official loss divides by ``mc_samples x num_generations`` with one group per device micro-batch; here by K times
the micro-batch's sequences, which is the same number for one group and keeps the loss independent of how a step
is split into micro-batches. Also here: log-probs of the untempered, unfiltered logits, as every replay in this
harness (the official code divides by the sampling temperature 0.6 and applies the top-k 150 / top-p 0.99 masks it
sampled with), and only the uniform step rule (the recipe's ``importance_sampling: entropy`` needs the sampler's
token entropies).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import TraceSample
from stabledrl_bench.core.losses import row_mean, token_ppo, token_ppo_metrics


def agrpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon: float = 0.2,
    beta: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """AGRPO's loss (module docstring): token tensors [R, L] over the R = K B sampled replay rows, ``advantages``
    [R]. Each row's tokens are summed and the rows averaged (``row_mean`` with N_r = 1); in ``compute_dtype``."""
    terms = token_ppo(logp, old_logp, ref_logp, mask, advantages, epsilon=epsilon, beta=beta, kl_times_ratio=True)
    loss = row_mean(terms.per_token, mask, torch.ones_like(terms.advantages))
    return loss, token_ppo_metrics(loss, terms, mask)


@dataclass
class AGRPOConfig(BaselineConfig):
    epsilon: float = 0.2  # PPO clip range, both sides (train.yaml)
    num_mc: int = 24  # replayed steps per sequence (mc_samples)
    low_discrepancy: bool = True  # stratified step draws over the micro-batch


@register_baseline("agrpo")
class AGRPO(Baseline):
    """AGRPO: token PPO clip (eps 0.2) on K Monte-Carlo sampled steps of the replayed trajectory, r - mean."""

    description: ClassVar[str] = "AGRPO: token PPO clip (eps 0.2) on 24 sampled steps of the rollout trajectory"
    Config: ClassVar[type[BaselineConfig]] = AGRPOConfig
    advantage: ClassVar[str] = "group_mean"
    needs_old: ClassVar[bool] = True
    config: AGRPOConfig

    def estimator(self) -> TraceSample:
        return TraceSample(num_mc=self.config.num_mc, low_discrepancy=self.config.low_discrepancy)

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        return agrpo_loss(*inputs.token_rows(self.name), epsilon=self.config.epsilon, beta=self.config.beta)
