"""Checkpoints that make a resumed run identical to an uninterrupted one.

A checkpoint holds the model (``save_pretrained`` format, loadable on its own), optimizer and scheduler state,
the step, the position in the prompt stream, and the state of every random generator (one set per process).
It is written to a temporary folder and renamed into place, so a run killed mid-save leaves the previous
checkpoint intact and never a half-written one.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from .errors import UserError
from .models import DiffusionLM, save_diffusion_lm

_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step:06d}"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step (temporary folders of an interrupted save are ignored)."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    complete = [(s, p) for s, p in found if (p / "state.pt").is_file()]
    return max(complete)[1] if complete else None


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    dlm: DiffusionLM,
    state: dict[str, Any],
    rank_states: list[dict[str, Any]],
    keep_last: int = 2,
) -> Path:
    """Write model + ``state`` (shared) + ``rank_states`` (one per process, e.g. generator states) atomically."""
    final = checkpoint_dir(output_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_diffusion_lm(dlm, tmp / "model")
    torch.save({"state": state, "rank_states": rank_states}, tmp / "state.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _prune(Path(output_dir) / "checkpoints", keep_last)
    return final


def load_checkpoint_state(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    path = Path(path)
    try:
        blob = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError) as exc:
        raise UserError(f"cannot read checkpoint {path}: {exc}") from exc
    return blob["state"], blob["rank_states"]


def _prune(root: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)))
    for _, path in steps[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)
