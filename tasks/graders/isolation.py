"""Hard wall-clock limits for computations on untrusted model output, enforced by killing a worker process.

Why a process and not a signal or a thread: symbolic simplification (sympy, reached through math-verify) can run
for hours on inputs such as ``9^{9^{9^9}}``, and much of that time is spent inside C code (big-integer
arithmetic, the regex engine) that never returns to the interpreter, so ``SIGALRM`` is not delivered in time; a
thread cannot be stopped at all; and ``signal`` only works on the main thread. A long-lived worker subprocess that
is SIGKILLed when it overruns its deadline gives a limit that really holds, from any thread.

Workers are plain ``python -c`` subprocesses (not ``multiprocessing``), so the caller's ``__main__`` is never
re-imported and no global start-method or fork-server state is touched. A worker serves one request at a time;
a pool keeps ``size`` of them warm. After a kill, the replacement is started immediately in the background.

**Each answer is charged only its own time.** Its limit runs from the moment its request reaches a started worker
to the answer. Waiting for a worker is never charged: not queueing behind other answers, and not a replacement's
start-up after a kill (importing sympy takes seconds on a busy machine, and charging it to the next answer once
marked plain correct answers as timed out whenever the machine was loaded). A worker that has not started within
``startup_timeout_s`` is an error, so the wait is bounded too. **An overrun the machine caused is retried once:**
the worker is killed, and unless it had a CPU to itself for the whole limit (:data:`OWN_TIME_SHARE` of it, read
from ``/proc``), the answer runs again, with the full limit, on a fresh worker started in its place (waited for,
uncharged); only a second overrun is a ``timeout``. An answer that did compute for its whole limit is a ``timeout``
at once: a retry would compute the same again. Where the worker's CPU time cannot be read (not Linux), every
overrun is retried. A hostile answer therefore costs at most twice its limit plus the kills and one start-up, and
the pool's other workers stay warm for the answers after it. A replacement that is still starting is handed out
only when no other worker is busy: otherwise a busy worker (or the replacement, once started) is waited for,
whichever is free first.

A batch (:meth:`IsolatedPool.call_many`) runs its answers concurrently, one thread per worker, each answer
exactly as a single call: same limit, same verdict, results in input order. A single call is a batch of one.

Protocol: the child imports a *registry* module that maps names to functions (``ISOLATED_FUNCTIONS``) and may
define a warm-up hook (``isolated_warmup``); requests are pickled ``(name, args)`` tuples over the child's
stdin/stdout pipes, answers are ``("ok", value)`` or ``("error", message)``.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Literal

# Extra address space a worker may allocate beyond what it holds after warm-up; a guard against inputs that
# make sympy build astronomically large objects (the time limit is the main defence).
MEMORY_HEADROOM_BYTES = 2 << 30
# An overrun is the answer's own when its worker had at least this share of a CPU for the whole limit; otherwise
# the machine's load took the time, and the answer is retried once on a fresh worker (module docstring).
OWN_TIME_SHARE = 0.9
# How often a call waiting for a worker looks again whether a starting replacement has become ready (a ready
# message does not wake the pool's condition variable); small against any limit, cheap to poll.
STARTING_POLL_S = 0.02


@dataclass(frozen=True)
class IsolatedResult:
    """Outcome of one isolated call: ``ok`` (``value`` holds the result), ``timeout`` or ``error``."""

    status: Literal["ok", "timeout", "error"]
    value: Any = None
    error: str | None = None


# The child imports this module by name (``-m`` would execute it a second time as ``__main__``).
_CHILD_CODE = f"import sys; from {__name__} import serve; serve(sys.argv[1])"


class _Worker:
    """One child process running :func:`serve` for a registry module."""

    def __init__(self, registry: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD_CODE, registry],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self._send = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self._recv = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.ready = False
        self.broken = False  # the pipe failed: replace this worker even if the process is still exiting
        self.started_at = time.monotonic()

    def wait_ready(self, timeout_s: float, *, startup_timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the child to import its registry and warm up; True once it is ready.

        A child that has been starting for longer than ``startup_timeout_s`` in all is declared broken.
        """
        if self.ready:
            return True
        try:
            if not self._recv.poll(max(0.0, timeout_s)):
                if time.monotonic() - self.started_at > startup_timeout_s:
                    raise RuntimeError(f"isolated worker did not start within {startup_timeout_s:.0f} s")
                return False
            message = self._recv.recv()
        except (EOFError, OSError) as exc:
            raise RuntimeError(f"isolated worker exited during start-up (status {self.proc.poll()})") from exc
        if message != ("ready", None):
            raise RuntimeError(f"isolated worker failed to start: {message!r}")
        self.ready = True
        return True

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system) the child has used so far, from ``/proc``; None where it cannot be read."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    def has_started(self) -> bool:
        """True once the ready message (or an exit) is waiting to be read; never blocks."""
        return self.ready or self._recv.poll(0)

    def request(self, func: str, args: tuple[Any, ...], timeout_s: float) -> IsolatedResult:
        """Send one request; ``timeout`` if no answer arrives within ``timeout_s`` (the caller then kills us)."""
        try:
            self._send.send((func, args))
            if not self._recv.poll(timeout_s):
                return IsolatedResult("timeout", error=f"no answer within {timeout_s:g} s")
            status, value = self._recv.recv()
        except (EOFError, OSError) as exc:
            self.broken = True
            return IsolatedResult("error", error=f"worker died ({type(exc).__name__}, status {self.proc.poll()})")
        if status == "ok":
            return IsolatedResult("ok", value=value)
        return IsolatedResult("error", error=str(value))

    def kill(self) -> None:
        self._send.close()
        self._recv.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class IsolatedPool:
    """A fixed-size pool of warm worker processes with a hard per-call wall-clock limit.

    ``call(func, *args, timeout_s=...)`` runs ``registry.ISOLATED_FUNCTIONS[func](*args)`` in a worker and
    returns within ``timeout_s`` (plus the kill) of reaching a started worker, or twice that when the first attempt
    overran and was retried (module docstring). Thread-safe: up to ``size`` calls run
    concurrently, further callers wait for a free worker. Safe across ``fork``: a child process of the owner
    starts its own workers instead of talking to the parent's.
    """

    def __init__(self, registry: str, *, size: int = 2, startup_timeout_s: float = 120.0) -> None:
        if size < 1:
            raise ValueError(f"pool size must be >= 1, got {size}")
        self.registry = registry
        self.size = size
        self.startup_timeout_s = startup_timeout_s
        self._cond = threading.Condition()
        self._owner_pid = os.getpid()
        self._idle: list[_Worker] = [_Worker(registry) for _ in range(size)]
        self._closed = False
        self.waited_s = 0.0  # seconds calls waited for their worker to start, charged to no answer (diagnostics)

    def _check_owner(self) -> None:
        if os.getpid() != self._owner_pid:  # forked: the inherited workers belong to the parent
            self._owner_pid = os.getpid()
            self._idle = [_Worker(self.registry) for _ in range(self.size)]

    def _acquire(self) -> _Worker:
        """A free worker (waiting for one as long as it takes), preferring one that has started.

        A worker that is still starting is taken only when every worker is idle, i.e. when no busy one could
        come back sooner; the taker then waits for its start-up, uncharged (module docstring).
        """
        with self._cond:
            self._check_owner()
            while True:
                if self._closed:
                    raise RuntimeError("isolated pool is closed")
                worker = next((w for w in self._idle if w.has_started()), None)
                if worker is None and self._idle and len(self._idle) == self.size:
                    worker = self._idle[0]
                if worker is not None:
                    self._idle.remove(worker)
                    return worker
                self._cond.wait(STARTING_POLL_S)

    def _release(self, worker: _Worker) -> None:
        with self._cond:
            if self._closed:
                worker.kill()
            else:
                self._idle.append(worker)
            self._cond.notify()

    def call(self, func: str, *args: Any, timeout_s: float) -> IsolatedResult:
        """Run ``func(*args)`` in a worker, killing it if it overruns its ``timeout_s`` limit, and once more on a
        fresh worker if the machine's load may have taken that time; a ``timeout`` when the answer computed for
        its whole limit or both attempts overran.

        The limit runs from the moment the request reaches a started worker: waiting for one (queueing, or a
        replacement's start-up, at most ``startup_timeout_s``) is not charged.
        """
        return self.call_many(func, [args], timeout_s=timeout_s)[0]

    def call_many(self, func: str, arg_tuples: Sequence[tuple[Any, ...]], *, timeout_s: float) -> list[IsolatedResult]:
        """``call(func, *args, timeout_s=timeout_s)`` for every ``args``, run concurrently on the pool's workers.

        Why: one caller grading answers one after another keeps a single worker busy. Here one thread per worker
        takes the next answer as soon as its previous one returns, so the whole pool works. Each answer is one
        ordinary call (its own limit, counted from when its request reaches a started worker, and its own retry; a
        kill or a crash costs only that answer), and the results are in the order of ``arg_tuples``. An exception
        (a closed pool, workers that cannot start) cancels the answers not yet started and is raised, as the first
        failing call would raise.
        """
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        width = min(self.size, len(arg_tuples))
        if width <= 1:
            return [self._call_one(func, args, timeout_s) for args in arg_tuples]
        with ThreadPoolExecutor(width, thread_name_prefix="isolated-call") as threads:
            futures = [threads.submit(self._call_one, func, args, timeout_s) for args in arg_tuples]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:
                    future.cancel()
                raise

    def _call_one(self, func: str, args: tuple[Any, ...], timeout_s: float) -> IsolatedResult:
        """One answer under its hard limit, retried once on a fresh worker after an overrun the machine's load
        caused (the body of :meth:`call`); thread-safe."""
        worker = self._acquire()
        healthy = False  # unless the call ends normally below: then the worker goes back to the pool as it is
        try:
            result, own_time = self._attempt(worker, func, args, timeout_s)
            if result.status == "timeout" and not own_time:  # killed; once more on a fresh worker in its place
                worker.kill()
                worker = _Worker(self.registry)
                result, _ = self._attempt(worker, func, args, timeout_s)
                if result.status == "timeout":
                    result = IsolatedResult(
                        "timeout", error=f"no answer within {timeout_s:g} s, twice (retried on a fresh worker)"
                    )
            # A worker that overran its limit or died is replaced at once; one whose function raised is kept.
            healthy = result.status != "timeout" and not worker.broken and worker.proc.poll() is None
            return result
        finally:
            if not healthy:
                worker.kill()
                worker = _Worker(self.registry)
            self._release(worker)

    def _attempt(
        self, worker: _Worker, func: str, args: tuple[Any, ...], timeout_s: float
    ) -> tuple[IsolatedResult, bool]:
        """Run the answer once on ``worker``, charged from its request: the wait for the worker to start is not
        (it is added to :attr:`waited_s`), and a worker not started within ``startup_timeout_s`` raises. Also
        says whether a time-out was the answer's own (the worker had :data:`OWN_TIME_SHARE` of a CPU)."""
        waiting = time.monotonic()
        ready = worker.wait_ready(self.startup_timeout_s, startup_timeout_s=self.startup_timeout_s)
        with self._cond:
            self.waited_s += time.monotonic() - waiting
        if not ready:
            raise RuntimeError(f"isolated worker did not start within {self.startup_timeout_s:.0f} s")
        before = worker.cpu_seconds()
        result = worker.request(func, args, timeout_s)
        after = worker.cpu_seconds() if result.status == "timeout" else None
        own_time = before is not None and after is not None and after - before >= OWN_TIME_SHARE * timeout_s
        return result, own_time

    def wait_until_ready(self) -> None:
        """Block until every idle worker has started (e.g. before timing calls); replacements included."""
        with self._cond:
            self._check_owner()
            idle = list(self._idle)
        for worker in idle:
            worker.wait_ready(self.startup_timeout_s, startup_timeout_s=self.startup_timeout_s)

    def close(self) -> None:
        """Stop all idle workers now; busy ones are stopped when their call returns."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


_SHARED: dict[str, IsolatedPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(registry: str, size: int = 2) -> IsolatedPool:
    """The process-wide pool for ``registry`` (created on first use, closed at interpreter exit)."""
    with _SHARED_LOCK:
        pool = _SHARED.get(registry)
        if pool is None or pool._closed:
            pool = _SHARED[registry] = IsolatedPool(registry, size=size)
            atexit.register(pool.close)
        return pool


def _limit_memory() -> None:
    """Cap the worker's address space at its current size plus :data:`MEMORY_HEADROOM_BYTES` (Linux only)."""
    try:
        import resource

        with open("/proc/self/statm") as statm:
            current = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):
        return
    limit = current + MEMORY_HEADROOM_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def serve(registry_name: str) -> None:
    """Child main loop: answer requests until stdin closes. Stray prints go to stderr, never to the pipe."""
    send = Connection(os.dup(1), readable=False)
    recv = Connection(os.dup(0), writable=False)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    logging.disable(logging.WARNING)  # libraries' warnings about disabled internal timeouts are expected here
    try:
        registry = importlib.import_module(registry_name)
        warmup = getattr(registry, "isolated_warmup", None)
        if warmup is not None:
            warmup()
        functions = registry.ISOLATED_FUNCTIONS
    except Exception as exc:
        send.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    _limit_memory()
    send.send(("ready", None))
    while True:
        try:
            func, args = recv.recv()
        except EOFError:
            return
        try:
            answer = ("ok", functions[func](*args))
        except Exception as exc:
            answer = ("error", f"{type(exc).__name__}: {exc}")
        send.send(answer)
