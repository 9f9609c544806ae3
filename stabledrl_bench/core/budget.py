"""The training budget every baseline of a comparison shares.

A fair comparison gives each method the same rollouts and the same optimizer steps; only the loss and its
likelihood estimator differ. The budget is everything that fixes that amount of work. Its hash is written into
every log, checkpoint and result, and the leaderboard refuses to put runs with different hashes in one table.

Per-process micro-batching is deliberately *not* part of the budget: it changes memory use, not the maths
(every loss normalises per group or per token, so splitting a step into micro-batches changes nothing).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stabledrl_bench.config import from_dict, read_recipe, stable_hash
from stabledrl_bench.core.sampling import DECODE_MODES, BlockDecode, DecodeSettings, FullDecode
from stabledrl_bench.errors import UserError

if TYPE_CHECKING:
    from stabledrl_bench.core.models.interface import DiffusionLM


@dataclass(frozen=True)
class Budget:
    """Work per comparison, with TRL-style names where one exists.

    No field has a default: a budget is the identity of a comparison, so every value is written down where the
    comparison is defined (a recipe or a preset). The paper's budget is the StableDRL recipe's
    (``configs/recipes/stabledrl/_base.yaml``, :func:`paper_budget`).
    """

    max_steps: int  # optimizer steps
    prompts_per_step: int  # distinct prompts per optimizer step, all processes together
    num_generations: int  # completions per prompt (the advantage group G)
    num_iterations: int  # mu: optimizer steps taken on each rollout batch
    max_completion_length: int  # L: the fixed rollout canvas
    diffusion_steps: int  # rollout denoising steps over the canvas
    block_length: int  # rollout semi-autoregressive block (full attention)
    temperature: float  # rollout sampling temperature
    max_prompt_length: int  # prompts keep their last tokens beyond this
    # Opt-in fast rollouts, a mode of ``DECODE_MODES`` (full attention). The only field with a default: "exact"
    # is what every budget meant before the option existed, and it is left out of :meth:`to_dict` (so of the
    # hash), which keeps every earlier budget hash -- hence every stored result key -- unchanged.
    rollout_decode: str = "exact"

    def __post_init__(self) -> None:
        positive = (
            "max_steps",
            "prompts_per_step",
            "num_generations",
            "num_iterations",
            "max_completion_length",
            "diffusion_steps",
            "block_length",
            "max_prompt_length",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise UserError(f"budget.{name} must be positive, got {getattr(self, name)}")
        if self.max_completion_length % self.block_length:
            raise UserError(
                f"budget.block_length={self.block_length} must divide "
                f"max_completion_length={self.max_completion_length}"
            )
        if self.max_steps % self.num_iterations:
            raise UserError(
                f"budget.max_steps={self.max_steps} must be a multiple of num_iterations={self.num_iterations} "
                "(each rollout batch is used for exactly num_iterations optimizer steps)"
            )
        if not (0 <= self.temperature < float("inf")):  # NaN fails too
            raise UserError(f"budget.temperature must be a finite number >= 0, got {self.temperature}")
        if self.rollout_decode not in DECODE_MODES:
            raise UserError(
                f"budget.rollout_decode must be one of {', '.join(DECODE_MODES)}, got {self.rollout_decode!r}"
            )

    @property
    def rollout_phases(self) -> int:
        return self.max_steps // self.num_iterations

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations

    def decode_settings(self, model: DiffusionLM) -> DecodeSettings:
        """How ``model`` decodes rollouts under this budget (the trainer's and every rollout made to compare with it).

        A fast ``rollout_decode`` changes only which tokens are sampled: the estimators still compute the old
        policy's likelihoods of those tokens, so the losses are unchanged. Block models decode with their own block
        size and exact cache; the fast modes are Fast-dLLM's for full attention, so a block model refuses them.
        """
        if model.attention == "full":
            return FullDecode(
                max_completion_length=self.max_completion_length,
                block_length=self.block_length,
                steps=self.diffusion_steps,
                temperature=self.temperature,
                **DECODE_MODES[self.rollout_decode],
            )
        if self.rollout_decode != "exact":
            raise UserError(
                f"budget.rollout_decode={self.rollout_decode!r} is a full-attention mode; {model.name} decodes "
                "block by block (use rollout_decode: exact)"
            )
        return BlockDecode(
            max_completion_length=self.max_completion_length,
            block_length=model.block_size,
            steps=self.diffusion_steps,
            temperature=self.temperature,
            use_cache=model.supports_kv_cache,
        )

    def to_dict(self) -> dict[str, object]:
        """The budget as written to logs, checkpoints and results (``rollout_decode`` only when not exact)."""
        data = dataclasses.asdict(self)
        if self.rollout_decode == "exact":
            del data["rollout_decode"]
        return data

    def hash(self) -> str:
        return stable_hash(self.to_dict())


PAPER_RECIPE = "stabledrl/_base.yaml"


def paper_budget() -> Budget:
    """The official StableDRL budget, read from its recipe (the one place the paper's numbers are written)."""
    return from_dict(Budget, read_recipe(PAPER_RECIPE)["budget"], where=f"recipes/{PAPER_RECIPE}: budget")
