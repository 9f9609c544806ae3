"""Graders for evaluation: math answers (math-verify under a hard time limit + d1's parser), Countdown (safe
arithmetic evaluator), Sudoku (validity, solution counting, d1's cell accuracy).

Module map: :mod:`.text` (linear-time tag/box extraction), :mod:`.d1` (d1-compatible parsers),
:mod:`.isolation` (killable worker processes), :mod:`.mathverify` (math-verify in those workers),
:mod:`.math_answers`, :mod:`.arithmetic`, :mod:`.countdown`, :mod:`.sudoku`, :mod:`.sandbox` (confined processes for
generated programs) and :mod:`.code_io` (Code I/O: an ``ast`` format check, then the tests run in the sandbox).
"""

from .arithmetic import NUMBER_RULES, Arithmetic, NumberRule, evaluate, parse_arithmetic, uses_numbers
from .countdown import extract_expression, grade_countdown
from .isolation import IsolatedPool, IsolatedResult
from .math_answers import grade_math_answer, gsm8k_gold
from .mathverify import MathVerifyOutcome, math_verify
from .sudoku import (
    all_grids,
    cell_accuracy,
    count_solutions,
    grade_sudoku,
    is_completion,
    is_valid_grid,
    solutions,
)

__all__ = [
    "NUMBER_RULES",
    "Arithmetic",
    "IsolatedPool",
    "IsolatedResult",
    "MathVerifyOutcome",
    "NumberRule",
    "all_grids",
    "cell_accuracy",
    "count_solutions",
    "evaluate",
    "extract_expression",
    "grade_countdown",
    "grade_math_answer",
    "grade_sudoku",
    "gsm8k_gold",
    "is_completion",
    "is_valid_grid",
    "math_verify",
    "parse_arithmetic",
    "solutions",
    "uses_numbers",
]
