"""JustGRPO (``LeapLabTHU/JustGRPO``, arXiv 2601.15165 "The Flexibility Trap"; ``grpo.py`` at ``eebe50e``:
``logprob_loss`` lines 25-55, ``compute_group_advantages`` lines 58-61; ``train.py`` lines 13-31, 152-216).

Plain GRPO on the diffusion model used as an autoregressive one: rollouts decode left to right (block length 1, one
token per step) and the likelihood is the exact left-to-right factorisation, one forward pass per position (the
``ar_replay`` estimator; docs/methods.md#justgrpo)::

    log pi(y_t) = log p_theta(y_t | x, y_<t, M...M)                                  (every position t of the canvas)
    rho_it      = exp(log pi_theta(y_it) - log pi_old(y_it))
    L           = -(1 / (L V)) sum_i sum_t min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps) A_i),   eps = 0.2
    A_i         = (r_i - mean_group(r)) / (std_group(r) + 1e-4)                        (sample std, TRL's GRPO)

with L the canvas and V the official ``valid_samples`` (plus 1e-5): the scale ``gain / gen_length / (valid_samples +
1e-5)``, every token of every completion summed. There is no KL term and no reference model. The official loop takes
one optimizer step per rollout, so rho = 1 there and the clip never binds; with ``num_iterations`` > 1 the ratio is
against the rollout policy, as GRPO's.

Official settings (``train.py``): G = 16 (8 generations x 2 repeats), one prompt per device, 8 devices x 8
accumulation steps = 64 prompts per step, 125 steps, lr 5e-6, AdamW betas (0.9, 0.999), no weight decay, gradient
clip 1.0, full-parameter training, canvas 256 decoded in 256 steps with block length 1 at temperature 1, reward +1 /
-1 for a correct / wrong answer.

Where it departs from GRPO (``grpo.py``): the likelihood is exact (the AR factorisation, L passes) rather than d1's
one-step mean-field estimate; advantages are divided by the group std; the loss sums every canvas position (EOS
padding included) and divides by L and the number of informative completions instead of taking a token mean; eps
0.2; no KL.

How a step's pieces combine, as the official loop runs them (``train.py`` lines 157-219, ``grpo.py`` lines 31-32).
Each of ``D`` devices takes one micro-batch per accumulation round; the loop calls ``backward`` once per round on a
plain ``Accelerator()`` (no division by the rounds) and DDP averages the devices, so a step's gradient is
``(1 / D) sum over rounds and devices``. And ``valid_samples`` is the mean over a round's devices of each device's count
of completions with a non-zero advantage (``accelerator.gather(valid_samples).float().mean()``), not the device's own
count. Here the ``devices`` option is that ``D`` (the recipe's 8; default 1, the official loop on one device): a step's
micro-batches, in order, make rounds of ``D``, :meth:`JustGRPO.step_context` gives each one its round's mean count and
the number of rounds K, and the loss is multiplied by K, so that the trainer's average over the ``K D`` micro-batches
is the official sum. This holds on any number of processes of this harness: ``D`` is a setting of the method, not
of the launch.

Rollouts: the harness samples with the budget's decoder. JustGRPO's recipe (``configs/recipes/justgrpo/``) sets
block length 1 and as many steps as the canvas, which is the official autoregressive rollout; under any other budget
the same loss scores the sampled completion under the left-to-right factorisation, not under the order it was
sampled in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from stabledrl_bench.config import require_positive
from stabledrl_bench.core.baseline import Baseline, BaselineConfig, LossInputs, register_baseline
from stabledrl_bench.core.estimators import ARReplay
from stabledrl_bench.core.losses import need, per_row, token_ppo, token_ppo_metrics
from stabledrl_bench.errors import UserError


def justgrpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    row_to_seq: torch.Tensor | None,
    *,
    canvas: int,
    epsilon: float = 0.2,
    valid_samples: float | None = None,
    rounds: int = 1,
) -> tuple[torch.Tensor, dict[str, float]]:
    """JustGRPO's loss (module docstring): token tensors [R, L] over replay rows, ``advantages`` [B] per completion
    (``row_to_seq`` maps rows to completions; None: one row each), ``canvas`` = L. ``valid_samples``: V, the mean
    count of informative completions over the micro-batch's round (None: its own count); ``rounds``: how many
    accumulation rounds the official loop sums, the factor that turns the trainer's mean into that sum. In
    ``compute_dtype``."""
    terms = token_ppo(logp, old_logp, None, mask, per_row(advantages, row_to_seq), epsilon=epsilon)
    if valid_samples is None:
        valid_samples = float((advantages != 0).sum())
    scale = rounds / canvas / (valid_samples + 1e-5)  # the official gain / gen_length / (valid_samples + 1e-5)
    loss = torch.where(mask.bool(), terms.per_token, 0.0).sum() * scale
    return loss, token_ppo_metrics(loss, terms, mask)


@dataclass
class JustGRPOConfig(BaselineConfig):
    epsilon: float = 0.2  # PPO clip range (logprob_loss eps)
    std_epsilon: float = 1e-4  # added to the group std of the advantage (compute_group_advantages)
    devices: int = 1  # D: the devices an official accumulation round spreads over (module docstring)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(devices=self.devices)
        if self.beta != 0:
            raise UserError(f"JustGRPO: beta must be 0 (the official loss has no KL term); got {self.beta}")


@register_baseline("justgrpo")
class JustGRPO(Baseline):
    """JustGRPO: GRPO on the exact left-to-right likelihood, z-scored advantages, no KL."""

    description: ClassVar[str] = "JustGRPO: token PPO clip (eps 0.2) on the exact left-to-right likelihood, z-score"
    Config: ClassVar[type[BaselineConfig]] = JustGRPOConfig
    advantage: ClassVar[str] = "reward_zscore"
    needs_old: ClassVar[bool] = True
    config: JustGRPOConfig

    def estimator(self) -> ARReplay:
        return ARReplay()

    def advantage_options(self) -> dict[str, Any]:
        return {"epsilon": self.config.std_epsilon}

    def require_micro_batches(self, count: int) -> None:
        if count % self.config.devices:
            raise UserError(
                f"JustGRPO: a step of {count} micro-batch(es) (prompts_per_step / per_device_prompts) does not split "
                f"into accumulation rounds of devices={self.config.devices}"
            )

    def step_context(self, advantages: list[torch.Tensor]) -> list[dict[str, float]]:
        """Rounds of ``devices`` consecutive micro-batches: each gets its round's mean count of completions with a
        non-zero advantage (``valid_samples``, in float32 as the official gather) and the number of rounds."""
        devices = self.config.devices
        self.require_micro_batches(len(advantages))
        rounds = len(advantages) // devices
        counts = torch.stack([(a != 0).sum() for a in advantages]).float()
        contexts = []
        for mean in counts.view(rounds, devices).mean(dim=1).tolist():
            contexts += [{"valid_samples": mean, "rounds": rounds}] * devices
        return contexts

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        new = inputs.new
        return justgrpo_loss(
            need(new, "token_logp", self.name),
            need(inputs.old, "token_logp", self.name),
            need(new, "token_mask", self.name),
            inputs.advantages,
            new.row_to_seq,
            canvas=inputs.completion_mask.shape[1],
            epsilon=self.config.epsilon,
            valid_samples=inputs.context.get("valid_samples"),
            rounds=int(inputs.context.get("rounds", 1)),
        )
