"""The sandbox for generated programs: correct programs pass, and every kind of hostile program ends as a failed
sample with nothing else happening (files, network, processes, memory and time of the harness untouched)."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stabledrl_bench.tasks.graders import sandbox
from stabledrl_bench.tasks.graders.sandbox import Limits, SandboxUnavailable, run_program

pytestmark = pytest.mark.skipif(sandbox.available() is not None, reason=f"no sandbox here: {sandbox.available()}")
QUICK = Limits(cpu_seconds=2, wall_seconds=4.0)


def _uid_processes() -> list[str]:
    """Processes of every sandbox uid still there (zombies included: each must have been reaped)."""
    lines = subprocess.run(["ps", "-eo", "uid=,pid=,stat=,args="], capture_output=True, text=True).stdout.splitlines()
    uids = range(sandbox.FIRST_UID, sandbox.FIRST_UID + sandbox.UIDS)
    return [line for line in lines if line.split() and int(line.split()[0]) in uids]


def test_a_correct_program_passes_with_its_input_files_and_output() -> None:
    source = "import sys\ndata = open('numbers.txt').read().split()\nprint(sum(map(int, data)), sys.stdin.read())"
    outcome = run_program(source, stdin="hello", files={"numbers.txt": "1 2 3"})
    assert outcome.passed and outcome.stdout == "6 hello\n" and outcome.returncode == 0


def test_a_failing_program_is_an_error_with_its_traceback() -> None:
    outcome = run_program("assert 1 + 1 == 3, 'wrong sum'")
    assert outcome.status == "error" and outcome.returncode == 1 and "AssertionError: wrong sum" in outcome.stderr


def test_the_users_files_are_out_of_reach(tmp_path: Path) -> None:
    """A file of the user's, readable by everyone, and this repository: neither exists in the sandbox; writing
    anywhere but the working directory fails; the user's file is unchanged."""
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    secret.chmod(0o644)
    here = Path(__file__).resolve()
    source = f"""
import os
for path in ({str(secret)!r}, {str(here)!r}, '/etc/passwd', '/proc/self/environ'):
    try:
        open(path).read()
        print('READ', path)
    except OSError as exc:
        print('no', type(exc).__name__)
for path in ({str(secret)!r}, '/usr/evil', '/evil', '/tmp/evil'):
    try:
        open(path, 'w').write('x')
        print('WROTE', path)
    except OSError as exc:
        print('no', type(exc).__name__)
open('mine.txt', 'w').write('ok')
print(sorted(os.listdir('/')))
"""
    outcome = run_program(source, limits=QUICK)
    assert outcome.passed, outcome.stderr
    assert "READ" not in outcome.stdout and "WROTE" not in outcome.stdout
    assert secret.read_text() == "do not read"
    assert "['bin', 'dev', 'lib', 'lib64', 'root', 'sbin', 'usr', 'work']" in outcome.stdout


def test_no_network() -> None:
    """A server of the harness on the loopback: the program cannot connect, and the server sees nobody."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    source = f"""
import socket
for address in (('127.0.0.1', {port}), ('8.8.8.8', 53)):
    try:
        socket.create_connection(address, timeout=1)
        print('CONNECTED', address)
    except OSError as exc:
        print('no', exc.errno)
"""
    outcome = run_program(source, limits=QUICK)
    assert outcome.passed and "CONNECTED" not in outcome.stdout
    with pytest.raises(TimeoutError):
        server.accept()
    server.close()


def test_the_harness_cannot_be_signalled() -> None:
    """Killing this test's process by its pid, its parent, or every process it can see: the test lives on."""
    source = f"""
import os, signal
for pid in ({os.getpid()}, os.getppid(), -1):
    try:
        os.kill(pid, signal.SIGKILL)
        print('signalled', pid)
    except OSError as exc:
        print('no', pid, type(exc).__name__)
"""
    outcome = run_program(source, limits=QUICK)
    assert outcome.status in ("ok", "error")  # kill(-1) may take the program itself down: fine
    assert f"signalled {os.getpid()}" not in outcome.stdout


def test_ctypes_cannot_regain_privileges() -> None:
    """libc through ctypes: mounting, leaving the namespaces, becoming root again all fail."""
    source = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print('mount', libc.mount(b'none', b'/work', b'tmpfs', 0, None), ctypes.get_errno())
print('unshare', libc.unshare(0x10000000), ctypes.get_errno())
print('setuid', libc.setuid(0), ctypes.get_errno())
print('chroot', libc.chroot(b'/usr'), ctypes.get_errno())
"""
    outcome = run_program(source, limits=QUICK)
    assert outcome.passed, outcome.stderr
    results = [line.split()[1:] for line in outcome.stdout.splitlines()]
    assert results == [["-1", "1"]] * 4, outcome.stdout  # each refused with EPERM
    nested = "import subprocess, sys\n"
    nested += "print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True).stdout)"
    assert run_program(nested, limits=QUICK).stdout == "42\n\n"  # an ordinary subprocess still runs


def test_infinite_loops_and_programs_that_never_exit_end_at_their_limits() -> None:
    busy = run_program("while True: pass", limits=QUICK)
    assert busy.status == "error" and busy.returncode is not None and busy.seconds < QUICK.wall_seconds + 1
    asleep = run_program("import time\ntime.sleep(1000)", limits=QUICK)
    assert asleep.status == "timeout" and QUICK.wall_seconds <= asleep.seconds < QUICK.wall_seconds + 2


def test_a_memory_bomb_fails_alone() -> None:
    outcome = run_program("x = bytearray(4 << 30)\nprint('allocated')", limits=QUICK)
    assert outcome.status == "error" and "MemoryError" in outcome.stderr and "allocated" not in outcome.stdout


def test_a_fork_bomb_fails_alone_and_leaves_nothing() -> None:
    source = """
import os
children = 0
for _ in range(10000):
    try:
        if os.fork() == 0:
            import time
            time.sleep(60)
            os._exit(0)
        children += 1
    except OSError:
        break
print('children', children)
"""
    outcome = run_program(source, limits=QUICK)
    children = int(outcome.stdout.split()[-1])
    assert children < QUICK.processes  # refused by its process limit
    assert not _uid_processes()  # its children went with its namespace
    assert run_program("print('still fine')").stdout == "still fine\n"


def test_children_left_behind_are_killed_with_the_program(tmp_path: Path) -> None:
    source = """
import subprocess, sys
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])
print('parent done')
"""
    outcome = run_program(source, limits=QUICK)
    assert outcome.passed and outcome.seconds < 3, outcome
    assert not _uid_processes()


def test_huge_output_is_cut_at_the_limit() -> None:
    limits = Limits(cpu_seconds=2, wall_seconds=4.0, output_bytes=1 << 16)
    outcome = run_program("while True: print('x' * 1000)", limits=limits)
    assert outcome.status == "output_limit" and len(outcome.stdout) <= limits.output_bytes and outcome.seconds < 2


def test_a_large_file_and_a_full_working_directory_fail_alone() -> None:
    source = """
try:
    open('big', 'wb').write(b'x' * (64 << 20))
    print('WROTE')
except OSError as exc:
    print('no', type(exc).__name__)
"""
    outcome = run_program(source, limits=QUICK)
    assert "WROTE" not in outcome.stdout


def test_correct_programs_stay_correct_while_hostile_ones_run_beside_them() -> None:
    """Under load: sixteen correct programs interleaved with fork bombs, memory bombs and busy loops, four at a
    time: every correct program passes with its own output, every hostile one fails."""
    hostile = ["while True: pass", "import os\nwhile True: os.fork()", "x = bytearray(8 << 30)"]
    jobs = []
    for i in range(16):
        jobs.append((f"print({i} * {i})", f"{i * i}\n"))
        jobs.append((hostile[i % len(hostile)], None))
    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(lambda job: run_program(job[0], limits=QUICK), jobs))
    for (_, expected), outcome in zip(jobs, outcomes, strict=True):
        if expected is None:
            assert not outcome.passed
        else:
            assert outcome.passed and outcome.stdout == expected, outcome
    assert not _uid_processes()


def test_without_namespaces_nothing_runs(monkeypatch) -> None:
    monkeypatch.setattr(sandbox, "_AVAILABLE", "this machine refuses new namespaces (test)")
    with pytest.raises(SandboxUnavailable, match=r"^not running generated code: this machine refuses"):
        run_program("print(1)")


def test_concurrent_sandboxes_lease_different_uids() -> None:
    seen, barrier = [], threading.Barrier(3)

    def one() -> None:
        barrier.wait()
        seen.append(run_program("import os, time\ntime.sleep(0.5)\nprint(os.getuid())").stdout.strip())

    threads = [threading.Thread(target=one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(seen)) == 3 if os.geteuid() == 0 else len(seen) == 3
    time.sleep(0)
