"""Markdown pieces every report shares: the table writer, the missing-cell mark and the tasks' display names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from stabledrl_bench.tasks import TASKS

MISSING = "–"


def task_label(name: str) -> str:
    """A task's column label (:meth:`Task.column_label`), or its name when it is not installed here."""
    task = TASKS.entries().get(name)
    return name if task is None else task.column_label()


def markdown_rows(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table (no extra dependency such as ``tabulate``), without a final newline; a ``|`` inside
    a cell is escaped."""

    def line(values: Sequence[Any]) -> str:
        return "| " + " | ".join(str(value).replace("|", "\\|") for value in values) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(row) for row in rows)])


def markdown_table(frame: pd.DataFrame) -> str:
    """:func:`markdown_rows` of a frame of strings, ending in a newline."""
    return markdown_rows(list(frame.columns), list(frame.to_numpy())) + "\n"
