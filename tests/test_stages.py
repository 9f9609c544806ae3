"""The overall progress line of long jobs: stage counts, elapsed time and the estimate, from the first stage on, for
one worker (the plain sum) and several (the rest of the run simulated on them)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stabledrl_bench.experiments.stages import Planned, Stages, duration

REUSED = SimpleNamespace(reused=True)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _stages(kinds, work=None, after=None, workers=1):
    """A plan of stages "0", "1", ... of ``kinds``; ``after`` maps a stage's index to the indices it needs."""
    work = work or [1.0] * len(kinds)
    after = after or {}
    plan = [
        Planned(str(i), kind, f"stage {i}", w, tuple(str(j) for j in after.get(i, ())))
        for i, (kind, w) in enumerate(zip(kinds, work, strict=True))
    ]
    clock, lines = FakeClock(), []
    return Stages(plan, workers=workers, clock=clock, out=lines.append), clock, lines


def _run_one(stages, clock, key: str, seconds: float, result=None) -> None:
    stages.begin(key)
    clock.now += seconds
    stages.end(key, result)


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59.4, "59s"), (75, "1m15s"), (3725, "1h02m"), (-3, "0s")])
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_estimate_is_the_mean_of_each_kind_times_the_stages_left():
    stages, clock, lines = _stages(["a:sft", "a:eval", "a:train", "a:eval", "a:train"])
    stages.begin("0")
    assert lines[-1] == "[stage 1/5 | 0s elapsed, estimate after the first stage] stage 0"
    clock.now += 60
    stages.end("0")
    stages.begin("1")  # nothing but the warm start measured: every stage is expected to take 60 s
    assert lines[-1] == "[stage 2/5 | 1m00s elapsed, ~4m00s left] stage 1"
    clock.now += 10
    stages.end("1")
    stages.begin("2")  # train never measured yet: the rate of every stage so far, (60 + 10) / 2 each
    assert lines[-1] == "[stage 3/5 | 1m10s elapsed, ~1m20s left] stage 2"
    clock.now += 100
    stages.end("2")
    stages.begin("3")
    # left: eval (10) + train (100) = 110 s; elapsed 170 s
    assert lines[-1] == "[stage 4/5 | 2m50s elapsed, ~1m50s left] stage 3"
    clock.now += 30  # evals now average (10 + 30) / 2 = 20
    stages.end("3")
    assert stages.estimate_left() == pytest.approx(100.0)


def test_reused_stages_do_not_enter_the_estimate():
    stages, clock, _ = _stages(["t:train", "t:train", "t:train"])
    _run_one(stages, clock, "0", 0.01, REUSED)
    assert stages.estimate_left() is None
    _run_one(stages, clock, "1", 50)
    assert stages.estimate_left() == pytest.approx(50.0)


def test_a_new_task_borrows_the_cost_of_the_same_kind_until_measured():
    stages, clock, _ = _stages(["sudoku:train", "countdown:train", "countdown:train"])
    _run_one(stages, clock, "0", 40)
    assert stages.estimate_left() == pytest.approx(80.0)
    _run_one(stages, clock, "1", 10)
    assert stages.estimate_left() == pytest.approx(10.0)  # its own kind now, not sudoku's


def test_the_budget_work_of_each_stage_carries_a_measured_rate_to_the_stages_of_other_kinds():
    """From the first stage on: every stage's seconds = its work x the rate measured so far (its own kind's once
    measured), so a long training after a short warm start is expected to take its share of the work."""
    stages, clock, _ = _stages(["s:sft", "s:eval", "s:train", "s:eval"], work=[10, 1, 40, 1])
    _run_one(stages, clock, "0", 20)  # 2 s per unit of work
    assert stages.estimate_left() == pytest.approx(2 * (1 + 40 + 1))
    _run_one(stages, clock, "1", 5)  # evaluations: 5 s per unit of their own
    assert stages.estimate_left() == pytest.approx(40 * 25 / 11 + 5)  # train: every stage's rate, (20 + 5) / 11


def test_with_workers_the_estimate_simulates_the_rest_of_the_run_on_them():
    """A warm start (60 s) then four trainings of 100 s each needing it, on two workers: once the warm start is
    measured the trainings are expected at the same rate per unit of work, two at a time: 2 x 100 s, not 4 x 100."""
    stages, clock, lines = _stages(
        ["t:sft", "t:train", "t:train", "t:train", "t:train"],
        work=[60, 100, 100, 100, 100],
        after={i: (0,) for i in range(1, 5)},
        workers=2,
    )
    _run_one(stages, clock, "0", 60)  # 1 s per unit of work
    stages.begin("1", running=1)
    assert lines[-1] == "[stage 2/5 | 1m00s elapsed, ~3m20s left, 1 running] stage 1"
    clock.now += 30
    stages.begin("2", running=2)  # stage 1 has 70 s left; stage 2 100 s; stages 3 and 4 follow each
    assert stages.estimate_left() == pytest.approx(max(70 + 100, 100 + 100))
    clock.now += 70
    stages.end("1")
    assert stages.estimate_left() == pytest.approx(30 + 100)  # stage 2's 30 s, then one more on each worker


def test_a_stage_waits_for_the_stages_it_needs_in_the_estimate():
    """Two independent chains, sft -> train, on two workers: each chain runs on its own worker."""
    kinds = ["a:sft", "a:train", "b:sft", "b:train"]
    stages, clock, _ = _stages(kinds, work=[10, 30, 10, 30], after={1: (0,), 3: (2,)}, workers=2)
    _run_one(stages, clock, "0", 10)
    assert stages.estimate_left() == pytest.approx(max(30, 10 + 30))


def test_misuse_is_an_error():
    stages, _, _ = _stages(["x:eval"])
    with pytest.raises(RuntimeError, match="before it began"):
        stages.end("0")
    stages.begin("0")
    with pytest.raises(RuntimeError, match="twice"):
        stages.begin("0")
    with pytest.raises(ValueError, match="distinct keys"):
        Stages([Planned("a", "k", "a"), Planned("a", "k", "b")])
    with pytest.raises(ValueError, match="positive amount"):
        Stages([Planned("a", "k", "a", 0.0)])
