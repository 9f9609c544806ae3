"""``verify`` for the stability records: every field a verdict is read from is recomputed and compared.

The leaderboard's stability verdicts are read from each record's summary (collapsed seeds, seeds above the frozen
control, spike counts, the chosen learning rate). A summary is derived data: edit it, and a verdict changes while
the runs behind it stay the same. So each experiment's ``rederive`` (:class:`~.options.Experiment`) recomputes those
fields from what the record stores beside them (the per-step curves of every run and every seed's frozen control,
the per-seed drift measurements; the convex-hull trials are seeded and re-run in seconds), and this module compares
them with the stored ones, number by number (relative tolerance 1e-9). The commit the record was made at must be in
this repository.

Where the run folders a training record names are on this machine (the run cache), their logs are read again
(:func:`~.sweep.reread`), so the stored curves are compared with the runs they name too; the folders are not
committed, so elsewhere that link is not proven.

The same derivation rewrites records (:func:`rederive_records`, ``stress rederive``) when the analysis itself
changes (a new statistic, a mended definition): the derived fields are recomputed from the stored data, nothing is
trained again, and the record says when and by which code (``rederived``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stabledrl_bench.errors import UserError
from stabledrl_bench.experiments.stress.common import SCHEMA, read_record, stability_dir
from stabledrl_bench.experiments.stress.options import EXPERIMENTS
from stabledrl_bench.reporting.provenance import git_state, unknown_commit
from stabledrl_bench.reporting.results import plain_json, write_json_record

TOLERANCE = 1e-9


def differences(stored: Any, derived: Any, where: str) -> list[str]:
    """Where ``derived`` (plain JSON) differs from ``stored``: numbers within :data:`TOLERANCE`, everything else
    equal; a dict is compared on the derived keys (a stored dict may hold more, e.g. a run's folder)."""
    if isinstance(derived, Mapping):
        if not isinstance(stored, Mapping):
            return [f"{where}: stored {stored!r}, recomputed a mapping"]
        return [
            line
            for key, value in derived.items()
            for line in (
                differences(stored[key], value, f"{where}.{key}") if key in stored else [f"{where}.{key}: missing"]
            )
        ]
    if isinstance(derived, list):
        if not isinstance(stored, list) or len(stored) != len(derived):
            return [f"{where}: stored {_short(stored)}, recomputed {_short(derived)}"]
        return [
            line
            for k, (a, b) in enumerate(zip(stored, derived, strict=True))
            for line in differences(a, b, f"{where}[{k}]")
        ]
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (stored, derived))
    if numbers and math.isclose(stored, derived, rel_tol=TOLERANCE, abs_tol=TOLERANCE):
        return []
    if not numbers and stored == derived and type(stored) is type(derived):
        return []
    return [f"{where}: stored {_short(stored)}, recomputed {_short(derived)}"]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


UNDERIVABLE = (KeyError, TypeError, ValueError)  # what a rederive raises on stored data it cannot read


def _underivable(exc: Exception) -> str:
    return f"cannot recompute its summary from the stored data ({type(exc).__name__}: {exc})"


def _differing(record: Mapping[str, Any], derived: Mapping[str, Any]) -> list[str]:
    """Where the recomputed ``derived`` fields differ from those ``record`` stores (:func:`differences`)."""
    return [line for key in derived for line in differences(record.get(key), derived[key], key)]


def recheck(path: Path) -> tuple[list[str], list[str]]:
    """(problems, notes) of one stability record."""
    try:
        record = read_record(path)
        name = record["experiment"]
        if name not in EXPERIMENTS:
            return [], [f"no stress experiment {name!r} is registered here: not re-derived"]
        rederive = EXPERIMENTS.get(name).rederive
        if rederive is None:
            return unknown_commit(record), [f"stress {name} has no rederive: its summary was not recomputed"]
        derived = plain_json(rederive(record))
    except UserError as exc:
        return [str(exc)], []
    except UNDERIVABLE as exc:
        return [_underivable(exc)], []
    return [*unknown_commit(record), *_differing(record, derived)], []


def rederive_records(results: Path | str) -> list[str]:
    """Rewrite the derived fields of every stability record under ``results`` from its stored data (its experiment's
    ``rederive``), and say per record what changed; a record whose derivation already agrees is left as it is."""
    paths = sorted(stability_dir(results).glob("*.json"))
    if not paths:
        raise UserError(f"no stability records in {stability_dir(results)}: nothing to re-derive")
    lines = []
    for path in paths:
        record = read_record(path)
        experiment = EXPERIMENTS.get(record["experiment"]) if record.get("experiment") in EXPERIMENTS else None
        if experiment is None or experiment.rederive is None:
            lines.append(f"{path}: left as it is (no rederive for {record.get('experiment')!r})")
            continue
        try:
            derived = plain_json(experiment.rederive(record))
        except UNDERIVABLE as exc:
            raise UserError(f"{path}: {_underivable(exc)}; nothing was rewritten from here on") from exc
        changed = _differing(record, derived)
        if not changed:
            lines.append(f"{path}: unchanged")
            continue
        when = datetime.now(timezone.utc).isoformat(timespec="seconds")
        write_json_record(path, SCHEMA, {**record, **derived, "rederived": {"created": when, "git": git_state()}})
        lines.append(f"{path}: {len(changed)} derived field(s) recomputed (first: {changed[0]})")
    return lines
