"""Shipped data: checksums listed in data/README.md, row counts, doc structure, d1's Sudoku subset."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from stabledrl_bench.errors import UserError
from stabledrl_bench.tasks import TASKS, evaluation_tasks, get_task, list_tasks
from stabledrl_bench.tasks.base import DATA_DIR, read_data_file
from stabledrl_bench.tasks.countdown import LARGE_TEST_RECIPE, CountdownTask, puzzle_key, solve
from stabledrl_bench.tasks.graders.sudoku import count_solutions
from stabledrl_bench.tasks.sudoku import HARD_TEST_RECIPE, SudokuTask

README_ROW = re.compile(r"^\| `([^`]+)` \|.*\| `([0-9a-f]{64})` \|$", re.MULTILINE)


def test_readme_lists_every_file_with_its_sha256() -> None:
    listed = dict(README_ROW.findall((DATA_DIR / "README.md").read_text()))
    shipped = {str(p.relative_to(DATA_DIR)) for p in DATA_DIR.rglob("*") if p.is_file() and p.name != "README.md"}
    assert set(listed) == shipped and len(listed) == 17
    for relative, digest in listed.items():
        assert hashlib.sha256((DATA_DIR / relative).read_bytes()).hexdigest() == digest, relative
    assert sum((DATA_DIR / r).stat().st_size for r in listed) < 15 * 2**20


@pytest.mark.parametrize(
    ("task", "split", "rows"),
    [
        ("gsm8k", "test", 1319),
        ("gsm8k", "train", 7473),
        ("math500", "test", 500),
        ("math500", "train", 7474),
        ("math500", "train_l3to5", 8523),
        ("aime24", "test", 30),
        ("aime25", "test", 30),
        ("countdown", "test", 256),
        ("countdown", "train", 10_238),  # 10,240 minus the two test puzzles
        ("countdown", "train_cd3", 5050),
        ("sudoku", "test", 500),
        ("sudoku", "test_d1", 256),
        ("sudoku", "train", 288),
        ("sudoku_hard", "test_hard", 256),
        ("countdown_large", "test_large", 1024),
        ("countdown_large", "train", 10_232),  # the train split also drops the 6 rows that are large-test puzzles
        ("code_io", "test", 256),
        ("humaneval", "test", 164),
        ("mbpp", "test", 500),
    ],
)
def test_split_sizes_and_doc_ids(task: str, split: str, rows: int) -> None:
    docs = get_task(task).load(split)
    assert len(docs) == rows
    assert [d["doc_id"] for d in docs] == [f"{task}/{split}/{i}" for i in range(rows)]
    assert {d["task"] for d in docs} == {task}


def test_eval_docs_are_the_d1_evaluation_sets() -> None:
    sizes = {name: len(get_task(name).eval_docs()) for name in evaluation_tasks()}  # kodcode has none
    assert sizes == {
        **{"gsm8k": 1319, "math500": 500, "countdown": 256, "sudoku": 256, "aime24": 30, "aime25": 30},
        **{"countdown_large": 1024, "sudoku_hard": 256, "code_io": 256},  # not d1 sets: generated problems
        **{"humaneval": 164, "mbpp": 500},  # not d1 sets: StableDRL's code evaluation
    }
    assert get_task("sudoku").eval_docs(limit=2) == get_task("sudoku").load("test_d1", limit=2)
    assert get_task("sudoku_hard").eval_docs(limit=2) == get_task("sudoku_hard").load("test_hard", limit=2)


def test_hard_sudoku_test_is_its_recipe_and_held_out_from_training() -> None:
    """The shipped 12-blank test is what its documented recipe generates; the task's generator, which makes its
    SFT and RL puzzles, never produces one of them (without the exclusion 28 of 3000 12-blank puzzles would be)."""
    hard = get_task("sudoku_hard").load("test_hard")
    made = SudokuTask().generate(**HARD_TEST_RECIPE)
    assert [(d["puzzle"], d["solution"]) for d in hard] == [(d["puzzle"], d["solution"]) for d in made]
    assert all(d["puzzle"].count("0") == 12 and count_solutions(d["puzzle"]) == 1 for d in hard)
    assert all(p == "0" or p == s for d in hard for p, s in zip(d["puzzle"], d["solution"], strict=True))
    held_out = {d["puzzle"] for d in hard} | {d["puzzle"] for d in get_task("sudoku").load("test")}
    training = get_task("sudoku_hard").generate(3000, seed=0, num_blanks=12)
    assert not held_out & {d["puzzle"] for d in training}
    assert training[0]["doc_id"] == "sudoku_hard/generated-0/0" and training[0]["task"] == "sudoku_hard"


def test_large_countdown_test_is_its_recipe_and_held_out_from_training() -> None:
    """The shipped 1,024-puzzle test is what its documented recipe generates, every puzzle solvable with three
    numbers in 1-100; ``countdown_large``'s generator and train split never contain one (without the exclusion,
    the plain generator repeats one of them in 2,000 puzzles and the train file holds 6)."""
    large = get_task("countdown_large").load("test_large")
    made = CountdownTask().generate(**LARGE_TEST_RECIPE)
    assert [(d["numbers"], d["target"]) for d in large] == [(d["numbers"], d["target"]) for d in made]
    assert all(len(d["numbers"]) == 3 and all(1 <= n <= 100 for n in d["numbers"]) for d in large)
    assert all(solve(d["numbers"], d["target"]) is not None for d in large[:64])
    cd3 = get_task("countdown").load("test")
    held_out = {puzzle_key(d["numbers"], d["target"]) for d in large + cd3}
    options = {key: LARGE_TEST_RECIPE[key] for key in ("num_numbers", "number_range", "target_range")}
    task = get_task("countdown_large")
    for docs in (task.generate(2000, seed=0, **options), task.load("train")):
        assert not held_out & {puzzle_key(d["numbers"], d["target"]) for d in docs}


def test_d1_sudoku_subset_is_numpy_seed_42() -> None:
    stored = json.loads((DATA_DIR / "sudoku/d1_test_subset_seed42.json").read_text())["indices"]
    assert stored == np.random.RandomState(42).choice(500, 256, replace=False).tolist()  # a local legacy stream
    test, subset = get_task("sudoku").load("test"), get_task("sudoku").load("test_d1")
    assert [(d["puzzle"], d["solution"]) for d in subset] == [(test[i]["puzzle"], test[i]["solution"]) for i in stored]
    assert subset[0]["source_index"] == 361 and test[0]["puzzle"] == "3102200002100320"  # leading zeros kept


def test_gold_fields() -> None:
    gsm = get_task("gsm8k").load("test")
    assert gsm[0]["gold"] == "18" and sorted({d["gold"] for d in gsm if d["gold"].startswith("-")}) == ["-10", "-3"]
    aime24 = get_task("aime24").load("test")
    assert [d["answer"] for d in aime24][:8] == ["204", "113", "371", "385", "110", "104", "721", "25"]
    assert next(d for d in aime24 if "Eight circles of radius" in d["problem"])["answer"] == "197"
    assert get_task("aime25").load("test")[0]["answer"] == "70"
    assert get_task("countdown").load("test")[0] == {
        "doc_id": "countdown/test/0",
        "task": "countdown",
        "numbers": [30, 100, 93],
        "target": 23,
    }
    assert get_task("math500").load("test", limit=1)[0]["answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)"


def test_load_returns_independent_copies_and_checks_arguments() -> None:
    task = get_task("countdown")
    first = task.load("test", limit=2)
    first[0]["numbers"].append(1)
    assert task.load("test", limit=2)[0]["numbers"] == [30, 100, 93] and len(first) == 2
    assert task.load("test", limit=0) == []
    with pytest.raises(UserError, match="no split 'valid'"):
        task.load("valid")
    with pytest.raises(UserError, match="limit"):
        task.load("test", limit=-1)


def test_registry() -> None:
    expected = ["gsm8k", "math500", "countdown", "sudoku", "aime24", "aime25", "countdown_large", "sudoku_hard"]
    expected += ["code_io", "humaneval", "mbpp"]
    assert list_tasks() == [*expected, "kodcode"] == list(TASKS)  # kodcode: a training split only
    assert evaluation_tasks() == expected
    with pytest.raises(UserError, match=r"unknown task 'apps'; known: gsm8k, math500"):
        get_task("apps")


def test_data_is_resolved_relative_to_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert DATA_DIR.is_absolute() and len(read_data_file("aime/aime2025_test.jsonl")) == 30
    with pytest.raises(UserError, match="missing data file"):
        read_data_file("aime/nothing.jsonl")
