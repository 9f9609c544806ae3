"""One exception type for problems the user can fix (bad config, missing path, unknown name).

The command line prints its message as a single line and exits with status 2; anything else is a bug and keeps
its traceback. The argument parser and the checks every command shares live here too, so that each command
reports bad input the same way, before doing any work.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NoReturn, TypeVar

T = TypeVar("T")


class UserError(Exception):
    """A problem with the user's input, reported as one clear line."""


class CommandParser(argparse.ArgumentParser):
    """``argparse`` whose usage errors are :class:`UserError`s: one ``error:`` line, not usage text plus a line."""

    def error(self, message: str) -> NoReturn:
        raise UserError(message)


@contextlib.contextmanager
def on_interrupt(rerun: Callable[[], str]) -> Iterator[None]:
    """Say what re-running the command does when it is interrupted (Ctrl-C) inside this block.

    Why here and asked at that moment: only the code doing the work knows what it has kept (a trainer, its last
    checkpoint), and a promise made up front ("re-run to resume") is false for a run that has saved nothing yet. The
    notes of nested blocks ride on the exception, outermost first (:func:`rerun_notes`); the command line prints them.
    """
    try:
        yield
    except KeyboardInterrupt as exc:
        exc.rerun_notes = [rerun(), *rerun_notes(exc)]  # type: ignore[attr-defined]
        raise


def rerun_notes(exc: BaseException) -> list[str]:
    """What the blocks an interrupt left said about re-running the command (:func:`on_interrupt`), outermost first."""
    return list(getattr(exc, "rerun_notes", []))


def positive_int(text: str) -> int:
    """``type=`` for counts on the command line: a positive integer, checked where it is parsed."""
    return _int_from(text, 1, "a positive integer")


def count_int(text: str) -> int:
    """``type=`` for counts where 0 means none (``verify --redecode 0``): a non-negative integer."""
    return _int_from(text, 0, "a non-negative integer")


def _int_from(text: str, minimum: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def memory_gib(text: str) -> float:
    """``type=`` for a memory size in GiB: ``80GiB``, ``141GB`` (10**9 bytes), ``1.5TiB``, or a bare number of GiB."""
    units = {"": 1.0, "gib": 1.0, "gb": 1e9 / 2**30, "tib": 1024.0, "tb": 1e12 / 2**30}
    number, unit = text.strip(), ""
    for name in sorted(units, key=len, reverse=True):
        if name and number.lower().endswith(name):
            number, unit = number[: -len(name)].strip(), name
            break
    try:
        value = float(number) * units[unit]
    except ValueError:
        value = float("nan")
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a size such as 80GiB or 141GB, got {text!r}")
    return value


INT64_LIMIT = 2**63  # seeds and counts fit a signed 64-bit integer, as torch (manual_seed, tensors) needs


def seed_int(text: str) -> int:
    """``type=`` for seeds on the command line: a non-negative integer that fits a torch generator's 64 bits."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < INT64_LIMIT:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 2**63 - 1, got {text!r}")
    return value


def require_folder(path: str | Path, what: str) -> None:
    """Fail before any work when ``path`` (a folder to write into) cannot be one: it or a parent is a file or a
    dangling link, or the nearest existing folder is not writable."""
    for candidate in (Path(path), *Path(path).parents):
        if candidate.is_symlink() and not candidate.exists():
            raise UserError(f"{what} {path}: {candidate} is a link to nothing")
        if candidate.exists() and not candidate.is_dir():
            raise UserError(
                f"{what} {path} is a file" if candidate == Path(path) else f"{what} {path}: {candidate} is a file"
            )
        if candidate.is_dir():
            if not os.access(candidate, os.W_OK | os.X_OK):
                raise UserError(f"{what} {path}: {candidate} is not writable")
            return


def comma_list(
    text: str,
    option: str,
    *,
    kind: Callable[[str], T] = str,  # type: ignore[assignment]
    choices: Iterable[str] | None = None,
    what: str = "value",
) -> list[T]:
    """An option's comma-separated values (``--seeds 0,1,2``), in order, repeats dropped; one error line for an
    empty list, a value ``kind`` cannot parse, or a name outside ``choices``.

    Why one helper: every list option of every command then reads and rejects input the same way.
    """
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise UserError(f"{option}: no {what} given in {text!r}")
    if choices is not None:
        known = list(choices)
        unknown = [part for part in parts if part not in known]
        if unknown:
            raise UserError(f"{option}: unknown {what}(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    try:
        values = [kind(part) for part in parts]
    except ValueError:
        name = getattr(kind, "__name__", "value")
        raise UserError(f"{option}: expected comma-separated {name} values, got {text!r}") from None
    return list(dict.fromkeys(values))
