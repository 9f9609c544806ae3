"""The leaderboard's sampled-evaluation blocks: pass@k and maj@k per comparison, the change from the start, and a
pass@k plot.

Records of a sampled protocol (``<protocol>-n<N>-t<T>``: every test problem decoded N times at temperature T,
:mod:`stabledrl_bench.reporting.passk`) never fill a greedy table's cells; they get a block of their own per
comparison. Each value is computed from the stored samples, per problem, and averaged over problems (the seeds of
a row pooled: each seed's problems are separate items), with a percentile-bootstrap 95% interval over them.

Why a change-from-start table: RL can raise pass@1 while lowering pass@k (it sharpens what the start already
solved and forgets the rest), or raise both. The per-problem difference from the start, paired by problem, shows
which, with the problems' difficulty taken out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stabledrl_bench.errors import UserError
from stabledrl_bench.plots import new_figure, save_png
from stabledrl_bench.reporting.frame import ROW_KEY, checkpoint_label, join_unique, row_name, row_order
from stabledrl_bench.reporting.markdown import MISSING, markdown_table, task_label
from stabledrl_bench.reporting.naming import slugify
from stabledrl_bench.reporting.overruns import RUNS_COLUMN, START, Finding, row_over_runs
from stabledrl_bench.reporting.passk import k_values, per_problem, votes_by_problem
from stabledrl_bench.reporting.results import load_samples
from stabledrl_bench.reporting.runlevel import RunInterval, paired_differences, two_level_bootstrap
from stabledrl_bench.reporting.schema import REFERENCE_BASELINES
from stabledrl_bench.reporting.stats import Interval, bootstrap_mean_ci

Cell = tuple[str, Any]  # (task, length) in Table 1 and the coding table, (task, sampling) in Table 2


@dataclass
class SampledCell:
    """One cell of one row: decodes per problem, and for every metric (``pass@k``, ``maj@k``) each problem's value
    per seed (``(seed, problem) -> value``)."""

    samples: int
    values: dict[str, dict[tuple[int, str], float]]

    def interval(self, metric: str) -> Interval:
        return bootstrap_mean_ci([np.fromiter(self.values[metric].values(), dtype=np.float64)])

    def seeds(self) -> list[int]:
        return sorted({seed for values in self.values.values() for seed, _ in values})

    def of_seed(self, metric: str, seed: int) -> dict[str, float]:
        """Each problem's value on one training seed."""
        return {problem: value for (ours, problem), value in self.values[metric].items() if ours == seed}

    def per_problem(self, metric: str) -> dict[str, float]:
        """Each problem's value, averaged over the seeds that decoded it (what a paired change compares)."""
        by_problem: dict[str, list[float]] = {}
        for (_, problem), value in self.values[metric].items():
            by_problem.setdefault(problem, []).append(value)
        return {problem: float(np.mean(values)) for problem, values in by_problem.items()}


@dataclass
class SampledRow:
    info: dict[str, str]
    cells: dict[Cell, SampledCell]


def _cell(runs: pd.DataFrame, records: Sequence[Mapping[str, Any]]) -> SampledCell:
    """Per-problem pass@k and maj@k of every record of one cell (one record per seed)."""
    values: dict[str, dict[tuple[int, str], float]] = {}
    sizes = set()
    for index, seed in zip(runs["index"], runs["seed"], strict=True):
        for problem, votes in votes_by_problem(load_samples(records[index])).items():
            sizes.add(len(votes))
            if len(sizes) > 1:
                raise UserError(f"{records[index]['_path']}: problems decoded {sorted(sizes)} times in one cell")
            for metric, value in per_problem(votes, k_values(len(votes))).items():
                values.setdefault(metric, {})[(int(seed), problem)] = value
    return SampledCell(sizes.pop(), values)


def _rows(group: pd.DataFrame, records: Sequence[Mapping[str, Any]]) -> list[SampledRow]:
    rows = []
    for _, row_group in row_order(group).groupby(ROW_KEY, sort=False):
        first = row_group.iloc[0]
        info = {
            "Baseline": first["baseline"],
            "Checkpoint": checkpoint_label(row_group),
            "Model": first["model"],
            "Protocol": join_unique(row_group["protocol"].tolist()),
            "Seeds": join_unique(row_group["seed"].tolist()),
        }
        cells = {(task, sub): _cell(runs, records) for (task, sub), runs in row_group.groupby(["task", "sub"])}
        rows.append(SampledRow(info, cells))
    return rows


def _header(cell: Cell, metric: str) -> str:
    return f"{task_label(cell[0])} {cell[1]} {metric}"


def _shown_metrics(samples: int) -> tuple[str, ...]:
    """The table's metrics of a cell with ``samples`` decodes per problem (the plot shows every k)."""
    return ("pass@1", f"pass@{samples}", f"maj@{samples}")


def _columns(rows: Sequence[SampledRow]) -> list[tuple[Cell, str]]:
    cells = sorted({cell: row.cells[cell].samples for row in rows for cell in row.cells}.items(), key=str)
    return [(cell, metric) for cell, samples in cells for metric in _shown_metrics(samples)]


def _paired_change(row: SampledRow, start: SampledRow, cell: Cell, metric: str) -> Interval | None:
    """Mean over shared problems of (row - start) in ``metric``, bootstrapped over the problems."""
    if cell not in row.cells or cell not in start.cells or metric not in start.cells[cell].values:
        return None
    difference = paired_differences(row.cells[cell].per_problem(metric), start.cells[cell].per_problem(metric))
    return None if difference is None else bootstrap_mean_ci([difference])


def _run_change(row: SampledRow, start: SampledRow, cell: Cell, metric: str) -> RunInterval | None:
    """Each seed's change from the same seed's start, paired by problem, over runs (seeds, then problems)."""
    if cell not in row.cells or cell not in start.cells or metric not in start.cells[cell].values:
        return None
    ours, theirs = row.cells[cell], start.cells[cell]
    runs = []
    for seed in sorted(set(ours.seeds()) & set(theirs.seeds())):
        difference = paired_differences(ours.of_seed(metric, seed), theirs.of_seed(metric, seed))
        if difference is not None:
            runs.append([difference])
    return two_level_bootstrap(runs) if runs else None


def _findings(comparison: str, others: Sequence[SampledRow], start: SampledRow, columns: Sequence) -> list[Finding]:
    found = []
    for row in others:
        for cell, metric in columns:
            change = _run_change(row, start, cell, metric)
            if change is not None:
                name = row.info["Baseline"]
                found.append(Finding(comparison, "sampled decoding", name, START, _header(cell, metric), change))
    return found


def _runs_table(others: Sequence[SampledRow], columns: Sequence[tuple[Cell, str]], found: Sequence[Finding]) -> str:
    """Each RL row's change from the start over runs, with its verdict, per cell and metric."""
    by_cell = {(f.subject, f.column): f for f in found}
    headers = [_header(cell, metric) for cell, metric in columns]
    rows = []
    for row in others:
        name = row.info["Baseline"]
        runs, cells = row_over_runs({header: by_cell.get((name, header)) for header in headers})
        rows.append({"Baseline": name, "Checkpoint": row.info["Checkpoint"], "Runs": runs} | cells)
    table = pd.DataFrame(rows)
    return (
        "**Change from the start over runs**: each seed's change from its own start, paired by problem, with a "
        f"two-level bootstrap 95% interval (the seeds resampled, then the problems within each); {RUNS_COLUMN} "
        "`above` / `below` where it excludes 0, else `not resolved` at this budget.\n\n" + markdown_table(table)
    )


def _change_text(row: SampledRow, start: SampledRow, cell: Cell, metric: str) -> str:
    change = _paired_change(row, start, cell, metric)
    return MISSING if change is None else change.text("+.1f")


def _start(rows: Sequence[SampledRow]) -> SampledRow | None:
    """``sft`` if measured, else ``base``: what every RL row is compared with."""
    for name in reversed(REFERENCE_BASELINES):
        for row in rows:
            if row.info["Baseline"] == name:
                return row
    return None


def _text(row: SampledRow, cell: Cell, metric: str) -> str:
    if cell not in row.cells or metric not in row.cells[cell].values:
        return MISSING
    return row.cells[cell].interval(metric).text()


def _plot(path: Path, title: str, rows: Sequence[SampledRow]) -> None:
    """One panel per cell: pass@k (solid) and maj@k (dashed) against k on a log2 axis, one color per row."""
    cells = sorted({cell for row in rows for cell in row.cells}, key=str)
    # the start (first row) gray, then ten distinct colors: the default comparison has nine rows
    palette = ("tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink")
    palette += ("tab:olive", "tab:cyan", "black")
    figure = new_figure(4.2 * len(cells) + 3.0, 4.0)
    axes = figure.subplots(1, len(cells), squeeze=False)[0]
    for ax, cell in zip(axes, cells, strict=True):
        for i, row in enumerate(rows):
            if cell not in row.cells:
                continue
            ks = k_values(row.cells[cell].samples)
            color = palette[i % len(palette)]
            for kind, style in (("pass", "-"), ("maj", "--")):
                means = [100 * row.cells[cell].interval(f"{kind}@{k}").mean for k in ks]
                label = row_name(row.info) if kind == "pass" else "_nolegend_"  # one entry per row: the title
                ax.plot(ks, means, style, marker="o", markersize=3, color=color, label=label)  # names the styles
        ax.set_xscale("log", base=2)
        every_k = sorted({k for row in rows if cell in row.cells for k in k_values(row.cells[cell].samples)})
        ax.set_xticks(every_k, [str(k) for k in every_k])
        ax.set_ylim(0, 100)
        ax.set_xlabel("k (samples)", fontsize=8)
        ax.set_ylabel("% of problems", fontsize=8)
        ax.set_title(f"{task_label(cell[0])} {cell[1]}", fontsize=9)
        ax.tick_params(labelsize=8)
    handles, names = axes[0].get_legend_handles_labels()
    share = 1.0 - 2.6 / (4.2 * len(cells) + 3.0)  # the legend keeps 2.6 inches on the right
    figure.legend(handles, names, loc="center left", bbox_to_anchor=(share, 0.5), fontsize="small", frameon=False)
    figure.suptitle(f"{title}\npass@k (solid, unbiased estimator) and maj@k (dashed)", fontsize=9)
    save_png(figure, path, dpi=100, rect=(0, 0, share, 1))


def sampled_blocks(
    table: str, frame: pd.DataFrame, records: Sequence[Mapping[str, Any]], plots_dir: Path | None, markdown_dir: Path
) -> tuple[str, list[Finding]]:
    """The markdown of every comparison of ``table`` that has sampled records in ``frame`` (none: ``""``), and its
    comparisons over runs (:class:`~.overruns.Finding`)."""
    subset = frame[(frame["table"] == table) & frame["sampled"]]
    blocks, found = [], []
    for comparison, group in subset.groupby("comparison", sort=True):
        rows = _rows(group, records)
        columns = _columns(rows)
        display = pd.DataFrame(
            [row.info | {_header(cell, metric): _text(row, cell, metric) for cell, metric in columns} for row in rows]
        )
        temperatures = join_unique(f"{records[i]['settings']['temperature']:g}" for i in group["index"])
        block = (
            f"**Measured by this code — comparison `{comparison}`, SAMPLED DECODING: pass@k and maj@k** (every test "
            f"problem decoded n times at temperature {temperatures}; n and T are in the protocol's name "
            "`<protocol>-n<n>-t<T>`). pass@k: unbiased estimate of the chance that one of k samples is correct; "
            "maj@k: the chance that the most frequent answer of k samples is correct (Sudoku: the puzzle solved, "
            "not the cell accuracy of the greedy tables). % of problems with a percentile-bootstrap 95% interval "
            "over the problems; seeds of one row pooled.\n\n" + markdown_table(display)
        )
        start = _start(rows)
        others = [row for row in rows if row.info["Baseline"] not in REFERENCE_BASELINES]
        if start is not None and others:
            change = pd.DataFrame(
                [
                    {"Baseline": row.info["Baseline"], "Checkpoint": row.info["Checkpoint"]}
                    | {_header(cell, metric): _change_text(row, start, cell, metric) for cell, metric in columns}
                    for row in others
                ]
            )
            block += (
                f"\n**Change from the start** (`{start.info['Baseline']}`), in percentage points, paired by problem: "
                "RL that sharpens what the start already solved raises pass@1 and lowers pass@n; RL that widens "
                "what the model can solve raises both.\n\n" + markdown_table(change)
            )
            ours = _findings(comparison, others, start, columns)
            found += ours
            block += "\n" + _runs_table(others, columns, ours)
        if plots_dir is not None:
            path = Path(plots_dir) / f"{table}__{slugify(comparison, 80)}__passk.png"
            _plot(path, f"{comparison}: sampled decoding", rows)
            link = Path(os.path.relpath(path.resolve(), markdown_dir.resolve())).as_posix()
            block += f"\n![pass@k {comparison}]({link})\n"
        blocks.append(block)
    return "\n".join(blocks), found
