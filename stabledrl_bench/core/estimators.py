"""Likelihood estimators for masked diffusion LMs (data types; implementations follow below them).

Every RL method for dLLMs needs log pi(y|x), which a masked diffusion model cannot compute exactly; each method
uses a different Monte-Carlo proxy. They share one interface so baselines can be compared on equal terms:

* ``draw(batch, generator) -> Noise``: all randomness (masks, mask counts, chosen blocks), from an explicit
  ``torch.Generator``;
* ``evaluate(model, batch, noise) -> Estimate``: one batched forward pass over every MC sample.

Coupled estimation (old and new policy see the same masks) is reusing one ``Noise``; independent estimation
(what the official StableDRL code does) is drawing twice.

Attention, for every estimator: a full-attention model gets a key-padding mask, so left-pad prompt keys are
never attended. This deliberately fixes d1/ESPO, which attend the pads (harmless there only because a
per-device batch holds one prompt). A block-attention model (``model.attention == "block"``) gets
:func:`~stabledrl_bench.core.masks.block_causal_mask` over ``[prompt | completion]``; the staircase-based estimators
build ``[prompt | clean | noisy]`` rows with :func:`~stabledrl_bench.core.masks.staircase_mask`. Log-probs come from
a log-softmax in float32 (float64 when the model runs in float64).

Registered estimators (``ESTIMATORS``; ``build_estimator(name, **kwargs)``):

==================  ===============================================================  ==========================
name                proxy                                                            returns
==================  ===============================================================  ==========================
``d1_one_step``     d1 mean-field one-step log-probs, prompt masked with p           token_logp [B, L]
``coupled_pair``    coupled-GRPO: a mask and its complement, plus the all-masked pass  token_logp [B, L]
``sdmc_elbo``       GDPO: Gauss-Legendre quadrature ELBO over mask ratios            elbo [B]
``spg_block``       SPG block_random masks: per-token-mean ELBO and Renyi EUBO       elbo, eubo [B] (+ tokens)
``espo_elbo``       ESPO sum-scale ELBO, stratified counts, antithetic complement     elbo [B]
``denoise_pair``    GDSD: ESPO's masks, per-sample (un)weighted denoising log-probs  elbo [B], elbo_samples [B, K]
``stratified_elbo`` BGPO: per-sequence stratified counts, 1/t-weighted ELBO samples  elbo [B], elbo_samples [B, K]
``trace_replay``    TraceRL: exact per-step log-probs along the sampler trajectory   token_logp [R, L]
``trace_sample``    AGRPO: the replay at Monte-Carlo sampled steps of the trajectory  token_logp [B K, L]
``ar_replay``       JustGRPO: the left-to-right (autoregressive) factorisation       token_logp [R, L]
``chosen_steps``    EGSPO: the replay at the steps the rollout chose per sequence     token_logp [B K, L]
``advantage_steps`` MDPO: each chosen step's full prediction at every masked position  token_logp [B K, L]
``tree_transitions`` d-TreeRPO: each tree transition on its parent's partial state  token_logp [R, L]
``igpo_one_step``   IGPO: all-MASK one-step log-probs, hints filtered by entropy      token_logp, weight [B, L]
``staircase_elbo``  block-diffusion ELBO, all blocks in one staircase pass           elbo, eubo [B] (+ tokens)
==================  ===============================================================  ==========================
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from stabledrl_bench.core.logprobs import chosen_token_logps, log_prob_dtype
from stabledrl_bench.core.masks import staircase_mask, staircase_position_ids
from stabledrl_bench.core.registry import Registry, subclass_check
from stabledrl_bench.core.rollouts import TreeRecords
from stabledrl_bench.core.sampling import _top_by_confidence
from stabledrl_bench.errors import UserError

if TYPE_CHECKING:
    from stabledrl_bench.core.models.interface import DiffusionLM


@dataclass
class SequenceBatch:
    """Prompts and completions to score; prompts are left-padded, completions have a fixed length L."""

    prompt_ids: torch.Tensor  # [B, P] long
    prompt_mask: torch.Tensor  # [B, P] bool, False at left padding
    completion_ids: torch.Tensor  # [B, L] long
    completion_mask: torch.Tensor  # [B, L] bool, True up to and including the first EOS
    unmask_step: torch.Tensor | None = None  # [B, L] long, sampler step that committed each token (TraceRL)
    # What a rollout scheme recorded beyond the completions, one row per sequence (docs/rollouts.md): e.g. the
    # sampler steps EGSPO chose and its intermediate predictions' rewards. Empty for the default scheme.
    records: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    def select(self, keep: torch.Tensor) -> SequenceBatch:
        """The rows where ``keep`` [B] bool is True (a baseline dropping whole groups keeps the rest)."""
        keep = keep.to(self.completion_ids.device)
        return SequenceBatch(
            prompt_ids=self.prompt_ids[keep],
            prompt_mask=self.prompt_mask[keep],
            completion_ids=self.completion_ids[keep],
            completion_mask=self.completion_mask[keep],
            unmask_step=None if self.unmask_step is None else self.unmask_step[keep],
            records={name: value[keep.to(value.device)] for name, value in self.records.items()},
        )


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
    # [B, K] one value per Monte-Carlo sample, whose mean over K is ``elbo``, for the losses that treat every sample
    # on its own (GDSD, BGPO); filled by the estimators that keep them.
    elbo_samples: torch.Tensor | None = None
    # [R] long: for rows that replay steps a rollout chose per sequence (EGSPO), which of its sequence's chosen steps
    # each row is, the column of the per-step advantages [B, K] it takes.
    row_column: torch.Tensor | None = None
    # [R] float: the importance weight of each row, for rows drawn from a non-uniform distribution whose loss terms
    # are reweighted to keep the uniform estimate's expectation (AGRPO's entropy rule); None: every row weighs 1.
    row_weight: torch.Tensor | None = None
    # [R, L] a weight per token of ``token_mask`` for the losses that weight their tokens (MDPO: the probability the
    # sampler gave the predicted token); None means 1.
    token_weight: torch.Tensor | None = None
    # [R] long: rows with one value were scored on one state (d-TreeRPO: the transitions out of one parent node, its
    # children), for the losses that compare such rows with each other; None: no such grouping.
    row_group: torch.Tensor | None = None
    # [R, L] long: the tokens whose log-probs ``token_logp`` holds, for the losses that compare the rows' tokens
    # (d-TreeRPO's self-distillation); None: not kept.
    token_ids: torch.Tensor | None = None

    def detach(self) -> Estimate:
        return Estimate(**{k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()})


# ====================================================================================== noise types
@dataclass
class D1Noise:
    """d1: which real prompt tokens are replaced by the mask token (the completion is always fully masked)."""

    prompt_masked: torch.Tensor  # [B, P] bool


@dataclass
class SPGNoise:
    """SPG block_random masks for m MC samples per sequence (True = replaced by the mask token)."""

    prompt_masked: torch.Tensor  # [B, m, P] bool
    completion_masked: torch.Tensor  # [B, m, L] bool (partial chosen block, later blocks, post-EOS, p-masking)
    block: torch.Tensor  # [B, m] long, the chosen (partially masked) block
    count: torch.Tensor  # [B, m] long, masked tokens inside the valid part of the chosen block


@dataclass
class ESPONoise:
    """ESPO masks: a uniformly random ``count``-subset of the L completion positions per (sequence, MC sample)."""

    masked: torch.Tensor  # [B, K, L] bool
    count: torch.Tensor  # [B, K] long, n_i = round(kappa + i (L+1)/B) mod (L+1)
    kappa: torch.Tensor  # [K] long, the stratification offset of each MC sample, U{0..L}


@dataclass
class TraceNoise:
    """TraceRL replays the recorded trajectory: there is no randomness."""


@dataclass
class TraceSampleNoise:
    """AGRPO: one uniform number per (sequence, Monte-Carlo sample), mapped to a replay step at evaluation."""

    u: torch.Tensor  # [B, K] float in [0, 1)


@dataclass
class ChosenStepsNoise:
    """EGSPO: which of each sequence's chosen steps (columns of ``records["steps"]``) this estimate replays."""

    columns: torch.Tensor  # [C] long


@dataclass
class TreeNoise:
    """d-TreeRPO: the parent nodes (slots of ``records["tree_parent"]``) whose transitions this estimate replays."""

    parents: torch.Tensor  # [C] long


@dataclass
class StratifiedNoise:
    """BGPO's masks: per sequence, ``count`` stratified over the K samples, a uniform subset of the valid tokens."""

    masked: torch.Tensor  # [B, K, L] bool
    count: torch.Tensor  # [B, K] long, in 1..l_i (l_i = valid tokens of sequence i)


@dataclass
class StaircaseNoise:
    """Masks of the noisy copy in the staircase input, drawn per (sequence, MC sample, block)."""

    masked: torch.Tensor  # [B, K, L] bool (post-EOS positions always masked)
    count: torch.Tensor  # [B, K, NB] long, U{1..valid tokens of the block}; 0 for blocks without valid tokens
    block_size: int


@dataclass
class CoupledNoise:
    """Coupled-GRPO: one mask ratio per draw and a uniform per completion position; the pair of partial masks is
    ``u < t`` and its complement ``u > t``."""

    prompt_masked: torch.Tensor  # [B, P] bool
    t: torch.Tensor  # [B] float, the mask ratio (one value per draw, as the official code draws it)
    u: torch.Tensor  # [B, L] float in [0, 1)


@dataclass
class SDMCNoise:
    """GDPO's masks: for every quadrature node and Monte-Carlo draw, an exact-count subset of the completion."""

    masked: torch.Tensor  # [B, N, L] bool, N = nodes x draws
    coefficient: torch.Tensor  # [N] float, w_n / (t_n draws): the weight of each masked row's log-probs


Noise = (
    D1Noise
    | SPGNoise
    | ESPONoise
    | TraceNoise
    | TraceSampleNoise
    | ChosenStepsNoise
    | StratifiedNoise
    | StaircaseNoise
    | CoupledNoise
    | SDMCNoise
)


# ====================================================================================== shared pieces
def _require(condition: bool, message: str) -> None:
    if not condition:
        raise UserError(message)


def _is_int(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _is_prob(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0


def _uniform(generator: torch.Generator, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """U[0, 1) in float64 from ``generator`` (drawn on the generator's device, then moved to ``device``)."""
    return torch.rand(shape, generator=generator, device=generator.device, dtype=torch.float64).to(device)


def _uniform_int(generator: torch.Generator, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Elementwise U{low..high} (inclusive; requires high >= low)."""
    u = _uniform(generator, tuple(low.shape), low.device)
    return torch.minimum(low + torch.floor(u * (high - low + 1)).long(), high)


def _random_subsets(
    generator: torch.Generator | None,
    allowed: torch.Tensor,
    count: torch.Tensor,
    group: torch.Tensor | None = None,
    uniform: torch.Tensor | None = None,
) -> torch.Tensor:
    """For every row and every group g, a uniformly random ``count[..., g]``-subset of the allowed positions of g.

    ``allowed`` [..., L] bool; ``count`` [..., G] (at most the number of allowed positions of the group);
    ``group`` [L] long (contiguous groups 0..G-1, e.g. blocks; None = one group). Random keys put the allowed
    positions of each group first in random order; a position is chosen when its rank inside its group is below
    the group's count. The keys are U[0, 1) drawn from ``generator``, or ``uniform`` (shaped like ``allowed``) when
    the caller drew them itself.
    """
    length = allowed.shape[-1]
    if group is None:
        group = torch.zeros(length, dtype=torch.long, device=allowed.device)
    if uniform is None:
        assert generator is not None
        uniform = _uniform(generator, tuple(allowed.shape), allowed.device)
    keys = group.to(torch.float64) * 4.0 + torch.where(allowed, uniform, 2.0)
    rank = keys.argsort(dim=-1).argsort(dim=-1)
    group_start = torch.searchsorted(group, group, right=False)  # first position of each position's group
    rank_in_group = rank - group_start
    per_position = count.gather(-1, group.expand(*count.shape[:-1], length))
    return allowed & (rank_in_group < per_position)


CONTENT_HASH_MODULUS = 2**31 - 1


def content_seeds(batch: SequenceBatch) -> torch.Tensor:
    """One mask seed per sequence from its own tokens: sum_p p * token_p mod (2^31 - 1), positions p = 1, 2, ...
    over the real prompt tokens followed by the scored completion tokens, [B] long.

    NeMo RL GDPO's ``make_dllm_mask_seeds`` (``research/gdpo/gdpo/elbo.py``), which the official worker computes
    from every row it scores, so a sequence gets the same masks at every evaluation (old, reference and current
    policy) however it is batched. The official row is [prompt | response | right padding]; padding enters its hash.
    Here neither padding nor the positions after the first EOS do, so a seed depends on the sequence alone.
    """
    real = torch.cat((batch.prompt_mask.bool(), batch.completion_mask.bool()), dim=1)
    tokens = torch.cat((batch.prompt_ids, batch.completion_ids), dim=1).to(torch.int64)
    positions = torch.cumsum(real.to(torch.int64), dim=1)
    return torch.remainder(torch.where(real, tokens * positions, 0).sum(dim=1), CONTENT_HASH_MODULUS)


def _content_uniform(batch: SequenceBatch, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """U[0, 1) [B, *shape] in float64, row i drawn from a generator seeded with :func:`content_seeds` of sequence i."""
    seeds = content_seeds(batch).tolist()
    rows = [_uniform(torch.Generator().manual_seed(int(seed)), shape, device) for seed in seeds]
    return torch.stack(rows) if rows else torch.zeros((0, *shape), dtype=torch.float64, device=device)


def _block_ids(length: int, block_size: int | None, device: torch.device) -> torch.Tensor:
    """Block index of each completion position (all 0 when there are no blocks)."""
    pos = torch.arange(length, device=device)
    return pos // block_size if block_size else torch.zeros_like(pos)


def spg_bounds(
    logp: torch.Tensor, member: torch.Tensor, completion_mask: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """SPG's ELBO and EUBO proxies (docs/estimators.md#spg_block) from per-token log-probs of m MC samples.

    ``logp`` [B, m, L] (log p(y^k | z_ij)), ``member`` [B, m, L] = M_ij (masked valid completion positions),
    ``completion_mask`` [B, L].

    * ELBO  E_i = (1/m) sum_j (1/|M_ij|) sum_{k in M_ij} log p(y^k | z_ij)   (no 1/t weighting);
    * EUBO  t_ij = |M_ij| / l_i,  q_ik = (1/m) sum_j 1[k in M_ij] p(y^k | z_ij)^beta / t_ij,
            U_i = (1/beta) (1/|K_i|) sum_{k in K_i} log q_ik,  K_i = {k : q_ik > 0}.

    Denominators are clamped at 1e-8 as in StableDRL's ``_get_per_seq_logps_spg``; p^beta = exp(beta log p).
    """
    dtype = logp.dtype
    weights = member.to(dtype)
    n_masked = weights.sum(-1)  # |M_ij|
    elbo = ((logp * weights).sum(-1) / n_masked.clamp(min=1e-8)).mean(-1)
    valid_len = completion_mask.to(dtype).sum(-1, keepdim=True).clamp(min=1e-8)
    t = (n_masked / valid_len).clamp(min=1e-8)  # [B, m]
    q = (torch.exp(beta * logp) * weights / t.unsqueeze(-1)).mean(1)  # [B, L]
    keep = q > 0
    log_q = torch.where(keep, q, torch.ones_like(q)).log()
    eubo = (log_q * keep).sum(-1) / keep.to(dtype).sum(-1).clamp(min=1e-8) / beta
    return elbo, eubo


# ====================================================================================== interface
@dataclass(frozen=True, kw_only=True)
class Estimator(ABC):
    """A likelihood estimator: ``draw`` all randomness, then ``evaluate`` it under a model in one batched pass.

    An estimator *is* its typed settings: a frozen dataclass whose fields are the estimator's options, validated
    on construction, so a baseline declares ``SPGBlock(num_mc=2, eubo_beta=1.5)`` instead of a name plus a dict,
    ``dataclasses.replace`` derives a variant, and :meth:`settings` is the record of what ran.
    ``micro_batch_size`` splits the rows of the forward pass into chunks (memory only; same result).
    """

    name: ClassVar[str] = ""
    micro_batch_size: int | None = None

    def __post_init__(self) -> None:
        _require(
            self.micro_batch_size is None or _is_int(self.micro_batch_size, 1),
            f"micro_batch_size must be a positive integer or None, got {self.micro_batch_size!r}",
        )

    def settings(self) -> dict[str, Any]:
        """``{"name": ..., <field>: <value>, ...}``: what a record needs to say which estimate was used."""
        return {"name": self.name, **dataclasses.asdict(self)}

    def for_attention(self, attention: str) -> Estimator:
        """The estimator to use on a model whose attention is ``"full"`` or ``"block"`` (itself by default).

        Sequence-level ELBOs over a full-attention canvas would leak later blocks into earlier ones on a
        block-diffusion model; those estimators return their staircase counterpart for ``"block"``.
        """
        del attention
        return self

    def bind(self, model: DiffusionLM, *, block_length: int | None = None) -> Estimator:
        """Fill settings left to the model or the rollout (``block_length`` = the rollout's block); itself here."""
        del model, block_length
        return self

    @abstractmethod
    def draw(self, batch: SequenceBatch, generator: torch.Generator) -> Noise:
        """Every random choice of one estimate (masks, counts, chosen blocks), from ``generator`` only."""

    def draw_for(self, batch: SequenceBatch, generator: torch.Generator, iteration: int, iterations: int) -> Noise:
        """The noise of inner iteration ``iteration`` (0-based) of ``iterations`` on one rollout.

        Every estimator draws alike at every iteration (this is :meth:`draw`), except one whose iterations take
        turns over parts of the rollout (EGSPO's chosen steps: :class:`ChosenSteps`).
        """
        del iteration, iterations
        return self.draw(batch, generator)

    @abstractmethod
    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: Noise) -> Estimate:
        """The estimate of ``batch`` under ``model`` for the given noise (gradients flow to the model)."""

    def _clean_token_logps(
        self,
        model: DiffusionLM,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        position_ids: torch.Tensor | None,
        targets: torch.Tensor,
        read_start: int,
    ) -> torch.Tensor:
        """log p(targets) [R, L] read from logits at positions read_start .. read_start+L of each row."""
        return self._token_reads(
            model,
            input_ids,
            attention,
            position_ids,
            targets.shape[1],
            read_start,
            lambda logits, rows: chosen_token_logps(logits, targets[rows]),
        )

    def _token_reads(
        self,
        model: DiffusionLM,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        position_ids: torch.Tensor | None,
        length: int,
        read_start: int,
        read: Callable[[torch.Tensor, slice], torch.Tensor],
    ) -> torch.Tensor:
        """``read(logits, rows)`` of the logits [r, L, V] at positions read_start .. read_start+L of each chunk of rows
        (``micro_batch_size`` rows at a time), concatenated over the rows: [R, L, ...]. A read that needs only the
        chosen tokens' log-probs takes them span by span (:func:`~stabledrl_bench.core.logprobs.chosen_token_logps`),
        one that needs the whole distribution (IGPO's entropies) takes the log-softmax itself."""
        rows = input_ids.shape[0]
        step = self.micro_batch_size or max(rows, 1)
        starts = list(range(0, rows, step))
        out = []
        # under FSDP every process makes the same number of passes (DiffusionLM.agreed_passes): extras count 0
        for i in range(model.agreed_passes(len(starts))):
            lo = starts[min(i, len(starts) - 1)]
            hi = min(lo + step, rows)
            pos = None if position_ids is None else position_ids[lo:hi]
            logits = model.logits(input_ids[lo:hi], attention[lo:hi], pos, keep=slice(read_start, read_start + length))
            chunk = read(logits, slice(lo, hi))
            if i < len(starts):
                out.append(chunk)
            else:
                out[-1] = out[-1] + 0 * chunk.sum()
        return torch.cat(out, dim=0)

    def _masked_copies_logps(self, model: DiffusionLM, batch: SequenceBatch, masked: torch.Tensor) -> torch.Tensor:
        """log p [B, N, L] of every clean completion token in N copies of each sequence, copy n of sequence i with
        the positions ``masked[i, n]`` replaced by the mask token (the prompt untouched); one batched pass."""
        n_seq, copies, length = masked.shape
        seq = torch.arange(n_seq, device=masked.device).repeat_interleave(copies)
        completion = torch.where(masked.flatten(0, 1), model.mask_id, batch.completion_ids[seq])
        input_ids = torch.cat((batch.prompt_ids[seq], completion), dim=1)
        attention = model.context_attention(batch.prompt_mask, length)[seq]
        logp = self._clean_token_logps(
            model, input_ids, attention, None, batch.completion_ids[seq], batch.prompt_ids.shape[1]
        )
        return logp.view(n_seq, copies, length)


ESTIMATORS: Registry[type[Estimator]] = Registry("estimator", "estimators", check=subclass_check(Estimator))


# ====================================================================================== d1
@ESTIMATORS.register("d1_one_step")
@dataclass(frozen=True, kw_only=True)
class D1OneStep(Estimator):
    """d1 / diffu-GRPO one-step mean-field estimator (docs/estimators.md#d1_one_step).

    z = [x~, M^L], where each real prompt token is replaced by M with probability ``p_mask_prompt`` and every
    completion position (all L, post-EOS included) is M; log pi^(y^k) = log softmax(f(z))_k[y^k]. One sample,
    no 1/t weighting. ``token_mask`` = completion mask (tokens up to and including the first EOS).
    """

    p_mask_prompt: float = 0.15

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(_is_prob(self.p_mask_prompt), f"p_mask_prompt must be in [0, 1], got {self.p_mask_prompt!r}")

    def draw(self, batch: SequenceBatch, generator: torch.Generator) -> D1Noise:
        u = _uniform(generator, tuple(batch.prompt_ids.shape), batch.prompt_ids.device)
        return D1Noise(prompt_masked=batch.prompt_mask.bool() & (u < self.p_mask_prompt))

    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: D1Noise) -> Estimate:
        prompt = torch.where(noise.prompt_masked, model.mask_id, batch.prompt_ids)
        completion = torch.full_like(batch.completion_ids, model.mask_id)
        attention = model.context_attention(batch.prompt_mask, batch.completion_ids.shape[1])
        logp = self._clean_token_logps(
            model, torch.cat((prompt, completion), dim=1), attention, None, batch.completion_ids, prompt.shape[1]
        )
        mask = batch.completion_mask.bool()
        return Estimate(token_logp=torch.where(mask, logp, torch.zeros_like(logp)), token_mask=mask)


@ESTIMATORS.register("igpo_one_step")
@dataclass(frozen=True, kw_only=True)
class IGPOOneStep(Estimator):
    """IGPO's likelihood with ``d1_masking`` (its published run, ``run_igpo.sh``; docs/estimators.md#igpo_one_step;
    ``facebookresearch/igpo`` at ``e85eaea``, ``trainer_igpo.py``): every timestep is T (lines 967-976), so the
    mask ratio t / T is 1 and every completion position is MASK in z = [x, M^L] (lines 988-1025; the prompt is
    never masked); log pi(y^k) = log softmax(f(z))_k[y^k] at every position (lines 1107-1140).

    ``token_mask``: all L positions, post-EOS included (the official loss counts the masked positions, not the
    completion mask, lines 681-686). ``token_weight``: 1, except at the positions a hint was injected into
    (``records["hint_mask"]``, the ``hint_injection`` rollout), where only the ``max(1, int(n * hint_keep_ratio))``
    of the row's n hint positions of highest entropy H = -sum_v p_v log(p_v + 1e-8) of the distribution there
    count (weight 1), the others 0 (lines 1764-1826; ties: the earlier position). Why: a hint token was not drawn
    by the policy, and only its most uncertain positions carry a learning signal the policy could have produced.
    The loss reads the rollout policy's weights (its ``old`` estimate), as the official filter is computed once,
    from the rollout policy's entropies. Nothing is drawn at random.
    """

    hint_keep_ratio: float = 0.2  # entropy_clipping_ratio_inpaint (diffu_grpo_config.py line 487)

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(_is_prob(self.hint_keep_ratio), f"hint_keep_ratio must be in [0, 1], got {self.hint_keep_ratio!r}")

    def draw(self, batch: SequenceBatch, generator: torch.Generator) -> D1Noise:
        del generator
        return D1Noise(prompt_masked=torch.zeros_like(batch.prompt_mask, dtype=torch.bool))

    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: D1Noise) -> Estimate:
        del noise  # the prompt is never masked
        length = batch.completion_ids.shape[1]
        z = torch.cat((batch.prompt_ids, torch.full_like(batch.completion_ids, model.mask_id)), dim=1)
        attention = model.context_attention(batch.prompt_mask, length)
        mask = torch.ones_like(batch.completion_ids, dtype=torch.bool)
        hint = batch.records.get("hint_mask")
        if hint is None:
            logp = self._clean_token_logps(model, z, attention, None, batch.completion_ids, batch.prompt_ids.shape[1])
            return Estimate(token_logp=logp, token_mask=mask)
        hint = hint.to(batch.completion_ids.device).bool()

        def read(logits: torch.Tensor, rows: slice) -> torch.Tensor:
            """The clean token's log-prob and, at the hint positions only, the entropy (0 elsewhere)."""
            logp = torch.log_softmax(logits.to(log_prob_dtype(logits.dtype)), dim=-1)
            chosen = logp.gather(-1, batch.completion_ids[rows].unsqueeze(-1)).squeeze(-1)
            entropy = torch.zeros_like(chosen)
            with torch.no_grad():
                p = logp[hint[rows]].exp()
                entropy[hint[rows]] = -(p * torch.log(p + ENTROPY_EPS)).sum(dim=-1)
            return torch.stack((chosen, entropy), dim=-1)

        reads = self._token_reads(model, z, attention, None, length, batch.prompt_ids.shape[1], read)
        weight = kept_hints(hint, reads[..., 1], self.hint_keep_ratio)
        return Estimate(token_logp=reads[..., 0], token_mask=mask, token_weight=weight.to(reads.dtype))


ENTROPY_EPS = 1e-8  # inside the log of IGPO's token entropies (trainer_igpo.py line 1124)


def kept_hints(hint: torch.Tensor, entropy: torch.Tensor, keep_ratio: float) -> torch.Tensor:
    """[R, L] bool: every position but the hint positions (``hint`` [R, L] bool) outside each row's
    ``max(1, int(n * keep_ratio))`` hint positions of highest ``entropy`` [R, L] (n: the row's hint count; ties:
    the earlier position); IGPO's filter (``trainer_igpo.py`` lines 1786-1826)."""
    count = hint.sum(dim=1)
    keep = torch.where(count > 0, (count.double() * keep_ratio).floor().long().clamp(min=1), 0)
    top = _top_by_confidence(entropy.detach().masked_fill(~hint, float("-inf")), keep)
    return ~hint | top


# ====================================================================================== coupled
@ESTIMATORS.register("coupled_pair")
@dataclass(frozen=True, kw_only=True)
class CoupledPair(Estimator):
    """Coupled-GRPO's complementary-mask token log-probs (docs/estimators.md#coupled_pair).

    DiffuCoder (``apple/ml-diffucoder``, ``src/open_r1/coupled_grpo.py``: ``forward_process``,
    ``selective_log_softmax``). Three forward passes per sequence: every completion position masked (p0, d1's
    one-step estimate), the positions with u_k < t masked (p1) and the complement u_k > t masked (p2), with
    t ~ U(``t_min``, ``t_max``) once per draw and u_k ~ U(0, 1) per position. Every completion token is masked in
    exactly one of the pair, and

        log pi^(y^k) = (p0_k + (p1_k / t if u_k < t else p2_k / (1 - t))) / 2

    (the 1/t and 1/(1 - t) are the official code's importance weights of the two partial masks). Real prompt
    tokens are masked with probability ``p_mask_prompt`` (official: 0).
    """

    t_min: float = 0.2
    t_max: float = 0.8
    p_mask_prompt: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(
            0.0 < self.t_min <= self.t_max < 1.0,
            f"need 0 < t_min <= t_max < 1, got t_min={self.t_min!r}, t_max={self.t_max!r}",
        )
        _require(_is_prob(self.p_mask_prompt), f"p_mask_prompt must be in [0, 1], got {self.p_mask_prompt!r}")

    def draw(self, batch: SequenceBatch, generator: torch.Generator) -> CoupledNoise:
        device = batch.prompt_ids.device
        prompt_u = _uniform(generator, tuple(batch.prompt_ids.shape), device)
        t = self.t_min + (self.t_max - self.t_min) * _uniform(generator, (1,), device)
        return CoupledNoise(
            prompt_masked=batch.prompt_mask.bool() & (prompt_u < self.p_mask_prompt),
            t=t.expand(batch.completion_ids.shape[0]).clone(),
            u=_uniform(generator, tuple(batch.completion_ids.shape), device),
        )

    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: CoupledNoise) -> Estimate:
        prompt = torch.where(noise.prompt_masked, model.mask_id, batch.prompt_ids)
        clean, t = batch.completion_ids, noise.t[:, None]
        first = noise.u < t
        versions = (
            torch.full_like(clean, model.mask_id),
            torch.where(first, model.mask_id, clean),
            torch.where(noise.u > t, model.mask_id, clean),
        )
        inputs = torch.cat([torch.cat((prompt, v), dim=1) for v in versions], dim=0)
        attention = model.context_attention(batch.prompt_mask, clean.shape[1])
        logp = self._clean_token_logps(
            model,
            inputs,
            attention.repeat(3, *([1] * (attention.dim() - 1))),
            None,
            clean.repeat(3, 1),
            prompt.shape[1],
        )
        p0, p1, p2 = logp.split(clean.shape[0], dim=0)
        combined = (p0 + torch.where(first, p1 / t, p2 / (1 - t))) / 2
        mask = batch.completion_mask.bool()
        return Estimate(token_logp=torch.where(mask, combined, torch.zeros_like(combined)), token_mask=mask)


# ====================================================================================== GDPO
# Gauss-Legendre nodes and weights on [-1, 1] (textbook values), mapped to t = (x + 1) / 2, w = w_x / 2 on [0, 1].
GAUSS_LEGENDRE: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = {
    1: ((0.0,), (2.0,)),
    2: ((-((1 / 3) ** 0.5), (1 / 3) ** 0.5), (1.0, 1.0)),
    3: ((-((3 / 5) ** 0.5), 0.0, (3 / 5) ** 0.5), (5 / 9, 8 / 9, 5 / 9)),
}


MASK_SEEDS = ("stream", "content")


@ESTIMATORS.register("sdmc_elbo")
@dataclass(frozen=True, kw_only=True)
class SDMCElbo(Estimator):
    """GDPO's semi-deterministic Monte-Carlo ELBO (docs/estimators.md#sdmc_elbo).

    NVIDIA NeMo RL ``research/gdpo/gdpo/elbo.py`` (``SdmcElboEstimator``). The time integral of the ELBO is a
    Gauss-Legendre rule over t with ``nodes`` points; only the mask at each node is random. For node n (t_n, w_n)
    and each of ``mc_samples`` draws, exactly max(1, floor(t_n l_i)) of the l_i scored completion positions are
    masked, uniformly at random, and

        E_i = sum_n w_n / (t_n mc_samples) sum_draws sum_{k masked} log p(y^k | z_{i,n})

    ``elbo`` [B] on the sum scale, from one forward pass over B * nodes * mc_samples rows. Scored positions are
    the completion mask (up to and including the first EOS); later positions stay clean and visible, where the
    official code has cut the response at its stop token. No prompt token is masked (the recipe's
    ``p_mask_prompt: 0.0``).

    ``mask_seed``: where the masks' randomness comes from. ``"stream"`` draws them from the generator ``draw`` is
    given, like every estimator; ``"content"`` (what GDPO's official worker does) ignores it and draws each
    sequence's masks from its own generator seeded by :func:`content_seeds`, so a sequence has the same masks
    wherever and whenever it is scored. The staircase counterpart (block attention) always draws from the stream.
    """

    nodes: int = 3  # "gauss-3", the published recipe
    mc_samples: int = 1
    mask_seed: str = "stream"

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(self.nodes in GAUSS_LEGENDRE, f"nodes must be one of {sorted(GAUSS_LEGENDRE)}, got {self.nodes!r}")
        _require(_is_int(self.mc_samples, 1), f"mc_samples must be a positive integer, got {self.mc_samples!r}")
        _require(
            self.mask_seed in MASK_SEEDS, f"mask_seed must be one of {', '.join(MASK_SEEDS)}, got {self.mask_seed!r}"
        )

    def quadrature(self) -> tuple[list[float], list[float]]:
        """The nodes t_n and weights w_n on [0, 1] (the weights sum to 1)."""
        xs, ws = GAUSS_LEGENDRE[self.nodes]
        return [0.5 * x + 0.5 for x in xs], [0.5 * w for w in ws]

    def for_attention(self, attention: str) -> Estimator:
        """Block attention: the staircase ELBO on the sum scale with as many masked copies as forward rows here."""
        if attention != "block":
            return self
        return StaircaseElbo(num_mc=self.nodes * self.mc_samples, scale="sum", micro_batch_size=self.micro_batch_size)

    def draw(self, batch: SequenceBatch, generator: torch.Generator) -> SDMCNoise:
        times, weights = self.quadrature()
        rows = [
            (t, w / (t * self.mc_samples)) for t, w in zip(times, weights, strict=True) for _ in range(self.mc_samples)
        ]
        scored = batch.completion_mask.bool()
        lengths = scored.sum(-1, keepdim=True)  # [B, 1]
        t = torch.tensor([r[0] for r in rows], dtype=torch.float64, device=scored.device)
        count = torch.minimum(torch.floor(lengths * t).long().clamp(min=1), lengths)  # [B, N]
        allowed = scored.unsqueeze(1).expand(-1, len(rows), -1)
        uniform = None
        if self.mask_seed == "content":
            uniform = _content_uniform(batch, tuple(allowed.shape[1:]), allowed.device)
        masked = _random_subsets(generator, allowed, count.unsqueeze(-1), uniform=uniform)
        coefficient = torch.tensor([r[1] for r in rows], dtype=torch.float64, device=scored.device)
        return SDMCNoise(masked=masked, coefficient=coefficient)

    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: SDMCNoise) -> Estimate:
        logp = self._masked_copies_logps(model, batch, noise.masked)
        per_row = torch.where(noise.masked, logp, torch.zeros_like(logp)).sum(-1)
        return Estimate(elbo=(per_row * noise.coefficient.to(per_row.dtype)).sum(-1))


# ====================================================================================== SPG
@ESTIMATORS.register("spg_block")
@dataclass(frozen=True, kw_only=True)
class SPGBlock(Estimator):
    """SPG ``block_random`` forward process with its ELBO / EUBO proxies (docs/estimators.md#spg_block).

    Per sequence i (valid length l_i, n_i = ceil(l_i / b) blocks holding valid tokens) and MC sample j:

    1. chosen block beta_ij = j-th entry of (random permutation of the N_b blocks) mod n_i;
    2. m_len = min(b, l_i - b beta_ij); mask a uniform n-subset of the first m_len positions of the block with
       n ~ U{max(floor(m_len t_min), 1) .. min(floor(m_len t_max), m_len)};
    3. every later block and every post-EOS position is masked;
    4. everything else, real prompt tokens **and earlier clean completion blocks**, is masked independently
       with probability ``p_mask_prompt`` (the official code's "prompt" masking hits both).

    ``elbo`` and ``eubo`` [B] come from :func:`spg_bounds` over M_ij = masked valid completion positions, from
    one forward pass over B*m rows. Also returns the per-row tokens (``token_logp`` / ``token_mask`` over M_ij,
    rows ordered sequence-major, ``row_to_seq``).

    Deviations: the block count is ceil(L / b), so L need not be a multiple of b (identical when it is); if
    t_max is so small that the upper count bound falls below the lower one (the official code asserts, StableDRL
    masks the whole block), the count is the lower bound, so at least one token is always masked.
    """

    num_mc: int = 2  # m, the official code's num_t
    p_mask_prompt: float = 0.15
    block_length: int | None = None  # b; None = the rollout's block length (resolved by bind)
    min_t: float = 0.0
    max_t: float = 1.0
    eubo_beta: float = 1.5

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(_is_int(self.num_mc, 1), f"num_mc must be a positive integer, got {self.num_mc!r}")
        _require(_is_prob(self.p_mask_prompt), f"p_mask_prompt must be in [0, 1], got {self.p_mask_prompt!r}")
        _require(
            self.block_length is None or _is_int(self.block_length, 1),
            f"block_length must be a positive integer or None, got {self.block_length!r}",
        )
        _require(
            _is_prob(self.min_t) and _is_prob(self.max_t) and self.min_t <= self.max_t,
            f"need 0 <= min_t <= max_t <= 1, got min_t={self.min_t!r}, max_t={self.max_t!r}",
        )
        _require(_is_positive(self.eubo_beta), f"eubo_beta must be > 0, got {self.eubo_beta!r}")

    def for_attention(self, attention: str) -> Estimator:
        """Block attention: the staircase ELBO with the same MC samples, per-token mean scale (SPG/StableDRL)."""
        if attention != "block":
            return self
        return StaircaseElbo(
            num_mc=self.num_mc, scale="mean", eubo_beta=self.eubo_beta, micro_batch_size=self.micro_batch_size
        )

    def bind(self, model: DiffusionLM, *, block_length: int | None = None) -> SPGBlock:
        """SPG masks in the rollout's blocks unless it was given its own ``block_length``."""
        del model
        if self.block_length is not None:
            return self
        _require(block_length is not None, "spg_block needs block_length (none given and no rollout block)")
        return dataclasses.replace(self, block_length=block_length)

    def count_bounds(self, valid_in_block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inclusive bounds of the mask count for a chosen block with ``valid_in_block`` (= m_len) valid tokens."""
        low = torch.clamp(torch.floor(valid_in_block * self.min_t).long(), min=1)
        high = torch.minimum(torch.floor(valid_in_block * self.max_t).long(), valid_in_block)
        return low, torch.maximum(high, low)

    def draw(self, batch: SequenceBatch, generator: torch.Generator) -> SPGNoise:
        _require(self.block_length is not None, "spg_block: pass block_length or call bind() before draw")
        comp_mask = batch.completion_mask.bool()
        dev = comp_mask.device
        n_seq, length = comp_mask.shape
        m, bl = self.num_mc, self.block_length
        n_blocks = -(-length // bl)
        _require(m <= n_blocks, f"spg_block needs num_mc <= number of blocks ({n_blocks}), got num_mc={m}")
        valid_len = comp_mask.sum(-1)  # l_i (>= 1: the first token is always kept)
        valid_blocks = (valid_len - 1) // bl + 1  # n_i
        perm = _uniform(generator, (n_seq, n_blocks), dev).argsort(dim=-1)  # a random permutation per sequence
        chosen = perm[:, :m] % valid_blocks.unsqueeze(1)  # [B, m]
        m_len = torch.clamp(valid_len.unsqueeze(1) - bl * chosen, max=bl)
        count = _uniform_int(generator, *self.count_bounds(m_len))
        blk = _block_ids(length, bl, dev)
        in_chosen = (blk == chosen.unsqueeze(-1)) & comp_mask.unsqueeze(1)  # valid part of the chosen block
        partial = _random_subsets(generator, in_chosen, count.unsqueeze(-1))
        earlier = blk < chosen.unsqueeze(-1)
        p_masked = earlier & (_uniform(generator, (n_seq, m, length), dev) < self.p_mask_prompt)
        completion_masked = partial | (blk > chosen.unsqueeze(-1)) | ~comp_mask.unsqueeze(1) | p_masked
        u_prompt = _uniform(generator, (n_seq, m, batch.prompt_ids.shape[1]), dev)
        prompt_masked = batch.prompt_mask.bool().unsqueeze(1) & (u_prompt < self.p_mask_prompt)
        return SPGNoise(prompt_masked=prompt_masked, completion_masked=completion_masked, block=chosen, count=count)

    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: SPGNoise) -> Estimate:
        n_seq, m, length = noise.completion_masked.shape
        seq = torch.arange(n_seq, device=batch.completion_ids.device).repeat_interleave(m)
        prompt = torch.where(noise.prompt_masked, model.mask_id, batch.prompt_ids.unsqueeze(1)).flatten(0, 1)
        completion = torch.where(noise.completion_masked, model.mask_id, batch.completion_ids.unsqueeze(1))
        attention = model.context_attention(batch.prompt_mask, length)[seq]
        input_ids = torch.cat((prompt, completion.flatten(0, 1)), dim=1)
        targets = batch.completion_ids[seq]
        logp = self._clean_token_logps(model, input_ids, attention, None, targets, prompt.shape[1])
        logp = logp.view(n_seq, m, length)
        member = noise.completion_masked & batch.completion_mask.bool().unsqueeze(1)
        elbo, eubo = spg_bounds(logp, member, batch.completion_mask, self.eubo_beta)
        return Estimate(
            token_logp=torch.where(member, logp, torch.zeros_like(logp)).flatten(0, 1),
            token_mask=member.flatten(0, 1),
            row_to_seq=seq,
            elbo=elbo,
            eubo=eubo,
        )


# ====================================================================================== ESPO
@ESTIMATORS.register("espo_elbo")
@dataclass(frozen=True, kw_only=True)
class ESPOElbo(Estimator):
    """ESPO's sequence ELBO (docs/estimators.md#espo_elbo): stratified mask counts and an antithetic complement pass.

    For MC sample j: kappa ~ U{0..L}; sequence i of the batch gets n_i = round(kappa + i (L+1)/B) mod (L+1),
    t_i = n_i / (L+1), and a uniform n_i-subset M_i of **all L** completion positions (EOS padding included, as
    the official code does; no prompt masking). With ``reduce_var`` a second row masks the complement:

        E_i = 1/2 [ sum_{k in M_i} log p(y^k | z_i) / t_i + sum_{k not in M_i} log p(y^k | z~_i) / (L/(L+1) - t_i) ]

    (without ``reduce_var``: the first sum alone). ``elbo`` [B] is the mean over ``num_mc`` samples, on the sum
    (log-likelihood) scale. Empty sums (n_i = 0, or n_i = L for the complement) contribute 0, never NaN. One
    forward pass over B * num_mc * (2 if reduce_var else 1) rows.
    """

    num_mc: int = 2
    reduce_var: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(_is_int(self.num_mc, 1), f"num_mc must be a positive integer, got {self.num_mc!r}")
        _require(isinstance(self.reduce_var, bool), f"reduce_var must be true or false, got {self.reduce_var!r}")

    def for_attention(self, attention: str) -> Estimator:
        """Block attention: the staircase ELBO with the same MC samples on ESPO's 1/t-weighted sum scale."""
        if attention != "block":
            return self
        return StaircaseElbo(num_mc=self.num_mc, scale="sum", micro_batch_size=self.micro_batch_size)

    def draw(self, batch: SequenceBatch, generator: torch.Generator) -> ESPONoise:
        n_seq, length = batch.completion_ids.shape
        dev = batch.completion_ids.device
        kappa = torch.floor(_uniform(generator, (self.num_mc,), dev) * (length + 1)).long().clamp(max=length)
        offsets = torch.arange(n_seq, device=dev, dtype=torch.float64) * ((length + 1) / n_seq)
        count = torch.round(kappa.unsqueeze(0) + offsets.unsqueeze(1)).long() % (length + 1)  # [B, K]
        allowed = torch.ones(n_seq, self.num_mc, length, dtype=torch.bool, device=dev)
        masked = _random_subsets(generator, allowed, count.unsqueeze(-1))
        return ESPONoise(masked=masked, count=count, kappa=kappa)

    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: ESPONoise) -> Estimate:
        sums, weights = self.pass_sums(model, batch, noise)
        return Estimate(elbo=(sums * weights).mean(-1).mean(-1))

    def pass_sums(
        self, model: DiffusionLM, batch: SequenceBatch, noise: ESPONoise
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sums, weights)`` [B, K, S]: the log-probs summed over the positions masked in each pass (S = 2 with
        ``reduce_var``: the draw and its complement) and each pass's 1/t weight, from one forward pass.

        1/t = (L+1)/n for the draw and (L+1)/(L-n) for the complement; an empty pass has sum 0 and weight 0.
        """
        n_seq, k_mc, length = noise.masked.shape
        passes = (noise.masked, ~noise.masked) if self.reduce_var else (noise.masked,)
        masks = torch.stack(passes, dim=2)  # [B, K, S, L]
        n_pass = masks.shape[2]
        logp = self._masked_copies_logps(model, batch, masks.flatten(1, 2)).view(n_seq, k_mc, n_pass, length)
        n = noise.count.to(logp.dtype)
        zero = torch.zeros_like(n)
        weight_masked = torch.where(noise.count > 0, (length + 1) / n.clamp(min=1), zero)  # 1 / t
        weight_complement = torch.where(noise.count < length, (length + 1) / (length - n).clamp(min=1), zero)
        weights = torch.stack((weight_masked, weight_complement), dim=-1)[..., :n_pass]  # [B, K, S]
        return torch.where(masks, logp, torch.zeros_like(logp)).sum(-1), weights


@ESTIMATORS.register("denoise_pair")
@dataclass(frozen=True, kw_only=True)
class DenoisePair(ESPOElbo):
    """GDSD's denoising log-probability (docs/estimators.md#denoise_pair): ESPO's masks, one value per MC sample.

    ``GaryBall/GDSD: gdsd/trainers/gdsd_trainer_batchll.py`` (``forward_process`` lines 56-76,
    ``_compute_denoise_probs_from_masked_batch`` lines 432-485). The draw is ESPO's (stratified counts over the
    micro-batch, a uniform subset of all L positions, no prompt masking); for Monte-Carlo sample j

        D_ij = 1/2 [ sum_{k in M} log p(y^k | z) + sum_{k not in M} log p(y^k | z~) ]      (reduce_var, official)

    with ``inverse_t=False`` (GDSD): the complementary pair predicts every position once, no 1/t weight. With
    ``inverse_t=True`` (GDSD-TLC, ``gdsd_trainer_tlc.py`` lines 455-478) each pass is divided by its t, which is
    ESPO's ELBO term; TLC's "logit centralisation" subtracts a detached per-position constant from the logits,
    which a log-softmax does not see, so it is not reproduced. ``elbo_samples`` [B, K] holds D_ij, ``elbo`` their
    mean. The official trainers always take the complement (``reduce_var`` in the recipe is never read), hence the
    default.
    """

    num_mc: int = 1
    inverse_t: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(isinstance(self.inverse_t, bool), f"inverse_t must be true or false, got {self.inverse_t!r}")

    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: ESPONoise) -> Estimate:
        sums, weights = self.pass_sums(model, batch, noise)
        samples = (sums * weights if self.inverse_t else sums).mean(-1)  # [B, K]
        return Estimate(elbo=samples.mean(-1), elbo_samples=samples)


@ESTIMATORS.register("stratified_elbo")
@dataclass(frozen=True, kw_only=True)
class StratifiedElbo(Estimator):
    """BGPO's per-sample ELBOs (docs/estimators.md#stratified_elbo), counts stratified over one sequence's samples.

    ``yjyddq/DARE: verl/trainer/ppo/dllm_core_algos.py: _forward_process_bgpo`` (lines 593-631) with the sums of
    ``verl/workers/actor/llada_dp_actor_bgpo.py: _forward_micro_batch`` (lines 93-124). For sequence i with l_i
    valid tokens (the completion mask) and its K = ``num_mc`` samples: kappa_i ~ U{1..l_i},
    n_ij = ((round(kappa_i + j l_i / K) - 1) mod l_i) + 1 for j = 0..K-1, a uniform n_ij-subset M_ij of the valid
    positions is masked (t_ij = n_ij / l_i), and

        E_ij = (1 / t_ij) sum_{k in M_ij} log p(y^k | z_ij)           (``elbo_samples`` [B, K]; ``elbo`` = mean)

    No prompt token is masked; positions after the first EOS stay clean and visible, where verl has cut the response
    at its stop token. One forward pass over B K rows.
    """

    num_mc: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(_is_int(self.num_mc, 1), f"num_mc must be a positive integer, got {self.num_mc!r}")

    def for_attention(self, attention: str) -> Estimator:
        """Block attention: the staircase ELBO on the 1/t-weighted sum scale with as many samples."""
        if attention != "block":
            return self
        return StaircaseElbo(num_mc=self.num_mc, scale="sum", micro_batch_size=self.micro_batch_size)

    def draw(self, batch: SequenceBatch, generator: torch.Generator) -> StratifiedNoise:
        valid = batch.completion_mask.bool()
        n_seq, length = valid.shape
        lengths = valid.sum(-1, keepdim=True).clamp(min=1)  # [B, 1]
        kappa = _uniform_int(generator, torch.ones_like(lengths), lengths)
        steps = torch.arange(self.num_mc, device=valid.device, dtype=torch.float64) * (lengths / self.num_mc)
        count = (torch.round(kappa + steps).long() - 1) % lengths + 1  # [B, K]
        allowed = valid.unsqueeze(1).expand(n_seq, self.num_mc, length)
        return StratifiedNoise(masked=_random_subsets(generator, allowed, count.unsqueeze(-1)), count=count)

    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: StratifiedNoise) -> Estimate:
        logp = self._masked_copies_logps(model, batch, noise.masked)
        lengths = batch.completion_mask.sum(-1, keepdim=True).to(logp.dtype)
        inv_t = lengths / noise.count.to(logp.dtype)  # [B, K]
        samples = torch.where(noise.masked, logp, torch.zeros_like(logp)).sum(-1) * inv_t
        return Estimate(elbo=samples.mean(-1), elbo_samples=samples)


# ====================================================================================== TraceRL
@dataclass
class TracePlan:
    """The rows of a trajectory replay: which positions are masked in each row's state, and its targets."""

    row_to_seq: torch.Tensor  # [R] long
    masked: torch.Tensor  # [R, L] bool, positions shown as the mask token in the (noisy) state
    targets: torch.Tensor  # [R, L] bool, positions whose log-prob is an action of this row
    # [R, L] long, the tokens whose log-probs are read at the targets; None: the completion's own (every replay but
    # MDPO's, whose targets are the sampler's intermediate predictions)
    tokens: torch.Tensor | None = None

    def select(self, rows: torch.Tensor) -> TracePlan:
        """The plan of the given rows only (in that order, repeats allowed)."""
        tokens = None if self.tokens is None else self.tokens[rows]
        return TracePlan(self.row_to_seq[rows], self.masked[rows], self.targets[rows], tokens)


def replay_rounds(row_to_seq: torch.Tensor) -> torch.Tensor:
    """The round of every row [R] of a full replay plan, from its sequence index.

    :func:`trace_replay_plan` lists rows sequence-major with each sequence's rounds in order, so a row's round is
    its offset from its sequence's first row (what CJ-GRPO's per-step aggregation and AGRPO's step sampling need).
    """
    rows = torch.arange(row_to_seq.shape[0], device=row_to_seq.device)
    return rows - torch.searchsorted(row_to_seq, row_to_seq)


def trace_replay_plan(
    unmask_step: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    shrink: int,
    post_num: int | None,
    block_size: int | None,
) -> TracePlan:
    """TraceRL's replay rows (docs/estimators.md#trace_replay) from the step that committed each completion token.

    Eligible targets are the positions up to the first EOS plus ``post_num`` more (``post_num=None``: every
    decoded position of the canvas, EOS padding included, as CJ-GRPO, AGRPO and JustGRPO train). Inside each
    block (the whole completion when ``block_size`` is None), the unique steps of eligible positions are sorted
    and grouped every ``shrink`` consecutive values. Round r takes, in every block at once, the block's r-th group g:

    * state: every position of the block whose step >= the first step of g is masked (the sampler's state just
      before g started); blocks without an r-th group are left clean;
    * targets: eligible positions whose step lies in g.

    One row per (sequence, round); each eligible position is a target exactly once.
    """
    n_seq, length = unmask_step.shape
    dev = unmask_step.device
    # Negative steps mark positions the sampler never decoded (EOS fill after an early stop): never targets.
    decoded = unmask_step >= 0
    steps = unmask_step.long().clamp(min=0)
    span = int(steps.max()) + 1
    block = _block_ids(length, block_size, dev)
    n_blocks = int(block.max()) + 1
    eligible = decoded
    if post_num is not None:
        cut = completion_mask.long().sum(-1, keepdim=True) + post_num
        eligible = eligible & (torch.arange(length, device=dev) < cut)
    # rank of a step among the unique eligible steps of its (sequence, block): searchsorted over sorted keys
    cell = torch.arange(n_seq, device=dev).unsqueeze(1) * n_blocks + block  # [B, L]
    keys = cell * span + steps
    unique_keys = torch.unique(keys[eligible])
    rank = torch.searchsorted(unique_keys, keys) - torch.searchsorted(unique_keys, cell * span)
    group = torch.where(eligible, rank // shrink, -1)  # [B, L]
    rounds = group.max(dim=1).values + 1  # [B] (>= 1: the first completion token is always eligible)
    row_to_seq = torch.arange(n_seq, device=dev).repeat_interleave(rounds)
    row_round = torch.cat([torch.arange(int(r), device=dev) for r in rounds])
    targets = group[row_to_seq] == row_round.unsqueeze(1)
    row_steps = steps[row_to_seq]
    never = torch.iinfo(torch.long).max
    first = torch.full((row_to_seq.shape[0], n_blocks), never, dtype=torch.long, device=dev)
    first.scatter_reduce_(1, block.expand_as(targets), torch.where(targets, row_steps, never), reduce="amin")
    masked = row_steps >= first.gather(1, block.expand_as(targets))
    return TracePlan(row_to_seq=row_to_seq, masked=masked, targets=targets)


@ESTIMATORS.register("trace_replay")
@dataclass(frozen=True, kw_only=True)
class TraceReplay(Estimator):
    """TraceRL trajectory replay (docs/estimators.md#trace_replay): exact per-step log-probs of the committed tokens.

    Needs ``batch.unmask_step``. Full-attention models: one plain ``[prompt | state]`` row per (sequence, step
    group), grouping over the whole completion (dLLM-RL's LLaDA path). Block models: one staircase row
    ``[prompt | clean | noisy_r]`` per round, where round r replays every block's r-th group at once (TraDo).
    The noise is deterministic (``draw`` returns an empty :class:`TraceNoise`), so old and new are always coupled.

    Deviation: targets beyond the first EOS are cut by position (first EOS + ``post_num``; None: no cut) rather
    than by counting pad tokens, and only eligible positions define the step groups.
    """

    shrink: int = 1
    post_num: int | None = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(_is_int(self.shrink, 1), f"shrink must be a positive integer, got {self.shrink!r}")
        _require(
            self.post_num is None or _is_int(self.post_num, 0),
            f"post_num must be a non-negative integer or null (every position), got {self.post_num!r}",
        )

    def draw(self, batch: SequenceBatch, generator: torch.Generator) -> TraceNoise:
        del batch, generator
        return TraceNoise()

    def plan(self, model: DiffusionLM, batch: SequenceBatch) -> TracePlan:
        """The replay rows of ``batch`` for ``model`` (blocks of ``model.block_size`` for block models)."""
        _require(batch.unmask_step is not None, "trace_replay needs the sampler's unmask_step for every completion")
        block_size = int(model.block_size) if model.attention == "block" else None
        return trace_replay_plan(
            batch.unmask_step, batch.completion_mask, shrink=self.shrink, post_num=self.post_num, block_size=block_size
        )

    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: TraceNoise) -> Estimate:
        del noise
        return self.replay(model, batch, self.plan(model, batch))

    def replay(self, model: DiffusionLM, batch: SequenceBatch, plan: TracePlan) -> Estimate:
        """The exact log-probs of the targets of every row of ``plan``, from one batched pass over its rows."""
        seq = plan.row_to_seq
        clean = batch.completion_ids[seq]
        state = torch.where(plan.masked, model.mask_id, clean)
        tokens = clean if plan.tokens is None else plan.tokens
        p_len, length = batch.prompt_ids.shape[1], clean.shape[1]
        if model.attention == "block":
            prompt_valid = batch.prompt_mask.bool()[seq]
            input_ids = torch.cat((batch.prompt_ids[seq], clean, state), dim=1)
            attention = staircase_mask(prompt_valid, length, int(model.block_size))
            logp = self._clean_token_logps(
                model, input_ids, attention, staircase_position_ids(prompt_valid, length), tokens, p_len + length
            )
        else:
            input_ids = torch.cat((batch.prompt_ids[seq], state), dim=1)
            attention = model.context_attention(batch.prompt_mask, length)[seq]
            logp = self._clean_token_logps(model, input_ids, attention, None, tokens, p_len)
        return Estimate(
            token_logp=torch.where(plan.targets, logp, torch.zeros_like(logp)),
            token_mask=plan.targets,
            row_to_seq=seq,
        )


@ESTIMATORS.register("trace_sample")
@dataclass(frozen=True, kw_only=True)
class TraceSample(TraceReplay):
    """AGRPO's amortised replay (docs/estimators.md#trace_sample): the trajectory at ``num_mc`` sampled steps.

    ``probablyabot/agrpo: agrpo_trainer.py: compute_loss`` (lines 256-301). Instead of every step of the trajectory
    (``trace_replay``), each sequence replays K = ``num_mc`` steps drawn uniformly from its steps 0..T_i, where T_i
    is the last step that committed a token other than a stop token (steps after it only write EOS padding):
    step = floor(u (T_i + 1)). With ``low_discrepancy`` the S = B K uniforms of the micro-batch are stratified,
    u = (pi + v) / S with pi a random permutation of 0..S-1 and v ~ U[0, 1) (AGRPO's sampler, arXiv:2409.02908
    appendix G.2). The same step may be drawn twice; both rows count, as in the official loop. Rows are the replay
    plan's (``post_num=None``: every token the step committed, EOS included), K per sequence in draw order
    (``row_to_seq``); steps are rounds of the plan, which on a full-attention model are the sampler's steps and on a
    block model replay every block's r-th step at once.

    ``importance_sampling="entropy"`` (lines 267-280 and 336-339; the recipe's rule) draws the steps in proportion to
    the entropies of the tokens they committed instead, and weighs each replayed row so that the estimate keeps the
    uniform rule's expectation. It reads ``batch.records["token_entropy"]`` [B, L] (the ``token_entropies``
    rollout): with H_is = 1e-8 + the sum of the token entropies of step s (round s of the plan) for s <= T_i and
    H_is = 0 after, p_is = H_is / sum_s H_is, the step of u is the first s whose cumulative p_is reaches u (the
    inverse CDF, ``searchsorted``; the same uniforms as the uniform rule) and the row's weight (``row_weight``) is
    (1 / (T_i + 1)) / p_is. A u beyond the last cumulative value by rounding takes step T_i (the official
    ``gather`` would index past the end).
    """

    post_num: int | None = None
    num_mc: int = 1
    low_discrepancy: bool = True
    importance_sampling: str = "uniform"

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(_is_int(self.num_mc, 1), f"num_mc must be a positive integer, got {self.num_mc!r}")
        _require(
            isinstance(self.low_discrepancy, bool),
            f"low_discrepancy must be true or false, got {self.low_discrepancy!r}",
        )
        _require(
            self.importance_sampling in IMPORTANCE_SAMPLING,
            f"importance_sampling must be one of {', '.join(IMPORTANCE_SAMPLING)}, got {self.importance_sampling!r}",
        )

    def draw(self, batch: SequenceBatch, generator: torch.Generator) -> TraceSampleNoise:
        n_seq, dev = batch.completion_ids.shape[0], batch.completion_ids.device
        total = n_seq * self.num_mc
        u = _uniform(generator, (total,), dev)
        if self.low_discrepancy:
            order = torch.randperm(total, generator=generator, device=generator.device).to(dev)
            u = (order.to(u.dtype) + u) / total
        return TraceSampleNoise(u=u.view(n_seq, self.num_mc))

    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: TraceSampleNoise) -> Estimate:
        plan = self.plan(model, batch)
        rounds = replay_rounds(plan.row_to_seq)
        n_seq = batch.completion_ids.shape[0]
        clean = batch.completion_ids[plan.row_to_seq]
        stop = torch.tensor(model.stop_ids, device=clean.device)
        content = (plan.targets & ~torch.isin(clean, stop)).any(dim=1)  # rows that commit a non-stop token
        last = torch.zeros(n_seq, dtype=torch.long, device=clean.device)
        last.scatter_reduce_(0, plan.row_to_seq, torch.where(content, rounds, 0), reduce="amax")
        first_row = torch.searchsorted(plan.row_to_seq, torch.arange(n_seq, device=clean.device))
        if self.importance_sampling == "uniform":
            chosen = torch.minimum(torch.floor(noise.u * (last[:, None] + 1)).long(), last[:, None])  # [B, K]
            return self.replay(model, batch, plan.select((first_row[:, None] + chosen).flatten()))
        _require(
            "token_entropy" in batch.records,
            "trace_sample with importance_sampling: entropy needs the token_entropies rollout's token_entropy record",
        )
        target_rows, target_cols = plan.targets.nonzero(as_tuple=True)
        position_step = torch.zeros_like(batch.completion_ids)  # [B, L] the round whose targets hold each position
        position_step[plan.row_to_seq[target_rows], target_cols] = rounds[target_rows]
        targeted = torch.zeros_like(batch.completion_mask, dtype=torch.bool)
        targeted[plan.row_to_seq[target_rows], target_cols] = True
        entropy = torch.where(targeted, batch.records["token_entropy"].to(torch.float64), 0.0)
        chosen, weight = entropy_steps(entropy, position_step, int(rounds.max()) + 1, last, noise.u)
        estimate = self.replay(model, batch, plan.select((first_row[:, None] + chosen).flatten()))
        return dataclasses.replace(estimate, row_weight=weight.flatten())


IMPORTANCE_SAMPLING = ("uniform", "entropy")  # AGRPO's importance_sampling (agrpo_config.py lines 27-30)


def entropy_steps(
    token_entropy: torch.Tensor, token_step: torch.Tensor, steps: int, last: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """AGRPO's entropy rule (``agrpo_trainer.py`` lines 267-280): the steps [B, K] the uniforms ``u`` [B, K] draw,
    and their importance weights [B, K] against the uniform rule over each sequence's steps 0..``last`` [B].

    ``token_entropy`` [B, L] (float64) is summed into ``steps`` bins by ``token_step`` [B, L], the step that
    committed each token, starting from 1e-8 (the official ``torch.full(..., 1e-8)`` then ``scatter_add_``, so a step
    of zero entropy can still be drawn); the steps after ``last`` get 0. Then p = H / sum H, the step of u is the first
    whose cumulative p reaches u (``searchsorted``, at most ``last``: a u past the last cumulative value by rounding,
    which the official ``gather`` would index past the end) and its weight is (1 / (last + 1)) / p.
    """
    step_entropy = torch.full((token_entropy.shape[0], steps), 1e-8, dtype=torch.float64, device=token_entropy.device)
    step_entropy.scatter_add_(1, token_step, token_entropy)
    step_entropy[torch.arange(steps, device=step_entropy.device)[None, :] > last[:, None]] = 0.0
    probs = step_entropy / step_entropy.sum(dim=1, keepdim=True)
    cdf = probs.cumsum(dim=1)
    chosen = torch.minimum(torch.searchsorted(cdf, u.to(cdf.dtype).contiguous()), last[:, None])
    weight = (1.0 / (last[:, None] + 1).to(probs.dtype)) / probs.gather(1, chosen)
    return chosen, weight


@ESTIMATORS.register("ar_replay")
@dataclass(frozen=True, kw_only=True)
class ARReplay(TraceReplay):
    """JustGRPO's likelihood (docs/estimators.md#ar_replay): the exact left-to-right factorisation of the completion.

    ``LeapLabTHU/JustGRPO: grpo.py: logprob_loss`` (lines 34-44): for t = 0..L-1 the input is
    ``[prompt | y_<t | M...M]`` and the row's target is y_t, log pi(y) = sum_t log p(y_t | x, y_<t). This is the
    trajectory replay of the left-to-right order (step t commits position t, whatever order the sampler used),
    so it needs no ``unmask_step``: on a full-attention model L rows per sequence; on a block model one staircase row
    per position in the block, every block's t-th position at once, exactly as that order would be decoded.
    ``post_num=None`` (the official code scores every position of the canvas, EOS padding included).
    """

    post_num: int | None = None

    def plan(self, model: DiffusionLM, batch: SequenceBatch) -> TracePlan:
        """The replay of the left-to-right order: position t is committed at step t."""
        n_seq, length = batch.completion_ids.shape
        order = torch.arange(length, device=batch.completion_ids.device).expand(n_seq, length)
        block_size = int(model.block_size) if model.attention == "block" else None
        return trace_replay_plan(
            order, batch.completion_mask, shrink=self.shrink, post_num=self.post_num, block_size=block_size
        )


@ESTIMATORS.register("chosen_steps")
@dataclass(frozen=True, kw_only=True)
class ChosenSteps(TraceReplay):
    """EGSPO's likelihood (docs/estimators.md#chosen_steps): the exact log-probs of the tokens the sampler committed
    at the steps its rollout chose for each sequence (``batch.records["steps"]`` [B, K], the ``entropy_steps``
    scheme), one replay row per (sequence, chosen step).

    ``vishnutez/egspo-dllm-rl: egspo/egspo_trainer.py: _get_per_token_logps_unbiased`` (lines 488-542, the 2-D
    path, ``pred_state="next"``): the row of step s is the sampler's state before s (every completion token
    committed at a step < s clean, the rest masked); its targets are the tokens step s committed. The noise is
    deterministic (which columns to replay); :meth:`draw` replays all K, :meth:`draw_for` shares them out over the
    inner iterations in the official order: the trainer calls ``compute_loss`` K times per rollout with
    ``eval_time_step_idx = _step % K`` after ``_step`` was already incremented (lines 93, 559-564), so the columns
    come in the order 1, 2, ..., K-1, 0, and ``gradient_accumulation_steps`` consecutive ones make an optimizer
    step: iteration i of mu takes the i-th of mu equal runs of that order (mu >= K: column ``order[i mod K]``).
    Estimate rows are sequence-major, ``row_column`` says which chosen step each row is.
    """

    post_num: int | None = None

    @staticmethod
    def order(steps: int) -> list[int]:
        """The official order of the K chosen steps over a rollout's ``compute_loss`` calls: 1, ..., K-1, 0."""
        return [(k + 1) % steps for k in range(steps)]

    def draw(self, batch: SequenceBatch, generator: torch.Generator) -> ChosenStepsNoise:
        del generator
        steps = self._chosen(batch)
        return ChosenStepsNoise(columns=torch.arange(steps.shape[1], device=steps.device))

    def draw_for(
        self, batch: SequenceBatch, generator: torch.Generator, iteration: int, iterations: int
    ) -> ChosenStepsNoise:
        del generator
        steps = self._chosen(batch)
        k = steps.shape[1]
        order = self.order(k)
        if iterations >= k:
            chosen = [order[iteration % k]]
        else:
            chosen = order[iteration * k // iterations : (iteration + 1) * k // iterations]
        return ChosenStepsNoise(columns=torch.tensor(chosen, dtype=torch.long, device=steps.device))

    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: ChosenStepsNoise) -> Estimate:
        steps = self._chosen(batch)
        _require(batch.unmask_step is not None, "chosen_steps needs the sampler's unmask_step for every completion")
        assert batch.unmask_step is not None
        n_seq, dev = steps.shape[0], steps.device
        columns = noise.columns.to(dev)
        seq = torch.arange(n_seq, device=dev).repeat_interleave(columns.shape[0])
        column = columns.repeat(n_seq)
        committed = batch.unmask_step[seq]  # [R, L]
        step = steps[seq, column][:, None]
        # never-committed positions (EOS filled after an early stop) were MASK in every state
        plan = TracePlan(row_to_seq=seq, masked=(committed >= step) | (committed < 0), targets=committed == step)
        return dataclasses.replace(self.replay(model, batch, plan), row_column=column)

    @staticmethod
    def _chosen(batch: SequenceBatch) -> torch.Tensor:
        steps = batch.records.get("steps")
        _require(
            steps is not None,
            "chosen_steps needs the steps the rollout chose (records['steps'], drawn by the entropy_steps scheme)",
        )
        assert steps is not None
        return steps.long()


@ESTIMATORS.register("advantage_steps")
@dataclass(frozen=True, kw_only=True)
class AdvantageSteps(ChosenSteps):
    """MDPO's likelihood (docs/estimators.md#advantage_steps): per sequence, the ``num_steps`` sampler steps of
    largest |advantage| (``records["advantages"]`` [B, T], which the trainer puts there for MDPO), each replayed on
    the sampler's state before it with the step's full prediction as targets.

    ``autonomousvision/mdpo: src/open_r1/mdpo/mdpo_trainer.py``: ``split_into_micro_batches`` (lines 917-949) takes
    ``torch.topk(|A|.sum(dim=0), k=sample_train_steps)`` over the device's rows (one row: its generator decodes one
    prompt at a time, ``mdlm_generation_utils.py`` line 37), highest first (ties here: the earlier step); the row of
    step s is ``all_steps_input_ids[s]`` (the state before s: every position the sampler committed at a step < s
    clean, the rest MASK) and its targets ``all_steps_completion_ids[s]`` at every masked position
    (``compute_loss`` lines 1491 and 1510: ``completion_mask = input_ids == mask``), i.e. ``records["predictions"]``
    of the ``step_predictions`` scheme; ``token_weight`` is the step's ``records["confidence"]`` (``conf``, line
    935). Every inner iteration replays all K steps (the official loop trains each chosen step once, in one optimizer
    step). Rows are sequence-major, highest |A| first; ``row_column`` is the step itself, the column of the
    advantages [B, T].
    """

    num_steps: int = 16  # K: sample_train_steps

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(_is_int(self.num_steps, 1), f"num_steps must be a positive integer, got {self.num_steps!r}")

    def draw_for(
        self, batch: SequenceBatch, generator: torch.Generator, iteration: int, iterations: int
    ) -> ChosenStepsNoise:
        del iteration, iterations
        return self.draw(batch, generator)

    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: ChosenStepsNoise) -> Estimate:
        steps = self._chosen(batch)
        _require(batch.unmask_step is not None, "advantage_steps needs the sampler's unmask_step for every completion")
        predictions, confidence = batch.records.get("predictions"), batch.records.get("confidence")
        _require(
            predictions is not None and confidence is not None,
            "advantage_steps needs every step's prediction and confidence (the step_predictions rollout)",
        )
        assert batch.unmask_step is not None and predictions is not None and confidence is not None
        n_seq, dev = steps.shape[0], steps.device
        columns = noise.columns.to(dev)
        seq = torch.arange(n_seq, device=dev).repeat_interleave(columns.shape[0])
        step = steps[seq, columns.repeat(n_seq)]
        committed = batch.unmask_step[seq]
        masked = (committed >= step[:, None]) | (committed < 0)
        tokens = predictions.to(dev)[seq, step]
        plan = TracePlan(row_to_seq=seq, masked=masked, targets=masked, tokens=tokens)
        weight = torch.where(masked, confidence.to(dev)[seq, step], 0.0)
        return dataclasses.replace(self.replay(model, batch, plan), row_column=step, token_weight=weight)

    def _chosen(self, batch: SequenceBatch) -> torch.Tensor:
        advantages = batch.records.get("advantages")
        _require(
            advantages is not None and advantages.dim() == 2,
            "advantage_steps needs the per-step advantages [B, T] in records['advantages'] (the mdpo baseline)",
        )
        assert advantages is not None
        _require(
            self.num_steps <= advantages.shape[1],
            f"advantage_steps: num_steps={self.num_steps} exceeds the {advantages.shape[1]} sampler steps",
        )
        order = torch.argsort(advantages.abs(), dim=1, descending=True, stable=True)
        return order[:, : self.num_steps].to(batch.completion_ids.device)


@ESTIMATORS.register("tree_transitions")
@dataclass(frozen=True, kw_only=True)
class TreeTransitions(TraceReplay):
    """d-TreeRPO's likelihood (docs/estimators.md#tree_transitions): the log-prob of each transition parent -> child
    of the rollout tree (the ``tree_branches`` scheme's records, :class:`~stabledrl_bench.core.rollouts.TreeRecords`),
    one forward pass on the parent's partial state.

    ``THU-BPM/d-TreeRPO: dtreerpo/dtreerpo_trainer.py`` at ``3eb6f21``, ``_get_local_transition_logps`` (lines
    165-195) with ``_build_completion_mask`` (lines 197-214): the row of the transition into node c (depth d) is its
    parent's state (every token its owner committed before u_(d-1) clean, the rest MASK); its targets are the tokens
    c committed in [u_(d-1), u_d) up to and including the first stop token of c's own partial state (the official
    ``changed_mask & eos_mask``: positions MASK in the parent, unmasked in the child, not after the child's first
    EOS). One row per node and prompt (its owner leaf's row), sequence-major, levels ascending; ``row_column`` is
    d - 1 (the column of the advantages [B, D]), ``row_group`` one value per parent node (the siblings, scored on
    one state), ``token_ids`` the completion's tokens (the self-distillation compares siblings' tokens).

    The noise is which parents' transitions to replay (deterministic): :meth:`draw` all of them, :meth:`draw_for`
    shares them out over the inner iterations in the rollout's ``tree_order`` (``_prepare_inputs`` lines 645-697:
    the buffered parent segments, shuffled, each trained ``num_iterations`` optimizer steps in a row): iteration i
    of mu takes the parent at ``order[i P // mu]`` when mu >= P (runs of equal length when P divides mu), else the
    parents ``order[i P // mu : (i + 1) P // mu]``.
    """

    post_num: int | None = None

    def draw(self, batch: SequenceBatch, generator: torch.Generator) -> TreeNoise:
        del generator
        return TreeNoise(parents=TreeRecords.of(batch.records).order.clone())

    def draw_for(self, batch: SequenceBatch, generator: torch.Generator, iteration: int, iterations: int) -> TreeNoise:
        del generator
        order = TreeRecords.of(batch.records).order
        parents = order.shape[0]
        first = iteration * parents // iterations
        last = first + 1 if iterations >= parents else (iteration + 1) * parents // iterations
        return TreeNoise(parents=order[first:last].clone())

    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: TreeNoise) -> Estimate:
        tree = TreeRecords.of(batch.records)
        _require(batch.unmask_step is not None, "tree_transitions needs the sampler's unmask_step for every completion")
        assert batch.unmask_step is not None
        dev = batch.completion_ids.device
        take = tree.owned() & torch.isin(tree.parent, noise.parents.to(tree.parent.device))
        seq, level = (index.to(dev) for index in take.nonzero(as_tuple=True))
        steps, node = tree.steps.to(dev), tree.node.to(dev)
        committed = batch.unmask_step[seq]
        before, until = steps[level][:, None], steps[level + 1][:, None]
        tokens = batch.completion_ids[seq]
        child = torch.where(committed < until, tokens, model.mask_id)
        targets = (committed >= before) & (committed < until) & model.completion_mask(child)
        plan = TracePlan(row_to_seq=seq, masked=(committed >= before) | (committed < 0), targets=targets)
        parent_row = seq - node[seq, -1] + node[seq, level]  # the row that owns the parent node
        return dataclasses.replace(
            self.replay(model, batch, plan),
            row_column=level,
            row_group=parent_row * tree.depth + level,
            token_ids=tokens,
        )


# ====================================================================================== staircase
@ESTIMATORS.register("staircase_elbo")
@dataclass(frozen=True, kw_only=True)
class StaircaseElbo(Estimator):
    """Block-diffusion ELBO, staircase attention (docs/estimators.md#staircase_elbo): all blocks in one pass of P + 2L.

    Input ``[prompt | clean y | noisy z]`` under :func:`~stabledrl_bench.core.masks.staircase_mask`: noisy block b
    sees the prompt, the clean blocks before b and itself, so its logits give log p(y^k | x, y_<b, z_b). For
    each (sequence, MC sample, block b) with v_b > 0 valid tokens, a uniform count c_b ~ U{1..v_b} of them is
    masked (t_b = c_b / v_b; every block gets its own t, the BD3-LM / SDAR training choice; post-EOS positions are
    always masked and never count). With M = masked valid positions:

    * ``scale="sum"``:  elbo_i = (1/K) sum_j sum_b (1/t_b) sum_{k in M_b} log p(y^k | ...)  (log-likelihood scale);
    * ``scale="mean"``: elbo_i = (1/K) sum_j (1/|M_ij|) sum_{k in M_ij} log p (SPG-style per-token average, the
      quantity StableDRL's per-token ratio uses);
    * ``eubo``: SPG's formula (:func:`spg_bounds`) over the same masks;
    * ``elbo_samples`` [B, K]: on the sum scale, each MC sample's term before the mean over K (GDSD, BGPO).

    Also returns ``token_logp`` / ``token_mask`` over M (rows sequence-major, ``row_to_seq``).
    ``block_length=None`` takes ``model.block_size``: call :meth:`bind` before :meth:`draw`.
    """

    num_mc: int = 1
    block_length: int | None = None  # None = the model's block_size (resolved by bind)
    scale: str = "mean"
    eubo_beta: float = 1.5

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(_is_int(self.num_mc, 1), f"num_mc must be a positive integer, got {self.num_mc!r}")
        _require(
            self.block_length is None or _is_int(self.block_length, 1),
            f"block_length must be a positive integer or None, got {self.block_length!r}",
        )
        _require(self.scale in ("mean", "sum"), f"scale must be 'mean' or 'sum', got {self.scale!r}")
        _require(_is_positive(self.eubo_beta), f"eubo_beta must be > 0, got {self.eubo_beta!r}")

    def bind(self, model: DiffusionLM, *, block_length: int | None = None) -> StaircaseElbo:
        """The staircase's blocks are the model's own (``model.block_size``), whatever the rollout block."""
        del block_length
        if self.block_length is not None:
            return self
        _require(bool(model.block_size), "staircase_elbo needs block_length (the model has no block_size)")
        return dataclasses.replace(self, block_length=int(model.block_size))

    def draw(self, batch: SequenceBatch, generator: torch.Generator) -> StaircaseNoise:
        _require(
            self.block_length is not None,
            "staircase_elbo: pass block_length or call bind(model) before draw so the block size is known",
        )
        comp_mask = batch.completion_mask.bool()
        n_seq, length = comp_mask.shape
        block = _block_ids(length, self.block_length, comp_mask.device)
        n_blocks = int(block.max()) + 1
        valid = torch.zeros(n_seq, n_blocks, dtype=torch.long, device=comp_mask.device)
        valid.index_add_(1, block, comp_mask.long())  # v_b
        valid = valid.unsqueeze(1).expand(n_seq, self.num_mc, n_blocks)
        count = torch.where(valid > 0, _uniform_int(generator, torch.ones_like(valid), valid.clamp(min=1)), 0)
        allowed = comp_mask.unsqueeze(1).expand(n_seq, self.num_mc, length)
        masked = _random_subsets(generator, allowed, count, block) | ~allowed
        return StaircaseNoise(masked=masked, count=count, block_size=self.block_length)

    def evaluate(self, model: DiffusionLM, batch: SequenceBatch, noise: StaircaseNoise) -> Estimate:
        if self.block_length is not None and noise.block_size != self.block_length:
            raise ValueError(f"noise drawn with block size {noise.block_size}, estimator uses {self.block_length}")
        n_seq, k_mc, length = noise.masked.shape
        seq = torch.arange(n_seq, device=noise.masked.device).repeat_interleave(k_mc)
        clean = batch.completion_ids[seq]
        noisy = torch.where(noise.masked.flatten(0, 1), model.mask_id, clean)
        prompt_valid = batch.prompt_mask.bool()[seq]
        input_ids = torch.cat((batch.prompt_ids[seq], clean, noisy), dim=1)
        attention = staircase_mask(prompt_valid, length, noise.block_size)
        positions = staircase_position_ids(prompt_valid, length)
        read_start = batch.prompt_ids.shape[1] + length
        logp = self._clean_token_logps(model, input_ids, attention, positions, clean, read_start)
        logp = logp.view(n_seq, k_mc, length)
        comp_mask = batch.completion_mask.bool()
        member = noise.masked & comp_mask.unsqueeze(1)
        elbo, eubo = spg_bounds(logp, member, comp_mask, self.eubo_beta)
        samples = None  # the per-sample values are kept on the sum scale (the sequence losses that read them)
        if self.scale == "sum":
            block = _block_ids(length, noise.block_size, comp_mask.device)
            valid = torch.zeros(n_seq, noise.count.shape[-1], dtype=logp.dtype, device=logp.device)
            valid.index_add_(1, block, comp_mask.to(logp.dtype))
            inv_t = valid.unsqueeze(1) / noise.count.to(logp.dtype).clamp(min=1)  # 1/t_b = v_b / c_b
            weight = inv_t.gather(-1, block.expand(n_seq, k_mc, length))
            samples = (torch.where(member, logp, torch.zeros_like(logp)) * weight).sum(-1)
            elbo = samples.mean(-1)
        return Estimate(
            token_logp=torch.where(member, logp, torch.zeros_like(logp)).flatten(0, 1),
            token_mask=member.flatten(0, 1),
            row_to_seq=seq,
            elbo=elbo,
            eubo=eubo,
            elbo_samples=samples,
        )


# ====================================================================================== registry
def build_estimator(name: str, **settings: Any) -> Estimator:
    """The estimator registered as ``name`` with the given settings (one error line for an unknown one)."""
    cls = ESTIMATORS.get(name)
    accepted = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(settings) - accepted)
    if unknown:
        raise UserError(
            f"estimator {name!r} has no option(s) {', '.join(unknown)}; it accepts {', '.join(sorted(accepted))}"
        )
    return cls(**settings)
