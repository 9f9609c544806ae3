"""4x4 Sudoku checks: the 288 valid grids, validity of a completion, solution counting, d1's cell accuracy.

Grids are 16-character strings read row by row; ``0`` marks an empty cell in a puzzle. A 4x4 Sudoku has 288
valid grids, so counting the solutions of a puzzle is a scan over all of them (exact and fast).

Verdicts: ``correct`` = the predicted grid is *a* valid completion of the puzzle (clues kept; every row,
column and 2x2 box is a permutation of 1-4) - the right notion for the 124 d1 test puzzles that have several
solutions; ``score`` = d1's cell accuracy (empty cells filled as in the reference ``solution``), which is what
published Sudoku numbers report; ``details["exact_match"]`` = the grid equals the reference solution.

The two verdicts read the answer differently. ``score`` keeps d1's regex cascade (first ``<answer>`` block,
whitespace removed, digits compared cell by cell whatever else the text holds). ``correct`` and
``exact_match`` read the grid the model commits to (:func:`extract_grid`): its last answer block, written with
any common separators (``3,1,4,2``, ``[[3,1,4,2],...]``, ``| 3 | 1 | 4 | 2 |`` rows, ``3142 / 4213``, ``31|42``
rows with ``--+--`` lines, a leading ``Solution:``), but never text that only becomes 16 digits once words or
other digits are deleted.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import permutations

from ..base import GradeResult
from . import d1
from .text import clip, last_answer_tag

SIZE = 16
# What may stand between the digits of a written grid: whitespace and list/table punctuation. Letters, other
# digits and sentence punctuation may not, so prose is never read as a grid.
_GRID_SEPARATORS = frozenset(",;/|-+[](){}")
_LABEL_MAX_CHARS = 40
_EMPHASIS = "*_#"  # markdown around a label: ``**Solution:**``, ``### Final grid:``
_UNITS = (
    *[tuple(range(4 * r, 4 * r + 4)) for r in range(4)],  # rows
    *[tuple(range(c, 16, 4)) for c in range(4)],  # columns
    *[tuple(4 * (br + dr) + bc + dc for dr in (0, 1) for dc in (0, 1)) for br in (0, 2) for bc in (0, 2)],  # boxes
)


def is_valid_grid(grid: str) -> bool:
    """A complete grid: 16 digits 1-4, each row, column and 2x2 box a permutation of ``1234``."""
    if len(grid) != SIZE or not set(grid) <= set("1234"):
        return False
    return all(len({grid[i] for i in unit}) == 4 for unit in _UNITS)


@lru_cache(maxsize=1)
def all_grids() -> tuple[str, ...]:
    """The 288 valid 4x4 grids in lexicographic order (rows drawn from the 24 permutations of 1-4).

    Row by row, a row that repeats a digit of its column above is skipped before the rows below it are tried: the
    same grids in the same order as testing all 24^4 stacks, from 576 candidates (the 4x4 Latin squares) instead of
    331,776 (a second of every process that generates puzzles)."""
    rows = ["".join(p) for p in permutations("1234")]

    def below(stack: tuple[str, ...]) -> list[str]:
        return [row for row in rows if all(row[i] != above[i] for above in stack for i in range(4))]

    grids = [a + b + c + d for a in rows for b in below((a,)) for c in below((a, b)) for d in below((a, b, c))]
    return tuple(g for g in grids if is_valid_grid(g))


def is_completion(puzzle: str, grid: str) -> bool:
    """``grid`` is a valid grid that keeps every clue of ``puzzle``."""
    return is_valid_grid(grid) and all(p in ("0", g) for p, g in zip(puzzle, grid, strict=True))


@lru_cache(maxsize=1)
def _grid_bits() -> dict[tuple[int, str], int]:
    """For each (cell, digit), a bit set over :func:`all_grids` of the grids with that digit in that cell."""
    bits: dict[tuple[int, str], int] = {}
    for k, grid in enumerate(all_grids()):
        for i, ch in enumerate(grid):
            bits[i, ch] = bits.get((i, ch), 0) | (1 << k)
    return bits


def _consistent(puzzle: str) -> int:
    """Bit set of the grids that keep every clue of ``puzzle``."""
    bits, mask = _grid_bits(), (1 << len(all_grids())) - 1
    for i, ch in enumerate(puzzle):
        if ch != "0":
            mask &= bits.get((i, ch), 0)
    return mask


def count_solutions(puzzle: str) -> int:
    """Number of valid grids consistent with the clues of ``puzzle``."""
    return _consistent(puzzle).bit_count()


def solutions(puzzle: str) -> list[str]:
    """All valid grids consistent with the clues of ``puzzle``, in lexicographic order."""
    mask = _consistent(puzzle)
    return [grid for k, grid in enumerate(all_grids()) if mask >> k & 1]


def cell_accuracy(digits: str, puzzle: str, solution: str) -> tuple[int, int]:
    """d1's ``(correct_cells, empty_cells)``: ``digits`` right-padded with ``0``/truncated to 16, compared with
    ``solution`` on the puzzle's empty cells (no answer at all scores 0 correct cells)."""
    empty = [i for i in range(SIZE) if puzzle[i] == "0"]
    if not digits:
        return 0, len(empty)
    grid = digits[:SIZE].ljust(SIZE, "0")
    return sum(grid[i] == solution[i] for i in empty), len(empty)


def _fenced(text: str) -> str:
    """The inside of the first triple-backtick fence, else ``text``: a fenced grid may be followed by prose."""
    start = text.find("```")
    end = text.find("```", start + 3) if start >= 0 else -1
    return text[start + 3 : end] if end >= 0 else text


def _after_label(text: str) -> str:
    """The text after the last colon when that colon ends a label line (``Solution:``, ``**Final grid:**``), else
    ``text``. A label is at most 40 letters and spaces from the start of its line, so it cannot hide digits."""
    colon = text.rfind(":")
    if colon < 0:
        return text
    label = text[text.rfind("\n", 0, colon) + 1 : colon].strip().strip(_EMPHASIS).strip()
    if not label or len(label) > _LABEL_MAX_CHARS or not all(ch.isalpha() or ch == " " for ch in label):
        return text
    return text[colon + 1 :].lstrip(_EMPHASIS)


def read_grid(text: str) -> str | None:
    """The 16 digits of the one grid ``text`` holds, or None.

    After a fence and a label are taken off, the text must be exactly 16 digits 1-4 once whitespace and
    :data:`_GRID_SEPARATORS` are removed; anything else (a word, a 0 or 5, a 17th digit, a period) means the
    text is not just a grid, and deleting it could turn an explanation into a grid the model never wrote.
    """
    body = _after_label(_fenced(text))
    digits = "".join(ch for ch in body if not (ch.isspace() or ch in _GRID_SEPARATORS))
    return digits if len(digits) == SIZE and set(digits) <= set("1234") else None


def extract_grid(completion: str) -> str | None:
    """The grid a completion commits to, read by :func:`read_grid`, or None.

    The last closed ``<answer>`` block is the answer (a model that corrects itself is graded on its last
    attempt; a blank block is no answer, with no fallback to other text). Without a closed block, the text d1's
    cascade picks (an answer cut off at an end-of-text marker, a 16-digit run) is read, else the whole
    completion (a labelled grid without tags).
    """
    text = last_answer_tag(completion)
    if text is None:
        text = d1.sudoku_answer_text(completion)
    return read_grid(completion if text is None else text)


def grade_sudoku(completion: str, puzzle: str, solution: str) -> GradeResult:
    """Verdict for a Sudoku completion: ``correct`` on :func:`extract_grid`, ``score`` on d1's regex cascade."""
    answer = d1.extract_sudoku(completion)
    correct_cells, empty_cells = cell_accuracy(answer, puzzle, solution)
    cell_acc = correct_cells / empty_cells if empty_cells else 0.0
    grid = extract_grid(completion)
    valid = grid is not None and is_completion(puzzle, grid)
    d1_extracted = clip(answer) if answer else None
    return GradeResult(
        correct=valid,
        score=cell_acc,
        extracted=grid if grid is not None else d1_extracted,
        details={
            "valid": valid,
            "exact_match": grid == solution,
            "d1_cell_accuracy": cell_acc,
            "correct_cells": correct_cells,
            "empty_cells": empty_cells,
            "d1_extracted": d1_extracted,
        },
    )
