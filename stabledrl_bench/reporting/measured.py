"""The measured rows of one comparison: every cell's samples pooled over the seeds into an estimate with its
interval, each test item's mean value per cell (over the seeds, and for each seed alone), and the change of a row
from its starting point, paired by test item. The leaderboard's tables and plots show these numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from stabledrl_bench.reporting.frame import ROW_KEY, checkpoint_label, join_unique, row_order
from stabledrl_bench.reporting.layout import CellKey, Column
from stabledrl_bench.reporting.markdown import MISSING
from stabledrl_bench.reporting.results import load_samples
from stabledrl_bench.reporting.runlevel import RunInterval, paired_differences, two_level_bootstrap
from stabledrl_bench.reporting.schema import REFERENCE_BASELINES
from stabledrl_bench.reporting.stats import Interval, bootstrap_mean_ci
from stabledrl_bench.tasks import get_task


@dataclass
class MeasuredRow:
    """One displayed row: its descriptive columns, the estimate of every numeric column (None = missing), and per
    cell the mean headline value of every test item (over seeds and repeats), which the paired comparison needs."""

    info: dict[str, str]
    estimates: dict[CellKey, Interval | None]
    per_item: dict[CellKey, dict[str, float]]
    per_seed: dict[int, dict[CellKey, dict[str, float]]]  # the same, for each training seed on its own
    protocols: str = ""  # the protocol (family) of the row: an RL row is compared with the start under the same


def measured_rows(frame: pd.DataFrame, records: list[dict[str, Any]], columns: list[Column]) -> list[MeasuredRow]:
    """Pool the seeds of every cell and estimate each column.

    An average column is filled only when all of its cells were measured: an average over fewer lengths or tasks
    would look comparable with the published averages while it is not.
    """
    rows = []
    for _, group in row_order(frame).groupby(ROW_KEY, sort=False):
        cells: dict[CellKey, np.ndarray] = {}
        per_item: dict[CellKey, dict[str, float]] = {}
        per_seed: dict[int, dict[CellKey, dict[str, float]]] = {}
        for (task, sub), runs in group.groupby(["task", "sub"], sort=False):
            field = get_task(task).headline_field
            loaded = {i: load_samples(records[i]) for i in runs["index"]}  # each samples file is read once
            samples = [sample for record_samples in loaded.values() for sample in record_samples]
            cells[(task, sub)] = np.asarray([float(sample[field]) for sample in samples], dtype=np.float64)
            per_item[(task, sub)] = _item_means(samples, field)
            for seed, seed_runs in runs.groupby("seed", sort=True):
                seed_samples = [sample for i in seed_runs["index"] for sample in loaded[i]]
                per_seed.setdefault(int(seed), {})[(task, sub)] = _item_means(seed_samples, field)
        first = group.iloc[0]
        budgets = [digest for digest in group["budget_hash"] if isinstance(digest, str)]  # pandas: None -> NaN
        info = {
            "Baseline": first["baseline"],
            "Checkpoint": checkpoint_label(group),
            "Model": first["model"],
            "Preset": first["preset"],
            "Protocol": join_unique(group["protocol"].tolist()),
            "Budget": ", ".join(f"`{digest}`" for digest in sorted(set(budgets))) or MISSING,
            "Hardware": "; ".join(sorted(set(group["hardware"]))),
            "Code": "; ".join(sorted(set(group["code"]))),
            "Seeds": join_unique(group["seed"].tolist()),
        }
        estimates = {
            column.key: bootstrap_mean_ci([cells[part] for part in column.parts])
            if all(part in cells for part in column.parts)
            else None
            for column in columns
        }
        rows.append(MeasuredRow(info, estimates, per_item, per_seed, protocols=first["protocols"]))
    return rows


def _item_means(samples: Sequence[Mapping[str, Any]], field: str) -> dict[str, float]:
    """Mean headline value of every test item (over repeats and pooled seeds)."""
    by_item: dict[str, list[float]] = {}
    for sample in samples:
        by_item.setdefault(str(sample["doc_id"]), []).append(float(sample[field]))
    return {doc: float(np.mean(values)) for doc, values in by_item.items()}


def _differences(
    ours: Mapping[CellKey, dict[str, float]], theirs: Mapping[CellKey, dict[str, float]], column: Column
) -> list[np.ndarray] | None:
    """Per cell of ``column``, the per-item differences ``ours - theirs`` (None if a cell is missing or shares no
    item)."""
    differences = []
    for part in column.parts:
        if part not in ours or part not in theirs:
            return None
        difference = paired_differences(ours[part], theirs[part])
        if difference is None:
            return None
        differences.append(difference)
    return differences


def paired_change(row: MeasuredRow, reference: MeasuredRow, column: Column) -> Interval | None:
    """Change of ``row`` over ``reference`` in one column, paired by test item, seeds pooled.

    Why paired: both rows answered the same test items, so the per-item difference d_i = x_i - x_ref_i removes
    the item difficulty that dominates the spread of either row alone; the interval is the bootstrap of
    (1/K) Σ_c mean(d_c) over the column's cells c (:func:`bootstrap_mean_ci` on the differences). It measures the
    test-set sampling noise only: it says nothing about the spread over training seeds (:func:`run_change` does).
    ``None`` when a cell is missing in either row or the two rows share no item.
    """
    differences = _differences(row.per_item, reference.per_item, column)
    return None if differences is None else bootstrap_mean_ci(differences)


def shared_seeds(row: MeasuredRow, reference: MeasuredRow, column: Column) -> list[int]:
    """The training seeds on which both rows measured every cell of ``column``."""
    return [
        seed
        for seed in sorted(row.per_seed.keys() & reference.per_seed.keys())
        if all(part in row.per_seed[seed] and part in reference.per_seed[seed] for part in column.parts)
    ]


def run_change(row: MeasuredRow, reference: MeasuredRow, column: Column) -> RunInterval | None:
    """Change of ``row`` over ``reference`` in one column over runs: each training seed's change from the same
    seed's ``reference`` (paired by item), with the two-level bootstrap over the seeds and then the items
    (:func:`~.runlevel.two_level_bootstrap`). This is the interval a verdict is read from: a change of machine or
    of seed moves a run by more than the test items do. ``None`` when no seed has every cell in both rows."""
    runs = [
        _differences(row.per_seed[seed], reference.per_seed[seed], column)
        for seed in shared_seeds(row, reference, column)
    ]
    present = [run for run in runs if run is not None]
    return two_level_bootstrap(present) if present else None


def run_scores(row: MeasuredRow, column: Column, seeds: Sequence[int]) -> np.ndarray:
    """Runs x cells: each seed's mean headline value per cell of ``column`` (the few-run aggregates' input)."""
    return np.asarray(
        [[np.mean(list(row.per_seed[seed][part].values())) for part in column.parts] for seed in seeds],
        dtype=np.float64,
    )


def starting_points(rows: list[MeasuredRow]) -> dict[str, MeasuredRow]:
    """The starting point of each protocol (family): ``sft`` if measured, else ``base``. An RL row is compared with
    the start evaluated the same way (:attr:`MeasuredRow.protocols`)."""
    starts: dict[str, MeasuredRow] = {}
    for name in REFERENCE_BASELINES:  # base, then sft: a measured sft replaces base
        starts |= {row.protocols: row for row in rows if row.info["Baseline"] == name}
    return starts


def compared_rows(rows: list[MeasuredRow], starts: Mapping[str, MeasuredRow]) -> list[MeasuredRow]:
    """The RL rows that have a start to be compared with."""
    return [row for row in rows if row.info["Baseline"] not in REFERENCE_BASELINES and row.protocols in starts]
