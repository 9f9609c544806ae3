"""Grading of final answers for GSM8K, MATH500 and AIME: math-verify (robust) and d1's parser (comparable).

Both verdicts are computed for every completion and recorded. ``GradeResult.correct`` is the math-verify
verdict on the completion's final answer (it accepts equivalent forms such as ``\\frac{1}{2}`` vs ``0.5`` and is
what this harness reports as accuracy; :mod:`.mathverify` says which answer counts); ``details["d1"]`` is d1's
verdict, which reproduces how published RL-dLLM numbers were scored, first-answer and fallback quirks included.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from ...errors import UserError
from ..base import GradeResult
from . import d1
from .mathverify import MathVerifyOutcome, math_verify_many
from .text import clip

D1Kind = Literal["gsm8k", "math"]
_PLAIN_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def gsm8k_gold(answer: str | int | float) -> str:
    """The GSM8K gold number as a plain decimal string (``"#### 1,080"`` -> ``"1080"``, ``"-3"`` -> ``"-3"``).

    Accepts the dataset's worked solution (the text after ``####``, as ``extract_hash_answer`` in d1/TRL) or
    the bare number. d1's own gold regex drops the sign of negative answers (2 of 1,319 test items: -10 and -3,
    which d1 can therefore never mark correct); this parser keeps it.
    """
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise UserError(f"GSM8K answer must be a string or a number, got {type(answer).__name__}")
    text = str(answer)
    if "####" in text:
        text = text.split("####")[1]
    number = text.strip().replace(",", "").removeprefix("$").strip()
    if not _PLAIN_NUMBER.fullmatch(number):
        raise UserError(f"GSM8K answer is not a number after '####': {clip(text.strip())!r}")
    return number


def _format_number(value: float | None) -> str | None:
    if value is None:
        return None
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def grade_math_answer(prediction: str, gold: str, kind: D1Kind, *, timeout_s: float | None = None) -> GradeResult:
    """Grade ``prediction`` against the final answer ``gold`` (GSM8K: a plain number).

    ``kind`` picks d1's parser: ``gsm8k`` (float equality of the first box / last number in the first
    ``<answer>``) or ``math`` (``strip_string`` equality of the last box). ``timeout_s`` bounds math-verify.
    """
    return grade_math_answers([prediction], [gold], kind, timeout_s=timeout_s)[0]


def grade_math_answers(
    predictions: Sequence[str], golds: Sequence[str], kind: D1Kind, *, timeout_s: float | None = None
) -> list[GradeResult]:
    """:func:`grade_math_answer` for each pair, in order; the math-verify checks run concurrently on the pool.

    Why: math-verify is the slow part and runs in worker processes; submitting the whole batch keeps every
    worker busy, while each answer keeps its own hard limit and gets the verdict it would get alone.
    """
    outcomes = math_verify_many(golds, predictions, style="grader", timeout_s=timeout_s)
    return [_grade(p, g, kind, o) for p, g, o in zip(predictions, golds, outcomes, strict=True)]


def _grade(prediction: str, gold: str, kind: D1Kind, outcome: MathVerifyOutcome) -> GradeResult:
    """Both verdicts of one answer, given math-verify's ``outcome`` for it."""
    if kind == "gsm8k":
        value = d1.extract_gsm8k(prediction)
        d1_correct, d1_extracted = value is not None and value == float(gold), _format_number(value)
    else:
        d1_extracted = d1.extract_math(prediction)
        d1_correct = d1_extracted is not None and d1.is_equiv(d1_extracted, gold)
    extracted = outcome.extracted if outcome.extracted is not None else d1_extracted
    return GradeResult(
        correct=outcome.correct,
        score=float(outcome.correct),
        extracted=clip(extracted),
        details={
            "math_verify": outcome.correct,
            "d1": d1_correct,
            "timed_out": outcome.timed_out,
            "math_verify_extracted": clip(outcome.extracted),
            "d1_extracted": clip(d1_extracted),
            **({"math_verify_error": outcome.error} if outcome.error and not outcome.timed_out else {}),
        },
    )
