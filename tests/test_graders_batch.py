"""Batch grading: a batch runs on every isolated worker at once and gives exactly the one-by-one results.

The pool (:meth:`IsolatedPool.call_many`) is tested with a small registry written for these tests, whose
answers are instructions (sleep, hang, crash, meet another answer), so that order, concurrency, time-outs and
crashes are deterministic; no test asserts a speed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stabledrl_bench.tasks.graders.isolation import IsolatedPool, IsolatedResult

REGISTRY = "batch_test_registry"
REGISTRY_CODE = '''
import os
import time


def isolated_warmup():
    time.sleep(float(os.environ.get("BATCH_TEST_WARMUP_S", "0")))


def answer(spec):
    """"hang", "crash", "sleep SECONDS TEXT", "meet DIR ME OTHER" (wait until OTHER has started) or TEXT."""
    if spec == "hang":
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
    """The hanging answer is killed at its limit; its replacement starts slowly (2 s), and the answers after it
    wait for the busy worker instead of being charged that start-up, so every other verdict is unchanged."""
    monkeypatch.setenv("BATCH_TEST_WARMUP_S", "2")
    slow_start = IsolatedPool(REGISTRY, size=2)
    try:
        slow_start.wait_until_ready()
        specs = ["hang"] + [f"sleep 0.05 b{i}" for i in range(30)]
        results = run(slow_start, specs, timeout_s=1.0)
    finally:
        slow_start.close()
    assert verdicts(results) == [KILLED, *ok(*(f"B{i}" for i in range(30)))]


def test_an_answer_given_a_starting_worker_counts_its_start_up(registry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With every worker killed, the next answer gets a replacement that is still starting (2 s): the wait counts
    against its own limit, in a batch as one by one, and it is a time-out that never ran."""
    monkeypatch.setenv("BATCH_TEST_WARMUP_S", "2")
    slow_start = IsolatedPool(REGISTRY, size=2)
    specs = ["hang", "hang", "c"]
    try:
        slow_start.wait_until_ready()
        batch = run(slow_start, specs, timeout_s=0.5)
        slow_start.wait_until_ready()
        sequential = one_by_one(slow_start, specs, timeout_s=0.5)
    finally:
        slow_start.close()
    assert verdicts(batch) == verdicts(sequential) == [KILLED, KILLED, ("timeout", None, "no worker ready")]


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
