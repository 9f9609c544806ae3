"""Writes that readers see whole or not at all: files, streamed files and model folders; and what counts as the
machine's storage failing, whichever library was writing.

Why every writer goes through here: a run killed mid-write (Ctrl-C, out of memory, a full disk) must not leave a
file or folder that a later command takes for finished work -- a half-written ``final/`` that ``eval`` loads, a
truncated ``run.json`` that ``eval --run`` reads a budget from, a PNG that no viewer opens. Each function writes
into a temporary name beside the target (``os.replace`` is only atomic within one file system), renames it into
place when complete, and removes it when anything fails. A failure of the file system (full, read-only, refused,
gone) becomes one :class:`~stabledrl_bench.errors.UserError` line naming the target.

Storage failures do not all arrive as ``OSError``: the libraries that write model and checkpoint files raise their
own types (:func:`storage_failure` lists them, with the messages they were seen to give on a full, a read-only and a
forbidden folder). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from stabledrl_bench.errors import UserError

FILE_MODE = 0o644  # mkstemp creates 0600; results and logs are ordinary shared files
FOLDER_MODE = 0o755  # mkdtemp creates 0700

# The machine's storage failing (full, over quota, read-only, refused, broken), not a bug: one line, no traceback.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO})
# Rust's io::Error as safetensors (SafetensorError: "Error while serializing: I/O error: No space left on device
# (os error 28)") and tokenizers (a plain Exception: "Permission denied (os error 13)") print it.
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
# PyTorch's zip writer (torch.save): a RuntimeError "[enforce fail at inline_container.cc:...] . open file failed
# with strerror: Read-only file system", or on a full disk "... unexpected pos 576 vs 534" (no errno at all).
_TORCH_OPEN = re.compile(r"inline_container\.cc.*open file failed with strerror: (.+)")
_TORCH_WRITE = re.compile(r"inline_container\.cc.*(unexpected pos|PytorchStreamWriter failed writing)")


def storage_failure(exc: BaseException, *, any_errno: bool = False) -> str | None:
    """Why the storage failed, if ``exc`` says it did (whichever library raised it); None for anything else.

    ``any_errno``: every ``OSError`` counts (a writer's own failure, whatever its errno); otherwise only the
    :data:`STORAGE_ERRNOS`, since e.g. a missing file elsewhere is more likely a bug than the machine.
    """
    if isinstance(exc, OSError):
        if any_errno or exc.errno in STORAGE_ERRNOS:
            return exc.strerror or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return None
    text = str(exc).strip()
    if found := _RUST_OS_ERROR.search(text):
        number = int(found.group(1))
        return os.strerror(number) if any_errno or number in STORAGE_ERRNOS else None
    if isinstance(exc, RuntimeError):
        if found := _TORCH_OPEN.search(text):
            return found.group(1).strip()
        if _TORCH_WRITE.search(text):
            return "PyTorch's writer stopped part-way (is the disk full?)"
    return None


@contextlib.contextmanager
def storage_errors(target: Path | str) -> Iterator[None]:
    """Inside: a storage failure of any library becomes one :class:`UserError` line naming ``target``."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        reason = storage_failure(exc, any_errno=True)
        if reason is None:
            raise
        raise UserError(f"cannot write {target}: {reason}") from exc


@contextlib.contextmanager
def atomic_stream(path: Path | str, mode: str = "w") -> Iterator[IO]:
    """A handle on a temporary file that becomes ``path`` when the ``with`` block ends without an error
    (``mode`` ``"w"``: UTF-8 text, ``"wb"``: bytes). For outputs written piece by piece, e.g. a graded JSONL."""
    path = Path(path)
    with storage_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(descriptor, FILE_MODE)
        with os.fdopen(descriptor, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        with storage_errors(path):  # re-raised: as one line when it is the storage failing
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
    with storage_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        os.chmod(temporary, FOLDER_MODE)
        yield temporary
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(temporary, path)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        with storage_errors(path):  # re-raised: as one line when it is the storage failing
            raise
