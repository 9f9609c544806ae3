"""Countdown grading: the harness's robust verdict and d1's verdict, both via the safe evaluator.

Robust extraction: the final answer (:func:`.text.final_answer`: the later of the last balanced ``\\boxed{..}``
and the last ``<answer>..</answer>``, so a corrected attempt counts; a blank one is no expression), else the whole
completion; ``\\times \\cdot × ·`` become ``*``, ``\\div ÷`` become ``/``, ``$`` and ``\\left``/``\\right`` are
dropped, and an equation ``expr = N`` (or ``N = expr``, or a chain ``expr = ... = N``) is reduced to ``expr``.
Correct iff the expression's integer literals satisfy the number rule (d1's ``exact`` by default, StableDRL's
``subset`` as an option) and its exact value is within 1e-5 of the target (d1's tolerance).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..base import GradeResult
from . import d1
from .arithmetic import NumberRule, parse_arithmetic, uses_numbers
from .text import clip, final_answer

_REPLACEMENTS = (
    ("\\times", "*"),
    ("\\cdot", "*"),
    ("×", "*"),
    ("·", "*"),
    ("\\div", "/"),
    ("÷", "/"),
    ("\\left", ""),
    ("\\right", ""),
    ("$", ""),
)


def _is_number(text: str) -> bool:
    parsed = parse_arithmetic(text)
    return parsed is not None and len(parsed.literals) == 1


def extract_expression(completion: str) -> str:
    """The expression a completion proposes (see the module docstring)."""
    answer = final_answer(completion)
    candidate = completion if answer is None else answer.text
    for old, new in _REPLACEMENTS:
        candidate = candidate.replace(old, new)
    sides = [side.strip() for side in candidate.split("=")]
    if len(sides) >= 2 and _is_number(sides[-1]):
        return sides[0]
    if len(sides) == 2 and _is_number(sides[0]):
        return sides[1]
    return candidate.strip()


def grade_countdown(completion: str, numbers: Sequence[int], target: int, rule: NumberRule = "exact") -> GradeResult:
    """Verdict for a Countdown completion; ``details["d1"]`` is d1's verdict (always the ``exact`` rule)."""
    expression = extract_expression(completion)
    parsed = parse_arithmetic(expression)
    integers = None if parsed is None else parsed.integers
    numbers_ok = integers is not None and uses_numbers(integers, numbers, rule)
    value = None if parsed is None else parsed.value
    correct = numbers_ok and value is not None and abs(value - target) < 1e-5
    d1_correct, d1_expression = d1.countdown_correct(completion, list(numbers), target)
    return GradeResult(
        correct=correct,
        score=float(correct),
        extracted=clip(expression),
        details={
            "d1": d1_correct,
            "numbers_ok": numbers_ok,
            "value": None if value is None or abs(value) > 1e300 else float(value),
            "rule": rule,
            "d1_extracted": clip(d1_expression),
        },
    )
