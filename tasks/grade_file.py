"""Grade a JSONL file of completions: the body of ``python -m stabledrl_bench grade``.

Each input line is a JSON object with ``prediction`` (the completion text) and the task's gold fields:
``answer`` (GSM8K: the dataset solution ending in ``#### N``, or N; MATH500/AIME: the final answer, a string or
an integer), ``numbers`` and ``target`` (Countdown), ``puzzle`` and ``solution`` (Sudoku, 16-character
strings, ``0`` = blank). One JSON line is written per input line, in order, with ``correct``, ``score``,
``extracted`` and the grader's ``details`` (``id``/``doc_id`` are copied through when present). A bad line
(invalid JSON, a missing field, a wrong type) gets an ``error`` field and ``null`` verdicts; the other lines
are still graded, so a file is never rejected as a whole.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import IO, Any

from ..atomic import atomic_stream
from ..errors import CommandParser, UserError
from . import get_task
from .base import GradeResult, Task

GRADABLE_TASKS = ("gsm8k", "math500", "aime24", "aime25", "countdown", "sudoku")
# Lines read and graded as one batch: enough to keep every math-verify worker busy, few enough that records are
# written as the file is read.
CHUNK_LINES = 64
_PASSTHROUGH = ("id", "doc_id")


def _error(record: dict[str, Any], message: str) -> dict[str, Any]:
    return {**record, "correct": None, "score": None, "extracted": None, "error": message}


def read_line(raw: bytes, line_number: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The start of one input line's output record and its item to grade; ``None`` with an error record for a
    line that cannot be graded (never raises on bad input)."""
    record: dict[str, Any] = {"line": line_number}
    # utf-8-sig: a byte-order mark (Windows editors write one) is not part of the first line's JSON
    text = raw.decode("utf-8-sig" if line_number == 1 else "utf-8", errors="replace").strip()
    if not text:
        return _error(record, "empty line"), None
    try:
        item = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, too-long integers, too-deep nesting
        return _error(record, f"invalid JSON: {type(exc).__name__}: {str(exc)[:200]}"), None
    if not isinstance(item, dict):
        return _error(record, f"line is a JSON {type(item).__name__}, not an object"), None
    record.update({key: item[key] for key in _PASSTHROUGH if key in item})
    prediction = item.get("prediction")
    if not isinstance(prediction, str):
        missing = "missing field 'prediction'" if "prediction" not in item else "field 'prediction' must be a string"
        return _error(record, missing), None
    return record, item


def grade_lines(task: Task, lines: Sequence[tuple[dict[str, Any], dict[str, Any] | None]]) -> list[dict[str, Any]]:
    """The output records of :func:`read_line` results, in order; the gradable ones are graded as one batch.

    Why a batch: math tasks then check it on every math-verify worker at once. A bad gold field fails the whole
    batch, so such a batch is graded again line by line, and only the bad line gets the error.
    """
    gradable = [(record, item) for record, item in lines if item is not None]
    try:
        grades = task.grade_many([item["prediction"] for _, item in gradable], [item for _, item in gradable])
    except UserError as exc:
        if len(gradable) == 1:
            return [_error(record, str(exc)) if item is not None else record for record, item in lines]
        return [record for one in lines for record in grade_lines(task, [one])]
    verdicts = iter(grades)
    return [_verdict(record, next(verdicts)) if item is not None else record for record, item in lines]


def _verdict(record: dict[str, Any], grade: GradeResult) -> dict[str, Any]:
    return {**record, "correct": grade.correct, "score": grade.score, "extracted": grade.extracted, **grade.details}


def _summary(task: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    graded = [r for r in records if "error" not in r]

    def mean(key: str) -> float | None:
        return sum(float(r[key]) for r in graded) / len(graded) if graded else None

    summary: dict[str, Any] = {
        "task": task,
        "lines": len(records),
        "graded": len(graded),
        "errors": len(records) - len(graded),
        "accuracy": mean("correct"),
        "mean_score": mean("score"),
    }
    if task == "sudoku":
        empty = sum(r["empty_cells"] for r in graded)
        summary["cell_accuracy"] = sum(r["correct_cells"] for r in graded) / empty if empty else None
        summary["exact_match"] = mean("exact_match")
    else:
        summary["accuracy_d1"] = mean("d1")
    if task not in ("countdown", "sudoku"):
        summary["timed_out"] = sum(bool(r["timed_out"]) for r in graded)
    return summary


def grade_file(task: str, input_path: str | Path, output_path: str | Path | None = None) -> dict[str, Any]:
    """Grade every line of ``input_path``; write records to ``output_path`` (stdout if None); return a summary.

    Summary: line/graded/error counts, ``accuracy`` (mean ``correct``), ``mean_score``, plus ``accuracy_d1``
    (math, Countdown), ``timed_out`` (math) or micro-averaged ``cell_accuracy`` and ``exact_match`` (Sudoku).
    """
    if task not in GRADABLE_TASKS:
        raise UserError(f"cannot grade task {task!r}; gradable: {', '.join(GRADABLE_TASKS)}")
    grader = get_task(task)
    source = Path(input_path)
    if source.is_dir():
        raise UserError(f"--input {source} is a directory; give a JSONL file")
    if not source.is_file():
        raise UserError(f"input file not found: {source}")
    if output_path is not None and Path(output_path).exists() and source.resolve() == Path(output_path).resolve():
        raise UserError(f"--output {output_path} is the input file; writing it would erase what is being graded")
    if output_path is not None and not Path(output_path).parent.is_dir():
        raise UserError(f"cannot write {output_path}: no folder {Path(output_path).parent}")
    records = []
    with source.open("rb") as lines, _open_output(output_path) as out:
        numbered = enumerate(lines, start=1)
        while chunk := [read_line(raw, number) for number, raw in islice(numbered, CHUNK_LINES)]:
            for record in grade_lines(grader, chunk):
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                records.append({k: v for k, v in record.items() if k not in ("extracted", "d1_extracted")})
    return _summary(task, records)


@contextmanager
def _open_output(path: str | Path | None) -> Iterator[IO[str]]:
    """The output file, or stdout (left open) when no path is given. The file appears only when every line is
    graded and written: a run that fails part-way (a corrupt line, a full disk) leaves no half-graded file."""
    if path is None:
        yield sys.stdout
        return
    with atomic_stream(path) as handle:
        yield handle


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line body: parse ``--task --input [--output]``, grade, print the summary; return the exit code.

    The summary goes to stderr when the records go to stdout, else to stdout. User errors print one line
    and return 2.
    """
    parser = CommandParser(
        prog="stabledrl-bench grade", description="Grade a JSONL file of completions (one JSON object per line)."
    )
    parser.add_argument("--task", required=True, choices=GRADABLE_TASKS)
    parser.add_argument("--input", required=True, help="JSONL with 'prediction' and the task's gold fields")
    parser.add_argument("--output", help="where to write graded JSONL (default: stdout)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        summary = grade_file(args.task, args.input, args.output)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary), file=sys.stderr if args.output is None else sys.stdout)
    return 0
