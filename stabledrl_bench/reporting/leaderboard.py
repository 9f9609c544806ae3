"""The leaderboard: measured results of this harness next to published numbers, never mixed.

Why two separate blocks per table: a number measured here (one model, one preset, one budget, with a sampling
interval) and a number copied from a paper (other hardware, other protocol details, a source grade) answer
different questions. Each table therefore has a "Measured by this code" block per comparison, where every cell is
``accuracy % [95% interval]`` and never carries a grade, and a "Published (not measured here)" block, where every
cell is ``value (grade)`` and never carries an interval.

Layout:

* **Table 1** (full attention, LLaDA layout): GSM8K, MATH500, Countdown, Sudoku x 128/256/512, a per-task average
  over the lengths and an overall average (mean of the twelve cells). Where measured, Countdown on 1,024 generated
  puzzles and Sudoku on generated 12-blank puzzles follow as extra column groups, outside the overall average
  (they are not in the paper).
* **Table 2** (block diffusion, TraceRL layout): MATH500, AIME 2024, GSM8K (and AIME 2025 when measured), each
  under static and dynamic sampling.
* **Coding** (full attention, the layout of SPG's coding table, arXiv 2510.09541 Table 2): HumanEval and MBPP x
  128/256/512 and a per-task average. A Table 1 record of HumanEval or MBPP is shown here, not as a Table 1
  column (:func:`~.layout.shown_table`); its comparison's other tasks stay in Table 1, each table with the training
  rewards of its own tasks.

Measured rows are grouped by their ``comparison``: each comparison is its own table, and all RL rows of one
comparison must share one ``budget_hash`` (reference rows ``base``/``sft`` are exempt), otherwise building the
leaderboard fails - results trained under different budgets are not comparable. Several seeds of one row are pooled.

Under a comparison that has a starting point (an ``sft`` row, else ``base``), a "Change from the starting point"
table gives every RL row minus that start, paired by test item (:func:`~.measured.paired_change`): the learning
signal, with the item difficulty shared by both rows taken out. Where
``<results>/training/<comparison>__<task>.csv`` exists (written by ``reproduce``), a "Training reward" table gives
each run's reward over its last rollouts minus a frozen control's on the same rollouts (:func:`training_changes`).

Intervals are percentile bootstraps (1000 resamples, ``numpy.random.default_rng(0)``, so the file is reproducible)
of the mean per-sample correctness. An average column resamples each of its cells independently and averages:
for cells c = 1..K with samples x_c, one resample is (1/K) Σ_c mean(x*_c), x*_c drawn with replacement from x_c.

Extra sections: ``build_leaderboard(..., extra_sections=[fn, ...])`` calls each ``fn(results_dir)`` after the
tables and appends the markdown it returns (``None`` or an empty string adds nothing). A later Stability section
(stress tests) plugs in this way without this module knowing about it::

    def stability_section(results_dir: Path) -> str | None:
        runs = sorted((results_dir / "stability").glob("*.json"))
        return None if not runs else "## Stability\\n\\n..."

    write_leaderboard("results", "LEADERBOARD.md", extra_sections=[stability_section])

Regenerate with ``python -m stabledrl_bench leaderboard``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.plots import new_figure, save_png
from stabledrl_bench.reporting.frame import check_consistency, join_unique, records_frame, row_name
from stabledrl_bench.reporting.layout import (
    LENGTH_TABLES,
    SHOWN_TABLES,
    TABLE_TITLES,
    Column,
    extra_notes,
    shows,
    table_columns,
)
from stabledrl_bench.reporting.markdown import MISSING, markdown_table, task_label
from stabledrl_bench.reporting.measured import MeasuredRow, compared_rows, measured_rows, paired_change, starting_points
from stabledrl_bench.reporting.naming import slugify
from stabledrl_bench.reporting.overruns import (
    Finding,
    aggregate_table,
    measured_findings,
    pairwise_table,
    platform_checks,
    profiles_plot,
    run_change_table,
    task_groups,
    verdict_list,
)
from stabledrl_bench.reporting.published import EMPTY_BLOCK, load_published, published_block
from stabledrl_bench.reporting.results import load_results
from stabledrl_bench.reporting.sampled import sampled_blocks
from stabledrl_bench.reporting.schema import REFERENCE_BASELINES
from stabledrl_bench.reporting.stats import N_RESAMPLES, Interval
from stabledrl_bench.reporting.training import training_block, training_findings
from stabledrl_bench.tasks import get_task

ROW_COLUMNS = ("Baseline", "Checkpoint", "Model", "Preset", "Protocol", "Budget", "Hardware", "Code", "Seeds")

ExtraSection = Callable[[Path], str | None]


# -------------------------------------------------------------------------------------------- measured
def _format_measured(interval: Interval | None, spec: str = ".1f") -> str:
    return MISSING if interval is None else interval.text(spec)


def _change_block(rows: list[MeasuredRow], columns: list[Column], found: Sequence[Finding]) -> str:
    """Every RL row minus its starting point (:func:`~.measured.starting_points`): paired by item with the seeds
    pooled, then over runs with its verdicts (``found``: :func:`~.overruns.measured_findings`)."""
    starts = starting_points(rows)
    others = compared_rows(rows, starts)
    if not others:
        return ""
    display = pd.DataFrame(
        [
            {"Baseline": row.info["Baseline"], "Checkpoint": row.info["Checkpoint"], "Model": row.info["Model"]}
            | ({"Protocol": row.info["Protocol"]} if len(starts) > 1 else {})
            | {c.header: _format_measured(paired_change(row, starts[row.protocols], c), "+.1f") for c in columns}
            for row in others
        ]
    )
    start = starts[others[0].protocols]
    caption = (
        f"**Change from the starting point** (`{start.info['Baseline']}`, {start.info['Model']}), in percentage "
        "points, paired by test item with the seeds pooled, with a percentile-bootstrap 95% interval over the items. "
        "It covers the test-set sampling noise only, not the spread over training seeds or machines: the verdicts "
        "are read from the tables over runs below.\n"
    )
    groups = task_groups(columns, others)
    parts = [
        caption + "\n" + markdown_table(display),
        run_change_table(starts, others, columns, found),
        pairwise_table(others, groups, found),
        aggregate_table(starts, others, groups),
    ]
    return "\n".join(part for part in parts if part)


APPROXIMATE_NOTE = (
    "Approximate decoding (Fast-dLLM: KV cache refreshed per block, confidence-threshold parallel decoding, EOS "
    "stop): faster, but not the reference sampler, so these numbers are not comparable with exact-decoding rows."
)


def _caption(comparison: str, table: str, frame: pd.DataFrame, approximate: bool) -> str:
    rl = frame[~frame["baseline"].isin(REFERENCE_BASELINES)]
    budget = f"`{rl['budget_hash'].iloc[0]}`" if not rl.empty else MISSING
    title = f"comparison `{comparison}`" + (", APPROXIMATE DECODING" if approximate else "")
    lines = [
        f"**Measured by this code — {title}** (presets: {join_unique(frame['preset'].tolist())}; "
        f"protocols: {join_unique(frame['protocol'].tolist())}; RL training budget {budget} shared by every RL row, "
        f"reference rows base/sft exempt). Each cell is accuracy % with a percentile-bootstrap 95% interval over "
        f"per-sample correctness (Sudoku: d1 cell accuracy, the per-sample score, as in the published tables); "
        f"seeds of one row are pooled.",
    ]
    lengths = frame.drop_duplicates("length").sort_values("length")
    if (lengths["length"] != lengths["max_completion_length"]).any():
        pairs = ", ".join(f"{row.length} → {row.max_completion_length}" for row in lengths.itertuples())
        noun = "generation lengths" if table in LENGTH_TABLES else "response limits"
        lines.append(f"Lengths are scaled by the preset: nominal {noun} → actual generated tokens: {pairs}.")
    lines += extra_notes(table, set(frame["task"]))
    if approximate:
        lines.append(APPROXIMATE_NOTE)
    return "\n".join(lines) + "\n"


METRIC_NAMES = {"correct": "accuracy", "score": "d1 cell accuracy"}


def _metric_text(columns: Sequence[Column]) -> str:
    """What the plotted numbers are, per task: e.g. ``Sudoku: d1 cell accuracy``."""
    tasks = dict.fromkeys(part[0] for column in columns for part in column.parts)
    return "; ".join(f"{task_label(t)}: {METRIC_NAMES[get_task(t).headline_field]}" for t in tasks)


def _bars(
    axes,
    rows: list[MeasuredRow],
    shown: list[Column],
    value: Callable[[MeasuredRow, Column], Any],
    colors: Mapping[str, str],
) -> None:
    """Grouped bars, one group per column and one bar per row (its color fixed by ``colors``), 95% intervals."""
    width = 0.8 / max(1, len(rows))
    for offset, row in enumerate(rows):
        estimates = [value(row, c) for c in shown]
        means = [100 * e.mean if e else np.nan for e in estimates]
        errors = [
            [100 * (e.mean - e.low) if e else 0 for e in estimates],
            [100 * (e.high - e.mean) if e else 0 for e in estimates],
        ]
        positions = np.arange(len(shown)) + (offset - (len(rows) - 1) / 2) * width
        name = row_name(row.info)
        axes.bar(positions, means, width, yerr=errors, capsize=3, label=name, color=colors[name])


def _plot(path: Path, title: str, rows: list[MeasuredRow], columns: list[Column], canvases: Mapping[Any, int]) -> None:
    """Per task one row of two panels over its measured cell columns: the change of every RL row from the starting
    point (paired by test item, the comparison that shows a learning signal) and every row's own value; legend
    beside the panels. Each task's change panel has its own scale, so a large change in one task does not flatten
    the others.

    ``canvases`` maps a column's sub-key (a nominal length) to the tokens really generated, shown under its name.
    """
    shown = [c for c in columns if len(c.parts) == 1 and any(row.estimates[c.key] for row in rows)]
    by_task: dict[str, list[Column]] = {}
    for column in shown:
        by_task.setdefault(column.key[0], []).append(column)
    starts = starting_points(rows)
    others = compared_rows(rows, starts)
    palette = ("tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink")
    colors = {row_name(row.info): palette[i % len(palette)] for i, row in enumerate(rows)}
    panels = 2 if others else 1
    width = max(len(cells) for cells in by_task.values())
    figure = new_figure(max(7.0, panels * (1.3 * width + 2.5) + 2.5), 2.8 * len(by_task) + 0.8)
    grid = figure.subplots(len(by_task), panels, squeeze=False)
    reference = join_unique([start.info["Baseline"] for start in starts.values()])
    for cells, axes in zip(by_task.values(), grid, strict=True):
        if panels == 2:
            _bars(axes[0], others, cells, lambda row, c: paired_change(row, starts[row.protocols], c), colors)
            axes[0].axhline(0, color="black", lw=0.8)
            axes[0].set_ylabel(f"change from {reference} (points)", fontsize=8)
        _bars(axes[-1], rows, cells, lambda row, c: row.estimates[c.key], colors)
        axes[-1].set_ylabel("value (%)", fontsize=8)
        axes[-1].set_ylim(0, 100)
        labels = [
            f"{c.header}\n({canvases[c.key[1]]} tokens)" if canvases.get(c.key[1], c.key[1]) != c.key[1] else c.header
            for c in cells
        ]
        for ax in axes:
            ax.set_xticks(np.arange(len(cells)), labels, fontsize=8)
            ax.tick_params(axis="y", labelsize=8)
    if panels == 2:
        grid[0][0].set_title("Change from the start, paired by test item", fontsize=9)
    grid[0][-1].set_title("Value of each row", fontsize=9)
    handles, names = grid[0][-1].get_legend_handles_labels()
    figure.legend(handles, names, loc="center left", bbox_to_anchor=(0.88, 0.5), fontsize="small", frameon=False)
    figure.suptitle(f"{title}\n{_metric_text(shown)}; bars: mean, whiskers: 95% bootstrap interval", fontsize=9)
    save_png(figure, path, dpi=100, rect=(0, 0, 0.88, 1))


@dataclass
class Block:
    """One measured block: a comparison's rows under exact or approximate decoding, and its comparisons over runs."""

    comparison: str
    approximate: bool
    group: pd.DataFrame
    columns: list[Column]
    rows: list[MeasuredRow]
    found: list[Finding]

    @property
    def label(self) -> str:
        return self.comparison + (" (approximate decoding)" if self.approximate else "")


def measured_blocks(table: str, frame: pd.DataFrame, records: list[dict[str, Any]]) -> list[Block]:
    """The measured blocks of ``table`` (greedy records): exact and approximate decoding never share one."""
    subset = frame[(frame["table"] == table) & ~frame["sampled"]]
    blocks = []
    for (comparison, approximate), group in subset.groupby(["comparison", "approximate"], sort=True):
        columns = table_columns(table, set(group["task"]))
        rows = measured_rows(group, records, columns)
        label = comparison + (" (approximate decoding)" if approximate else "")
        found = measured_findings(label, rows, starting_points(rows), columns)
        blocks.append(Block(comparison, bool(approximate), group, columns, rows, found))
    return blocks


def findings(results_dir: Path | str) -> list[Finding]:
    """Every comparison over runs the leaderboard of ``results_dir`` reports (each RL row against its start, the
    frozen control and every other row; the sampled decoding's changes), with its verdict: what the platform study
    compares between platforms."""
    results_dir = Path(results_dir)
    records = load_results(results_dir)
    frame = records_frame(records)
    check_consistency(frame)
    found: list[Finding] = []
    for table in SHOWN_TABLES:
        blocks = measured_blocks(table, frame, records)
        found += [finding for block in blocks for finding in block.found]
        found += [
            f
            for comparison in sorted({b.comparison for b in blocks})
            for f in training_findings(results_dir, comparison, partial(shows, table))
        ]
        found += sampled_blocks(table, frame, records, None, Path("."))[1]
    return found


def _measured_blocks(
    results_dir: Path,
    table: str,
    frame: pd.DataFrame,
    records: list[dict[str, Any]],
    plots_dir: Path | None,
    markdown_dir: Path,
) -> str:
    sampled, sampled_found = sampled_blocks(table, frame, records, plots_dir, markdown_dir)
    checks = platform_checks(results_dir)
    for comparison in sorted({finding.comparison for finding in sampled_found}):
        ours = [finding for finding in sampled_found if finding.comparison == comparison]
        sampled += "\n" + verdict_list(ours, f"{comparison}, sampled decoding", checks)
    blocks = measured_blocks(table, frame, records)
    if not blocks:
        return sampled or "**Measured by this code**: no results for this table yet.\n"
    texts, trained = [], set()
    for block in blocks:
        comparison, rows, columns, group = block.comparison, block.rows, block.columns, block.group
        display = pd.DataFrame(
            [row.info | {c.header: _format_measured(row.estimates[c.key]) for c in columns} for row in rows]
        )
        text = _caption(comparison, table, group, block.approximate) + "\n" + markdown_table(display)
        change = _change_block(rows, columns, block.found)
        if change:
            text += "\n" + change
        found = list(block.found)
        if comparison not in trained:  # once per comparison
            shown = partial(shows, table)
            training = training_block(results_dir, comparison, markdown_dir if plots_dir is not None else None, shown)
            if training:
                text += "\n" + training
                found += training_findings(results_dir, comparison, shown)
        trained.add(comparison)
        if plots_dir is not None:
            name = slugify(comparison, 80) + ("__approximate" if block.approximate else "")
            plot_path = Path(plots_dir) / f"{table}__{name}.png"
            title = f"{TABLE_TITLES[table]}: {block.label}"
            canvases = (
                dict(zip(group["length"], group["max_completion_length"], strict=True))
                if table in LENGTH_TABLES
                else {}
            )
            _plot(plot_path, title, rows, columns, canvases)
            text += f"\n![{table} {comparison}]({_link(plot_path, markdown_dir)})\n"
            starts = starting_points(rows)
            profiles = profiles_plot(
                plot_path.with_name(f"{plot_path.stem}__profiles.png"),
                title,
                starts,
                compared_rows(rows, starts),
                task_groups(columns, rows),
            )
            if profiles is not None:
                text += f"\n![{table} {comparison} profiles]({_link(profiles, markdown_dir)})\n"
        listing = verdict_list(found, block.label, checks)
        if listing:
            text += "\n" + listing
        texts.append(text)
    return "\n".join([*texts, sampled] if sampled else texts)


def _link(path: Path, markdown_dir: Path) -> str:
    return Path(os.path.relpath(path.resolve(), markdown_dir.resolve())).as_posix()


# -------------------------------------------------------------------------------------------- markdown
HEADER = """# stabledrl-bench leaderboard

Generated from the result files in `{results_dir}`; do not edit by hand. Regenerate with:

    python -m stabledrl_bench leaderboard

Two kinds of numbers appear here, always in separate blocks:

* **Measured by this code**: evaluations run with this harness and stored as result files. Each cell is accuracy (%)
  with a percentile-bootstrap 95% interval over per-sample correctness ({n_resamples} resamples, fixed seed), e.g.
  `62.5 [55.1, 69.9]`. Measured rows are grouped by comparison; all RL rows of one comparison were trained under one
  budget (its hash is shown); reference rows (`base`, `sft`) are exempt. Model, preset, hardware, code (the git
  commit, `dirty` when uncommitted changes were present) and seeds are listed per row; `python -m stabledrl_bench
  verify` re-checks every record against its samples, grader and weights. Average columns are unweighted means
  over their cells. Where a comparison has a starting point (`sft`, else `base`), a second table gives each RL
  row's change from it in percentage points, paired by test item. Results decoded approximately (Fast-dLLM's
  cache / parallel decoding / EOS stop: protocols such as `d1-fast`) get their own block, titled APPROXIMATE
  DECODING, never the exact-decoding block of their comparison.
* **Published (not measured here)**: numbers copied from papers, each marked with its source grade: P = the paper's
  own text or table, C = the authors' code, S = a third-party note quoting the paper (not checked against it),
  D = derived by arithmetic from P or S numbers. Unreliable (U) values are never shown. Published numbers come from
  other hardware, checkpoints and protocol details; read the notes under each block before comparing.

Missing cells are shown as `{missing}`.
"""


def build_leaderboard(
    results_dir: Path | str,
    published: Mapping[str, Any] | Path | str | None = None,
    plots_dir: Path | str | None = None,
    extra_sections: Sequence[ExtraSection] = (),
    markdown_dir: Path | str | None = None,
) -> str:
    """The leaderboard markdown for ``results_dir``.

    ``published``: mapping, YAML path, or ``None`` for the packaged ``published.yaml``. ``plots_dir``: when given, a
    PNG bar chart per comparison is written there and linked relative to ``markdown_dir`` (the folder the markdown
    will live in; default: the current directory). ``extra_sections``: see the module docstring.
    """
    results_dir = Path(results_dir)
    tables = load_published(published)
    records = load_results(results_dir)
    frame = records_frame(records)
    check_consistency(frame)
    plots = None if plots_dir is None else Path(plots_dir)
    parts = [HEADER.format(results_dir=results_dir.as_posix(), n_resamples=N_RESAMPLES, missing=MISSING)]
    for table in SHOWN_TABLES:
        measured = _measured_blocks(results_dir, table, frame, records, plots, Path(markdown_dir or "."))
        published = published_block(table, tables.get(table, EMPTY_BLOCK))
        parts.append(f"## {TABLE_TITLES[table]}\n\n{measured}\n{published}")
    for section in extra_sections:
        text = section(results_dir)
        if text and text.strip():
            parts.append(text.strip() + "\n")
    return "\n".join(parts)


def write_leaderboard(
    results_dir: Path | str,
    out_path: Path | str,
    *,
    published: Mapping[str, Any] | Path | str | None = None,
    plots_dir: Path | str | None = None,
    extra_sections: Sequence[ExtraSection] = (),
) -> Path:
    """Build the leaderboard and replace ``out_path`` atomically (plots are linked relative to it)."""
    out_path = Path(out_path)
    text = build_leaderboard(results_dir, published, plots_dir, extra_sections, markdown_dir=out_path.parent)
    atomic_write_text(out_path, text)
    return out_path
