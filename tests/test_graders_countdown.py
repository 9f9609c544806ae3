"""Safe arithmetic evaluator, number-use rules and the Countdown grader (hand-computed cases)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from stabledrl_bench.tasks.graders.arithmetic import evaluate, parse_arithmetic, uses_numbers
from stabledrl_bench.tasks.graders.countdown import extract_expression, grade_countdown


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("3*5+7", Fraction(22)),
        ("(30 + 93) - 100", Fraction(23)),
        ("7/2", Fraction(7, 2)),
        ("-3+5", Fraction(2)),
        ("--3", Fraction(3)),
        ("1.5*2", Fraction(3)),
        (" (1+2)/3 \n", Fraction(1)),
        ("1/0", None),  # parsed, but division by zero has no value
    ],
)
def test_evaluate_values(expression: str, value: Fraction | None) -> None:
    assert evaluate(expression) == value
    assert parse_arithmetic(expression) is not None


@pytest.mark.parametrize(
    "expression",
    [
        "2**3",
        "9**9**9**9",
        "7//2",
        "__import__('os').system('true')",
        "1 if 1 else 2",
        "(1)(2)",
        "()",
        "...",
        "1e5",
        "1_000",
        "",
        "3 4",
        "(" * 5000 + "1" + ")" * 5000,
        "1+" * 50_000 + "1",
        "1" * 40,
    ],
)
def test_evaluate_rejects_everything_but_bounded_arithmetic(expression: str) -> None:
    assert parse_arithmetic(expression) is None


def test_evaluate_matches_float_arithmetic_on_random_expressions() -> None:
    """Independent check: random trees of + - * / over small integers, evaluated by hand-written recursion."""
    rng = np.random.default_rng(0)

    def build(depth: int) -> tuple[str, float]:
        if depth == 0 or rng.random() < 0.3:
            n = int(rng.integers(1, 50))
            return str(n), float(n)
        (left, a), (right, b) = build(depth - 1), build(depth - 1)
        op = "+-*/"[int(rng.integers(4))]
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else float("nan")}[op]
        return f"({left}{op}{right})", value

    checked = 0
    for _ in range(500):
        text, value = build(4)
        result = evaluate(text)
        if value != value:  # a division by zero somewhere
            continue
        assert result is not None and float(result) == pytest.approx(value, rel=1e-9, abs=1e-9)
        checked += 1
    assert checked > 300


def test_number_rules() -> None:
    assert uses_numbers([3, 5, 7], [7, 5, 3], "exact")
    assert not uses_numbers([3, 5], [3, 5, 7], "exact")
    assert uses_numbers([3, 5], [3, 5, 7], "subset")
    assert not uses_numbers([3, 3], [3, 5, 7], "subset")
    assert uses_numbers([3, 3], [3, 3, 7], "subset")
    with pytest.raises(ValueError, match="unknown number rule"):
        uses_numbers([1], [1], "some")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("completion", "expression"),
    [
        ("reasoning <answer>\\boxed{3 \\times 5 + 7}</answer>", "3 * 5 + 7"),
        ("<answer> 3*5+7 = 22 </answer>", "3*5+7"),
        ("<answer>22 = 3*5+7</answer>", "3*5+7"),
        ("$\\boxed{(30+93) \\div 1 - 100}$", "(30+93) / 1 - 100"),
        ("<answer>3*5+7 = 15+7 = 22</answer>", "3*5+7"),
        ("3*5+7", "3*5+7"),
    ],
)
def test_extract_expression(completion: str, expression: str) -> None:
    assert extract_expression(completion) == expression


def test_grade_countdown_verdicts() -> None:
    ok = grade_countdown("<answer>\\boxed{3 \\times 5 + 7}</answer>", [3, 5, 7], 22)
    assert ok.correct and ok.score == 1.0 and ok.details["d1"] and ok.extracted == "3 * 5 + 7"
    assert ok.details["value"] == 22.0
    # Robust extraction reads a bare answer tag; d1 parses the whole text without a box (its quirk).
    tag = grade_countdown("<answer>3*5+7</answer>", [3, 5, 7], 22)
    assert tag.correct and not tag.details["d1"]
    assert not grade_countdown("\\boxed{3*5+7}", [3, 5, 7], 23).correct  # wrong value
    assert not grade_countdown("\\boxed{3*5+5}", [3, 5, 7], 20).correct  # a number used twice
    unused = grade_countdown("\\boxed{3*5+7}", [3, 5, 7, 2], 22)
    assert not unused.correct and not unused.details["numbers_ok"]
    assert grade_countdown("\\boxed{3*5+7}", [3, 5, 7, 2], 22, rule="subset").correct  # StableDRL's rule
    assert not grade_countdown("\\boxed{3.0*5+7}", [3, 5, 7], 22).correct  # 3.0 is not the number 3
    assert not grade_countdown("", [1], 1).correct


# The final answer counts and a blank one is no expression; d1's verdict (computed before, never to move) reads
# the last box or the whole text whatever the harness does. Comments give the old ``correct`` where it differed.
@pytest.mark.parametrize(
    ("completion", "correct", "d1"),
    [
        ("\\boxed{3*5+5} wait, 5 twice. <answer>3*5+7</answer>", True, False),  # was False: the box came first
        ("<answer>3*5+5</answer> no: <answer>3*5+7</answer>", True, False),
        ("<answer>3*5+7</answer> no: \\boxed{3*5+5}", False, False),
        ("<answer>3*5+7</answer> <answer></answer>", False, False),
        ("<answer>3*5+7</answer> \\boxed{}", False, False),
        ("<answer>\\boxed{ }</answer> 3*5+7", False, False),
    ],
)
def test_countdown_final_answer_and_unchanged_d1(completion: str, correct: bool, d1: bool) -> None:
    result = grade_countdown(completion, [3, 5, 7], 22)
    assert (result.correct, result.details["d1"]) == (correct, d1)


def test_code_in_countdown_answers_is_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    for completion in (f"<answer>{payload}</answer>", f"\\boxed{{{payload}}}", payload):
        result = grade_countdown(completion, [1, 2], 3)
        assert not result.correct and not result.details["d1"]
    after_box = grade_countdown(f"\\boxed{{1+2}} {payload}", [1, 2], 3)  # the code is just ignored text
    assert after_box.correct and after_box.details["d1"]
    assert not marker.exists()
