"""Checkpoints that make a resumed run identical to an uninterrupted one, on one CPU or under DDP/FSDP/DeepSpeed.

A checkpoint folder holds:

* ``accelerate/`` - model, optimizer and scheduler state written by ``Accelerator.save_state`` (which knows how
  to gather or shard them for every distributed backend);
* ``model/`` - the full model in ``save_pretrained`` format, loadable on its own for evaluation;
* ``state.pt`` - the trainer's own state: step, position in the prompt stream, and every random generator of
  every process.

It is written to a temporary folder and renamed into place, so a run killed mid-save leaves the previous
checkpoint intact and never a half-written one.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from stabledrl_bench.core.models import DiffusionLM
from stabledrl_bench.errors import UserError

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


def export_model(accelerator, model: torch.nn.Module, dlm: DiffusionLM, path: str | Path) -> None:
    """Write the full model + tokenizer in ``save_pretrained`` format (collective: call on every process).

    LoRA models are exported merged (adapter folded into the base weights), so every exported folder loads with
    ``load_diffusion_lm`` and evaluates without peft.
    """
    unwrapped = accelerator.unwrap_model(model)
    if hasattr(unwrapped, "merge_and_unload"):
        if accelerator.is_main_process:
            copy.deepcopy(unwrapped).merge_and_unload().save_pretrained(path)
            dlm.tokenizer.save_pretrained(path)
        return
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        unwrapped.save_pretrained(path, state_dict=state_dict)
        dlm.tokenizer.save_pretrained(path)


def save_checkpoint(
    accelerator,
    output_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    dlm: DiffusionLM,
    state: dict[str, Any],
    rank_states: list[dict[str, Any]],
    keep_last: int = 2,
) -> Path:
    """Save everything needed to resume at ``step`` (collective: every process calls it)."""
    final = checkpoint_dir(output_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp / "accelerate"))
    export_model(accelerator, model, dlm, tmp / "model")
    if accelerator.is_main_process:
        torch.save({"state": state, "rank_states": rank_states}, tmp / "state.pt")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _prune(final.parent, keep_last)
    accelerator.wait_for_everyone()
    return final


def read_checkpoint_state(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The trainer state and the per-process states of a checkpoint, without touching any model (so that, e.g.,
    its budget can be checked before anything is restored)."""
    try:
        blob = torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)
        return blob["state"], blob["rank_states"]
    except (OSError, RuntimeError, EOFError, KeyError) as exc:
        raise UserError(f"cannot read checkpoint {path}: {exc}") from exc


def load_checkpoint(accelerator, path: str | Path) -> None:
    """Restore model, optimizer and scheduler in place from ``path`` (collective: every process calls it)."""
    accelerator.load_state(str(Path(path) / "accelerate"))


def _prune(root: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)))
    for _, path in steps[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)
