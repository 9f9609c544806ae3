"""Grading generated Python functions by execution, only ever inside the sandbox (:mod:`.sandbox`).

A completion's program is the text of its last ``<answer>`` tag. Two checks, in this order:

1. **Format**, with :mod:`ast` only (the text is parsed, never compiled to code objects or run): 1.0 when the
   program is exactly one ``def`` of the expected name with one plain parameter and no decorator, 0.5 when there is
   an answer tag but its text is not such a definition (DiffuCoder's partial credit for a code block with a
   grammar error), 0.0 without a tag.
2. **Execution**, only for a program whose format is 1.0: one sandboxed process per program runs the definition
   and calls the function on every hidden test input, catching each call's exception, and prints the results as
   one JSON line. The expected outputs never enter the sandbox; they are compared here, so a program can only
   pass a test by returning the right value (printing fake results, patching builtins or exiting early gains
   nothing). A program that does not finish within its limits (:data:`LIMITS`) passes no test.

Why one process per program and not per test case: starting a sandbox (namespaces, a fresh interpreter) costs
tens of milliseconds, calling a one-line function microseconds. A batch runs its programs on a thread pool (the
sandbox offers no pool of its own; each program is a separate process that a thread waits on), as wide as the
machine has CPUs. Results are cached by (program, inputs) (the latest ``CACHE_SIZE``), so a trainer that rewards
and then grades the same rollouts (TraDo) runs each program once.

Where the sandbox is unavailable, every call raises :class:`~.sandbox.SandboxUnavailable` (one line) and no
program runs, confined or not.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache, lru_cache

from . import sandbox
from .text import last_answer_tag

FUNCTION_NAME = "f"
# A one-line function on a dozen small integers needs milliseconds; an infinite loop is stopped after 2 CPU seconds.
# The wall-clock limit is three times that, so a loaded machine does not turn a correct program into a time-out.
LIMITS = sandbox.Limits(cpu_seconds=2, wall_seconds=6.0)
CACHE_SIZE = 4096
RESULT_MARK = "RESULTS:"  # the driver's result line starts with it (anything else the program prints is ignored)

# Runs inside the sandbox: define the program, call the function on each input, print the integer results. The
# program's own output is swallowed, so only the driver's last line carries results (forging it needs the answers).
_DRIVER = """\
import json, sys

class _Sink:
    def write(self, text):
        return len(text)

    def flush(self):
        pass

_out = sys.stdout
sys.stdout = sys.stderr = _Sink()
_results = []
try:
    _namespace = {"__name__": "solution"}
    exec(compile(SOURCE, "solution.py", "exec"), _namespace)
    _function = _namespace[NAME]
except BaseException:
    _function = None
for _x in INPUTS:
    try:
        _y = _function(_x)
        _results.append(_y if type(_y) is int and -10**18 < _y < 10**18 else None)
    except BaseException:
        _results.append(None)
_out.write(MARK + json.dumps(_results) + "\\n")
_out.flush()
"""


@dataclass(frozen=True)
class Execution:
    """How a program did on its tests: ``passed`` of ``total``; ``status`` is the sandbox's (``ok``, ``error``,
    ``timeout``, ``output_limit``), ``skipped`` for a program not run (format below 1.0)."""

    passed: int
    total: int
    status: str

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def extract_program(completion: str) -> str | None:
    """The program of a completion: its last ``<answer>`` tag's text, stripped; None without a tag."""
    answer = last_answer_tag(completion)
    return None if answer is None else answer.strip()


def format_score(program: str | None, name: str = FUNCTION_NAME) -> float:
    """1.0 for exactly one ``def name(param):`` (one plain parameter, no decorator) and nothing else, 0.5 for any
    other text in an answer tag, 0.0 for no tag. Parsed with :func:`ast.parse` only: nothing is compiled or run."""
    if program is None:
        return 0.0
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return 0.5
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        return 0.5
    definition = tree.body[0]
    args = definition.args
    plain = len(args.args) == 1 and not (args.posonlyargs or args.vararg or args.kwonlyargs or args.kwarg)
    return 1.0 if definition.name == name and plain and not args.defaults and not definition.decorator_list else 0.5


def driver_source(program: str, inputs: Sequence[int], name: str = FUNCTION_NAME) -> str:
    """The sandboxed program that runs ``program`` on ``inputs`` (constants first, then :data:`_DRIVER`)."""
    header = f"SOURCE = {program!r}\nINPUTS = {list(inputs)!r}\nNAME = {name!r}\nMARK = {RESULT_MARK!r}\n"
    return header + _DRIVER


def parse_results(stdout: str, count: int) -> list[int | None] | None:
    """The results of the driver's last result line, or None when there is none of ``count`` entries."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            try:
                values = json.loads(line[len(RESULT_MARK) :])
            except ValueError:
                return None
            if isinstance(values, list) and len(values) == count:
                return [v if type(v) is int else None for v in values]
            return None
    return None


@cache
def sandbox_unavailable() -> str | None:
    """Why this machine cannot confine a program (checked once per process), or None."""
    return sandbox.available()


def require_sandbox(task: str) -> None:
    """Raise :class:`~.sandbox.SandboxUnavailable` (one line) unless programs can be confined here."""
    reason = sandbox_unavailable()
    if reason is not None:
        raise sandbox.SandboxUnavailable(
            f"task {task!r} grades completions by running them, and only in the sandbox, which this machine cannot "
            f"provide: {reason} (docs/sandbox.md)"
        )


@lru_cache(maxsize=CACHE_SIZE)
def _outputs(program: str, inputs: tuple[int, ...]) -> tuple[tuple[int | None, ...], str]:
    """The function's output on each input (None: an exception or not an int) and the sandbox status; the latest
    ``CACHE_SIZE`` are kept."""
    outcome = sandbox.run_program(driver_source(program, inputs), limits=LIMITS)
    results = parse_results(outcome.stdout, len(inputs)) if outcome.passed else None
    return (tuple(results) if results is not None else (None,) * len(inputs), outcome.status)


def run_tests(
    programs: Sequence[str | None], tests: Sequence[Sequence[tuple[int, int]]], *, task: str
) -> list[Execution]:
    """Execute each well-formed program (:func:`format_score` 1.0) on its ``(input, expected)`` tests in the
    sandbox, one process per program, the batch in parallel; a program that is None or malformed is ``skipped``.

    Raises :class:`~.sandbox.SandboxUnavailable` when nothing can be confined here (before running anything).
    """
    require_sandbox(task)
    jobs = [i for i, program in enumerate(programs) if program is not None and format_score(program) == 1.0]
    results: list[Execution] = [Execution(0, len(cases), "skipped") for cases in tests]
    if not jobs:
        return results

    def one(i: int) -> Execution:
        program, cases = programs[i], tests[i]
        assert program is not None
        outputs, status = _outputs(program, tuple(x for x, _ in cases))
        passed = sum(y is not None and y == expected for y, (_, expected) in zip(outputs, cases, strict=True))
        return Execution(passed, len(cases), status)

    width = max(1, min(len(jobs), os.cpu_count() or 1))
    with ThreadPoolExecutor(width, thread_name_prefix="code-io-sandbox") as pool:
        for i, execution in zip(jobs, pool.map(one, jobs), strict=True):
            results[i] = execution
    return results
