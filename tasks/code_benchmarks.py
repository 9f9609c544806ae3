"""HumanEval and MBPP as the official StableDRL evaluation runs them, graded by running the code in the sandbox.

Source: ``JianyuanZhong/StableDRL`` at ``26ad014f``: ``code_metrics.py`` (decoding and wiring),
``evaluate/humaneval.py`` and ``evaluate/mbpp.py`` (prompts), ``custom_humaneval/evaluation.py`` and
``execution.py`` (extraction and scoring), ``scripts/eval_code.sh``; data ``datasets/HumanEval.jsonl.gz`` (164
problems) and ``datasets/mbpp_test.jsonl`` (MBPP's 500 test problems, task ids 11-510), committed unchanged
(``data/README.md``).

**Prompts** (prompt protocol ``stabledrl_eval``, which the ``stabledrl-code`` evaluation protocol feeds the model
without a chat template, as ``code_metrics.py`` does): HumanEval's asks for the function ``entry_point`` and shows
the problem's prompt, right-stripped, in a `````python`` fence; MBPP's shows the problem text, its three asserts
(indented four spaces) and a stub ``def name(input_param_1, ...):`` with the text as docstring, the name taken from
the first assert (its second word, up to ``(``) and the number of parameters from that assert's first call of the
name (:mod:`ast`, breadth first; 2 if the assert does not parse). ``code_metrics.py`` builds MBPP's prompts from
``datasets/mbpp.jsonl`` rows 10-509; their text, asserts, code and ids equal ``mbpp_test.jsonl``'s row for row
(checked when the data were added), so only the test file is shipped. The ``stabledrl`` protocol (RL training, with
the chat template, as StableDRL trains) uses the same text.

**Scoring** (``process_humaneval_test``, ``check_correctness``): the code is the first `````python`` fence's text,
stripped, else the whole completion (:func:`.graders.unit_tests.extract_code`); the test program is, for HumanEval,
the problem's original prompt + code + newline + its ``test`` + newline + ``check(entry_point)``, for MBPP, code +
newline + the asserts joined by newlines (MBPP's ``test_setup_code`` is not used: the official evaluation does not
read it). A sample passes when the program runs without an exception within 3 s; one greedy sample per problem, so
pass@1 is the fraction of problems passed (``correct``; ``score`` is the same). Departures, all in how the program
is run (:mod:`.graders.unit_tests`): it runs in the sandbox, not in a forked copy of the harness; the 3-second timer
counts CPU time, not wall time; the official "reliability guard" (``os.system`` and others set to None) is not
reproduced. The official script also pads the problem list to a multiple of the GPU count and drops the padding;
nothing here needs that.

**Rewards** for RL: DiffuCoder's coupled-GRPO reward, as ``code_io`` (:class:`.code_io.DiffuCoderRewards`):
``code_format`` = 0.5 x (1.0 for a `````python`` fence whose code parses, 0.5 for one that does not, 0.0 without a
fence) and ``code`` = 2.0 x the fraction of test cases passed (MBPP: its asserts; HumanEval: the statements of
``check`` that hold an assert), run only where the format is 1.0.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..errors import UserError
from .base import GradeResult, Task, read_json_lines, require
from .code_io import DiffuCoderRewards
from .graders.unit_tests import TestProgram, check_units, code_format, extract_code, run_unit_tests

HUMANEVAL_FILE = "humaneval/HumanEval.jsonl.gz"
MBPP_FILE = "mbpp/mbpp_test.jsonl"
INTRO = "You are an expert Python programmer. Your task is to complete the implementation of a function named `{}`."


def mbpp_signature(first_assert: str) -> tuple[str, int]:
    """The function name and parameter count ``evaluate/mbpp.py`` reads off a problem's first assert: the name is
    the assert's second space-separated word up to ``(``; the count is the positional arguments of the first call of
    that name in breadth-first order (0 if there is none, 2 if the assert does not parse)."""
    name = first_assert.split(" ")[1].split("(")[0]
    try:
        tree = ast.parse(first_assert.strip())
    except (SyntaxError, ValueError):
        return name, 2
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == name:
            return name, len(node.args)
    return name, 0


def humaneval_prompt(doc: Mapping[str, Any]) -> str:
    """The official zero-shot HumanEval prompt (``format_HumanEval_prompt_zero_shot``)."""
    return (
        f"{INTRO.format(doc['entry_point'])}\n\nHere is the function to complete:\n```python\n"
        f"{doc['prompt'].rstrip()}\n```\n"
    )


def mbpp_prompt(doc: Mapping[str, Any]) -> str:
    """The official zero-shot MBPP prompt (``format_MBPP_prompt_zero_shot``)."""
    name, count = mbpp_signature(doc["test"][0])
    parameters = ", ".join(f"input_param_{i + 1}" for i in range(count))
    asserts = "\n".join("    " + test for test in doc["test"])
    text = doc["prompt"]
    return (
        f"{INTRO.format(name)}\n\n** TARGET FUNCTION **\n{text}\n\n** UNIT TESTS **\n"
        f"Your code should pass unit tests like:\n{asserts}\n\nHere is the function to complete:\n```python\n"
        f'def {name}({parameters}):\n    """{text}\n    """\n```\n'
    )


class UnitTestCodeTask(DiffuCoderRewards, Task):
    """A code task scored as the official StableDRL evaluation scores it (module docstring); subclasses read their
    data, write their prompt and assemble their test program."""

    splits = ("test",)
    protocols: ClassVar[tuple[str, ...]] = ("stabledrl_eval", "stabledrl")

    def user_message(self, doc: Mapping[str, Any], protocol: str) -> str:
        return self.official_prompt(doc)

    def official_prompt(self, doc: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def solution(self, doc: Mapping[str, Any]) -> str:
        """The reference solution as a whole program (what a gold completion puts in its fence)."""
        raise NotImplementedError

    def test_program(self, code: str, doc: Mapping[str, Any]) -> TestProgram:
        """The official test program for extracted ``code``, and its test cases as units (for the reward)."""
        raise NotImplementedError

    def _target(self, doc: Mapping[str, Any], protocol: str) -> str:
        return f"```python\n{self.solution(doc)}\n```"

    # ------------------------------------------------------------------------------ rewards, grading
    def _formats_and_fractions(
        self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]
    ) -> list[tuple[float, float]]:
        formats = [code_format(c) for c in completions]
        tests = [
            self.test_program(extract_code(c), doc) if fmt == 1.0 else None
            for c, doc, fmt in zip(completions, docs, formats, strict=True)
        ]
        runs = run_unit_tests(tests, task=self.name)
        return [(fmt, run.fraction) for fmt, run in zip(formats, runs, strict=True)]

    def grade(self, completion: str, doc: Mapping[str, Any]) -> GradeResult:
        """``correct``: the official test program runs without an exception (pass@1 of one sample)."""
        return self._grade_many([completion], [doc])[0]

    def _grade_many(self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]) -> list[GradeResult]:
        codes = [extract_code(c) for c in completions]
        tests = [self.test_program(code, doc) for code, doc in zip(codes, docs, strict=True)]
        runs = run_unit_tests(tests, task=self.name)
        return [
            GradeResult(
                correct=run.passed,
                score=float(run.passed),
                extracted=code,
                details={
                    "result": run.result,
                    "format": code_format(completion),
                    "passed_units": run.passed_units,
                    "units": run.total_units,
                },
            )
            for completion, code, run in zip(completions, codes, runs, strict=True)
        ]


class HumanEvalTask(UnitTestCodeTask):
    """HumanEval (OpenAI, 164 problems) as the official StableDRL evaluation runs it: complete a Python function,
    graded by its unit tests in the sandbox."""

    name = "humaneval"
    description = (
        "HumanEval: complete a Python function from its signature and docstring, graded by its unit tests in the "
        "sandbox (164 problems, openai/human-eval via JianyuanZhong/StableDRL)."
    )
    label = "HumanEval"
    note = (
        "HumanEval is not a column of the paper: OpenAI's 164 problems, prompted and scored as StableDRL's "
        "`code_metrics.py` does (pass@1 of one greedy sample), the tests run in the sandbox."
    )

    def _read(self, split: str) -> list[dict[str, Any]]:
        return read_json_lines(HUMANEVAL_FILE)

    def official_prompt(self, doc: Mapping[str, Any]) -> str:
        for key in ("entry_point", "prompt"):
            require(doc, key, str, "HumanEval's problem text")
        return humaneval_prompt(doc)

    def solution(self, doc: Mapping[str, Any]) -> str:
        return require(doc, "prompt", str, "the function's header") + require(
            doc, "canonical_solution", str, "the reference body"
        )

    def test_program(self, code: str, doc: Mapping[str, Any]) -> TestProgram:
        prompt = require(doc, "prompt", str, "the function's header")
        test = require(doc, "test", str, "the problem's check function")
        entry = require(doc, "entry_point", str, "the function's name")
        program = f"{prompt}{code}\n{test}\ncheck({entry})"
        setup = f"{prompt}{code}\n{test}\ncandidate = {entry}\n"
        return TestProgram(program, setup, tuple(check_units(test, "check")))


class MBPPTask(UnitTestCodeTask):
    """MBPP (Google Research, the 500 test problems) as the official StableDRL evaluation runs it: write a Python
    function from a sentence and three asserts, graded by the asserts in the sandbox."""

    name = "mbpp"
    description = (
        "MBPP: write a Python function from a description and three asserts, graded by the asserts in the sandbox "
        "(500 test problems, google-research/mbpp via JianyuanZhong/StableDRL)."
    )
    label = "MBPP"
    note = (
        "MBPP is not a column of the paper: Google Research's 500 test problems, prompted and scored as StableDRL's "
        "`code_metrics.py` does (pass@1 of one greedy sample), the asserts run in the sandbox."
    )

    def _read(self, split: str) -> list[dict[str, Any]]:
        return read_json_lines(MBPP_FILE)

    @staticmethod
    def asserts(doc: Mapping[str, Any]) -> list[str]:
        tests = require(doc, "test", list, "the problem's asserts")
        if not tests or not all(isinstance(t, str) for t in tests):
            raise UserError("field 'test' must be a non-empty list of assert lines")
        return tests

    def official_prompt(self, doc: Mapping[str, Any]) -> str:
        self.asserts(doc)
        require(doc, "prompt", str, "the problem's description")
        return mbpp_prompt(doc)

    def solution(self, doc: Mapping[str, Any]) -> str:
        return require(doc, "code", str, "the reference solution")

    def test_program(self, code: str, doc: Mapping[str, Any]) -> TestProgram:
        tests = self.asserts(doc)
        return TestProgram(code + "\n" + "\n".join(tests), code, tuple(tests))
