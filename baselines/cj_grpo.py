"""CJ-GRPO, Consistency Trajectory GRPO (``yjyddq/EOSER-ASS-RL``, arXiv 2509.23924;
``cj-grpo/cj_grpo_trainer_semiar.py`` at ``5affb4e``: ``compute_loss`` lines 85-151, ``reversed_process`` lines
262-360, ``_get_per_token_logps`` lines 400-435, advantages lines 581-587; ``cj-grpo/slurm_scripts/train.yaml``).

d1's token-level PPO (``core.losses.token_ppo``) on the *rollout's own trajectory* instead of d1's one-step estimate:
the optimisation replays the denoising steps the sampler took, so the policy is trained on the very transitions it
sampled (the "consistency" of rollout and optimisation trajectories; docs/methods.md#cj-grpo)::

    z_s     = the sampler's state before step s (tokens committed at steps < s clean, the rest masked)
    rho_sk  = exp(log p_theta(y^k | z_s) - log p_old(y^k | z_s))             for the tokens k committed at step s
    l_sk    = -min(rho_sk A_i, clip(rho_sk, 1 - eps, 1 + eps) A_i) + beta KL3_sk            (as d1)
    L       = (1/S) sum_s [ sum_{i, k in U_is} l_isk / sum_i |U_is| ]      (token mean over the micro-batch per step)
    A_i     = r_i - mean_group(r)                                           (no std division)

The rows are the ``trace_replay`` estimator's with ``post_num=None``: the official replay scores every position the
step committed, EOS padding included (``unmask_positions`` is not cut at the first EOS), and the prompt is never
masked. Official settings: eps 0.5, beta 0.04 (k3 to the reference), mu 12 (8 on Countdown and Sudoku), G 6,
lr 3e-6, LoRA r 128.

Where it departs from GRPO (``grpo.py``): the likelihood (exact per-step log-probs on the sampled trajectory, one
forward pass per step, instead of one pass on a fully masked completion with a randomly masked prompt) and the
aggregation (each step's token mean, then the mean over steps, instead of one token mean). From TraceRL
(``trado.py``), which replays the same trajectory: d1's eps and KL to a frozen reference instead of eps 0.2 and a KL
to the rollout policy, ``r - mean`` instead of a z-score with groups dropped, every committed token instead of the
tokens up to the first EOS, and no log-ratio clamp.

``decoding`` picks the rollout, as the official option of that name (``cj_grpo_train.py`` lines 32-39 choose one
trainer file per value; loss and replay are the same in all four):

* ``semi-ar`` (the default, ``train.yaml`` line 76): the shared sampler, LLaDA's semi-autoregressive low-confidence
  remasking (``core.rollouts.Independent``);
* ``eoser-ass`` (``run.sh`` line 37, ``cj_grpo_trainer_eoser_ass.py``; the recipe's): ascending step sizes and EOS
  early rejection, ``core.rollouts.EoserAss`` -- the canvas as one block in log2(L) steps, 2^i tokens at step i,
  EOS's confidence scaled by a factor rising from ``eos_min_gamma`` to ``eos_max_gamma``;
* ``ass`` (``cj_grpo_trainer_ass.py``): the ascending step sizes alone;
* ``eoser`` (``cj_grpo_trainer_eoser.py``): EOS early rejection on the budget's steps, evenly split over the canvas
  as one block (the trainer asserts ``gen_length == block_length``, line 304; so does the rollout here).

The replay needs nothing more with a variable quota: each step's tokens are the ones the sampler recorded at that
step (``unmask_step``), and every ASS step commits at least one token, so the S replay steps are the official S.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import TraceReplay, replay_rounds
from stabledrl_bench.core.losses import token_mean_per_step, token_ppo, token_ppo_metrics
from stabledrl_bench.core.rollouts import EoserAss, Independent, RolloutScheme
from stabledrl_bench.errors import UserError

# decoding -> (the sampler's schedule, whether EOS is rejected early); None: the shared sampler
DECODINGS: dict[str, tuple[str, bool] | None] = {
    "semi-ar": None,
    "eoser": ("linear", True),
    "ass": ("ascending", False),
    "eoser-ass": ("ascending", True),
}


def cj_grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    step: torch.Tensor,
    *,
    epsilon: float = 0.5,
    beta: float = 0.04,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CJ-GRPO's loss (module docstring): token tensors [R, L] over replay rows, ``advantages`` and ``step`` [R].

    ``step`` is each row's replay step; the official loop over steps becomes ``token_mean_per_step``. Computed in
    ``compute_dtype`` of the inputs (``token_ppo``).
    """
    terms = token_ppo(logp, old_logp, ref_logp, mask, advantages, epsilon=epsilon, beta=beta)
    loss = token_mean_per_step(terms.per_token, mask, step)
    return loss, token_ppo_metrics(loss, terms, mask)


@dataclass
class CJGRPOConfig(BaselineConfig):
    epsilon: float = 0.5  # PPO clip range (train.yaml)
    beta: float = 0.04  # k3 KL to the frozen reference
    decoding: str = "semi-ar"  # the rollout (module docstring; train.yaml line 76)
    # EOSER: EOS's confidence factor at the first step, rising to eos_max_gamma at the last: the scheme's defaults
    # (train.yaml lines 74-75)
    eos_min_gamma: float = EoserAss.eos_min_gamma
    eos_max_gamma: float = EoserAss.eos_max_gamma

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.decoding not in DECODINGS:
            raise UserError(f"CJ-GRPO: decoding must be one of {', '.join(DECODINGS)}, got {self.decoding!r}")


@register_baseline("cj_grpo")
class CJGRPO(Baseline):
    """CJ-GRPO: d1's token PPO (eps 0.5, k3 KL 0.04) on the replayed sampling trajectory, step-wise token means."""

    description: ClassVar[str] = "CJ-GRPO: d1 token PPO (eps 0.5) on the replayed rollout trajectory, per-step means"
    Config: ClassVar[type[BaselineConfig]] = CJGRPOConfig
    advantage: ClassVar[str] = "group_mean"
    needs_old: ClassVar[bool] = True
    config: CJGRPOConfig

    def estimator(self) -> TraceReplay:
        return TraceReplay(shrink=1, post_num=None)

    def rollout(self) -> RolloutScheme:
        """The rollout of ``decoding``: the shared sampler, or :class:`EoserAss` with its rules."""
        c = self.config
        rules = DECODINGS[c.decoding]
        if rules is None:
            return Independent()
        schedule, eos_rule = rules
        if not eos_rule:
            return EoserAss(schedule=schedule, eos_min_gamma=1.0, eos_max_gamma=1.0)
        return EoserAss(schedule=schedule, eos_min_gamma=c.eos_min_gamma, eos_max_gamma=c.eos_max_gamma)

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        rows = inputs.new.row_to_seq  # None: one row per sequence, all of them one step
        if rows is None:
            rows = torch.arange(inputs.advantages.shape[0], device=inputs.advantages.device)
        c = self.config
        return cj_grpo_loss(*inputs.token_rows(self.name), replay_rounds(rows), epsilon=c.epsilon, beta=c.beta)
