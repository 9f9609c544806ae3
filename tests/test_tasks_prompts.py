"""Prompts of every protocol, spelled out by hand from the reference code (quirks included), and gold
completions of the tiny protocol."""

from __future__ import annotations

import pytest

from stabledrl_bench.errors import UserError
from stabledrl_bench.tasks import PromptSpec, get_task

D1_MATH_FORMAT = (
    "\nRespond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n\\boxed{...}\n"
    "</answer>"
)
D1_TRAIN_FORMAT = "\nRespond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n"
EXPERT = "You are a math expert. You will be given a question to solve. Solve it step by step. "
GSM = {"question": "How many?", "answer": "#### 3"}
MATH = {"problem": "Find $x$.", "answer": "5"}
CD = {"numbers": [30, 100, 93], "target": 23}
SUDOKU = {"puzzle": "3102200002100320", "solution": "3142243142131324"}


def message(task: str, doc: dict, protocol: str) -> str:
    spec = get_task(task).prompt(doc, protocol)
    assert isinstance(spec, PromptSpec) and spec.chat_template and len(spec.messages) == 1
    assert spec.messages[0]["role"] == "user" and spec.prefill == ("<reasoning>" if protocol == "d1" else "")
    return spec.messages[0]["content"]


def test_gsm8k_prompts() -> None:
    assert (
        message("gsm8k", GSM, "d1")
        == EXPERT + "Wrap the final answer in a \\boxed{}. " + D1_MATH_FORMAT + "\n\nHow many?"
    )
    assert message("gsm8k", GSM, "d1_train") == D1_TRAIN_FORMAT + "\n\nHow many?"
    assert message("gsm8k", GSM, "stabledrl") == (
        "How many?(Please put the final answer in \\\\boxed{} tag, i.e. $\\\\boxed{answer here}$)"
    )
    assert message("gsm8k", GSM, "tiny") == "How many?"
    # StableDRL math_metrics.py (collate_fn_gsm8k): the question alone; TraceRL trado_sample.py: its cot prompt
    assert message("gsm8k", GSM, "stabledrl_eval") == "How many?"
    assert message("gsm8k", GSM, "tracerl") == (
        "How many?\nPlease reason step by step, and put your final answer within \\boxed{}."
    )


@pytest.mark.parametrize("task", ["math500", "aime24", "aime25"])
def test_math_prompts(task: str) -> None:
    d1_expected = EXPERT + "Wrap the final answer in a \\boxed{}." + D1_MATH_FORMAT + '" \n' + "\n\nFind $x$."
    assert message(task, MATH, "d1") == d1_expected
    assert message(task, MATH, "d1_train") == (
        D1_TRAIN_FORMAT + "\n\n" + EXPERT + "Wrap the final answer in a \\boxed{}. \n\nFind $x$."
    )
    assert message(task, MATH, "stabledrl").startswith("Find $x$.(Please put the final answer in \\\\boxed{}")
    assert message(task, MATH, "tiny") == "Find $x$."
    # collate_fn_math's instruction is a raw string with single backslashes (collate_fn_mixed's, above, doubles them)
    assert message(task, MATH, "stabledrl_eval") == (
        "Find $x$.(Please put the final answer in \\boxed{} tag, i.e. $\\boxed{answer here}$)"
    )
    assert message(task, MATH, "tracerl") == (
        "Find $x$.\nPlease reason step by step, and put your final answer within \\boxed{}."
    )


def test_countdown_prompts() -> None:
    d1 = message("countdown", CD, "d1")
    assert d1.startswith("Using only the provided numbers, create an arithmetic expression that evaluates to exactly")
    assert "For example: \\boxed{a + b * c}Respond in the following format:\n<reasoning>\n" in d1
    assert d1.endswith("</answer>\n\nNumbers: [30, 100, 93]\nTarget: 23")
    train = message("countdown", CD, "d1_train")
    assert train.startswith(D1_TRAIN_FORMAT + "\nUsing only the numbers [30, 100, 93], create an arithmetic")
    assert "evaluates to exactly 23. You must use all numbers" in train
    assert train.endswith("a valid answer is: <answer>\n2*4-3\n</answer>")
    assert message("countdown", CD, "stabledrl") == (
        "Given numbers [30, 100, 93], find an equation that equals 23. Please put the reasoning in <reasoning> "
        "tags and the final equation in <answer> tags, e.g. <answer> 1 + 1 </answer>."
    )
    assert message("countdown", CD, "tiny") == "  30 100  93 ->  23"  # fixed-width fields (tiny_prompt)
    # neither TraceRL nor StableDRL's script evaluates Countdown: d1's and StableDRL's training messages
    assert (message("countdown", CD, "tracerl"), message("countdown", CD, "stabledrl_eval")) == (
        d1,
        message("countdown", CD, "stabledrl"),
    )


def test_sudoku_prompts() -> None:
    d1 = message("sudoku", SUDOKU, "d1")
    assert d1.startswith("\nPlease solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character")
    assert d1.endswith("</answer>\n\n\nSolve the following Sudoku puzzle: 3102200002100320\n")
    assert message("sudoku", SUDOKU, "d1_train") == d1
    assert message("sudoku", SUDOKU, "stabledrl") == (
        "Solve this 4x4 Sudoku puzzle: 3102200002100320. Use 0 for empty cells. Please put the reasoning in "
        "<reasoning> tags and the solution string in <answer> tags."
    )
    assert message("sudoku", SUDOKU, "tiny") == "3102200002100320"
    assert (message("sudoku", SUDOKU, "tracerl"), message("sudoku", SUDOKU, "stabledrl_eval")) == (
        d1,
        message("sudoku", SUDOKU, "stabledrl"),
    )


@pytest.mark.parametrize("task", ["gsm8k", "math500", "countdown", "sudoku"])
def test_evaluation_only_protocols_take_the_stabledrl_targets(task: str) -> None:
    """TraceRL's and StableDRL's evaluation prompts prefill nothing and ask for a free-form answer."""
    doc = {"gsm8k": GSM, "math500": MATH, "countdown": CD, "sudoku": SUDOKU}[task]
    target = get_task(task).target_completion(doc, "stabledrl")
    assert get_task(task).target_completion(doc, "tracerl") == target
    assert get_task(task).target_completion(doc, "stabledrl_eval") == target


def test_tiny_targets_are_answer_only_but_countdown_shows_a_step() -> None:
    assert get_task("gsm8k").target_completion({"question": "q", "answer": "x\n#### 1,080"}, "tiny") == (
        "<answer>1080</answer>"
    )
    assert get_task("math500").target_completion(MATH, "tiny") == "<answer>5</answer>"
    # Countdown's tiny target adds its first step before the answer (tests/test_countdown_tiny.py)
    assert get_task("countdown").target_completion({"numbers": [3, 5, 7], "target": 22}, "tiny") == (
        "  3*  5= 15<answer>  3*  5+  7</answer>"
    )
    assert get_task("sudoku").target_completion(SUDOKU, "tiny") == "<answer>3142243142131324</answer>"


def test_d1_targets_continue_the_reasoning_prefill() -> None:
    target = get_task("gsm8k").target_completion({"question": "q", "answer": "4 + 5 = <<4+5=9>>9\n#### 9"}, "d1")
    assert target == "\n4 + 5 = 9\n</reasoning>\n<answer>\n\\boxed{9}\n</answer>"
    strict = get_task("gsm8k").target_completion({"question": "q", "answer": "a\nb\n#### 9"}, "d1_train")
    assert strict == "<reasoning>\na b\n</reasoning>\n<answer>\n9\n</answer>\n"


def test_protocol_and_doc_errors() -> None:
    with pytest.raises(UserError, match="unknown protocol 'llada'"):
        get_task("gsm8k").prompt(GSM, "llada")
    with pytest.raises(UserError, match="unknown protocol"):
        get_task("sudoku").target_completion(SUDOKU, "d2")
    with pytest.raises(UserError, match="puzzle"):
        get_task("sudoku").prompt({"puzzle": "123", "solution": SUDOKU["solution"]}, "tiny")
    with pytest.raises(UserError, match="no solution"):
        get_task("countdown").target_completion({"numbers": [1, 1, 1], "target": 100}, "tiny")
    with pytest.raises(UserError, match="question"):
        get_task("gsm8k").prompt({"answer": "#### 1"}, "d1")
