"""4x4 Sudoku, as in d1: a 16-character puzzle (``0`` = empty) and its solution grid.

Splits: ``test`` (d1's 500 puzzles), ``test_d1`` (the 256 of them d1 evaluates: ``np.random.seed(42);
np.random.choice(500, 256, replace=False)``, stored once in ``data/sudoku/d1_test_subset_seed42.json``) and
``train`` (288 uniquely solvable puzzles, one per valid grid; a stand-in for d1's unavailable 1M-row training
set). Note that 124 of the 500 test puzzles have several solutions; see :mod:`.graders.sudoku` for how each
verdict treats them. :meth:`SudokuTask.generate` makes new puzzles procedurally.

``sudoku_hard`` (:class:`SudokuHardTask`) is the same task evaluated on 256 generated, uniquely solvable
12-blank puzzles (``data/sudoku/generated_12blank_test.csv``) instead of d1's 8-blank test. Why it exists: a
small model that has learned the answer format already fills 94-97% of d1's blank cells, so d1's test has no
room to show a gain in solving; with 12 blanks such a model fills about 80% (78-83% for the tiny preset's
starts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import UserError
from .base import DATA_DIR, GradeResult, RewardResult, Task, data_rng, read_data_file, require, tagged_completion
from .graders.sudoku import all_grids, count_solutions, grade_sudoku
from .rewards import anti_short_boxed, sudoku_cells

# d1 eval/sudoku.py and diffu-grpo/data_utils.py (identical text; note the leading newline).
D1_SUDOKU_SYSTEM_PROMPT = """
Please solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character string reading left-to-right, top-to-bottom, where '0' represents empty cells.

Rules:
- Fill empty cells with digits 1-4
- Each row must contain digits 1-4 exactly once
- Each column must contain digits 1-4 exactly once
- Each 2x2 box must contain digits 1-4 exactly once

Important: Your solution must be a COMPLETE 16-character string with only the digits 1-4, representing your final solved grid.

Respond in this exact format:
<reasoning>
Your step-by-step solving process
</reasoning>
<answer>
[16-character solution string with no spaces or separators]
</answer>
"""  # noqa: E501 - the prompt's lines are kept verbatim
SUDOKU_REASONING = "Fill each empty cell so that every row, column and 2x2 box contains the digits 1-4 once."
_TEST_FILE, _SUBSET_FILE = "sudoku/4x4_test_sudoku.csv", "sudoku/d1_test_subset_seed42.json"
_HARD_TEST_FILE = "sudoku/generated_12blank_test.csv"
# How the hard test was made (tests/test_tasks_data.py regenerates it): SudokuTask().generate(**HARD_TEST_RECIPE)
HARD_TEST_RECIPE = {"n": 256, "seed": 1212, "num_blanks": 12}


class SudokuTask(Task):
    """Sudoku 4x4: fill the blanks so every row, column and 2x2 box holds 1-4."""

    name = "sudoku"
    label = "Sudoku"
    splits = ("train", "test", "test_d1")
    eval_split = "test_d1"
    headline_field = "score"  # d1 reports Sudoku as cell accuracy (the grade's score)

    def _read(self, split: str) -> list[dict[str, Any]]:
        if split == "test_hard":
            return [{"puzzle": r["Puzzle"], "solution": r["Solution"]} for r in _read_grids(_HARD_TEST_FILE)]
        file = "sudoku/4x4_sudoku_unique_solution_288.csv" if split == "train" else _TEST_FILE
        rows = [{"puzzle": r["Puzzle"], "solution": r["Solution"]} for r in _read_grids(file)]
        if split != "test_d1":
            return rows
        indices = json.loads((DATA_DIR / _SUBSET_FILE).read_text())["indices"]
        return [{**rows[i], "source_index": i} for i in indices]

    @staticmethod
    def gold(doc: Mapping[str, Any]) -> tuple[str, str]:
        """``(puzzle, solution)``, validated: 16 characters each, ``0-4`` and ``1-4``."""
        puzzle = require(doc, "puzzle", str, "a 16-character string of digits 0-4")
        solution = require(doc, "solution", str, "a 16-character string of digits 1-4")
        if len(puzzle) != 16 or not set(puzzle) <= set("01234"):
            raise UserError(f"field 'puzzle' must be 16 characters of 0-4, got {puzzle[:40]!r}")
        if len(solution) != 16 or not set(solution) <= set("1234"):
            raise UserError(f"field 'solution' must be 16 characters of 1-4, got {solution[:40]!r}")
        return puzzle, solution

    def user_message(self, doc: Mapping[str, Any], protocol: str) -> str:
        puzzle, _ = self.gold(doc)
        # d1 uses the same text for evaluation and training; TraceRL evaluates no Sudoku: d1's message
        if protocol in ("d1", "d1_train", "tracerl"):
            return D1_SUDOKU_SYSTEM_PROMPT + "\n\n" + f"Solve the following Sudoku puzzle: {puzzle}\n"
        if protocol in ("stabledrl", "stabledrl_eval"):  # StableDRL's script evaluates no Sudoku
            return (
                f"Solve this 4x4 Sudoku puzzle: {puzzle}. Use 0 for empty cells. Please put the reasoning in "
                "<reasoning> tags and the solution string in <answer> tags."
            )
        return puzzle  # tiny

    def _target(self, doc: Mapping[str, Any], protocol: str) -> str:
        _, solution = self.gold(doc)
        return tagged_completion(SUDOKU_REASONING, solution, protocol)

    def d1_reward(self, completion: str, doc: Mapping[str, Any]) -> RewardResult:
        puzzle, solution = self.gold(doc)
        return RewardResult.of(cell_accuracy=sudoku_cells(completion, puzzle, solution))

    def stabledrl_reward(self, completion: str, doc: Mapping[str, Any]) -> RewardResult:
        puzzle, solution = self.gold(doc)
        cells = sudoku_cells(completion, puzzle, solution)
        return RewardResult.of(cell_accuracy=cells, anti_short_boxed=anti_short_boxed(completion))

    def grade(self, completion: str, doc: Mapping[str, Any]) -> GradeResult:
        """``correct`` = any valid completion of the puzzle; ``score`` = d1's cell accuracy vs ``solution``."""
        puzzle, solution = self.gold(doc)
        return grade_sudoku(completion, puzzle, solution)

    def generate(self, n: int, seed: int, *, num_blanks: int = 8, require_unique: bool = True) -> list[dict[str, Any]]:
        """``n`` distinct puzzles, none in a held-out test split: a uniformly drawn valid grid with ``num_blanks`` cells
        blanked uniformly at random.

        Every puzzle's solutions are counted exactly over the 288 grids; ``num_solutions`` and ``unique`` are
        recorded, and with ``require_unique`` only uniquely solvable puzzles are kept. d1's test puzzles have 8
        blanks. Deterministic in ``seed`` (a ``numpy.random.Generator``; no global RNG).
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise UserError(f"n must be a non-negative integer, got {n!r}")
        if not 1 <= num_blanks <= 16:
            raise UserError(f"num_blanks must be between 1 and 16, got {num_blanks!r}")
        rng = data_rng(seed)
        grids = all_grids()
        excluded = {doc["puzzle"] for split in self.held_out for doc in self.load(split)}
        docs: list[dict[str, Any]] = []
        attempts = 1000 * n + 10_000
        for _ in range(attempts):
            if len(docs) == n:
                break
            grid = grids[int(rng.integers(len(grids)))]
            blanks = set(rng.choice(16, size=num_blanks, replace=False).tolist())
            puzzle = "".join("0" if i in blanks else ch for i, ch in enumerate(grid))
            if puzzle in excluded:
                continue
            count = count_solutions(puzzle)
            if require_unique and count != 1:
                continue
            excluded.add(puzzle)
            docs.append(
                {
                    "doc_id": f"{self.name}/generated-{seed}/{len(docs)}",
                    "task": self.name,
                    "puzzle": puzzle,
                    "solution": grid,
                    "num_solutions": count,
                    "unique": count == 1,
                }
            )
        if len(docs) < n:
            raise UserError(f"could only generate {len(docs)} of {n} sudoku puzzles in {attempts} attempts")
        return docs


class SudokuHardTask(SudokuTask):
    """Sudoku 4x4 scored on 256 generated 12-blank puzzles, where a format-perfect small model has room to gain.

    Its training puzzles come from :meth:`generate`, which never produces these (see the module docstring).
    """

    name = "sudoku_hard"
    label = "Sudoku 12-blank"
    note = (
        "Sudoku 12-blank is not a column of the paper: 256 generated, uniquely solvable puzzles with 12 of 16 cells "
        "blank (`tasks/data/sudoku/generated_12blank_test.csv`; no RL or SFT puzzle is one of them), scored like "
        "Sudoku (d1 cell accuracy)."
    )
    splits = ("train", "test", "test_d1", "test_hard")
    eval_split = "test_hard"
    held_out = ("test", "test_hard")


def _read_grids(file: str) -> list[dict[str, Any]]:
    return read_data_file(file, string_columns=("Puzzle", "Solution"))
