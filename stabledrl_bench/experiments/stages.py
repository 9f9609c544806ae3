"""Overall progress of a long job made of stages: "stage k of N", the time elapsed, and an estimate of the rest.

Why: ``reproduce`` runs tens of stages (warm starts, RL runs, evaluations), each with its own progress bar; a user
needs to know where the whole job is and roughly when it ends, from the first minutes on. Stages differ wildly in
cost, so each declares its *work* (token-forwards, from its budget: :mod:`.plan`) and the estimate is work x seconds
per unit of work. The rate is refined as stages finish: the stages of a kind (``task:what``) take the measured rate
of that kind, else of ``what`` on any task, else the rate of every stage measured so far, so there is an estimate
as soon as the first stage has run. Reused stages (found in the cache) take no time and say nothing about the cost
of a real one, so they are left out of the estimate.

With several workers (``reproduce --workers``) stages run side by side, each once the stages it needs have finished.
The estimate then simulates the rest of the run: the stages not yet finished, in the scheduler's order (those other
stages wait for first, then plan order), each on the first worker to come free after its inputs are ready, a
running stage for what its kind's rate leaves of it. One worker gives the plain sum.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stabledrl_bench.experiments.workers import Progress, critical_path


def duration(seconds: float) -> str:
    """``75`` -> ``1m15s``; ``3725`` -> ``1h02m``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@dataclass(frozen=True)
class Planned:
    """One stage of the plan: its key, kind (``task:what``), what the progress line says, its work (any one unit,
    > 0) and the stages it needs."""

    key: str
    kind: str
    label: str
    work: float = 1.0
    after: tuple[str, ...] = ()


class Stages(Progress):
    """The planned stages of a job, started and ended by key (in any order their inputs allow) on ``workers``."""

    def __init__(
        self,
        plan: Sequence[Planned],
        *,
        workers: int = 1,
        clock: Callable[[], float] = time.monotonic,
        out: Callable[[str], None] = print,
    ) -> None:
        self.plan = {stage.key: stage for stage in plan}
        if len(self.plan) != len(plan) or not all(stage.work > 0 for stage in plan):
            raise ValueError(f"a plan needs {len(plan)} distinct keys, each with a positive amount of work")
        self.workers = max(1, workers)
        # the scheduler's order: the longest chain of work first, then plan order (workers.run_graph)
        chains = critical_path({s.key: s.after for s in plan}, {s.key: s.work for s in plan})
        self._order = sorted(self.plan, key=lambda key: (-chains[key], list(self.plan).index(key)))
        self._clock, self._out = clock, out
        self._start = clock()
        self._started: dict[str, float] = {}  # key -> when it began (running stages)
        self._finished: set[str] = set()
        self._measured: dict[str, list[tuple[float, float]]] = {}  # kind -> (seconds, work) of each measured stage

    def begin(self, key: str, running: int = 1) -> None:
        """Announce a stage (``running``: how many run now, it included)."""
        if key in self._started or key in self._finished:
            raise RuntimeError(f"stage {key} began twice")
        now = self._clock()
        self._started[key] = now
        left = self.estimate_left()
        estimate = f"~{duration(left)} left" if left is not None else "estimate after the first stage"
        side = f", {running} running" if self.workers > 1 else ""
        number = len(self._finished) + len(self._started)
        self._out(
            f"[stage {number}/{len(self.plan)} | {duration(now - self._start)} elapsed, {estimate}{side}] "
            f"{self.plan[key].label}"
        )

    def end(self, key: str, result: Any = None) -> None:
        """A stage finished; one whose result says ``reused`` (found in the cache) does not enter the estimate.
        The lines its result carries (``lines``) are printed."""
        if key not in self._started:
            raise RuntimeError(f"stage {key} ended before it began")
        began = self._started.pop(key)
        self._finished.add(key)
        stage = self.plan[key]
        if not getattr(result, "reused", False):
            self._measured.setdefault(stage.kind, []).append((self._clock() - began, stage.work))
        for line in getattr(result, "lines", ()):
            self._out(line)

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
        """Seconds until every stage has finished (see the module docstring); None before the first stage has been
        measured."""
        left = [self.plan[key] for key in (self._order if self.workers > 1 else self.plan) if key not in self._finished]
        rates = {stage.key: self._rate(stage.kind) for stage in left}
        if any(rate is None for rate in rates.values()):
            return None
        now = self._clock()
        remaining = {key: rates[key] * self.plan[key].work for key in rates}  # type: ignore[operator]
        ends: dict[str, float] = {}
        free: list[float] = []
        for key, began in self._started.items():
            ends[key] = max(0.0, remaining[key] - (now - began))
            free.append(ends[key])
        free += [0.0] * max(0, self.workers - len(free))
        heapq.heapify(free)
        for stage in left:
            if stage.key in ends:
                continue
            ready = max((ends.get(need, 0.0) for need in stage.after), default=0.0)
            start = max(heapq.heappop(free), ready)
            ends[stage.key] = start + remaining[stage.key]
            heapq.heappush(free, ends[stage.key])
        return max(ends.values(), default=0.0)
