"""Statistics over runs: the two-level bootstrap against a loop version and hand-computed cases, the verdict rule,
and the few-run aggregates (IQM, probability of improvement, profiles) against scipy and hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from stabledrl_bench.reporting.overruns import START, Finding, row_over_runs
from stabledrl_bench.reporting.runlevel import (
    NOT_RESOLVED,
    RunInterval,
    improvement_interval,
    iqm,
    iqm_interval,
    paired_differences,
    performance_profile,
    probability_of_improvement,
    stratified_bootstrap,
    two_level_bootstrap,
    verdict,
)
from stabledrl_bench.reporting.stats import bootstrap_mean_ci


def _loop_two_level(runs, n_resamples: int, seed: int) -> np.ndarray:
    """The two-level bootstrap's statistics, one resample and one drawn run at a time, from the same random draws
    (the vectorised version draws each cell's item picks per run, for that run's slots in row-major order)."""
    rng = np.random.default_rng(seed)
    count, width = len(runs), len(runs[0])
    drawn = rng.integers(0, count, size=(n_resamples, count))
    picks = {}
    for cell in range(width):
        for run in range(count):
            slots = int((drawn == run).sum())
            picks[cell, run] = iter(rng.integers(0, len(runs[run][cell]), size=(slots, len(runs[run][cell]))))
    means = np.zeros((width, n_resamples, count))
    for cell in range(width):
        for run in range(count):
            for b in range(n_resamples):
                for slot in range(count):
                    if drawn[b, slot] == run:
                        values = np.asarray(runs[run][cell])
                        means[cell, b, slot] = values[next(picks[cell, run])].mean()
    return np.mean([means[cell].mean(axis=1) for cell in range(width)], axis=0)


def test_the_two_level_bootstrap_equals_its_loop_version() -> None:
    rng = np.random.default_rng(5)
    runs = [[rng.normal(size=n), rng.normal(loc=1.0, size=n + 3)] for n in (7, 11, 5)]
    statistic = _loop_two_level(runs, 200, seed=3)
    interval = two_level_bootstrap(runs, n_resamples=200, seed=3)
    low, high = np.percentile(statistic, [2.5, 97.5])
    assert interval.low == pytest.approx(low, abs=1e-12) and interval.high == pytest.approx(high, abs=1e-12)
    expected = np.mean([np.mean([run[cell].mean() for run in runs]) for cell in range(2)])
    assert interval.mean == pytest.approx(expected, abs=1e-12) and interval.runs == 3


def test_two_runs_without_item_noise_span_the_runs() -> None:
    """Items constant within a run: a resample's mean is a (chance 1/4), (a+b)/2 (1/2) or b (1/4), so the 95%
    interval runs from the lower run to the higher one."""
    interval = two_level_bootstrap([[np.full(4, 0.1)], [np.full(6, 0.3)]])
    assert (interval.mean, interval.low, interval.high, interval.runs) == pytest.approx((0.2, 0.1, 0.3, 2))


def test_three_runs_one_of_which_differs_are_not_resolved() -> None:
    """Runs at 0, 0 and 1: a resample draws all three from the '1' run with chance 1/27 > 2.5 %, and none of it with
    8/27, so the interval is [0, 1] and includes 0 at its edge: not resolved. Three runs at 1 are."""
    interval = two_level_bootstrap([[np.zeros(3)], [np.zeros(3)], [np.ones(3)]])
    assert (interval.low, interval.high) == (0.0, 1.0)
    assert verdict(interval, "above", "below") == NOT_RESOLVED
    assert two_level_bootstrap([[np.ones(3)]] * 3).verdict("above", "below") == "above"


def test_one_run_gives_the_item_interval_and_no_verdict() -> None:
    values = np.random.default_rng(1).normal(0.5, 1.0, size=200)
    single = two_level_bootstrap([[values]], n_resamples=4000)
    items = bootstrap_mean_ci([values], n_resamples=4000)
    assert single.mean == pytest.approx(items.mean)
    assert single.low == pytest.approx(items.low, abs=0.03) and single.high == pytest.approx(items.high, abs=0.03)
    assert single.low > 0 and single.verdict("above", "below") == NOT_RESOLVED  # one run says nothing of runs


def test_the_interval_over_runs_covers_what_the_items_miss() -> None:
    """Runs whose offsets differ by more than their items vary: the pooled item interval is tight around the
    mean, the run-level one spans the runs."""
    rng = np.random.default_rng(2)
    offsets = (-2.0, 0.5, 3.0)
    runs = [[offset + rng.normal(scale=0.2, size=256)] for offset in offsets]
    pooled = bootstrap_mean_ci([np.concatenate([run[0] for run in runs])])
    over_runs = two_level_bootstrap(runs)
    assert pooled.high - pooled.low < 0.5 < 3.0 < over_runs.high - over_runs.low
    assert pooled.low > 0 and over_runs.low < 0 < over_runs.high


def test_bad_input_is_refused() -> None:
    for runs in ([], [[]], [[np.ones(2)], [np.ones(2), np.ones(2)]], [[np.ones((2, 2))]], [[np.array([])]]):
        with pytest.raises(ValueError):
            two_level_bootstrap(runs)


@pytest.mark.parametrize(
    ("low", "high", "runs", "expected"),
    [(0.1, 0.2, 2, "above"), (-0.2, -0.1, 3, "below"), (-0.1, 0.1, 5, NOT_RESOLVED), (0.0, 0.1, 5, NOT_RESOLVED)],
)
def test_a_verdict_needs_an_interval_that_excludes_zero(low, high, runs, expected) -> None:
    interval = RunInterval((low + high) / 2, low, high, runs=runs)
    assert verdict(interval, "above", "below") == expected
    assert interval.cell("above", "below").endswith(expected)


def test_paired_differences_keep_the_shared_items_in_order() -> None:
    assert list(paired_differences({"b": 1.0, "a": 0.5, "c": 2.0}, {"a": 0.25, "b": 1.5})) == [0.25, -0.5]
    assert paired_differences({"a": 1.0}, {"b": 1.0}) is None


# ------------------------------------------------------------------------------------------------ aggregates
@pytest.mark.parametrize("size", [1, 3, 4, 7, 12, 30])
def test_iqm_is_scipys_quarter_trimmed_mean(size: int) -> None:
    scores = np.random.default_rng(size).normal(size=(size, 1)) ** 3
    assert iqm(scores) == pytest.approx(stats.trim_mean(scores, 0.25, axis=None))


def test_iqm_by_hand() -> None:
    # eight scores: the two lowest and two highest are cut, the middle four averaged
    assert iqm(np.array([[0.0, 100.0], [1.0, 2.0], [3.0, 4.0], [-50.0, 5.0]])) == pytest.approx((1 + 2 + 3 + 4) / 4)


def test_the_probability_of_improvement_is_the_mann_whitney_statistic() -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(0, 4, size=(5, 3)).astype(float)  # small integers: ties happen
    y = rng.integers(0, 4, size=(4, 3)).astype(float)
    expected = np.mean(
        [stats.mannwhitneyu(x[:, c], y[:, c], alternative="greater").statistic / (5 * 4) for c in range(3)]
    )
    assert probability_of_improvement(x, y) == pytest.approx(expected)


def test_the_paired_probability_of_improvement_by_hand() -> None:
    x = np.array([[1.0, 2.0], [3.0, 0.0]])
    y = np.array([[0.0, 2.0], [4.0, -1.0]])
    # wins per seed and cell: 1, 0.5 (tie), 0, 1 -> 2.5 / 4
    assert probability_of_improvement(x, y, paired=True) == pytest.approx(0.625)
    # unpaired: cell 0 compares {1, 3} with {0, 4}: wins 1>0, 3>0 -> 2/4; cell 1 {2, 0} vs {2, -1}: 0.5 + 1 + 0 + 1
    assert probability_of_improvement(x, y) == pytest.approx((2 / 4 + 2.5 / 4) / 2)
    with pytest.raises(ValueError):
        probability_of_improvement(x, y[:1], paired=True)


def test_performance_profile_by_hand() -> None:
    scores = np.array([[0.1, 0.5], [0.2, 0.9]])
    assert list(performance_profile(scores, [0.0, 0.1, 0.5, 1.0])) == [1.0, 0.75, 0.25, 0.0]


def test_the_stratified_bootstrap_resamples_runs_within_each_cell() -> None:
    """Cell 0's runs are 0..4, cell 1's are 100..104: a resample that mixed cells would show a value of one cell's
    range in the other's column."""
    scores = np.stack([np.arange(5.0), 100 + np.arange(5.0)], axis=1)
    seen = []

    def record(batch: np.ndarray) -> np.ndarray:
        seen.append(batch)
        return batch.mean(axis=(1, 2))

    stratified_bootstrap(record, scores, n_resamples=50)
    resampled = seen[-1]
    assert resampled.shape == (50, 5, 2)
    assert resampled[:, :, 0].max() <= 4 and resampled[:, :, 1].min() >= 100
    assert len(np.unique(resampled[:, :, 0])) > 1  # it does resample


def test_aggregate_intervals_contain_their_estimates_and_are_reproducible() -> None:
    rng = np.random.default_rng(4)
    x, y = rng.normal(1.0, size=(5, 3)), rng.normal(size=(5, 3))
    for interval in (iqm_interval(x), improvement_interval(x, y), improvement_interval(x, y, paired=True)):
        assert interval.low <= interval.mean <= interval.high and interval.runs == 5
    assert iqm_interval(x) == iqm_interval(x)
    constant = iqm_interval(np.ones((3, 2)))
    assert (constant.low, constant.mean, constant.high) == (1.0, 1.0, 1.0)


def test_a_row_over_runs_says_when_its_cells_rest_on_different_numbers_of_runs() -> None:
    """A method run on five Sudoku seeds and three Countdown ones: one count beside the row would claim five runs
    for the Countdown cells, so the label is the range and the three-run cell says so."""

    def finding(column: str, low: float, runs: int) -> Finding:
        interval = RunInterval(mean=low + 0.01, low=low, high=low + 0.02, runs=runs)
        return Finding("c", "b", "grpo", START, column, interval)

    label, cells = row_over_runs({"Sudoku": finding("Sudoku", 0.01, 5), "Countdown": finding("Countdown", -0.05, 3)})
    assert label == "3-5"
    assert cells == {
        "Sudoku": "+2.0 [+1.0, +3.0] above",
        "Countdown": "-4.0 [-5.0, -3.0] below (3 runs)",
    }
    label, cells = row_over_runs({"Sudoku": finding("Sudoku", 0.01, 5), "Countdown": None})
    assert (label, cells["Countdown"]) == ("5", "–")
    assert row_over_runs({"Sudoku": None})[0] == "0"
