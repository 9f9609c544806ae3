"""AGRPO, Amortized Group Relative Policy Optimization (``probablyabot/agrpo``, arXiv 2510.04019; ``agrpo_trainer.py``
at ``98f1182``: ``compute_loss`` lines 231-363, advantages lines 186-188; ``agrpo_config.py``; ``train.yaml``).

Token-level PPO on the exact per-step log-probs of the sampled trajectory, like CJ-GRPO and TraceRL, but on a
Monte-Carlo sample of the denoising steps instead of all of them: each sequence replays ``num_mc`` steps drawn
uniformly (low-discrepancy) from its steps up to the last one that committed a non-EOS token, which gives an
unbiased estimate of the policy gradient of the whole trajectory at a fraction of its cost (the ``trace_sample``
estimator; docs/methods.md#agrpo)::

    rho_jk = exp(log p_theta(y^k | z_{s_j}) - log p_old(y^k | z_{s_j}))        tokens k committed at sampled step s_j
    l_jk   = -min(rho_jk A_i, clip(rho_jk, 1 - eps, 1 + eps) A_i) + beta rho_jk KL3_jk
    L      = (1 / (K B)) sum_i sum_{j <= K} w_ij sum_{k} l_ijk                     (a sum over each step's tokens)
    A_i    = r_i - mean_group(r)                                                   (no std division)

With ``importance_sampling: entropy`` (the recipe's rule; the code's default is ``uniform``, w = 1) the steps are
drawn with probability p_is proportional to 1e-8 + the summed entropies of the tokens step s committed (the
``token_entropies`` rollout records them while sampling), and w_ij = (1 / (T_i + 1)) / p_{i s_ij} keeps the uniform
rule's expectation (``agrpo_trainer.py`` lines 267-280, 336-339; ``generate.py`` lines 65-84).

The KL (off in the recipe, beta 0) is k3 to the reference multiplied by rho, the importance-sampling correction the
official code takes from DeepSeek-V3.2. Official settings (``train.yaml``): K = ``mc_samples`` 24, low-discrepancy
step draws, eps 0.2 on both sides, beta 0, one optimizer step per rollout, G 8, lr 5e-6 (cosine), LoRA r 64.

Where it departs from CJ-GRPO (``cj_grpo.py``), which replays every step: K sampled steps per sequence, each
step's tokens summed rather than averaged, sequences averaged over the micro-batch, eps 0.2, no KL by default. The
official loss divides by ``mc_samples x num_generations`` with one group per device micro-batch; here by K times
the micro-batch's sequences, which is the same number for one group and keeps the loss independent of how a step
is split into micro-batches. Also here: log-probs of the untempered, unfiltered logits, as every replay in this
harness (the official code divides by the sampling temperature 0.6 and applies the top-k 150 / top-p 0.99 masks it
sampled with); the token entropies are those of the harness's sampler (float64, MASK excluded, no top-k / top-p).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import TraceSample
from stabledrl_bench.core.losses import row_mean, token_ppo, token_ppo_metrics
from stabledrl_bench.core.rollouts import Independent, RolloutScheme, TokenEntropies


def agrpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon: float = 0.2,
    beta: float = 0.0,
    row_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """AGRPO's loss (module docstring): token tensors [R, L] over the R = K B sampled replay rows, ``advantages``
    [R]. Each row's tokens are summed and the rows averaged (``row_mean`` with N_r = 1); in ``compute_dtype``.

    ``row_weight`` [R]: the importance weights of rows drawn by the entropy rule (``Estimate.row_weight``), which
    multiply every per-token term of their row, KL included (``agrpo_trainer.py`` lines 336-339); None under the
    uniform rule, whose arithmetic is then untouched."""
    terms = token_ppo(logp, old_logp, ref_logp, mask, advantages, epsilon=epsilon, beta=beta, kl_times_ratio=True)
    per_token = terms.per_token
    if row_weight is not None:
        per_token = per_token * row_weight.to(per_token.dtype)[:, None]
    loss = row_mean(per_token, mask, torch.ones_like(terms.advantages))
    return loss, token_ppo_metrics(loss, terms, mask)


@dataclass
class AGRPOConfig(BaselineConfig):
    epsilon: float = 0.2  # PPO clip range, both sides (train.yaml)
    num_mc: int = 24  # replayed steps per sequence (mc_samples)
    low_discrepancy: bool = True  # stratified step draws over the micro-batch
    importance_sampling: str = "uniform"  # step rule: "uniform" (agrpo_config.py's default) or "entropy" (train.yaml)


@register_baseline("agrpo")
class AGRPO(Baseline):
    """AGRPO: token PPO clip (eps 0.2) on K Monte-Carlo sampled steps of the replayed trajectory, r - mean."""

    description: ClassVar[str] = "AGRPO: token PPO clip (eps 0.2) on 24 sampled steps of the rollout trajectory"
    Config: ClassVar[type[BaselineConfig]] = AGRPOConfig
    advantage: ClassVar[str] = "group_mean"
    needs_old: ClassVar[bool] = True
    config: AGRPOConfig

    def estimator(self) -> TraceSample:
        c = self.config
        return TraceSample(
            num_mc=c.num_mc, low_discrepancy=c.low_discrepancy, importance_sampling=c.importance_sampling
        )

    def rollout(self) -> RolloutScheme:
        """The entropy rule reads the sampler's token entropies (the ``token_entropies`` rollout); the uniform rule
        samples as every method does."""
        return TokenEntropies() if self.config.importance_sampling == "entropy" else Independent()

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        c = self.config
        weight = inputs.new.row_weight
        return agrpo_loss(*inputs.token_rows(self.name), epsilon=c.epsilon, beta=c.beta, row_weight=weight)
