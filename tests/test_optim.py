"""Learning-rate schedules against hand-computed factors (``training/optim.py: lr_factor``).

Why hand values: the schedule is written here rather than taken from ``transformers.get_scheduler``, whose warmup
starts at factor 0 and whose linear factor rounds differently; these pin the schedule every committed run used.
"""

from __future__ import annotations

import math

import pytest

from stabledrl_bench.training.optim import OptimConfig, lr_factor


@pytest.mark.parametrize(
    ("schedule", "warmup", "expected"),
    [
        ("constant", 0, [1.0, 1.0, 1.0, 1.0, 1.0]),
        ("constant", 2, [1.0, 1.0, 1.0, 1.0, 1.0]),  # constant ignores warmup, as its name says
        ("constant_with_warmup", 2, [0.5, 1.0, 1.0, 1.0, 1.0]),  # (step + 1) / warmup: the first step trains
        ("linear", 0, [1.0, 0.8, 0.6, 0.4, 0.2]),  # StableDRL: max(0, 1 - step / total)
        ("linear", 1, [1.0, 1.0, 0.75, 0.5, 0.25]),
        ("cosine", 0, [1.0, (1 + math.cos(math.pi / 5)) / 2, (1 + math.cos(2 * math.pi / 5)) / 2,
                       (1 + math.cos(3 * math.pi / 5)) / 2, (1 + math.cos(4 * math.pi / 5)) / 2]),
    ],
)  # fmt: skip
def test_schedule_factors_by_hand(schedule: str, warmup: int, expected: list[float]) -> None:
    cfg = OptimConfig(lr_scheduler_type=schedule, warmup_steps=warmup)
    assert [lr_factor(step, 5, cfg) for step in range(5)] == pytest.approx(expected, abs=1e-15)


def test_linear_reaches_zero_and_stays_there() -> None:
    cfg = OptimConfig(lr_scheduler_type="linear")
    assert lr_factor(5, 5, cfg) == 0.0 and lr_factor(9, 5, cfg) == 0.0
