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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from stabledrl_bench.core.models.interface import DiffusionLM
from stabledrl_bench.core.registry import Registry, subclass_check
from stabledrl_bench.core.sampling import (
    DecodeSettings,
    DecodeState,
    DecodeStep,
    FullDecode,
    _block_logits64,
    _token_prob,
    generate,
)
from stabledrl_bench.errors import UserError


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


@dataclass(frozen=True)
class Feedback:
    """What the trainer answers, during a rollout, about the micro-batch's rows (rows are grouped contiguously,
    ``group_size`` completions per prompt): for a scheme that reacts to its own completions (IGPO regenerates the
    groups whose completions are all wrong). Nothing is computed until a scheme asks.

    ``correct(rows, completion_ids)``: [R] bool, whether the task's grader accepts each completion [R, L] as an answer
    to the prompt of row ``rows[r]``. ``reference(row)``: the token ids of the worked solution of row ``row``'s
    prompt, written as a completion (a :class:`~stabledrl_bench.errors.UserError` for a prompt that has none).
    """

    group_size: int
    correct: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    reference: Callable[[int], list[int]]


class RolloutScheme(ABC):
    """A way of drawing completions: ``sample`` one micro-batch (see the module docstring)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    # the scheme draws on the task's worked solutions (Feedback.reference): the trainer refuses, before any
    # rollout, a task that has none
    needs_references: ClassVar[bool] = False

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

    def sample_with_feedback(
        self,
        dlm: DiffusionLM,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        settings: DecodeSettings,
        generator: torch.Generator,
        feedback: Feedback,
    ) -> Rollout:
        """What the trainer calls: :meth:`sample`, for every scheme that does not look at its completions' grades
        (the feedback is never consulted, so nothing is graded twice)."""
        del feedback
        return self.sample(dlm, prompt_ids, prompt_mask, settings, generator)

    def settings(self) -> dict[str, Any]:
        """The scheme and its options, as run folders record them."""
        return {"name": self.name, **dataclasses.asdict(self)}  # type: ignore[call-overload]

    def check(self, settings: DecodeSettings) -> None:
        """Refuse, with one line (:class:`~stabledrl_bench.errors.UserError`), decode settings this scheme cannot
        draw with, so that a run stops before its first rollout; every setting is fine by default."""
        del settings


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


ENTROPY_EPS = 1e-8  # inside the log of the step entropies, as the official code (egspo_trainer.py line 687)
SELECTIONS = ("high_entropy", "uniform", "random")


def require_exact_llada(settings: DecodeSettings, scheme: str, records: str) -> None:
    """Refuse decode settings under which a step observer cannot see the LLaDA sampler's every step: block models
    (their sampler takes no observer) and the approximate modes (a KV cache, dynamic steps, early stops).
    ``scheme`` names the rollout and its method, ``records`` what it keeps, for the message."""
    if not isinstance(settings, FullDecode):
        raise UserError(f"the {scheme} records the LLaDA sampler's {records}: it needs a full-attention model")
    if settings.approximate:
        raise UserError(f"the {scheme} needs exact decoding (budget.rollout_decode: exact)")


class _PredictionRecorder:
    """A step observer that keeps, per row and step, a full prediction of the completion: every position still
    masked in the state before the step filled with a predicted token, committed positions kept (the intermediate
    answers EGSPO and MDPO reward). Subclasses say which tokens (:meth:`predicted`)."""

    def __init__(self, rows: int, steps: int, prompt_len: int, length: int, mask_id: int, device: torch.device) -> None:
        self.prompt_len = prompt_len
        self.mask_id = mask_id
        self.predictions = torch.full((rows, steps, length), mask_id, dtype=torch.long, device=device)

    def keep(self, step: DecodeStep, tokens: torch.Tensor) -> torch.Tensor:
        """Store the prediction ``tokens`` [R, L] at the masked positions of ``step``'s state; returns that mask."""
        state = step.state[:, self.prompt_len :]
        masked = state == self.mask_id
        self.predictions[step.rows, step.index] = torch.where(masked, tokens, state)
        return masked


class _StepRecorder(_PredictionRecorder):
    """The observer of :class:`EntropySteps`: per step and row, the mean entropy of the committed tokens'
    distributions and the one-step denoised prediction of the state before the step."""

    def __init__(self, rows: int, steps: int, prompt_len: int, length: int, mask_id: int, device: torch.device) -> None:
        super().__init__(rows, steps, prompt_len, length, mask_id, device)
        self.entropy = torch.full((rows, steps), float("-inf"), dtype=torch.float64, device=device)

    def __call__(self, step: DecodeStep) -> None:
        probs = torch.softmax(step.block_logits, dim=-1)
        entropy = -(probs * torch.log(probs + ENTROPY_EPS)).sum(dim=-1)  # [R, b]
        count = step.selected.sum(dim=1)
        mean = torch.where(step.selected, entropy, 0.0).sum(dim=1) / count.clamp(min=1)
        # a step that commits nothing has no entropy to rank (the official mean over no token is NaN)
        self.entropy[step.rows, step.index] = torch.where(count > 0, mean, float("-inf"))
        logits = step.logits[:, self.prompt_len :]
        greedy = logits.argmax(dim=-1)
        if bool((greedy == self.mask_id).any()):  # MASK is never an output (as in the sampler): the runner-up
            fix = greedy == self.mask_id
            scores = logits[fix].clone()
            scores[:, self.mask_id] = float("-inf")
            greedy[fix] = scores.argmax(dim=-1)
        self.keep(step, greedy)


class _SampledRecorder(_PredictionRecorder):
    """The observer of :class:`StepPredictions`: per step and row, the sampler's own prediction of every masked
    position (its draws in the current block, the argmax beyond it) and each predicted token's probability under
    the sampling distribution softmax(logits / tau) (softmax(logits) at tau = 0), MASK excluded."""

    def __init__(
        self,
        rows: int,
        steps: int,
        prompt_len: int,
        length: int,
        mask_id: int,
        temperature: float,
        device: torch.device,
    ) -> None:
        super().__init__(rows, steps, prompt_len, length, mask_id, device)
        self.temperature = temperature
        self.confidence = torch.zeros((rows, steps, length), dtype=torch.float64, device=device)

    def __call__(self, step: DecodeStep) -> None:
        masked = step.state[:, self.prompt_len :] == self.mask_id
        scores = _block_logits64(step.logits[:, self.prompt_len :][masked], self.mask_id)  # [N, V]
        if self.temperature > 0:
            scores = scores / self.temperature
        tokens = torch.full(masked.shape, self.mask_id, dtype=torch.long, device=masked.device)
        tokens[masked] = scores.argmax(dim=-1)
        block = slice(step.span.start - self.prompt_len, step.span.stop - self.prompt_len)
        tokens[:, block] = step.tokens  # the sampler's draws (its argmax at tau = 0)
        self.keep(step, tokens)
        confidence = torch.zeros(masked.shape, dtype=torch.float64, device=masked.device)
        confidence[masked] = _token_prob(scores, tokens[masked])
        self.confidence[step.rows, step.index] = confidence


@ROLLOUTS.register("entropy_steps")
@dataclass(frozen=True)
class EntropySteps(RolloutScheme):
    """EGSPO's rollout (``vishnutez/egspo-dllm-rl: egspo/egspo_trainer.py``): the LLaDA sampler, recording at
    every step the entropies of the distributions its committed tokens were drawn from and the one-step denoised
    prediction of the state it started from; then ``num_steps`` steps are chosen per completion.

    Records (docs/rollouts.md#entropy_steps), per row: ``entropy`` [T] the mean over the step's committed tokens of
    H(p) = -sum_v p_v log(p_v + 1e-8), p the untempered softmax of the logits (``generate`` lines 279-342 and
    ``_get_high_entropy_time_steps`` lines 675-715); ``steps`` [K] the chosen steps; ``predictions`` [K, L] the
    one-step prediction at each chosen step: every masked position of the state filled with the argmax of that
    step's logits, committed positions kept (``x0_greedy``, lines 272-275; the trainer rewards them). ``selection``
    (``logps_eval_time_steps_mode``, lines 742-758): ``high_entropy`` the K steps of highest entropy, highest first
    (ties: the earlier step); ``uniform`` linspace(0, T-2, K-1) then T-1; ``random`` K-1 uniform draws in
    [0, T-2] shared by the micro-batch (from its generator), then T-1. The extra cost is a softmax over each block
    and an argmax over each forward, no extra forward.
    """

    description: ClassVar[str] = "the LLaDA sampler recording step entropies and one-step predictions (EGSPO)"
    num_steps: int = 8  # K: logps_eval_num_steps
    selection: str = "high_entropy"  # logps_eval_time_steps_mode

    def __post_init__(self) -> None:
        if isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise UserError(f"entropy_steps: num_steps must be a positive integer, got {self.num_steps!r}")
        if self.selection not in SELECTIONS:
            raise UserError(f"entropy_steps: selection must be one of {', '.join(SELECTIONS)}, got {self.selection!r}")

    def check(self, settings: DecodeSettings) -> None:
        require_exact_llada(settings, "entropy_steps rollout (EGSPO)", "one-step predictions")
        if self.num_steps > settings.steps:
            raise UserError(f"entropy_steps: num_steps={self.num_steps} exceeds the {settings.steps} sampler steps")

    def sample(self, dlm, prompt_ids, prompt_mask, settings, generator) -> Rollout:
        self.check(settings)
        length = settings.max_completion_length
        recorder = _StepRecorder(
            prompt_ids.shape[0], settings.steps, prompt_ids.shape[1], length, dlm.mask_id, prompt_ids.device
        )
        out = generate(dlm, prompt_ids, prompt_mask, settings, generator=generator, observer=recorder)
        steps = self.choose(recorder.entropy, generator)
        index = steps[:, :, None].expand(-1, -1, length)
        records = {"entropy": recorder.entropy, "steps": steps, "predictions": recorder.predictions.gather(1, index)}
        return Rollout(out.completion_ids, out.unmask_step, out.nfe, records)

    def choose(self, entropy: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The K chosen steps of every row [rows, K] from the step entropies [rows, T] (the class docstring)."""
        rows, total = entropy.shape
        k, device = self.num_steps, entropy.device
        if self.selection == "high_entropy":
            return torch.argsort(entropy, dim=1, descending=True, stable=True)[:, :k]
        if self.selection == "uniform":
            early = torch.linspace(0, total - 2, k - 1).long()
        else:
            early = torch.randint(0, max(total - 1, 1), (k - 1,), generator=generator, device=generator.device).cpu()
        last = torch.full((1,), total - 1, dtype=torch.long)
        return torch.cat((early, last)).to(device).expand(rows, k).clone()


class _TokenEntropyRecorder:
    """The observer of :class:`TokenEntropies`: at every step, the entropy of the distribution each committed token
    was drawn from, kept at the token's position."""

    def __init__(self, rows: int, length: int, prompt_len: int, temperature: float, device: torch.device) -> None:
        self.prompt_len = prompt_len
        self.temperature = temperature
        self.entropy = torch.zeros((rows, length), dtype=torch.float64, device=device)

    def __call__(self, step: DecodeStep) -> None:
        # the sampler draws from softmax(l / tau) (argmax of l at tau = 0, whose distribution is softmax(l)), as the
        # official gumbel_sample divides its logits in place before generate takes their log_softmax
        scores = step.block_logits / self.temperature if self.temperature > 0 else step.block_logits
        logp = torch.log_softmax(scores, dim=-1)
        entropy = -torch.where(torch.isfinite(logp), logp.exp() * logp, 0.0).sum(dim=-1)  # [R, b]
        cols = slice(step.span.start - self.prompt_len, step.span.stop - self.prompt_len)
        kept = self.entropy[step.rows, cols]
        self.entropy[step.rows, cols] = torch.where(step.selected, entropy, kept)


@ROLLOUTS.register("token_entropies")
@dataclass(frozen=True)
class TokenEntropies(RolloutScheme):
    """AGRPO's rollout (``probablyabot/agrpo: generate.py``, lines 65-84): the LLaDA sampler, recording for every
    committed token the entropy of the distribution it was drawn from, which AGRPO's ``importance_sampling:
    entropy`` sums per step to draw its training steps (``trace_sample``).

    Record (docs/rollouts.md#token_entropies): ``token_entropy`` [rows, L] float64, at each position
    H = -sum_v p_v log p_v (terms with p_v = 0 count 0) for p = softmax(l / tau), the tempered distribution the
    sampler drew the token from (tau = 0: softmax(l)), MASK excluded; 0 at positions the sampler never committed.
    The official ``generate`` computes it from ``log_softmax`` of the logits ``gumbel_sample`` divided by the
    temperature (and filtered by its top-k / top-p, which this harness's LLaDA sampler does not apply). No extra
    forward: a log-softmax over the block at every step.
    """

    description: ClassVar[str] = "the LLaDA sampler recording each committed token's entropy (AGRPO)"

    def check(self, settings: DecodeSettings) -> None:
        require_exact_llada(settings, "token_entropies rollout (AGRPO)", "token entropies")

    def sample(self, dlm, prompt_ids, prompt_mask, settings, generator) -> Rollout:
        self.check(settings)
        assert isinstance(settings, FullDecode)
        rows, prompt_len = prompt_ids.shape
        recorder = _TokenEntropyRecorder(
            rows, settings.max_completion_length, prompt_len, settings.temperature, prompt_ids.device
        )
        out = generate(dlm, prompt_ids, prompt_mask, settings, generator=generator, observer=recorder)
        return Rollout(out.completion_ids, out.unmask_step, out.nfe, {"token_entropy": recorder.entropy})


@ROLLOUTS.register("step_predictions")
@dataclass(frozen=True)
class StepPredictions(RolloutScheme):
    """MDPO's rollout (``autonomousvision/mdpo: src/mdlm_generation_utils.py: diffusion_generate``, lines 56-130):
    the LLaDA sampler, recording at every step T the full prediction of the completion it made and how probable
    each predicted token was; the trainer rewards every prediction, MDPO's advantages rank the steps.

    Records (docs/rollouts.md#step_predictions), per row: ``predictions`` [T, L] at step s every position masked in
    the state before s filled with the sampler's prediction x0 (its draw inside the current block, argmax(logits)
    beyond it), committed positions kept (``intermediate_results``, lines 83-102); ``confidence`` [T, L] at those
    masked positions the probability of x0 under softmax(logits / tau), or softmax(logits) at tau = 0
    (``intermediate_confidence``, lines 75-85, ``rcr=False``), 0 elsewhere. MASK is excluded from the vocabulary,
    as in the sampler. The prediction of the last step is the completion. ``train_steps`` only lets :meth:`check`
    refuse a sampler with fewer steps than the method trains on. No extra forward: a softmax over the
    still-masked positions at each step.
    """

    description: ClassVar[str] = (
        "the LLaDA sampler recording its full prediction and its probabilities at every step (MDPO)"
    )
    train_steps: int = 1  # K: the steps its method trains on, at most the sampler's (sample_train_steps)

    def __post_init__(self) -> None:
        if isinstance(self.train_steps, bool) or not isinstance(self.train_steps, int) or self.train_steps < 1:
            raise UserError(f"step_predictions: train_steps must be a positive integer, got {self.train_steps!r}")

    def check(self, settings: DecodeSettings) -> None:
        require_exact_llada(settings, "step_predictions rollout (MDPO)", "predictions at every step")
        if self.train_steps > settings.steps:
            raise UserError(
                f"step_predictions: train_steps={self.train_steps} exceeds the {settings.steps} sampler steps"
            )

    def sample(self, dlm, prompt_ids, prompt_mask, settings, generator) -> Rollout:
        self.check(settings)
        assert isinstance(settings, FullDecode)
        recorder = _SampledRecorder(
            prompt_ids.shape[0],
            settings.steps,
            prompt_ids.shape[1],
            settings.max_completion_length,
            dlm.mask_id,
            settings.temperature,
            prompt_ids.device,
        )
        out = generate(dlm, prompt_ids, prompt_mask, settings, generator=generator, observer=recorder)
        records = {"predictions": recorder.predictions, "confidence": recorder.confidence}
        return Rollout(out.completion_ids, out.unmask_step, out.nfe, records)


@ROLLOUTS.register("eoser_ass")
@dataclass(frozen=True)
class EoserAss(RolloutScheme):
    """CJ-GRPO's rollout (``yjyddq/EOSER-ASS-RL`` at ``5affb4e``, ``cj-grpo/cj_grpo_trainer_eoser_ass.py``:
    ``reversed_process`` lines 392-493, ``ass_sampling`` 329-345, ``get_block_sizes`` 347-390,
    ``get_num_transfer_tokens_ass`` 531-556): the LLaDA sampler with the authors' ascending step sizes (ASS) and EOS
    early rejection (EOSER), every completion decoded on its own.

    ``schedule="ascending"`` (ASS): the canvas of L tokens is one block decoded in S = floor(log2 L) steps, step i
    committing 2^i tokens and the last one the rest (:func:`~stabledrl_bench.core.sampling.ascending_schedule`; L
    256: 1, 2, 4, ..., 64, then 129); the budget must say so (``block_length`` = L, ``diffusion_steps`` = S), as the
    official ``get_block_sizes`` asserts ``log2(gen_length) == steps`` (line 350). ``schedule="linear"`` keeps the
    budget's even split of the steps (``cj_grpo_trainer_eoser.py``, the EOSER-only trainer). Either way the canvas
    is one block, as every trainer of the authors' asserts (``block_num <= steps`` with ``block_num`` 1 here;
    ``cj_grpo_trainer_eoser.py`` line 304).
    EOSER: the confidence of a drawn EOS is multiplied by a factor rising from ``eos_min_gamma`` to
    ``eos_max_gamma`` over the steps (:func:`~stabledrl_bench.core.sampling.eos_factors`), so EOS is committed
    late; both 1 is ASS alone (``cj_grpo_trainer_ass.py``). Defaults: ``train.yaml`` lines 74-75 (0.01 and 1).

    The sampler records each token's step as always (``unmask_step``), so CJ-GRPO's replay (``trace_replay``) takes
    the state before every step with its variable quota; no other record. Same cost as the shared sampler: S forward
    passes (8 for 256 tokens instead of the semi-autoregressive recipe's 128).
    """

    description: ClassVar[str] = (
        "the LLaDA sampler with CJ-GRPO's ascending step sizes and EOS early rejection (EOSER-ASS)"
    )
    schedule: str = "ascending"  # ASS; "linear": the budget's steps evenly (EOSER alone)
    eos_min_gamma: float = 0.01  # EOS's confidence factor at the first step (train.yaml line 74)
    eos_max_gamma: float = 1.0  # ... rising to this one at the last (line 75)

    def decode(self, settings: DecodeSettings) -> FullDecode:
        """The budget's decode settings with this scheme's rules; refuses (one line) what cannot carry them."""
        if not isinstance(settings, FullDecode):
            raise UserError(
                "the eoser_ass rollout (CJ-GRPO) is a rule of the LLaDA sampler: it needs a full-attention model"
            )
        if settings.block_length != settings.max_completion_length:
            raise UserError(
                f"eoser_ass rollout: CJ-GRPO's authors decode the canvas as one block: block_length must be "
                f"max_completion_length ({settings.max_completion_length}), got {settings.block_length}"
            )
        rules = {"schedule": self.schedule, "eos_min_gamma": self.eos_min_gamma, "eos_max_gamma": self.eos_max_gamma}
        try:
            return dataclasses.replace(settings, **rules)
        except UserError as exc:
            raise UserError(f"eoser_ass rollout: {exc}") from None

    def check(self, settings: DecodeSettings) -> None:
        self.decode(settings)

    def sample(self, dlm, prompt_ids, prompt_mask, settings, generator) -> Rollout:
        out = generate(dlm, prompt_ids, prompt_mask, self.decode(settings), generator=generator)
        return Rollout(out.completion_ids, out.unmask_step, out.nfe)


def tree_bounds(steps: int, contraction: int) -> list[int]:
    """The global steps at which a rollout tree branches, with 0 and ``steps``: int(k T / s) for k = 0..s, sorted and
    deduplicated (``THU-BPM/d-TreeRPO: dtreerpo/dtreerpo_trainer.py`` at ``3eb6f21``, lines 273-276, which counts
    the same points down from T as the steps still to run)."""
    return sorted({int(k * steps / contraction) for k in range(contraction + 1)})


@dataclass(frozen=True)
class TreeRecords:
    """A typed view of the records of a :class:`TreeBranches` rollout, one row per leaf (completion).

    A tree of depth D (``steps``: the branch steps u_0 = 0 < u_1 < ... < u_D = T) has n_0 = 1 root per prompt,
    n_1 = N children of the root and n_d = N b^(d-1) nodes at depth d; the leaves (d = D) are the completions, in
    the order of their branch digits (k_1, ..., k_D), so that a node's leaves are consecutive rows. The node at depth
    d is the partial decode before step u_d; it is *owned* by the first leaf under it (all later digits 0), whose
    decode went through it: its partial state is that leaf's tokens committed at a step < u_d, MASK elsewhere
    (:meth:`state`). Tensors (``records``): ``tree_steps`` [B, D+1] the branch steps; ``tree_node`` [B, D+1] the
    owner (index in the prompt's leaves) of each node on the row's path, root to leaf (the parent/child links: the
    parent of the node at depth d is the node at depth d-1 of the same row); ``tree_parent`` [B, D] the parent slot
    (0 .. P-1, the P = n_0 + ... + n_(D-1) internal nodes of a prompt, depth-major) of the transition into depth d;
    ``tree_order`` [B, P] the order in which the parents' transitions are trained (the same on every row).
    """

    steps: torch.Tensor  # [D+1] long
    node: torch.Tensor  # [B, D+1] long
    parent: torch.Tensor  # [B, D] long
    order: torch.Tensor  # [P] long

    @classmethod
    def of(cls, records: Mapping[str, Any]) -> TreeRecords:
        """The view of ``records``; one error line when a tree record is missing (another scheme drew them)."""
        names = ("tree_steps", "tree_node", "tree_parent", "tree_order")
        missing = [name for name in names if records.get(name) is None]
        if missing:
            raise UserError(f"records {', '.join(missing)} missing: they are recorded by the tree_branches rollout")
        steps, node, parent, order = (records[name].long() for name in names)
        return cls(steps[0], node, parent, order[0])

    @property
    def depth(self) -> int:
        return self.steps.shape[0] - 1

    def owned(self) -> torch.Tensor:
        """[B, D] bool: the row owns the node at depth d (d = 1..D), hence trains the transition into it."""
        return self.node[:, 1:] == self.node[:, -1:]

    def state(self, completion_ids: torch.Tensor, unmask_step: torch.Tensor, depth: int, mask_id: int) -> torch.Tensor:
        """[B, L] the partial state of each row's node at ``depth``: its tokens committed before step u_depth."""
        return torch.where(unmask_step < self.steps[depth], completion_ids, mask_id)


def _branch_generator(generator: torch.Generator) -> torch.Generator:
    """A new random stream for one branch, seeded by a draw of ``generator`` (on its device)."""
    seed = int(torch.randint(2**62, (1,), generator=generator, device=generator.device))
    return torch.Generator(device=generator.device).manual_seed(seed)


@ROLLOUTS.register("tree_branches")
@dataclass(frozen=True)
class TreeBranches(RolloutScheme):
    """d-TreeRPO's rollout (``THU-BPM/d-TreeRPO: dtreerpo/dtreerpo_trainer.py`` at ``3eb6f21``, the tree search of
    ``_perform_tree_search_and_compute_advantages`` lines 262-316 and ``_generate_partial`` lines 506-642): the
    LLaDA sampler is stopped at the branch steps u_1 < ... < u_(D-1) (:func:`tree_bounds`, ``contraction_factor``
    s) and each partial state is continued ``branch_factor`` b times (``num_tree_samples`` N times from the all-MASK
    root), so that every prompt's N b^(D-1) completions are the leaves of one tree (:class:`TreeRecords`).

    Each branch decodes with its own random stream: the k-th child of a node (k >= 1; every child of the root) with
    a generator seeded by a draw of the rollout generator (in the order the branches are started: the root's, then,
    first in first out, those of the nodes each decode went through); the first child (k = 0) of an inner node
    continues the stream of the decode that made the node (``DecodeState.generator``), so the decode that reached a
    node, run on to the end, *is* its first child and no forward is spent twice (every transition is decoded once,
    as in the official loop). A decode covers all the prompts of the micro-batch (a node holds every prompt, as the
    official node's batch does). Resuming is bitwise the uninterrupted sampler, and the official
    ``_generate_partial`` re-derives a block's transfer quota from the masked count and the block's remaining steps,
    which equals the quota the uninterrupted schedule gives those steps. The order in which the parents' transitions
    are trained is a permutation drawn last from the rollout generator (``random.shuffle``, line 664).

    Rows: the micro-batch's prompts repeated N b^(D-1) times (``num_generations``), each group's rows the leaves in
    branch-digit order. ``nfe``: the forwards of every decode, over the rows (rounded up). Full-attention models with
    exact decoding only (the resumable sampler's); at least s sampler steps (so that the depth is s).
    """

    description: ClassVar[str] = "a tree of LLaDA decodes that branch at scheduled steps (d-TreeRPO)"
    num_tree_samples: int = 1  # N: children of the root (num_tree_samples)
    branch_factor: int = 2  # b: children of every inner node (tree_branch_factor)
    contraction_factor: int = 4  # s: branch steps at T / s, 2T / s, ... (tree_contraction_factor)

    def __post_init__(self) -> None:
        for name in ("num_tree_samples", "branch_factor", "contraction_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"tree_branches: {name} must be a positive integer, got {value!r}")

    @property
    def leaves(self) -> int:
        """Completions per prompt: N b^(s-1)."""
        return self.num_tree_samples * self.branch_factor ** (self.contraction_factor - 1)

    def widths(self, depth: int) -> list[int]:
        """Nodes per prompt at each depth 0..D: 1, N, N b, ..., N b^(D-1)."""
        return [1] + [self.num_tree_samples * self.branch_factor ** (d - 1) for d in range(1, depth + 1)]

    def records(self, rows: int, bounds: list[int], order: torch.Tensor) -> dict[str, torch.Tensor]:
        """The tree records (:class:`TreeRecords`) of ``rows`` leaves, each prompt's in tree order, for the branch
        steps ``bounds`` and the parents' training ``order`` [P] (on its device)."""
        depth = len(bounds) - 1
        widths = self.widths(depth)
        leaves = widths[-1]
        span = [leaves // n for n in widths]
        local = torch.arange(leaves, device=order.device)
        node = torch.stack([local // s * s for s in span], dim=1)  # [leaves, D+1] owners
        slots = [sum(widths[:d]) for d in range(depth)]
        parent = torch.stack([slots[d] + local // span[d] for d in range(depth)], dim=1)
        return {
            "tree_steps": torch.tensor(bounds, device=order.device).repeat(rows, 1),
            "tree_node": node.repeat(rows // leaves, 1),
            "tree_parent": parent.repeat(rows // leaves, 1),
            "tree_order": order.repeat(rows, 1),
        }

    def check(self, settings: DecodeSettings) -> None:
        require_exact_llada(settings, "tree_branches rollout (d-TreeRPO)", "partial decodes")
        if settings.steps < self.contraction_factor:
            raise UserError(
                f"tree_branches: contraction_factor={self.contraction_factor} exceeds the {settings.steps} sampler "
                "steps (the tree would have fewer levels than branch points)"
            )

    def sample(self, dlm, prompt_ids, prompt_mask, settings, generator) -> Rollout:
        self.check(settings)
        rows, leaves = prompt_ids.shape[0], self.leaves
        prompts, masks = prompt_ids[::leaves], prompt_mask[::leaves]
        if rows % leaves or not torch.equal(prompts.repeat_interleave(leaves, dim=0), prompt_ids):
            raise UserError(
                f"tree_branches: each prompt must come {leaves} times in a row (num_generations = N b^(s-1) = {leaves})"
            )
        bounds = tree_bounds(settings.steps, self.contraction_factor)
        depth = len(bounds) - 1
        span = [leaves // n for n in self.widths(depth)]  # leaves under a node at depth d
        completion = torch.empty((rows, settings.max_completion_length), dtype=torch.long, device=prompt_ids.device)
        unmask_step = torch.empty_like(completion)
        group_rows = torch.arange(rows // leaves, device=prompt_ids.device) * leaves
        forwards = 0
        # (the state to resume, its depth, the first leaf of the branch, the branch's stream)
        pending: list[tuple[DecodeState | None, int, int, torch.Generator]] = [
            (None, 0, k * span[1], _branch_generator(generator)) for k in range(self.num_tree_samples)
        ]
        while pending:
            start, level, leaf, stream = pending.pop(0)
            out = generate(dlm, prompts, masks, settings, stream, start=start, snapshots=bounds[level + 1 : depth])
            completion[group_rows + leaf], unmask_step[group_rows + leaf] = out.completion_ids, out.unmask_step
            forwards += out.nfe
            for inner in range(level + 1, depth):  # the inner nodes this decode went through, each branching
                state = out.states[bounds[inner]]
                for k in range(1, self.branch_factor):
                    pending.append((state, inner, leaf + k * span[inner + 1], _branch_generator(generator)))
        parents = sum(self.widths(depth)[:depth])
        order = torch.randperm(parents, generator=generator, device=generator.device).to(prompt_ids.device)
        records = self.records(rows, bounds, order)
        return Rollout(completion, unmask_step, -(-forwards // leaves), records)


FREE_TAIL = 30  # the canvas's last tokens never hold a hint (generate.py lines 501-503)
MAX_STRETCH = 1.5  # the hints' spacing is stretched by at most this factor, never shrunk (lines 522-524)


@ROLLOUTS.register("hint_injection")
@dataclass(frozen=True)
class HintInjection(RolloutScheme):
    """IGPO's rollout (``facebookresearch/igpo`` at ``e85eaea``: ``trainer_igpo.py:
    _generate_and_score_completions`` lines 1377-1682; ``utils/generate.py: generate_inpainting`` lines 727-922 and
    ``create_spacing_scaled_inpainting_sequence`` lines 472-724): every completion decoded by the budget's sampler;
    then each group whose completions the grader all rejects is decoded again with fragments of the prompt's worked
    solution fixed in the canvas, and up to ``max_replacements`` of the hinted completions the grader accepts take
    the places of the group's first completions. Why: a group that is all wrong has zero advantage everywhere and
    teaches nothing; a correct hinted completion gives it a signal (arXiv 2509.10396).

    Hints of one row (its ratio r): the worked solution's tokens, cut to the canvas less its last 30 positions, are
    split into chunks of ``randint(min_chunk_size, max_chunk_size)`` tokens (a shorter remainder is dropped);
    ``int(chunks * (1 - r))`` chunks drawn at random are hidden, the others (and the last chunk, with
    ``reveal_last_chunk``) are placed in order, the first at int(start * s) and each next after the previous one
    with the original gap stretched, int(gap * s) capped at ``max_spacing``, s = clamp(usable / length, 1, 1.5);
    a chunk running past the usable positions is cut and the rest dropped. The ratios of a group's G rows are G
    draws of U[ratio_low, ratio_high), sorted ascending (lines 1448-1470). The hinted rows decode from that canvas
    (``sampling.DecodeState`` at step 0) with the sampler's every rule, each block's transfer quota spread over its
    still-masked positions only, as ``get_num_transfer_tokens`` of the masked count does (lines 848-858).
    Replacement (lines 1557-1606): of the hinted rows the grader accepts, ``max_replacements`` at random (all if
    fewer) replace rows 0, 1, ... of the group, hints and all; the group's other rows stay as first decoded.

    Records (docs/rollouts.md#hint_injection), per row: ``hint_mask`` [L] bool, the positions holding an injected
    token (all False for a completion the sampler decoded alone); ``hinted`` bool, the row is a hinted completion.
    Random numbers, from the micro-batch's generator in this order: the first decode, every wrong group's ratios,
    every hinted row's chunks and hidden chunks (row order), the hinted decode, the replacements' choices (the
    official code draws them from Python's and torch's global generators). ``nfe`` adds the hinted decode's.
    """

    description: ClassVar[str] = (
        "the budget's sampler; groups whose completions are all wrong re-decoded with hints from the worked "
        "solution fixed in the canvas (IGPO)"
    )
    needs_references: ClassVar[bool] = True
    ratio_low: float = 0.1  # inpaint_chunk_ratio_low (utils/diffu_grpo_config.py line 520)
    ratio_high: float = 0.5  # inpaint_chunk_high_initial_ratio (line 526)
    min_chunk_size: int = 4  # line 471
    max_chunk_size: int = 8  # line 475
    max_spacing: int = 100  # line 483
    max_replacements: int = 1  # line 510
    # create_spacing_scaled_inpainting_sequence's default (line 484): generate_inpainting passes no value, so the
    # config's inpaint_last_chunk_end (False, line 493) is never read
    reveal_last_chunk: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.ratio_low <= self.ratio_high <= 1:
            raise UserError(
                f"hint_injection: need 0 < ratio_low <= ratio_high <= 1, got {self.ratio_low} and {self.ratio_high}"
            )
        for name in ("min_chunk_size", "max_chunk_size", "max_replacements"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"hint_injection: {name} must be a positive integer, got {value!r}")
        if self.max_chunk_size < self.min_chunk_size:
            raise UserError("hint_injection: max_chunk_size must be at least min_chunk_size")
        if isinstance(self.max_spacing, bool) or not isinstance(self.max_spacing, int) or self.max_spacing < 0:
            raise UserError(f"hint_injection: max_spacing must be a non-negative integer, got {self.max_spacing!r}")

    def check(self, settings: DecodeSettings) -> None:
        if not isinstance(settings, FullDecode):
            raise UserError(
                "the hint_injection rollout (IGPO) resumes the LLaDA sampler from a hinted canvas: it needs a "
                "full-attention model"
            )
        if settings.approximate:
            raise UserError("the hint_injection rollout (IGPO) needs exact decoding (budget.rollout_decode: exact)")

    def sample(self, dlm, prompt_ids, prompt_mask, settings, generator) -> Rollout:
        raise UserError(
            "the hint_injection rollout (IGPO) grades its completions as it draws them: it needs the trainer's "
            "feedback (sample_with_feedback)"
        )

    def sample_with_feedback(self, dlm, prompt_ids, prompt_mask, settings, generator, feedback) -> Rollout:
        self.check(settings)
        out = generate(dlm, prompt_ids, prompt_mask, settings, generator=generator)
        size = feedback.group_size
        rows, length = out.completion_ids.shape
        wrong = all_wrong_groups(feedback.correct(torch.arange(rows), out.completion_ids), size)
        completion_ids, unmask_step, nfe = out.completion_ids.clone(), out.unmask_step.clone(), out.nfe
        hint_mask = torch.zeros((rows, length), dtype=torch.bool, device=completion_ids.device)
        hinted_rows = torch.zeros(rows, dtype=torch.bool, device=completion_ids.device)
        redo = (wrong[:, None] * size + torch.arange(size)).flatten()
        if len(redo):
            ratios = [r for _ in wrong.tolist() for r in self.ratios(size, generator)]
            canvases, hints = zip(
                *(
                    self.hint_canvas(feedback.reference(row), length, ratio, dlm.mask_id, generator)
                    for row, ratio in zip(redo.tolist(), ratios, strict=True)
                ),
                strict=True,
            )
            canvas = torch.stack(canvases).to(prompt_ids.device)
            start = DecodeState(torch.cat((prompt_ids[redo], canvas), dim=1), torch.full_like(canvas, -1), 0, None)
            hinted = generate(dlm, prompt_ids[redo], prompt_mask[redo], settings, generator=generator, start=start)
            nfe += hinted.nfe
            accepted = feedback.correct(redo, hinted.completion_ids).view(-1, size)
            for g, group in enumerate(wrong.tolist()):
                for i, local in enumerate(self.replacements(accepted[g], generator)):
                    source, target = g * size + local, group * size + i
                    completion_ids[target] = hinted.completion_ids[source]
                    unmask_step[target] = hinted.unmask_step[source]
                    hint_mask[target] = hints[source].to(hint_mask.device)
                    hinted_rows[target] = True
        return Rollout(completion_ids, unmask_step, nfe, {"hint_mask": hint_mask, "hinted": hinted_rows})

    def ratios(self, size: int, generator: torch.Generator) -> list[float]:
        """One group's hint ratios: ``size`` draws of U[ratio_low, ratio_high) in float32, ascending (lines
        1459-1470)."""
        u = torch.rand(size, generator=generator, device=generator.device).cpu()
        return (u * (self.ratio_high - self.ratio_low) + self.ratio_low).sort().values.tolist()

    def chunks(self, count: int, generator: torch.Generator) -> list[tuple[int, int]]:
        """The worked solution's first ``count`` tokens cut into consecutive chunks (lines 552-564)."""
        out: list[tuple[int, int]] = []
        start = 0
        while start < count:
            drawn = torch.randint(
                self.min_chunk_size, self.max_chunk_size + 1, (1,), generator=generator, device=generator.device
            )
            size = min(int(drawn), count - start)
            if size < self.min_chunk_size:  # a short remainder is hard to fill in: dropped (lines 559-562)
                break
            out.append((start, start + size))
            start += size
        return out

    def hint_canvas(
        self, reference: list[int], length: int, ratio: float, mask_id: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One row's completion canvas [L] (MASK but for the hints) and its hint mask [L] bool, from the worked
        solution's token ids and the row's hint ratio (the class docstring; lines 501-640)."""
        tokens = torch.full((length,), mask_id, dtype=torch.long)
        hint = torch.zeros(length, dtype=torch.bool)
        usable = max(0, length - FREE_TAIL)
        if not reference or usable == 0:
            return tokens, hint
        stretch = min(MAX_STRETCH, max(1.0, usable / len(reference)))
        kept = reference[:usable]
        chunks = self.chunks(len(kept), generator)
        hidden_count = int(len(chunks) * (1 - ratio))
        hidden: set[int] = set()
        if hidden_count > 0:
            hidden = set(
                torch.randperm(len(chunks), generator=generator, device=generator.device)[:hidden_count].tolist()
            )
        last = len(chunks) - 1
        shown = [c for k, c in enumerate(chunks) if k not in hidden or (self.reveal_last_chunk and k == last)]
        for (lo, _), (start, end) in zip(shown, place_chunks(shown, usable, stretch, self.max_spacing), strict=False):
            tokens[start:end] = torch.tensor(kept[lo : lo + end - start])
            hint[start:end] = True
        return tokens, hint

    def replacements(self, accepted: torch.Tensor, generator: torch.Generator) -> list[int]:
        """Which of a group's hinted rows (``accepted`` [G] bool: the grader's verdicts) replace its rows 0, 1, ...:
        all accepted ones up to ``max_replacements``, beyond that a random choice in random order (lines
        1573-1585)."""
        correct = accepted.nonzero().flatten().cpu()
        if len(correct) > self.max_replacements:
            order = torch.randperm(len(correct), generator=generator, device=generator.device).cpu()
            correct = correct[order[: self.max_replacements]]
        return correct.tolist()


def place_chunks(shown: list[tuple[int, int]], usable: int, stretch: float, max_spacing: int) -> list[tuple[int, int]]:
    """Where the shown chunks [lo, hi) of a worked solution go in the canvas, [start, end) each, in order
    (``scale_chunk_positions``, generate.py lines 671-724, and the placement, lines 613-637): the first at
    int(lo * stretch), each next one after the previous one's end with the original gap stretched, int(gap *
    stretch), capped at ``max_spacing``; a chunk running past ``usable`` is cut there; a chunk starting at or
    beyond it, and every later one, is dropped (so fewer places than chunks may come back)."""
    placed: list[tuple[int, int]] = []
    end = 0
    for k, (lo, hi) in enumerate(shown):
        start = int(lo * stretch) if k == 0 else end + min(int((lo - shown[k - 1][1]) * stretch), max_spacing)
        if start >= usable:
            break
        end = min(start + hi - lo, usable)
        placed.append((start, end))
    return placed


def all_wrong_groups(correct: torch.Tensor, size: int) -> torch.Tensor:
    """The groups [n] (long, ascending) none of whose ``size`` completions the grader accepts: ``correct`` [rows]
    bool, rows grouped contiguously (IGPO's trigger, ``trainer_igpo.py`` lines 1281-1286 and 1420-1422)."""
    return (~correct.bool().view(-1, size)).all(dim=1).nonzero().flatten().cpu()


__all__ = [
    "ROLLOUTS",
    "EntropySteps",
    "EoserAss",
    "Feedback",
    "HintInjection",
    "Independent",
    "Rollout",
    "RolloutScheme",
    "StepPredictions",
    "TokenEntropies",
    "TreeBranches",
    "TreeRecords",
    "all_wrong_groups",
    "place_chunks",
    "tree_bounds",
]
