"""Diffusion samplers: LLaDA's semi-autoregressive low-confidence remasking and SDAR-style block diffusion.

Both samplers start from an all-MASK completion and, step by step, commit some masked positions to a sampled
token; a committed token is never remasked. They record, for every completion token, the global index of the
step that committed it (``unmask_step``): the trajectory TraceRL trains on (docs/estimators.md#trace_replay).

* :func:`llada_generate` (full attention; ``ML-GSAI/LLaDA: generate.py``, docs/protocols.md#d1): every step is a full
  forward over ``[prompt | completion]``; within the current block, the top-k masked positions by confidence
  ``c_k = softmax(l)_k[x0_k]`` are committed, ``x0 = argmax(l / tau + Gumbel)``. That is the default, exact
  mode. Fast-dLLM's approximations (arXiv:2505.22618, ``NVlabs/Fast-dLLM: llada/generate.py``) are opt-in:
  an approximate KV cache refreshed at every block start (``cache="prefix"|"dual"``), confidence-threshold
  parallel decoding (``strategy="dynamic"``) and stopping rows at their first EOS (``stop_at_eos``).
* :func:`block_diffusion_generate` (block-causal attention; SDAR's ``Gen-Verse/dLLM-RL: generate.py``,
  docs/protocols.md#tracerl-static-and-tracerl-dynamic): blocks are decoded left to right, each one against an
  exact KV cache of the prompt and the finished blocks (or, without cache, by recomputing them under
  :func:`~stabledrl_bench.core.masks.block_causal_mask`).

Each sampler has its settings type, checked when built: :class:`FullDecode` and :class:`BlockDecode`;
:func:`generate` decodes a model with the one of its attention, and results record either in one flat form
(:data:`RECORD_FIELDS`, read back by :func:`recorded_decode`).

Step indices are global and per row: step ``i`` (0-based) of block ``j`` is ``j * steps_per_block + i``. They
are monotone over blocks, every block owns the range ``[j*n, (j+1)*n)``, and a row's trajectory does not depend
on the other rows of the batch. (The ascending schedule has one block, whose steps are the global steps.)

Two rules of CJ-GRPO's authors (``yjyddq/EOSER-ASS-RL``, arXiv 2509.23924) are settings of the LLaDA sampler, off by
default: the ascending step sizes (``schedule="ascending"``, :func:`ascending_schedule`: 2^i tokens at step i, so a
canvas of L tokens takes log2 L steps) and EOS early rejection (``eos_min_gamma`` / ``eos_max_gamma``,
:func:`eos_factors`: EOS's confidence scaled by a factor that rises over the steps, so EOS is committed late).

Deliberate differences from the reference code (each one keeps the result well defined):

* The MASK token is never sampled (its logit is set to -inf). The reference may commit MASK, which the next
  step then treats as masked again, breaking its own per-step schedule.
* LLaDA: ``steps`` must be a multiple of the number of blocks (LLaDA's assertion; d1 silently floors), so the
  recorded ``steps`` is the number of forward passes actually run.
* Block diffusion: blocks are aligned to the end of the prompt (as in :mod:`stabledrl_bench.core.masks` and
  dLLM-RL), so the whole prompt is prefilled and the completion starts a fresh block; SDAR instead lets the
  prompt's last partial block share a block with the first completion tokens.
* Block diffusion, dynamic: the fallback quota is capped at the number of masked tokens left in the row's block
  (SDAR's batched top-k would otherwise overwrite committed tokens).
* Block diffusion at ``temperature=0``: the token is the argmax and its confidence is its probability under the
  filtered *untempered* distribution (SDAR's code divides by zero there).
* The store pass after the final block (and after blocks where every remaining row stopped) is skipped: its
  keys/values would never be read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from stabledrl_bench.core.masks import block_causal_mask, real_positions
from stabledrl_bench.core.models.interface import DiffusionLM
from stabledrl_bench.errors import UserError

REMASKING = ("low_confidence", "random")
SCHEDULES = ("linear", "ascending")  # tokens per step: LLaDA's even split per block, or ASS's 2^i
STRATEGIES = ("static", "dynamic")
FULL_STRATEGIES = (*STRATEGIES, "factor")  # Fast-dLLM's factor rule: full attention only
CACHE_MODES = ("none", "prefix", "dual")


class DecodeSettingsError(UserError, ValueError):
    """Invalid decoding settings: a user-facing error (one line) that is also a ``ValueError``."""


@dataclass
class GenerationOutput:
    """Result of one batched decode."""

    sequences: torch.Tensor  # [B, P+L] prompt (left-padded) + completion
    completion_ids: torch.Tensor  # [B, L]
    unmask_step: torch.Tensor  # [B, L] long; -1 only at positions filled with EOS after a row stopped
    nfe: int  # forward evaluations per sample (CFG step = 2, KV store pass = 1, prefill = 1)
    states: dict[int, DecodeState] = field(default_factory=dict)  # the partial states asked for, by step


@dataclass(frozen=True)
class DecodeState:
    """A partial decode of :func:`llada_generate`: everything the sampler needs to continue it from step ``step``.

    Why: a rollout tree (d-TreeRPO) branches one partial state into several continuations, and hint injection
    (IGPO) edits a canvas before decoding goes on; both need to start the sampler mid-run. Exact full-attention
    decoding reads nothing else across steps (a block's transfer quota is read back from the canvas and
    ``unmask_step``, :func:`_block_quota`, the EOS factors depend only on the settings and the step, and a full
    forward has no cache), so continuing from here with a generator in state ``rng_state`` draws what the
    uninterrupted run drew, bitwise. The tensors are the state's own copies; resuming never writes into them.
    """

    sequences: torch.Tensor  # [B, P+L] the canvas before step ``step``'s commits: prompt (left-padded) + completion
    unmask_step: torch.Tensor  # [B, L] long, the step that committed each token so far (-1: not committed)
    step: int  # the global step (j * steps_per_block + i) at which decoding continues
    rng_state: torch.Tensor | None  # ``generator.get_state()`` before the step's draws (None: no generator given)

    def generator(self) -> torch.Generator | None:
        """A fresh generator in the state's random stream (on the canvas's device): resuming with it continues the
        uninterrupted run bitwise; each call gives a new one, so the state can be resumed any number of times."""
        if self.rng_state is None:
            return None
        generator = torch.Generator(device=self.sequences.device)
        generator.set_state(self.rng_state)
        return generator


@dataclass(frozen=True)
class DecodeStep:
    """One step of :func:`llada_generate` as an observer sees it, before the step's tokens are committed.

    Why: a rollout scheme may need what the sampler saw at every step (EGSPO ranks the steps by the entropy of the
    committed tokens' distributions and rewards the one-step denoised prediction of each state; MDPO rewards the
    sampler's own full prediction at every step and weights its loss by the predicted tokens' probabilities), and
    recomputing it would cost a forward pass per step. The tensors are the sampler's own; an observer copies what it
    keeps.
    """

    index: int  # the global step (j * steps_per_block + i)
    rows: torch.Tensor  # [R] the rows of the batch still decoding, which the tensors below are about
    state: torch.Tensor  # [R, P+L] the sequences before this step's commits
    logits: torch.Tensor  # [R, P+L, V] the step's full forward (with CFG: the guided logits)
    block_logits: torch.Tensor  # [R, b, V] float64, MASK excluded: the untempered distribution of the block
    selected: torch.Tensor  # [R, b] bool, the block positions this step commits
    span: slice  # the block's columns in ``state``
    tokens: torch.Tensor  # [R, b] the tokens the sampler drew for the block (written where ``selected``)


StepObserver = Callable[[DecodeStep], None]


@dataclass(frozen=True)
class FullDecode:
    """How a full-attention (LLaDA-style) model decodes: the settings of :func:`llada_generate`, checked here.

    The defaults are exact decoding. ``cache != "none"``, ``strategy="dynamic"`` and ``stop_at_eos`` are
    Fast-dLLM's approximations (see :func:`llada_generate`), as is ``strategy="factor"`` (with ``factor``).
    ``schedule="ascending"`` (one block of the canvas in floor(log2 L) steps, :func:`ascending_schedule`) and
    ``eos_min_gamma`` / ``eos_max_gamma`` (:func:`eos_factors`; both 1: no rule) are CJ-GRPO's EOSER and ASS rules:
    other samplers, not approximations of this one.
    """

    max_completion_length: int = 256  # the canvas: completion tokens decoded
    block_length: int = 32  # semi-autoregressive block
    steps: int = 128  # forward passes in total, spread evenly over the blocks
    temperature: float = 0.0
    remasking: str = "low_confidence"
    cfg_scale: float = 0.0
    strategy: str = "static"
    threshold: float = 0.9
    stop_at_eos: bool = False
    cache: str = "none"
    factor: float = 1.0  # strategy="factor"
    schedule: str = "linear"  # tokens per step: LLaDA's even split per block, or "ascending" (ASS)
    eos_min_gamma: float = 1.0  # EOSER: EOS's confidence factor at the first step ...
    eos_max_gamma: float = 1.0  # ... rising to this one at the last (both 1: no EOS rule)

    def __post_init__(self) -> None:
        _check_common(self.max_completion_length, self.steps, self.temperature)
        _require(
            self.block_length > 0 and self.max_completion_length % self.block_length == 0,
            "block_length must divide max_completion_length",
        )
        _require(self.schedule in SCHEDULES, f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.schedule == "ascending":
            power = self.max_completion_length.bit_length() - 1
            _require(
                self.block_length == self.max_completion_length,
                "schedule='ascending' decodes the canvas as one block: block_length must be max_completion_length",
            )
            _require(
                self.steps == power,
                f"schedule='ascending' commits 2^i tokens at step i: a {self.max_completion_length}-token canvas "
                f"takes floor(log2 {self.max_completion_length}) = {power} steps, got steps={self.steps}",
            )
            _require(self.strategy == "static", "schedule='ascending' is a static quota: it needs strategy='static'")
        _require(
            self.steps % self.num_blocks == 0,
            f"steps ({self.steps}) must be a multiple of the number of blocks "
            f"max_completion_length/block_length = {self.num_blocks}",
        )
        _require(self.remasking in REMASKING, f"remasking must be one of {REMASKING}, got {self.remasking!r}")
        _require(self.cfg_scale >= 0, f"cfg_scale must be >= 0, got {self.cfg_scale}")
        _require(self.strategy in FULL_STRATEGIES, f"strategy must be one of {FULL_STRATEGIES}, got {self.strategy!r}")
        _require(0.0 <= self.threshold <= 1.0, f"threshold must be in [0, 1], got {self.threshold}")
        _require(self.factor > 0, f"factor must be > 0, got {self.factor}")
        _require(
            self.strategy == "static" or self.remasking == "low_confidence",
            f"strategy={self.strategy!r} uses the model's confidence; it needs remasking='low_confidence'",
        )
        _require(self.cache in CACHE_MODES, f"cache must be one of {CACHE_MODES}, got {self.cache!r}")
        _require(
            self.cache == "none" or self.cfg_scale == 0,
            f"cache={self.cache!r} does not support classifier-free guidance (cfg_scale > 0)",
        )
        _require(
            all(math.isfinite(g) and g >= 0 for g in (self.eos_min_gamma, self.eos_max_gamma)),
            f"eos_min_gamma and eos_max_gamma must be finite and >= 0, got {self.eos_min_gamma}, {self.eos_max_gamma}",
        )
        _require(
            not self.eos_rule or self.remasking == "low_confidence",
            "the EOS confidence rule (eos_min_gamma, eos_max_gamma) scales the model's confidence; it needs "
            "remasking='low_confidence'",
        )

    @property
    def num_blocks(self) -> int:
        return self.max_completion_length // self.block_length

    @property
    def eos_rule(self) -> bool:
        """Whether EOS's confidence is scaled (EOSER, :func:`eos_factors`): a factor other than 1 at some step."""
        return self.eos_min_gamma != 1 or self.eos_max_gamma != 1

    @property
    def draws_noise(self) -> bool:
        """Whether a decode draws random numbers (then it needs a generator, and repeats only with its stream)."""
        return self.temperature > 0 or self.remasking == "random"

    @property
    def approximate(self) -> bool:
        """Whether these settings decode differently from the LLaDA reference sampler."""
        return self.cache != "none" or self.strategy != "static" or self.stop_at_eos

    def to_dict(self) -> dict[str, Any]:
        return _record_form(self)


@dataclass(frozen=True)
class BlockDecode:
    """How a block-attention (SDAR-style) model decodes: the settings of :func:`block_diffusion_generate`.

    ``block_length`` is the model's own block size (recorded, and checked against the model by :func:`generate`);
    ``steps`` is the total budget, ``steps_per_block`` of it per block. ``use_cache`` is the exact KV cache.
    """

    max_completion_length: int = 256  # the canvas: completion tokens decoded
    block_length: int = 4  # the model's block size (SDAR's and TraDo's is 4)
    steps: int = 128
    temperature: float = 0.0
    strategy: str = "static"
    threshold: float = 0.9
    top_k: int = 0
    top_p: float = 1.0
    use_cache: bool = True
    stop_at_eos: bool = False

    def __post_init__(self) -> None:
        _check_common(self.max_completion_length, self.steps, self.temperature)
        _require(self.block_length > 0, f"block_length must be positive, got {self.block_length}")
        _require(
            self.max_completion_length % self.block_length == 0,
            f"max_completion_length ({self.max_completion_length}) must be a multiple of the block size "
            f"({self.block_length})",
        )
        _require(self.strategy in STRATEGIES, f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        _require(0.0 <= self.threshold <= 1.0, f"threshold must be in [0, 1], got {self.threshold}")
        _require(self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}")
        _require(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def draws_noise(self) -> bool:
        """Whether a decode draws random numbers (then it needs a generator, and repeats only with its stream)."""
        return self.temperature > 0

    @property
    def steps_per_block(self) -> int:
        """The total step budget spread over the blocks (at least one step each)."""
        return max(1, self.steps // (self.max_completion_length // self.block_length))

    def to_dict(self) -> dict[str, Any]:
        return _record_form(self)


DecodeSettings = FullDecode | BlockDecode
SETTINGS_TYPES: dict[str, type[FullDecode] | type[BlockDecode]] = {"full": FullDecode, "block": BlockDecode}

# Results record either sampler's settings as one flat dict in this order (fixed by records written before the
# two types were split), with the other sampler's fields at their neutral values; a field added later (cache,
# factor) is last, so settings recorded before it read back as what they were.
RECORD_FIELDS = (
    "max_completion_length",
    "block_length",
    "steps",
    "temperature",
    "remasking",
    "cfg_scale",
    "strategy",
    "threshold",
    "top_k",
    "top_p",
    "use_cache",
    "stop_at_eos",
    "cache",
    "factor",
)
_NEUTRAL = {
    "remasking": "low_confidence",
    "cfg_scale": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "use_cache": True,
    "cache": "none",
    "factor": 1.0,
}


# Fields added after results were committed, recorded (last) only where they differ from these values: a record
# without them decoded with these, and every record written before them stays byte-identical.
RECORDED_IF_SET: dict[str, Any] = {"schedule": "linear", "eos_min_gamma": 1.0, "eos_max_gamma": 1.0}


def _record_form(settings: DecodeSettings) -> dict[str, Any]:
    values = {**_NEUTRAL, **asdict(settings)}
    changed = {name: values[name] for name, usual in RECORDED_IF_SET.items() if values.get(name, usual) != usual}
    return {name: values[name] for name in RECORD_FIELDS} | changed


def recorded_decode(settings: Mapping[str, Any], attention: str) -> DecodeSettings:
    """The settings a result recorded (:data:`RECORD_FIELDS`), as the type of its model's ``attention``."""
    kind = SETTINGS_TYPES[attention]
    return kind(**{f.name: settings[f.name] for f in fields(kind) if f.name in settings})


# ---------------------------------------------------------------------------------------------- validation
def _require(condition: bool, message: str) -> None:
    if not condition:
        raise DecodeSettingsError(message)


def _check_prompt(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None) -> torch.Tensor:
    """Boolean [B, P] key-padding mask; the prompt must be left-padded (the completion follows real tokens)."""
    _require(prompt_ids.dim() == 2, f"prompt_ids must be [batch, prompt_len], got shape {tuple(prompt_ids.shape)}")
    if prompt_mask is None:
        return torch.ones_like(prompt_ids, dtype=torch.bool)
    _require(prompt_mask.shape == prompt_ids.shape, "prompt_mask must have the shape of prompt_ids")
    mask = prompt_mask.bool()
    _require(bool((mask[:, 1:] >= mask[:, :-1]).all()), "prompts must be left-padded (prompt_mask False...True)")
    return mask


def _check_generator(generator: torch.Generator | None, needed: bool, device: torch.device) -> None:
    """Randomness comes only from the caller's generator, which must live where the noise is drawn."""
    if not needed:
        return
    _require(generator is not None, "temperature > 0 or random remasking needs a torch.Generator")
    _require(
        generator.device.type == device.type,
        f"generator is on {generator.device.type} but the model runs on {device.type}",
    )


def _check_common(max_completion_length: int, steps: int, temperature: float) -> None:
    _require(max_completion_length > 0, f"max_completion_length must be positive, got {max_completion_length}")
    _require(steps > 0, f"the number of steps must be positive, got {steps}")
    _require(temperature >= 0, f"temperature must be >= 0, got {temperature}")


# ---------------------------------------------------------------------------------------------- shared pieces
def transfer_schedule(masked_count: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens to commit per step, [B, steps]: every step gets floor(m/n), the first (m mod n) steps one more.

    LLaDA's ``get_num_transfer_tokens``: the linear noise schedule unmasks the same expected number of tokens at
    every step, and the counts sum exactly to the ``m`` masked tokens of the block.
    """
    base = torch.div(masked_count, steps, rounding_mode="floor")[:, None]
    extra = torch.arange(steps, device=masked_count.device)[None, :] < (masked_count % steps)[:, None]
    return base + extra.long()


def ascending_schedule(length: int, steps: int) -> list[int]:
    """ASS's tokens per step for a one-block canvas of ``length`` tokens in ``steps`` = floor(log2 length) steps:
    2^i at step i, and at the last step the rest, ``length - 2^(S-1) + 1`` (2^(S-1) + 1 for a power of two).

    ``cj-grpo/cj_grpo_trainer_eoser_ass.py`` at ``5affb4e``, ``get_num_transfer_tokens_ass`` (lines 531-556, its
    ``len(block_sizes) == 1`` branch: ``block_num`` 1, as ``train.yaml`` line 64 and ``eval/run_eval.sh`` run it).
    Why: few tokens are committed while the canvas is mostly MASK and the model least sure, many once the context
    is nearly complete, so a canvas of L tokens needs only log2 L forward passes. The counts sum to ``length``.
    """
    return [2**i for i in range(steps - 1)] + [length - 2 ** (steps - 1) + 1]


def eos_factors(settings: FullDecode) -> list[float] | None:
    """EOS early rejection (EOSER): the factor on the confidence of a drawn EOS token at each global step, rising
    linearly in ``t`` from ``eos_min_gamma`` to ``eos_max_gamma``; None without the rule (both 1).

    ``cj-grpo/cj_grpo_trainer_eoser_ass.py`` at ``5affb4e``, ``sampling`` (lines 308-327) and ``ass_sampling``
    (329-345), ``x0_p = where(x0 == eos_id, x0_p * fac, x0_p)`` with ``fac = min + (max - min) t``:

    * ascending schedule (``ass_sampling``): ``t_i = (2^(i+1) - 1) / 2^S``, the share of a 2^S canvas committed
      after step i;
    * linear schedule (``sampling``): ``t_i = i / (S - 1)``, with i the step's index *within its block*, as
      ``eval/generate.py: eoser_generate`` (lines 220-254) passes it; the authors decode EOSER as one block
      (``eval/eval.py`` line 127, ``cj_grpo_trainer_eoser.py``), where it is the global step.

    S is the total number of steps; with one step the factor is ``eos_max_gamma`` (as the official code). Why: a
    masked diffusion model is confident about EOS at the end of a mostly masked canvas, so a low-confidence sampler
    fills the tail with EOS first and the answer is cut short; damping EOS early lets the content come first.
    """
    if not settings.eos_rule:
        return None
    low, high, total = settings.eos_min_gamma, settings.eos_max_gamma, settings.steps
    if total <= 1:
        return [high] * total
    if settings.schedule == "ascending":
        shares = [(2 ** (i + 1) - 1) / 2**total for i in range(total)]
    else:
        per_block = total // settings.num_blocks
        shares = [(i % per_block) / (total - 1) for i in range(total)]
    return [low + (high - low) * t for t in shares]


def _step_plan(settings: FullDecode) -> list[tuple[int, slice, list[int]]]:
    """The blocks of the canvas in decoding order: each one's first global step, its columns of the completion and
    its tokens to commit per step on an all-MASK block (a block holding fixed tokens: :func:`_row_quotas`)."""
    length, block = settings.max_completion_length, settings.block_length
    if settings.schedule == "ascending":
        return [(0, slice(0, length), ascending_schedule(length, settings.steps))]
    per_block = settings.steps // settings.num_blocks
    quota = transfer_schedule(torch.tensor([block]), per_block)[0].tolist()
    return [(j * per_block, slice(j * block, (j + 1) * block), quota) for j in range(settings.num_blocks)]


def _row_quotas(
    settings: FullDecode,
    schedule: list[int],
    block: torch.Tensor,
    block_steps: torch.Tensor,
    mask_id: int,
    first_step: int,
) -> torch.Tensor:
    """Each row's tokens to commit per step of one block, [B, steps]. The even split counts only the positions that
    were MASK when the block started (:func:`_block_quota`, as LLaDA's ``get_num_transfer_tokens``), so a canvas
    with fixed tokens (IGPO's hints) spreads only what is left to decode; the ascending schedule is CJ-GRPO's
    fixed 1, 2, 4, ... for every row, as its authors' ``get_num_transfer_tokens_ass`` (their canvases are all
    MASK). On an all-MASK block both are ``schedule`` itself."""
    if settings.schedule == "ascending":
        return torch.tensor(schedule, device=block.device).expand(block.shape[0], -1)
    return _block_quota(block, block_steps, mask_id, first_step, len(schedule))


def _top_by_confidence(confidence: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Boolean [B, b]: the ``count[row]`` highest-confidence positions of each row (ties: lower index first)."""
    order = torch.argsort(confidence, dim=-1, descending=True, stable=True)
    ranks_taken = torch.arange(confidence.shape[1], device=confidence.device)[None, :] < count[:, None]
    return torch.zeros_like(ranks_taken).scatter(1, order, ranks_taken)


def _pick_tokens(scores: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """argmax(scores) at tau=0, else a Gumbel-max sample argmax(scores + g), g = -log(-log u), u ~ U(0,1).

    ``scores`` are float64 log-weights already divided by tau: LLaDA's ``exp(l) / (-log u)^tau`` has the same
    argmax as ``l / tau - log(-log u)``, an exact sample from softmax(l / tau). float64 as in LLaDA (low-precision
    Gumbel-max hurts generation quality, arXiv:2409.02908).
    """
    if temperature == 0:
        return scores.argmax(dim=-1)
    u = torch.rand(scores.shape, generator=generator, dtype=torch.float64, device=scores.device)
    return (scores - torch.log(-torch.log(u))).argmax(dim=-1)


def _token_prob(scores: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """softmax(scores)[token] without materialising the softmax: exp(s_token - logsumexp(s))."""
    return torch.exp(scores.gather(-1, tokens[..., None])[..., 0] - torch.logsumexp(scores, dim=-1))


def _block_logits64(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """float64 copy of block logits with MASK excluded from the vocabulary (it is never a valid output)."""
    scores = logits.to(torch.float64, copy=True)
    scores[..., mask_id] = float("-inf")
    return scores


def _commit(
    state: torch.Tensor,
    steps: torch.Tensor,
    tokens: torch.Tensor,
    selected: torch.Tensor,
    step_index: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A block's state and unmask steps after writing the selected tokens, committed at ``step_index``."""
    return torch.where(selected, tokens, state), steps.masked_fill(selected, step_index)


def _block_quota(
    block: torch.Tensor, block_steps: torch.Tensor, mask_id: int, first_step: int, steps_per_block: int
) -> torch.Tensor:
    """Each row's tokens to commit per step of one block, [B, steps_per_block]: :func:`transfer_schedule` of the
    positions that were MASK when the block started, i.e. those still MASK in ``block`` [B, b] or committed by this
    block's own steps (``block_steps`` >= ``first_step``; a resumed decode may enter a block mid-way).

    LLaDA's ``get_num_transfer_tokens`` counts the block's masked positions, so a canvas whose block already holds
    fixed tokens (IGPO's hints, ``facebookresearch/igpo: utils/generate.py`` lines 848-858) spreads only the
    positions left to decode over the block's steps; on the all-MASK canvas of a plain decode every row counts b,
    the schedule of every row is the same, and so are the numbers.
    """
    started_masked = (block == mask_id) | (block_steps >= first_step)
    return transfer_schedule(started_masked.sum(dim=1), steps_per_block)


def _with_completion(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_completion_length: int, mask_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x = [prompt | MASK * L]`` and its key-padding mask ``[prompt_mask | True * L]``."""
    batch = prompt_ids.shape[0]
    masks = torch.full((batch, max_completion_length), mask_id, dtype=prompt_ids.dtype, device=prompt_ids.device)
    valid = torch.ones((batch, max_completion_length), dtype=torch.bool, device=prompt_ids.device)
    return torch.cat((prompt_ids, masks), dim=1), torch.cat((prompt_mask, valid), dim=1)


# ---------------------------------------------------------------------------------------------- LLaDA
def _llada_step_logits(
    model: DiffusionLM,
    x: torch.Tensor,
    key_valid: torch.Tensor | None,
    prompt_real: torch.Tensor,
    cfg_scale: float,
    keep: slice | None = None,
) -> torch.Tensor:
    """Logits [B, T, V] of one full forward (of the positions ``keep`` only, when given: the step reads one
    block); with CFG ``l = l_u + (s+1)(l_c - l_u)``, both halves in one batch.

    The unconditional copy replaces every real prompt token by MASK (LLaDA's ``un_x[prompt_index] = mask_id``).
    """
    if cfg_scale == 0:
        return model.logits(x, attention_mask=key_valid, keep=keep)
    uncond = x.clone()
    uncond[:, : prompt_real.shape[1]][prompt_real] = model.mask_id
    mask = None if key_valid is None else key_valid.repeat(2, 1)
    cond_logits, uncond_logits = model.logits(torch.cat((x, uncond)), attention_mask=mask, keep=keep).chunk(2)
    return uncond_logits + (cfg_scale + 1) * (cond_logits - uncond_logits)


class _WorkingBatch:
    """The rows of a batch still decoding, their positions and (with a cache) the backend's KV cache of them.

    Rows that stop (``stop_at_eos``) leave through :meth:`drop`, from the batch and the cache alike, so their
    skipped work costs nothing. Both samplers' contexts build on it.
    """

    def __init__(self, model: DiffusionLM, x: torch.Tensor, key_valid: torch.Tensor) -> None:
        self.model = model
        self.x = x
        self.key_valid = key_valid
        self.positions = real_positions(key_valid)
        self.rows = torch.arange(x.shape[0], device=x.device)
        self.cache: Any = None  # the backend's own cache object
        self.nfe = 0

    def drop(self, stopped: torch.Tensor) -> None:
        """Remove the rows flagged in ``stopped`` [R] from the working batch and the cache."""
        keep = ~stopped
        self.rows = self.rows[keep]
        if self.cache is not None:
            self.cache = self.model.select_cache_rows(self.cache, keep)


class _FullContext(_WorkingBatch):
    """The working batch of full-attention decoding: the rows still decoding and, with a cache, their keys/values.

    ``cache="none"``: every step is a full forward (exact). ``prefix`` / ``dual`` (Fast-dLLM): the first step of
    each block is a full forward that also stores every position's keys/values; the later steps of the block
    forward only ``[block | rest]`` (prefix) or only the block (dual) against the stored keys/values of the
    other positions. Those were computed before this block's commits, so the logits are approximate -- except
    at the first step, which is the exact full forward. A model whose logits at i predict token i+1 (Dream)
    also forwards the position before the block, whose output is the block's first prediction.
    """

    def __init__(
        self,
        model: DiffusionLM,
        x: torch.Tensor,
        key_valid: torch.Tensor,
        prompt_real: torch.Tensor,
        cache: str,
        cfg_scale: float,
    ) -> None:
        super().__init__(model, x, key_valid)  # the cache holds every position but the forwarded ones
        self.prompt_real = prompt_real
        self.cache_mode = cache
        self.cfg_scale = cfg_scale
        self.shift = int(model.shift_logits)
        self.queries = torch.arange(0)  # positions forwarded against the cache
        self.full_logits: torch.Tensor | None = None  # the last step's whole forward, kept for an observer only
        self.keep_full = False

    def block_logits(self, span: slice, first_step: bool) -> torch.Tensor:
        """Logits [R, block, V] of the block at ``span`` for the working rows."""
        x = self.x[self.rows]
        if self.cache_mode == "none":
            self.nfe += 2 if self.cfg_scale > 0 else 1
            key_valid = self.key_valid[self.rows]
            keep = None if self.keep_full else span  # an observer reads the whole forward, decoding the block
            logits = _llada_step_logits(self.model, x, key_valid, self.prompt_real[self.rows], self.cfg_scale, keep)
            if not self.keep_full:
                return logits
            self.full_logits = logits
            return logits[:, span]
        if first_step:
            return self._refresh(x, span)
        mask = self._pattern(torch.cat((self._cached_positions(span), self.queries)), len(self.queries))
        block = slice(self.shift, self.shift + span.stop - span.start)
        logits, _ = self.model.forward_cached(
            x[:, self.queries], mask, self.positions[self.rows][:, self.queries], self.cache, store=False, keep=block
        )
        self.nfe += 1
        return logits

    def _refresh(self, x: torch.Tensor, span: slice) -> torch.Tensor:
        """Full forward storing every position, then the cache keeps only the positions not forwarded later."""
        total = x.shape[1]
        everything = torch.arange(total, device=x.device)
        logits, cache = self.model.forward_cached(
            x, self._pattern(everything, total), self.positions[self.rows], None, store=True, keep=span
        )
        self.nfe += 1
        start = span.start - self.shift
        self.queries = torch.arange(start, total if self.cache_mode == "prefix" else span.stop, device=x.device)
        self.cache = self.model.select_cache_positions(cache, self._cached_positions(span))
        return logits

    def _cached_positions(self, span: slice) -> torch.Tensor:
        """Positions whose keys/values stay cached during the block: before it, and (dual) after it."""
        total = self.x.shape[1]
        before = torch.arange(span.start - self.shift, device=self.x.device)
        if self.cache_mode == "prefix":
            return before
        return torch.cat((before, torch.arange(span.stop, total, device=self.x.device)))

    def _pattern(self, keys: torch.Tensor, queries: int) -> torch.Tensor:
        """Boolean [R, 1, Q, K] attention of ``queries`` rows to the ``keys`` positions: all but left padding."""
        return self.key_valid[self.rows][:, keys][:, None, None, :].expand(-1, 1, queries, -1)


# Named decoding modes for full-attention models: fields of FullDecode that differ from exact decoding.
# The fast protocols (d1-fast, ...) and the budget's ``rollout_decode`` are built from them. "fast" is
# Fast-dLLM's best LLaDA setting (dual cache + parallel decoding, threshold 0.9), plus the EOS stop.
DECODE_MODES: dict[str, dict[str, Any]] = {
    "exact": {},
    "fast": {"cache": "dual", "strategy": "dynamic", "threshold": 0.9, "stop_at_eos": True},
    "fast-prefix": {"cache": "prefix", "strategy": "dynamic", "threshold": 0.9, "stop_at_eos": True},
    "parallel": {"strategy": "dynamic", "threshold": 0.9, "stop_at_eos": True},
}


def _stopped_rows(completion: torch.Tensor, stop_ids: torch.Tensor, mask_id: int) -> torch.Tensor:
    """[R] rows whose text is final: a committed stop token with every position before the first one committed.

    Committed tokens never change, so later steps could only change positions after that stop token, which
    the text does not contain: stopping there keeps the text identical to decoding to the end.
    """
    is_stop = torch.isin(completion, stop_ids)
    has_stop = is_stop.any(dim=1)
    first = torch.where(has_stop, is_stop.long().argmax(dim=1), completion.shape[1])
    columns = torch.arange(completion.shape[1], device=completion.device)[None, :]
    undecided = ((completion == mask_id) & (columns < first[:, None])).any(dim=1)
    return has_stop & ~undecided


def _select_by_factor(
    confidence: torch.Tensor, masked: torch.Tensor, quota: torch.Tensor, factor: float
) -> torch.Tensor:
    """Fast-dLLM's factor rule (arXiv:2505.22618, ``get_transfer_index_dynamic``): commit the n most confident
    masked positions, n the longest run of the ranked confidences with ``c_(i) >= 1 - factor / (i + 1)``
    (i = 1, 2, ...): the more tokens are committed at once, the more confident each one must be. At least the
    static quota (so a tiny ``factor`` is static decoding), at most the masked positions left.
    """
    confidence = confidence.masked_fill(~masked, float("-inf"))
    ranked = confidence.sort(dim=1, descending=True).values
    ranks = torch.arange(1, ranked.shape[1] + 1, device=ranked.device, dtype=ranked.dtype)
    run = (ranked >= 1 - factor / (ranks + 1)).long().cumprod(dim=1).sum(dim=1)
    count = torch.maximum(run, masked.sum(dim=1).clamp(max=quota))
    return _top_by_confidence(confidence, count)


@torch.no_grad()
def llada_generate(
    model: DiffusionLM,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor | None,
    *,
    max_completion_length: int,
    block_length: int,
    steps: int,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    cfg_scale: float = 0.0,
    generator: torch.Generator | None = None,
    cache: str = "none",
    strategy: str = "static",
    threshold: float = 0.9,
    factor: float = 1.0,
    stop_at_eos: bool = False,
    schedule: str = "linear",
    eos_min_gamma: float = 1.0,
    eos_max_gamma: float = 1.0,
    observer: StepObserver | None = None,
    start: DecodeState | None = None,
    snapshots: Collection[int] = (),
) -> GenerationOutput:
    """LLaDA reference sampler (semi-autoregressive blocks, low-confidence or random remasking).

    For each block j (N_b = L / b blocks, n = S / N_b steps each) and step i: full forward of x under the key
    padding mask ``[prompt_mask | True]``; ``x0 = argmax(l / tau + g)`` (plain argmax at tau = 0); confidence
    ``c = softmax(l)[x0]`` (untempered, float64) or ``c ~ U(0, 1)`` for ``random``; ``c = -inf`` at committed
    positions (positions outside block j are never candidates); commit the top-k_{j,i} positions of each row,
    with k from :func:`transfer_schedule` of the row's masked count at block start. ``nfe = S`` (``2S`` with CFG).

    Approximate modes (Fast-dLLM), all off by default:

    * ``cache``: ``prefix`` / ``dual`` KV cache refreshed at each block start (see :class:`_FullContext`); one
      forward per step as before, so the NFE is unchanged but every forward after a block's first is shorter.
    * ``strategy="dynamic"``: also commit every masked position of the block whose confidence exceeds
      ``threshold`` (at least the static quota, so ``threshold=1`` is exact decoding); a block ends as soon as
      it has no MASK left, so fewer forwards are run. ``strategy="factor"``: the same with Fast-dLLM's factor
      rule instead of a fixed threshold (:func:`_select_by_factor`).
    * ``stop_at_eos``: a row stops as soon as its text is final (:func:`_stopped_rows`); its remaining MASK
      positions become EOS (``unmask_step = -1``) and it leaves the batch. The text up to the first stop token
      is the one decoding to the end gives (greedy; sampled draws depend on the batch shape).

    ``nfe`` counts the forwards run on the working batch (rows that stopped ran fewer).

    CJ-GRPO's rules (``yjyddq/EOSER-ASS-RL``), off by default: ``schedule="ascending"`` decodes the canvas as one
    block committing :func:`ascending_schedule`'s 2^i tokens at step i (``steps`` = floor(log2 L)); with
    ``eos_min_gamma`` / ``eos_max_gamma`` the confidence of a drawn EOS (``model.eos_id``, the tokenizer's EOS as
    the official ``eos_token_id``) is multiplied by the step's factor from :func:`eos_factors` before the top-k.
    Without them the arithmetic is the same.

    ``observer`` (exact forwards only, ``cache="none"``) is called at every step with a :class:`DecodeStep`, before
    the step's commits; without one nothing is kept and the arithmetic is the same.

    Resuming (exact decoding only): ``snapshots`` names global steps whose :class:`DecodeState` (taken before the
    step's random draws) the output keeps in ``states``; ``start`` continues a decode from such a state instead of
    from the all-MASK canvas (``prompt_ids`` and ``prompt_mask`` must be the ones it was decoded from). With the
    generator ``start.generator()`` the tokens, ``unmask_step`` and remaining forwards (``nfe`` counts only those)
    are bitwise the uninterrupted run's; any other generator gives an independent continuation. Without either,
    nothing is copied and the arithmetic is the same.
    """
    mask = _check_prompt(prompt_ids, prompt_mask)
    _require(model.attention == "full", "llada_generate needs a full-attention model; use block_diffusion_generate")
    settings = FullDecode(  # checks them
        max_completion_length=max_completion_length,
        block_length=block_length,
        steps=steps,
        temperature=temperature,
        remasking=remasking,
        cfg_scale=cfg_scale,
        strategy=strategy,
        threshold=threshold,
        stop_at_eos=stop_at_eos,
        cache=cache,
        factor=factor,
        schedule=schedule,
        eos_min_gamma=eos_min_gamma,
        eos_max_gamma=eos_max_gamma,
    )
    supported = ", ".join(model.full_cache_modes) or "none"
    _require(
        cache == "none" or cache in model.full_cache_modes,
        f"the {model.family} backend cannot decode with cache={cache!r} (its cache modes: {supported})",
    )
    _check_generator(generator, settings.draws_noise, prompt_ids.device)
    _require(observer is None or cache == "none", "a step observer needs exact forwards (cache='none')")
    _check_resumable(settings, start, snapshots)
    if cache != "none" and model.pad_free and not bool(mask.all()):
        return _by_padding(model, prompt_ids, mask, generator, **asdict(settings))

    prompt_len = prompt_ids.shape[1]
    x, key_valid = _with_completion(prompt_ids, mask, max_completion_length, model.mask_id)
    unmask_step = torch.full((x.shape[0], max_completion_length), -1, dtype=torch.long, device=x.device)
    first = 0
    if start is not None:
        x, unmask_step, first = _resumed(start, x, unmask_step)
    eos_factor = eos_factors(settings)
    stop_ids = torch.tensor(model.stop_ids, device=x.device)
    ctx = _FullContext(model, x, key_valid, mask, cache, cfg_scale)
    ctx.keep_full = observer is not None
    states: dict[int, DecodeState] = {}
    for offset, cols, schedule in _step_plan(settings):
        if offset + len(schedule) <= first:
            continue  # a block finished before the state resumed from
        span = slice(prompt_len + cols.start, prompt_len + cols.stop)
        quota = _row_quotas(settings, schedule, x[:, span], unmask_step[:, cols], model.mask_id, offset)
        for i in range(max(first - offset, 0), len(schedule)):
            index = offset + i
            if index in snapshots:
                states[index] = _snapshot(x, unmask_step, index, generator)
            state = x[ctx.rows, span]
            masked = state == model.mask_id
            if strategy != "static" and not masked.any():
                break  # static decoding runs (and draws noise for) every step, as the reference does
            logits = _block_logits64(ctx.block_logits(span, first_step=i == 0), model.mask_id)
            scores = logits / temperature if temperature > 0 else logits
            tokens = _pick_tokens(scores, temperature, generator)
            if remasking == "low_confidence":
                confidence = _token_prob(logits, tokens)
                if eos_factor is not None:
                    confidence = torch.where(tokens == model.eos_id, confidence * eos_factor[index], confidence)
            else:
                confidence = torch.rand(tokens.shape, generator=generator, dtype=torch.float64, device=x.device)
            if strategy == "factor":
                selected = _select_by_factor(confidence, masked, quota[ctx.rows, i], factor)
            else:
                selected = _select_block(confidence, masked, quota[ctx.rows, i], strategy, threshold)
            if observer is not None:
                assert ctx.full_logits is not None
                observer(DecodeStep(index, ctx.rows, x[ctx.rows], ctx.full_logits, logits, selected, span, tokens))
            x[ctx.rows, span], unmask_step[ctx.rows, cols] = _commit(
                state, unmask_step[ctx.rows, cols], tokens, selected, index
            )
            if stop_at_eos:
                completion = x[ctx.rows, prompt_len:]
                stopped = _stopped_rows(completion, stop_ids, model.mask_id)
                x[ctx.rows[stopped], prompt_len:] = completion[stopped].masked_fill(
                    completion[stopped] == model.mask_id, model.eos_id
                )
                ctx.drop(stopped)
                if len(ctx.rows) == 0:
                    break
        if len(ctx.rows) == 0:
            break
    return GenerationOutput(x, x[:, prompt_len:], unmask_step, ctx.nfe, states)


def _check_resumable(settings: FullDecode, start: DecodeState | None, snapshots: Collection[int]) -> None:
    """Snapshots and resumes only under exact decoding, at steps of the schedule: a KV cache and the rows that
    stopped at EOS are carried from step to step but not held by a state, and the other approximate modes (dynamic
    and factor steps) are not needed by the schemes that resume, so they are refused rather than left untested."""
    if start is None and not snapshots:
        return
    _require(
        not settings.approximate,
        "resuming a decode (start / snapshots) needs exact decoding (cache='none', strategy='static', "
        "stop_at_eos=False)",
    )
    steps = [*snapshots, *([] if start is None else [start.step])]
    bad = [s for s in steps if not (isinstance(s, int) and 0 <= s < settings.steps)]
    _require(not bad, f"decode state steps must be in [0, {settings.steps}) (the schedule's steps), got {bad}")


def _resumed(start: DecodeState, x: torch.Tensor, unmask_step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Working copies of ``start``'s canvas and unmask steps, checked against the fresh canvas ``x`` and steps of
    the prompt being decoded (same shapes, dtypes, device and prompt), and the step to continue at."""
    prompt_len = x.shape[1] - unmask_step.shape[1]
    for name, given, fresh in (("sequences", start.sequences, x), ("unmask_step", start.unmask_step, unmask_step)):
        _require(
            given.shape == fresh.shape and given.dtype == fresh.dtype and given.device == fresh.device,
            f"decode state {name} is {tuple(given.shape)} {given.dtype} on {given.device}, but this decode needs "
            f"{tuple(fresh.shape)} {fresh.dtype} on {fresh.device}",
        )
    _require(
        torch.equal(start.sequences[:, :prompt_len], x[:, :prompt_len]),
        "decode state canvas holds a different prompt from prompt_ids",
    )
    _require(
        bool((start.unmask_step < start.step).all()),
        f"decode state unmask_step records steps at or after its step {start.step}",
    )
    return start.sequences.clone(), start.unmask_step.clone(), start.step


def _snapshot(x: torch.Tensor, unmask_step: torch.Tensor, step: int, generator: torch.Generator | None) -> DecodeState:
    """The partial state before ``step``'s random draws (copies: the decode goes on writing into its tensors)."""
    rng_state = None if generator is None else generator.get_state()
    return DecodeState(x.clone(), unmask_step.clone(), step, rng_state)


def _by_padding(
    model: DiffusionLM,
    prompt_ids: torch.Tensor,
    mask: torch.Tensor,
    generator: torch.Generator | None,
    **kwargs: Any,
) -> GenerationOutput:
    """Cached decoding for a model that ignores attention masks: each group of rows with equal padding alone.

    Such a model must never see a pad token (:class:`DiffusionLM`), and a KV cache cannot be split per row the
    way :meth:`DiffusionLM.logits` splits a forward, so each group is decoded unpadded and put back in place.
    """
    pads = (~mask).sum(dim=1)
    sequences, _ = _with_completion(prompt_ids, mask, kwargs["max_completion_length"], model.mask_id)
    unmask_step = torch.full(sequences[:, mask.shape[1] :].shape, -1, dtype=torch.long, device=sequences.device)
    nfe = 0
    for pad in pads.unique().tolist():
        rows = (pads == pad).nonzero().squeeze(1)
        out = llada_generate(model, prompt_ids[rows, pad:], None, generator=generator, **kwargs)
        sequences[rows, pad:] = out.sequences
        unmask_step[rows] = out.unmask_step
        nfe = max(nfe, out.nfe)
    prompt_len = mask.shape[1]
    return GenerationOutput(sequences, sequences[:, prompt_len:], unmask_step, nfe)


# ---------------------------------------------------------------------------------------------- block diffusion
def filter_logits(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then top-p (nucleus) filtering of [..., V] scores: dropped tokens get -inf (SDAR's order).

    top-k keeps every score >= the k-th largest; top-p keeps, in descending order, every token whose preceding
    mass is <= p (so the token that crosses p is kept and at least one token survives).
    """
    if 0 < top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        drop_sorted = probs.cumsum(dim=-1) - probs > top_p
        drop_sorted[..., 0] = False
        scores = scores.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
    return scores


def _sample_block(
    logits: torch.Tensor,
    mask_id: int,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SDAR sampling: tokens from the tempered, top-k/top-p filtered distribution, and their probability there."""
    scores = _block_logits64(logits, mask_id)
    scores = filter_logits(scores / temperature if temperature > 0 else scores, top_k, top_p)
    tokens = _pick_tokens(scores, temperature, generator)
    return tokens, _token_prob(scores, tokens)


def _select_block(
    confidence: torch.Tensor,
    masked: torch.Tensor,
    quota: int | torch.Tensor,
    strategy: str,
    threshold: float,
) -> torch.Tensor:
    """Positions to commit in each row's block (``quota``: one for every row, or [R] each row's own).

    static: the top-``quota`` masked positions by confidence. dynamic: every masked position with confidence
    > threshold, unless that is fewer than the quota, then the top-quota ones. The quota is capped by the
    number of masked positions left (0 for rows whose block is already complete).
    """
    confidence = confidence.masked_fill(~masked, float("-inf"))
    count = masked.sum(dim=1).clamp(max=quota)
    top = _top_by_confidence(confidence, count)
    if strategy == "static":
        return top
    confident = confidence > threshold
    enough = confident.sum(dim=1) >= count
    return torch.where(enough[:, None], confident, top)


class _BlockContext(_WorkingBatch):
    """The working batch of block diffusion: the rows still decoding, and (with cache) their exact KV cache."""

    def __init__(
        self,
        model: DiffusionLM,
        x: torch.Tensor,
        key_valid: torch.Tensor,
        prompt_len: int,
        use_cache: bool,
    ) -> None:
        super().__init__(model, x, key_valid)
        self.prompt_len = prompt_len
        self.use_cache = use_cache

    def prefill(self) -> None:
        """Cache the prompt's keys/values under the block-causal mask (prompt blocks aligned to its end)."""
        if not self.use_cache or self.prompt_len == 0:
            return
        span = slice(0, self.prompt_len)
        mask = block_causal_mask(self.key_valid[:, span], self.prompt_len, self.model.block_size)
        self._cached_forward(span, mask, store=True)

    def block_logits(self, span: slice) -> torch.Tensor:
        """Logits [R, block, V] of the current block given the prompt and the finished blocks."""
        if self.use_cache:
            return self._cached_forward(span, self._block_queries_mask(span), store=False)
        context = slice(0, span.stop)
        mask = block_causal_mask(self.key_valid[self.rows, context], self.prompt_len, self.model.block_size)
        self.nfe += 1
        return self.model.logits(self.x[self.rows, context], mask, self.positions[self.rows, context], keep=span)

    def store(self, span: slice) -> None:
        """Append the finished block's keys/values to the cache (exact: it never attends to later blocks)."""
        if self.use_cache:
            self._cached_forward(span, self._block_queries_mask(span), store=True)

    def _block_queries_mask(self, span: slice) -> torch.Tensor:
        """The block's rows of the block-causal mask: every cached key and its own block, except left padding."""
        keys = self.key_valid[self.rows, : span.stop]
        return keys[:, None, None, :].expand(-1, 1, span.stop - span.start, -1)

    def _cached_forward(self, span: slice, mask: torch.Tensor, store: bool) -> torch.Tensor:
        logits, cache = self.model.forward_cached(
            self.x[self.rows, span], mask, self.positions[self.rows, span], self.cache, store=store
        )
        if store:
            self.cache = cache
        self.nfe += 1
        return logits


@torch.no_grad()
def block_diffusion_generate(
    model: DiffusionLM,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor | None,
    *,
    max_completion_length: int,
    steps_per_block: int,
    strategy: str = "static",
    threshold: float = 0.9,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    use_cache: bool = True,
    stop_at_eos: bool = False,
    generator: torch.Generator | None = None,
) -> GenerationOutput:
    """SDAR/TraDo block diffusion for block-causal models (block size = ``model.block_size``).

    Blocks of the completion are decoded left to right, each in at most ``steps_per_block`` steps: sample
    ``x0`` from softmax(filter(l / tau)) (argmax at tau = 0), confidence = that distribution's probability of
    ``x0``, commit per ``strategy`` (static quota: the block spread evenly over the steps). With ``use_cache``:
    one prefill of the prompt, one block-sized forward per step against the cache, and one store pass per
    finished block (except the last), so ``nfe = 1 + steps + blocks - 1`` for static decoding. Without cache
    every step recomputes ``[prompt | finished blocks | block]`` under the block-causal mask (same outputs,
    ``nfe = steps``). With ``stop_at_eos``, a row whose finished block holds a stop token stops there and the
    rest of its completion is filled with EOS (``unmask_step = -1``).
    """
    mask = _check_prompt(prompt_ids, prompt_mask)
    _require(model.attention == "block", "block_diffusion_generate needs a block-attention model; use llada_generate")
    block = int(model.block_size)
    num_blocks = max_completion_length // block if block > 0 else 0
    settings = BlockDecode(  # checks them
        max_completion_length=max_completion_length,
        block_length=block,
        steps=steps_per_block * max(1, num_blocks),
        temperature=temperature,
        strategy=strategy,
        threshold=threshold,
        top_k=top_k,
        top_p=top_p,
        use_cache=use_cache,
        stop_at_eos=stop_at_eos,
    )
    _require(
        not use_cache or model.supports_kv_cache,
        f"the {model.family} backend has no KV cache; decode with use_cache=False",
    )
    _check_generator(generator, settings.draws_noise, prompt_ids.device)

    prompt_len = prompt_ids.shape[1]
    x, key_valid = _with_completion(prompt_ids, mask, max_completion_length, model.mask_id)
    unmask_step = torch.full((x.shape[0], max_completion_length), -1, dtype=torch.long, device=x.device)
    quota = transfer_schedule(torch.tensor([block]), steps_per_block)[0].tolist()
    stop_ids = torch.tensor(model.stop_ids, device=x.device)
    ctx = _BlockContext(model, x, key_valid, prompt_len, use_cache)
    ctx.prefill()
    for j in range(num_blocks):
        cols = slice(j * block, (j + 1) * block)
        span = slice(prompt_len + cols.start, prompt_len + cols.stop)
        for i in range(steps_per_block):
            state = x[ctx.rows, span]
            masked = state == model.mask_id
            if not masked.any():
                break
            tokens, confidence = _sample_block(
                ctx.block_logits(span), model.mask_id, temperature, top_k, top_p, generator
            )
            selected = _select_block(confidence, masked, quota[i], strategy, threshold)
            x[ctx.rows, span], unmask_step[ctx.rows, cols] = _commit(
                state, unmask_step[ctx.rows, cols], tokens, selected, j * steps_per_block + i
            )
        if stop_at_eos:
            stopped = torch.isin(x[ctx.rows, span], stop_ids).any(dim=1)
            x[ctx.rows[stopped], span.stop :] = model.eos_id
            ctx.drop(stopped)
        if j + 1 < num_blocks and len(ctx.rows) > 0:
            ctx.store(span)
        if len(ctx.rows) == 0:
            break
    return GenerationOutput(sequences=x, completion_ids=x[:, prompt_len:], unmask_step=unmask_step, nfe=ctx.nfe)


# ---------------------------------------------------------------------------------------------- dispatch
def generate(
    model: DiffusionLM,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor | None,
    settings: DecodeSettings,
    generator: torch.Generator | None = None,
    observer: StepObserver | None = None,
    start: DecodeState | None = None,
    snapshots: Collection[int] = (),
) -> GenerationOutput:
    """Decode with the sampler that ``settings`` belong to, which must be the one of the model's attention:
    :func:`llada_generate` for :class:`FullDecode`, :func:`block_diffusion_generate` for :class:`BlockDecode`
    (whose ``block_length`` must be the model's block size). ``observer``, ``start`` and ``snapshots``: see
    :func:`llada_generate` (full attention only)."""
    kind = SETTINGS_TYPES[model.attention]
    _require(
        isinstance(settings, kind),
        f"{type(settings).__name__} settings cannot decode {model.name}, a {model.attention}-attention model: "
        f"give {kind.__name__}",
    )
    if isinstance(settings, FullDecode):
        return llada_generate(
            model,
            prompt_ids,
            prompt_mask,
            generator=generator,
            observer=observer,
            start=start,
            snapshots=snapshots,
            **asdict(settings),
        )
    _require(observer is None, "a step observer needs the full-attention (LLaDA) sampler")
    _require(
        start is None and not snapshots,
        "resuming a decode (start / snapshots) needs the full-attention (LLaDA) sampler; block diffusion keeps a "
        "KV cache across blocks that a decode state does not hold",
    )
    _require(
        settings.block_length == model.block_size,
        f"block_length {settings.block_length} is not the block size of {model.name} ({model.block_size})",
    )
    return block_diffusion_generate(
        model,
        prompt_ids,
        prompt_mask,
        max_completion_length=settings.max_completion_length,
        steps_per_block=settings.steps_per_block,
        strategy=settings.strategy,
        threshold=settings.threshold,
        temperature=settings.temperature,
        top_k=settings.top_k,
        top_p=settings.top_p,
        use_cache=settings.use_cache,
        stop_at_eos=settings.stop_at_eos,
        generator=generator,
    )


__all__ = [
    "CACHE_MODES",
    "DECODE_MODES",
    "RECORD_FIELDS",
    "SETTINGS_TYPES",
    "BlockDecode",
    "DecodeSettings",
    "DecodeSettingsError",
    "DecodeState",
    "DecodeStep",
    "FullDecode",
    "GenerationOutput",
    "StepObserver",
    "ascending_schedule",
    "block_diffusion_generate",
    "eos_factors",
    "filter_logits",
    "generate",
    "llada_generate",
    "recorded_decode",
    "transfer_schedule",
]
