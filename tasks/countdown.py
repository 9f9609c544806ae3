"""Countdown: combine the given numbers with ``+ - * /`` (each used once) to reach the target.

Splits: ``test`` (d1's cd3 test, 256 three-number puzzles), ``train`` (the first 10,240 rows of
Countdown-Tasks-3to4 minus the puzzles that also occur in the test set) and ``train_cd3`` (its three-number
rows, what d1 trains on). :meth:`CountdownTask.generate` makes new puzzles procedurally.

``countdown_large`` (:class:`CountdownLargeTask`) is the same task evaluated on 1,024 generated three-number
puzzles drawn like the cd3 test (``data/countdown/generated_cd3like_test.jsonl``). Why it exists: a paired interval
on 256 puzzles resolves only changes of about 3 points for a model that solves 5-15% of them; four times the
puzzles halve that.

The solver (:func:`solve`) searches all ways of combining numbers pairwise with exact rational arithmetic,
so it proves a target reachable by returning an expression that reaches it.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import UserError
from .base import GradeResult, RewardResult, Task, data_rng, read_data_file, require, tagged_completion
from .graders.arithmetic import NUMBER_RULES, NumberRule
from .graders.countdown import grade_countdown
from .math_common import D1_TRAIN_SYSTEM_PROMPT
from .rewards import anti_short_boxed, countdown_score

# d1 eval/countdown.py (the format block follows the example without a newline, as in d1).
D1_COUNTDOWN_SYSTEM_PROMPT = (
    "Using only the provided numbers, create an arithmetic expression that evaluates to exactly the provided "
    "target number. You may use the operations +, -, *, and / as needed, but each number must be used exactly "
    "once. Think step-by-step. After reasoning, provide only your final expression inside \\boxed{} tags without "
    "including an equals sign or the target number. For example: \\boxed{a + b * c}Respond in the following "
    "format:\n<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n\\boxed{...}\n</answer>"
)
_APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


@dataclass(frozen=True)
class Expr:
    """An expression with its exact value and operator precedence (3 atom, 2 ``* /``, 1 ``+ -``)."""

    value: Fraction
    text: str
    precedence: int = 3

    @classmethod
    def atom(cls, number: int) -> Expr:
        return cls(Fraction(number), str(number))

    def combine(self, op: str, other: Expr) -> Expr | None:
        """``self op other`` printed with the fewest parentheses; None for a division by zero."""
        if op == "/" and other.value == 0:
            return None
        left = self.text if self.precedence >= (2 if op in "*/" else 1) else f"({self.text})"
        right_min = {"+": 1, "-": 2, "*": 2, "/": 3}[op]
        right = other.text if other.precedence >= right_min else f"({other.text})"
        return Expr(_APPLY[op](self.value, other.value), f"{left}{op}{right}", 2 if op in "*/" else 1)


def _pairings(items: tuple[Expr, ...]) -> Iterator[tuple[Expr, tuple[Expr, ...]]]:
    """Every expression obtained by combining two of ``items``, with the remaining items."""
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            a, b = items[i], items[j]
            rest = items[:i] + items[i + 1 : j] + items[j + 1 :]
            for left, op, right in ((a, "+", b), (a, "*", b), (a, "-", b), (b, "-", a), (a, "/", b), (b, "/", a)):
                combined = left.combine(op, right)
                if combined is not None:
                    yield combined, rest


def solve(numbers: Sequence[int], target: int) -> str | None:
    """An expression using every number exactly once that equals ``target``, or None if none exists.

    Depth-first over pairwise combinations; multisets of intermediate values already shown not to reach the
    target are remembered, so each is explored once.
    """
    goal = Fraction(target)
    failed: set[tuple[Fraction, ...]] = set()

    def search(items: tuple[Expr, ...]) -> str | None:
        if len(items) == 1:
            return items[0].text if items[0].value == goal else None
        key = tuple(sorted(item.value for item in items))
        if key in failed:
            return None
        for combined, rest in _pairings(items):
            found = search((combined, *rest))
            if found is not None:
                return found
        failed.add(key)
        return None

    return search(tuple(Expr.atom(n) for n in numbers)) if numbers else None


# Search order of flat_solution: the prompt's first two numbers are tried as the first step first.
_FLAT_ORDERS = ((0, 1, 2), (1, 0, 2), (0, 2, 1), (2, 0, 1), (1, 2, 0), (2, 1, 0))
TINY_WIDTH = 3  # the tiny protocol's field width: every number and intermediate value right-aligned in 3 characters


def flat_solution(numbers: Sequence[int], target: int) -> tuple[int, str, int, int, str, int] | None:
    """``(x, op1, y, v, op2, z)`` such that ``x op1 y op2 z`` uses the three ``numbers`` once and equals ``target``
    both read left to right and with the usual precedence, and the intermediate ``v = x op1 y`` is a positive
    integer below 1000; None if no such solution exists (e.g. one needing ``a*(b+c)``).

    Deterministic: orders of the numbers in :data:`_FLAT_ORDERS`, operators in ``+ - * /``, first match. Every
    puzzle solvable with ``+`` and ``-`` alone has one (write its positive terms first).
    """
    if len(numbers) != 3:
        return None
    for i, j, k in _FLAT_ORDERS:
        x, y, z = numbers[i], numbers[j], numbers[k]
        for op1 in "+-*/":
            if op1 == "/" and y == 0:
                continue
            v = _APPLY[op1](Fraction(x), Fraction(y))
            if v.denominator != 1 or not 0 < v < 10**TINY_WIDTH:
                continue
            for op2 in "+-*/":
                if op2 in "*/" and op1 in "+-":  # precedence would not read it left to right
                    continue
                if (op2 != "/" or z != 0) and _APPLY[op2](v, Fraction(z)) == target:
                    return x, op1, y, int(v), op2, z
    return None


def tiny_worked_solution(numbers: Sequence[int], target: int) -> str | None:
    """The ``tiny`` protocol's gold completion of a three-number puzzle: the first step, then the answer, in
    fixed-width fields, e.g. ``" 75+ 18= 93<answer> 75+ 18- 83</answer>"`` for the puzzle 83 18 75 -> 10.

    Why (measured on the built-in 0.8M-parameter tiny model, greedy ``tiny`` protocol, the 256 cd3 test puzzles):
    SFT on the answer alone (``<answer>75-(83-18)</answer>``) solves 2-3% after 3000 steps, and a first step of
    variable width (``83-18=65 <answer>...``) 0%: the protocol decodes two tokens per step in parallel, and where the
    digit count of a number is uncertain the positions garble (``"83-18=1 0 aanwe>r>"``). Right-aligning every
    number in 3 characters gives each character a fixed position (39 characters: it fits the 40-token canvas with
    its EOS), and the answer then copies its numbers from the step at a fixed offset: 3000 steps of 32 generated
    three-number puzzles (constant lr 2e-3, canvas 40..64, 10 minutes on one CPU thread) solve 9.8%, 10.2% and 9.0%
    at 40, 48 and 64 tokens on training seed 0, the fixed-width answer alone about 1% (these measurements used the
    earlier variable-width prompt; seed 1 then solved 0%, which :func:`tiny_prompt` fixed). The grader and the
    rewards read only the ``<answer>`` tag, where the padding spaces are harmless, so RL can still change the
    chosen operations.

    None when a number or ``v`` does not fit the width or the puzzle has no flat solution (:func:`flat_solution`);
    the caller then uses the answer-only layout.
    """
    solution = None if any(not 0 <= n < 10**TINY_WIDTH for n in numbers) else flat_solution(numbers, target)
    if solution is None:
        return None
    x, op1, y, v, op2, z = solution
    w = TINY_WIDTH
    return f"{x:>{w}}{op1}{y:>{w}}={v:>{w}}<answer>{x:>{w}}{op1}{y:>{w}}{op2}{z:>{w}}</answer>"


def tiny_prompt(numbers: Sequence[int], target: int) -> str:
    """The ``tiny`` protocol's puzzle, every number right-aligned in a field of ``TINY_WIDTH + 1`` characters:
    ``"  30 100  93 ->  23"`` for ``30 100 93 -> 23``.

    Why: the worked solution copies the numbers into fixed-width fields, and with a fixed-width prompt every copy
    is a fixed offset. With the plain prompt ``"30 100 93 -> 23"``, where a number's position depends on the widths
    of the numbers before it, the SFT of :func:`tiny_worked_solution` solved 10.2% of the cd3 test puzzles at 48
    tokens on training seed 0 and 0.0% on seed 1, whose model never learned to copy the numbers. With this prompt
    the same SFT solved 10.9%, 5.5% and 10.9% on seeds 0, 1 and 2 (the starts of the committed ``table1-tiny``
    records).
    """
    w = TINY_WIDTH + 1
    return "".join(f"{n:>{w}}" for n in numbers) + f" ->{target:>{w}}"


def puzzle_key(numbers: Sequence[int], target: int) -> tuple[tuple[int, ...], int]:
    """Identity of a puzzle: the multiset of numbers and the target."""
    return tuple(sorted(numbers)), int(target)


class CountdownTask(Task):
    """Countdown: combine the given numbers with + - * / to reach the target (d1's 3-number test set)."""

    name = "countdown"
    label = "Countdown"
    splits = ("train", "train_cd3", "test")

    def __init__(self, number_rule: NumberRule = "exact") -> None:
        """``number_rule``: ``exact`` (d1: use every number once) or ``subset`` (StableDRL) for grading."""
        if number_rule not in NUMBER_RULES:
            raise UserError(f"unknown number rule {number_rule!r}; known: {', '.join(NUMBER_RULES)}")
        self.number_rule = number_rule

    # ------------------------------------------------------------------------------------------ data
    def _read(self, split: str) -> list[dict[str, Any]]:
        if split in _TEST_FILES:
            return _read_test(_TEST_FILES[split])
        held_out = {puzzle_key(d["numbers"], d["target"]) for s in self.held_out for d in _read_test(_TEST_FILES[s])}
        train = [
            {"numbers": list(r["nums"]), "target": int(r["target"])}
            for r in read_data_file("countdown/countdown_3to4_train_first10240.jsonl")
            if puzzle_key(r["nums"], r["target"]) not in held_out
        ]
        return train if split == "train" else [d for d in train if len(d["numbers"]) == 3]

    def item_key(self, doc: Mapping[str, Any]) -> tuple[tuple[int, ...], int]:
        """The puzzle (:func:`puzzle_key`): its numbers in any order, and its target."""
        return puzzle_key(*self.gold(doc))

    @staticmethod
    def gold(doc: Mapping[str, Any]) -> tuple[list[int], int]:
        """The puzzle's ``(numbers, target)``, validated."""
        numbers = require(doc, "numbers", list, "a list of integers")
        if not numbers or any(isinstance(n, bool) or not isinstance(n, int) for n in numbers):
            raise UserError("field 'numbers' must be a non-empty list of integers")
        return numbers, require(doc, "target", int, "an integer")

    # --------------------------------------------------------------------------------------- prompts
    def user_message(self, doc: Mapping[str, Any], protocol: str) -> str:
        numbers, target = self.gold(doc)
        if protocol in ("d1", "tracerl"):  # TraceRL evaluates no Countdown: d1's message
            return D1_COUNTDOWN_SYSTEM_PROMPT + "\n\n" + f"Numbers: {numbers}\nTarget: {target}"
        if protocol == "d1_train":
            return (
                f"{D1_TRAIN_SYSTEM_PROMPT}\nUsing only the numbers {numbers}, create an arithmetic expression that "
                f"evaluates to exactly {target}. You must use all numbers from the list, and each number must be "
                "used exactly once. You may use the operations +, -, *, and / as needed. After reasoning, provide "
                "only your final expression inside <answer></answer> tags without including an equals sign or the "
                "target number. For example, if the numbers are [2, 3, 4] and the target is 5, a valid answer is: "
                "<answer>\n2*4-3\n</answer>"
            )
        if protocol in ("stabledrl", "stabledrl_eval"):  # StableDRL's script evaluates no Countdown
            return (
                f"Given numbers {numbers}, find an equation that equals {target}. Please put the reasoning in "
                "<reasoning> tags and the final equation in <answer> tags, e.g. <answer> 1 + 1 </answer>."
            )
        return tiny_prompt(numbers, target)

    def solution(self, doc: Mapping[str, Any]) -> str:
        """A solution expression: the doc's own (generated puzzles carry one) or the solver's."""
        numbers, target = self.gold(doc)
        found = doc.get("solution") or solve(numbers, target)
        if found is None:
            raise UserError(f"countdown puzzle {numbers} -> {target} has no solution")
        return found

    def _target(self, doc: Mapping[str, Any], protocol: str) -> str:
        expression = self.solution(doc)
        numbers, target = self.gold(doc)
        if protocol == "tiny":
            worked = tiny_worked_solution(numbers, target)
            if worked is not None:
                return worked
        reasoning = f"Combining {', '.join(map(str, numbers))} with + - * / gives {expression}, which equals {target}."
        answer = "\\boxed{" + expression + "}" if protocol == "d1" else expression
        return tagged_completion(reasoning, answer, protocol)

    # ------------------------------------------------------------------------------ rewards, grading
    def d1_reward(self, completion: str, doc: Mapping[str, Any]) -> RewardResult:
        numbers, target = self.gold(doc)
        return RewardResult.of(correctness=countdown_score(completion, numbers, target, "exact"))

    def stabledrl_reward(self, completion: str, doc: Mapping[str, Any]) -> RewardResult:
        numbers, target = self.gold(doc)
        return RewardResult.of(
            correctness=countdown_score(completion, numbers, target, "subset"),
            anti_short_boxed=anti_short_boxed(completion),
        )

    def grade(self, completion: str, doc: Mapping[str, Any]) -> GradeResult:
        numbers, target = self.gold(doc)
        return grade_countdown(completion, numbers, target, self.number_rule)

    # ------------------------------------------------------------------------------------- generator
    def generate(
        self,
        n: int,
        seed: int,
        *,
        num_numbers: Sequence[int] = (3, 4),
        number_range: tuple[int, int] = (1, 99),
        target_range: tuple[int, int] = (10, 100),
    ) -> list[dict[str, Any]]:
        """``n`` distinct puzzles, none in a held-out test split, each with a ``solution`` proving it solvable.

        Each puzzle draws ``k`` numbers uniformly from ``number_range`` (``k`` uniform over ``num_numbers``)
        and combines them in a random binary tree with random operators (division only when exact, so every
        intermediate value is an integer); the tree's value is the target, kept if it lies in
        ``target_range``. Defaults follow Countdown-Tasks-3to4 (numbers 1-99, targets 10-100). Deterministic in
        ``seed`` (a ``numpy.random.Generator``; no global RNG).
        """
        _check_generator_args(n, num_numbers, number_range, target_range)
        rng = data_rng(seed)
        excluded = {puzzle_key(d["numbers"], d["target"]) for split in self.held_out for d in self.load(split)}
        docs: list[dict[str, Any]] = []
        attempts = 1000 * n + 10_000
        for _ in range(attempts):
            if len(docs) == n:
                break
            k = int(num_numbers[int(rng.integers(len(num_numbers)))])
            numbers = [int(x) for x in rng.integers(number_range[0], number_range[1] + 1, size=k)]
            expr = _random_tree(numbers, rng)
            if expr is None or expr.value.denominator != 1:
                continue
            target = int(expr.value)
            key = puzzle_key(numbers, target)
            if not target_range[0] <= target <= target_range[1] or key in excluded:
                continue
            excluded.add(key)
            docs.append(
                {
                    "doc_id": f"{self.name}/generated-{seed}/{len(docs)}",
                    "task": self.name,
                    "numbers": numbers,
                    "target": target,
                    "solution": expr.text,
                }
            )
        if len(docs) < n:
            raise UserError(f"could only generate {len(docs)} of {n} countdown puzzles in {attempts} attempts")
        return docs


class CountdownLargeTask(CountdownTask):
    """Countdown scored on 1,024 generated cd3-like puzzles (four times d1's test), for narrower intervals.

    Its generator and training splits never contain them (see the module docstring).
    """

    name = "countdown_large"
    label = "Countdown 1024"
    note = (
        "Countdown 1024 is not a column of the paper: 1,024 generated three-number puzzles drawn like d1's cd3 test "
        "(`tasks/data/countdown/generated_cd3like_test.jsonl`; no RL or SFT puzzle is one of them), graded like "
        "Countdown."
    )
    splits = ("train", "train_cd3", "test", "test_large")
    eval_split = "test_large"
    held_out = ("test", "test_large")


# The evaluation files: d1's cd3 test, and the large one, made here by
# CountdownTask().generate(**LARGE_TEST_RECIPE) (tests/test_tasks_data.py regenerates it).
_TEST_FILES = {"test": "countdown/countdown_cd3_test.jsonl", "test_large": "countdown/generated_cd3like_test.jsonl"}
LARGE_TEST_RECIPE = {"n": 1024, "seed": 3131, "num_numbers": [3], "number_range": [1, 100], "target_range": [1, 100]}


def _read_test(file: str) -> list[dict[str, Any]]:
    """A test file of d1's cd3 format: ``input`` = comma-separated numbers, ``output`` = target."""
    return [
        {"numbers": [int(n) for n in r["input"].split(",")], "target": int(r["output"])} for r in read_data_file(file)
    ]


def _random_tree(numbers: list[int], rng: np.random.Generator) -> Expr | None:
    """Combine ``numbers`` pairwise in random order with random operators; None after an inexact division."""
    items = [Expr.atom(x) for x in numbers]
    while len(items) > 1:
        i, j = int(rng.integers(len(items))), int(rng.integers(len(items) - 1))
        j += j >= i  # an ordered pair of distinct indices, uniformly
        a, b = items[i], items[j]
        ops = ["+", "-", "*"] + (["/"] if b.value != 0 and (a.value / b.value).denominator == 1 else [])
        combined = a.combine(ops[int(rng.integers(len(ops)))], b)
        if combined is None:
            return None
        items = [x for m, x in enumerate(items) if m not in (i, j)] + [combined]
    return items[0]


def _check_generator_args(
    n: int, num_numbers: Sequence[int], number_range: tuple[int, int], target_range: tuple[int, int]
) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise UserError(f"n must be a non-negative integer, got {n!r}")
    if not num_numbers or any(not 2 <= k <= 6 for k in num_numbers):
        raise UserError(f"num_numbers must list counts between 2 and 6, got {num_numbers!r}")
    if not 0 <= number_range[0] <= number_range[1] or target_range[0] > target_range[1]:
        raise UserError(f"bad ranges: number_range={number_range!r}, target_range={target_range!r}")
