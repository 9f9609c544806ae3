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
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.config import canonical_json, parse_json
from stabledrl_bench.errors import UserError
from stabledrl_bench.reporting.provenance import environment_info

# Still importable from here only because stabledrl_bench.experiments.stress.report imports it so, and stress/ is
# being refactored separately: once it imports from provenance, this line goes.
from stabledrl_bench.reporting.provenance import hardware_label as hardware_label
from stabledrl_bench.reporting.schema import (
    REFERENCE_BASELINES,
    SAMPLES_SUFFIX,
    SCHEMA,
    budget_hash,
    check_registered,
    upgraded,
    validate_record,
    validate_samples,
)

STABILITY_DIR = "stability"


@dataclass(frozen=True)
class ResultKey:
    """What identifies an evaluation (and therefore its file name, :func:`result_path`); everything else in a
    record describes its outcome. ``length`` is the nominal length (a table column), ``sampling`` Table 2's
    static/dynamic column (None in Table 1), ``model`` the :func:`~stabledrl_bench.evaluation.native.model_record`."""

    comparison: str
    table: str
    preset: str
    baseline: str
    task: str
    length: int
    sampling: str | None
    protocol: str
    seed: int
    model: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in KEY_FIELDS}


KEY_FIELDS = tuple(ResultKey.__dataclass_fields__)


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


# ------------------------------------------------------------------------------------------ file naming
def slugify(value: Any, limit: int = 48) -> str:
    """File-name-safe ``value`` (letters, digits, ``._+-``; no ``__``, which separates name parts), ``limit`` long."""
    slug = re.sub(r"_{2,}", "_", re.sub(r"[^A-Za-z0-9._+-]+", "-", str(value))).strip("-._")
    return slug[:limit] or "x"


def model_short_name(model: Mapping[str, Any]) -> str:
    """Readable model label for file names: the checkpoint's last two path parts, else the model name's last part.

    Two parts because fine-tuned checkpoints are usually ``<run>/<step>`` and the step alone says nothing.
    """
    checkpoint = model.get("checkpoint")
    if checkpoint:
        return "-".join(Path(str(checkpoint)).parts[-2:])
    return str(model["name"]).rstrip("/").split("/")[-1]


def result_path(results_dir: Path | str, key: Mapping[str, Any]) -> Path:
    """Where the result JSON for the evaluation identified by ``key`` (the :data:`KEY_FIELDS`) lives.

    The readable parts can collide after slugging (two checkpoints ``a/final`` in different folders), so a short
    hash of all key fields keeps names unique while staying deterministic for :func:`result_exists`.
    """
    key = {"sampling": None, **key}  # Table 1 keys may leave it out, as write_result allows
    missing = [field for field in KEY_FIELDS if field not in key]
    if missing:
        raise UserError(f"result key is missing field(s): {', '.join(missing)}")
    model = key["model"]
    identity = canonical_json(
        {**{field: key[field] for field in KEY_FIELDS}, "model": [model.get("name"), model.get("checkpoint")]}
    )
    digest = hashlib.sha256(identity.encode("utf-8")).hexdigest()[:8]
    length = f"L{key['length']}" + (f"_{key['sampling']}" if key["sampling"] else "")
    parts = [key["table"], key["preset"], key["baseline"], key["task"], length, key["protocol"], f"s{key['seed']}"]
    stem = "__".join(slugify(part) for part in parts) + f"__{slugify(model_short_name(model))}-{digest}"
    return Path(results_dir) / slugify(key["comparison"], 80) / f"{stem}.json"


def _samples_path(json_path: Path) -> Path:
    return json_path.with_name(json_path.name[: -len(".json")] + SAMPLES_SUFFIX)


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
    samples_path = _samples_path(path)
    for key, value in (
        ("samples_file", samples_path.name),
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
    atomic_write_text(samples_path, text)
    try:
        atomic_write_text(path, record_text)
    except BaseException:
        samples_path.unlink(missing_ok=True)  # no samples file without the record that describes it
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
    """All result records under ``results_dir`` (recursively, sorted by path), except ``<results_dir>/stability``.

    Every other ``*.json`` must be a valid record: a corrupt or foreign file is an error, not something to skip,
    because skipping it would silently drop a row from the leaderboard. So is a record whose identity disagrees
    with what else names it (:func:`identity_problems`): the board would show it under a label it did not earn.
    """
    root = Path(results_dir)
    if not root.is_dir():
        raise UserError(f"results directory {root} does not exist")
    stability = root / STABILITY_DIR
    paths = sorted(path for path in root.rglob("*.json") if stability not in path.parents)
    records = [read_result(path) for path in paths]
    problems = identity_problems(records)
    if problems:
        path, problem = next(iter(problems.items()))
        raise UserError(f"{path}: {problem[0]} (python -m stabledrl_bench verify lists every such record)")
    return records


def identity_problems(records: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Records whose identity (comparison, baseline, task, seed, length, protocol) disagrees with what else names
    them, by path: their file name (derived from every key field when written), the folders of their checkpoint
    path (``runs/<comparison>/<task>/s<seed>/<baseline>/final``, where present), the run's ``job.json`` when the
    run folder is here, and the other records (another seed's record with the very same completions and weights).

    What a relabelling that rewrites all of these consistently cannot be caught by: a record without its
    checkpoint proves its completions and grades, not which run made them (README, ``verify``).
    """
    from stabledrl_bench.core.baseline import BASELINES
    from stabledrl_bench.tasks import TASKS

    methods = {*BASELINES.entries(), *REFERENCE_BASELINES}
    found: dict[str, list[str]] = {}
    seen: dict[tuple, Mapping[str, Any]] = {}
    for record in records:
        path = Path(record["_path"])
        problems = found.setdefault(str(path), [])
        expected = result_path(path.parent.parent, record)
        if (expected.parent.name, expected.name) != (path.parent.name, path.name):
            problems.append(f"its file name is not the one its fields give ({expected.parent.name}/{expected.name})")
        parts = Path(str(record["model"].get("checkpoint") or "")).parts
        named = {part for part in parts if part in methods}
        if record["baseline"] != "base" and named and record["baseline"] not in named:
            problems.append(f"its checkpoint path names {sorted(named)}, not baseline {record['baseline']!r}")
        seeds = {part for part in parts if re.fullmatch(r"s\d+", part)}
        if seeds and f"s{record['seed']}" not in seeds:
            problems.append(f"its checkpoint path names seed {sorted(seeds)}, not s{record['seed']}")
        tasks = {part for part in parts if part in TASKS.entries()}
        if tasks and record["task"] not in tasks:
            problems.append(f"its checkpoint path names task {sorted(tasks)}, not {record['task']!r}")
        problems.extend(_job_problems(record))
        # two seeds' runs never end with the same weights; a weak model may decode the same text from different ones
        same = (record["comparison"], record["baseline"], record["task"], record["length"], record["protocol"])
        twin = seen.setdefault((*same, record["samples_sha256"], record["model"].get("weights_sha256")), record)
        if twin is not record and twin["seed"] != record["seed"]:
            problems.append(
                f"seed {record['seed']} has the very completions and weights of seed {twin['seed']} ({twin['_path']})"
            )
    return {path: problems for path, problems in found.items() if problems}


def _job_problems(record: Mapping[str, Any]) -> list[str]:
    """The training run's ``job.json`` (when the run folder is on this machine) against the record's identity."""
    job = Path(str(record["model"].get("checkpoint") or "")).parent / "job.json"
    if record["baseline"] in REFERENCE_BASELINES or not job.is_file():
        return []
    try:
        config = json.loads(job.read_text())["identity"]["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return [f"its run's {job} is unreadable"]
    fields = {"baseline": config.get("baseline"), "task": config.get("task"), "seed": config.get("seed")}
    return [
        f"its run ({job}) trained {name} {value!r}, the record says {record[name]!r}"
        for name, value in fields.items()
        if value is not None and value != record[name]
    ]


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
    """True when the evaluation identified by ``key`` (:data:`KEY_FIELDS`) is stored completely.

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
