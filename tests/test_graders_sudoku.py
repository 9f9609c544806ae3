"""4x4 Sudoku checks against an independent backtracking solver and hand-made completions."""

from __future__ import annotations

from collections import Counter

import pytest

from stabledrl_bench.tasks import get_task
from stabledrl_bench.tasks.graders import d1
from stabledrl_bench.tasks.graders.sudoku import (
    all_grids,
    cell_accuracy,
    count_solutions,
    grade_sudoku,
    is_completion,
    is_valid_grid,
    read_grid,
    solutions,
)


def slow_solutions(puzzle: str) -> list[str]:
    """Backtracking over empty cells, checking row/column/box constraints cell by cell."""
    cells = list(puzzle)

    def allowed(i: int, d: str) -> bool:
        r, c = divmod(i, 4)
        peers = {4 * r + k for k in range(4)} | {4 * k + c for k in range(4)}
        peers |= {4 * (r // 2 * 2 + a) + (c // 2 * 2 + b) for a in range(2) for b in range(2)}
        return all(cells[p] != d for p in peers if p != i)

    found: list[str] = []

    def fill(i: int) -> None:
        if i == 16:
            found.append("".join(cells))
            return
        if cells[i] != "0":
            if allowed(i, cells[i]):
                fill(i + 1)
            return
        for d in "1234":
            if allowed(i, d):
                cells[i] = d
                fill(i + 1)
                cells[i] = "0"

    fill(0)
    return found


def test_all_grids() -> None:
    grids = all_grids()
    assert len(grids) == 288 == len(set(grids))
    assert grids == tuple(sorted(grids))
    assert grids == tuple(slow_solutions("0" * 16))


def test_solution_counts_of_d1_test_set() -> None:
    """Data README: 376 puzzles with 1 solution, 115 with 2, 8 with 3 and 1 with 4."""
    docs = get_task("sudoku").load("test")
    counts = Counter(count_solutions(d["puzzle"]) for d in docs)
    assert counts == {1: 376, 2: 115, 3: 8, 4: 1}
    for doc in docs[:60]:
        assert solutions(doc["puzzle"]) == slow_solutions(doc["puzzle"])
        assert doc["solution"] in solutions(doc["puzzle"])


def test_validity() -> None:
    assert is_valid_grid("1234341221434321")
    assert not is_valid_grid("1234341221434312")  # last row fine, but the columns repeat
    assert not is_valid_grid("123434122143432")  # 15 characters
    assert not is_valid_grid("1234341221434320")
    assert is_completion("1034340221034301", "1234341221434321")
    assert not is_completion("4034340221034301", "1234341221434321")  # a clue changed


def test_cell_accuracy_follows_d1() -> None:
    puzzle, solution = "1034340221034301", "1234341221434321"  # empty cells 1, 6, 10, 14 (0-based)
    assert cell_accuracy(solution, puzzle, solution) == (4, 4)
    assert cell_accuracy("12", puzzle, solution) == (1, 4)  # right-padded with zeros
    assert cell_accuracy(solution + "999", puzzle, solution) == (4, 4)  # truncated to 16
    assert cell_accuracy("", puzzle, solution) == (0, 4)


def test_grade_sudoku_accepts_any_valid_completion() -> None:
    doc = next(d for d in get_task("sudoku").load("test") if count_solutions(d["puzzle"]) == 2)
    other = next(s for s in solutions(doc["puzzle"]) if s != doc["solution"])
    exact = grade_sudoku(f"<answer>\n{doc['solution']}\n</answer>", doc["puzzle"], doc["solution"])
    assert exact.correct and exact.score == 1.0 and exact.details["exact_match"]
    alternative = grade_sudoku(f"<answer>{other}</answer>", doc["puzzle"], doc["solution"])
    assert alternative.correct and not alternative.details["exact_match"]
    empty = 16 - sum(ch != "0" for ch in doc["puzzle"])
    same = sum(other[i] == doc["solution"][i] for i in range(16) if doc["puzzle"][i] == "0")
    assert alternative.score == pytest.approx(same / empty) and alternative.score < 1.0
    spaced = " ".join(doc["solution"][i : i + 4] for i in range(0, 16, 4))
    assert grade_sudoku(f"<answer>{spaced}</answer>", doc["puzzle"], doc["solution"]).correct


def test_grade_sudoku_rejects_invalid_grids() -> None:
    puzzle, solution = "1034340221034301", "1234341221434321"
    wrong = "1134341221434321"  # first empty cell filled with a repeated digit
    result = grade_sudoku(f"<answer>{wrong}</answer>", puzzle, solution)
    assert not result.correct and result.score == pytest.approx(3 / 4)
    assert not grade_sudoku(f"<answer>{solution[:15]}</answer>", puzzle, solution).correct
    assert not grade_sudoku("no answer", puzzle, solution).correct


ROWS = ("1234", "3412", "2143", "4321")  # the solution of PUZZLE, row by row
PUZZLE, SOLUTION = "1034340221034301", "".join(ROWS)
COMMAS = ",".join(SOLUTION)
FENCE = "```"


# ``correct`` reads the grid the model commits to; the d1 columns (``score`` = d1's cell accuracy and its correct
# cell count) were computed before that reading changed and must never move. Comments give the old ``correct``.
@pytest.mark.parametrize(
    ("completion", "correct", "d1_cells"),
    [
        # Separators inside the answer block (all were False).
        (f"<answer>{COMMAS}</answer>", True, 2),
        ("<answer>[" + ",".join("[" + ",".join(row) + "]" for row in ROWS) + "]</answer>", True, 0),
        ("<answer>\n" + "".join("| " + " | ".join(row) + " |\n" for row in ROWS) + "</answer>", True, 0),
        ("<answer>" + " / ".join(ROWS) + "</answer>", True, 1),
        ("<answer>\n12|34\n34|12\n--+--\n21|43\n43|21\n</answer>", True, 1),
        ("<answer>\nSolution:\n" + "\n".join(ROWS) + "\n</answer>", True, 0),
        ("<answer>**Final grid:** " + " ".join(ROWS) + "</answer>", True, 0),
        (f"<answer>\n{COMMAS}<|eot_id|>", True, 2),  # cut off at an end-of-text marker
        ("Solution:\n" + "\n".join(ROWS), True, 0),  # a labelled grid without tags
        # The last answer block counts; a blank one is no answer.
        (f"<answer>1134341221434321</answer> Row 1 repeats a 1. <answer>{SOLUTION}</answer>", True, 3),  # was False
        (f"<answer>{SOLUTION}</answer> Let me redo it. <answer>1134341221434321</answer>", False, 4),  # was True
        (f"<answer>{SOLUTION}</answer> <answer> </answer>", False, 4),  # was True
        (f"<answer></answer>\n{SOLUTION}", False, 4),  # was True
        # Unchanged: a fenced grid followed by prose, a garbled closing tag (the tiny model's), a plain block.
        (
            f"<answer>\n{FENCE}\n" + "\n".join(ROWS) + f"\n{FENCE}\nEvery row, column and box holds 1-4.\n</answer>",
            True,
            4,
        ),
        (f"<answer>{SOLUTION}</answe>", True, 4),
        ("<answer>\n" + " ".join(ROWS) + "\n</answer>", True, 4),
        # Not a grid: words or other digits mixed in, a 0 or 5, another separator (all False before as well).
        ("<answer>The grid is 1234 then 3412 then 2143 and 4321</answer>", False, 0),
        ("<answer>Step 1: " + " ".join(ROWS) + "</answer>", False, 2),
        ("<answer>" + " ".join(ROWS) + " (16 cells)</answer>", False, 4),
        ("<answer>" + " ".join(ROWS) + " 5</answer>", False, 4),
        ("<answer>[1,0,3,4],[3,4,1,2],[2,1,4,3],[4,3,2,1]</answer>", False, 0),
        ("<answer>" + ".".join(ROWS) + "</answer>", False, 1),
        ("<answer>Solution: " + " ".join(ROWS) + " (checked: valid)</answer>", False, 0),
    ],
)
def test_correct_reads_the_committed_grid_and_d1_score_is_unchanged(
    completion: str, correct: bool, d1_cells: int
) -> None:
    result = grade_sudoku(completion, PUZZLE, SOLUTION)
    assert result.correct is correct and result.details["exact_match"] is correct
    assert (result.details["correct_cells"], result.details["empty_cells"]) == (d1_cells, 4)
    assert result.score == result.details["d1_cell_accuracy"] == d1_cells / 4
    assert result.details["d1_extracted"] == (d1.extract_sudoku(completion) or None)


@pytest.mark.parametrize(
    ("text", "grid"),
    [
        (" 1 2 3 4\n3 4 1 2\n2 1 4 3\n4 3 2 1 ", SOLUTION),
        ("((1,2,3,4);(3,4,1,2);(2,1,4,3);(4,3,2,1))", SOLUTION),
        ("### Answer:\n+----+\n|1234|\n|3412|\n|2143|\n|4321|\n+----+", SOLUTION),
        ("2143342112344321", "2143342112344321"),  # any 16 digits 1-4: validity is checked separately
        ("", None),
        (" \n ", None),
        ("123434122143432", None),  # 15 digits
        ("12343412214343211", None),  # 17 digits
        ("1234341221434320", None),
        ("1234 3412 2143 4321.", None),
        ("１234341221434321", None),  # a full-width digit
        ("Row 1: 1234 3412 2143 4321", None),  # the label holds a digit
        ("A" * 41 + ": 1234341221434321", None),  # too long for a label
        ("first: 1234\nsecond: 3412 2143 4321", None),  # only the last label counts
        (FENCE + "text\n1234341221434321" + FENCE, None),  # a fence's language tag is text
    ],
)
def test_read_grid(text: str, grid: str | None) -> None:
    assert read_grid(text) == grid
