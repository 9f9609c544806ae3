"""Writes that readers see whole or not at all: files, streamed files and model folders.

Why every writer goes through here: a run killed mid-write (Ctrl-C, out of memory, a full disk) must not leave a
file or folder that a later command takes for finished work -- a half-written ``final/`` that ``eval`` loads, a
truncated ``run.json`` that ``eval --run`` reads a budget from, a PNG that no viewer opens. Each function writes
into a temporary name beside the target (``os.replace`` is only atomic within one file system), renames it into
place when complete, and removes it when anything fails. A failure of the file system (full, read-only, gone)
becomes one :class:`~stabledrl_bench.errors.UserError` line naming the target.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from stabledrl_bench.errors import UserError

FILE_MODE = 0o644  # mkstemp creates 0600; results and logs are ordinary shared files
FOLDER_MODE = 0o755  # mkdtemp creates 0700


def _storage_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the file system failing (and not a bug): ``OSError`` or safetensors' wrapped ``IoError``."""
    return isinstance(exc, OSError) or (type(exc).__name__ == "SafetensorError" and "IoError" in str(exc))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@contextlib.contextmanager
def atomic_stream(path: Path | str, mode: str = "w") -> Iterator[IO]:
    """A handle on a temporary file that becomes ``path`` when the ``with`` block ends without an error
    (``mode`` ``"w"``: UTF-8 text, ``"wb"``: bytes). For outputs written piece by piece, e.g. a graded JSONL."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {_reason(exc)}") from exc
    try:
        os.fchmod(descriptor, FILE_MODE)
        with os.fdopen(descriptor, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if _storage_error(exc):
            raise UserError(f"cannot write {path}: {_reason(exc)}") from exc
        raise


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the complete new one."""
    with atomic_stream(path, "wb") as handle:
        handle.write(data)


def atomic_write_text(path: Path | str, text: str) -> None:
    """:func:`atomic_write_bytes` of UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_folder(path: Path | str) -> Iterator[Path]:
    """A temporary folder to fill; it replaces ``path`` (an older folder there is removed) when the ``with`` block
    ends without an error, and is removed otherwise. For model folders (``save_pretrained``): a killed export
    leaves the previous folder or none, never weights without their config or a config without its weights."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    except OSError as exc:
        raise UserError(f"cannot write {path}: {_reason(exc)}") from exc
    try:
        os.chmod(temporary, FOLDER_MODE)
        yield temporary
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(temporary, path)
    except BaseException as exc:
        shutil.rmtree(temporary, ignore_errors=True)
        if _storage_error(exc):
            raise UserError(f"cannot write {path}: {_reason(exc)}") from exc
        raise
