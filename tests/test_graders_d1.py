"""d1-compatible parsers: hand-computed cases of d1's quirks, and agreement with a regex-based reference.

The reference functions below restate d1's evaluation parsing (``eval/parse_and_get_acc.py``,
``eval/parser_helper.py``) with the original regular expressions and control flow; the production code uses
linear scans and a safe evaluator instead, and must return the same results.
"""

from __future__ import annotations

import re

import pytest
from test_graders_text import TEXTS, random_texts

from stabledrl_bench.tasks.graders import d1

NUMBER = r"-?\d+\.?\d*"


# ------------------------------------------------------------------------------------------ reference
def ref_last_boxed(s: str) -> str | None:
    if "\\boxed " in s:
        return "\\boxed " + s.split("\\boxed ")[-1].split("$")[0]
    start = s.rfind("\\boxed")
    if start < 0:
        start = s.rfind("\\fbox")
    if start < 0:
        return s
    depth = 0
    for i in range(start, len(s)):
        if s[i] == "{":
            depth += 1
        elif s[i] == "}":
            depth -= 1
            if depth == 0:
                return s[start : i + 1]
    return None


def ref_remove_boxed(s: str) -> str:  # raises like d1 (TypeError on None, AssertionError on a misplaced "\boxed ")
    if "\\boxed " in s:
        assert s.startswith("\\boxed ")
        return s[7:]
    if s[:7] == "\\boxed{" and s[-1:] == "}":
        return s[7:-1]
    return s


def ref_gsm8k(s: str) -> float | None:
    for content in re.findall(r"\\boxed{(.*?)}", s):
        content = content.strip()
        if not content or re.match(r"^\.+$", content):
            continue
        try:
            return float(content)
        except ValueError:
            numbers = re.findall(NUMBER, content)
            if numbers:
                return float(numbers[0])
    match = re.search(r"<answer>(.*?)</answer>", s, re.DOTALL)
    if match and match.group(1).strip():
        answer = match.group(1).strip()
        try:
            return float(answer)
        except ValueError:
            numbers = re.findall(NUMBER, answer)
            return float(numbers[-1]) if numbers else None
    return None


def ref_math(s: str) -> str | None:
    try:
        parsed = ref_remove_boxed(ref_last_boxed(s))
    except (TypeError, AssertionError):
        parsed = None
    if not parsed:
        match = re.search(r"<answer>(.*?)</answer>", s, re.DOTALL)
        if match:
            parsed = match.group(1).strip()
    return parsed


def ref_countdown(s: str, numbers: list[int], target: int) -> tuple[bool, str] | None:
    """None when d1 would ``eval`` an operator the safe evaluator rejects (``**``, ``//``)."""
    try:
        equation = ref_remove_boxed(ref_last_boxed(s))
    except (TypeError, AssertionError):
        match = re.search(r"<answer>(.*?)</answer>", s, re.DOTALL)
        equation = match.group(1).strip() if match else s
    equation = equation.replace(r"\div", "/").replace(r"\times", "*").replace(r"\cdot", "*")
    match = re.search(r"([0-9+\-*/() ]+)=[0-9. ]+", equation)
    if match:
        equation = match.group(1).strip()
    if sorted(int(n) for n in re.findall(r"\d+", equation)) != sorted(numbers):
        return False, equation
    if "**" in equation or "//" in equation:
        return None
    if not re.match(r"^[\d+\-*/().\s]+$", equation):
        return False, equation
    try:
        value = eval(equation.strip(), {"__builtins__": None}, {})  # test reference only: whitelisted text
        return abs(value - target) < 1e-5, equation
    except Exception:
        return False, equation


def ref_sudoku(s: str) -> str:
    patterns = [
        r"<answer>.*?```\s*([\d\s]+)```",
        r"<answer>(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|</answer>)",
        r"</answer>\s*(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|$)",
        r".*?(\d{16})\s*</answer>",
        r"\b(\d{16})\b",
    ]
    for pattern in patterns:
        match = re.search(pattern, s, re.DOTALL)
        if match and match.group(1).strip():
            return re.sub(r"\s", "", match.group(1).strip())
    return ""


# ------------------------------------------------------------------------------------------ agreement
FUZZ = TEXTS + random_texts(3000, seed=3, max_tokens=25)


def test_boxed_helpers_agree_with_reference() -> None:
    for s in FUZZ:
        assert d1.last_boxed_only_string(s) == ref_last_boxed(s)
        try:
            expected = ref_remove_boxed(s)
        except AssertionError:
            with pytest.raises(d1.D1ParseError):
                d1.remove_boxed(s)
        else:
            assert d1.remove_boxed(s) == expected


def test_gsm8k_math_sudoku_extraction_agree_with_reference() -> None:
    for s in FUZZ:
        assert d1.extract_gsm8k(s) == ref_gsm8k(s), s
        assert d1.extract_math(s) == ref_math(s), s
        assert d1.extract_sudoku(s) == ref_sudoku(s), s


def test_countdown_verdict_agrees_with_reference() -> None:
    compared = correct = 0
    for s in [*FUZZ, "\\boxed{1+2+3}", "<answer>\\boxed{3*2*1 = 6}</answer>", "\\boxed{3 \\times 4}"]:
        for numbers, target in (([1, 2, 3], 6), ([3, 4], 12), ([1, 2, 3, 4], 10)):
            expected = ref_countdown(s, numbers, target)
            if expected is None:
                continue
            compared += 1
            correct += expected[0]
            assert d1.countdown_correct(s, numbers, target) == expected, s
    assert compared > 20_000 and correct >= 3


# ------------------------------------------------------------------------------------------ hand cases
@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("\\boxed{...} then \\boxed{12}", 12.0),  # "..." boxes are skipped
        ("\\boxed{x = 5, y = 7}", 5.0),  # first number of the first usable box
        ("<answer>the total is 1,080</answer>", 80.0),  # d1 has no thousands separators: last number is "080"
        ("<answer>5</answer> <answer>6</answer>", 5.0),  # the first answer tag
        ("\\boxed{-3}", -3.0),
        ("\\boxed{12\n} <answer>7</answer>", 7.0),  # a box does not cross a newline
        ("the answer is 42", None),
    ],
)
def test_gsm8k_parser_hand_cases(completion: str, expected: float | None) -> None:
    assert d1.extract_gsm8k(completion) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("The answer is 5", "The answer is 5"),  # no box: the whole text
        ("so \\boxed 5$ done", "5"),  # "\boxed " takes the text up to "$"
        ("\\fbox{3}", "\\fbox{3}"),  # never unwrapped
        ("\\boxed{3 <answer>7</answer>", "7"),  # unbalanced box: the answer-tag fallback
        ("\\boxed{3", None),
    ],
)
def test_math_parser_hand_cases(completion: str, expected: str | None) -> None:
    assert d1.extract_math(completion) == expected


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("0.5", "\\frac{1}{2}", True),
        ("\\dfrac{1}{2}", "\\frac12", True),
        ("x = 5", "5", True),  # a short "k = " prefix is dropped
        ("10\\%", "10", True),
        ("90^\\circ", "90", True),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})", True),
        ("3/4", "\\frac{3}{4}", True),
        ("0.25", "\\frac{1}{4}", False),  # no numeric comparison
        ("\\sqrt", "\\sqrt", True),  # normalisation raises: raw equality
        ("\\sqrt", "x", False),
        ("a/b", "a/b", True),  # int() fails inside fix_a_slash_b: raw equality
    ],
)
def test_is_equiv_hand_cases(prediction: str, gold: str, expected: bool) -> None:
    assert d1.is_equiv(prediction, gold) is expected


def test_strip_string_hand_cases() -> None:
    assert d1.strip_string("\\dfrac12 \\text{ cm}") == "\\frac{1}{2}"
    assert d1.strip_string(".5") == "\\frac{1}{2}"
    assert d1.strip_string("\\sqrt3") == "\\sqrt{3}"
    assert d1.strip_string("\\$5") == "5"
    with pytest.raises(d1.D1ParseError):
        d1.strip_string("\\text{ a}\\text{ b}")


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<answer>\n```\n1234 3412\n2143\n4321\n```\n</answer>", "1234341221434321"),
        ("<answer>\n1234 3412 2143 4321\n</answer>", "1234341221434321"),
        ("<answer>12<|eot_id|>34</answer>", "12"),
        ("</answer>\n\n99<|endoftext|>", "99"),
        ("grid: 1234341221434321.", "1234341221434321"),
        ("no digits", ""),
    ],
)
def test_sudoku_cascade_hand_cases(completion: str, expected: str) -> None:
    assert d1.extract_sudoku(completion) == expected


def test_countdown_hand_cases() -> None:
    assert d1.countdown_correct("<answer>\\boxed{3 \\times 5 + 7}</answer>", [3, 5, 7], 22) == (True, "3 * 5 + 7")
    assert d1.countdown_correct("\\boxed{3*5+7 = 22}", [3, 5, 7], 22) == (True, "3*5+7")
    # Without a box d1 parses the whole completion, so the tags make it invalid (a d1 quirk).
    assert d1.countdown_correct("<answer>3*5+7</answer>", [3, 5, 7], 22)[0] is False
    assert d1.countdown_correct("\\boxed{2**3}", [2, 3], 8)[0] is False  # d1's eval would accept "**"
