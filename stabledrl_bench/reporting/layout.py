"""The tables' layout: which columns Table 1, Table 2 and the coding table have, which table a record is shown in,
what an average column averages, and the notes that say what a column outside the paper's layout measures (the
task's own :attr:`Task.note`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from stabledrl_bench.reporting.markdown import task_label
from stabledrl_bench.reporting.schema import SAMPLING_MODES, TABLE1_LENGTHS
from stabledrl_bench.tasks import TASKS

# The papers' layouts: the columns their tables (and published.yaml's cells) have. Any other registered task is a
# column of either table once measured, after these and never in Table 1's overall average; its label and note
# come from the Task (stabledrl_bench.tasks.base.Task.label, .note), so a plugin task needs no edit here.
TABLE1_TASKS = ("gsm8k", "math500", "countdown", "sudoku")
TABLE2_TASKS = ("math500", "aime24", "gsm8k", "aime25")
TABLE2_OPTIONAL = ("aime25",)  # a paper column shown only when some row has it
# SPG's coding table (arXiv 2510.09541, Table 2): the same full-attention models and lengths as Table 1, on other
# benchmarks. A Table 1 record of one of these tasks is shown there (:func:`shown_table`), never as a Table 1 column.
CODE = "code"
CODE_TASKS = ("humaneval", "mbpp")
PAPER_TASKS = {"table1": TABLE1_TASKS, "table2": TABLE2_TASKS, CODE: CODE_TASKS}
OVERALL = "overall"
AVG = "avg"
TABLE_TITLES = {
    "table1": "Table 1 — full attention (LLaDA layout)",
    "table2": "Table 2 — block diffusion (TraceRL layout)",
    CODE: "Coding — full attention, HumanEval and MBPP (SPG layout)",
}
SHOWN_TABLES = tuple(TABLE_TITLES)  # the leaderboard's tables, in page order
LENGTH_TABLES = ("table1", CODE)  # tables whose columns are generation lengths (Table 2's: sampling modes)
CellKey = tuple[str, int | str]


@dataclass(frozen=True)
class Column:
    """One numeric column: ``key`` addresses published cells, ``parts`` are the measured cells it averages."""

    key: CellKey
    header: str
    parts: tuple[CellKey, ...]


def shown_table(table: str, task: str) -> str:
    """The leaderboard table a record of ``table`` (its ``table`` field) and ``task`` is shown in: its own, except
    Table 1's coding tasks, which have a table of their own as in SPG's paper."""
    return CODE if table == "table1" and task in CODE_TASKS else table


def shows(table: str, task: str) -> bool:
    """Whether the leaderboard's ``table`` shows ``task`` when one comparison has records of several tables: the
    coding table shows Table 1's coding tasks, Table 1 its other tasks, Table 2 all of its own."""
    return shown_table("table1" if table == CODE else table, task) == table


def extra_tasks(table: str, present: Collection[str]) -> list[str]:
    """The measured tasks of ``table`` outside the paper's layout, in registry order (built-ins, then plugins)."""
    return [task for task in TASKS if task in present and task not in PAPER_TASKS[table]]


def _length_columns(tasks: Sequence[str]) -> list[Column]:
    """Per task, one column per generation length and its average over the lengths."""
    columns: list[Column] = []
    for task in tasks:
        cells = tuple((task, length) for length in TABLE1_LENGTHS)
        columns += [Column(cell, f"{task_label(task)} {cell[1]}", (cell,)) for cell in cells]
        columns.append(Column((task, AVG), f"{task_label(task)} avg", cells))
    return columns


def table_columns(table: str, present: Collection[str] = ()) -> list[Column]:
    """Column layout of ``table``: the paper's columns, then every other task in ``present`` (e.g. Table 1's
    generated Countdown / Sudoku sets, or a plugin task), outside Table 1's overall average. Table 2's optional
    paper column (AIME 2025) is shown only when present. The coding table has per-task averages only, as the published
    rows beside it."""
    if table == CODE:
        return _length_columns(CODE_TASKS)
    if table == "table1":
        columns = _length_columns((*TABLE1_TASKS, *extra_tasks(table, present)))
        paper = [column for column in columns if column.key[1] != AVG and column.key[0] in TABLE1_TASKS]
        every = tuple(part for column in paper for part in column.parts)
        return [*columns, Column((OVERALL, ""), "Overall avg", every)]
    tasks = [task for task in TABLE2_TASKS if task not in TABLE2_OPTIONAL or task in present]
    return [
        Column((task, mode), f"{task_label(task)} {mode}", ((task, mode),))
        for task in (*tasks, *extra_tasks(table, present))
        for mode in SAMPLING_MODES
    ]


def extra_notes(table: str, present: Collection[str]) -> list[str]:
    """What each measured column outside the paper's layout is (:attr:`Task.note`), under the table."""
    notes = []
    for task in extra_tasks(table, present):
        note = TASKS.get(task).column_note()
        note = note or (f"{task_label(task)} is not a column of the paper." if table == "table1" else "")
        if note:
            notes.append(note + (" It is not in the overall average." if table == "table1" else ""))
    return notes
