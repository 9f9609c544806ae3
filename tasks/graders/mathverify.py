"""math-verify checks of final answers, run in isolated worker processes under a hard time limit.

Two styles are offered:

* ``grader`` (evaluation): the gold answer is parsed as ``\\boxed{gold}``; the prediction is the completion's
  final answer (:func:`.text.final_answer`: the later of the last balanced box and the last closed ``<answer>``
  tag, so a model that corrects itself is graded on its last attempt). A box is parsed as ``\\boxed{content}``
  like the gold, a tag's content both as ``$content$`` and as is. A blank final answer (``<answer></answer>``,
  ``\\boxed{}``) is no answer and is never correct; only a completion with neither a box nor a tag is parsed
  whole (math-verify then takes its last number or expression). Degree signs (``°``, ``\\degree``) in the gold
  and the prediction are written ``^{\\circ}``, the spelling math-verify reads as a unit annotation: ``\\boxed{90°}``
  would otherwise not parse at all.
* ``stabledrl`` (StableDRL's ``_math_verify_equal`` in ``dataloaders/math.py``): ``verify(parse(gold),
  parse(response))`` with math-verify's default extraction configs on the full response.

math-verify's own ``signal.alarm`` timeouts only work on the main thread and cannot interrupt C code, so they
are switched off inside the worker; the limit is enforced by :mod:`.isolation`, which kills an overrunning
worker. This module is both the parent-side API (:func:`math_verify`) and the worker-side registry
(``ISOLATED_FUNCTIONS``); math-verify itself is only imported in the workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from .isolation import IsolatedResult, shared_pool
from .text import final_answer

Style = Literal["grader", "stabledrl"]

# Per-answer hard limit for evaluation: legitimate checks take milliseconds, and a verdict must come back well
# within 2 s even for adversarial input. StableDRL's reward used 5 s (``timeout_seconds=5``).
GRADER_TIMEOUT_S = 1.5
STABLEDRL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class MathVerifyOutcome:
    """math-verify's verdict; ``timed_out``/``error`` explain a False that is not a real mismatch."""

    correct: bool
    extracted: str | None
    timed_out: bool = False
    error: str | None = None


def math_verify(
    gold: str, prediction: str, *, style: Style = "grader", timeout_s: float | None = None
) -> MathVerifyOutcome:
    """Whether ``prediction`` states ``gold``, per math-verify, within a hard wall-clock limit.

    Safe to call from any thread; calls run concurrently up to the pool size.
    """
    return math_verify_many([gold], [prediction], style=style, timeout_s=timeout_s)[0]


def math_verify_many(
    golds: Sequence[str], predictions: Sequence[str], *, style: Style = "grader", timeout_s: float | None = None
) -> list[MathVerifyOutcome]:
    """:func:`math_verify` for each pair, graded concurrently by the worker pool; outcomes in input order.

    Why a batch: answers checked one after another leave all workers but one idle. Each pair still gets its own
    hard limit and exactly the outcome :func:`math_verify` gives it (a time-out included).
    """
    if style not in ("grader", "stabledrl"):
        raise ValueError(f"unknown math-verify style {style!r}")
    limit = timeout_s if timeout_s is not None else (GRADER_TIMEOUT_S if style == "grader" else STABLEDRL_TIMEOUT_S)
    results = shared_pool(__name__).call_many(style, list(zip(golds, predictions, strict=True)), timeout_s=limit)
    return [_outcome(result) for result in results]


def _outcome(result: IsolatedResult) -> MathVerifyOutcome:
    if result.status == "ok":
        correct, extracted = result.value
        return MathVerifyOutcome(bool(correct), extracted)
    return MathVerifyOutcome(False, None, timed_out=result.status == "timeout", error=result.error)


def warm_up() -> None:
    """Start the worker processes now and wait for them (their start-up is a one-off cost per process)."""
    shared_pool(__name__).wait_until_ready()


# ------------------------------------------------------------------------------------- worker side
# Spellings of the degree sign that math-verify does not parse (a box holding one fails to parse), replaced in this
# order so that ``^°`` does not become ``^^{\circ}``. ``^\circ`` and ``^{\circ}`` already read as a unit (90 degrees
# = 90); the braces keep a following letter (``30°C``) from merging into the command name.
_DEGREE_SPELLINGS = ("^{°}", "^°", "\\textdegree", "\\degree", "°")
_DEGREE = "^{\\circ}"


def normalise_degrees(text: str) -> str:
    """``90°``, ``90^°`` and ``90\\degree`` -> ``90^{\\circ}``, which math-verify compares as ``90``."""
    for spelling in _DEGREE_SPELLINGS:
        text = text.replace(spelling, _DEGREE)
    return text


def _configs() -> list[Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


def _extracted(parsed: list[Any]) -> str | None:
    """math-verify's ``parse`` returns ``[sympy_object, matched_string]`` (or ``[]``)."""
    return str(parsed[-1]) if parsed else None


@lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> list[Any]:
    from math_verify import parse

    return parse("\\boxed{" + normalise_degrees(gold) + "}", extraction_config=_configs(), parsing_timeout=None)


def prediction_candidates(prediction: str) -> list[str]:
    """Texts to parse for the ``grader`` style, best first; none for a blank final answer (module docstring)."""
    answer = final_answer(prediction)
    if answer is None:
        return [normalise_degrees(prediction)]
    content = normalise_degrees(answer.text.strip())
    if not content:
        return []
    if answer.boxed:
        return ["\\boxed{" + content + "}"]
    if any(delim in content for delim in ("$", "\\(", "\\[")):
        return [content]
    return ["$" + content + "$", content]


def _grader(gold: str, prediction: str) -> tuple[bool, str | None]:
    from math_verify import parse, verify

    target = _parse_gold(gold)
    first: str | None = None
    for text in prediction_candidates(prediction):
        parsed = parse(text, extraction_config=_configs(), parsing_timeout=None)
        first = first if first is not None else _extracted(parsed)
        if verify(target, parsed, timeout_seconds=None):
            return True, _extracted(parsed)
    return False, first


def _stabledrl(gold: str, prediction: str) -> tuple[bool, str | None]:
    from math_verify import parse, verify

    parsed = parse(prediction, parsing_timeout=None)
    return bool(verify(parse(gold, parsing_timeout=None), parsed, timeout_seconds=None)), _extracted(parsed)


# Checks through the kinds of final answer MATH500 has (fractions, tuples, intervals, symbols, text, units,
# matrices, complex numbers, lists). The first parse of each kind builds parser and sympy state: without these, a
# worker's first real answers took up to 0.9 s each on a busy two-core machine, most of the 1.5 s limit, and a
# batch meets two fresh workers at once after a start.
_WARMUP_ANSWERS = (
    ("1/2", "\\boxed{0.5}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "<answer>\\boxed{(3, \\pi/2)}</answer>"),
    ("p - q", "so the sum is \\boxed{q - p}"),
    ("[-2, \\sqrt{3})", "\\boxed{\\left[-2,\\sqrt 3\\right)}"),
    ("\\text{Evelyn}", "\\boxed{\\text{(E) Evelyn}}"),
    ("90^\\circ", "<answer>90°</answer>"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\boxed{\\begin{pmatrix} 1 \\\\ 3 \\end{pmatrix}}"),
    ("x^2+7x+10", "\\boxed{(x+2)(x+5)}"),
    ("6 - 5i", "\\boxed{6-5 i}"),
    ("\\{1, 2\\}", "\\boxed{1,2}"),
)


def isolated_warmup() -> None:
    """Import math-verify and sympy and check one answer of each kind, so a worker's first real calls are not slow."""
    for gold, prediction in _WARMUP_ANSWERS:
        _grader(gold, prediction)
    _stabledrl("\\boxed{72}", "The total is 72.")


ISOLATED_FUNCTIONS = {"grader": _grader, "stabledrl": _stabledrl}
