"""Committed warm starts: SFT starting points trained once by this code and kept in the repository.

Why they exist: the tiny presets' RL runs start from an SFT warm start trained on the CPU, and another kind of CPU
rounds that training differently. A fresh clone elsewhere therefore started RL from other weights, which acts like
another seed and can flip the sign of a method's small change (docs/tiny-preset.md), and the warm start was most of
the front door's time. A committed start is the same file on every machine: ``reproduce`` copies it into the run
folder when its settings match (the spec hash of :class:`~stabledrl_bench.experiments.runner.WarmStart`), and trains
a start only where none matches, or everywhere with ``--train-starts``. The RL runs after it still round like the
machine they run on; what a committed start removes is the largest source of that difference.

A start lives in ``results/starts/<comparison>__<task>__s<seed>/``: the model folder as ``save_pretrained`` wrote
it and ``start.json``, which names the settings, the machine and commit that trained it, its cost, and two hashes:
the file's (checked before every copy) and the weights' (:func:`~stabledrl_bench.evaluation.native.weights_sha256`,
the one evaluation records carry, so a record can be traced to its start).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

from stabledrl_bench.atomic import atomic_folder, atomic_write_text
from stabledrl_bench.errors import UserError
from stabledrl_bench.reporting.provenance import PACKAGE_DIR, environment_info
from stabledrl_bench.reporting.results import STARTS_SUBDIR

STARTS_DIR = PACKAGE_DIR.parent / "results" / STARTS_SUBDIR  # the repository's (a clone or an editable install)
START_FILE = "start.json"
MODEL_FOLDER = "model"
WEIGHTS_FILE = "model.safetensors"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_start(folder: Path) -> dict[str, Any]:
    """A committed start's ``start.json``; a broken one is one error line naming it."""
    path = folder / START_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a committed start ({exc.__class__.__name__}: {exc})") from None
    missing = [key for key in ("spec_hash", "file_sha256") if not isinstance(record, dict) or key not in record]
    if missing:
        raise UserError(f"{path}: not a committed start (no {', '.join(missing)})")
    return record


def committed_starts(root: Path = STARTS_DIR) -> dict[str, Path]:
    """Every committed start under ``root`` by its spec hash."""
    if not root.is_dir():
        return {}
    return {read_start(folder)["spec_hash"]: folder for folder in sorted(root.iterdir()) if folder.is_dir()}


def find_start(spec_hash: str, root: Path = STARTS_DIR) -> Path | None:
    """The committed start trained with the settings ``spec_hash`` (None if there is none)."""
    return committed_starts(root).get(spec_hash)


def copy_start(folder: Path, final: Path) -> dict[str, Any]:
    """Copy the committed start ``folder`` to the model folder ``final`` after checking its weights file against the
    recorded hash (a truncated or replaced file is an error, not a silently different start); returns its record."""
    record = read_start(folder)
    weights = folder / MODEL_FOLDER / WEIGHTS_FILE
    found = file_sha256(weights) if weights.is_file() else "missing"
    if found != record["file_sha256"]:
        raise UserError(
            f"{weights}: sha256 {found[:12]} is not the committed start's {record['file_sha256'][:12]}; restore it "
            "(git checkout results/starts) or pass --train-starts"
        )
    with atomic_folder(final) as target:
        shutil.copytree(folder / MODEL_FOLDER, target, dirs_exist_ok=True)
    return record


def start_name(warm_start: Path) -> str:
    """``<comparison>__<task>__s<seed>`` of a run folder ``runs/<comparison>/<task>/s<seed>/sft``."""
    parts = warm_start.resolve().parts
    if len(parts) < 4 or parts[-1] != "sft" or not re.fullmatch(r"s\d+", parts[-2]):
        raise UserError(f"{warm_start}: not a warm start's run folder (runs/<comparison>/<task>/s<seed>/sft)")
    return "__".join(parts[-4:-1])


def save_start(warm_start: Path, root: Path = STARTS_DIR, name: str | None = None, note: str | None = None) -> Path:
    """Commit the finished warm start in run folder ``warm_start`` (``runs/<comparison>/<task>/s<seed>/sft``) as
    ``root/name`` (default :func:`start_name`): its model and a ``start.json`` with its settings, provenance and
    hashes, and ``note`` (what else is known of where it came from, e.g. for a start built before its machine was
    recorded)."""
    from stabledrl_bench.core.models import load_diffusion_lm  # torch: only when a start is saved
    from stabledrl_bench.evaluation.native import weights_sha256
    from stabledrl_bench.experiments.runner import WARM_START_FILE  # (runner imports this module)

    info_path, final = warm_start / WARM_START_FILE, warm_start / "final"
    if not info_path.is_file() or not (final / WEIGHTS_FILE).is_file():
        raise UserError(f"{warm_start}: no finished warm start (needs {WARM_START_FILE} and final/{WEIGHTS_FILE})")
    info = json.loads(info_path.read_text())
    if info.get("source") == "committed":  # copied from a committed start: its record already says where it came from
        raise UserError(f"{warm_start}: this warm start is a copy of the committed start {info.get('committed')}")
    name = name or start_name(warm_start)
    record = {
        "spec": info["spec"],
        "spec_hash": info["spec_hash"],
        "file_sha256": file_sha256(final / WEIGHTS_FILE),
        "weights_sha256": weights_sha256(load_diffusion_lm(str(final)).model),
        "sft_seconds": info.get("sft_seconds"),
        "sft_cpu_seconds": info.get("sft_cpu_seconds"),
        # the machine and code that trained it (warm starts built before this was recorded have none) and saved it
        "trained": info.get("environment"),
        "saved": environment_info(),
        **({"note": note} if note else {}),
    }
    with atomic_folder(root / name) as target:
        shutil.copytree(final, target / MODEL_FOLDER)
        atomic_write_text(target / START_FILE, json.dumps(record, indent=1) + "\n")
    return root / name
