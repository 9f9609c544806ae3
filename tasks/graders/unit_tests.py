"""Grading generated Python programs against unit tests (HumanEval, MBPP), only ever inside the sandbox.

The official StableDRL evaluation (``custom_humaneval/evaluation.py``, ``execution.py``) takes a completion's code
with :func:`extract_code` (the first `````python`` fence, else the whole text), builds one test program from it and
the problem's tests, and ``exec``-s it in a fresh, empty namespace with stdout and stderr swallowed, reading stdin
an error, under a 3-second timer: the sample passes when the program raises nothing. :func:`run_unit_tests` does
the same, except that the program runs in the sandbox (docs/sandbox.md), not in a forked copy of the harness:

* a driver (:data:`_DRIVER`) ``exec``-s the program in an empty namespace (so ``__name__`` is ``builtins`` and an
  ``if __name__ == "__main__":`` block does not run, as officially), with the same swallowed streams, and reports
  ``passed``, ``failed`` or ``timed out`` on a line that starts with a random token passed on stdin. The program
  cannot simply report for itself: the token is read before it runs and kept in a local (a program would have to
  search the interpreter's frames or memory for it), and ``sys.exit`` or ``os._exit`` before its asserts ends the
  driver without a report, so the sample fails (officially ``SystemExit`` is caught and fails too). What the verdict
  depends on (``exec``, ``compile``, the units, the report's text) is taken before the program runs, so rebinding
  ``builtins.exec``, ``json.dumps`` or the driver's module attributes forges no pass;
* the timer counts CPU time (``ITIMER_PROF``, 3 s), where the official one counts wall time (``ITIMER_REAL``):
  on a loaded machine a wall-clock timer turns correct programs into time-outs. The sandbox's own limits
  (:data:`LIMITS`) stop a program that sleeps or ignores the timer;
* the official "reliability guard" (``os.system``, ``subprocess.Popen`` and some thirty other names set to None) is
  not reproduced: the sandbox confines the program instead. A program that calls one of them fails officially and
  may pass here; no canonical solution does.

For an RL reward a pass/fail bit is coarse, so when the whole program fails the driver also runs its test *units*
one by one (``setup`` once, then each unit in the same namespace, one shared timer) and reports which pass:
DiffuCoder's code reward is the fraction of test cases passed. A program that passes passes every unit.
Results are cached by (program, setup, units), so a trainer that rewards and then grades runs each once.
"""

from __future__ import annotations

import ast
import json
import os
import re
import secrets
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

from . import sandbox
from .code_io import CACHE_SIZE, require_sandbox

TIMEOUT_SECONDS = 3.0  # the official evaluation's timeout (evaluate_functional_correctness(timeout=3.0))
# The driver's timer ends a busy program after 3 CPU seconds per phase (two phases at most); the sandbox stops what
# the timer cannot (a program that sleeps, or catches the timer's exception and loops on).
LIMITS = sandbox.Limits(cpu_seconds=8, wall_seconds=12.0)
# The official evaluation's code extraction: the first ```python fence's text, stripped.
FENCE = re.compile(r"```python\n(.*?)```", re.DOTALL)

# Runs inside the sandbox. Constants PROGRAM, SETUP, UNITS and LIMIT are prepended (driver_source); the token that
# marks the report line comes on stdin, read before the program runs and kept in a local of _main, so no module
# attribute (``import __main__``) reveals it; what decides the verdict is kept in locals of _main too, so a program
# that rebinds the driver's names, ``exec`` or ``json.dumps`` changes nothing. What it does not stop: a program that
# deliberately searches the interpreter (the calling frame's locals, ``gc``) for them; it guards against exits,
# printing and rebinding.
_DRIVER = """\
import signal, sys


class TimeoutException(Exception):
    pass


class _Sink:
    def write(self, text):
        return len(text)

    def flush(self):
        pass

    def read(self, *args):
        raise OSError("stdin is not readable")

    readline = readlines = read


def _alarm(signum, frame):
    raise TimeoutException("Timed out!")


def _timer(seconds):
    signal.signal(signal.SIGPROF, _alarm)
    signal.setitimer(signal.ITIMER_PROF, seconds)


def _units(setup, units, run, build, timeout):
    passed = [False for _ in units]
    namespace = {}
    try:
        _timer(LIMIT)
        run(build(setup, "<string>", "exec"), namespace)
        i = 0
        for unit in units:
            try:
                run(build(unit, "<string>", "exec"), namespace)
                passed[i] = True
            except timeout:
                raise
            except BaseException:
                pass
            i += 1
    except BaseException:
        pass
    signal.setitimer(signal.ITIMER_PROF, 0)
    return passed


def _main():
    token, out = sys.stdin.readline().strip(), sys.stdout  # locals: no module attribute leads to them
    # Everything the verdict depends on after the program has run, taken now, as locals: the program can rebind
    # module attributes and builtins (``__main__.UNITS``, ``builtins.exec``, ``json.dumps``), not these. The report
    # is built from literals and a tuple's iteration, which no program can rebind.
    run, build, timeout, units, setup, tests = exec, compile, TimeoutException, _units, SETUP, tuple(UNITS)
    sys.stdout = sys.stderr = sys.stdin = _Sink()
    result, flags = "failed", None
    try:
        _timer(LIMIT)
        run(build(PROGRAM, "<string>", "exec"), {})
        signal.setitimer(signal.ITIMER_PROF, 0)
        result = "passed"
    except timeout:
        result = "timed out"
    except BaseException:
        pass
    signal.setitimer(signal.ITIMER_PROF, 0)
    if result == "failed" and tests:
        flags = units(setup, tests, run, build, timeout)
    listed = "null" if flags is None else "[" + ", ".join(["true" if flag else "false" for flag in flags]) + "]"
    out.write(token + '{"result": "' + result + '", "units": ' + listed + "}\\n")
    out.flush()


_main()
"""


@dataclass(frozen=True)
class TestProgram:
    """What to run for one completion: the official test program, and the same tests as units for the reward
    (``setup`` defines the solution and whatever the units need; each unit is one test case)."""

    program: str
    setup: str
    units: tuple[str, ...]


@dataclass(frozen=True)
class UnitTestRun:
    """How a program did: ``result`` is the official verdict (``passed``, ``failed``, ``timed out``; ``skipped``
    when not run), ``passed_units`` of ``total_units`` test cases passed (all of them when ``result`` passed)."""

    result: str
    passed_units: int
    total_units: int

    @property
    def passed(self) -> bool:
        return self.result == "passed"

    @property
    def fraction(self) -> float:
        return self.passed_units / self.total_units if self.total_units else 0.0


def extract_code(completion: str) -> str:
    """The official extraction (``process_humaneval_test``): the text of the first `````python`` fence (a newline
    right after the tag, up to the next `````), stripped; without one, the whole completion unchanged."""
    match = FENCE.search(completion)
    return match.group(1).strip() if match else completion


def fenced_code(completion: str) -> str | None:
    """The first `````python`` fence's text, stripped, or None without one (what the format reward looks at)."""
    match = FENCE.search(completion)
    return match.group(1).strip() if match else None


def code_format(completion: str) -> float:
    """DiffuCoder's format score: 1.0 for a `````python`` fence whose code parses, 0.5 for one with a syntax
    error, 0.0 without a fence. Parsed with :func:`ast.parse` only: nothing is compiled or run."""
    code = fenced_code(completion)
    if code is None:
        return 0.0
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return 0.5
    return 1.0


def check_units(source: str, function: str) -> list[str]:
    """The test cases of ``def function(...)`` in trusted test ``source`` (HumanEval's ``check``): one unit per
    statement of its body that holds an ``assert``, each with the statements without one that come before it
    (setup such as ``import math``), as source text; raises ValueError without the def."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            units: list[str] = []
            pending: list[str] = []
            for statement in node.body:
                pending.append(ast.unparse(statement))
                if any(isinstance(n, ast.Assert) for n in ast.walk(statement)):
                    units.append("\n".join(pending))
                    pending = []
            return units
    raise ValueError(f"no function {function!r} in the test code")


def driver_source(test: TestProgram) -> str:
    """The sandboxed program for ``test``: constants first, then :data:`_DRIVER`."""
    header = (
        f"PROGRAM = {test.program!r}\nSETUP = {test.setup!r}\nUNITS = {list(test.units)!r}\n"
        f"LIMIT = {TIMEOUT_SECONDS!r}\n"
    )
    return header + _DRIVER


def parse_report(stdout: str, token: str, units: int) -> tuple[str, int] | None:
    """(verdict, units passed) from the driver's report line (the last line starting with ``token``), or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(token):
            try:
                report = json.loads(line[len(token) :])
                result, flags = report["result"], report["units"]
            except (ValueError, KeyError, TypeError):
                return None
            if result == "passed":
                return result, units
            if result in ("failed", "timed out"):
                ok = isinstance(flags, list) and len(flags) == units
                return result, sum(flag is True for flag in flags) if ok else 0
            return None
    return None


@lru_cache(maxsize=CACHE_SIZE)
def _run(test: TestProgram) -> UnitTestRun:
    """One sandboxed run of ``test`` (the latest ``CACHE_SIZE`` kept)."""
    token = secrets.token_hex(16)
    outcome = sandbox.run_program(driver_source(test), stdin=token + "\n", limits=LIMITS)
    report = parse_report(outcome.stdout, token, len(test.units)) if outcome.passed else None
    if report is None:  # killed by a limit, or ended before reporting (sys.exit, os._exit)
        result = "timed out" if outcome.status == "timeout" else "failed"
        return UnitTestRun(result, 0, len(test.units))
    return UnitTestRun(report[0], report[1], len(test.units))


def run_unit_tests(tests: Sequence[TestProgram | None], *, task: str) -> list[UnitTestRun]:
    """Run each test program in the sandbox, one process each, the batch on a thread pool as wide as the CPUs
    (``None``: not run, ``skipped``). Raises :class:`~.sandbox.SandboxUnavailable` before running anything when
    programs cannot be confined here."""
    require_sandbox(task)
    results = [UnitTestRun("skipped", 0, 0 if t is None else len(t.units)) for t in tests]
    jobs = [i for i, t in enumerate(tests) if t is not None]
    if not jobs:
        return results
    width = max(1, min(len(jobs), os.cpu_count() or 1))
    with ThreadPoolExecutor(width, thread_name_prefix="unit-test-sandbox") as pool:
        for i, run in zip(jobs, pool.map(lambda i: _run(tests[i]), jobs), strict=True):
            results[i] = run
    return results
