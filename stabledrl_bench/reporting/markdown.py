"""Markdown pieces every report shares: the table writer, the missing-cell mark and the tasks' display names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

MISSING = "–"

TASK_LABELS = {
    "gsm8k": "GSM8K",
    "math500": "MATH500",
    "countdown": "Countdown",
    "sudoku": "Sudoku",
    "sudoku_hard": "Sudoku 12-blank",
    "countdown_large": "Countdown 1024",
    "aime24": "AIME 2024",
    "aime25": "AIME 2025",
}


def markdown_rows(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table (no extra dependency such as ``tabulate``), without a final newline; a ``|`` inside
    a cell is escaped."""

    def line(values: Sequence[Any]) -> str:
        return "| " + " | ".join(str(value).replace("|", "\\|") for value in values) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(row) for row in rows)])


def markdown_table(frame: pd.DataFrame) -> str:
    """:func:`markdown_rows` of a frame of strings, ending in a newline."""
    return markdown_rows(list(frame.columns), list(frame.to_numpy())) + "\n"
