"""Shared by the benchmark scripts: best-of-N wall time, synchronising CUDA around each run."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """Wall time of one ``fn()`` (GPU work included) and its output."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def best_time(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    """Best-of-``repeats`` wall time of ``fn()`` (the minimum is the least disturbed run) and its last output."""
    best, out = float("inf"), None
    for _ in range(repeats):
        seconds, out = timed(fn)
        best = min(best, seconds)
    return best, out
