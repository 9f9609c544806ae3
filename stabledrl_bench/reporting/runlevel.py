"""Statistics over training runs: the intervals a verdict is read from, and the few-run aggregates.

Why: one run of a comparison is one draw of warm start, RL and evaluation. Another seed moves a method's change from
its start by more than the test items do, and so does another kind of CPU (it rounds differently, and from the first
optimizer step on that acts like another seed). The item-level intervals of :mod:`.stats` cover the test items only.
Here every comparison of two things measured on the same runs (a method against its start, against the frozen
control, against another method) gets

* :func:`two_level_bootstrap`: resample the runs (seeds) with replacement, then the test items within each drawn run,
  and take the percentile interval of the mean. It covers both sources of variation; a verdict is read from it
  (:func:`verdict`), and only where it excludes 0.
* the aggregates that Agarwal et al. (2021, "Deep Reinforcement Learning at the Edge of the Statistical Precipice")
  recommend for few runs, on run-level scores (one number per run and cell): the interquartile mean (:func:`iqm`), the
  probability of improvement (:func:`probability_of_improvement`) and score distributions (:func:`performance_profile`),
  with their stratified bootstrap (:func:`stratified_bootstrap`: the runs of each cell resampled on their own).

Why not the ``rliable`` package, which implements the aggregates: its stratified bootstrap draws from numpy's global
random state (``np.random.choice`` in ``StratifiedBootstrap.update_indices``, whatever ``random_state`` it is given),
so a reproducible page would need the global RNG reseeded; and it pulls in ``arch`` (with ``statsmodels``), ``seaborn``
and ``absl-py`` for about forty lines of arithmetic. The definitions here are rliable's (``metrics.aggregate_iqm``:
``scipy.stats.trim_mean(scores, 0.25)``; ``metrics.probability_of_improvement``: the Mann-Whitney U statistic over
``n_x n_y`` per cell, averaged over cells); the tests check them against scipy.

With few runs the percentile bootstrap is optimistic: with R runs its spread of a mean is about sqrt((R-1)/R) of the
usual standard error (0.82 at R = 3). A verdict at 3 runs therefore needs every run to agree, and more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from stabledrl_bench.reporting.stats import BOOTSTRAP_SEED, CONFIDENCE, N_RESAMPLES, Interval

MIN_RUNS = 2  # a verdict needs runs to resample: one run says nothing about the spread over runs
NOT_RESOLVED = "not resolved"  # the interval includes 0: no verdict at this budget


@dataclass(frozen=True)
class RunInterval(Interval):
    """An estimate with its interval over runs (and items within them), and how many runs it resampled."""

    runs: int = 1

    def verdict(self, above: str, below: str) -> str:
        """:func:`verdict` of this interval."""
        return verdict(self, above, below)

    def cell(self, above: str, below: str, spec: str = "+.1f", scale: float = 100.0) -> str:
        """``+1.3 [+0.4, +2.2] above``: the estimate, its interval and the verdict it supports."""
        return f"{self.text(spec, scale)} {self.verdict(above, below)}"


def verdict(interval: RunInterval, above: str, below: str) -> str:
    """``above`` where the interval lies above 0, ``below`` where below, else :data:`NOT_RESOLVED` (also when it
    resampled fewer than :data:`MIN_RUNS` runs: a single run's interval covers its test items only)."""
    if interval.runs < MIN_RUNS:
        return NOT_RESOLVED
    if interval.low > 0:
        return above
    if interval.high < 0:
        return below
    return NOT_RESOLVED


def _percentiles(statistic: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(statistic, [tail, 100.0 - tail])
    return float(low), float(high)


def two_level_bootstrap(
    runs: Sequence[Sequence[np.ndarray | Sequence[float]]],
    *,
    n_resamples: int = N_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> RunInterval:
    """Percentile interval of the mean over cells of the mean over runs of each cell's item mean, resampling runs,
    then items.

    ``runs[r][c]`` holds the per-item values of cell ``c`` (a length, a task) in run ``r`` (a training seed): for a
    change, the paired differences. The estimate is θ = (1/K) Σ_c (1/R) Σ_r mean(x_rc). One resample draws R runs
    with replacement, r*_1..r*_R, and for every drawn run and cell an independent resample of its items x*_{r*_j,c}
    (a run drawn twice gets two item resamples); θ* = (1/K) Σ_c (1/R) Σ_j mean(x*_{r*_j,c}). With one run this is
    :func:`~.stats.bootstrap_mean_ci` of its cells. A fresh ``default_rng(seed)`` per call, as there.
    """
    arrays = [[np.asarray(values, dtype=np.float64) for values in run] for run in runs]
    cells = {len(run) for run in arrays}
    if not arrays or len(cells) != 1 or 0 in cells or any(a.ndim != 1 or a.size == 0 for run in arrays for a in run):
        raise ValueError("two_level_bootstrap needs runs with the same number (>= 1) of non-empty 1-D cells")
    rng = np.random.default_rng(seed)
    count, width = len(arrays), cells.pop()
    drawn = rng.integers(0, count, size=(n_resamples, count))  # the runs each resample draws
    statistic = np.zeros(n_resamples)
    for cell in range(width):
        means = np.empty((n_resamples, count))
        for run in range(count):
            slots = drawn == run
            values = arrays[run][cell]
            picks = rng.integers(0, values.size, size=(int(slots.sum()), values.size))
            means[slots] = values[picks].mean(axis=1)
        statistic += means.mean(axis=1)
    statistic /= width
    estimate = float(np.mean([np.mean([run[cell].mean() for run in arrays]) for cell in range(width)]))
    return RunInterval(estimate, *_percentiles(statistic, confidence), runs=count)


def paired_differences(ours: Mapping[str, float], theirs: Mapping[str, float]) -> np.ndarray | None:
    """The per-item differences ``ours - theirs`` over the items both have (in item order), or None if none."""
    shared = sorted(ours.keys() & theirs.keys())
    if not shared:
        return None
    return np.asarray([ours[item] - theirs[item] for item in shared], dtype=np.float64)


# ------------------------------------------------------------------------------------------------ aggregates
def iqm(scores: np.ndarray) -> float:
    """Interquartile mean of every score (runs x cells flattened): the mean of the middle half, ``int(n/4)`` cut from
    each end as ``scipy.stats.trim_mean(scores, 0.25, axis=None)`` does. Less swayed by one outlying run than the
    mean, far less noisy than the median."""
    return float(_iqm_rows(np.asarray(scores, dtype=np.float64).reshape(1, -1))[0])


def _iqm_rows(values: np.ndarray) -> np.ndarray:
    """IQM of each row of a 2-D array."""
    ordered = np.sort(values, axis=1)
    cut = int(0.25 * ordered.shape[1])
    return ordered[:, cut : ordered.shape[1] - cut].mean(axis=1)


def probability_of_improvement(x: np.ndarray, y: np.ndarray, *, paired: bool = False) -> float:
    """P(X > Y): the chance that a run of X scores above a run of Y on the same cell, ties counted half, averaged
    over cells. ``x`` is runs_x x cells, ``y`` runs_y x cells.

    Unpaired (Agarwal et al. 2021, rliable's ``probability_of_improvement``): every run of X against every run of Y,
    per cell the Mann-Whitney U statistic over ``n_x n_y``. ``paired``: run r of X against run r of Y only (the same
    number of runs): here the runs of one seed share their warm start, whose score differs from seed to seed by more
    than the methods do, so comparing across seeds would read the starts' differences as the methods'.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if paired:
        return float(_wins(x, y).mean())
    return float(_poi_batches(x[None], y[None])[0])


def _wins(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per run and cell: 1 where x beats y, 0.5 on a tie, else 0 (the paired probability of improvement's terms)."""
    if x.shape != y.shape:
        raise ValueError(f"a paired comparison needs the same runs and cells, got {x.shape} and {y.shape}")
    return (x > y) + 0.5 * (x == y)


def _poi_batches(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """:func:`probability_of_improvement` of each batch: ``x`` is (B, runs_x, cells), ``y`` (B, runs_y, cells)."""
    left, right = x[:, :, None, :], y[:, None, :, :]
    per_cell = (left > right).mean(axis=(1, 2)) + 0.5 * (left == right).mean(axis=(1, 2))
    return per_cell.mean(axis=1)


def performance_profile(scores: np.ndarray, thresholds: np.ndarray | Sequence[float]) -> np.ndarray:
    """The score distribution: for every threshold τ, the fraction of runs x cells scoring above τ (rliable's
    ``run_score_deviation``). One curve per method shows where its runs lie, not only their mean."""
    values = np.asarray(scores, dtype=np.float64).reshape(-1)
    return np.asarray([np.mean(values > tau) for tau in thresholds], dtype=np.float64)


def _stratified(scores: np.ndarray, rng: np.random.Generator, n_resamples: int) -> np.ndarray:
    """(B, runs, cells): every cell's runs resampled with replacement on their own (rliable's stratified bootstrap)."""
    runs, cells = scores.shape
    picks = rng.integers(0, runs, size=(n_resamples, runs, cells))
    return scores[picks, np.arange(cells)[None, None, :]]


def stratified_bootstrap(
    statistic: Callable[..., np.ndarray],
    *scores: np.ndarray,
    n_resamples: int = N_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> RunInterval:
    """The percentile interval of an aggregate over runs. ``statistic`` takes one (B, runs, cells) array per score
    matrix and returns B values; each matrix (runs x cells) is resampled on its own, stratified by cell."""
    arrays = [np.asarray(matrix, dtype=np.float64) for matrix in scores]
    if not arrays or any(matrix.ndim != 2 or matrix.size == 0 for matrix in arrays):
        raise ValueError("stratified_bootstrap needs non-empty runs x cells matrices")
    rng = np.random.default_rng(seed)
    resampled = [_stratified(matrix, rng, n_resamples) for matrix in arrays]
    point = float(statistic(*(matrix[None] for matrix in arrays))[0])
    return RunInterval(point, *_percentiles(statistic(*resampled), confidence), runs=min(m.shape[0] for m in arrays))


def iqm_interval(scores: np.ndarray) -> RunInterval:
    """:func:`iqm` with its stratified bootstrap interval."""
    return stratified_bootstrap(lambda batch: _iqm_rows(batch.reshape(batch.shape[0], -1)), scores)


def improvement_interval(x: np.ndarray, y: np.ndarray, *, paired: bool = False) -> RunInterval:
    """:func:`probability_of_improvement` with its stratified bootstrap interval: X's and Y's runs resampled
    independently (rliable's ``StratifiedIndependentBootstrap``), or, ``paired``, the seeds resampled together."""
    if paired:
        wins = _wins(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
        return stratified_bootstrap(lambda batch: batch.mean(axis=(1, 2)), wins)
    return stratified_bootstrap(_poi_batches, x, y)
