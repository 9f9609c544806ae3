"""MDPO, Masked Diffusion Policy Optimization (``autonomousvision/mdpo``, arXiv 2508.13148;
``src/open_r1/mdpo/mdpo_trainer.py`` at ``e6ae439``: ``_generate_and_score_completions`` lines 757-915,
``split_into_micro_batches`` lines 917-949, the training loop lines 1259-1310, ``compute_loss`` lines 1487-1545;
``src/mdlm_generation_utils.py: diffusion_generate`` lines 27-130; ``src/open_r1/mdpo/mdpo_config.py`` lines
189-282; ``recipes/LLaDA-Instruct/mdpo/config_demo.yaml``).

MDPO rewards the sampler's full prediction of the completion at every one of its T steps (an answer can be right
halfway through decoding and lost later), turns the step rewards into per-step advantages, normalises each step
over the group, and trains the K steps of largest |advantage|, each on the sampler's state before it with the
step's prediction as targets, every token weighted by the probability the sampler gave it (docs/methods.md#mdpo)::

    r_it   = reward of x^_it, the prediction at step t (every masked position of z_t filled by the sampler)
    D_it   = r_i0 + 1 (t = 0),   r_it - r_i,t-1 + 1 (t > 0)                       (adv-v3, line 849)
    S_it   = D_it + mean_{s = t+1..T-1} r_is (t < T-1),   D_i,T-1 + r_i,T-1          (adv-v4, line 851)
    A_it   = (S_it - mean_group S_.t) / (std_group S_.t + 1e-4)    sample std, per step t (lines 852-858)
    S_i    = the K steps of largest |A_it|                          (line 922, one row per device)
    rho    = exp(log p_theta(x^_it^k | z_it) - log p_old(...))      per token k masked in z_it
    l_itk  = -min(rho A_it, clip(rho, 1 - eps, 1 + eps) A_it) L / (n_it + 1e-4) + beta (log p_ref - log p_theta)^2 / 2
    L_it   = sum_k c_itk l_itk / (n_it + 1e-4)                      c: the sampler's probability of x^_it^k
    L      = mean_i sum_{t in S_i} L_it                             n_it: masked positions of z_it, L: the canvas

Official defaults (``mdpo_config.py``): K = ``sample_train_steps`` 16, eps 0.2, beta 0.04 (k2, to the initial
model), T = 128 steps, one block (``block_length`` = the canvas), temperature 0 (``conf_alg="llada"``,
``rcr=False``, ``num_iterations`` 1). The recipe (``config_demo.yaml``) sets beta 0, temperature 0.1, canvas 512 in
128 steps with one block, G 4, one prompt per device with gradient accumulation 32, lr 1e-5 constant with 10 %
warm-up, full-parameter training (``configs/recipes/mdpo/``). Each chosen step is one ``compute_loss`` call whose
loss the trainer divides by the accumulation steps: the K steps of a rollout are summed, the rollouts averaged.

Official line -> here (the full table is in docs/methods.md#mdpo):

* the sampler's predictions and their probabilities (``diffusion_generate`` lines 56-130) ->
  ``core.rollouts.StepPredictions`` (``records["predictions"]``, ``records["confidence"]``);
* the step rewards (lines 804-843: every reward function on each prediction, weighted, ``nansum``) -> the trainer
  scores ``predictions`` with the task's reward profile (``RLTrainer._batch_records``);
* shaping and normalisation (lines 849-858) -> :func:`mdpo_advantages`;
* top-|A| steps and their rows (lines 917-949) -> ``core.estimators.AdvantageSteps`` (it reads the advantages
  :meth:`MDPO.estimator_records` puts in the records);
* the loss (lines 1487-1532) -> :func:`mdpo_loss`.

Where it departs from the official code, each a convention of this harness or a case the official code leaves
undefined: every number of the sampler is the harness's (LLaDA's Gumbel-max draw in float64 with MASK excluded,
its transfer schedule, prompts' left padding not attended; the official sampler draws with
``torch.distributions.Categorical`` in autocast and its ``get_num_transfer_tokens_maskgit`` schedule); beyond the
current block the prediction is the argmax where the official code samples (the same at temperature 0 and with
one block, its default and recipe); log-probs are untempered (the official loss divides the logits by
``temperature + eps``: 1 / 0.0078 for bf16 at its default temperature 0) and in float32, the probabilities in
float64; old log-probs come from the rollout policy's replay (iteration 0: the current policy, detached, as the
official ``num_iterations == 1``); texts are cut at the first stop token before they are rewarded (the official
code decodes the whole canvas, skipping special tokens); ties among |A| go to the earlier step (``torch.topk``
leaves them unspecified); more than one prompt per device selects steps per completion (the official sampler
decodes one prompt per device, so its sum over the device's rows is one row). Not implemented (off by default):
``rcr`` (remasking by the running confidence), ``conf_alg`` ``random`` / ``topk_margin`` / ``entropy``, ``top_k``
/ ``top_p`` filtering, ``incremental_training`` and ``mixture_data`` (data selection and mixed block sizes), the
Dream shift.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from stabledrl_bench.core.advantages import compute_dtype, reward_zscore_advantage
from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import AdvantageSteps
from stabledrl_bench.core.losses import k2_kl, need, token_ppo, token_ppo_metrics
from stabledrl_bench.core.rollouts import StepPredictions
from stabledrl_bench.errors import UserError

from .egspo import row_advantages

STD_EPSILON = 1e-4  # added to each step's group std (line 858)
COUNT_EPSILON = 1e-4  # added to the masked count in lambda_t and in the denominator (lines 1512 and 1532)


def mdpo_advantages(step_rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """MDPO's per-step advantages [B, T] (lines 849-858) from the rewards of every step's prediction [B, T]; in
    ``compute_dtype``. The shaping in the official order of operations (the +1 cancels in the centring), then each
    step's column is z-scored over its group with the sample std + 1e-4 (``reward_zscore_advantage``)."""
    rewards = step_rewards.to(compute_dtype(step_rewards))
    steps = rewards.shape[1]
    shaped = torch.cat([rewards[:, 0:1], rewards[:, 1:] - rewards[:, :-1]], dim=-1) + 1
    later = rewards[:, 1:].flip(dims=(-1,)).cumsum(dim=-1) / torch.arange(1, steps, device=rewards.device)[None]
    shaped = shaped + torch.cat([later.flip(dims=(-1,)), rewards[:, -1:]], dim=-1)
    columns = [reward_zscore_advantage(column, group_ids, STD_EPSILON) for column in shaped.unbind(dim=1)]
    return torch.stack(columns, dim=1)


def mdpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    mask: torch.Tensor,
    weight: torch.Tensor | None,
    advantages: torch.Tensor,
    num_sequences: int,
    *,
    epsilon: float = 0.2,
    beta: float = 0.04,
) -> tuple[torch.Tensor, dict[str, float]]:
    """MDPO's loss (module docstring): token tensors [R, L] over the replayed steps (row r: one chosen step of one
    sequence, its mask the positions masked in the step's state), ``weight`` [R, L] the sampler's probabilities
    (None: 1), ``advantages`` [R] per row. Each row is one official ``compute_loss`` (lines 1510-1532); the rows are
    summed and divided by the number of sequences. In ``compute_dtype`` of the log-probs and advantages.
    """
    terms = token_ppo(logp, old_logp, None, mask, advantages, epsilon=epsilon)
    dtype = terms.per_token.dtype
    mask = mask.bool()
    count = mask.sum(dim=1, keepdim=True).to(dtype)
    per_token = terms.per_token * (mask.shape[1] / (count + COUNT_EPSILON))  # lambda_t
    metrics: dict[str, float] = {}
    if beta > 0:
        if ref_logp is None:
            raise ValueError("a KL term (beta > 0) needs the reference log-probs")
        kl = k2_kl(torch.where(mask, ref_logp.to(dtype) - logp.to(dtype), 0.0))
        per_token = per_token + beta * kl
        metrics["kl"] = kl[mask].mean().item()
    weight = torch.ones_like(per_token) if weight is None else weight.to(dtype)
    per_row = torch.where(mask, per_token * weight, 0.0).sum(dim=1) / (count[:, 0] + COUNT_EPSILON)
    loss = per_row.sum() / num_sequences
    return loss, token_ppo_metrics(loss, terms, mask) | metrics


@dataclass
class MDPOConfig(BaselineConfig):
    beta: float = 0.04  # k2 KL to the reference (mdpo_config.py line 226; the recipe sets 0)
    epsilon: float = 0.2  # clip range (line 237; inactive at num_iterations 1, where every ratio is 1)
    sample_train_steps: int = 16  # K: steps of largest |A| trained per completion (line 205)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.epsilon < 1:
            raise UserError(f"MDPO: need 0 < epsilon < 1, got {self.epsilon}")
        if not self.coupled:
            raise UserError("MDPO: coupled must be true (the old policy replays the same chosen steps)")
        AdvantageSteps(num_steps=self.sample_train_steps)  # checks K


@register_baseline("mdpo")
class MDPO(Baseline):
    """MDPO: token PPO on the K sampler steps of largest |A|, rewards of every intermediate prediction."""

    description: ClassVar[str] = "MDPO: token PPO on the steps of largest |A|, rewards of every step's prediction"
    Config: ClassVar[type[BaselineConfig]] = MDPOConfig
    advantage: ClassVar[str] = "reward_zscore"  # its per-step z-score; the shaping is mdpo_advantages
    needs_old: ClassVar[bool] = True
    config: MDPOConfig

    def estimator(self) -> AdvantageSteps:
        return AdvantageSteps(num_steps=self.config.sample_train_steps)

    def rollout(self) -> StepPredictions:
        return StepPredictions(train_steps=self.config.sample_train_steps)

    def advantage_record(self) -> dict[str, Any]:
        return {"rule": "mdpo_stepwise", "options": {"epsilon": STD_EPSILON}}

    def advantages(
        self,
        rewards: torch.Tensor,
        group_ids: torch.Tensor,
        correct: torch.Tensor | None = None,
        records: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages [B, T], keep [B])``: :func:`mdpo_advantages` of the rewards of every step's prediction
        (``records["prediction_rewards"]``; the last is the completion's, ``rewards``); no group is dropped."""
        del correct
        step_rewards = None if records is None else records.get("prediction_rewards")
        if step_rewards is None:
            raise UserError("MDPO needs the rewards of every step's prediction (the step_predictions rollout)")
        return mdpo_advantages(step_rewards, group_ids), torch.ones_like(rewards, dtype=torch.bool)

    def estimator_records(
        self, records: Mapping[str, torch.Tensor], advantages: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The rollout's records and the per-step advantages, by which the estimator chooses its steps."""
        return {**records, "advantages": advantages}

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        new, c = inputs.new, self.config
        return mdpo_loss(
            need(new, "token_logp", self.name),
            need(inputs.old, "token_logp", self.name),
            inputs.ref.token_logp if inputs.ref is not None else None,
            need(new, "token_mask", self.name),
            new.token_weight,
            row_advantages(inputs),
            inputs.advantages.shape[0],
            epsilon=c.epsilon,
            beta=c.beta,
        )
