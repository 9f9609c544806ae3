"""Likelihood estimators for masked diffusion LMs (data types; implementations follow below them).

Every RL method for dLLMs needs log pi(y|x), which a masked diffusion model cannot compute exactly; each method
uses a different Monte-Carlo proxy. They share one interface so baselines can be compared on equal terms:

* ``draw(batch, generator) -> Noise``: all randomness (masks, mask counts, chosen blocks), from an explicit
  ``torch.Generator``;
* ``evaluate(model, batch, noise) -> Estimate``: one batched forward pass over every MC sample.

Coupled estimation (old and new policy see the same masks) is reusing one ``Noise``; independent estimation
(what the official StableDRL code does) is drawing twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SequenceBatch:
    """Prompts and completions to score; prompts are left-padded, completions have a fixed length L."""

    prompt_ids: torch.Tensor  # [B, P] long
    prompt_mask: torch.Tensor  # [B, P] bool, False at left padding
    completion_ids: torch.Tensor  # [B, L] long
    completion_mask: torch.Tensor  # [B, L] bool, True up to and including the first EOS
    unmask_step: torch.Tensor | None = None  # [B, L] long, sampler step that committed each token (TraceRL)


@dataclass
class Estimate:
    """What an estimator returns. Each estimator fills the fields it defines; the rest stay None.

    Token-level estimators (d1 one-step, TraceRL replay) give ``token_logp`` and ``token_mask`` over R rows
    (R = B, or more rows for trajectory replay, mapped back by ``row_to_seq``). Sequence-level estimators
    (SPG, ESPO, staircase) give ``elbo`` (and SPG also ``eubo``) per sequence.
    """

    token_logp: torch.Tensor | None = None  # [R, L] log p of the clean token (0 where token_mask is False)
    token_mask: torch.Tensor | None = None  # [R, L] bool, the positions that count
    row_to_seq: torch.Tensor | None = None  # [R] long, sequence index of each row (None means identity)
    elbo: torch.Tensor | None = None  # [B] sequence-level ELBO (scale documented per estimator)
    eubo: torch.Tensor | None = None  # [B] SPG's Renyi-type upper bound proxy

    def detach(self) -> Estimate:
        return Estimate(
            **{k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        )
