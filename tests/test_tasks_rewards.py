"""Reward profiles against hand-computed values, component by component (docs/methods.md#reward-profiles)."""

from __future__ import annotations

import pytest

from stabledrl_bench.errors import UserError
from stabledrl_bench.tasks import get_task

GSM = {"question": "q", "answer": "Steps\n#### 72"}
GSM_COMMA = {"question": "q", "answer": "#### 1,080"}
MATH = {"problem": "p", "answer": "\\frac{1}{2}"}
CD = {"numbers": [3, 5, 7], "target": 22}
SUDOKU = {"puzzle": "1034340221034301", "solution": "1234341221434321"}  # blanks at 1, 6, 10, 14

LONG = "Let us reason carefully about every step of this problem. " * 4  # 200+ non-whitespace characters


def components(task: str, completion: str, doc: dict, profile: str) -> dict[str, float]:
    result = get_task(task).reward(completion, doc, profile)
    assert result.total == pytest.approx(sum(result.components.values()))
    return {k: round(v, 6) for k, v in result.components.items()}


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        # Canonical d1 layout: every tag once (4 x 0.125), strict matches, soft cannot (no DOTALL), digits.
        (
            "<reasoning>\nR\n</reasoning>\n<answer>\n72\n</answer>\n",
            {"xmlcount": 0.5, "soft_format": 0.0, "strict_format": 0.5, "int": 0.5, "correctness": 2.0},
        ),
        # One-line layout: soft matches, strict and xmlcount do not.
        (
            "<reasoning>R</reasoning> <answer>72</answer>",
            {"xmlcount": 0.0, "soft_format": 0.5, "strict_format": 0.0, "int": 0.5, "correctness": 2.0},
        ),
        # Trailing text: 0.125 - 0.001*5 (after "\n</answer>\n") and 0.125 - 0.001*(6-1) (after "\n</answer>").
        (
            "<reasoning>\nR\n</reasoning>\n<answer>\n72\n</answer>\nextra",
            {"xmlcount": 0.49, "soft_format": 0.0, "strict_format": 0.0, "int": 0.5, "correctness": 2.0},
        ),
        # Only "<reasoning>\n" and "\n</answer>" occur; nothing follows the last tag: 0.125 - 0.001 * (0 - 1).
        (
            "<reasoning>\na\nb\n</reasoning><answer>\n-3\n</answer>",
            {"xmlcount": 0.251, "soft_format": 0.0, "strict_format": 0.0, "int": 0.0, "correctness": 0.0},
        ),
        (
            "The answer is 72",
            {"xmlcount": 0.0, "soft_format": 0.0, "strict_format": 0.0, "int": 0.0, "correctness": 0.0},
        ),
    ],
)
def test_gsm8k_d1_components(completion: str, expected: dict[str, float]) -> None:
    assert components("gsm8k", completion, GSM, "d1") == pytest.approx(expected)


def test_gsm8k_d1_correctness_is_exact_string_match() -> None:
    assert components("gsm8k", "<answer>1,080</answer>", GSM_COMMA, "d1")["correctness"] == 2.0
    assert components("gsm8k", "<answer>1080</answer>", GSM_COMMA, "d1")["correctness"] == 0.0
    assert components("gsm8k", "<answer>\\boxed{72}</answer>", GSM, "d1")["correctness"] == 0.0


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<answer>\n\\boxed{\\frac{1}{2}}\n</answer>", {"correctness": 2.0, "boxed_and_answer_tags_format": 0.75}),
        ("\\boxed{0.5}", {"correctness": 2.0, "boxed_and_answer_tags_format": 0.25}),  # 0.5 -> \frac{1}{2}
        ("<answer>1/2</answer>", {"correctness": 0.0, "boxed_and_answer_tags_format": 0.75}),  # whole text compared
        ("<answer>\x08oxed</answer>", {"correctness": 0.0, "boxed_and_answer_tags_format": 1.0}),  # backspace quirk
        ("\\boxed{1/3}", {"correctness": 0.0, "boxed_and_answer_tags_format": 0.25}),
    ],
)
def test_math_d1_components(completion: str, expected: dict[str, float]) -> None:
    assert components("math500", completion, MATH, "d1") == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("\\boxed{\\frac{1}{2}}", {"correctness": 1.0, "anti_short_boxed": 0.0}),  # a bare box
        ("The answer is \\boxed{0.5}.", {"correctness": 1.0, "anti_short_boxed": 0.0}),  # 12/22 < 0.85 non-boxed
        (LONG + "so \\boxed{1/2}", {"correctness": 1.0, "anti_short_boxed": 1.0}),
        (LONG + "so \\boxed{2}", {"correctness": -1.0, "anti_short_boxed": 1.0}),
        ("I do not know.", {"correctness": -1.0, "anti_short_boxed": 1.0}),  # short but no box at all
    ],
)
def test_math_stabledrl_components(completion: str, expected: dict[str, float]) -> None:
    assert components("math500", completion, MATH, "stabledrl") == expected


def test_gsm8k_stabledrl_uses_the_text_after_hashes() -> None:
    assert components("gsm8k", LONG + "\\boxed{1080}", GSM_COMMA, "stabledrl") == {
        "correctness": 1.0,
        "anti_short_boxed": 1.0,
    }


@pytest.mark.parametrize(
    ("completion", "d1", "stabledrl"),
    [
        ("<answer>3*5+7</answer>", 1.0, 1.0),
        ("<answer>\n(7+3)*5 - 28\n</answer>", 0.1, 0.1),  # 28 is not an available number
        ("<answer>3*5+7+0</answer>", 0.1, 0.1),  # wrong multiset (0 added)
        ("<answer>5*5-3</answer>", 0.1, 0.1),  # 5 used twice: not a sub-multiset either
        ("<answer>\\boxed{3*5+7}</answer>", 0.1, 0.1),  # characters outside d1's whitelist
        ("<answer>2</answer> then <answer>3*5+7</answer>", 1.0, 1.0),  # the last tag counts
        ("3*5+7", 0.0, 0.0),  # no tag
    ],
)
def test_countdown_components(completion: str, d1: float, stabledrl: float) -> None:
    assert components("countdown", completion, CD, "d1") == {"correctness": d1}
    anti = components("countdown", completion, CD, "stabledrl")
    assert anti == {"correctness": stabledrl, "anti_short_boxed": 0.0 if "boxed" in completion else 1.0}


def test_countdown_stabledrl_accepts_a_sub_multiset() -> None:
    doc = {"numbers": [3, 5, 7, 2], "target": 22}
    assert components("countdown", "<answer>3*5+7</answer>", doc, "d1") == {"correctness": 0.1}
    assert components("countdown", "<answer>3*5+7</answer>", doc, "stabledrl")["correctness"] == 1.0


@pytest.mark.parametrize(
    ("completion", "cells"),
    [
        ("<answer>1234341221434321</answer>", 1.0),
        ("<answer>1134341221434321</answer>", 0.75),  # first blank wrong
        ("<answer>\n1 2 3 4\n3 4 1 2\n</answer>", 0.5),  # 8 digits, padded with zeros: blanks 1 and 6 right
        ("<answer>12</answer>", 0.25),
        ("1234341221434321", 0.0),  # no tag
        ("<answer>none</answer>", 0.0),
    ],
)
def test_sudoku_components(completion: str, cells: float) -> None:
    assert components("sudoku", completion, SUDOKU, "d1") == {"cell_accuracy": cells}
    assert components("sudoku", completion, SUDOKU, "stabledrl") == {"cell_accuracy": cells, "anti_short_boxed": 1.0}


@pytest.mark.parametrize("completion", ["<answer>1234341221434321</answe>>", "<answer>1234341221434321</answe>"])
def test_garbled_closing_tag_earns_no_reward_but_keeps_its_test_score(completion: str) -> None:
    """The tiny preset's learning signal (README): d1's reward reads only a closed ``<answer>`` tag, while d1's
    evaluation grader falls back to the digits; the garbled tags are the ones the tiny SFT start writes."""
    sudoku = get_task("sudoku")
    assert sudoku.reward(completion, SUDOKU, "d1").total == 0.0
    assert sudoku.grade(completion, SUDOKU).score == 1.0


def test_reward_rejects_bad_arguments() -> None:
    with pytest.raises(UserError, match="unknown reward profile"):
        get_task("gsm8k").reward("x", GSM, "grpo")
    with pytest.raises(UserError, match="must be a string"):
        get_task("gsm8k").reward(None, GSM)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="numbers"):
        get_task("countdown").reward("x", {"numbers": "3,5", "target": 8})
