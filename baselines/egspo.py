"""EGSPO, Entropy-Guided Stepwise Policy Optimization with Stepwise Advantages (``vishnutez/egspo-dllm-rl``, arXiv
2603.12554; ``egspo/egspo_trainer.py`` at ``a7d618b``: ``compute_loss`` lines 86-181, ``generate`` lines 198-357,
``_get_per_token_logps_unbiased`` lines 428-551, ``_prepare_inputs`` lines 554-565, step choice and returns lines
675-969; ``egspo/egspo_config.py`` lines 368-443; ``egspo/train.sh`` lines 29-40 and ``slurm_scripts/train.yaml``).

The denoising trajectory is an MDP whose actions are the sampler's steps (the tokens step s commits from state z_s).
EGSPO trains on K of the T steps per completion, those whose committed tokens were drawn from the most uncertain
distributions, and gives each its own advantage, measured by how much better the final completion is than the
one-step denoised prediction of z_s (docs/methods.md#egspo)::

    H_s      = mean_{k committed at s} -sum_v p_v log(p_v + 1e-8)      p = softmax of the sampler's logits at k
    S_i      = the K steps of highest H_s                              (highest first; the entropy_steps rollout)
    x^_s     = argmax of the logits at z_s on every masked position    (the one-step prediction, rewarded as r_is)
    R_is     = (r_i + lambda (r_i - r_is)) / (1 + lambda)               r_i the final completion's reward
    A_is     = R_is - mean_group(R_.s)                                  per chosen step (column), no std division
    log pi_s = sum_{k committed at s} log p_theta(y^k | z_s)          (the chosen_steps replay, one row per step)
    rho_is   = exp(log pi_s - log pi_old,s)                             one ratio per step, not per token
    l_is     = -min(rho_is A_is, clip(rho_is, 1 - eps, 1 + eps_high) A_is) + beta k3(log pi_ref,s - log pi_s)
    L        = mean over the iteration's (i, s) of l_is / n_is         n_is: tokens committed at s (L / T officially)

Official defaults (``train.sh`` and ``train.yaml``): K = 8, lambda = 0.5 with returns normalised by 1 + lambda,
eps 0.2, eps_high 0.5, beta 0.04 (k3 to the adapter-free model), G 8, lr 3e-5, LoRA r 128, canvas 256 in 128
steps with blocks of 32 at temperature 0.9. One rollout serves K ``compute_loss`` calls, each on one chosen step
of every completion, two per optimizer step (gradient accumulation 2): the trainer's mu = K / 2 = 4 inner
iterations, each on two chosen steps (``ChosenSteps.draw_for``: the official order 1, 2, ..., K-1, 0).

Official line -> here (the full table is in docs/methods.md#egspo):

* step entropies and one-step predictions (``generate`` lines 272-342, ``_get_high_entropy_time_steps`` lines
  675-715; ``logps_eval_time_steps_mode``, lines 741-758) -> ``core.rollouts.EntropySteps`` (``selection``);
* intermediate rewards (lines 790-897: every reward function on each prediction, weighted, ``nansum``) -> the
  trainer scores ``predictions`` with the task's reward profile (``RLTrainer._batch_records``);
* returns and advantages (lines 906-969) -> :func:`egspo_advantages` (``lambda1``, ``normalize_returns``,
  ``standard_grpo_returns``);
* per-step log-probs (lines 488-542, ``pred_state="next"``, ``logps_aggregation_mode="sum"``) ->
  ``core.estimators.ChosenSteps``; old log-probs (lines 761-768, the sampler's) -> the rollout policy's replay of the
  same rows (iteration 0: the current policy, detached: the ratio is 1, as the official first call);
* the loss (lines 106-148, ``use_exact_kl=False``) -> :func:`egspo_loss`.

Where it departs from the official code, each a convention of this harness or a case the official code leaves
undefined: every number of the sampler is the harness's (MASK never sampled, nor predicted: its runner-up fills a
position whose argmax is MASK; entropies from the float64 logits with MASK excluded, the official ones from the
softmax in the model's dtype); old log-probs come from the rollout policy's replay instead of the sampler's softmax
(the same quantity, computed as every other method here computes it, in the estimator's precision); prompts' left
padding is not attended; texts are cut at the first stop token before they are rewarded (the official code decodes
the whole canvas, skipping special tokens); ties among entropies go to the earlier step (``torch.topk`` leaves them
unspecified), and a step that commits no token is never chosen (the official mean over no token is NaN, which topk
ranks first); each step's loss is divided by its own token count (equal to the official L / T whenever every step
commits L / T tokens, as in the official setting). Not implemented: ``use_exact_kl`` (the full-vocabulary KL,
which keeps every distribution), ``pred_state="final"``, ``logps_aggregation_mode="mean"``,
``terminate_at_last_non_eos``, ``correctness_step_reward_only`` and ``dynamic_lambda1`` (all off by default), and
the ``ada_egspo`` variant of ``train_vision.sh``, whose training script (``ada_egspo_train.py``) is not in the
repository.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from stabledrl_bench.core.advantages import compute_dtype, group_index
from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import ChosenSteps
from stabledrl_bench.core.losses import conditional_clip, k3_kl, need, per_row, ratio_metrics
from stabledrl_bench.core.rollouts import SELECTIONS, EntropySteps
from stabledrl_bench.errors import UserError


def egspo_advantages(
    rewards: torch.Tensor,
    step_rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    lambda1: float = 0.5,
    normalize_returns: bool = True,
    standard_grpo_returns: bool = False,
) -> torch.Tensor:
    """EGSPO's stepwise advantages [B, K] (lines 906-969) from the final rewards ``rewards`` [B] and the rewards of
    the one-step predictions at the chosen steps ``step_rewards`` [B, K]; in ``compute_dtype``.

    Default: R_is = r_i + lambda (r_i - r_is), divided by 1 + lambda when ``normalize_returns``, then centred on
    each group's mean per column. ``standard_grpo_returns``: A_is = (r_i - mean_group r) + lambda (r_i - r_is),
    divided by 1 + lambda when ``normalize_returns`` (the stepwise part is not centred).
    """
    dtype = compute_dtype(rewards, step_rewards)
    final = rewards.to(dtype)[:, None]
    stepwise = final - step_rewards.to(dtype)
    index, num_groups = group_index(group_ids)
    if standard_grpo_returns:
        advantages = _minus_group_mean(final, index, num_groups) + lambda1 * stepwise
        return advantages / (1 + lambda1) if normalize_returns else advantages
    returns = final + lambda1 * stepwise
    if normalize_returns:
        returns = returns / (1 + lambda1)
    return _minus_group_mean(returns, index, num_groups)


def _minus_group_mean(values: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``values`` [B, K] minus the mean of each column over its group (``returns_grouped.mean(dim=1)``)."""
    sums = values.new_zeros(num_groups, values.shape[1]).index_add(0, index, values)
    counts = torch.bincount(index, minlength=num_groups).to(values.dtype)
    return values - (sums / counts[:, None])[index]


def egspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float = 0.5,
    beta: float = 0.04,
) -> tuple[torch.Tensor, dict[str, float]]:
    """EGSPO's loss (module docstring): token tensors [R, L] over the replayed steps (the targets of row r are the
    tokens its step committed), ``advantages`` [R] per row. Each row's log-probs are summed into the step's log-prob
    (lines 536-537), the PPO clip and k3 act on the step (lines 116-136), and every row's term is divided by its
    token count before the mean over the rows (lines 140-144). In ``compute_dtype`` of the inputs.
    """
    dtype = compute_dtype(logp, old_logp, ref_logp, advantages)
    mask = mask.bool()
    step_logp = torch.where(mask, logp.to(dtype), 0.0).sum(dim=1)
    log_ratio = step_logp - torch.where(mask, old_logp.to(dtype), 0.0).sum(dim=1)
    advantages = advantages.to(dtype)
    objective, clipped = conditional_clip(log_ratio, advantages, epsilon, epsilon_high)
    per_step, metrics = -objective, {}
    if beta > 0:
        if ref_logp is None:
            raise ValueError("a KL term (beta > 0) needs the reference log-probs")
        kl = k3_kl(torch.where(mask, ref_logp.to(dtype), 0.0).sum(dim=1) - step_logp)
        per_step = per_step + beta * kl
        metrics["kl"] = kl.mean().item()
    loss = (per_step / mask.sum(dim=1).clamp(min=1).to(dtype)).mean()
    return loss, metrics | {
        "loss": loss.item(),
        **ratio_metrics(log_ratio),
        "clip_ratio": clipped.float().mean().item(),
        "adv_abs_mean": advantages.abs().mean().item(),
    }


@dataclass
class EGSPOConfig(BaselineConfig):
    beta: float = 0.04  # k3 KL to the reference (train.yaml)
    epsilon: float = 0.2  # lower clip range (train.sh EPSILON)
    epsilon_high: float = 0.5  # upper clip range (train.sh EPSILON_HIGH)
    logps_eval_num_steps: int = 8  # K: chosen steps per completion (train.sh LOGPS_EVAL_NUM_STEPS)
    logps_eval_time_steps_mode: str = "high_entropy"  # how they are chosen: high_entropy | uniform | random
    lambda1: float = 0.5  # weight of the stepwise advantage r_i - r_is (train.sh LAMBDA1)
    normalize_returns: bool = True  # divide by 1 + lambda1 (train.sh NORMALIZE_RETURNS)
    standard_grpo_returns: bool = False  # centre only the final reward, add the stepwise part after

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (0 < self.epsilon < 1 and self.epsilon_high > 0):
            raise UserError(
                f"EGSPO: need 0 < epsilon < 1 and epsilon_high > 0; got {self.epsilon} and {self.epsilon_high}"
            )
        if self.lambda1 < 0:
            raise UserError(f"EGSPO: lambda1 must be >= 0, got {self.lambda1}")
        if self.logps_eval_time_steps_mode not in SELECTIONS:
            raise UserError(
                f"EGSPO: logps_eval_time_steps_mode must be one of {', '.join(SELECTIONS)}, "
                f"got {self.logps_eval_time_steps_mode!r}"
            )
        if not self.coupled:
            raise UserError("EGSPO: coupled must be true (each inner iteration replays its own chosen steps)")
        EntropySteps(num_steps=self.logps_eval_num_steps)  # checks K


@register_baseline("egspo")
class EGSPO(Baseline):
    """EGSPO: step-level PPO (eps 0.2 / 0.5) on the K highest-entropy sampler steps, stepwise advantages."""

    description: ClassVar[str] = "EGSPO: step PPO on the sampler's highest-entropy steps, stepwise advantages"
    Config: ClassVar[type[BaselineConfig]] = EGSPOConfig
    advantage: ClassVar[str] = "group_mean"  # its group centring; the stepwise rule is egspo_advantages
    needs_old: ClassVar[bool] = True
    config: EGSPOConfig

    def estimator(self) -> ChosenSteps:
        return ChosenSteps()

    def rollout(self) -> EntropySteps:
        c = self.config
        return EntropySteps(num_steps=c.logps_eval_num_steps, selection=c.logps_eval_time_steps_mode)

    def advantage_record(self) -> dict[str, Any]:
        c = self.config
        options = {"lambda1": c.lambda1, "normalize_returns": c.normalize_returns}
        return {"rule": "egspo_stepwise", "options": {**options, "standard_grpo_returns": c.standard_grpo_returns}}

    def advantages(
        self,
        rewards: torch.Tensor,
        group_ids: torch.Tensor,
        correct: torch.Tensor | None = None,
        records: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages [B, K], keep [B])``: :func:`egspo_advantages` of the final rewards and the rewards of the
        one-step predictions the rollout recorded (``records["prediction_rewards"]``); no group is dropped."""
        del correct
        step_rewards = None if records is None else records.get("prediction_rewards")
        if step_rewards is None:
            raise UserError("EGSPO needs the rewards of its rollout's one-step predictions (the entropy_steps scheme)")
        c = self.config
        advantages = egspo_advantages(
            rewards,
            step_rewards,
            group_ids,
            lambda1=c.lambda1,
            normalize_returns=c.normalize_returns,
            standard_grpo_returns=c.standard_grpo_returns,
        )
        return advantages, torch.ones_like(rewards, dtype=torch.bool)

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        new, c = inputs.new, self.config
        return egspo_loss(
            need(new, "token_logp", self.name),
            need(inputs.old, "token_logp", self.name),
            inputs.ref.token_logp if inputs.ref is not None else None,
            need(new, "token_mask", self.name),
            row_advantages(inputs),
            epsilon=c.epsilon,
            epsilon_high=c.epsilon_high,
            beta=c.beta,
        )


def row_advantages(inputs: LossInputs) -> torch.Tensor:
    """The advantage of every estimate row [R]: stepwise advantages [B, K] at the row's sequence and chosen step
    (``row_to_seq``, ``row_column``), or per-sequence advantages [B] broadcast to the rows."""
    new, advantages = inputs.new, inputs.advantages
    if advantages.dim() == 1:
        return per_row(advantages, new.row_to_seq)
    if new.row_column is None:
        raise ValueError("stepwise advantages [B, K] need Estimate.row_column (the chosen_steps estimator)")
    rows = new.row_to_seq if new.row_to_seq is not None else torch.arange(advantages.shape[0])
    return advantages[rows.to(advantages.device), new.row_column.to(advantages.device)]
