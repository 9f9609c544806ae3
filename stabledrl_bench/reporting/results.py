"""Evaluation result records: one JSON per evaluation plus its per-sample JSONL, written atomically.

Layout on disk (``results_dir`` is e.g. ``results/``)::

    results/<comparison>/<table>__<preset>__<baseline>__<task>__L<length>[_<sampling>]__<protocol>__s<seed>__<model>-<hash>.json
    results/<comparison>/<same stem>.samples.jsonl
    results/stability/...            (other writers; ignored by :func:`load_results`)

The JSON holds everything about the evaluation except the per-sample rows, which live in the JSONL beside it
(``doc_id, prompt, completion, correct, score, extracted, details``). The JSON references the JSONL by name and by
sha256, so a JSON can never silently describe samples that were overwritten later. Both files are written with
:func:`~stabledrl_bench.atomic.atomic_write_text` (temporary file in the same directory, ``fsync``,
``os.replace``), JSONL first and an old JSON removed before that; the JSONL is removed again when the JSON cannot be
written. So an interrupted run leaves a complete result or none (a JSONL left without its JSON by a killed process
counts as "not done" and is overwritten by the rerun).

The record's fields and the rules they follow are those of :mod:`.schema`.

Loaded records carry one extra key, ``_path`` (the JSON file), which :func:`load_samples` uses.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.config import parse_json
from stabledrl_bench.errors import UserError
from stabledrl_bench.reporting.identity import identity_problems
from stabledrl_bench.reporting.naming import result_path, samples_path
from stabledrl_bench.reporting.provenance import environment_info
from stabledrl_bench.reporting.schema import (
    SCHEMA,
    budget_hash,
    check_registered,
    upgraded,
    validate_record,
    validate_samples,
)

STABILITY_DIR = "stability"  # the stress tests' records: another schema, their own leaderboard section
PLATFORMS_DIR = "platforms"  # the platform study's runs of a comparison under other kernels, and its report
STARTS_SUBDIR = "starts"  # committed SFT warm starts (experiments/starts.py): models, not records


def record_paths(root: Path) -> list[Path]:
    """Every result record's path under ``root`` (sorted), outside the folders that hold other things: the stress
    tests' records, the platform study's (whose platforms are folders of records of their own) and the committed
    warm starts."""
    skipped = [root / STABILITY_DIR, root / PLATFORMS_DIR, root / STARTS_SUBDIR]
    return sorted(path for path in root.rglob("*.json") if not any(folder in path.parents for folder in skipped))


# ------------------------------------------------------------------------------------------- records
def stamped(record: Mapping[str, Any], schema: str) -> dict[str, Any]:
    """``record`` with its bookkeeping filled in where absent: ``schema``, ``created`` (now, UTC) and
    ``environment`` (:func:`~.provenance.environment_info`). Every record this package writes goes through here."""
    full = {"schema": schema, **record}
    full.setdefault("created", datetime.now(timezone.utc).isoformat(timespec="seconds"))
    full.setdefault("environment", environment_info())
    return full


def plain_json(value: Any) -> Any:
    """Plain JSON data: non-finite floats become null (= not finite / undefined), tuples lists, paths strings."""
    if isinstance(value, Mapping):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_json(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json_record(path: Path | str, schema: str, payload: Mapping[str, Any]) -> Path:
    """Write ``payload`` as a :func:`stamped` record of ``schema`` to ``path`` (atomic, :func:`plain_json`)."""
    path = Path(path)
    atomic_write_text(path, json.dumps(plain_json(stamped(payload, schema)), indent=1, allow_nan=False))
    return path


def read_json_record(path: Path, schema: str) -> dict[str, Any]:
    """A record of ``schema``, or a one-line error naming the file."""
    try:
        record = parse_json(path.read_text(), str(path))
    except OSError as exc:
        raise UserError(f"{path}: unreadable record ({exc})") from exc
    if not isinstance(record, dict) or record.get("schema") != schema:
        found = record.get("schema") if isinstance(record, dict) else type(record).__name__
        raise UserError(f"{path}: schema {found!r}, expected {schema!r}")
    return record


# ------------------------------------------------------------------------------------------- write/read
def _dump_jsonl(rows: Sequence[Mapping[str, Any]], where: str) -> str:
    try:
        return "".join(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n" for row in rows)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: samples are not plain JSON data: {exc}") from exc


def write_result(results_dir: Path | str, record: Mapping[str, Any], samples: Sequence[Mapping[str, Any]]) -> Path:
    """Validate and store one evaluation; returns the JSON path.

    ``record`` may omit the bookkeeping fields, which are filled in: ``schema``, ``kind``, ``sampling`` (null),
    ``budget_hash`` (from ``budget``), ``environment`` (:func:`~.provenance.environment_info`), ``created`` (now, UTC),
    ``samples_file`` and ``samples_sha256``. Given values are checked, never overwritten. ``baseline`` must be a
    registered baseline or ``base``/``sft``. Nothing is written unless the record and samples are valid.
    """
    full = stamped({key: value for key, value in record.items() if not key.startswith("_")}, SCHEMA)
    full.setdefault("kind", "measured")
    full.setdefault("sampling", None)
    if "budget_hash" not in full:
        full["budget_hash"] = None if full.get("budget") is None else budget_hash(full["budget"])
    path = result_path(results_dir, full)
    where = str(path)
    text = _dump_jsonl(samples, where)
    jsonl_path = samples_path(path)
    for key, value in (
        ("samples_file", jsonl_path.name),
        ("samples_sha256", hashlib.sha256(text.encode("utf-8")).hexdigest()),
    ):
        if full.setdefault(key, value) != value:
            raise UserError(f"{where}: '{key}' given as {full[key]!r}, expected {value!r}")
    validate_record(full, where)
    validate_samples(list(samples), full["metrics"], where)
    check_registered(full["baseline"], where)
    try:
        record_text = json.dumps(full, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: record is not plain JSON data: {exc}") from exc
    # Overwriting: drop the old JSON first, so an interruption leaves "not done" instead of an old JSON whose
    # samples were already replaced (the sha256 would catch it, but a rerun is the better outcome).
    path.unlink(missing_ok=True)
    atomic_write_text(jsonl_path, text)
    try:
        atomic_write_text(path, record_text)
    except BaseException:
        jsonl_path.unlink(missing_ok=True)  # no samples file without the record that describes it
        raise
    return path


def read_result(path: Path | str) -> dict[str, Any]:
    """Load and validate one result JSON, in the current schema (:func:`~.schema.upgraded`); ``_path`` is set."""
    path = Path(path)
    try:
        record = parse_json(path.read_text(encoding="utf-8"), f"{path}: unreadable result file")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: unreadable result file: {exc}") from exc
    validate_record(record, str(path))
    record = upgraded(record)
    record["_path"] = str(path)
    return record


def load_results(results_dir: Path | str) -> list[dict[str, Any]]:
    """All result records under ``results_dir`` (recursively, sorted by path), except ``<results_dir>/stability`` and
    ``<results_dir>/platforms`` (:func:`record_paths`).

    Every other ``*.json`` must be a valid record: a corrupt or foreign file is an error, not something to skip,
    because skipping it would silently drop a row from the leaderboard. So is a record whose identity disagrees
    with what else names it (:func:`~.identity.identity_problems`): the board would show it under a label it did
    not earn.
    """
    root = Path(results_dir)
    if not root.is_dir():
        raise UserError(f"results directory {root} does not exist")
    records = [read_result(path) for path in record_paths(root)]
    problems = identity_problems(records)
    if problems:
        path, problem = next(iter(problems.items()))
        raise UserError(f"{path}: {problem[0]} (python -m stabledrl_bench verify lists every such record)")
    return records


def _read_samples_text(record: Mapping[str, Any]) -> tuple[Path, str]:
    if "_path" not in record:
        raise UserError("load_samples needs a record returned by load_results/read_result (no '_path')")
    path = Path(record["_path"]).with_name(record["samples_file"])
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: unreadable samples file: {exc}") from exc
    if hashlib.sha256(data).hexdigest() != record["samples_sha256"]:
        raise UserError(f"{path}: samples file does not match the sha256 recorded in {record['_path']}")
    try:
        return path, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: samples file is not UTF-8: {exc}") from exc


def load_samples(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-sample rows of a loaded record, checked against its sha256, ``n`` and ``accuracy``."""
    path, text = _read_samples_text(record)
    samples = [parse_json(line, f"{path}: corrupt samples file") for line in text.splitlines() if line.strip()]
    validate_samples(samples, record["metrics"], str(path))
    return samples


def result_exists(results_dir: Path | str, key: Mapping[str, Any]) -> bool:
    """True when the evaluation identified by ``key`` (:data:`~.naming.KEY_FIELDS`) is stored completely.

    Lets an interrupted command skip finished evaluations. A JSON whose samples are missing counts as not done;
    a JSON that exists but is corrupt raises (it cannot come from :func:`write_result`, so someone must look).
    """
    path = result_path(results_dir, key)
    if not path.exists():
        return False
    record = read_result(path)
    try:
        _read_samples_text(record)
    except UserError:
        return False
    return True
