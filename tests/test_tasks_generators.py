"""Procedural generators: 10,000 puzzles each are valid, solvable, distinct and disjoint from the test sets."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from itertools import permutations

import pytest
from test_graders_sudoku import slow_solutions

from stabledrl_bench.errors import UserError
from stabledrl_bench.tasks import get_task
from stabledrl_bench.tasks.countdown import solve
from stabledrl_bench.tasks.graders.arithmetic import parse_arithmetic


def brute_force_reachable(numbers: list[int]) -> set[Fraction]:
    """Every value of every expression using all numbers once (independent of the production solver)."""
    if len(numbers) == 1:
        return {Fraction(numbers[0])}
    values: set[Fraction] = set()
    for order in set(permutations(numbers)):
        for split in range(1, len(order)):
            for a in brute_force_reachable(list(order[:split])):
                for b in brute_force_reachable(list(order[split:])):
                    values |= {a + b, a - b, a * b} | ({a / b} if b else set())
    return values


@pytest.fixture(scope="module")
def countdown_puzzles() -> list[dict]:
    return get_task("countdown").generate(10_000, seed=0)


def test_countdown_generator_makes_valid_solvable_new_puzzles(countdown_puzzles: list[dict]) -> None:
    test_keys = {(tuple(sorted(d["numbers"])), d["target"]) for d in get_task("countdown").load("test")}
    keys = set()
    for doc in countdown_puzzles:
        numbers, target = doc["numbers"], doc["target"]
        assert len(numbers) in (3, 4) and all(1 <= n <= 99 for n in numbers) and 10 <= target <= 100
        parsed = parse_arithmetic(doc["solution"])
        assert parsed is not None and sorted(parsed.integers) == sorted(numbers) and parsed.value == target
        keys.add((tuple(sorted(numbers)), target))
    assert len(keys) == 10_000 and not keys & test_keys
    assert set(Counter(len(d["numbers"]) for d in countdown_puzzles)) == {3, 4}
    for doc in countdown_puzzles[:25]:  # independent proof of solvability
        assert Fraction(doc["target"]) in brute_force_reachable(doc["numbers"])


def test_countdown_generator_is_deterministic_in_the_seed(countdown_puzzles: list[dict]) -> None:
    task = get_task("countdown")
    assert task.generate(200, seed=0) == countdown_puzzles[:200]
    assert task.generate(200, seed=1) != countdown_puzzles[:200]
    three = task.generate(50, seed=3, num_numbers=(3,), target_range=(1, 50))
    assert all(len(d["numbers"]) == 3 and 1 <= d["target"] <= 50 for d in three)
    with pytest.raises(UserError):
        task.generate(5, seed=-1)
    with pytest.raises(UserError):
        task.generate(5, seed=0, num_numbers=(1,))


def test_solver_agrees_with_brute_force() -> None:
    cases = [([1, 1, 1], 100), ([3, 5, 7], 22), ([2, 3, 4], 5), ([97, 89, 83], 1), ([6, 4, 2, 5], 24), ([5, 5, 5], 2)]
    for numbers, target in cases:
        found = solve(numbers, target)
        reachable = Fraction(target) in brute_force_reachable(numbers)
        assert (found is not None) == reachable, (numbers, target)
        if found is not None:
            parsed = parse_arithmetic(found)
            assert parsed is not None and parsed.value == target and sorted(parsed.integers) == sorted(numbers)
    assert solve([1, 1, 1], 100) is None


def test_every_countdown_test_puzzle_is_solvable() -> None:
    for doc in get_task("countdown").load("test"):
        assert solve(doc["numbers"], doc["target"]) is not None


@pytest.fixture(scope="module")
def sudoku_puzzles() -> list[dict]:
    return get_task("sudoku").generate(10_000, seed=0)


def test_sudoku_generator_makes_valid_unique_new_puzzles(sudoku_puzzles: list[dict]) -> None:
    test_puzzles = {d["puzzle"] for d in get_task("sudoku").load("test")}
    for doc in sudoku_puzzles:
        puzzle, solution = doc["puzzle"], doc["solution"]
        assert puzzle.count("0") == 8 and doc["unique"] and doc["num_solutions"] == 1
        assert all(p in ("0", s) for p, s in zip(puzzle, solution, strict=True))
        rows = [solution[4 * r : 4 * r + 4] for r in range(4)]
        cols = ["".join(row[c] for row in rows) for c in range(4)]
        boxes = [rows[r][c : c + 2] + rows[r + 1][c : c + 2] for r in (0, 2) for c in (0, 2)]
        assert all(sorted(unit) == list("1234") for unit in rows + cols + boxes)
    puzzles = [d["puzzle"] for d in sudoku_puzzles]
    assert len(set(puzzles)) == 10_000 and not set(puzzles) & test_puzzles
    for doc in sudoku_puzzles[:300]:
        assert slow_solutions(doc["puzzle"]) == [doc["solution"]]


def test_sudoku_generator_flags_multi_solution_puzzles(sudoku_puzzles: list[dict]) -> None:
    task = get_task("sudoku")
    assert task.generate(100, seed=0) == sudoku_puzzles[:100]
    mixed = task.generate(300, seed=5, num_blanks=10, require_unique=False)
    assert {d["unique"] for d in mixed} == {True, False}
    for doc in mixed:
        found = slow_solutions(doc["puzzle"])
        assert doc["num_solutions"] == len(found) and doc["unique"] == (len(found) == 1) and doc["solution"] in found
    with pytest.raises(UserError):
        task.generate(3, seed=0, num_blanks=0)


def test_other_tasks_have_no_generator() -> None:
    with pytest.raises(NotImplementedError):
        get_task("gsm8k").generate(1, seed=0)


# ------------------------------------------------------------------------------------- validation docs
def _test_keys(task) -> set:
    return {task.item_key(doc) for split in task.held_out for doc in task.load(split)}


@pytest.mark.parametrize(
    ("name", "source", "options"),
    [
        ("sudoku", "generated", {}),
        ("sudoku_hard", "generated", {"num_blanks": 12}),
        ("countdown", "generated", {"num_numbers": [3]}),
        ("countdown_large", "train_cd3", {}),
        ("gsm8k", "train", {}),
        ("math500", "train", {}),
        ("code_io", "generated", {}),
        ("code_io", "train", {}),
    ],
)
def test_validation_docs_are_never_test_items(name: str, source: str, options: dict) -> None:
    task = get_task(name)
    docs = task.validation_docs(24, seed=5, source=source, generator_options=options)
    keys = {task.item_key(doc) for doc in docs}
    assert len(keys) == 24 and not keys & _test_keys(task)
    assert docs == task.validation_docs(24, seed=5, source=source, generator_options=options)  # deterministic


def test_validation_docs_drop_test_items_whatever_the_source_holds(monkeypatch) -> None:
    """A generator or a split that hands out test puzzles (and puzzles a run trains on) does not leak them: they are
    removed by key, a permuted Countdown puzzle included; a held-out split is refused as a source."""
    task = get_task("countdown")
    tests = task.load("test")
    permuted = [{**doc, "numbers": doc["numbers"][::-1]} for doc in tests[:20]]
    fresh = task.generate(30, seed=1, num_numbers=[3])
    monkeypatch.setattr(task, "generate", lambda n, seed, **kw: (permuted + fresh)[:n])
    docs = task.validation_docs(10, seed=0, source="generated", exclude={task.item_key(fresh[0])})
    assert [doc["doc_id"] for doc in docs] == [doc["doc_id"] for doc in fresh[1:11]]
    original = task.load
    monkeypatch.setattr(
        task, "load", lambda split, limit=None: permuted + fresh if split == "train" else original(split)
    )
    drawn = task.validation_docs(30, seed=0, source="train")
    assert sorted(doc["doc_id"] for doc in drawn) == sorted(doc["doc_id"] for doc in fresh)
    with pytest.raises(UserError, match="split 'test' is held out for testing"):
        task.validation_docs(4, seed=0, source="test")


def test_a_generated_training_pool_is_made_once_per_process_and_each_caller_owns_its_docs(monkeypatch) -> None:
    """The methods of one seed train on the same pool: the second ask for the same task, seed, size and options
    reuses the first's docs (no second generation); other options make another pool; a caller that edits its docs
    does not edit the next caller's."""
    from stabledrl_bench.tasks.sudoku import SudokuTask
    from stabledrl_bench.training.data import _generated_pool, training_docs

    calls = []
    original = SudokuTask.generate

    def counted(self, n, seed, **options):
        calls.append((n, seed, options))
        return original(self, n, seed, **options)

    monkeypatch.setattr(SudokuTask, "generate", counted)
    _generated_pool.cache_clear()
    task = get_task("sudoku")
    first = training_docs(task, "generated", seed=5, pool_size=50)
    first[0]["puzzle"] = "edited"
    again = training_docs(get_task("sudoku"), "generated", seed=5, pool_size=50)
    assert calls == [(50, 5, {})] and again[0]["puzzle"] != "edited"
    assert again == original(task, 50, 5)
    harder = training_docs(task, "generated", seed=5, pool_size=50, generator_options={"num_blanks": 12})
    assert calls[-1] == (50, 5, {"num_blanks": 12}) and harder != again
    _generated_pool.cache_clear()
