"""A safe evaluator for Countdown arithmetic, and the number-use rules of d1 and StableDRL.

The reference graders run Python ``eval`` on model text after a character whitelist, which still admits
``9**9**9**9`` (hangs the grader) and relies on the whitelist being perfect. Here the expression is parsed
with :func:`ast.parse` and only numeric literals, ``+ - * /``, unary signs and parentheses are accepted, under
size bounds; the value is computed exactly with :class:`fractions.Fraction`. Nothing from the model is ever
executed.

Number-use rules (``numbers`` are the puzzle's, ``used`` the integers written in the expression):

* ``exact`` (d1, the default): ``sorted(used) == sorted(numbers)``, every number used exactly once.
* ``subset`` (StableDRL's ``dataloaders/logic_puzzles.py``): ``Counter(used) <= Counter(numbers)``, a
  sub-multiset, so an expression may leave numbers out.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

NumberRule = Literal["exact", "subset"]
NUMBER_RULES: tuple[NumberRule, ...] = ("exact", "subset")

# Bounds: a Countdown expression has a handful of small numbers; anything far larger is not an answer.
MAX_EXPRESSION_CHARS = 1024
MAX_NODES = 256
MAX_LITERAL_DIGITS = 32
_ALLOWED_CHARS = frozenset("0123456789+-*/(). \t\n\r\f\v")
_BINARY = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__}


@dataclass(frozen=True)
class Arithmetic:
    """A parsed expression: its exact value (None after a division by zero) and its literals in order."""

    value: Fraction | None
    literals: tuple[int | Fraction, ...]

    @property
    def integers(self) -> list[int] | None:
        """The literals if all are integers (``3.0`` is not), else None."""
        ints = [lit for lit in self.literals if isinstance(lit, int)]
        return ints if len(ints) == len(self.literals) else None


def parse_arithmetic(expression: str) -> Arithmetic | None:
    """Parse and evaluate ``expression``; None unless it is a bounded ``+ - * /`` expression of numbers.

    Evaluation is a post-order walk with an explicit stack (no recursion on model-controlled depth).
    """
    text = expression.strip()
    if not text or len(text) > MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS.issuperset(text):
        return None
    try:
        root = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    literals: list[int | Fraction] = []
    values: dict[int, Fraction | None] = {}
    stack: list[tuple[ast.AST, bool]] = [(root, False)]
    nodes = 0
    while stack:
        node, children_done = stack.pop()
        if not children_done:
            nodes += 1
            if nodes > MAX_NODES:
                return None
            if isinstance(node, ast.Constant):
                literal = _literal(node.value)
                if literal is None:
                    return None
                literals.append(literal)
                values[id(node)] = Fraction(literal)
                continue
            if isinstance(node, ast.BinOp) and (type(node.op) in _BINARY or isinstance(node.op, ast.Div)):
                stack += [(node, True), (node.right, False), (node.left, False)]
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
                stack += [(node, True), (node.operand, False)]
            else:
                return None
            continue
        values[id(node)] = _combine(node, values)
    return Arithmetic(values[id(root)], tuple(literals))


def _literal(value: object) -> int | Fraction | None:
    """An ``int`` or ``float`` constant (floats read exactly from their shortest decimal repr)."""
    if type(value) is int:
        return value if len(str(abs(value))) <= MAX_LITERAL_DIGITS else None
    if type(value) is float and len(repr(value)) <= MAX_LITERAL_DIGITS:
        return Fraction(repr(value))
    return None


def _combine(node: ast.AST, values: dict[int, Fraction | None]) -> Fraction | None:
    if isinstance(node, ast.UnaryOp):
        operand = values[id(node.operand)]
        return None if operand is None else (-operand if isinstance(node.op, ast.USub) else operand)
    assert isinstance(node, ast.BinOp)
    left, right = values[id(node.left)], values[id(node.right)]
    if left is None or right is None:
        return None
    if isinstance(node.op, ast.Div):
        return None if right == 0 else left / right
    return _BINARY[type(node.op)](left, right)


def evaluate(expression: str) -> Fraction | None:
    """The exact value of a safe arithmetic expression, or None (invalid, too large, division by zero)."""
    parsed = parse_arithmetic(expression)
    return None if parsed is None else parsed.value


def uses_numbers(used: Sequence[int], numbers: Sequence[int], rule: NumberRule = "exact") -> bool:
    """Whether the integers ``used`` in an expression respect ``rule`` for the puzzle's ``numbers``."""
    if rule == "exact":
        return sorted(used) == sorted(numbers)
    if rule == "subset":
        available = Counter(numbers)
        return all(available[n] >= k for n, k in Counter(used).items())
    raise ValueError(f"unknown number rule {rule!r}; expected one of {NUMBER_RULES}")
