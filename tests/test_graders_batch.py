"""Batch grading: a batch runs on every isolated worker at once and gives exactly the one-by-one results.

Two levels. The pool (:meth:`IsolatedPool.call_many`) is tested with a small registry written for these tests,
whose answers are instructions (sleep, hang, crash, meet another answer), so that order, concurrency, time-outs
and crashes are deterministic; no test asserts a speed. The tasks (``reward_many``, ``grade_many``) are tested
on real MATH500 and GSM8K answers, hostile ones included, against values recorded with the one-by-one code
before batching existed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stabledrl_bench.errors import UserError
from stabledrl_bench.tasks import get_task
from stabledrl_bench.tasks.base import Task
from stabledrl_bench.tasks.graders import mathverify
from stabledrl_bench.tasks.graders.isolation import IsolatedPool, IsolatedResult, _Worker
from stabledrl_bench.tasks.graders.mathverify import math_verify, math_verify_many, warm_up
from stabledrl_bench.tasks.gsm8k import GSM8KTask
from stabledrl_bench.tasks.math500 import Math500Task

REGISTRY = "batch_test_registry"
REGISTRY_CODE = '''
import os
import time


def isolated_warmup():
    time.sleep(float(os.environ.get("BATCH_TEST_WARMUP_S", "0")))


def answer(spec):
    """"hang", "crash", "sleep SECONDS TEXT", "meet DIR ME OTHER" (wait until OTHER has started), "hang-once FILE
    TEXT" (hangs the first time, when FILE does not exist yet) or TEXT."""
    if spec == "hang":
        while True:
            time.sleep(1)
    if spec.startswith("hang-once "):
        _, marker, spec = spec.split(" ", 2)
        if not os.path.exists(marker):
            open(marker, "w").close()
            while True:
                time.sleep(1)
    if spec == "crash":
        os._exit(3)
    if spec.startswith("sleep "):
        _, seconds, spec = spec.split(" ", 2)
        time.sleep(float(seconds))
    if spec.startswith("meet "):
        _, folder, me, other = spec.split(" ")
        open(os.path.join(folder, me), "w").close()
        while not os.path.exists(os.path.join(folder, other)):
            time.sleep(0.01)
        spec = me
    return spec.upper()


ISOLATED_FUNCTIONS = {"answer": answer}
'''


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test registry, importable by worker processes (they inherit ``PYTHONPATH``)."""
    (tmp_path / f"{REGISTRY}.py").write_text(REGISTRY_CODE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    return tmp_path


@pytest.fixture
def pool(registry: Path) -> Iterator[IsolatedPool]:
    started = IsolatedPool(REGISTRY, size=2)
    started.wait_until_ready()
    yield started
    started.close()


def run(pool: IsolatedPool, specs: list[str], timeout_s: float) -> list[IsolatedResult]:
    return pool.call_many("answer", [(spec,) for spec in specs], timeout_s=timeout_s)


def one_by_one(pool: IsolatedPool, specs: list[str], timeout_s: float) -> list[IsolatedResult]:
    return [pool.call("answer", spec, timeout_s=timeout_s) for spec in specs]


def verdicts(results: list[IsolatedResult]) -> list[tuple[str, Any, str | None]]:
    """Status, value and what happened ("no answer", "no worker ready", "worker died"), without the numbers:
    an error message says how much time was left, which varies from run to run."""
    return [(r.status, r.value, r.error and r.error.split(" within ")[0].split(" (")[0]) for r in results]


def ok(*values: str) -> list[tuple[str, Any, None]]:
    return [("ok", value, None) for value in values]


KILLED = ("timeout", None, "no answer")


def test_a_batch_keeps_input_order_and_equals_one_by_one(pool: IsolatedPool) -> None:
    # early answers are slow, so later ones finish first on the other worker
    specs = [f"sleep {0.2 if i % 4 == 0 else 0} a{i}" for i in range(12)]
    expected = [IsolatedResult("ok", value=f"A{i}") for i in range(12)]
    assert run(pool, specs, timeout_s=30) == one_by_one(pool, specs, timeout_s=30) == expected
    assert run(pool, [], timeout_s=30) == []
    with pytest.raises(ValueError, match="positive"):
        run(pool, ["a"], timeout_s=0)


def test_a_batch_runs_on_every_worker_at_once(pool: IsolatedPool, tmp_path: Path) -> None:
    # each answer waits until the other has started: one after the other, the first would wait forever
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    specs = [f"meet {meeting} left right", f"meet {meeting} right left"]
    assert verdicts(run(pool, specs, timeout_s=60)) == ok("LEFT", "RIGHT")


def test_a_hanging_answer_costs_only_its_own_limit(registry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hanging answer is killed at its limit and retried on a fresh worker, which starts slowly (1 s); the
    answers after it run on the other worker meanwhile, so every other verdict is unchanged."""
    monkeypatch.setenv("BATCH_TEST_WARMUP_S", "1")
    slow_start = IsolatedPool(REGISTRY, size=2)
    try:
        slow_start.wait_until_ready()
        specs = ["hang"] + [f"sleep 0.05 b{i}" for i in range(30)]
        results = run(slow_start, specs, timeout_s=1.0)
    finally:
        slow_start.close()
    assert verdicts(results) == [KILLED, *ok(*(f"B{i}" for i in range(30)))]


def test_a_restart_is_never_charged_to_the_next_answer(registry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-worker pool: the hanging answer is killed, retried on the replacement once it has started, and killed
    again; the next answer then waits for another replacement, which starts slowly (0.5 s of warm-up, more than the
    limit). The wait is not its time, so it is answered (it was a time-out that never ran before)."""
    monkeypatch.setenv("BATCH_TEST_WARMUP_S", "0.5")
    slow_start = IsolatedPool(REGISTRY, size=1)
    try:
        slow_start.wait_until_ready()
        results = [slow_start.call("answer", spec, timeout_s=0.3) for spec in ("hang", "c")]
    finally:
        slow_start.close()
    assert verdicts(results) == [KILLED, *ok("C")]
    assert results[0].error == "no answer within 0.3 s, twice (retried on a fresh worker)"


def test_an_overrun_is_retried_once_on_a_fresh_worker(pool: IsolatedPool, tmp_path: Path) -> None:
    """An answer that overran once (here: it hangs only the first time) gets its verdict from the retry."""
    specs = [f"hang-once {tmp_path / 'first'} slow", "a", f"hang-once {tmp_path / 'second'} late"]
    assert verdicts(run(pool, specs, timeout_s=0.5)) == ok("SLOW", "A", "LATE")


def test_an_answer_that_had_a_cpu_for_its_whole_limit_is_not_retried(pool, tmp_path, monkeypatch) -> None:
    """Its time was its own (a retry would compute the same): a time-out after one attempt. Here the worker is
    reported to have used a CPU all along (its CPU clock is made the wall clock); the same answer is retried, and
    answered, when the report says it got no CPU (as a sleeping worker does)."""
    monkeypatch.setattr(_Worker, "cpu_seconds", lambda worker: time.monotonic())
    assert verdicts(run(pool, [f"hang-once {tmp_path / 'busy'} late"], timeout_s=0.5)) == [KILLED]
    monkeypatch.setattr(_Worker, "cpu_seconds", lambda worker: 0.0)
    assert verdicts(run(pool, [f"hang-once {tmp_path / 'starved'} late"], timeout_s=0.5)) == ok("LATE")


def test_a_worker_crash_in_a_batch_costs_only_that_answer(pool: IsolatedPool) -> None:
    specs = ["a", "b", "crash", "c", "d", "e"]
    expected = [*ok("A", "B"), ("error", None, "worker died"), *ok("C", "D", "E")]
    assert verdicts(run(pool, specs, timeout_s=30)) == verdicts(one_by_one(pool, specs, timeout_s=30)) == expected
    pool.wait_until_ready()  # the crashed worker was replaced
    assert verdicts(run(pool, ["f", "g"], timeout_s=30)) == ok("F", "G")


def test_a_batch_raises_what_a_call_raises(registry: Path) -> None:
    broken = IsolatedPool("stabledrl_bench.no_such_registry", size=2)
    try:
        with pytest.raises(RuntimeError, match=r"failed to start: .*ModuleNotFoundError"):
            broken.call_many("answer", [("a",)] * 8, timeout_s=1)
    finally:
        broken.close()
    closed = IsolatedPool(REGISTRY, size=2)
    closed.close()
    with pytest.raises(RuntimeError, match="closed"):
        closed.call_many("answer", [("a",)] * 4, timeout_s=1)


# ------------------------------------------------------------------------------------------- tasks
HANG = "\\boxed{9^{9^{9^{9}}}}"  # sympy evaluates the tower against a numeric gold: a time-out
LIMIT_S = 1.5  # the grader's default; StableDRL's reward gets the same here to keep the test short

# (grade.correct, grade.details["d1"], grade.details["timed_out"], d1 reward, StableDRL reward) of each answer
# of fixed_answers(), recorded with the one-by-one code before batching existed.
MATH500_DOC = [(True, True, False, 2.75, 2.0), (False, False, False, 0.75, 0.0), (True, True, False, 2.25, 2.0)]
MATH500_BEFORE = MATH500_DOC * 6 + [(False, False, True, 0.25, -1.0)] + MATH500_DOC * 2
GSM8K_BEFORE = [
    (True, True, False, 0.23299999999999998, 2.0),
    (False, False, False, 0.244, 0.0),
    (True, True, False, 0.0, 2.0),
    (True, True, False, 0.244, 2.0),
    (False, False, False, 0.09899999999999998, 0.0),
    (True, True, False, 0.0, 2.0),
    (False, False, True, 0.0, -1.0),
    (True, True, False, 0.09899999999999998, 2.0),
    (False, False, False, 0.28200000000000003, 0.0),
    (True, True, False, 0.0, 2.0),
    (True, True, False, 0.28200000000000003, 2.0),
    (False, False, False, 0.23299999999999998, 0.0),
    (True, True, False, 0.0, 1.0),
]


def fixed_answers(task: Task, n_docs: int, hostile_doc: int) -> tuple[list[str], list[dict[str, Any]]]:
    """Per test doc: the gold solution as a d1 completion, another doc's (a wrong answer), the gold in StableDRL's
    format; after ``hostile_doc``'s, an answer that hangs math-verify (its gold is a number)."""
    docs = task.load("test", n_docs)
    completions, rows = [], []
    for i, doc in enumerate(docs):
        other = docs[(i + 1) % n_docs]
        for text in (
            task.target_completion(doc, "d1"),
            task.target_completion(other, "d1"),
            task.target_completion(doc, "stabledrl"),
        ):
            completions.append(text)
            rows.append(doc)
        if i == hostile_doc:
            completions.append(HANG)
            rows.append(doc)
    return completions, rows


def summary(grade: Any, d1: Any, stabledrl: Any) -> tuple[bool, bool, bool, float, float]:
    return grade.correct, grade.details["d1"], grade.details["timed_out"], d1.total, stabledrl.total


@pytest.mark.parametrize(
    ("task", "n_docs", "hostile_doc", "before"),
    [(Math500Task(timeout_s=LIMIT_S), 8, 5, MATH500_BEFORE), (GSM8KTask(timeout_s=LIMIT_S), 4, 1, GSM8K_BEFORE)],
    ids=["math500", "gsm8k"],
)
def test_batch_rewards_and_grades_equal_one_by_one_and_the_values_before(
    task: Task, n_docs: int, hostile_doc: int, before: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mathverify, "STABLEDRL_TIMEOUT_S", LIMIT_S)
    completions, docs = fixed_answers(task, n_docs, hostile_doc)
    pairs = list(zip(completions, docs, strict=True))

    def settled(results: list[Any]) -> list[Any]:
        # The hostile answer's worker is being replaced. Two hostile answers within one start-up would leave no
        # started worker, and the next answer would pay the start-up out of its own limit, batch or not; so every
        # pass starts from a ready pool, as the first one does.
        warm_up()
        return results

    warm_up()
    batch = (
        settled(task.grade_many(completions, docs)),
        settled(task.reward_many(completions, docs, "d1")),
        settled(task.reward_many(completions, docs, "stabledrl")),
    )
    single = (
        settled([task.grade(c, doc) for c, doc in pairs]),
        settled([task.reward(c, doc, "d1") for c, doc in pairs]),
        settled([task.reward(c, doc, "stabledrl") for c, doc in pairs]),
    )
    assert batch == single  # whole results: every component and every grading detail
    assert [summary(*verdicts) for verdicts in zip(*batch, strict=True)] == before


def test_batch_arguments_are_checked_as_one_by_one() -> None:
    math = get_task("math500")
    with pytest.raises(UserError, match="2 completions for 1 docs"):
        math.grade_many(["a", "b"], [{"answer": "1"}])
    with pytest.raises(UserError, match="unknown reward profile"):
        math.reward_many(["a"], [{"answer": "1"}], "nope")
    with pytest.raises(UserError, match="completion must be a string"):
        math.reward_many(["a", 3], [{"answer": "1"}] * 2, "stabledrl")  # type: ignore[list-item]
    with pytest.raises(UserError, match="missing field 'answer'"):
        math.grade_many(["a", "b"], [{"answer": "1"}, {}])
    assert math.grade_many([], []) == [] and math.reward_many([], [], "stabledrl") == []


def test_math_verify_many_equals_math_verify() -> None:
    golds = ["1/2", "72", "\\frac{1}{4}", "3"]
    predictions = ["\\boxed{0.5}", "The total is 71.", "<answer>0.25</answer>", "<answer></answer>"]
    warm_up()
    batch = math_verify_many(golds, predictions)
    assert batch == [math_verify(g, p) for g, p in zip(golds, predictions, strict=True)]
    assert [outcome.correct for outcome in batch] == [True, False, True, False]
    with pytest.raises(ValueError):
        math_verify_many(golds, predictions[:2])
