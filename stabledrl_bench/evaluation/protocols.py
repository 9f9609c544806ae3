"""Named evaluation protocols: prompt style + decoding settings, recorded in every result.

Published dLLM numbers come from different evaluators; comparing them means decoding exactly as they did.
Each protocol names one such evaluator (docs/protocols.md gives each one's settings and upstream source):

* ``d1`` (default): d1/SPG's evaluator, basis of most published LLaDA RL numbers: greedy, block 32,
  steps = length / 2 (two tokens per step), chat template + task system prompt + ``<reasoning>`` prefill.
* ``stabledrl-code``: the official StableDRL ``math_metrics.py``: greedy, block 8, one token per step, the
  problem as that script builds it (its ``collate_fn_math`` / ``collate_fn_gsm8k``: prompt protocol
  ``stabledrl_eval``) without chat template. It grades prompt + completion there; we grade the completion only
  (the prompt contains ``\\boxed{answer here}``), a documented deviation.
* ``stabledrl-evalpy``: StableDRL's deleted ``eval/eval.py``: d1 prompts, block 32, steps = length.
* ``tracerl-static`` / ``tracerl-dynamic``: TraceRL's block-diffusion protocol (SDAR/TraDo): one token per step
  greedy (top-1) / temperature 1.0 with confidence threshold 0.9; TraceRL's own math prompt (``trado_sample.py``:
  the problem, then "Please reason step by step, ...", in the model's chat template, no prefill).
* ``tiny`` / ``tiny-static`` / ``tiny-dynamic``: the same decoders for the built-in tiny model, with the tasks'
  short ``tiny`` prompts (the tiny model cannot read d1's long system prompts).
* Approximate decoding (Fast-dLLM, arXiv:2505.22618; its LLaDA-8B GSM8K anchor at 256 tokens: 8.1x faster with
  dual cache + parallel decoding, -0.8 points), d1's and tiny's prompts and lengths with:
  ``d1-fast`` / ``tiny-fast``: dual KV cache + confidence threshold 0.9 + EOS stop; ``d1-fast-prefix``: the
  same with a prefix cache (neither cache runs on LLaDA's own remote code: use ``d1-parallel`` there); ``d1-parallel`` /
  ``tiny-parallel``: threshold 0.9 + EOS stop without a cache. Their numbers are never shown next to exact ones
  without saying so (:attr:`EvalProtocol.approximate`).
* Sampled evaluation for pass@k / maj@k (:mod:`stabledrl_bench.reporting.passk`): any protocol above decoded n
  times per problem at temperature T is the protocol ``<name>-n<n>-t<T>`` (e.g. ``tiny-n16-t1``, ``d1-n8-t0.6``),
  built on request by :func:`get_protocol`; its records are shown apart from greedy ones.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace

from stabledrl_bench.core.models import DiffusionLM
from stabledrl_bench.core.registry import Registry
from stabledrl_bench.core.sampling import DECODE_MODES, BlockDecode, DecodeSettings, FullDecode
from stabledrl_bench.errors import UserError


@dataclass(frozen=True)
class EvalProtocol:
    name: str
    description: str
    prompt_protocol: str  # the task's prompt construction (d1, stabledrl_eval, tracerl, tiny: tasks/base.py)
    attention: str  # "full" (LLaDA-style) or "block" (SDAR-style) models
    block_length: int = 32  # semi-autoregressive block for full-attention models
    tokens_per_step: int = 2  # steps = length / tokens_per_step (full) or block / tokens_per_step (block)
    temperature: float = 0.0
    strategy: str = "static"
    threshold: float = 0.9
    chat_template: bool = True  # apply the model's chat template to the user message
    prefill: str = "<reasoning>"  # text that opens the assistant turn (d1); "" for the short prompts
    repeats: int = 1  # evaluations per problem, averaged (TraceRL: AIME x20, others x3 when sampling)
    cache: str = "none"  # full attention: Fast-dLLM's approximate KV cache ("prefix" or "dual")
    stop_at_eos: bool = False  # full attention: rows stop at their first EOS (block protocols always stop)
    pass_at_k: bool = False  # decoded `repeats` times at `temperature` for pass@k / maj@k (see sampled_protocol)

    @property
    def sampling(self) -> str | None:
        """Table 2's column for a block-diffusion protocol: TraceRL's ``dynamic`` (confidence threshold) or
        ``static`` decoding; None for full attention (Table 1 has no such columns)."""
        if self.attention != "block":
            return None
        return "dynamic" if self.strategy == "dynamic" else "static"

    @property
    def approximate(self) -> bool:
        """Whether this full-attention protocol decodes differently from the LLaDA reference sampler."""
        return self.attention == "full" and self.full_settings(self.block_length).approximate

    def full_settings(self, max_completion_length: int) -> FullDecode:
        """Full-attention decode settings for a ``max_completion_length`` canvas (the block is capped at it)."""
        block = min(self.block_length, max_completion_length)
        if max_completion_length % block:
            raise UserError(f"protocol {self.name!r}: block {block} does not divide length {max_completion_length}")
        return FullDecode(
            max_completion_length=max_completion_length,
            block_length=block,
            steps=max(1, max_completion_length // self.tokens_per_step),
            temperature=self.temperature,
            strategy=self.strategy,
            threshold=self.threshold,
            stop_at_eos=self.stop_at_eos,
            cache=self.cache,
        )

    def settings(self, max_completion_length: int, model: DiffusionLM) -> DecodeSettings:
        """Decode settings for ``model`` on a ``max_completion_length`` canvas (block models: their block size)."""
        if model.attention != self.attention:
            kind = "block-diffusion" if self.attention == "block" else "full-attention"
            raise UserError(
                f"protocol {self.name!r} is for {kind} models; {model.name} has {model.attention} attention"
            )
        if self.attention == "block":
            block_size = model.block_size
            return BlockDecode(
                max_completion_length=max_completion_length,
                block_length=block_size,
                steps=(max_completion_length // block_size) * max(1, block_size // self.tokens_per_step),
                temperature=self.temperature,
                strategy=self.strategy,
                threshold=self.threshold,
                stop_at_eos=True,
                use_cache=model.supports_kv_cache,
            )
        return self.full_settings(max_completion_length)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _protocol(name: str, protocol: EvalProtocol) -> EvalProtocol:
    if not isinstance(protocol, EvalProtocol) or protocol.name != name:
        raise TypeError(f"protocol {name!r} must be an EvalProtocol named {name!r}, got {protocol!r}")
    return protocol


# Packages add protocols through the ``stabledrl_bench.protocols`` entry-point group (an EvalProtocol object).
PROTOCOLS: Registry[EvalProtocol] = Registry("evaluation protocol", "protocols", check=_protocol)
for _protocol_entry in (
    EvalProtocol("d1", "d1/SPG evaluator: greedy, block 32, 2 tokens/step, chat + <reasoning>", "d1", "full"),
    EvalProtocol(
        "stabledrl-code",
        "StableDRL math_metrics.py: greedy, block 8, 1 token/step, no chat template",
        "stabledrl_eval",
        "full",
        block_length=8,
        tokens_per_step=1,
        chat_template=False,
        prefill="",
    ),
    EvalProtocol(
        "stabledrl-evalpy",
        "StableDRL's deleted eval/eval.py: d1 prompts, block 32, 1 token/step",
        "d1",
        "full",
        tokens_per_step=1,
    ),
    EvalProtocol(
        "tracerl-static",
        "TraceRL static: block diffusion, greedy, 1 token/step, TraceRL's prompt",
        "tracerl",
        "block",
        tokens_per_step=1,
        prefill="",
    ),
    EvalProtocol(
        "tracerl-dynamic",
        "TraceRL dynamic: block diffusion, temperature 1.0, confidence threshold 0.9, TraceRL's prompt",
        "tracerl",
        "block",
        tokens_per_step=1,
        prefill="",
        temperature=1.0,
        strategy="dynamic",
        repeats=3,
    ),
    EvalProtocol(
        "tiny",
        "tiny model: d1 decoder (greedy, 2 tokens/step) with short prompts, block 8",
        "tiny",
        "full",
        block_length=8,
        prefill="",
    ),
    EvalProtocol(
        "tiny-static", "tiny block model: greedy, 1 token/step", "tiny", "block", tokens_per_step=1, prefill=""
    ),
    EvalProtocol(
        "tiny-dynamic",
        "tiny block model: greedy with confidence threshold 0.9",
        "tiny",
        "block",
        tokens_per_step=1,
        strategy="dynamic",
        prefill="",
    ),
):
    PROTOCOLS.register(_protocol_entry.name, _protocol_entry)

for _base, _name, _mode in (
    ("d1", "d1-fast", "fast"),
    ("d1", "d1-fast-prefix", "fast-prefix"),
    ("d1", "d1-parallel", "parallel"),
    ("tiny", "tiny-fast", "fast"),
    ("tiny", "tiny-parallel", "parallel"),
):
    _what = ", ".join(f"{key}={value}" for key, value in DECODE_MODES[_mode].items())
    PROTOCOLS.register(
        _name,
        replace(
            PROTOCOLS.get(_base),
            name=_name,
            description=f"APPROXIMATE (Fast-dLLM) {_base}: {_what}",
            **DECODE_MODES[_mode],
        ),
    )


SAMPLED_NAME = re.compile(r"(?P<base>.+)-n(?P<samples>[0-9]+)-t(?P<temperature>[0-9]+(?:\.[0-9]+)?)")


def sampled_name(base: str, samples: int, temperature: float) -> str:
    """The name of ``base`` decoded ``samples`` times at ``temperature``: ``tiny-n16-t1``, ``d1-n8-t0.6``."""
    return f"{base}-n{samples}-t{temperature:g}"


def sampled_protocol(base: str, samples: int, temperature: float) -> EvalProtocol:
    """Protocol ``base`` decoded ``samples`` times per problem at ``temperature``, for pass@k and maj@k.

    Everything else (prompts, canvas, blocks, steps, remasking) stays the base protocol's, so a sampled record
    differs from its greedy one only in the noise; the temperature is part of the name and of the record.
    """
    proto = PROTOCOLS.get(base)
    if proto.pass_at_k or proto.repeats > 1:
        raise UserError(f"protocol {base!r} already repeats its decodes; sample from a single-decode protocol")
    if samples < 2:
        raise UserError(f"pass@k needs at least 2 samples per problem, got {samples}")
    if not 0.0 < temperature <= 10.0:
        raise UserError(f"pass@k needs a sampling temperature in (0, 10], got {temperature:g}")
    return replace(
        proto,
        name=sampled_name(base, samples, temperature),
        description=f"{base} sampled {samples}x per problem at temperature {temperature:g} (pass@k, maj@k)",
        temperature=temperature,
        repeats=samples,
        pass_at_k=True,
    )


def get_protocol(name: str) -> EvalProtocol:
    """A registered protocol, or a sampled one named ``<protocol>-n<samples>-t<temperature>``."""
    match = SAMPLED_NAME.fullmatch(name)
    if match is None or name in PROTOCOLS:
        return PROTOCOLS.get(name)
    samples, temperature = int(match["samples"]), float(match["temperature"])
    if sampled_name(match["base"], samples, temperature) != name:
        canonical = sampled_name(match["base"], samples, temperature)
        raise UserError(f"protocol {name!r}: write it {canonical!r} (one spelling per protocol, it names files)")
    return sampled_protocol(match["base"], samples, temperature)
