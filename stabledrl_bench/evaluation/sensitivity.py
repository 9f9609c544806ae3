"""How much each protocol choice moves a checkpoint's score: the ``sensitivity`` command.

Users ask again and again why their numbers differ from published ones. Often the checkpoint is the same and the
evaluation is not: how the sampler treats EOS, the remasking rule, the block length, how many tokens a step commits,
greedy or sampled decoding, the prompt's template, the answer parser. This module scores one checkpoint under a base
protocol and under variants that each change one of those choices, on the same test items, and reports each change
paired by item: ``mean over items of (variant - base)`` with a percentile bootstrap over the items
(:func:`~stabledrl_bench.reporting.stats.bootstrap_mean_ci` of the differences), so a choice whose interval excludes
0 moves the score by more than the luck of the items. docs/protocols.md has a worked example.

The EOS confidence rule is CJ-GRPO's EOS early rejection (``eos early rejection``: the confidence of a drawn EOS
damped by a factor rising from :data:`EOSER_MIN_GAMMA` to 1 over the steps, ``sampling.eos_factors``) beside
Fast-dLLM's EOS stop (``eos stop``). One choice the issue tracker names is not a variant here: the few-shot count (the
native protocols are zero-shot; the lm-eval route takes ``num_fewshot``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stabledrl_bench.core.models import DiffusionLM
from stabledrl_bench.core.sampling import DECODE_MODES, DecodeSettingsError
from stabledrl_bench.evaluation.native import evaluate
from stabledrl_bench.evaluation.protocols import EvalProtocol
from stabledrl_bench.reporting.stats import Interval, bootstrap_mean_ci
from stabledrl_bench.tasks import get_task

# EOS early rejection's first factor: the authors' evaluation decodes EOSER with 0.01 (``yjyddq/EOSER-ASS-RL`` at
# ``5affb4e``, ``eval/eval.py`` lines 126-139; ``eval/generate.py: eoser_generate`` defaults to 0.4), their training
# too (``cj-grpo/slurm_scripts/train.yaml`` line 74)
EOSER_MIN_GAMMA = 0.01


@dataclass(frozen=True)
class Variant:
    """One protocol choice changed from the base: ``protocol`` replaces fields of the :class:`EvalProtocol`, ``decode``
    fields of the decode settings a protocol does not carry (the remasking rule, the EOS rule); ``other_verdict``
    reads the base's completions with the task's second grader instead of decoding again."""

    name: str
    choice: str  # which of the choices it varies (the report's grouping)
    protocol: Mapping[str, Any] = field(default_factory=dict)
    decode: Mapping[str, Any] = field(default_factory=dict)
    other_verdict: bool = False


@dataclass(frozen=True)
class VariantScore:
    """A variant's score and its change from the base, paired by item (None for the base itself)."""

    variant: Variant
    score: float
    change: Interval | None
    items_changed: int
    settings: dict[str, Any]


def variants(proto: EvalProtocol, canvas: int, *, temperature: float) -> list[Variant]:
    """The variants of ``proto`` on a ``canvas``-token completion that differ from it: each changes one choice.

    Full attention: the block halved and doubled (within the canvas), twice and half the tokens per step, random
    remasking, Fast-dLLM's EOS stop, CJ-GRPO's EOS early rejection (EOS's confidence damped by the factors of
    ``sampling.eos_factors`` from :data:`EOSER_MIN_GAMMA`) and Fast-dLLM's parallel decoding (confidence threshold
    0.9); every protocol: sampled decoding at ``temperature`` (greedy for a sampled base), the prompt without the
    chat template or the prefill. The answer-extraction variant is added by :func:`run_sensitivity` where the task
    has a second verdict."""
    found: list[Variant] = []
    if proto.attention == "full":
        block = min(proto.block_length, canvas)
        for size in (block // 2, block * 2):
            if 0 < size <= canvas and canvas % size == 0:
                found.append(Variant(f"block {size}", "block length", {"block_length": size}))
        found.append(Variant("random remasking", "remasking rule", decode={"remasking": "random"}))
        if not proto.stop_at_eos:
            found.append(Variant("eos stop", "EOS handling", {"stop_at_eos": True}))
        found.append(Variant("eos early rejection", "EOS handling", decode={"eos_min_gamma": EOSER_MIN_GAMMA}))
        if proto.strategy == "static" and proto.cache == "none":
            found.append(Variant("parallel decoding (Fast-dLLM)", "decoding rule", dict(DECODE_MODES["parallel"])))
    for per_step in (proto.tokens_per_step * 2, proto.tokens_per_step // 2):
        if per_step >= 1:
            found.append(Variant(f"{per_step} token(s) per step", "steps per token", {"tokens_per_step": per_step}))
    if proto.temperature == 0:
        found.append(Variant(f"temperature {temperature:g}", "temperature", {"temperature": temperature}))
    else:
        found.append(Variant("greedy", "temperature", {"temperature": 0.0}))
    if proto.chat_template:
        found.append(Variant("no chat template", "prompt", {"chat_template": False}))
    if proto.prefill:
        found.append(Variant("no prefill", "prompt", {"prefill": ""}))
    return found


def item_values(samples: Sequence[Mapping[str, Any]], value: Callable[[Mapping[str, Any]], float]) -> dict[str, float]:
    """One value per test item, by its doc id: the mean of ``value`` over the item's decodes (a sampled protocol
    decodes an item several times, its rows named ``<doc_id>#r<k>``)."""
    by_item: dict[str, list[float]] = {}
    for sample in samples:
        by_item.setdefault(str(sample["doc_id"]).split("#r")[0], []).append(float(value(sample)))
    return {item: sum(values) / len(values) for item, values in by_item.items()}


def headline(task_name: str) -> Callable[[Mapping[str, Any]], float]:
    """A sample's value in the task's table cell: its ``correct`` flag, or its ``score`` (Sudoku's cell accuracy)."""
    name = get_task(task_name).headline_field
    return lambda sample: float(sample[name])


def other_verdict(task_name: str, samples: Sequence[Mapping[str, Any]]) -> tuple[str, Callable] | None:
    """The task's second reading of the same completions, if it has one: the exact-solution flag beside Sudoku's
    cell accuracy, or d1's answer parser beside math-verify; None otherwise (e.g. Countdown, one grader)."""
    if get_task(task_name).headline_field == "score":
        return "exact answer instead of partial credit", lambda sample: float(sample["correct"])
    if samples and all(isinstance(sample["details"].get("d1"), bool) for sample in samples):
        return "d1's answer parser", lambda sample: float(sample["details"]["d1"])
    return None


def paired_change(base: Mapping[str, float], variant: Mapping[str, float]) -> tuple[Interval, int]:
    """Mean of ``variant - base`` over the items (paired by doc id) with its bootstrap interval, and how many items
    changed."""
    if base.keys() != variant.keys():
        raise ValueError(f"paired change over different items ({len(base)} and {len(variant)})")
    differences = [variant[item] - base[item] for item in base]
    return bootstrap_mean_ci([differences]), sum(1 for d in differences if d != 0)


def run_sensitivity(
    dlm: DiffusionLM,
    task_name: str,
    proto: EvalProtocol,
    *,
    canvas: int,
    temperature: float = 0.7,
    limit: int | None = None,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = True,
) -> tuple[list[VariantScore], list[tuple[Variant, str]]]:
    """The base protocol's score first, then every variant's (:func:`variants`) with its change paired by item;
    and the variants the decoder refuses for this canvas, with its reason (they are reported, not scored)."""
    value = headline(task_name)

    def score(variant: Variant) -> tuple[dict[str, float], list[dict[str, Any]], dict[str, Any]]:
        out = evaluate(
            dlm,
            task_name,
            protocol=dataclasses.replace(proto, **variant.protocol),
            max_completion_length=canvas,
            limit=limit,
            batch_size=batch_size,
            seed=seed,
            progress=progress,
            decode_overrides=variant.decode,
        )
        return item_values(out.samples, value), out.samples, out.settings

    base_variant = Variant(f"{proto.name} (base)", "base")
    base, base_samples, base_settings = score(base_variant)
    scores = [VariantScore(base_variant, _mean(base), None, 0, base_settings)]
    second = other_verdict(task_name, base_samples)
    if second is not None:
        label, reading = second
        read = item_values(base_samples, reading)
        scores.append(
            VariantScore(
                Variant(label, "answer extraction", other_verdict=True),
                _mean(read),
                *paired_change(base, read),
                base_settings,
            )
        )
    refused: list[tuple[Variant, str]] = []
    for variant in variants(proto, canvas, temperature=temperature):
        try:
            values, _, settings = score(variant)
        except DecodeSettingsError as exc:
            refused.append((variant, str(exc)))
            continue
        scores.append(VariantScore(variant, _mean(values), *paired_change(base, values), settings))
    return scores, refused


def _mean(values: Mapping[str, float]) -> float:
    return sum(values.values()) / len(values)


def format_report(scores: Sequence[VariantScore], refused: Sequence[tuple[Variant, str]], *, what: str) -> str:
    """A markdown table: each variant's score and its change from the base in points, paired by item (95% CI)."""
    lines = [
        f"Protocol sensitivity of {what}.",
        "Each row changes one choice of the base protocol; the change is the mean over the test items of",
        "(variant - base) in points, with a 95% bootstrap interval over the items.",
        "",
        "| choice | variant | score | change (points) | items changed |",
        "|---|---|---:|---:|---:|",
    ]
    for entry in scores:
        change = "" if entry.change is None else entry.change.text("+.1f")
        changed = "" if entry.change is None else str(entry.items_changed)
        lines.append(
            f"| {entry.variant.choice} | {entry.variant.name} | {100 * entry.score:.1f} | {change} | {changed} |"
        )
    lines += ["", *(f"Not scored: {variant.name} ({reason})." for variant, reason in refused)] if refused else []
    return "\n".join(lines) + "\n"


def report_record(scores: Sequence[VariantScore], **about: Any) -> dict[str, Any]:
    """The report as JSON: what was scored (``about``) and every variant with its settings and change."""
    return {
        **about,
        "variants": [
            {
                "name": entry.variant.name,
                "choice": entry.variant.choice,
                "protocol_changes": dict(entry.variant.protocol),
                "decode_changes": dict(entry.variant.decode),
                "other_verdict": entry.variant.other_verdict,
                "score": entry.score,
                "change": None if entry.change is None else dataclasses.asdict(entry.change),
                "items_changed": entry.items_changed,
                "settings": entry.settings,
            }
            for entry in scores
        ],
    }
