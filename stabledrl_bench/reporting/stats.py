"""Intervals for the measured numbers: percentile bootstraps with a fixed seed, so a regenerated page is identical.

Why a bootstrap: per-sample correctness is a 0/1 (or cell-fraction) variable over a few hundred test items, where
normal-approximation intervals misbehave near 0 and 1; resampling the items needs no such assumption.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

N_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """A point estimate (fraction) with its bootstrap interval."""

    mean: float
    low: float
    high: float

    def text(self, spec: str = ".1f", scale: float = 100.0) -> str:
        """``mean [low, high]`` scaled (default: percent) in format ``spec``, e.g. ``"+.1f"`` for changes."""
        return f"{scale * self.mean:{spec}} [{scale * self.low:{spec}}, {scale * self.high:{spec}}]"


def bootstrap_mean_ci(
    groups: Sequence[Sequence[float] | np.ndarray],
    *,
    n_resamples: int = N_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> Interval:
    """Percentile bootstrap of the mean of group means, resampling every group independently.

    One group is the plain bootstrap of a mean. Several groups (the lengths of a task, or all twelve cells of the
    overall average) are resampled separately because they are separate evaluations whose sizes must not
    change: statistic* = (1/K) Σ_k mean(resample of group k); interval = its (α/2, 1-α/2) percentiles.
    A fresh ``default_rng(seed)`` per call makes every cell reproducible independently of the others.
    """
    arrays = [np.asarray(group, dtype=np.float64) for group in groups]
    if not arrays or any(array.ndim != 1 or array.size == 0 for array in arrays):
        raise ValueError("bootstrap_mean_ci needs one or more non-empty 1-D groups")
    rng = np.random.default_rng(seed)
    statistic = np.zeros(n_resamples)
    for array in arrays:
        statistic += array[rng.integers(0, array.size, size=(n_resamples, array.size))].mean(axis=1)
    statistic /= len(arrays)
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(statistic, [tail, 100.0 - tail])
    return Interval(float(np.mean([array.mean() for array in arrays])), float(low), float(high))
