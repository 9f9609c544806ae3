"""The overall progress line of long jobs: stage counts, elapsed time and the estimate, from the first stage on."""

from __future__ import annotations

import pytest

from stabledrl_bench.experiments.stages import Stages, duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _stages(kinds, work=None):
    clock, lines = FakeClock(), []
    return Stages(kinds, work=work, clock=clock, out=lines.append), clock, lines


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59.4, "59s"), (75, "1m15s"), (3725, "1h02m"), (-3, "0s")])
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_estimate_is_the_mean_of_each_kind_times_the_stages_left():
    stages, clock, lines = _stages(["a:sft", "a:eval", "a:train", "a:eval", "a:train"])
    stages.begin("warm start")
    assert lines[-1] == "[stage 1/5 | 0s elapsed, estimate after the first stage] warm start"
    clock.now += 60
    stages.end()
    stages.begin("evaluate the start")  # nothing but the warm start measured: every stage is expected to take 60 s
    assert lines[-1] == "[stage 2/5 | 1m00s elapsed, ~4m00s left] evaluate the start"
    clock.now += 10
    stages.end()
    stages.begin("train grpo")  # train never measured yet: the rate of every stage so far, (60 + 10) / 2 each
    assert lines[-1] == "[stage 3/5 | 1m10s elapsed, ~1m20s left] train grpo"
    clock.now += 100
    stages.end()
    stages.begin("evaluate grpo")
    # left: eval (10) + train (100) = 110 s; elapsed 170 s
    assert lines[-1] == "[stage 4/5 | 2m50s elapsed, ~1m50s left] evaluate grpo"
    clock.now += 30  # evals now average (10 + 30) / 2 = 20
    stages.end()
    assert stages.estimate_left() == pytest.approx(100.0)


def test_reused_stages_do_not_enter_the_estimate():
    stages, clock, _ = _stages(["t:train", "t:train", "t:train"])
    stages.begin("first")
    clock.now += 0.01
    stages.end(reused=True)
    assert stages.estimate_left() is None
    stages.begin("second")
    clock.now += 50
    stages.end()
    assert stages.estimate_left() == pytest.approx(50.0)


def test_a_new_task_borrows_the_cost_of_the_same_kind_until_measured():
    stages, clock, _ = _stages(["sudoku:train", "countdown:train", "countdown:train"])
    stages.begin("sudoku")
    clock.now += 40
    stages.end()
    assert stages.estimate_left() == pytest.approx(80.0)
    stages.begin("countdown")
    clock.now += 10
    stages.end()
    assert stages.estimate_left() == pytest.approx(10.0)  # its own kind now, not sudoku's


def test_the_budget_work_of_each_stage_carries_a_measured_rate_to_the_stages_of_other_kinds():
    """From the first stage on: every stage's seconds = its work x the rate measured so far (its own kind's once
    measured), so a long training after a short warm start is expected to take its share of the work."""
    stages, clock, _ = _stages(["s:sft", "s:eval", "s:train", "s:eval"], work=[10, 1, 40, 1])
    stages.begin("warm start")
    clock.now += 20  # 2 s per unit of work
    stages.end()
    assert stages.estimate_left() == pytest.approx(2 * (1 + 40 + 1))
    stages.begin("evaluate the start")
    clock.now += 5  # evaluations: 5 s per unit of their own
    stages.end()
    assert stages.estimate_left() == pytest.approx(40 * 25 / 11 + 5)  # train: every stage's rate, (20 + 5) / 11
    with pytest.raises(ValueError, match="positive amount for each of the 2 stages"):
        Stages(["a", "b"], work=[1.0, 0.0])


def test_misuse_is_an_error():
    stages, _, _ = _stages(["x:eval"])
    with pytest.raises(RuntimeError, match="before begin"):
        stages.end()
    stages.begin("one")
    with pytest.raises(RuntimeError, match="twice"):
        stages.begin("two")
    stages.end()
    with pytest.raises(RuntimeError, match="already ran"):
        stages.begin("three")
