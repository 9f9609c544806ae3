"""What an RL method is to the trainer: one small class, registered by name in ``BASELINES``.

A baseline declares four things and nothing else, so that two methods differ only where their papers differ:

* ``Config``    - a dataclass of its loss hyperparameters (TRL's names where one exists), defaults from its
  official code;
* ``estimator`` - the likelihood estimator it needs, as a typed spec (an
  :class:`~stabledrl_bench.core.estimators.Estimator` with its settings, e.g. ``SPGBlock(num_mc=2)``);
* ``advantage`` - the name of its advantage rule in :data:`~stabledrl_bench.core.advantages.ADVANTAGES`
  (plus ``advantage_options`` when the rule takes any);
* ``loss``      - a pure function of tensors returning ``(loss, metrics)``.

Everything else (rollouts, optimizer, budget, logging) is shared by the trainer. External packages add a
baseline without editing this repository through the ``stabledrl_bench.baselines`` entry-point group::

    [project.entry-points."stabledrl_bench.baselines"]
    my_method = "my_package.my_module"   # importing the module runs its @register_baseline
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from stabledrl_bench.core.advantages import ADVANTAGES, min_group_size
from stabledrl_bench.core.estimators import Estimate, Estimator
from stabledrl_bench.core.losses import need, per_row
from stabledrl_bench.core.registry import Registry, subclass_check
from stabledrl_bench.core.rollouts import Independent, RolloutScheme
from stabledrl_bench.errors import UserError
from stabledrl_bench.migrations import BASELINE_OPTION_RENAMES, renamed_keys


@dataclass
class LossInputs:
    """Everything a loss may read. Tensors of the current policy carry gradients; old/ref are detached."""

    new: Estimate  # current policy pi_theta (with grad)
    old: Estimate | None  # rollout policy pi_theta_old (no grad); None when the baseline needs no ratio
    ref: Estimate | None  # frozen reference policy (no grad); None when beta == 0
    advantages: torch.Tensor  # [B] (a stepwise method's: [B, K], one column per chosen step, Estimate.row_column)
    completion_mask: torch.Tensor  # [B, L] bool, True up to and including the first EOS
    group_ids: torch.Tensor  # [B] long, the prompt each completion belongs to
    # what the loss needs from the other micro-batches of its optimizer step (Baseline.step_context); empty for most
    context: dict[str, float] = dataclasses.field(default_factory=dict)
    # the optimizer steps done before this one and the run's length (TRL's state.global_step and args.max_steps), for
    # a loss whose terms follow a schedule over training (d-TreeRPO's self-distillation)
    step: int = 0
    total_steps: int = 1

    def token_rows(
        self, baseline: str
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """``(logp, old_logp, ref_logp, mask, advantages)`` of a token-level estimate, every tensor over its rows
        (the advantages broadcast to them): the arguments of every loss built on ``core.losses.token_ppo``."""
        new = self.new
        return (
            need(new, "token_logp", baseline),
            need(self.old, "token_logp", baseline),
            self.ref.token_logp if self.ref is not None else None,
            need(new, "token_mask", baseline),
            per_row(self.advantages, new.row_to_seq),
        )


@dataclass
class BaselineConfig:
    """Hyperparameters shared by name across baselines (TRL's GRPOConfig names where one exists).

    ``sync_ref_model`` is TRL's TR-DPO reference update (``SyncRefModelCallback``), for any method with a reference
    (beta > 0): after every ``ref_model_sync_steps``-th optimizer step, ref <- (1 - alpha) ref + alpha policy with
    alpha = ``ref_model_mixup_alpha``, parameter by parameter (``training/distributed.py: mix_into``). Off (a frozen
    reference) unless a method's official recipe turns it on; TRL's defaults for the other two.
    """

    beta: float = 0.0  # KL coefficient; 0 means no reference model is loaded
    coupled: bool = True  # old/new likelihoods from the same masks (False: independent masks)
    sync_ref_model: bool = False  # mix the policy into the reference every ref_model_sync_steps steps
    ref_model_sync_steps: int = 512  # TRL's default
    ref_model_mixup_alpha: float = 0.6  # TRL's default

    def __post_init__(self) -> None:
        steps, alpha = self.ref_model_sync_steps, self.ref_model_mixup_alpha
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise UserError(f"ref_model_sync_steps must be a positive integer, got {steps!r}")
        if not 0 < alpha <= 1:
            raise UserError(f"ref_model_mixup_alpha must be in (0, 1], got {alpha!r}")


class Baseline:
    """Base class of every RL method; subclasses set the class attributes and implement ``estimator``/``loss``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Config: ClassVar[type[BaselineConfig]] = BaselineConfig
    advantage: ClassVar[str] = "group_mean"  # a rule of ADVANTAGES
    needs_old: ClassVar[bool] = True  # computes a ratio against the rollout policy

    def __init__(self, config: BaselineConfig | None = None, **overrides: Any) -> None:
        config = config or self.Config()
        if overrides:
            known = {f.name for f in dataclasses.fields(config)}
            unknown = sorted(set(overrides) - known)
            renamed = renamed_keys(unknown, known, BASELINE_OPTION_RENAMES)  # a pointer, not "unknown option"
            if renamed:
                raise UserError(f"baseline {self.name!r}: option {'; '.join(renamed)}")
            if unknown:
                raise UserError(f"unknown option(s) for baseline {self.name!r}: {', '.join(unknown)}")
            config = dataclasses.replace(config, **overrides)
        self.config = config

    @property
    def needs_ref(self) -> bool:
        return self.config.beta > 0

    def estimator(self) -> Estimator:
        """The likelihood estimator, with this baseline's settings (the trainer adapts it to the model)."""
        raise NotImplementedError

    def rollout(self) -> RolloutScheme:
        """How this method draws its completions (:mod:`~stabledrl_bench.core.rollouts`): by default each one on its
        own by the budget's sampler."""
        return Independent()

    def advantage_options(self) -> dict[str, Any]:
        """Keyword options of the advantage rule (none for most rules)."""
        return {}

    def correctness(self, correct: torch.Tensor, response_lengths: torch.Tensor, canvas: int) -> torch.Tensor:
        """The correctness flags the advantage rule sees: the grader's, unless the method overrides them (TraDo
        counts answers that nearly fill the canvas as wrong)."""
        del response_lengths, canvas
        return correct

    def advantage_record(self) -> dict[str, Any]:
        """The advantage rule and its options, as run folders and result records store them: two methods that differ
        only in their rule (a plugin's, say) must not look the same on disk."""
        return {"rule": self.advantage, "options": self.advantage_options()}

    def require_groups(self, num_generations: int) -> None:
        """Refuse a group size under which this method cannot learn: its advantage rule then gives 0 to every
        completion (e.g. ``group_mean`` with one completion per prompt), so training would change nothing."""
        least = min_group_size(ADVANTAGES.get(self.advantage))
        if num_generations < least:
            raise UserError(
                f"budget.num_generations={num_generations}: {self.name} compares the completions of a prompt with each "
                f"other (advantage rule {self.advantage!r}), which needs at least {least} per prompt; with fewer every "
                "advantage is 0 and nothing is learned"
            )

    def require_micro_batches(self, count: int) -> None:
        """Refuse an optimizer step of ``count`` micro-batches that this method cannot combine its way
        (:meth:`step_context`); any count does for a method that averages them."""
        del count

    def step_context(self, advantages: list[torch.Tensor]) -> list[dict[str, float]] | None:
        """What each micro-batch's loss needs from the others of its optimizer step, for a method whose official loop
        combines them otherwise than the trainer does (it averages the micro-batches' losses, on one process or many).

        ``advantages``: every micro-batch's, of every process, in the step's order. Returns one dict per micro-batch,
        its ``LossInputs.context`` (JustGRPO: the mean count of informative completions over the micro-batches one
        official accumulation round spreads over its devices, and the number of rounds its loop sums). None, the
        default: each loss sees its own micro-batch only, and the trainer gathers nothing.
        """
        del advantages
        return None

    def advantages(
        self,
        rewards: torch.Tensor,
        group_ids: torch.Tensor,
        correct: torch.Tensor | None = None,
        records: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages [B], keep [B] bool)`` by the ``advantage`` rule; ``keep`` drops whole groups.

        ``records`` are what the method's rollout scheme recorded per completion (``SequenceBatch.records``); the
        rules of rewards alone ignore them, a method with stepwise advantages (EGSPO: [B, K]) reads them.
        """
        del records
        rule = ADVANTAGES.get(self.advantage)
        return rule(rewards, group_ids, correct, **self.advantage_options())

    def estimator_records(
        self, records: Mapping[str, torch.Tensor], advantages: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The records the estimator sees once the rollout's advantages are known (``SequenceBatch.records``): the
        rollout scheme's own, for every method whose likelihood does not depend on them. MDPO adds its per-step
        advantages [B, T], by which its estimator chooses the steps it replays."""
        del advantages
        return dict(records)

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError


BASELINES: Registry[type[Baseline]] = Registry(
    "baseline", "baselines", builtins=["stabledrl_bench.baselines"], check=subclass_check(Baseline)
)
register_baseline = BASELINES.register  # the decorator a method file uses: @register_baseline("name")


def build_baseline(name: str, **overrides: Any) -> Baseline:
    """The baseline registered as ``name``, with config ``overrides`` (one error line for an unknown option)."""
    return BASELINES.get(name)(**overrides)


def training_estimator(
    baseline: Baseline,
    model: Any,
    *,
    block_length: int | None = None,
    micro_batch_size: int | None = None,
) -> Estimator:
    """The estimator ``baseline`` trains ``model`` with (:func:`bound_estimator` of its spec)."""
    return bound_estimator(baseline.estimator(), model, block_length=block_length, micro_batch_size=micro_batch_size)


def bound_estimator(
    spec: Estimator,
    model: Any,
    *,
    block_length: int | None = None,
    micro_batch_size: int | None = None,
) -> Estimator:
    """``spec`` adapted to ``model``'s attention and bound.

    Block-diffusion models get the staircase counterpart of a sequence-level ELBO (``Estimator.for_attention``);
    settings left open (SPG's masking block = the rollout's ``block_length``; the staircase block = the model's)
    are filled by ``bind``. ``micro_batch_size`` only chunks the forward pass.
    """
    estimator = spec.for_attention(model.attention)
    if micro_batch_size:
        estimator = dataclasses.replace(estimator, micro_batch_size=micro_batch_size)
    return estimator.bind(model, block_length=block_length)
