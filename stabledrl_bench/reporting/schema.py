"""The result record's schema: its fields, the rules that relate them, and the checks of its per-sample rows.

Why a strict, versioned record: the leaderboard pools, averages and bootstraps these files without a human in
the loop, so a record that is missing a field, mixes up units (accuracy is a fraction in [0, 1], never a
percentage) or points at the wrong samples must fail loudly with the file name instead of becoming a wrong cell.

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
  complete :class:`~stabledrl_bench.core.budget.Budget` as a dict, required for RL rows) and ``budget_hash``
  (:func:`budget_hash` of it), ``settings`` (decode settings), ``advantage`` (RL rows written since it was added: the
  method's advantage rule and its options, ``{"rule": ..., "options": {...}}``; null for base/sft rows);
* ``metrics``: ``accuracy`` = mean of the per-sample ``correct`` flags (checked against the JSONL), ``n`` = number of
  samples, optional ``score_mean, nfe_per_sample, wall_time_s, tokens_per_s, d1_accuracy``, ``pass@k`` and
  ``maj@k`` (k >= 1; protocols that decode each problem several times) and no other name (:data:`METRIC_NAMES`);
* ``environment`` (:func:`~.provenance.environment_info`), ``created`` (ISO 8601), ``samples_file``, ``samples_sha256``;
* ``selection`` (which checkpoint of the run this is, the statistic a row reports): ``final`` (the last weights;
  what a record without the field means, and the only value of base/sft rows) or ``best`` (the weights with the
  highest validation score over training, :mod:`stabledrl_bench.training.validation`), and for ``best`` its
  ``validation``: the chosen ``step`` and ``score`` with the settings (``every``, ``tasks``, ``lengths``, ``items``,
  ``protocol``).

The per-sample rows (:data:`SAMPLE_KEYS`) live in a JSONL beside the record (:mod:`.results`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from stabledrl_bench.config import from_dict, stable_hash
from stabledrl_bench.core.baseline import BASELINES
from stabledrl_bench.core.budget import Budget
from stabledrl_bench.errors import UserError
from stabledrl_bench.migrations import upgraded_result
from stabledrl_bench.reporting.passk import METRIC_PATTERN
from stabledrl_bench.tasks import TASKS

SCHEMA = "stabledrl-bench/result/v2"
REFERENCE_BASELINES = ("base", "sft")
SAMPLES_SUFFIX = ".samples.jsonl"

# Every metric a record may hold: what the evaluators write. A name outside it is a typo or a forgery, and the
# leaderboard would otherwise carry it along silently (verify recomputes the ones the samples determine).
METRIC_NAMES = ("accuracy", "n", "score_mean", "d1_accuracy", "nfe_per_sample", "wall_time_s", "tokens_per_s")
FRACTION_METRICS = ("accuracy", "d1_accuracy")  # plus pass@k and maj@k (METRIC_PATTERN)
# The papers' two tables, Table 1's lengths and Table 2's decoding modes: what a record's table, length and
# sampling may be (they are the tables' columns too, :mod:`.layout`).
TABLE1_LENGTHS = (128, 256, 512)
SAMPLING_MODES = ("static", "dynamic")
TABLES = ("table1", "table2")

SAMPLE_KEYS = ("doc_id", "prompt", "completion", "correct", "score", "extracted", "details")
# Which checkpoint of a run a record evaluated: its last weights, or the best on the validation docs.
SELECTIONS = ("final", "best")
VALIDATION_KEYS = ("every", "items", "lengths", "protocol", "score", "step", "tasks")


def budget_hash(budget: Mapping[str, Any]) -> str:
    """:func:`~stabledrl_bench.config.stable_hash` of a training budget, the identity every RL row must share."""
    try:
        return stable_hash(budget)
    except UserError as exc:
        raise UserError(f"budget is not plain JSON data: {exc}") from exc


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
    advantage: dict[str, Any] | None = None  # absent from records written before it was recorded
    selection: str = "final"
    validation: dict[str, Any] | None = None

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
        self._check_selection()
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
        if self.advantage is not None:
            _require(
                sorted(self.advantage) == ["options", "rule"]
                and _nonempty_str(self.advantage["rule"])
                and isinstance(self.advantage["options"], dict),
                '\'advantage\' must be {"rule": name, "options": {...}}',
            )
            _require(self.baseline not in REFERENCE_BASELINES, f"a {self.baseline} row has no 'advantage'")

    def _check_selection(self) -> None:
        _require(self.selection in SELECTIONS, f"'selection' must be one of {', '.join(SELECTIONS)}")
        if self.selection == "final":
            _require(self.validation is None, "'validation' belongs to a 'best' selection only")
            return
        _require(self.baseline not in REFERENCE_BASELINES, "base/sft rows are a starting point: selection 'final'")
        found = sorted(self.validation or {})
        _require(found == sorted(VALIDATION_KEYS), f"'validation' needs exactly {', '.join(VALIDATION_KEYS)}")
        assert self.validation is not None
        step, score = self.validation["step"], self.validation["score"]
        _require(_is_int(step) and step > 0, "'validation.step' must be a positive integer")
        _require(_is_number(score) and 0 <= score <= 1, "'validation.score' must be a fraction in [0, 1]")

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


def validate_samples(samples: Sequence[Any], metrics: Mapping[str, Any], where: str) -> None:
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


def check_registered(baseline: str, where: str) -> None:
    """Results are only meaningful for methods the harness can name again; imported lazily (torch)."""
    if baseline in REFERENCE_BASELINES:
        return

    names = BASELINES.entries()
    _check(baseline in names, where, f"baseline {baseline!r} is not registered (known: {', '.join(names) or 'none'})")
