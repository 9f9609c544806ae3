"""The tiny protocol's Countdown gold completion: a fixed-width first step, then the answer (hand-checked)."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

from stabledrl_bench.tasks import get_task
from stabledrl_bench.tasks.countdown import flat_solution, tiny_prompt, tiny_worked_solution

HAND_CHECKED = [
    # numbers, target, completion; the step and the answer are worked out by hand in the comment
    ([83, 18, 75], 10, " 18+ 75= 93<answer> 18+ 75- 83</answer>"),  # 18+75=93, 93-83=10
    ([3, 5, 7], 22, "  3*  5= 15<answer>  3*  5+  7</answer>"),  # 3*5=15, 15+7=22
    ([30, 100, 93], 23, " 30+ 93=123<answer> 30+ 93-100</answer>"),  # 30+93=123, 123-100=23
    ([4, 89, 12], 73, " 89-  4= 85<answer> 89-  4- 12</answer>"),  # 89-4=85, 85-12=73
    ([8, 2, 3], 12, "  8/  2=  4<answer>  8/  2*  3</answer>"),  # 8/2=4, 4*3=12
]


@pytest.mark.parametrize(("numbers", "target", "expected"), HAND_CHECKED)
def test_tiny_completion_hand_checked(numbers: list[int], target: int, expected: str) -> None:
    task = get_task("countdown")
    doc = {"numbers": numbers, "target": target}
    completion = task.target_completion(doc, "tiny")
    assert completion == expected
    assert len(completion) == 39  # fits the tiny preset's shortest canvas (40) with its EOS
    assert task.grade(completion, doc).correct
    assert task.reward(completion, doc, "d1").total == 1.0
    assert task.reward(completion, doc, "stabledrl").components["correctness"] == 1.0


def test_tiny_completion_falls_back_to_the_answer_alone() -> None:
    task = get_task("countdown")
    assert flat_solution([2, 3, 4], 20) is None  # only (2+3)*4: precedence would read 2+3*4
    assert task.target_completion({"numbers": [2, 3, 4], "target": 20}, "tiny") == "<answer>(2+3)*4</answer>"
    assert tiny_worked_solution([1, 2, 3, 4], 10) is None  # four numbers: no fixed-width layout
    assert task.target_completion({"numbers": [1, 2, 3, 4], "target": 10}, "tiny").startswith("<answer>")
    assert tiny_worked_solution([1000, 1, 1], 1000) is None  # a number wider than the field
    assert tiny_worked_solution([1, 2, 3], 7) is not None


def test_tiny_prompt_puts_every_number_in_a_fixed_field() -> None:
    """Every number ends at a fixed column (4, 8, 12; the target at 19), whatever the widths of the others."""
    assert tiny_prompt([5, 100, 42], 7) == "   5 100  42 ->   7"
    assert tiny_prompt([83, 18, 75], 10) == "  83  18  75 ->  10"
    for numbers, target in (([1, 2, 3], 4), ([100, 100, 100], 100), ([9, 10, 99], 1)):
        text = tiny_prompt(numbers, target)
        assert [text[i - 4 : i].strip() for i in (4, 8, 12)] == [str(n) for n in numbers]
        assert text[12:15] == " ->" and text[15:].strip() == str(target) and len(text) == 19
    assert get_task("countdown").user_message({"numbers": [5, 100, 42], "target": 7}, "tiny") == "   5 100  42 ->   7"


def test_other_protocols_keep_their_layout() -> None:
    task = get_task("countdown")
    doc = {"numbers": [83, 18, 75], "target": 10}
    assert task.target_completion(doc, "d1_train") == (
        "<reasoning>\nCombining 83, 18, 75 with + - * / gives 75-(83-18), which equals 10.\n</reasoning>\n"
        "<answer>\n75-(83-18)\n</answer>\n"
    )


def test_every_scratchpad_step_is_right_on_the_test_set() -> None:
    """The first step's value is what its operands give, and the answer continues that step (every test row)."""
    task = get_task("countdown")
    layout = re.compile(r"^([ \d]{3})([-+*/])([ \d]{3})=([ \d]{3})<answer>\1\2\3([-+*/])([ \d]{3})</answer>$")
    worked = 0
    for doc in task.load("test"):
        completion = task.target_completion(doc, "tiny")
        match = layout.match(completion)
        if match is None:
            assert completion == f"<answer>{task.solution(doc)}</answer>"
            continue
        worked += 1
        x, op1, y, v, op2, z = match.groups()
        apply = {"+": Fraction.__add__, "-": Fraction.__sub__, "*": Fraction.__mul__, "/": Fraction.__truediv__}
        assert apply[op1](Fraction(int(x)), Fraction(int(y))) == int(v)
        assert apply[op2](Fraction(int(v)), Fraction(int(z))) == doc["target"]
        assert sorted([int(x), int(y), int(z)]) == sorted(doc["numbers"])
    assert worked == 241  # of 256: the other 15 need parentheses around a sum before * or /
