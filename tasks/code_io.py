"""Code I/O: write a one-line Python function ``f(x)`` from a few input/output examples, graded by running it.

A small generated code task, so that RL with execution rewards runs end to end on a laptop CPU and in CI (the tiny
preset), the way DiffuCoder's coupled-GRPO trains on code with test-case rewards.

**Problems.** A problem is a function from a fixed universe (:data:`FAMILIES`: ``x+a``, ``x-a``, ``a-x``, ``x*a``,
``x//a``, ``x%a``, ``a*x+b``, ``a*x-b``, ``x*x+a``, ``x*x-a`` with one-digit constants, 213 functions), four
examples on distinct inputs from ``0..19`` (shown in the prompt) and twelve hidden test cases (the four examples and
eight more inputs). The examples are drawn again until no other function of the universe fits them, so every
problem has one answer in the universe, and the hidden tests check it. Every expression has at most five characters,
so the ``tiny`` gold completion ``<answer>def f(x):return x+3</answer>`` has at most 38 characters and fits the tiny
preset's shortest canvas (40 tokens) with its EOS; every character is printable ASCII, which the tiny model's
character tokenizer covers.

**Train and test are disjoint by function.** A function is held out for testing iff ``zlib.crc32`` of its
expression text is divisible by 4 (:func:`is_test_function`: 56 of the 213, in every family). The committed test set
(``data/code_io/test.jsonl``, 256 problems) is ``make_problems(**TEST_RECIPE)``, drawn from those functions only;
:meth:`CodeIOTask.generate` (RL and SFT problems) and the ``train`` split draw from the other 157 only. So a test
score measures writing functions never trained on, of families that were.

**Grading** runs the completion only in the sandbox (:mod:`.graders.code_io`, docs/sandbox.md): the program is the
last ``<answer>`` tag's text; it must be one ``def f(x):`` (checked with :mod:`ast`, never executed for that), and
one sandboxed process per completion calls it on the twelve hidden inputs. ``correct``: all twelve pass; ``score``:
the fraction passed. Where the sandbox is unavailable, grading and rewards stop with one error line.

**Rewards** follow DiffuCoder's coupled-GRPO recipe (``apple/ml-diffucoder``: ``recipes/config_coupled_code.yaml``
``reward_funcs: [code, code_format]``, ``reward_weights: [2.0, 0.5]``; ``src/open_r1/rewards.py``):
``code_format`` = 0.5 x (1.0 for a well-formed definition, 0.5 for an answer tag holding anything else, DiffuCoder's
partial credit for a grammar error, 0.0 without a tag) and ``code`` = 2.0 x the fraction of hidden tests passed,
computed, as in DiffuCoder, only for a completion whose format is 1.0. Why these weights: they are the recipe's own,
so this task's reward has the shape of the paper's code reward (a correct function earns 2.5, a well-formed wrong
one 0.5, and passing tests outweighs the format four to one, so RL cannot settle for the format). The ``d1`` profile
is this reward (d1 has no code task); the ``stabledrl`` profile adds StableDRL's ``anti_short_boxed``, as every task
does.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UserError
from .base import GradeResult, RewardResult, Task, data_rng, read_json_lines, require, tagged_completion
from .graders.code_io import FUNCTION_NAME, Execution, extract_program, format_score, run_tests
from .math_common import D1_TRAIN_SYSTEM_PROMPT
from .rewards import anti_short_boxed

DOMAIN = tuple(range(20))  # every input, shown or hidden
SHOWN, HIDDEN = 4, 12  # examples in the prompt; hidden test cases (the examples included)
FORMAT_WEIGHT, CODE_WEIGHT = 0.5, 2.0  # DiffuCoder's reward_weights for code_format and code
TEST_FILE = "code_io/test.jsonl"
# How the committed test set was made (tests/test_code_io.py regenerates it): make_problems(**TEST_RECIPE)
TEST_RECIPE = {"n": 256, "seed": 5252, "held_out": True}

CODE_SYSTEM_PROMPT = (
    "You are a Python programmer. You will be given input/output examples of an integer function. Write the "
    "function f(x) in Python: one line that returns an integer.\nRespond in the following format:\n<reasoning>\n"
    "Your reasoning here\n</reasoning>\n<answer>\ndef f(x):\n    return ...\n</answer>"
)


@dataclass(frozen=True)
class Family:
    """Functions of one shape: an expression template over ``x`` and constants, and how to compute it here."""

    name: str
    template: str  # str.format template, constants in order
    constants: tuple[tuple[int, ...], ...]
    compute: Callable[..., int]  # (x, *constants) -> value; the harness's own arithmetic, never model text

    def members(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(self.template.format(*c), c) for c in self.constants]


def _ones(low: int) -> tuple[tuple[int, ...], ...]:
    return tuple((a,) for a in range(low, 10))


_PAIRS = tuple((a, b) for a in range(2, 10) for b in range(1, 10))
FAMILIES: tuple[Family, ...] = (
    Family("add", "x+{}", _ones(1), lambda x, a: x + a),
    Family("subtract", "x-{}", _ones(1), lambda x, a: x - a),
    Family("subtract_from", "{}-x", _ones(1), lambda x, a: a - x),
    Family("multiply", "x*{}", _ones(2), lambda x, a: x * a),
    Family("floor_divide", "x//{}", _ones(2), lambda x, a: x // a),
    Family("remainder", "x%{}", _ones(2), lambda x, a: x % a),
    Family("affine_plus", "{}*x+{}", _PAIRS, lambda x, a, b: a * x + b),
    Family("affine_minus", "{}*x-{}", _PAIRS, lambda x, a, b: a * x - b),
    Family("square_plus", "x*x+{}", _ones(1), lambda x, a: x * x + a),
    Family("square_minus", "x*x-{}", _ones(1), lambda x, a: x * x - a),
)


def is_test_function(expression: str) -> bool:
    """Whether a function is held out for testing: ``zlib.crc32`` of its expression divisible by 4."""
    return zlib.crc32(expression.encode()) % 4 == 0


@dataclass(frozen=True)
class Universe:
    """Every function of :data:`FAMILIES`: its expression, family index and values on :data:`DOMAIN`."""

    expressions: tuple[str, ...]
    family: tuple[int, ...]
    values: np.ndarray  # (functions, len(DOMAIN)) int64

    def pool(self, held_out: bool) -> list[list[int]]:
        """Per family, the indices of its test functions (``held_out``) or of its training functions."""
        pools: list[list[int]] = [[] for _ in FAMILIES]
        for i, expression in enumerate(self.expressions):
            if is_test_function(expression) == held_out:
                pools[self.family[i]].append(i)
        return pools


def universe() -> Universe:
    """The function universe, built from :data:`FAMILIES` with the harness's own arithmetic."""
    expressions, family, rows = [], [], []
    for k, fam in enumerate(FAMILIES):
        for expression, constants in fam.members():
            expressions.append(expression)
            family.append(k)
            rows.append([fam.compute(x, *constants) for x in DOMAIN])
    return Universe(tuple(expressions), tuple(family), np.array(rows, dtype=np.int64))


_UNIVERSE = universe()


def make_problems(n: int, seed: int, *, held_out: bool = False) -> list[dict[str, Any]]:
    """``n`` distinct problems (distinct examples), deterministic in ``seed`` (``numpy.random.default_rng``).

    Each draws a family uniformly, then one of its functions of the chosen side of the split (``held_out``: test
    functions, else training functions), then :data:`SHOWN` distinct inputs until only that function of the whole
    universe fits their examples, then ``HIDDEN - SHOWN`` further inputs; examples and tests are sorted by input.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise UserError(f"n must be a non-negative integer, got {n!r}")
    rng = data_rng(seed)
    pools = [pool for pool in _UNIVERSE.pool(held_out) if pool]
    values = _UNIVERSE.values
    seen: set[tuple[tuple[int, int], ...]] = set()
    problems: list[dict[str, Any]] = []
    attempts = 100 * n + 1000
    for _ in range(attempts):
        if len(problems) == n:
            break
        pool = pools[int(rng.integers(len(pools)))]
        function = pool[int(rng.integers(len(pool)))]
        shown = np.sort(rng.choice(len(DOMAIN), size=SHOWN, replace=False))
        if int((values[:, shown] == values[function, shown]).all(axis=1).sum()) != 1:
            continue  # another function fits these examples too
        rest = np.setdiff1d(np.arange(len(DOMAIN)), shown)
        tests = np.sort(np.concatenate([shown, rng.choice(rest, size=HIDDEN - SHOWN, replace=False)]))
        examples = tuple((DOMAIN[i], int(values[function, i])) for i in shown)
        if examples in seen:
            continue
        seen.add(examples)
        problems.append(
            {
                "function": _UNIVERSE.expressions[function],
                "examples": [list(e) for e in examples],
                "tests": [[DOMAIN[i], int(values[function, i])] for i in tests],
            }
        )
    if len(problems) < n:
        raise UserError(f"could only generate {len(problems)} of {n} code problems in {attempts} attempts")
    return problems


@dataclass(frozen=True)
class Problem:
    """A doc's gold fields, validated: the gold expression, the shown examples and the hidden tests."""

    function: str
    examples: tuple[tuple[int, int], ...]
    tests: tuple[tuple[int, int], ...]


def _pairs(doc: Mapping[str, Any], key: str) -> tuple[tuple[int, int], ...]:
    rows = require(doc, key, list, "a list of [input, output] integer pairs")
    if not rows or any(
        not isinstance(r, list | tuple) or len(r) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in r)
        for r in rows
    ):
        raise UserError(f"field {key!r} must be a non-empty list of [input, output] integer pairs")
    return tuple((int(r[0]), int(r[1])) for r in rows)


def tiny_prompt(examples: Sequence[tuple[int, int]]) -> str:
    """The ``tiny`` protocol's prompt: each example ``input:output`` in fixed-width fields (2 and 3 characters),
    e.g. ``" 1:  4  2:  5  7: 10 13: 16"``; fixed widths make copying a number a fixed offset (as Countdown's
    :func:`.countdown.tiny_prompt`)."""
    return " ".join(f"{x:>2}:{y:>3}" for x, y in examples)


def question(examples: Sequence[tuple[int, int]]) -> str:
    """The problem in words, for the full-size protocols."""
    shown = ", ".join(f"f({x}) = {y}" for x, y in examples)
    return f"Write a Python function f(x) that returns an integer and fits these examples: {shown}."


class DiffuCoderRewards:
    """DiffuCoder's coupled-GRPO code reward, shared by the code tasks (module docstring, **Rewards**): ``code_format``
    = :data:`FORMAT_WEIGHT` x the format score, ``code`` = :data:`CODE_WEIGHT` x the fraction of tests passed (a
    task reports 0 passed for a program it did not run, so the code part counts only where the format is 1.0); the
    ``stabledrl`` profile adds ``anti_short_boxed``, as for every task. A task supplies each completion's
    (format score, fraction passed), one sandbox batch per call."""

    def _formats_and_fractions(
        self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]
    ) -> list[tuple[float, float]]:
        raise NotImplementedError

    def d1_rewards(self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]) -> list[RewardResult]:
        return [
            RewardResult.of(code_format=FORMAT_WEIGHT * fmt, code=CODE_WEIGHT * fraction)
            for fmt, fraction in self._formats_and_fractions(completions, docs)
        ]

    def stabledrl_rewards(self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]) -> list[RewardResult]:
        return [
            RewardResult.of(**reward.components, anti_short_boxed=anti_short_boxed(completion))
            for reward, completion in zip(self.d1_rewards(completions, docs), completions, strict=True)
        ]

    def d1_reward(self, completion: str, doc: Mapping[str, Any]) -> RewardResult:
        return self.d1_rewards([completion], [doc])[0]

    def stabledrl_reward(self, completion: str, doc: Mapping[str, Any]) -> RewardResult:
        return self.stabledrl_rewards([completion], [doc])[0]


class CodeIOTask(DiffuCoderRewards, Task):
    """Code I/O: write a one-line Python function from input/output examples (generated by this repository; graded
    by running it in the sandbox)."""

    name = "code_io"
    description = (
        "Code I/O: write a one-line Python function from four input/output examples, graded by running it in the "
        "sandbox (problems generated by this repository)."
    )
    label = "Code I/O"
    note = (
        "Code I/O is not a column of the paper: 256 generated problems (`tasks/data/code_io/test.jsonl`), each a "
        "one-line Python function to write from four input/output examples; correct when it passes all twelve "
        "hidden tests, run in the sandbox. No test function is ever an RL or SFT problem."
    )
    splits = ("train", "test")

    # ------------------------------------------------------------------------------------------ data
    def _read(self, split: str) -> list[dict[str, Any]]:
        if split == "train":  # procedural, like the generator (training functions only); not a shipped file
            return make_problems(4096, seed=0)
        return read_json_lines(TEST_FILE)

    @staticmethod
    def gold(doc: Mapping[str, Any]) -> Problem:
        """The doc's :class:`Problem`, validated."""
        function = require(doc, "function", str, "the gold expression in x")
        return Problem(function, _pairs(doc, "examples"), _pairs(doc, "tests"))

    # --------------------------------------------------------------------------------------- prompts
    def user_message(self, doc: Mapping[str, Any], protocol: str) -> str:
        examples = self.gold(doc).examples
        if protocol in ("d1", "tracerl"):
            return CODE_SYSTEM_PROMPT + "\n\n" + question(examples)
        if protocol == "d1_train":
            return D1_TRAIN_SYSTEM_PROMPT + question(examples)
        if protocol in ("stabledrl", "stabledrl_eval"):
            return (
                question(examples) + " Please put the reasoning in <reasoning> tags and the function in <answer> tags."
            )
        return tiny_prompt(examples)

    def _target(self, doc: Mapping[str, Any], protocol: str) -> str:
        function = self.gold(doc).function
        if protocol == "tiny":
            return f"<answer>def {FUNCTION_NAME}(x):return {function}</answer>"
        program = f"def {FUNCTION_NAME}(x):\n    return {function}"
        return tagged_completion(f"Every example fits f(x) = {function}.", program, protocol)

    # ------------------------------------------------------------------------------ rewards, grading
    def _run(
        self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]
    ) -> list[tuple[str | None, float, Execution]]:
        """Each completion's program, its format score and how its execution went (one sandbox batch)."""
        tests = [self.gold(doc).tests for doc in docs]
        programs = [extract_program(c) for c in completions]
        executions = run_tests(programs, tests, task=self.name)
        return [(p, format_score(p), e) for p, e in zip(programs, executions, strict=True)]

    def _formats_and_fractions(
        self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]
    ) -> list[tuple[float, float]]:
        return [(fmt, execution.fraction) for _, fmt, execution in self._run(completions, docs)]

    def grade(self, completion: str, doc: Mapping[str, Any]) -> GradeResult:
        """``correct``: a well-formed ``def f(x)`` passing every hidden test; ``score``: the fraction passed."""
        return self._grade_many([completion], [doc])[0]

    def _grade_many(self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]) -> list[GradeResult]:
        return [
            GradeResult(
                correct=fmt == 1.0 and execution.passed == execution.total,
                score=execution.fraction,
                extracted=program,
                details={
                    "format": fmt,
                    "passed": execution.passed,
                    "tests": execution.total,
                    "status": execution.status,
                },
            )
            for program, fmt, execution in self._run(completions, docs)
        ]

    # ------------------------------------------------------------------------------------- generator
    def generate(self, n: int, seed: int, **kwargs: Any) -> list[dict[str, Any]]:
        """``n`` distinct training problems from training functions only (:func:`make_problems`), deterministic in
        ``seed``; no test function is ever one of them (the module docstring)."""
        if kwargs:
            raise TypeError(f"unexpected generator options {sorted(kwargs)}")
        return [
            {"doc_id": f"{self.name}/generated-{seed}/{i}", "task": self.name, **problem}
            for i, problem in enumerate(make_problems(n, seed))
        ]
