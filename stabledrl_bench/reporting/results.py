"""Evaluation result records: one JSON per evaluation plus its per-sample JSONL, written atomically.

Why a strict, versioned record: the leaderboard pools, averages and bootstraps these files without a human in
the loop, so a record that is missing a field, mixes up units (accuracy is a fraction in [0, 1], never a
percentage) or points at the wrong samples must fail loudly with the file name instead of becoming a wrong cell.

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

Record fields (schema ``stabledrl-bench/result/v2``; v1 records are read too, see :func:`upgraded`):

* ``schema``, ``kind`` (``"measured"``), ``preset`` (``tiny``/``smoke``/``paper``/custom), ``comparison`` (runs that
  must share one training budget), ``table`` (``table1`` full attention / ``table2`` block diffusion);
* ``baseline`` (registered baseline name, or ``base``/``sft`` for reference rows), ``task``, ``length`` (the
  protocol's nominal generation length, 128/256/512 in Table 1), ``max_completion_length`` (tokens really
  decoded, e.g. the tiny preset scales 128 -> 40; schema v1 called it ``actual_gen_length``), ``sampling``
  (``static``/``dynamic`` for Table 2 - TraceRL's two decoding modes are two columns there - and ``null`` for
  Table 1), ``protocol``, ``seed``;
* ``model`` (``family, name, checkpoint, parameters``, and in newer records ``weights_sha256`` -- a hash of the
  evaluated weights, :func:`stabledrl_bench.evaluation.native.weights_sha256` -- and ``dtype``), ``budget`` (a
  complete :class:`~stabledrl_bench.training.budget.Budget` as a dict, required for RL rows) and ``budget_hash``
  (:func:`budget_hash` of it), ``settings`` (decode settings);
* ``metrics``: ``accuracy`` = mean of the per-sample ``correct`` flags (checked against the JSONL), ``n`` = number of
  samples, optional ``score_mean, nfe_per_sample, wall_time_s, tokens_per_s, d1_accuracy``, ``pass@k`` and
  ``maj@k`` (k >= 1; protocols that decode each problem several times) and no other name (:data:`METRIC_NAMES`);
* ``environment`` (:func:`~.provenance.environment_info`), ``created`` (ISO 8601), ``samples_file``, ``samples_sha256``.

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
from stabledrl_bench.config import canonical_json, from_dict, parse_json, stable_hash
from stabledrl_bench.errors import UserError
from stabledrl_bench.evaluation.passk import METRIC_PATTERN
from stabledrl_bench.migrations import upgraded_result
from stabledrl_bench.reporting.provenance import environment_info

# Still importable from here only because stabledrl_bench.experiments.stress.report imports it so, and stress/ is
# being refactored separately: once it imports from provenance, this line goes.
from stabledrl_bench.reporting.provenance import hardware_label as hardware_label
from stabledrl_bench.tasks import TASKS

SCHEMA = "stabledrl-bench/result/v2"
REFERENCE_BASELINES = ("base", "sft")
STABILITY_DIR = "stability"
SAMPLES_SUFFIX = ".samples.jsonl"

# Every metric a record may hold: what the evaluators write. A name outside it is a typo or a forgery, and the
# leaderboard would otherwise carry it along silently (verify recomputes the ones the samples determine).
METRIC_NAMES = ("accuracy", "n", "score_mean", "d1_accuracy", "nfe_per_sample", "wall_time_s", "tokens_per_s")
FRACTION_METRICS = ("accuracy", "d1_accuracy")  # plus pass@k and maj@k (METRIC_PATTERN)
# The papers' layouts: the columns their tables (and published.yaml's cells) have. Any other registered task is a
# column of either table once measured, after these and never in Table 1's overall average; its label and note
# come from the Task (stabledrl_bench.tasks.base.Task.label, .note), so a plugin task needs no edit here.
TABLE1_TASKS = ("gsm8k", "math500", "countdown", "sudoku")
TABLE1_LENGTHS = (128, 256, 512)
TABLE2_TASKS = ("math500", "aime24", "gsm8k", "aime25")
TABLE2_OPTIONAL = ("aime25",)  # a paper column shown only when some row has it
SAMPLING_MODES = ("static", "dynamic")
TABLES = ("table1", "table2")

SAMPLE_KEYS = ("doc_id", "prompt", "completion", "correct", "score", "extracted", "details")


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


# ---------------------------------------------------------------------------------------------- hashing
def budget_hash(budget: Mapping[str, Any]) -> str:
    """:func:`~stabledrl_bench.config.stable_hash` of a training budget, the identity every RL row must share."""
    try:
        return stable_hash(budget)
    except UserError as exc:
        raise UserError(f"budget is not plain JSON data: {exc}") from exc


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


# ------------------------------------------------------------------------------------------- validation
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _check(condition: bool, where: str, message: str) -> None:
    if not condition:
        raise UserError(f"{where}: {message}")


class RecordError(ValueError):
    """A field of a record breaks a rule (the message names the field); the loader adds the file name."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise RecordError(message)


def _sha256_hex(value: str | None) -> bool:
    return value is not None and re.fullmatch(r"[0-9a-f]{64}", value) is not None


@dataclass(frozen=True)
class ModelInfo:
    """The evaluated model. ``weights_sha256`` and ``dtype`` are written since the weights hash was introduced;
    older records lack them and are still read."""

    family: str
    name: str
    checkpoint: str | None
    parameters: int | None
    weights_sha256: str | None = None
    dtype: str | None = None

    def __post_init__(self) -> None:
        _require(_nonempty_str(self.name), "'model.name' must be a non-empty string")
        _require(self.checkpoint is None or _nonempty_str(self.checkpoint), "'model.checkpoint' must not be empty")
        _require(self.weights_sha256 is None or _sha256_hex(self.weights_sha256), "'model.weights_sha256' bad")


@dataclass(frozen=True)
class ResultRecord:
    """One evaluation (schema ``stabledrl-bench/result/v2``; the module docstring describes every field).

    Types are checked by :func:`~stabledrl_bench.config.from_dict`, the loader of every typed file of this package;
    the rules that relate fields to each other are checked here.
    """

    schema: str
    kind: str
    preset: str
    comparison: str
    table: str
    baseline: str
    task: str
    length: int
    max_completion_length: int
    sampling: str | None
    protocol: str
    seed: int
    model: ModelInfo
    budget: dict[str, Any] | None
    budget_hash: str | None
    settings: dict[str, Any]
    metrics: dict[str, float | None]
    environment: dict[str, Any]
    created: str
    samples_file: str
    samples_sha256: str

    def __post_init__(self) -> None:
        _require(self.schema == SCHEMA, f"schema is {self.schema!r}, expected {SCHEMA!r}")
        _require(self.kind == "measured", "'kind' must be 'measured'")
        for key in ("preset", "comparison", "baseline", "protocol"):
            _require(_nonempty_str(getattr(self, key)), f"'{key}' must be a non-empty string")
        _require(self.table in TABLES, f"'table' must be one of {', '.join(TABLES)}, got {self.table!r}")
        _require(self.task in TASKS, f"'task' {self.task!r} is not a registered task ({', '.join(TASKS)})")
        for key in ("length", "max_completion_length"):
            _require(getattr(self, key) > 0, f"'{key}' must be a positive integer")
        if self.table == "table1":
            _require(self.length in TABLE1_LENGTHS, f"'length' must be one of {TABLE1_LENGTHS} in table1")
            _require(self.sampling is None, "'sampling' must be null in table1")
        else:
            _require(self.sampling in SAMPLING_MODES, f"'sampling' must be one of {SAMPLING_MODES} in table2")
        if self.budget is None:
            _require(self.budget_hash is None, "'budget_hash' given without a 'budget'")
            _require(
                self.baseline in REFERENCE_BASELINES,
                f"RL baseline {self.baseline!r} needs a 'budget' (only base/sft rows may omit it)",
            )
        else:
            _require(self.budget_hash == budget_hash(self.budget), f"'budget_hash' {self.budget_hash!r} does not match")
            _check_budget(self.budget)
        self._check_metrics()
        try:
            datetime.fromisoformat(self.created)
        except ValueError:
            raise RecordError("'created' must be an ISO 8601 time") from None
        name = self.samples_file
        _require(
            Path(name).name == name and name.endswith(SAMPLES_SUFFIX),
            f"'samples_file' must be a plain file name ending in {SAMPLES_SUFFIX}",
        )
        _require(_sha256_hex(self.samples_sha256), "'samples_sha256' must be 64 hex digits")

    def _check_metrics(self) -> None:
        unknown = sorted(m for m in self.metrics if m not in METRIC_NAMES and not METRIC_PATTERN.fullmatch(m))
        known = ", ".join((*METRIC_NAMES, "pass@k", "maj@k"))
        _require(not unknown, f"unknown metric(s) {', '.join(unknown)}; known: {known}")
        _require(self.metrics.get("accuracy") is not None, "'metrics.accuracy' must be a fraction in [0, 1]")
        n = self.metrics.get("n")
        _require(n is not None and n == int(n) and n > 0, "'metrics.n' must be a positive integer")
        repeats = self.settings.get("protocol", {}).get("repeats", 1)
        for name, value in self.metrics.items():
            _require(value is None or math.isfinite(value), f"'metrics.{name}' must be a finite number or null")
            sampled = METRIC_PATTERN.fullmatch(name)
            in_range = value is None or 0.0 <= value <= 1.0
            _require(
                in_range or not (sampled or name in FRACTION_METRICS), f"'metrics.{name}' must be a fraction in [0, 1]"
            )
            if sampled:  # pass@k / maj@k exist only for a protocol that decoded every problem at least k (>= 2) times
                least = max(2, int(sampled[2]))
                _require(
                    isinstance(repeats, int) and repeats >= least,
                    f"'metrics.{name}' needs {least}+ decodes per problem; settings.protocol.repeats is {repeats}",
                )


def _check_budget(budget: Mapping[str, Any]) -> None:
    """A record's budget must be one the trainer could have run (every field, no other, each in range): the
    leaderboard groups rows by it, so a made-up budget would put a row beside runs it never matched."""
    from stabledrl_bench.training.budget import Budget

    try:
        from_dict(Budget, dict(budget), where="'budget'")
    except UserError as exc:
        raise RecordError(str(exc)) from None


def upgraded(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` in the current schema (:func:`stabledrl_bench.migrations.upgraded_result`)."""
    return upgraded_result(record, SCHEMA)


def validate_record(record: Mapping[str, Any], where: str) -> ResultRecord:
    """The typed record, or :class:`UserError` (prefixed with ``where``, usually the file) if ``record`` is invalid.

    Keys starting with ``_`` are in-memory annotations of a loaded record (``_path``) and are ignored.
    """
    _check(isinstance(record, Mapping), where, "a result record must be a JSON object")
    data = {key: value for key, value in upgraded(record).items() if not key.startswith("_")}
    try:
        return from_dict(ResultRecord, data, where=where)
    except RecordError as exc:
        raise UserError(f"{where}: {exc}") from None


def _validate_samples(samples: Sequence[Any], metrics: Mapping[str, Any], where: str) -> None:
    """Per-sample rows must be complete and agree with the summary: ``n`` rows, ``accuracy = mean(correct)``."""
    for index, sample in enumerate(samples):
        at = f"{where}: sample {index}"
        _check(isinstance(sample, dict), at, "must be an object")
        _check(sorted(sample) == sorted(SAMPLE_KEYS), at, f"must have exactly the keys {', '.join(SAMPLE_KEYS)}")
        _check(isinstance(sample["doc_id"], (int, str)) and not isinstance(sample["doc_id"], bool), at, "bad doc_id")
        _check(isinstance(sample["prompt"], str) and isinstance(sample["completion"], str), at, "texts must be str")
        _check(isinstance(sample["correct"], bool), at, "'correct' must be true/false")
        _check(sample["score"] is None or _is_number(sample["score"]), at, "'score' must be a number or null")
        _check(sample["extracted"] is None or isinstance(sample["extracted"], str), at, "'extracted' must be str")
        _check(isinstance(sample["details"], dict), at, "'details' must be an object")
    _check(len(samples) == metrics["n"], where, f"{len(samples)} samples but metrics.n = {metrics['n']}")
    mean_correct = sum(sample["correct"] for sample in samples) / len(samples)
    _check(
        math.isclose(mean_correct, metrics["accuracy"], rel_tol=0.0, abs_tol=1e-9),
        where,
        f"metrics.accuracy = {metrics['accuracy']} but the samples give {mean_correct}",
    )


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
        _check(full.setdefault(key, value) == value, where, f"'{key}' given as {full[key]!r}, expected {value!r}")
    validate_record(full, where)
    _validate_samples(list(samples), full["metrics"], where)
    _check_registered(full["baseline"], where)
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


def _check_registered(baseline: str, where: str) -> None:
    """Results are only meaningful for methods the harness can name again; imported lazily (torch)."""
    if baseline in REFERENCE_BASELINES:
        return
    from stabledrl_bench.core.baseline import BASELINES

    names = BASELINES.entries()
    _check(baseline in names, where, f"baseline {baseline!r} is not registered (known: {', '.join(names) or 'none'})")


def read_result(path: Path | str) -> dict[str, Any]:
    """Load and validate one result JSON, in the current schema (:func:`upgraded`); ``_path`` is set."""
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
    _validate_samples(samples, record["metrics"], str(path))
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
