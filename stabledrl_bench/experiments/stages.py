"""Overall progress of a long job made of stages: "stage k of N", the time elapsed, and an estimate of the rest.

Why: ``reproduce`` runs tens of stages (warm starts, RL runs, evaluations), each with its own progress bar; a user
needs to know where the whole job is and roughly when it ends, from the first minutes on. Stages differ wildly in
cost, so each declares its *work* (token-forwards, from its budget: :mod:`.plan`) and the estimate is work x seconds
per unit of work. The rate is refined as stages finish: the stages of a kind (``task:what``) take the measured rate
of that kind, else of ``what`` on any task, else the rate of every stage measured so far, so there is an estimate
as soon as the first stage has run. Reused stages (found in the cache) take no time and say nothing about the cost
of a real one, so they are left out of the estimate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence


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
        work: Sequence[float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        out: Callable[[str], None] = print,
    ) -> None:
        """``work``: each stage's amount of work in any one unit (None: every stage alike)."""
        self.kinds = list(kinds)
        self.work = [1.0] * len(self.kinds) if work is None else [float(w) for w in work]
        if len(self.work) != len(self.kinds) or not all(w > 0 for w in self.work):
            raise ValueError(f"work must give a positive amount for each of the {len(self.kinds)} stages")
        self._clock, self._out = clock, out
        self._start = clock()
        self._done = 0
        self._began: float | None = None
        self._measured: dict[str, list[tuple[float, float]]] = {}  # kind -> (seconds, work) of each measured stage

    def begin(self, label: str) -> None:
        """Announce the next planned stage (``label`` says what it does)."""
        if self._began is not None:
            raise RuntimeError("begin() called twice without end()")
        if self._done >= len(self.kinds):
            raise RuntimeError(f"all {len(self.kinds)} planned stages already ran")
        self._began = self._clock()
        elapsed = self._began - self._start
        left = self.estimate_left()
        estimate = f"~{duration(left)} left" if left is not None else "estimate after the first stage"
        self._out(f"[stage {self._done + 1}/{len(self.kinds)} | {duration(elapsed)} elapsed, {estimate}] {label}")

    def end(self, *, reused: bool = False) -> None:
        """The current stage finished; a reused one (from the cache) does not enter the estimate."""
        if self._began is None:
            raise RuntimeError("end() called before begin()")
        if not reused:
            measured = (self._clock() - self._began, self.work[self._done])
            self._measured.setdefault(self.kinds[self._done], []).append(measured)
        self._done, self._began = self._done + 1, None

    def _rate(self, kind: str) -> float | None:
        """Seconds per unit of work for a stage of ``kind``: its kind's, else its ``what``'s, else every measured
        stage's; None before any stage was measured."""
        what = kind.rpartition(":")[2]
        for same in (
            self._measured.get(kind, []),
            [m for other, ms in self._measured.items() if other.rpartition(":")[2] == what for m in ms],
            [m for ms in self._measured.values() for m in ms],
        ):
            if same:
                return sum(seconds for seconds, _ in same) / sum(work for _, work in same)
        return None

    def estimate_left(self) -> float | None:
        """Seconds the stages not yet finished should take (the current one whole); None before the first stage
        has been measured."""
        left = range(self._done, len(self.kinds))
        rates = [self._rate(self.kinds[i]) for i in left]
        if any(rate is None for rate in rates):
            return None
        return float(sum(rate * self.work[i] for rate, i in zip(rates, left, strict=True)))  # type: ignore[operator]
