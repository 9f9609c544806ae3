"""A sandbox for model-generated programs: each runs in a process of its own that cannot touch the user's files,
network or processes, under limits on time, memory, files, processes and output (docs/sandbox.md).

Why not the classic "reliability guard" (``exec`` in a forked process after setting ``os.system`` and friends to
``None``, as HumanEval's and the official StableDRL evaluation's executors do): a program can re-import what was
removed, open any file the user can, reach the network, signal the parent, call ``ctypes``, or exhaust memory and
processes. Generated code runs thousands of times per RL step; the isolation must hold whatever it does. So it comes
from the kernel, not from Python:

* **namespaces** (``unshare``): a mount namespace whose root is an empty tmpfs holding only ``/usr`` and the
  interpreter's installation (read-only), three device files and ``/work``, a small writable tmpfs with the program
  (``pivot_root``; the host's tree is detached, so no path leads to the user's files); a network namespace with no
  interface up; a PID namespace (the program sees only its own processes, so it cannot signal the harness, and when
  it ends every process it left behind is killed); IPC and UTS namespaces;
* **no privileges**: as root, the program runs under a uid of its own (leased per sandbox, so the process limit of
  one sandbox is not shared with another), which drops every capability; as a user, in a user namespace, with its
  capability sets emptied; ``PR_SET_NO_NEW_PRIVS`` either way;
* **resource limits** (:class:`Limits`): CPU seconds, address space, file size, open files, processes, the working
  directory's size, a wall-clock limit enforced by killing the whole namespace, and output capped.

:func:`run_program` runs one program and says how it ended (:class:`Outcome`); a hostile program ends as a failed
sample and nothing else happens. What this does not guarantee: a kernel vulnerability reachable from an unprivileged
process is not blocked (there is no seccomp filter), and the interpreter's own standard library and ``/usr`` are
readable. It needs Linux with ``unshare`` (util-linux) and either root or unprivileged user namespaces; elsewhere it
refuses to run code at all (:class:`SandboxUnavailable`) rather than run it unconfined.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stabledrl_bench.errors import UserError

INIT = Path(__file__).with_name("_sandbox_init.py")
FIRST_UID = 61000  # sandbox uids (root mode): FIRST_UID .. FIRST_UID + UIDS - 1, one per running sandbox
UIDS = 256
LEASES = Path(tempfile.gettempdir()) / "stabledrl-sandbox-uids"
MAX_SOURCE_BYTES = 64 * 1024  # the program travels on the command line


class SandboxUnavailable(UserError):
    """This machine cannot confine a program (no Linux namespaces): nothing is run."""


@dataclass(frozen=True)
class Limits:
    """What one program may use. Defaults suit a unit-test program of HumanEval or MBPP."""

    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_bytes: int = 512 << 20  # address space
    file_bytes: int = 8 << 20  # largest file it may write
    workdir_bytes: int = 16 << 20  # /work in all
    open_files: int = 64
    processes: int = 16  # processes and threads of its uid
    output_bytes: int = 1 << 20  # stdout and stderr together

    def rlimits(self, own_uid: bool) -> dict[str, int]:
        """The resource limits; without a uid of its own (``own_uid`` False: run as a user) the process limit counts
        the user's processes too, so it is what the user runs now plus the program's share."""
        processes = self.processes if own_uid else self.processes + _processes_of(os.geteuid())
        return {
            "RLIMIT_CPU": self.cpu_seconds,
            "RLIMIT_AS": self.memory_bytes,
            "RLIMIT_FSIZE": self.file_bytes,
            "RLIMIT_NOFILE": self.open_files,
            "RLIMIT_NPROC": processes,
            "RLIMIT_CORE": 0,
        }


def _processes_of(uid: int) -> int:
    """Processes and threads that ``uid`` runs now (what RLIMIT_NPROC counts)."""
    count = 0
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                count += len(list((entry / "task").iterdir()))
    return count


@dataclass(frozen=True)
class Outcome:
    """How a program ended: ``ok`` (exit code 0), ``error`` (another exit code, or killed by a signal: a limit it hit,
    such as CPU time, ends this way), ``timeout`` (the wall-clock limit) or ``output_limit`` (it wrote more than its
    share); with its exit code (negative: the signal), its output (cut at the limit) and its wall time."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    notes: tuple[str, ...] = field(default=())

    @property
    def passed(self) -> bool:
        return self.status == "ok"


def available() -> str | None:
    """Why programs cannot be confined here, or None when they can."""
    if not sys.platform.startswith("linux"):
        return "the sandbox needs Linux namespaces"
    if shutil.which("unshare") is None:
        return "the sandbox needs `unshare` (util-linux)"
    probe = subprocess.run([*_unshare(), "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"this machine refuses new namespaces ({probe.stderr.strip() or probe.returncode})"
    return None


def _unshare() -> list[str]:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child"]


@contextlib.contextmanager
def _uid() -> Iterator[int | None]:
    """A sandbox uid no other running sandbox holds (root only: a user's sandboxes all run as that user)."""
    if os.geteuid() != 0:
        yield None
        return
    LEASES.mkdir(mode=0o700, exist_ok=True)
    for offset in range(UIDS):
        lease = open(LEASES / str(offset), "w")  # noqa: SIM115 (held until the program ends)
        try:
            fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lease.close()
            continue
        try:
            yield FIRST_UID + offset
        finally:
            lease.close()
        return
    raise RuntimeError(f"all {UIDS} sandbox uids are in use")


def run_program(
    source: str, *, stdin: str = "", limits: Limits = Limits(), files: Mapping[str, str] | None = None
) -> Outcome:
    """Run the Python program ``source`` in the sandbox (module docstring), with ``stdin`` as its input and
    ``files`` (name -> text) beside it in ``/work``; return how it ended. Raises :class:`SandboxUnavailable` when
    this machine cannot confine it."""
    reason = _availability()
    if reason is not None:
        raise SandboxUnavailable(f"not running generated code: {reason} (docs/sandbox.md)")
    if len(source.encode()) > MAX_SOURCE_BYTES:
        return Outcome("error", None, "", f"program longer than {MAX_SOURCE_BYTES} bytes", 0.0)
    python = os.path.realpath(sys.executable)
    with _uid() as uid:
        spec = {
            "source": source,
            "files": dict(files or {}),
            "prefix": sys.base_prefix,
            "python": python,
            "uid": uid,
            "workdir_bytes": limits.workdir_bytes,
            "limits": limits.rlimits(own_uid=uid is not None),
        }
        command = [*_unshare(), python, "-I", "-S", "-B", str(INIT), json.dumps(spec)]
        start = time.monotonic()
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        status, out, err = _communicate(process, stdin.encode(), limits)
        seconds = time.monotonic() - start
    code = process.returncode
    if status is None:
        status = "ok" if code == 0 else "error"
    return Outcome(status, code, _text(out, limits), _text(err, limits), seconds)


def _availability() -> str | None:
    global _AVAILABLE
    if _AVAILABLE is _UNKNOWN:
        _AVAILABLE = available()
    return _AVAILABLE  # type: ignore[return-value]


_UNKNOWN = object()
_AVAILABLE: object = _UNKNOWN


def _communicate(process: subprocess.Popen, data: bytes, limits: Limits) -> tuple[str | None, bytes, bytes]:
    """Feed stdin, read stdout and stderr up to the output limit and the wall-clock limit; on either, kill the whole
    namespace. Returns (status if a limit ended it, stdout, stderr)."""
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    with contextlib.suppress(BrokenPipeError):
        process.stdin.write(data)
    with contextlib.suppress(BrokenPipeError):
        process.stdin.close()
    chunks: dict[int, list[bytes]] = {process.stdout.fileno(): [], process.stderr.fileno(): []}
    deadline = time.monotonic() + limits.wall_seconds
    total, status = 0, None
    with selectors.DefaultSelector() as selector:
        for stream in (process.stdout, process.stderr):
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                status = "timeout"
                break
            for key, _ in selector.select(timeout=left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                chunks[key.fd].append(chunk)
                total += len(chunk)
            if total > limits.output_bytes:
                status = "output_limit"
                break
    if status is not None:
        _kill(process)
    try:
        process.wait(timeout=max(0.0, deadline - time.monotonic()) + 1.0)
    except subprocess.TimeoutExpired:  # closed its output but keeps running
        status = "timeout"
        _kill(process)
    out, err = (b"".join(chunks[stream.fileno()]) for stream in (process.stdout, process.stderr))
    process.stdout.close()
    process.stderr.close()
    return status, out, err


def _kill(process: subprocess.Popen) -> None:
    """End the program's namespace: its first process is killed (a PID namespace ends with it, every other process
    in it killed by the kernel), and ``unshare``, which waits for it, reaps it and exits. Killing ``unshare`` first
    would work too (``--kill-child``), but would leave the first process to whichever process adopts orphans here,
    which may never reap it. ``unshare`` itself is killed only if it has not exited after a second."""
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
    with contextlib.suppress(OSError, ValueError):
        for child in children.read_text().split():
            os.kill(int(child), signal.SIGKILL)
    try:
        process.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _text(data: bytes, limits: Limits) -> str:
    return data[: limits.output_bytes].decode("utf-8", errors="replace")
