"""Jobs for the worker-pool tests: module-level functions, so a spawned worker can unpickle them."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from stabledrl_bench.errors import UserError, on_interrupt


def add(x: int, *inputs: int) -> int:
    """``x`` plus the results of the stages it needs; prints, to show where a job's output goes."""
    print(f"adding {x} to {list(inputs)}")
    return x + sum(inputs)


def threads() -> int:
    return torch.get_num_threads()


def refuse(message: str, folder: str | None = None) -> None:
    """Raise a user's error (once a :func:`wait_for_stop` job in ``folder`` has started, when given)."""
    while folder is not None and not list(Path(folder).glob("started-*")):
        time.sleep(0.05)
    raise UserError(message)


def crash() -> None:
    raise ValueError("a bug in a job")


def die() -> None:
    os._exit(3)


def wait_for_stop(folder: str) -> None:
    """Run until interrupted; then leave a file saying the job cleaned up, and a note on resuming."""
    started = Path(folder) / f"started-{os.getpid()}"
    with on_interrupt(lambda: "the waiting job resumes"):
        try:
            started.touch()
            while True:
                time.sleep(0.05)
        finally:
            (Path(folder) / f"cleaned-{os.getpid()}").touch()
