"""IGPO, Inpainting-Guided Policy Optimization (``facebookresearch/igpo``, arXiv 2509.10396; at ``e85eaea``:
``trainer_igpo.py``: ``compute_loss`` lines 592-846, ``_get_per_token_logps_grpo`` lines 1043-1155,
``_generate_and_score_completions`` lines 1329-2072; ``utils/generate.py``: ``generate_inpainting`` lines 727-922,
``create_spacing_scaled_inpainting_sequence`` lines 472-668, ``scale_chunk_positions`` lines 671-724;
``utils/diffu_grpo_config.py`` lines 466-531; ``run_igpo.sh`` and ``train.yaml``).

When every completion of a group is wrong, the group's advantages are all zero and it teaches nothing. IGPO then
decodes the group again with fragments of the prompt's worked solution fixed in the canvas (inpainting), and lets
correct hinted completions replace some of the group's own (docs/methods.md#igpo)::

    hints   rollouts.HintInjection: chunks of the worked solution at stretched positions, ratio r ~ U[lo, hi)
    A_i     = r_i - mean_group(r)                                        (no std division, lines 1906-1920)
    z       = [x, M^L]                                                   (d1_masking: t = T, ratio 1)
    rho_ik  = exp(log pi_theta(y_i^k | z) - log pi_old(y_i^k | z))       (token ratio, line 668)
            = exp(mean_k log pi_theta(y_i^k | z) - mean_k log pi_old(...)) for every k   (use_gspo, lines 651-665)
    l_ik    = -min(rho_ik A_i, clip(rho_ik, 1 - eps_low, 1 + eps_high) A_i) + beta KL3_ik    (lines 670-679)
    KL3_ik  = exp(log pi_ref - log pi_theta) - (log pi_ref - log pi_theta) - 1              (lines 633-639)
    L       = sum_ik c_ik l_ik / sum_ik c_ik                              (token mean over the batch, lines 681-686)

where k runs over all L positions of the canvas (post-EOS included: the official loss counts the masked positions,
and at ratio 1 that is every one), and c_ik = 0 only at hint positions outside the row's top
``entropy_clipping_ratio_inpaint`` by the rollout policy's entropy (``estimators.IGPOOneStep``, lines 1764-1826).
The mean of the GSPO ratio is over all L positions, filtered hints included, as the official ``sum / size(1)``.

Official defaults (``diffu_grpo_config.py``): eps_low 0.2, eps_high 0.28, beta 0.04, ``use_gspo`` off,
``entropy_clipping_ratio_inpaint`` 0.2, hint ratios U[0.1, 0.5), chunks of 4-8 tokens, ``max_spacing`` 100,
``max_replacements`` 1. The published run (``run_igpo.sh``, ``configs/recipes/igpo/``) sets eps 0.2 / 0.2, beta
0.01, ``use_gspo``, ``d1_masking``, ratios U[0.2, 0.6), chunks of 5-10, ``max_replacements`` 4, G 8, mu 4,
temperature 1.2, a 256-token canvas in 128 steps with blocks of 32.

Official line -> here (the full table is in docs/methods.md#igpo):

* the all-wrong trigger, the hinted decode and the replacement (lines 1377-1682, ``generate_inpainting``) ->
  ``core.rollouts.HintInjection`` (records ``hint_mask``, ``hinted``);
* the grader's verdicts during the rollout -> ``rollouts.Feedback`` (the trainer's ``_feedback``);
* the fully masked one-step log-probs and the entropy filter of the hints (lines 955-1155, 1764-1826) ->
  ``core.estimators.IGPOOneStep``;
* advantages (lines 1906-1920) -> the ``group_mean`` rule;
* the loss (lines 641-686) -> :func:`igpo_loss`.

Where it departs from the official code, each a convention of this harness or a choice the official code leaves to
its set-up: every number of the sampler is the harness's (Gumbel-max in float64, MASK excluded, left padding not
attended); the official decode skips a block no row has a MASK in and stops once every row's block is all
``<|endoftext|>`` (filling the rest with it), which this sampler does not (the same tokens, other forward counts
and random streams); the all-wrong trigger is per group, where the official code tests the whole device batch (one
group per device in its runs, so the same there); correctness is the task's grader (the official code's
correctness reward == 3, its all-correct value); the worked solution is the task's gold completion in the run's
protocol (the official code prepends ``<reasoning>`` to MetaMathQA's response); random numbers come from the
micro-batch's generator (the official code uses Python's and torch's global ones); entropies are computed from
float32 log-probs (the official softmax runs in the model's bf16) and only rank the hints. Not implemented: the
default ``d1_masking: false`` estimate (a structured random timestep per inner iteration, masks at ratio t / T,
lines 955-986), the only one its recipe does not use; resampling when no hinted completion is correct
(``max_resamples`` is 0 in the official code: never).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from stabledrl_bench.core.advantages import compute_dtype
from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import IGPOOneStep
from stabledrl_bench.core.losses import TokenPPO, conditional_clip, k3_kl, need, token_mean, token_ppo_metrics
from stabledrl_bench.core.rollouts import HintInjection
from stabledrl_bench.errors import UserError


def igpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    counted: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.28,
    beta: float = 0.04,
    sequence_ratio: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """IGPO's loss (module docstring): token tensors [B, L] over every completion position, ``counted`` [B, L] bool
    the positions the token mean runs over (the hint filter), ``advantages`` [B]. ``sequence_ratio``: GSPO's ratio
    exp(mean_k log pi_theta - mean_k log pi_old) for every token of a row (``use_gspo``). In ``compute_dtype``."""
    dtype = compute_dtype(logp, old_logp, ref_logp, advantages)
    logp, old_logp, advantages = logp.to(dtype), old_logp.to(dtype), advantages.to(dtype)
    if sequence_ratio:
        log_ratio = (logp.mean(dim=1) - old_logp.mean(dim=1))[:, None].expand_as(logp)
    else:
        log_ratio = logp - old_logp
    objective, clipped = conditional_clip(log_ratio, advantages[:, None], epsilon_low, epsilon_high)
    per_token, kl = -objective, None
    if beta > 0:
        if ref_logp is None:
            raise ValueError("a KL term (beta > 0) needs the reference log-probs")
        kl = k3_kl(ref_logp.to(dtype) - logp)
        per_token = per_token + beta * kl
    loss = token_mean(per_token, counted)
    if not bool(counted.any()):  # the official loss returns 0 (lines 681-683): no token, no ratio to report
        return loss, {"loss": loss.item()}
    return loss, token_ppo_metrics(loss, TokenPPO(per_token, log_ratio, clipped, kl, advantages), counted)


@dataclass
class IGPOConfig(BaselineConfig):
    beta: float = 0.04  # k3 KL to the reference (diffu_grpo_config.py line 295; the published run: 0.01)
    epsilon_low: float = 0.2  # line 507
    epsilon_high: float = 0.28  # clip-higher, line 504 (the published run: 0.2)
    use_gspo: bool = False  # GSPO's sequence ratio (line 516; the published run turns it on)
    entropy_clipping_ratio_inpaint: float = 0.2  # share of a row's hint positions kept, by entropy (line 487)
    inpaint_chunk_ratio_low: float = 0.1  # hint ratios U[low, high) (line 520)
    inpaint_chunk_high_initial_ratio: float = 0.5  # (line 526)
    min_chunk_size: int = 4  # line 471
    max_chunk_size: int = 8  # line 475
    max_spacing: int = 100  # line 483
    max_replacements: int = 1  # hinted completions that may replace a group's own (line 510)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.epsilon_low < 1 or self.epsilon_high <= 0:
            raise UserError(
                f"IGPO: need 0 < epsilon_low < 1 and epsilon_high > 0, got {self.epsilon_low}, {self.epsilon_high}"
            )
        IGPOOneStep(hint_keep_ratio=self.entropy_clipping_ratio_inpaint)  # checks the ratio
        self.hints()  # checks the rollout's options

    def hints(self) -> HintInjection:
        return HintInjection(
            ratio_low=self.inpaint_chunk_ratio_low,
            ratio_high=self.inpaint_chunk_high_initial_ratio,
            min_chunk_size=self.min_chunk_size,
            max_chunk_size=self.max_chunk_size,
            max_spacing=self.max_spacing,
            max_replacements=self.max_replacements,
        )


@register_baseline("igpo")
class IGPO(Baseline):
    """IGPO: hinted re-decodes of all-wrong groups, token PPO (clip-higher) on the all-MASK one-step estimate."""

    description: ClassVar[str] = "IGPO: all-wrong groups re-decoded with solution hints; clip-higher token PPO"
    Config: ClassVar[type[BaselineConfig]] = IGPOConfig
    advantage: ClassVar[str] = "group_mean"
    needs_old: ClassVar[bool] = True
    config: IGPOConfig

    def estimator(self) -> IGPOOneStep:
        return IGPOOneStep(hint_keep_ratio=self.config.entropy_clipping_ratio_inpaint)

    def rollout(self) -> HintInjection:
        return self.config.hints()

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss on the rows' every position, averaged over those the rollout policy's hint filter keeps (its
        ``old`` estimate's ``token_weight``: the official filter is computed once, at the rollout)."""
        c, old = self.config, inputs.old
        counted = need(inputs.new, "token_mask", self.name)
        if old is not None and old.token_weight is not None:
            counted = counted & (old.token_weight > 0)
        return igpo_loss(
            need(inputs.new, "token_logp", self.name),
            need(old, "token_logp", self.name),
            inputs.ref.token_logp if inputs.ref is not None else None,
            counted,
            inputs.advantages,
            epsilon_low=c.epsilon_low,
            epsilon_high=c.epsilon_high,
            beta=c.beta,
            sequence_ratio=c.use_gspo,
        )
