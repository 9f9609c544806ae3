"""Whether a record is what it says it is: its identity (comparison, baseline, task, seed, length, protocol)
against everything else that names it.

Why a separate check: every field of a record can be edited, so a record relabelled as another method or seed
would still validate (:mod:`.schema`); only what names it elsewhere can contradict it. ``load_results`` refuses
such a record, ``python -m stabledrl_bench verify`` lists every one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stabledrl_bench.core.baseline import BASELINES
from stabledrl_bench.reporting.naming import result_path
from stabledrl_bench.reporting.schema import REFERENCE_BASELINES
from stabledrl_bench.tasks import TASKS


def identity_problems(records: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Records whose identity (comparison, baseline, task, seed, length, protocol) disagrees with what else names
    them, by path: their file name (derived from every key field when written), the folders of their checkpoint
    path (``runs/<comparison>/<task>/s<seed>/<baseline>/final``, where present), the run's ``job.json`` when the
    run folder is here, and the other records (another seed's record with the very same completions and weights).

    What a relabelling that rewrites all of these consistently cannot be caught by: a record without its
    checkpoint proves its completions and grades, not which run made them (README, ``verify``).
    """

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
