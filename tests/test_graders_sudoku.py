"""4x4 Sudoku checks against an independent backtracking solver and hand-made completions."""

from __future__ import annotations

from collections import Counter

import pytest

from stabledrl_bench.tasks import get_task
from stabledrl_bench.tasks.graders.sudoku import (
    all_grids,
    cell_accuracy,
    count_solutions,
    grade_sudoku,
    is_completion,
    is_valid_grid,
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
