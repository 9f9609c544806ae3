"""Overall progress of a long job made of stages: "stage k of N", the time elapsed, and an estimate of the rest.

Why: ``reproduce`` runs tens of stages (warm starts, RL runs, evaluations), each with its own progress bar; a user
needs to know where the whole job is and roughly when it ends. Stages differ wildly in cost, so the estimate is
per kind: each remaining stage is expected to take as long as the measured stages of its kind (``task:what``, or
of ``what`` on any task before one of the task's own has run). Reused stages (found in the cache) take no time
and say nothing about the cost of a real one, so they are left out of the estimate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from statistics import mean


def duration(seconds: float) -> str:
    """``75`` -> ``1m15s``; ``3725`` -> ``1h02m``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Stages:
    """A planned sequence of stage kinds (``"sudoku:train"``...), started and ended in that order."""

    def __init__(
        self,
        kinds: Sequence[str],
        *,
        clock: Callable[[], float] = time.monotonic,
        out: Callable[[str], None] = print,
    ) -> None:
        self.kinds = list(kinds)
        self._clock, self._out = clock, out
        self._start = clock()
        self._done = 0
        self._began: float | None = None
        self._measured: dict[str, list[float]] = {}

    def begin(self, label: str) -> None:
        """Announce the next planned stage (``label`` says what it does)."""
        if self._began is not None:
            raise RuntimeError("begin() called twice without end()")
        if self._done >= len(self.kinds):
            raise RuntimeError(f"all {len(self.kinds)} planned stages already ran")
        self._began = self._clock()
        elapsed = self._began - self._start
        left = self.estimate_left()
        estimate = f"~{duration(left)} left" if left is not None else "estimate after the first stage of each kind"
        self._out(f"[stage {self._done + 1}/{len(self.kinds)} | {duration(elapsed)} elapsed, {estimate}] {label}")

    def end(self, *, reused: bool = False) -> None:
        """The current stage finished; a reused one (from the cache) does not enter the estimate."""
        if self._began is None:
            raise RuntimeError("end() called before begin()")
        if not reused:
            self._measured.setdefault(self.kinds[self._done], []).append(self._clock() - self._began)
        self._done, self._began = self._done + 1, None

    def _expected(self, kind: str) -> float | None:
        if kind in self._measured:
            return mean(self._measured[kind])
        what = kind.rpartition(":")[2]
        same = [t for other, times in self._measured.items() if other.rpartition(":")[2] == what for t in times]
        return mean(same) if same else None

    def estimate_left(self) -> float | None:
        """Seconds the stages not yet finished should take (the current one whole); None while a kind among them
        has never been measured."""
        expected = [self._expected(kind) for kind in self.kinds[self._done :]]
        return None if any(e is None for e in expected) else float(sum(expected))  # type: ignore[arg-type]
