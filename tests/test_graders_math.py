"""Math grading: math-verify verdicts, the hard time limit (also off the main thread), d1 vs math-verify."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from stabledrl_bench.errors import UserError
from stabledrl_bench.tasks.graders.isolation import IsolatedPool
from stabledrl_bench.tasks.graders.math_answers import D1Kind, grade_math_answer, gsm8k_gold
from stabledrl_bench.tasks.graders.mathverify import math_verify, normalise_degrees, prediction_candidates, warm_up

HANG = "\\boxed{9^{9^{9^{9}}}}"  # sympy tries to evaluate the tower: hours, mostly inside C code


@pytest.mark.parametrize(
    ("gold", "prediction", "expected"),
    [
        ("\\frac{1}{2}", "so \\boxed{0.5}", True),
        ("1000", "<answer>\\boxed{1,000}</answer>", True),
        ("3\\sqrt{13}", "$\\boxed{\\sqrt{117}}$", True),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\boxed{(3, \\pi/2)}", True),
        ("x^2+7x+10", "\\boxed{(x+2)(x+5)}", True),
        ("\\frac{1}{2}", "\\boxed{0.25}", False),
        ("72", "<answer>72</answer>", True),  # answer tag without box (tiny protocol)
        ("\\frac{14}{3}", "<answer>\\frac{14}{3}</answer>", True),
        ("72", "first \\boxed{72}, then 73", True),  # a box wins over a later number
        ("72", "no answer here", False),
    ],
)
def test_math_verify_verdicts(gold: str, prediction: str, expected: bool) -> None:
    outcome = math_verify(gold, prediction)
    assert outcome.correct is expected
    assert not outcome.timed_out and outcome.error is None


def test_prediction_candidates() -> None:
    assert prediction_candidates("a \\boxed{1} <answer>2</answer>") == ["$2$", "2"]  # the later answer
    assert prediction_candidates("<answer>2</answer> so $\\boxed{ 1 }$") == ["\\boxed{1}"]
    assert prediction_candidates("<answer>\\boxed{1} or \\boxed{2}</answer> 3") == ["\\boxed{2}"]
    assert prediction_candidates("x <answer> 1/2 </answer>") == ["$1/2$", "1/2"]
    assert prediction_candidates("<answer>$1$</answer>") == ["$1$"]
    assert prediction_candidates("just 5") == ["just 5"]
    assert prediction_candidates("5 <answer> </answer>") == prediction_candidates("5 \\boxed{}") == []
    assert prediction_candidates("\\boxed{90°}") == ["\\boxed{90^{\\circ}}"]


def test_normalise_degrees() -> None:
    assert normalise_degrees("90°") == normalise_degrees("90^°") == normalise_degrees("90^{°}") == "90^{\\circ}"
    assert normalise_degrees("90\\degree + 1\\textdegree") == "90^{\\circ} + 1^{\\circ}"
    assert normalise_degrees("90^\\circ") == "90^\\circ"  # already math-verify's unit spelling


# Harness verdict (``correct``) and d1's verdict for completions whose final answer is blank, comes after an
# earlier attempt or carries a degree sign. The d1 column was computed before the harness rule changed and must
# never move; the comments give the old ``correct`` where it differed.
@pytest.mark.parametrize(
    ("gold", "kind", "prediction", "correct", "d1"),
    [
        # A blank answer tag or box is no answer: no fallback to the last number of the reasoning (was True).
        ("72", "math", "so 72 apples.\n<answer></answer>", False, False),
        ("72", "math", "so 72 apples.\n<answer>  \n </answer>", False, False),
        ("72", "math", "so 72 apples.\n<answer>\\boxed{}</answer>", False, False),
        ("72", "math", "so 72 apples. \\boxed{ }", False, False),
        ("72", "gsm8k", "so 72 apples.\n<answer></answer>", False, False),
        ("72", "gsm8k", "so 72 apples.\n<answer>\\boxed{}</answer>", False, False),
        ("72", "gsm8k", "so 72 apples. \\boxed{}", False, False),
        ("72", "math", "\\boxed{72} wait\n<answer>\\boxed{}</answer>", False, False),  # unchanged
        ("72", "math", "\\boxed{} so <answer>72</answer>", True, True),  # was False: the empty box came first
        # The final answer counts: a first box used to win over a later tag, and several boxes were read as a set.
        ("6", "math", "<answer>\\boxed{5}</answer> no, <answer>6</answer>", True, False),  # was False
        ("5", "math", "<answer>\\boxed{5}</answer> no, <answer>6</answer>", False, True),  # was True
        ("6", "math", "<answer>\\boxed{5}</answer> no, <answer>\\boxed{6}</answer>", True, True),  # was False
        ("6", "math", "\\boxed{5} no: \\boxed{6}", True, True),  # was False
        ("6", "math", "\\boxed{5} so <answer>6</answer>", True, False),  # was False
        ("6", "gsm8k", "<answer>\\boxed{5}</answer> no, <answer>\\boxed{6}</answer>", True, False),  # was False
        ("6", "gsm8k", "<answer>\\boxed{5}</answer> no, <answer>6</answer>", True, False),  # was False
        ("6", "math", "<answer>5</answer> no, <answer>6</answer>", True, False),  # unchanged
        ("6", "gsm8k", "<answer>5</answer> no, <answer>6</answer>", True, False),  # unchanged
        ("6", "math", "<answer>5</answer> no, \\boxed{6}", True, True),  # unchanged
        ("6", "math", "<answer>\\boxed{6} or \\boxed{5}</answer>", False, False),  # the last box in the tag
        # Degree signs are unit annotations; math-verify could not parse a box holding one.
        ("90", "math", "<answer>\\boxed{90°}</answer>", True, False),  # was False
        ("90^\\circ", "math", "<answer>\\boxed{90°}</answer>", True, False),  # was False
        ("90°", "math", "<answer>\\boxed{90^\\circ}</answer>", True, False),  # was False
        ("90", "math", "<answer>\\boxed{90\\degree}</answer>", True, False),  # was False
        ("90", "gsm8k", "<answer>\\boxed{90°}</answer>", True, True),  # was False
        ("90", "math", "<answer>\\boxed{90^{\\circ}}</answer>", True, True),
        ("90", "math", "<answer>\\boxed{90^\\circ}</answer>", True, True),
        ("90^\\circ", "math", "<answer>\\boxed{90}</answer>", True, True),
        ("90", "math", "<answer>90°</answer>", True, False),
        ("90", "math", "<answer>\\boxed{91°}</answer>", False, False),
        ("90^\\circ", "math", "<answer>\\boxed{91°}</answer>", False, False),
    ],
)
def test_final_answer_verdicts_and_unchanged_d1(
    gold: str, kind: D1Kind, prediction: str, correct: bool, d1: bool
) -> None:
    result = grade_math_answer(prediction, gold, kind)
    assert (result.correct, result.details["d1"]) == (correct, d1)
    assert result.score == float(correct) and not result.details["timed_out"]


def test_stabledrl_style_parses_the_full_response_with_defaults() -> None:
    assert math_verify("\\boxed{72}", "The total is 72.", style="stabledrl").correct
    assert math_verify("2,125", "\\boxed{2125}", style="stabledrl").correct
    assert not math_verify("\\boxed{72}", "The total is 71.", style="stabledrl").correct


def test_hard_time_limit_holds_on_and_off_the_main_thread() -> None:
    outcome = math_verify("72", HANG, timeout_s=0.5)
    assert outcome == type(outcome)(False, None, timed_out=True, error=outcome.error)
    results = []
    thread = threading.Thread(target=lambda: results.append(math_verify("72", HANG, timeout_s=0.5)))
    thread.start()
    thread.join()
    assert results[0].timed_out and not results[0].correct
    warm_up()  # the killed workers were replaced (their start-up would count against the next call's limit)
    assert math_verify("72", "\\boxed{72}").correct


def test_concurrent_calls_from_threads() -> None:
    cases = [(str(n), f"\\boxed{{{n}}}", True) for n in range(20)] + [("5", "\\boxed{6}", False)] * 5
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(lambda c: math_verify(c[0], c[1]).correct, cases))
    assert verdicts == [c[2] for c in cases]


def test_isolated_pool_errors_and_replacement() -> None:
    pool = IsolatedPool("stabledrl_bench.tasks.graders.mathverify", size=1)
    try:
        unknown = pool.call("no_such_function", timeout_s=30)
        assert unknown.status == "error" and "KeyError" in unknown.error
        assert pool.call("grader", "2", "\\boxed{2}", timeout_s=30).value == (True, "2")
        assert pool.call("grader", "2", HANG, timeout_s=0.3).status == "timeout"
        assert pool.call("grader", "3", "\\boxed{3}", timeout_s=30).value == (True, "3")
        crashed = pool._idle[0].proc  # a worker that dies between calls is detected and replaced
        crashed.kill()
        crashed.wait()
        died = pool.call("grader", "4", "\\boxed{4}", timeout_s=30)
        assert died.status == "error" and "worker died" in died.error
        assert pool.call("grader", "4", "\\boxed{4}", timeout_s=30).value == (True, "4")
        with pytest.raises(ValueError, match="positive"):
            pool.call("grader", "1", "1", timeout_s=0)
    finally:
        pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.call("grader", "1", "1", timeout_s=1)
    broken = IsolatedPool("stabledrl_bench.no_such_registry", size=1)
    try:
        with pytest.raises(RuntimeError, match=r"failed to start: .*ModuleNotFoundError"):
            broken.call("grader", "1", "1", timeout_s=1)
    finally:
        broken.close()


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("Janet ...\n#### 18", "18"),
        ("#### 1,080", "1080"),
        ("#### -10", "-10"),
        (72, "72"),
        (" $5 ", "5"),
        ("2.5", "2.5"),
    ],
)
def test_gsm8k_gold(answer: str | int, gold: str) -> None:
    assert gsm8k_gold(answer) == gold


@pytest.mark.parametrize("answer", ["#### twelve", "", True, None, [1]])
def test_gsm8k_gold_rejects_non_numbers(answer: object) -> None:
    with pytest.raises(UserError):
        gsm8k_gold(answer)  # type: ignore[arg-type]


def test_both_verdicts_are_recorded() -> None:
    # math-verify accepts 1,000 = 1000; d1's GSM8K parser reads "1,000" as 1.
    commas = grade_math_answer("\\boxed{1,000}", "1000", "gsm8k")
    assert commas.correct and commas.details == {
        "math_verify": True,
        "d1": False,
        "timed_out": False,
        "math_verify_extracted": "1,000",
        "d1_extracted": "1",
    }
    # d1's MATH comparison is string normalisation only.
    decimal = grade_math_answer("<answer>\\boxed{0.25}</answer>", "\\frac{1}{4}", "math")
    assert decimal.correct and not decimal.details["d1"] and decimal.score == 1.0
    both = grade_math_answer("\\boxed{\\dfrac{1}{4}}", "\\frac{1}{4}", "math")
    assert both.correct and both.details["d1"] and both.details["d1_extracted"] == "\\dfrac{1}{4}"
    assert both.extracted == both.details["math_verify_extracted"] == "\\frac{1}{4}"  # math-verify normalises
    wrong = grade_math_answer("\\boxed{5}", "6", "gsm8k")
    assert not wrong.correct and not wrong.details["d1"] and wrong.score == 0.0
