"""The overall progress line of long jobs: stage counts, elapsed time and the per-kind estimate."""

from __future__ import annotations

import pytest

from stabledrl_bench.experiments.stages import Stages, duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _stages(kinds):
    clock, lines = FakeClock(), []
    return Stages(kinds, clock=clock, out=lines.append), clock, lines


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59.4, "59s"), (75, "1m15s"), (3725, "1h02m"), (-3, "0s")])
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_estimate_is_the_mean_of_each_kind_times_the_stages_left():
    stages, clock, lines = _stages(["a:sft", "a:eval", "a:train", "a:eval", "a:train"])
    stages.begin("warm start")
    assert lines[-1] == "[stage 1/5 | 0s elapsed, estimate after the first stage of each kind] warm start"
    clock.now += 60
    stages.end()
    stages.begin("evaluate the start")
    clock.now += 10
    stages.end()
    stages.begin("train grpo")  # train never measured yet
    assert "estimate after" in lines[-1]
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
