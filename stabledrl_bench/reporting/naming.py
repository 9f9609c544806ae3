"""What names a result: the fields that identify an evaluation (:class:`ResultKey`) and the file names derived
from them.

Why derived, never chosen: the same key always gives the same name, so a rerun finds a finished evaluation
(:func:`~.results.result_exists`) and a record's name can be checked against its own fields (:mod:`.identity`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabledrl_bench.config import canonical_json
from stabledrl_bench.errors import UserError
from stabledrl_bench.reporting.schema import SAMPLES_SUFFIX


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
    hash of all key fields keeps names unique while staying deterministic for :func:`~.results.result_exists`.
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


def samples_path(json_path: Path) -> Path:
    """The per-sample JSONL beside the result JSON ``json_path``."""
    return json_path.with_name(json_path.name[: -len(".json")] + SAMPLES_SUFFIX)
