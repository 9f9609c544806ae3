"""Independent jobs on several cores: a pool of worker processes, and a scheduler that runs a graph of stages on it.

Why processes and not threads: the tiny models of the CPU presets gain nothing from a second intra-op thread, and
lose most of their speed when another program competes for the cores (:func:`~stabledrl_bench.processes.
threads_for`). So a job runs in a process of its own with the thread count of its size, and the cores are used by
running independent jobs side by side: methods, seeds, the warm starts of different tasks, evaluations. Each job is
deterministic given its inputs (explicit random generators, a fixed thread count), so a record is the same whether
its job ran alone or beside others (``reproduce --workers``).

* :class:`WorkerPool`: ``N`` spawned processes, each with the given thread count. A worker ignores Ctrl-C (the
  terminal sends it to every process of the group); the parent asks the running jobs to stop
  (:meth:`WorkerPool.interrupt`): in a job, SIGTERM raises ``KeyboardInterrupt``, so the job leaves through the
  same path as an interrupted run in the foreground and says what re-running resumes. A parent killed without
  Ctrl-C takes its workers with it (:func:`_end_with_parent`). A job's printed output goes to its own log file:
  several progress bars in one terminal would overwrite each other.
* :func:`run_graph`: the scheduler. A stage runs once every stage it needs has finished; with one worker, in this
  process, in plan order, printing to the terminal as a single job does.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabledrl_bench.errors import UserError, rerun_notes

_RUNNING = False  # in a worker: a job is running (SIGTERM interrupts it), else the worker is idle (SIGTERM ends it)


def _on_terminate(signum: int, frame: Any) -> None:
    del signum, frame
    if _RUNNING:
        raise KeyboardInterrupt
    os._exit(0)


@dataclass(frozen=True)
class Outcome:
    """What a job returned (``done``), said about its interruption (``interrupted``: its rerun notes), or raised
    (``failed``: the exception, or its traceback text when it does not pickle)."""

    key: str
    status: str
    value: Any = None


def _call(key: str, function: Callable[..., Any], args: tuple, log: Path | None) -> Outcome:
    """Run one job (in a worker: with its output in ``log``) and describe how it ended."""
    global _RUNNING
    redirect: contextlib.AbstractContextManager = contextlib.nullcontext()
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        redirect = _redirected(log)
    try:
        with redirect:
            _RUNNING = True
            try:
                return Outcome(key, "done", function(*args))
            finally:
                _RUNNING = False
    except KeyboardInterrupt as exc:
        return Outcome(key, "interrupted", rerun_notes(exc))
    except Exception as exc:  # reported by the parent, which stops the other jobs
        try:
            import pickle

            pickle.dumps(exc)
            return Outcome(key, "failed", exc)
        except Exception:
            return Outcome(key, "failed", RuntimeError("".join(traceback.format_exception(exc))))


@contextlib.contextmanager
def _redirected(log: Path):
    with open(log, "a", buffering=1) as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        yield


def _serve(tasks: Any, results: Any, threads: int) -> None:
    """A worker's loop: jobs from ``tasks`` until ``None``, outcomes to ``results``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_terminate)
    _end_with_parent()
    import torch

    torch.set_num_threads(threads)
    while (task := tasks.get()) is not None:
        outcome = _call(*task)
        if _PARENT_GONE.is_set():
            break  # nobody is left to take the outcome
        results.put(outcome)


PARENT_GONE_GRACE_S = 60.0  # how long a worker whose parent died lets its job leave through its interrupt path
_PARENT_GONE = threading.Event()  # in a worker: the process that started it has ended


def _end_with_parent() -> None:
    """End this worker when the process that started it is gone. A parent stopped by Ctrl-C stops its jobs itself
    (:meth:`WorkerPool.interrupt`); one killed otherwise (``kill``, the out-of-memory killer, a closed session)
    cannot, and its workers would run their jobs to the end with nobody to take the results, holding the cores. So
    a thread waits on the parent's sentinel; when it fires, the running job is interrupted as by
    :meth:`WorkerPool.interrupt` (SIGTERM: its checkpoint and rerun note, as in the foreground) and the worker ends
    when the job has left; a job that does not leave within :data:`PARENT_GONE_GRACE_S` is ended with it."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        _PARENT_GONE.set()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(PARENT_GONE_GRACE_S)
        os._exit(1)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()


@dataclass
class WorkerPool:
    """``workers`` spawned processes with ``threads`` intra-op threads each (see the module docstring)."""

    workers: int
    threads: int
    _processes: list[Any] = field(default_factory=list)
    _busy: dict[str, Any] = field(default_factory=dict)  # job key -> the process running it

    def __post_init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._results = context.Queue()
        self._tasks = [context.Queue() for _ in range(self.workers)]
        self._processes = [
            context.Process(target=_serve, args=(tasks, self._results, self.threads), daemon=True)
            for tasks in self._tasks
        ]
        for process in self._processes:
            process.start()
        self._idle = list(range(self.workers))

    @property
    def free(self) -> int:
        return len(self._idle)

    @property
    def running(self) -> int:
        return len(self._busy)

    def submit(self, key: str, function: Callable[..., Any], args: tuple, log: Path) -> None:
        """Start a job on an idle worker (the caller checks :attr:`free`)."""
        slot = self._idle.pop(0)
        self._busy[key] = slot
        self._tasks[slot].put((key, function, args, log))

    def next_outcome(self) -> Outcome:
        """Wait for the next job to end; a worker that died (killed, out of memory) is a failure of its job."""
        while True:
            try:
                outcome = self._results.get(timeout=1.0)
            except queue.Empty:
                for key, slot in self._busy.items():
                    if not self._processes[slot].is_alive():
                        code = self._processes[slot].exitcode
                        self._busy.pop(key)
                        return Outcome(key, "failed", RuntimeError(f"the worker running {key} died (exit code {code})"))
                continue
            self._idle.append(self._busy.pop(outcome.key))
            return outcome

    def interrupt(self, grace: float = 60.0) -> list[Outcome]:
        """Ask every running job to stop (SIGTERM: ``KeyboardInterrupt`` inside it) and collect how they ended,
        waiting up to ``grace`` seconds; then end the workers. (A job that had just finished leaves its worker idle,
        and an idle worker ends on SIGTERM: it is not waited for.)"""
        for slot in self._busy.values():
            if self._processes[slot].is_alive():
                os.kill(self._processes[slot].pid, signal.SIGTERM)
        ended = []
        deadline = time.monotonic() + grace
        while self._busy and time.monotonic() < deadline:
            try:
                outcome = self._results.get(timeout=0.2)
            except queue.Empty:
                for key, slot in list(self._busy.items()):
                    if not self._processes[slot].is_alive():
                        self._busy.pop(key)
                continue
            self._busy.pop(outcome.key, None)
            ended.append(outcome)
        self.close()
        return ended

    def close(self) -> None:
        """End every worker: idle ones leave their loop; any still running is killed."""
        for tasks in self._tasks:
            with contextlib.suppress(Exception):
                tasks.put(None)
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()


# ------------------------------------------------------------------------------------------------ the scheduler
@dataclass(frozen=True)
class Stage:
    """One job of a graph: ``run(*inputs)`` where ``inputs`` are the results of the stages it needs (``after``),
    in that order. ``run`` must be a module-level function (it is pickled into a worker)."""

    key: str
    run: Callable[..., Any]
    args: tuple = ()
    after: tuple[str, ...] = ()
    log: Path | None = None  # where its output goes when it runs in a worker
    work: float = 1.0  # its expected cost, in any unit shared by the graph's stages (the scheduler's priority)


class Progress:
    """What the scheduler tells about the stages: a no-op base (:class:`~.stages.Stages` prints)."""

    def begin(self, key: str, running: int) -> None:
        del key, running

    def end(self, key: str, result: Any) -> None:
        del key, result


def run_graph(stages: Sequence[Stage], workers: int, threads: int, progress: Progress | None = None) -> dict[str, Any]:
    """Run every stage once its inputs are ready, on ``workers`` processes (1: here, in order); return each stage's
    result by key. A failing stage stops the others and re-raises; Ctrl-C stops every job and raises
    ``KeyboardInterrupt`` carrying the jobs' notes on what re-running resumes."""
    progress = progress or Progress()
    keys = {stage.key for stage in stages}
    unknown = sorted({need for stage in stages for need in stage.after} - keys)
    if unknown or len(keys) != len(stages):
        raise ValueError(f"a stage graph needs unique keys and known inputs (unknown: {unknown})")
    results: dict[str, Any] = {}
    if workers <= 1:
        for stage in _in_order(stages):
            progress.begin(stage.key, 1)
            results[stage.key] = stage.run(*stage.args, *(results[need] for need in stage.after))
            progress.end(stage.key, results[stage.key])
        return results
    pool = WorkerPool(min(workers, len(stages)), threads)
    try:
        ended = _drive(pool, list(stages), results, progress)
        if ended is not None and ended.status == "failed":
            pool.interrupt()
            raise _failure(ended, {stage.key: stage for stage in stages})
        if ended is not None:  # a job stopped from outside: stop every job, as on Ctrl-C
            raise _interrupted([ended, *pool.interrupt()])
    except KeyboardInterrupt as exc:
        if getattr(exc, "rerun_notes", None) is not None:
            raise
        raise _interrupted(pool.interrupt()) from None
    finally:
        pool.close()
    return results


def critical_path(after: Mapping[str, Sequence[str]], work: Mapping[str, float]) -> dict[str, float]:
    """For every stage (key -> the stages it needs), the work of the longest chain that starts with it: its own work
    plus the longest chain among the stages that need it. No schedule ends before the longest chain, and starting
    the stages on long chains first (a warm start before the evaluations of another seed, a training before a frozen
    control, a control before the short evaluations) keeps every worker busy until the end instead of leaving one
    long stage to run alone."""
    needed_by: dict[str, set[str]] = {key: set() for key in after}
    for key, needs in after.items():
        for need in needs:
            needed_by[need].add(key)
    chains: dict[str, float] = {}

    def chain(key: str) -> float:
        if key not in chains:
            chains[key] = work[key] + max((chain(other) for other in needed_by[key]), default=0.0)
        return chains[key]

    return {key: chain(key) for key in after}


def _drive(pool: WorkerPool, pending: list[Stage], results: dict[str, Any], progress: Progress) -> Outcome | None:
    """Submit the stages whose inputs are ready to the free workers until all have run, those on the longest chain
    of work first (:func:`critical_path`), then in plan order; the first job that does not end normally stops it
    (returned)."""
    order = {stage.key: i for i, stage in enumerate(pending)}
    chains = critical_path({s.key: s.after for s in pending}, {s.key: s.work for s in pending})
    while pending or pool.running:
        ready = [s for s in pending if all(need in results for need in s.after)]
        for stage in sorted(ready, key=lambda s: (-chains[s.key], order[s.key])):
            if not pool.free:
                break
            pending.remove(stage)
            progress.begin(stage.key, pool.running + 1)
            args = (*stage.args, *(results[need] for need in stage.after))
            pool.submit(stage.key, stage.run, args, stage.log or Path(os.devnull))
        outcome = pool.next_outcome()
        if outcome.status != "done":
            return outcome
        results[outcome.key] = outcome.value
        progress.end(outcome.key, outcome.value)
    return None


def _in_order(stages: Sequence[Stage]) -> list[Stage]:
    """The stages in plan order, each after the stages it needs (a stage listed before its input waits for it)."""
    done: set[str] = set()
    ordered, pending = [], list(stages)
    while pending:
        ready = next((s for s in pending if all(need in done for need in s.after)), None)
        if ready is None:
            raise ValueError(f"stages wait for each other: {', '.join(s.key for s in pending)}")
        pending.remove(ready)
        ordered.append(ready)
        done.add(ready.key)
    return ordered


def _interrupted(outcomes: Sequence[Outcome]) -> KeyboardInterrupt:
    exc = KeyboardInterrupt()
    notes = [note for outcome in outcomes if outcome.status == "interrupted" for note in outcome.value]
    exc.rerun_notes = list(dict.fromkeys(notes))  # type: ignore[attr-defined]
    return exc


def _failure(outcome: Outcome, stages: Mapping[str, Stage]) -> BaseException:
    """The failed job's exception; an unexpected one names the job and its log."""
    error = outcome.value
    if isinstance(error, UserError):
        return error
    log = stages[outcome.key].log
    return RuntimeError(f"{outcome.key} failed{f' (its output: {log})' if log else ''}: {error}")
