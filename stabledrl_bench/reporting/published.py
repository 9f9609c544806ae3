"""Published numbers (``published.yaml``): loaded, validated as strictly as measured records, and shown in their own
block, each cell ``value (grade)`` with its source. Never mixed with a measured cell."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from stabledrl_bench.errors import UserError
from stabledrl_bench.reporting.layout import (
    AVG,
    CODE,
    CODE_TASKS,
    OVERALL,
    SHOWN_TABLES,
    TABLE1_TASKS,
    TABLE2_TASKS,
    Column,
    table_columns,
)
from stabledrl_bench.reporting.markdown import MISSING, markdown_table
from stabledrl_bench.reporting.schema import SAMPLING_MODES, TABLE1_LENGTHS

PUBLISHED_SCHEMA = "stabledrl-bench/published/v1"
DISPLAY_GRADES = ("P", "C", "S", "D")  # grade U (unreliable) is never shown
# Which checkpoint a published row reports, as its source says (a row's ``statistic``), and how the board shows it.
# Measured rows are ``final`` unless a comparison selects its best checkpoints too (on validation docs, never the
# test set the papers pick theirs on).
STATISTICS = {
    "start": "start (no RL)",
    "best-average": "best checkpoint, best mean over the lengths",
    "best-per-length": "best checkpoint per length",
    "unstated": "not stated",
    "released": "released model (not trained by the source)",
}
EMPTY_BLOCK: dict[str, Any] = {"title": "", "notes": [], "rows": []}
ROUNDING = 0.05 + 1e-9  # a mean stored to one decimal, as the sources print theirs (plus float slack)


def _published_cell(cell: Any, where: str) -> None:
    if not isinstance(cell, Mapping) or sorted(cell) != ["grade", "source", "value"]:
        raise UserError(f"{where}: a published cell needs exactly value, grade, source")
    if cell["grade"] == "U":
        raise UserError(f"{where}: grade-U (unreliable) numbers must never be shown")
    if cell["grade"] not in DISPLAY_GRADES:
        raise UserError(f"{where}: grade {cell['grade']!r} is not one of {', '.join(DISPLAY_GRADES)}")
    value = cell["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise UserError(f"{where}: value must be a percentage in [0, 100], got {value!r}")
    if not isinstance(cell["source"], str) or not cell["source"].strip():
        raise UserError(f"{where}: source must be a non-empty string")


def _validate_published(data: Any, where: str) -> None:
    """Published numbers are hand-entered, so their shape is checked as strictly as measured records."""
    if not isinstance(data, Mapping) or data.get("schema") != PUBLISHED_SCHEMA:
        raise UserError(f"{where}: expected a mapping with schema {PUBLISHED_SCHEMA!r}")
    unknown = sorted(set(data) - {"schema", *SHOWN_TABLES})
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}")
    allowed = {
        "table1": (TABLE1_TASKS, (*TABLE1_LENGTHS, AVG)),
        "table2": (TABLE2_TASKS, SAMPLING_MODES),
        CODE: (CODE_TASKS, (*TABLE1_LENGTHS, AVG)),
    }
    for table in SHOWN_TABLES:
        block = data.get(table, EMPTY_BLOCK)
        at = f"{where}: {table}"
        if not isinstance(block, Mapping) or sorted(block) != ["notes", "rows", "title"]:
            raise UserError(f"{at}: needs exactly title, notes, rows")
        if not isinstance(block["notes"], list) or not all(isinstance(note, str) for note in block["notes"]):
            raise UserError(f"{at}: notes must be a list of strings")
        if not isinstance(block["rows"], list):
            raise UserError(f"{at}: rows must be a list")
        tasks, subs = allowed[table]
        for row in block["rows"]:
            if not isinstance(row, Mapping) or sorted(row) != ["cells", "label", "statistic"]:
                raise UserError(f"{at}: every row needs exactly label, statistic and cells")
            if not isinstance(row["cells"], dict):
                raise UserError(f"{at}: {row['label']}: cells must be a mapping")
            if row["statistic"] not in STATISTICS:
                raise UserError(f"{at}: {row['label']}: statistic must be one of {', '.join(STATISTICS)}")
            for task, cells in row["cells"].items():
                at_row = f"{at}: {row['label']}: {task}"
                if table == "table1" and task == OVERALL:
                    _published_cell(cells, at_row)
                    continue
                if task not in tasks or not isinstance(cells, Mapping):
                    raise UserError(f"{at_row}: not a column group of {table}")
                for sub, cell in cells.items():
                    if sub not in subs:
                        raise UserError(f"{at_row}: {sub!r} is not one of {subs}")
                    _published_cell(cell, f"{at_row} {sub}")
                if AVG in cells and cells[AVG]["grade"] == "D":
                    _derived_average(cells, at_row)


def _derived_average(cells: Mapping[Any, Mapping[str, Any]], where: str) -> None:
    """A grade-D average is arithmetic on the row's own length cells, so it is recomputed here: a hand-entered
    mean that disagrees with its cells (beyond the one-decimal rounding of the sources) is a typo, not a number."""
    lengths = [cells[length]["value"] for length in TABLE1_LENGTHS if length in cells]
    if len(lengths) != len(TABLE1_LENGTHS):
        raise UserError(f"{where} avg: a grade-D average needs every length's cell ({TABLE1_LENGTHS})")
    mean = sum(lengths) / len(lengths)
    if abs(cells[AVG]["value"] - mean) > ROUNDING:
        raise UserError(f"{where} avg: {cells[AVG]['value']} is not the mean of its lengths, {mean:.2f}")


def load_published(source: Mapping[str, Any] | Path | str | None = None) -> dict[str, Any]:
    """Validated published numbers: the packaged ``published.yaml`` by default, or a path, or a mapping."""
    if isinstance(source, Mapping):
        data, where = dict(source), "published data"
    else:
        if source is None:
            text, where = (
                resources.files("stabledrl_bench.reporting").joinpath("published.yaml").read_text("utf-8"),
                "published.yaml",
            )
        else:
            path = Path(source)
            where = str(path)
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise UserError(f"{path}: cannot read published numbers: {exc}") from exc
        try:
            data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # C loader when built
        except yaml.YAMLError as exc:
            raise UserError(f"{where}: invalid YAML: {' '.join(str(exc).split())}") from exc
    _validate_published(data, where)
    return data


def _published_cell_text(row: Mapping[str, Any], column: Column) -> str:
    task, sub = column.key
    cell = row["cells"].get(task) if task == OVERALL else row["cells"].get(task, {}).get(sub)
    return MISSING if cell is None else f"{cell['value']:.1f} ({cell['grade']})"


def _published_sources(row: Mapping[str, Any]) -> str:
    """The row's distinct cell sources, in cell order: the "Source" column."""
    cells = [cell for task, group in row["cells"].items() for cell in ([group] if task == OVERALL else group.values())]
    return "; ".join(dict.fromkeys(cell["source"] for cell in cells))


def published_block(table: str, block: Mapping[str, Any]) -> str:
    if not block["rows"]:
        return "**Published (not measured here)**: none.\n"
    columns = table_columns(table, {task for row in block["rows"] for task in row["cells"]})
    frame = pd.DataFrame(
        [
            {"Model": row["label"], "Checkpoint": STATISTICS[row["statistic"]]}
            | {c.header: _published_cell_text(row, c) for c in columns}
            | {"Source": _published_sources(row)}
            for row in block["rows"]
        ]
    )
    notes = "".join(f"- {' '.join(note.split())}\n" for note in block["notes"])
    return (
        f"**Published (not measured here)** — {block['title']}. Each cell is `value (grade)`.\n\n"
        f"{markdown_table(frame)}\nNotes:\n\n{notes}"
    )
