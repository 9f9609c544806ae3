"""What a comparison's training runs resolve, and what they do not: the leaderboard's blocks over runs.

Why: the tables above these blocks pool a row's seeds and give intervals over test items. Those look tight and do
not cover what decides a verdict at a small budget: another seed, or another kind of CPU (which rounds differently
and so acts like another seed), moves a method's change from its start by more than the items do. Every comparison
the page reports is therefore also given over runs (:mod:`.runlevel`): the training seeds resampled, then the items
within each, with the number of runs shown, and a verdict only where that interval excludes 0.

* :func:`run_change_table`: each RL row's change from the same seed's start, per column ("above" / "below" its
  start, else "not resolved").
* :func:`pairwise_table`: every method against every other, per task (mean over its lengths): the difference, paired
  by seed and item, with rliable's probability of improvement beside it ("better" / "worse" than the column).
* :func:`aggregate_table`: per task, the interquartile mean of the runs' changes and P(run > start).
* :func:`profiles_plot`: the distribution of the runs' changes (a performance profile per method), as a PNG.
* :func:`verdict_list`: the verdicts that are resolved, in words; :func:`findings` gives the same as values for
  every comparison of a results folder (the platform study compares them between platforms). Where a committed
  platform study (:func:`platform_checks`) measured the same runs, each verdict says whether it kept its sign under
  the study's other kernels: a verdict that does not is a draw of this machine's rounding.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from stabledrl_bench.errors import UserError
from stabledrl_bench.plots import new_figure, save_png
from stabledrl_bench.reporting.layout import Column
from stabledrl_bench.reporting.markdown import MISSING, markdown_table, task_label
from stabledrl_bench.reporting.measured import MeasuredRow, compared_rows, run_change, run_scores, shared_seeds
from stabledrl_bench.reporting.runlevel import MIN_RUNS, NOT_RESOLVED, RunInterval, improvement_interval, iqm_interval

ABOVE, BELOW = "above", "below"  # a row against its start, a run against the frozen control
BETTER, WORSE = "better", "worse"  # a method against another
START, CONTROL = "its start", "the frozen control"


@dataclass(frozen=True)
class Finding:
    """One comparison over runs: ``subject`` against ``other`` (:data:`START`, :data:`CONTROL` or another method) in
    ``column`` of ``comparison``'s ``block``, with its run-level interval (fractions, or rewards for the control)."""

    comparison: str
    block: str
    subject: str
    other: str
    column: str
    interval: RunInterval

    @property
    def verdict(self) -> str:
        """``above`` / ``below`` (against a start or the control), ``better`` / ``worse`` (against a method), or
        :data:`~.runlevel.NOT_RESOLVED`."""
        if self.other in (START, CONTROL):
            return self.interval.verdict(ABOVE, BELOW)
        return self.interval.verdict(BETTER, WORSE)

    @property
    def resolved(self) -> bool:
        return self.verdict != NOT_RESOLVED

    def sentence(self) -> str:
        """``trado is above its start in Sudoku 128: +41.7 [+0.9, +90.0] points over 3 runs``."""
        points = self.block != "training reward"
        spec, scale, unit = ("+.1f", 100.0, " points") if points else ("+.3f", 1.0, "")
        relation = f"{self.verdict} {self.other}" if self.other in (START, CONTROL) else f"{self.verdict} than"
        other = "" if self.other in (START, CONTROL) else f" {self.other}"
        return (
            f"{self.subject} is {relation}{other} in {self.column}: {self.interval.text(spec, scale)}{unit} over "
            f"{self.interval.runs} runs"
        )


def task_groups(columns: Sequence[Column], rows: Sequence[MeasuredRow]) -> list[Column]:
    """One column per task over the cells of it that ``rows`` measured (Table 1: its lengths; Table 2: static and
    dynamic): what the method-against-method and aggregate tables compare, so that a task's lengths are the cells of
    its runs. A task no row measured has none."""
    parts: dict[str, list] = {}
    for column in columns:
        if len(column.parts) == 1 and any(_measured(row, column.parts[0]) for row in rows):
            parts.setdefault(column.key[0], []).append(column.parts[0])
    return [Column((task, "runs"), task_label(task), tuple(cells)) for task, cells in parts.items()]


def _measured(row: MeasuredRow, part: tuple) -> bool:
    return any(part in cells for cells in row.per_seed.values())


def _has(row: MeasuredRow, column: Column) -> bool:
    return all(_measured(row, part) for part in column.parts)


# ------------------------------------------------------------------------------------------------ change from start
def change_findings(
    comparison: str, starts: Mapping[str, MeasuredRow], others: Sequence[MeasuredRow], columns: Sequence[Column]
) -> list[Finding]:
    """Every RL row against its start, in every column both measured."""
    found = []
    for row in others:
        for column in columns:
            change = run_change(row, starts[row.protocols], column)
            if change is not None:
                found.append(Finding(comparison, "change from the start", _name(row), START, column.header, change))
    return found


def _selected(row: MeasuredRow) -> bool:
    """Whether a row is its runs' best checkpoint on validation (compared only with other best checkpoints)."""
    return row.info["Checkpoint"].startswith("best")


def _name(row: MeasuredRow) -> str:
    name = row.info["Baseline"]
    return name if row.info["Checkpoint"] in ("final", "start") else f"{name} ({row.info['Checkpoint']})"


RUNS_COLUMN = (
    "Runs: how many (a range where the row's cells rest on different numbers of seeds; a cell with fewer than the "
    "row's most says how many)."
)


def row_over_runs(findings: Mapping[str, Finding | None]) -> tuple[str, dict[str, str]]:
    """A row's ``Runs`` label and its cells (header -> ``estimate [low, high] verdict``) over runs.

    Why: one row can rest on different numbers of runs in different cells (a method run on five Sudoku seeds and
    three Countdown ones), and a single count beside the row would claim more runs than some cells have. The label
    is then the range (``3-5``), and every cell with fewer runs than the row's most says how many it has."""
    counts = [f.interval.runs for f in findings.values() if f is not None]
    most = max(counts, default=0)
    label = str(most) if len(set(counts)) <= 1 else f"{min(counts)}-{most}"

    def cell(finding: Finding | None) -> str:
        if finding is None:
            return MISSING
        text = finding.interval.cell(ABOVE, BELOW)
        return text if finding.interval.runs == most else f"{text} ({finding.interval.runs} runs)"

    return label, {header: cell(finding) for header, finding in findings.items()}


def run_change_table(
    starts: Mapping[str, MeasuredRow],
    others: Sequence[MeasuredRow],
    columns: Sequence[Column],
    found: Sequence[Finding],
) -> str:
    """Each RL row's change from its start over runs (``found``: :func:`measured_findings`), with its verdict, per
    column."""
    found = {(f.subject, f.column): f for f in found if f.other == START}
    if not found:
        return ""
    rows = []
    for row in others:
        runs, cells = row_over_runs({c.header: found.get((_name(row), c.header)) for c in columns})
        rows.append(
            {"Baseline": row.info["Baseline"], "Checkpoint": row.info["Checkpoint"]}
            | ({"Protocol": row.info["Protocol"]} if len(starts) > 1 else {})
            | {"Runs": runs}
            | cells
        )
    caption = (
        "**Change from the start over runs**: each training seed's change from its own start (a seed repeats warm "
        "start, RL and evaluation), paired by test item, in percentage points, with a two-level bootstrap 95% "
        f"interval that resamples the runs (seeds), then the test items within each drawn run; {RUNS_COLUMN} "
        "`above` / `below`: the row is above / below its start, the interval excludes 0. `not resolved`: the "
        "interval includes 0, so the runs do not tell at this budget (and never from one run).\n"
    )
    return caption + "\n" + markdown_table(pd.DataFrame(rows))


# ------------------------------------------------------------------------------------------------ method vs method
def method_findings(comparison: str, others: Sequence[MeasuredRow], groups: Sequence[Column]) -> list[Finding]:
    """Every ordered pair of RL rows of one protocol family and checkpoint kind (final, or best on validation), per
    task: the row's change over the other, paired by seed and item (both trained from each seed's one start)."""
    found = []
    for ours, theirs in itertools.permutations(others, 2):
        if ours.protocols != theirs.protocols or _selected(ours) != _selected(theirs):
            continue
        for group in groups:
            if _has(ours, group) and _has(theirs, group):
                change = run_change(ours, theirs, group)
                if change is not None:
                    found.append(
                        Finding(comparison, "method against method", _name(ours), _name(theirs), group.header, change)
                    )
    return found


def pairwise_table(others: Sequence[MeasuredRow], groups: Sequence[Column], found: Sequence[Finding]) -> str:
    """Per task, a matrix of every method (row) against every other (column) (``found``: :func:`measured_findings`)."""
    found = {(f.subject, f.other, f.column): f for f in found if f.other not in (START, CONTROL)}
    blocks = []
    for group in groups:
        rows = [row for row in others if _has(row, group)]
        names = [_name(row) for row in rows]
        if len(rows) < 2 or not any(key[2] == group.header for key in found):
            continue
        table = []
        for ours, name in zip(rows, names, strict=True):
            cells = {}
            for theirs, other in zip(rows, names, strict=True):
                finding = found.get((name, other, group.header))
                cells[other] = MISSING if finding is None else _pair_cell(ours, theirs, group, finding)
            table.append({"Baseline": name} | cells)
        blocks.append(f"*{group.header}*\n\n" + markdown_table(pd.DataFrame(table)))
    if not blocks:
        return ""
    caption = (
        "**Method against method over runs**, per task (mean over its cells): the row's score minus the column's, "
        "paired by seed and test item (both start from each seed's one warm start), in percentage points, then in "
        "parentheses P(row > column), the probability of improvement of Agarwal et al. (2021), paired by seed: the "
        "fraction of seeds x cells on which the row's run scores above the column's (ties count half). `better` / "
        "`worse`: the two-level bootstrap 95% interval of the difference excludes 0; `not resolved`: it does not.\n"
    )
    return caption + "\n" + "\n".join(blocks)


def _pair_cell(ours: MeasuredRow, theirs: MeasuredRow, group: Column, finding: Finding) -> str:
    seeds = shared_seeds(ours, theirs, group)
    improvement = improvement_interval(run_scores(ours, group, seeds), run_scores(theirs, group, seeds), paired=True)
    return f"{100 * finding.interval.mean:+.1f} ({improvement.mean:.2f}) {finding.verdict}"


# ------------------------------------------------------------------------------------------------ aggregates
def _changes(row: MeasuredRow, start: MeasuredRow, group: Column) -> np.ndarray | None:
    """Runs x cells: each seed's change from its own start, per cell (None without a shared seed)."""
    seeds = shared_seeds(row, start, group)
    if not seeds:
        return None
    return run_scores(row, group, seeds) - run_scores(start, group, seeds)


def aggregate_table(starts: Mapping[str, MeasuredRow], others: Sequence[MeasuredRow], groups: Sequence[Column]) -> str:
    """Per task: the interquartile mean of the runs' changes from their starts, and P(run > start)."""
    table = []
    for row in others:
        start = starts[row.protocols]
        entry = {"Baseline": _name(row)}
        for group in groups:
            changes = _changes(row, start, group) if _has(row, group) and _has(start, group) else None
            if changes is None:
                entry |= {f"{group.header} IQM change": MISSING, f"{group.header} P(run > start)": MISSING}
                continue
            seeds = shared_seeds(row, start, group)
            improvement = improvement_interval(
                run_scores(row, group, seeds), run_scores(start, group, seeds), paired=True
            )
            entry |= {
                f"{group.header} IQM change": iqm_interval(changes).text("+.1f"),
                f"{group.header} P(run > start)": improvement.text(".2f", scale=1.0),
            }
        table.append(entry)
    if not table:
        return ""
    caption = (
        "**Aggregates over runs** (Agarwal et al. 2021, for few runs), per task over its cells: the interquartile "
        "mean of the runs' changes from their own starts (the middle half of runs x cells, less swayed by one "
        "outlying seed than the mean), in points, and P(run > start), the probability of improvement paired by "
        "seed: the fraction of seeds x cells on which the run beats its own start (ties half; 0.5: no "
        "difference); 95% intervals from the stratified bootstrap (each cell's runs resampled on their own).\n"
    )
    return caption + "\n" + markdown_table(pd.DataFrame(table))


def profiles_plot(
    path: Path, title: str, starts: Mapping[str, MeasuredRow], others: Sequence[MeasuredRow], groups: Sequence[Column]
) -> Path | None:
    """One panel per task: for every method the fraction of its runs x cells whose change from the start exceeds τ,
    against τ (a performance profile of the changes). Curves to the right of another's are better everywhere."""
    panels = []
    for group in groups:
        curves = {}
        for row in others:
            start = starts[row.protocols]
            changes = _changes(row, start, group) if _has(row, group) and _has(start, group) else None
            if changes is not None:
                curves[_name(row)] = 100 * changes.reshape(-1)
        if curves:
            panels.append((group, curves))
    if not panels:
        return None
    figure = new_figure(4.6 * len(panels) + 2.8, 3.8)
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    palette = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
    palette += ("tab:cyan", "tab:gray", "black", "gold", "navy", "lime", "maroon")
    names = list(dict.fromkeys(name for _, curves in panels for name in curves))
    colors = {name: palette[i % len(palette)] for i, name in enumerate(names)}  # one color per method everywhere
    handles = {}
    for ax, (group, curves) in zip(axes, panels, strict=True):
        every = np.concatenate(list(curves.values()))
        taus = np.linspace(min(every.min(), 0.0) - 0.5, max(every.max(), 0.0) + 0.5, 200)
        for name, values in curves.items():
            fraction = [np.mean(values > tau) for tau in taus]
            (handles[name],) = ax.step(taus, fraction, where="post", color=colors[name], label=name, lw=1.2)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("τ: change from the start (points)", fontsize=8)
        ax.set_ylabel("fraction of runs x cells above τ", fontsize=8)
        runs = max(len(values) for values in curves.values()) // len(group.parts)
        ax.set_title(f"{group.header} ({runs} runs x {len(group.parts)} cells)", fontsize=9)
        ax.tick_params(labelsize=8)
    share = 1.0 - 2.6 / (4.6 * len(panels) + 2.8)
    figure.legend(
        [handles[name] for name in names],
        names,
        loc="center left",
        bbox_to_anchor=(share, 0.5),
        fontsize="small",
        frameon=False,
    )
    figure.suptitle(f"{title}\nperformance profiles of the runs' changes from their starts", fontsize=9)
    return save_png(figure, path, dpi=100, rect=(0, 0, share, 1))


# ------------------------------------------------------------------------------------------------ verdicts
@dataclass(frozen=True)
class PlatformCheck:
    """What a platform study says of one comparison: its report, its platforms (the reference first), whether the
    estimate kept its sign on each (None: not measured on every one) and the reference platform's estimate, which
    tells whether the study measured the runs a page shows."""

    report: str
    platforms: tuple[str, ...]
    holds: bool | None
    reference: Mapping[str, float] | None

    def same_runs(self, finding: Finding) -> bool:
        """Whether the study's reference estimate is ``finding``'s: it measured the runs the page shows."""
        ours, theirs = finding.interval, self.reference
        return (
            theirs is not None
            and theirs["runs"] == ours.runs
            and all(abs(theirs[key] - getattr(ours, key)) <= 1e-9 for key in ("mean", "low", "high"))
        )

    def note(self, finding: Finding) -> str:
        """What the study says of ``finding``, to follow its sentence."""
        if not self.same_runs(finding):
            return "; its platform study measured other runs"
        others = ", ".join(self.platforms[1:])
        return f"; same sign under {others}" if self.holds else f"; sign NOT kept under {others}"


def platform_checks(results_dir: Path | str) -> dict[tuple[str, str, str, str, str], PlatformCheck]:
    """Every comparison of the platform studies committed in ``<results>/platforms/`` (``platforms`` command), by
    (comparison, block, subject, other, column)."""
    checks = {}
    for path in sorted((Path(results_dir) / "platforms").glob("*.json")):
        try:
            study = json.loads(path.read_text())
            names = tuple(study["platforms"])
            for row in study["findings"]:
                block, subject, other, column = row["comparison"]
                key = (study["comparison"], block, subject, other, column)
                checks[key] = PlatformCheck(path.with_suffix(".md").as_posix(), names, row["holds"], row[names[0]])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{path}: unreadable platform study ({exc})") from exc
    return checks


def verdict_list(found: Sequence[Finding], comparison: str, checks: Mapping[tuple, PlatformCheck] | None = None) -> str:
    """The resolved verdicts of ``found`` as sentences, each with what a platform study of ``checks`` says of it;
    every other comparison is not resolved at this budget."""
    resolved = [finding for finding in found if finding.resolved]
    counted = len(found)
    if not counted:
        return ""
    checks = checks or {}
    # a method better than another is listed once: its mirror ("worse than") says the same
    listed = [finding for finding in resolved if finding.verdict != WORSE]
    studied = {
        finding: check
        for finding in listed
        if (check := checks.get((finding.comparison, finding.block, finding.subject, finding.other, finding.column)))
        and check.holds is not None  # not measured on every platform: the study says nothing of it
    }
    lines = [
        f"- {finding.sentence()}{studied[finding].note(finding) if finding in studied else ''}" for finding in listed
    ] or ["- none"]
    few = max(finding.interval.runs for finding in found) < MIN_RUNS
    hint = (
        " One run resolves nothing: every seed of `--seeds` is one more run (the tiny preset's committed comparisons "
        "run five, docs/platforms.md)."
        if few
        else ""
    )
    if studied:
        reports = sorted({check.report for check in studied.values()})
        kept = sum(bool(check.holds) and check.same_runs(finding) for finding, check in studied.items())
        who = "Platform studies" if len(reports) > 1 else "A platform study"
        hint += (
            f" {who} ({', '.join(f'`{report}`' for report in reports)})"
            f" ran {len(studied)} of the {len(listed)} listed again under other kernels (emulated, as another kind of"
            f" CPU rounds): {kept} kept their sign there."
        )
    return (
        f"**Verdicts over runs, comparison `{comparison}`**: {len(resolved)} of the {counted} comparisons above are "
        f"resolved (their run-level 95% interval excludes 0); the others are not resolved at this budget.{hint}\n\n"
        + "\n".join(lines)
        + "\n"
    )


def measured_findings(
    comparison: str, rows: Sequence[MeasuredRow], starts: Mapping[str, MeasuredRow], columns: Sequence[Column]
) -> list[Finding]:
    """Every run-level comparison of one block's rows: each RL row against its start (every column) and against
    every other (per task)."""
    others = compared_rows(list(rows), dict(starts))
    return [
        *change_findings(comparison, starts, others, columns),
        *method_findings(comparison, others, task_groups(columns, others)),
    ]
