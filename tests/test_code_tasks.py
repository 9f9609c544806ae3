"""HumanEval and MBPP as the official StableDRL evaluation runs them: its prompts, its code extraction and test
programs, the canonical solutions passing in the sandbox, wrong and evasive programs failing, time bounded, and
DiffuCoder's reward (format, then the fraction of test cases passed)."""

from __future__ import annotations

import time

import pytest
from conftest import SMALL

from stabledrl_bench.core.models import build_tiny
from stabledrl_bench.errors import UserError
from stabledrl_bench.evaluation.native import evaluate
from stabledrl_bench.evaluation.protocols import get_protocol
from stabledrl_bench.tasks import code_benchmarks as module
from stabledrl_bench.tasks import get_task
from stabledrl_bench.tasks.graders import code_io as code_io_grader
from stabledrl_bench.tasks.graders import sandbox
from stabledrl_bench.tasks.graders import unit_tests as grader

NO_SANDBOX = sandbox.available()
needs_sandbox = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox here: {NO_SANDBOX}")
HUMANEVAL, MBPP = get_task("humaneval"), get_task("mbpp")
HE0 = HUMANEVAL.load("test", limit=1)[0]  # has_close_elements
MB0 = MBPP.load("test", limit=1)[0]  # remove_Occ, task 11
MBPP_SETUP_ONLY = 367  # its asserts use a `root` that only MBPP's test_setup_code defines, which is not used
# Its reference solution needs 2-5 CPU seconds here, about the official 3 s limit: its verdict depends on the machine,
# as it does officially (a wall-clock limit there), so the canonical-solution test accepts either.
MBPP_NEAR_THE_LIMIT = 123


def _fence(code: str, before: str = "", after: str = "") -> str:
    return f"{before}```python\n{code}\n```{after}"


# ----------------------------------------------------------------------------------------------- prompts
def test_prompts_are_the_official_ones() -> None:
    """Checked against the official functions on all 664 problems when the tasks were added; two written out."""
    assert HUMANEVAL.user_message(HE0, "stabledrl_eval") == (
        "You are an expert Python programmer. Your task is to complete the implementation of a function named "
        "`has_close_elements`.\n\nHere is the function to complete:\n```python\n" + HE0["prompt"].rstrip() + "\n```\n"
    )
    assert MBPP.user_message(MB0, "stabledrl_eval") == (
        "You are an expert Python programmer. Your task is to complete the implementation of a function named "
        "`remove_Occ`.\n\n** TARGET FUNCTION **\nWrite a python function to remove first and last occurrence of a "
        "given character from the string.\n\n** UNIT TESTS **\nYour code should pass unit tests like:\n"
        '    assert remove_Occ("hello","l") == "heo"\n    assert remove_Occ("abcda","a") == "bcd"\n'
        '    assert remove_Occ("PHP","P") == "H"\n\nHere is the function to complete:\n```python\n'
        'def remove_Occ(input_param_1, input_param_2):\n    """Write a python function to remove first and last '
        'occurrence of a given character from the string.\n    """\n```\n'
    )
    for task, doc in ((HUMANEVAL, HE0), (MBPP, MB0)):
        assert task.user_message(doc, "stabledrl") == task.user_message(doc, "stabledrl_eval")
        with pytest.raises(UserError, match="unknown protocol 'd1'"):
            task.prompt(doc, "d1")


@pytest.mark.parametrize(
    ("first_assert", "expected"),
    [
        ('assert remove_Occ("hello","l") == "heo"', ("remove_Occ", 2)),
        ("assert f(g(1, 2), 3)==4", ("f", 2)),  # the call of the name, not the nested call
        ("assert math.isclose(area(2), 12.5)", ("math.isclose", 0)),  # the second word up to "(": no such call
        ("assert set(f(1)) == {1}", ("set", 1)),
        ("assert f(1) == (", ("f", 2)),  # does not parse: the official fallback of 2
    ],
)
def test_mbpp_signature_reads_the_first_assert_as_the_official_code(first_assert: str, expected: tuple) -> None:
    assert module.mbpp_signature(first_assert) == expected


# ------------------------------------------------------------------------------------------- extraction
@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("```python\ndef f():\n    return 1\n```", "def f():\n    return 1"),
        ("Here it is:\n```python\n  x = 1  \n```\nIt works.", "x = 1"),  # stripped, text around ignored
        ("```python\nA\n```\n```python\nB\n```", "A"),  # the first fence
        ("    return 1\n", "    return 1\n"),  # no fence: the whole completion, unchanged
        ("```Python\nx = 1\n```", "```Python\nx = 1\n```"),  # the tag is case-sensitive
        ("```python x = 1```", "```python x = 1```"),  # a newline must follow the tag
        ("```\nx = 1\n```", "```\nx = 1\n```"),  # an untagged fence is not code
        ("```python\nx = 1", "```python\nx = 1"),  # an unclosed fence: the whole completion
        ("```python\nx = 1```", "x = 1"),  # the closing fence may end the line
        ("", ""),
    ],
)
def test_extraction_is_the_official_one(completion: str, expected: str) -> None:
    assert grader.extract_code(completion) == expected


def test_test_programs_are_the_official_ones() -> None:
    """HumanEval: prompt + code + test + check(entry_point); MBPP: code + the asserts. Both were compared with the
    official ``process_humaneval_test`` on the first 20 problems of each and eight completions."""
    test = HUMANEVAL.test_program("    return False", HE0)
    assert test.program == HE0["prompt"] + "    return False\n" + HE0["test"] + "\ncheck(has_close_elements)"
    assert len(test.units) == 7 and all(u.startswith("assert candidate(") for u in test.units)
    test = MBPP.test_program("def remove_Occ(s, c): pass", MB0)
    assert test.program == "def remove_Occ(s, c): pass\n" + "\n".join(MB0["test"])
    assert test.units == tuple(MB0["test"])


def test_check_units_keep_their_setup_statements() -> None:
    source = (
        "def check(candidate):\n    import math\n    assert candidate(1)\n    for i in range(3):\n        assert i\n"
    )
    assert grader.check_units(source, "check") == [
        "import math\nassert candidate(1)",
        "for i in range(3):\n    assert i",
    ]
    with pytest.raises(ValueError):
        grader.check_units("x = 1", "check")


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (_fence("def f(x):\n    return x"), 1.0),
        (_fence("def f(x) return x"), 0.5),  # a syntax error in the fence
        ("def f(x):\n    return x", 0.0),  # no fence: graded as code, but no format credit
        (_fence("import os\nos.system('true')"), 1.0),  # parsed only, never run for the format
    ],
)
def test_format_score(completion: str, expected: float) -> None:
    assert grader.code_format(completion) == expected


# ------------------------------------------------------------------------------------------- execution
@needs_sandbox
def test_canonical_solutions_pass_in_the_sandbox() -> None:
    """A fixed subset (every 4th HumanEval problem, every 8th MBPP one, and MBPP 367) in one batch per task: the
    full sets take about 35 s on two shared cores here (all 164; 498 or 499 of 500: MBPP 367 fails as officially, 123
    passes or times out).
    HumanEval's ``canonical_solution`` is a body, graded as a completion without a fence; MBPP's ``code`` whole."""
    docs = HUMANEVAL.load("test")[::4]
    grades = HUMANEVAL.grade_many([d["canonical_solution"] for d in docs], docs)
    assert [d["task_id"] for d, g in zip(docs, grades, strict=True) if not g.correct] == []
    docs = MBPP.load("test")[::8] + [d for d in MBPP.load("test") if d["task_id"] == MBPP_SETUP_ONLY]
    grades = MBPP.grade_many([d["code"] for d in docs], docs)
    failed = [d["task_id"] for d, g in zip(docs, grades, strict=True) if not g.correct]
    assert [task_id for task_id in failed if task_id != MBPP_NEAR_THE_LIMIT] == [MBPP_SETUP_ONLY]
    assert all(g.score == float(g.correct) for g in grades)
    results = {d["task_id"]: g.details["result"] for d, g in zip(docs, grades, strict=True)}
    assert {r for task_id, r in results.items() if task_id != MBPP_NEAR_THE_LIMIT} == {"passed", "failed"}


@needs_sandbox
def test_gold_completions_pass_and_earn_the_full_reward() -> None:
    for task, doc in ((HUMANEVAL, HE0), (MBPP, MB0)):
        gold = task.target_completion(doc, "stabledrl_eval")
        assert gold.startswith("```python\n") and task.grade(gold, doc).correct
        assert task.reward(gold, doc, "d1").components == {"code_format": 0.5, "code": 2.0}
        assert task.reward(gold, doc, "stabledrl").components.keys() == {"code_format", "code", "anti_short_boxed"}


WRONG = "def remove_Occ(s, ch):\n    return s"  # passes none of the asserts
FORGE = (  # write a passing report with whatever token the driver's module exposes, then leave before the asserts
    "import __main__, os, sys\n"
    "token = next((v for v in vars(__main__).values() if isinstance(v, str) and len(v) == 32), '')\n"
    'sys.__stdout__.write(token + \'{"result": "passed", "units": null}\\n\')\n'
    "sys.__stdout__.flush()\n"
    "os._exit(0)"
)
PARTIAL = "def remove_Occ(s, ch):\n    return 'heo' if s == 'hello' else s"  # passes the first of three


@needs_sandbox
@pytest.mark.parametrize(
    ("code", "result", "units"),
    [
        (WRONG, "failed", 0),
        (PARTIAL, "failed", 1),
        (WRONG + "\nimport sys\nsys.exit(0)", "failed", 0),  # leaving before the asserts is no pass
        (WRONG + "\nimport os\nos._exit(0)", "failed", 0),
        (WRONG + "\nprint('" + "passed" + "')", "failed", 0),  # printing proves nothing
        (WRONG + "\n" + FORGE, "failed", 0),  # the report's token is no module attribute
        # rebinding what the driver runs the program and units with, or writes its report with, forges nothing
        (WRONG + "\nimport builtins\nbuiltins.exec = lambda *args, **kwargs: None", "failed", 0),
        (WRONG + '\nimport json\njson.dumps = lambda obj: \'{"result": "passed", "units": null}\'', "failed", 0),
        (WRONG + "\nimport __main__\n__main__.UNITS = ['pass'] * len(__main__.UNITS)", "failed", 0),
        (WRONG + "\nimport __main__\n__main__._units = lambda *args: [True] * 3", "failed", 0),
        (WRONG + "\ndef remove_Occ(s, ch): return input()", "failed", 0),  # stdin cannot be read
        ("import ctypes\nctypes.string_at(0)", "failed", 0),  # a crash is a failure, not an error of the harness
    ],
)
def test_wrong_and_evasive_programs_fail(code: str, result: str, units: int) -> None:
    grade = MBPP.grade(_fence(code), MB0)
    assert not grade.correct and grade.details["result"] == result and grade.details["passed_units"] == units


@needs_sandbox
def test_main_blocks_do_not_run_as_officially() -> None:
    """The official evaluation ``exec``-s the program in an empty namespace, where ``__name__`` is ``builtins``."""
    code = MB0["code"] + "\nif __name__ == '__main__':\n    raise SystemExit(1)"
    assert MBPP.grade(_fence(code), MB0).correct


@needs_sandbox
def test_rewards_are_the_fraction_of_test_cases_passed() -> None:
    rewards = MBPP.reward_many([_fence(PARTIAL), _fence(WRONG), _fence("def f(x) return"), PARTIAL], [MB0] * 4)
    assert [r.components for r in rewards] == [
        {"code_format": 0.5, "code": pytest.approx(2.0 / 3)},
        {"code_format": 0.5, "code": 0.0},
        {"code_format": 0.25, "code": 0.0},  # a syntax error: not run
        {"code_format": 0.0, "code": 0.0},  # no fence: not run, as DiffuCoder's reward
    ]
    half = "def has_close_elements(numbers, threshold):\n    return False"  # passes the 3 checks expecting False
    reward = HUMANEVAL.reward(_fence(half), HE0, "d1")
    assert reward.components["code"] == pytest.approx(2.0 * 3 / 7)


@needs_sandbox
def test_grading_is_bounded_in_time() -> None:
    """A busy loop is stopped by the 3-second CPU timer (on a machine so loaded that 3 CPU seconds take longer than
    the sandbox's wall-clock limit, by the sandbox: a time-out either way), so the harness is never held longer than
    the sandbox's limits (and the second it gives a killed namespace to end)."""
    start = time.monotonic()
    grade = MBPP.grade(_fence("while True:\n    pass"), MB0)
    assert grade.details["result"] == "timed out" and not grade.correct
    assert time.monotonic() - start < grader.LIMITS.wall_seconds + 2.0


def test_nothing_runs_without_a_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(code_io_grader, "sandbox_unavailable", lambda: "no namespaces here")
    monkeypatch.setattr(grader.sandbox, "run_program", lambda source, **kwargs: calls.append(source))
    for call in (lambda: MBPP.grade(MB0["code"], MB0), lambda: HUMANEVAL.reward(_fence("x = 1"), HE0, "d1")):
        with pytest.raises(sandbox.SandboxUnavailable, match="no namespaces here"):
            call()
    assert calls == []


# ------------------------------------------------------------------------------------------- evaluation
def test_the_stabledrl_code_protocol_decodes_as_code_metrics() -> None:
    """``code_metrics.py``'s defaults: 256 tokens, block 8, 256 steps (one token per step), greedy, the prompt
    without a chat template."""
    protocol = get_protocol("stabledrl-code")
    settings = protocol.full_settings(256)
    assert (settings.block_length, settings.steps, settings.temperature) == (8, 256, 0.0)
    assert (protocol.prompt_protocol, protocol.chat_template, protocol.prefill) == ("stabledrl_eval", False, "")


@needs_sandbox
def test_eval_runs_them_under_the_stabledrl_code_protocol_only() -> None:
    dlm = build_tiny(**SMALL)
    for task in (HUMANEVAL, MBPP):
        outcome = evaluate(
            dlm, task.name, protocol="stabledrl-code", max_completion_length=16, limit=2, batch_size=2, progress=False
        )
        assert outcome.metrics["n"] == 2 and outcome.metrics["accuracy"] == 0.0  # an untrained model
        assert outcome.samples[0]["prompt"] == task.user_message(task.eval_docs(limit=1)[0], "stabledrl_eval")
        with pytest.raises(UserError, match="unknown protocol 'd1'"):
            evaluate(dlm, task.name, protocol="d1", max_completion_length=16, limit=2, progress=False)
