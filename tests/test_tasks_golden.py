"""Golden tests: every eval set's own gold answer, written as a completion, grades correct; shifted answers
grade wrong. The ``d1`` protocol is checked on every row with both graders; the other protocols on every
Countdown/Sudoku row and on a prefix of each math set (math-verify grades each batch on a pool of two worker
processes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from stabledrl_bench.tasks import GradeResult, Task, get_task
from stabledrl_bench.tasks.graders import d1

MATH_TASKS = ("gsm8k", "math500", "aime24", "aime25")
OTHER_PROTOCOLS = ("d1_train", "stabledrl", "tiny")
EVAL_SPLIT = {"gsm8k": "test", "math500": "test", "aime24": "test", "aime25": "test", "countdown": "test"}


def golden_task(name: str) -> Task:
    """The task with a generous math-verify limit: these tests check verdicts, and on a busy machine a correct
    gold answer that takes longer than the 1.5 s default would fail for the wrong reason (the limit itself is
    tested in test_graders_adversarial.py)."""
    task = get_task(name)
    if hasattr(task, "timeout_s"):
        task.timeout_s = 30.0
    return task


def failures(results: list[GradeResult], docs: Sequence[Mapping[str, Any]], key: str | None = None) -> list[str]:
    return [d["doc_id"] for r, d in zip(results, docs, strict=True) if not (r.details[key] if key else r.correct)]


@pytest.mark.parametrize("name", MATH_TASKS)
def test_math_gold_completions_grade_correct_on_every_row(name: str) -> None:
    task = golden_task(name)
    docs = task.load("test")
    results = task.grade_many([task.target_completion(d, "d1") for d in docs], docs)
    assert failures(results, docs) == []  # math-verify
    assert failures(results, docs, "d1") == []  # d1's parser
    assert len(docs) == {"gsm8k": 1319, "math500": 500, "aime24": 30, "aime25": 30}[name]


def shifted_answer(docs: list[dict[str, Any]], i: int, name: str) -> str:
    """A wrong answer for doc ``i``: integer golds + 1, else the next MATH500 answer that differs."""
    gold = golden_task(name).gold(docs[i])
    if name != "math500":
        return str(int(gold) + 1)
    for doc in docs[i + 1 :] + docs[:i]:
        other = doc["answer"]
        try:
            same_number = float(other) == float(gold)
        except ValueError:
            same_number = False
        if not same_number and not d1.is_equiv(other, gold):
            return other
    raise AssertionError("no differing answer")


@pytest.mark.parametrize("name", MATH_TASKS)
def test_math_shifted_answers_grade_wrong(name: str) -> None:
    task = golden_task(name)
    docs = task.load("test")
    wrong = [
        task.target_completion({**doc, "answer": shifted_answer(docs, i, name)}, "d1") for i, doc in enumerate(docs)
    ]
    results = task.grade_many(wrong, docs)
    assert [d["doc_id"] for r, d in zip(results, docs, strict=True) if r.correct or r.details["d1"]] == []


@pytest.mark.parametrize("name", MATH_TASKS)
@pytest.mark.parametrize("protocol", OTHER_PROTOCOLS)
def test_math_gold_completions_in_other_protocols(name: str, protocol: str) -> None:
    task = golden_task(name)
    docs = task.load("test", limit=40)
    results = task.grade_many([task.target_completion(d, protocol) for d in docs], docs)
    assert failures(results, docs) == []


@pytest.mark.parametrize("name", ("gsm8k", "math500"))
def test_stabledrl_reward_of_gold_completions(name: str) -> None:
    task = golden_task(name)
    docs = task.load("test", limit=20)
    rewards = task.reward_many([task.target_completion(d, "stabledrl") for d in docs], docs, "stabledrl")
    assert [r.components["correctness"] for r in rewards] == [1.0] * len(docs)


def test_countdown_gold_completions_every_protocol_every_row() -> None:
    task = get_task("countdown")
    docs = task.load("test")
    for protocol in task.protocols:
        results = task.grade_many([task.target_completion(d, protocol) for d in docs], docs)
        assert failures(results, docs) == [], protocol
        if protocol == "d1":
            assert failures(results, docs, "d1") == []
        if protocol in ("tiny", "d1_train"):  # d1's reward gives these targets full marks
            assert {task.reward(task.target_completion(d, protocol), d, "d1").total for d in docs} == {1.0}
        if protocol == "stabledrl":
            rewards = {task.reward(task.target_completion(d, protocol), d, "stabledrl").total for d in docs}
            assert rewards == {2.0}  # correctness 1 + anti_short_boxed 1
    shifted = task.grade_many(
        [task.target_completion(d, "d1") for d in docs], [{**d, "target": d["target"] + 1} for d in docs]
    )
    assert not any(r.correct or r.details["d1"] for r in shifted)


@pytest.mark.parametrize("split", ("test", "test_d1", "train"))
def test_sudoku_gold_completions_every_protocol_every_row(split: str) -> None:
    task = get_task("sudoku")
    docs = task.load(split)
    for protocol in task.protocols:
        results = [task.grade(task.target_completion(d, protocol), d) for d in docs]
        assert all(r.correct and r.score == 1.0 and r.details["exact_match"] for r in results), protocol
        rewards = {task.reward(task.target_completion(d, protocol), d, "d1").total for d in docs}
        assert rewards == {1.0}, protocol
    for doc in docs:  # shift one blank cell to another digit: a duplicate in its row
        blank = doc["puzzle"].index("0")
        digit = "1" if doc["solution"][blank] != "1" else "2"
        wrong = doc["solution"][:blank] + digit + doc["solution"][blank + 1 :]
        result = task.grade(task.target_completion({**doc, "solution": wrong}, "d1"), doc)
        assert not result.correct and result.score < 1.0
