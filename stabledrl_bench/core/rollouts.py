"""Rollout schemes: how a method draws its completions, a plug-in point beside estimators, advantage rules and losses
(docs/rollouts.md).

Why a plug-in point: some methods put their novelty in the rollout itself, not in the likelihood or the loss (trees
of partial states that branch, rewards on every intermediate prediction, hints injected into the canvas). A scheme
takes one micro-batch's prompts (each repeated ``num_generations`` times), the policy, the budget's decode settings
and the micro-batch's random stream, and returns a :class:`Rollout`: the completions, the step at which the sampler
committed each token, the forward passes it took, and whatever else its method asked it to record.

A scheme *is* its typed settings, like an estimator: a frozen dataclass whose fields are its options, registered in
:data:`ROLLOUTS` (entry-point group ``stabledrl_bench.rollouts``), which a method declares with
:meth:`~stabledrl_bench.core.baseline.Baseline.rollout`. :class:`Independent`, every completion decoded on its own
by the budget's sampler, is the default: every method of the paper's tables samples this way.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from stabledrl_bench.core.models.interface import DiffusionLM
from stabledrl_bench.core.registry import Registry, subclass_check
from stabledrl_bench.core.sampling import DecodeSettings, generate


@dataclass(frozen=True)
class Rollout:
    """One micro-batch's completions as a scheme drew them.

    ``completion_ids`` [rows, L]; ``unmask_step`` [rows, L]: the sampler step that committed each token (the
    trajectory TraceRL and CJ-GRPO replay); ``nfe``: forward passes per row; ``records``: what the method asked the
    scheme to keep beyond that (per-step states, a tree of partial states, per-step rewards), by name.
    """

    completion_ids: torch.Tensor
    unmask_step: torch.Tensor
    nfe: int
    records: Mapping[str, Any] = field(default_factory=dict)


class RolloutScheme(ABC):
    """A way of drawing completions: ``sample`` one micro-batch (see the module docstring)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @abstractmethod
    def sample(
        self,
        dlm: DiffusionLM,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        settings: DecodeSettings,
        generator: torch.Generator,
    ) -> Rollout:
        """The completions of ``prompt_ids`` (rows already repeated per completion) under ``settings``, drawing
        every random number from ``generator``."""

    def settings(self) -> dict[str, Any]:
        """The scheme and its options, as run folders record them."""
        return {"name": self.name, **dataclasses.asdict(self)}  # type: ignore[call-overload]


ROLLOUTS: Registry[type[RolloutScheme]] = Registry(
    "rollout scheme", "rollouts", builtins=["stabledrl_bench.core.rollouts"], check=subclass_check(RolloutScheme)
)


@ROLLOUTS.register("independent")
@dataclass(frozen=True)
class Independent(RolloutScheme):
    """Every completion decoded on its own by the budget's sampler (LLaDA's semi-autoregressive low-confidence
    remasking on full attention, block diffusion with its KV cache on block models): the rollouts of GRPO, SPG, ESPO,
    TraceRL and StableDRL."""

    description: ClassVar[str] = "each completion decoded on its own by the budget's sampler (the default)"

    def sample(self, dlm, prompt_ids, prompt_mask, settings, generator) -> Rollout:
        out = generate(dlm, prompt_ids, prompt_mask, settings, generator=generator)
        return Rollout(out.completion_ids, out.unmask_step, out.nfe)


__all__ = ["ROLLOUTS", "Independent", "Rollout", "RolloutScheme"]
