"""Checkpoints that make a resumed run identical to an uninterrupted one, on one CPU or under DDP/FSDP/DeepSpeed.

A checkpoint folder holds only what resuming needs:

* ``accelerate/`` - model, optimizer and scheduler state written by ``Accelerator.save_state`` (which knows how
  to gather or shard them for every distributed backend: under FSDP each process writes its own shard);
* ``state.pt`` - the trainer's own state: step, position in the prompt stream, the number of processes (and
  SFT's mask generator). Plain tensors and containers only, read with ``weights_only=True``: a checkpoint from
  elsewhere cannot run code when it is resumed;
* ``<name>/rank<i>.pt`` - the parameters of a frozen module that training changes all the same (a reference model
  synced with the policy, ``frozen=``), as plain tensors: process i's shards under FSDP2, else rank 0's copy.

It is written to a temporary folder and renamed into place, so a run killed mid-save leaves the previous
checkpoint intact and never a half-written one. The model to evaluate is the run's ``final/`` export
(:func:`export_model`), written once, in the dtype training computed in.
"""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from stabledrl_bench.atomic import atomic_folder, storage_errors
from stabledrl_bench.core.models import DiffusionLM
from stabledrl_bench.errors import UserError
from stabledrl_bench.training.distributed import local_parameters

_STEP_DIR = re.compile(r"^step_(\d+)$")


@contextlib.contextmanager
def exclusive(folder: str | Path, what: str):
    """Hold an exclusive lock on ``folder`` while a run writes into it, so that a second run into the same folder
    refuses at once instead of interleaving its log and checkpoints. The lock is the operating system's (``flock``
    on ``folder/.lock``): it ends with the process, so a killed run leaves none behind."""
    import fcntl

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    handle = (folder / ".lock").open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        raise UserError(f"{folder} is in use by another {what}; wait for it to finish or use another folder") from exc
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


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


def rerun_note(output_dir: str | Path, what: str, total: int, every: int) -> str:
    """What running the same command again does for a run interrupted now (said on Ctrl-C): resume from its last
    checkpoint, or start again when it has saved none (``every``: its steps between checkpoints, 0 = at the end)."""
    path = latest_checkpoint(output_dir)
    if path is not None:
        step = int(_STEP_DIR.match(path.name).group(1))  # type: ignore[union-attr]
        return f"re-running the same command resumes {what} from step {step} of {total} (its last checkpoint, {path})"
    interval = f"one every {every} steps" if every else "save_every: 0, a checkpoint at the end only"
    return f"{what} saved no checkpoint yet ({interval}), so re-running the same command starts it again from step 0"


def export_model(
    accelerator, model: torch.nn.Module, dlm: DiffusionLM, path: str | Path, dtype: torch.dtype | None = None
) -> None:
    """Write the full model + tokenizer in ``save_pretrained`` format (collective: call on every process).

    ``dtype`` casts the floating-point weights (a bf16 run's export in bf16: half the disk of fp32 masters).
    LoRA models are exported merged (adapter folded into the base weights), so every exported folder loads with
    ``load_diffusion_lm`` and evaluates without peft; the merge is made from ``dlm.model``, which must be an
    unsharded module holding the current weights (the trainer's rollout module).
    """
    unwrapped = accelerator.unwrap_model(model)
    if hasattr(unwrapped, "merge_and_unload"):
        if accelerator.is_main_process:
            unwrapped = copy.deepcopy(dlm.model).merge_and_unload()
            state_dict = unwrapped.state_dict()
    else:
        state_dict = accelerator.get_state_dict(model)  # collective under FSDP/DeepSpeed
    if accelerator.is_main_process:
        with atomic_folder(path) as folder:  # a killed export leaves no folder that loads half-written weights
            unwrapped.save_pretrained(folder, state_dict=_cast(state_dict, dtype))
            dlm.tokenizer.save_pretrained(folder)


def _cast(state_dict: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    if dtype is None:
        return state_dict
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}


def save_checkpoint(
    accelerator,
    output_dir: str | Path,
    step: int,
    state: dict[str, Any],
    *,
    keep_last: int = 2,
    frozen: Mapping[str, torch.nn.Module] | None = None,
) -> Path:
    """Save everything needed to resume at ``step`` (collective: every process calls it), ``frozen`` modules
    included (module docstring); keep the newest ``keep_last`` checkpoints (0: all).

    A storage failure (a full disk under safetensors, torch or the file system) removes the half-written folder and
    is one line naming the checkpoint; the previous checkpoints are untouched."""
    frozen = frozen or {}
    final = checkpoint_dir(output_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    try:
        with storage_errors(final):
            if accelerator.is_main_process:
                if tmp.exists():
                    shutil.rmtree(tmp)
                for folder in ("accelerate", *frozen):  # before any process writes its shard into them
                    (tmp / folder).mkdir(parents=True)
            accelerator.wait_for_everyone()
            accelerator.save_state(str(tmp / "accelerate"))
            for name, module in frozen.items():
                _save_parameters(accelerator, tmp / name, module)
            accelerator.wait_for_everyone()  # every process has written its files before the folder is renamed
            if accelerator.is_main_process:
                torch.save({"state": state}, tmp / "state.pt")
                if final.exists():
                    shutil.rmtree(final)
                os.replace(tmp, final)
                _prune(final.parent, keep_last)
    except BaseException:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    accelerator.wait_for_everyone()
    return final


def read_checkpoint_state(path: str | Path) -> dict[str, Any]:
    """The trainer state of a checkpoint, without touching any model (so that, e.g., its budget can be checked
    before anything is restored). Loaded with ``weights_only=True``: tensors and plain containers, no code."""
    try:
        blob = torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=True)
        return blob["state"]
    except (*_UNREADABLE, KeyError, TypeError) as exc:
        raise _unreadable(path, exc) from exc


# What loading a damaged or foreign checkpoint raises: a pickle naming anything but tensors and plain containers is
# an UnpicklingError under ``weights_only=True`` (what accelerate's loader uses too), a truncated file EOF/Runtime.
_UNREADABLE = (OSError, RuntimeError, EOFError, pickle.UnpicklingError)


def _unreadable(path: str | Path, exc: BaseException) -> UserError:
    first = (str(exc).strip().splitlines() or [""])[0]
    return UserError(f"cannot read checkpoint {path}: {type(exc).__name__}: {first}")


def load_checkpoint(accelerator, path: str | Path, frozen: Mapping[str, torch.nn.Module] | None = None) -> None:
    """Restore model, optimizer and scheduler, and the ``frozen`` modules it saved, in place from ``path``
    (collective: every process calls it). accelerate reads weights from safetensors and everything else with
    ``weights_only=True``, as :func:`_load_parameters` does: no code runs."""
    try:
        accelerator.load_state(str(Path(path) / "accelerate"))
        for name, module in (frozen or {}).items():
            _load_parameters(accelerator, Path(path) / name, module)
    except (*_UNREADABLE, KeyError) as exc:
        raise _unreadable(path, exc) from exc


def _save_parameters(accelerator, folder: Path, module: torch.nn.Module) -> None:
    """This process's shards of ``module`` (FSDP2), or rank 0's copy of the whole, as plain tensors."""
    sharded, local = local_parameters(module)
    if sharded or accelerator.is_main_process:
        rank = accelerator.process_index if sharded else 0
        torch.save({name: t.detach().cpu().clone() for name, t in local.items()}, folder / f"rank{rank}.pt")


@torch.no_grad()
def _load_parameters(accelerator, folder: Path, module: torch.nn.Module) -> None:
    sharded, local = local_parameters(module)
    rank = accelerator.process_index if sharded else 0
    saved = torch.load(folder / f"rank{rank}.pt", map_location="cpu", weights_only=True)
    for name, tensor in local.items():
        tensor.copy_(saved[name])


def _prune(root: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)))
    for _, path in steps[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)
