"""KodCode-Light-RL-10K: a training split for code RL, read with ``datasets.load_dataset``; no evaluation split.

**Why this task.** The published dLLM coding results the harness compares against train on the Hugging Face dataset
``KodCode/KodCode-Light-RL-10K`` (SPG, arXiv 2510.09541, Table 2, "coding") and evaluate on HumanEval and MBPP. The
harness has those two evaluation sets (:mod:`.code_benchmarks`) but had no training split, so no code model could be
trained here. This task is that split: ``kodcode`` has one split, ``train``, and :meth:`KodCodeTask.eval_docs` refuses
with one line naming ``humaneval`` and ``mbpp``. Refusing, rather than evaluating on training rows, keeps a
"kodcode" accuracy from ever looking like a held-out result; :meth:`~.code_benchmarks.UnitTestCodeTask.grade` still
gives the all-tests verdict, which checkpoint selection on training prompts (``validation: source: train``) uses.

**Data** (not committed: CC BY-NC 4.0, ``KodCode-AI/kodcode`` README, and about 10,000 rows; ``data/README.md``).
:data:`DATA_ENV` names where it is: unset, the Hub id, loaded with ``datasets.load_dataset(HUB_ID, split="train")``
(a cached copy works offline); a directory (a snapshot from ``hf download KodCode/KodCode-Light-RL-10K --repo-type
dataset --local-dir DIR``) or a ``.json``/``.jsonl``/``.parquet`` file, loaded by the same ``load_dataset`` call
with the local path. Where neither exists the task stops with one line saying how to get it. A row must hold
``question``, ``solution`` and ``test`` as strings (another shape is a corrupt file: one error naming the row); a
row whose ``test`` defines no test function this task can call (below) is skipped, and the count is reported in a
warning, as is a row whose reference solution's test program is longer than the sandbox runs. Each doc keeps
``question_id`` (where the row has one), ``question``, ``solution``, ``test`` and ``test_functions``.

**Sources.** SPG's official code (``facebookresearch/SPG`` at ``a1c7120``) has no coding task, and DiffuCoder's
coupled-GRPO recipe (``apple/ml-diffucoder`` at ``f735e01``, ``recipes/config_coupled_code.yaml``) trains on
``TIGER-Lab/AceCode-89K``, whose tests are asserts run by E2B, not on KodCode. The d1-family code that trains on this
dataset (``diffu-grpo``'s ``data_utils.py: get_code_questions`` and ``reward_func.py: coding_reward_func`` in public
d1 forks; the fork that introduced them was not identified) is followed for the prompt and the test execution, and
the reward is the harness's DiffuCoder code reward, as for HumanEval and MBPP:

* prompt: ``get_code_questions``'s user message, d1's ``SYSTEM_PROMPT``, a blank line, "You are a coding expert.
  ... Solve it step by step. ", a blank line, the question (:func:`kodcode_prompt`, prompt protocol ``d1_train``);
* rows: it trains on ``train_test_split(test_size=0.1, seed=42)["train"]`` (10 % "used for a different
  experiment"); here every row, since that split depends on ``datasets``' shuffling;
* program: it takes the first `````python`` fence (here :func:`.graders.unit_tests.extract_code`), renames the first
  ``def`` to the first imported name when they differ and puts the code in place of ``from solution import <name>``;
  here the code becomes module ``solution``, the first imported name is bound to that first function when the code
  does not define it (:func:`first_import`), and the test source imports it as KodCode wrote it;
* tests: it runs each ``def name():`` of the test in a process of its own for 1 s (wall) and scores passed / total;
  here each top-level ``test*`` function without parameters is called in its own ``try``, under one 3-CPU-second
  timer, in the sandbox; a test with at most one such function is split into one function per ``assert`` line
  there, not here;
* pytest: imported from the trainer's environment there; here :data:`PYTEST_STAND_IN` (``raises``, ``approx``,
  ``mark``, ``fixture``);
* reward: fraction passed + 0.5 when the fence is inside ``<answer>`` there; here DiffuCoder's
  (:class:`.code_io.DiffuCoderRewards`): 0.5 x format + 2.0 x the fraction passed.

Why these departures: putting the code in place of the import line breaks tests that import two names (``from
solution import a, b`` becomes the code followed by ``, b``: a syntax error, zero reward for every completion), and
renaming a ``def`` breaks a recursive function's calls to its own name, while importing the completion as a module
(the name bound, not renamed) runs every test as KodCode wrote it, for pytest. A wall-clock second per test counts
machine load, where the sandbox's timer counts CPU time (:mod:`.graders.unit_tests`). pytest is not importable in
the sandbox, which runs the standard library only, so the few names the tests use come from a stand-in (a test
using another pytest feature fails, for every completion alike). The reward is the one the harness's other code
tasks train with, so a code run is comparable across them. The d1-family split is a ``datasets`` shuffle whose
order this harness does not reproduce, so all rows are used.
"""

from __future__ import annotations

import ast
import os
import re
import warnings
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from ..errors import UserError
from .base import require, tagged_completion
from .code_benchmarks import UnitTestCodeTask
from .graders import sandbox
from .graders.unit_tests import TestProgram, driver_source
from .math_common import D1_TRAIN_SYSTEM_PROMPT

HUB_ID = "KodCode/KodCode-Light-RL-10K"
DATA_ENV = "STABLEDRL_KODCODE_DATA"  # a local copy (directory or file), or another Hub id; unset: HUB_ID
LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}
FETCH_HINT = (
    f"get it with `hf download {HUB_ID} --repo-type dataset --local-dir DIR` (huggingface_hub's CLI) where there is "
    f"internet, then set {DATA_ENV}=DIR"
)
# d1-family diffu-grpo data_utils.py get_code_questions: d1's SYSTEM_PROMPT, a blank line, this, the question.
CODE_INSTRUCTION = "You are a coding expert. You will be given a coding problem to solve. Solve it step by step. "
REASONING = "Write the function the tests import, then check it against the examples in the question."

# The names KodCode's tests take from pytest, for a sandbox that has only the standard library. ``raises`` returns
# a context manager whose ``value`` and ``type`` are the exception caught (or calls ``func(*args)`` under it);
# ``approx`` compares numbers, and lists or tuples of numbers, within pytest's default tolerance (relative 1e-6,
# absolute 1e-12); ``mark.<anything>`` and ``fixture`` leave the function as it is, with or without arguments.
PYTEST_STAND_IN = """\
import re as _re


class _Raises:
    def __init__(self, expected, match):
        self.expected, self.match, self.value, self.type = expected, match, None, None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            raise AssertionError(f"DID NOT RAISE {self.expected}")
        if not issubclass(kind, self.expected):
            return False
        if self.match is not None and not _re.search(self.match, str(value)):
            raise AssertionError(f"{str(value)!r} does not match {self.match!r}")
        self.value, self.type = value, kind
        return True


def raises(expected, *args, match=None, **kwargs):
    if not args:
        return _Raises(expected, match)
    with _Raises(expected, match) as caught:
        args[0](*args[1:], **kwargs)
    return caught


class _Approx:
    def __init__(self, expected, rel, absolute):
        self.expected = expected
        self.rel = 1e-6 if rel is None else rel
        self.absolute = 1e-12 if absolute is None else absolute

    def _close(self, actual, expected):
        if isinstance(expected, (list, tuple)):
            return (
                isinstance(actual, (list, tuple))
                and len(actual) == len(expected)
                and all(self._close(a, e) for a, e in zip(actual, expected))
            )
        try:
            return actual == expected or abs(actual - expected) <= max(self.rel * abs(expected), self.absolute)
        except TypeError:
            return False

    def __eq__(self, actual):
        return self._close(actual, self.expected)

    def __repr__(self):
        return f"approx({self.expected!r})"


def approx(expected, rel=None, abs=None):
    return _Approx(expected, rel, abs)


def _identity(*args, **kwargs):
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]
    return lambda function: function


class _Marks:
    def __getattr__(self, name):
        return _identity


mark = _Marks()
fixture = _identity
"""

# Runs first in the sandboxed program (the sandbox's driver executes it in a namespace of its own): pytest's
# stand-in where pytest is missing, then the completion's code as module ``solution``, registered before it runs, as
# an import registers it, so that the tests' ``from solution import ...`` (any form) imports it unchanged and an
# ``if __name__ == "__main__":`` block in it does not run.
_PRELUDE = """\
import sys as _sys
import types as _types


def _module(name, source):
    module = _types.ModuleType(name)
    module.__file__ = name + ".py"
    _sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


try:
    import pytest
except ImportError:
    pytest = _module("pytest", {stand_in!r})
_solution = _module("solution", {code!r})
if {alias!r} and not hasattr(_solution, {alias!r}[0]) and hasattr(_solution, {alias!r}[1]):
    setattr(_solution, {alias!r}[0], getattr(_solution, {alias!r}[1]))
"""
# The first function the completion defines, as the d1-family code finds it (the first ``def name(``).
FIRST_DEF = re.compile(r"def (\w+)\(")


def kodcode_prompt(question: str) -> str:
    """The d1-family training prompt of a KodCode question (module docstring, **Sources**, first item)."""
    return f"{D1_TRAIN_SYSTEM_PROMPT}\n\n{CODE_INSTRUCTION}\n\n{question}"


def test_functions(test: str) -> list[str]:
    """The tests of a KodCode ``test`` source: its top-level functions named ``test*`` (pytest's rule) that take no
    parameters, in order; [] when the source does not parse. Parametrized tests and tests taking fixtures need
    pytest to supply their arguments, so they are not called."""
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError):
        return []
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test") and not _has_parameters(node.args)
    ]


@lru_cache(maxsize=1024)
def first_import(test: str) -> str | None:
    """The first name a test imports from ``solution`` (``from solution import name``, any form), or None: the name
    the d1-family code renames a completion's first function to."""
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "solution" and node.names[0].name != "*":
            return node.names[0].name
    return None


def _has_parameters(args: ast.arguments) -> bool:
    return bool(args.posonlyargs or args.args or args.kwonlyargs or args.vararg or args.kwarg)


def read_rows(source: str) -> list[dict[str, Any]]:
    """The rows of ``source`` through ``datasets.load_dataset``: a local directory or a ``.json``/``.jsonl``/
    ``.parquet`` file, else a Hub id (its ``train`` split, from the cache when offline). One :class:`UserError`
    line, saying how to get the data, when it cannot be had."""
    import datasets
    from datasets import utils as hf_utils
    from datasets.exceptions import DatasetsError

    path = Path(source).expanduser()
    local = path.is_file() or path.is_dir()
    if path.is_file() and path.suffix not in LOCAL_BUILDERS:
        raise UserError(f"{path}: a KodCode file must be {', '.join(LOCAL_BUILDERS)}; or point {DATA_ENV} at a folder")
    if path.is_file():
        args: tuple[str, ...] = (LOCAL_BUILDERS[path.suffix],)
        options: dict[str, Any] = {"data_files": str(path)}
    else:
        args, options = (str(path) if local else source,), {}
    bars_were_off = hf_utils.are_progress_bars_disabled()
    hf_utils.disable_progress_bars()
    try:
        return datasets.load_dataset(*args, split="train", **options).to_list()
    except (OSError, ValueError, DatasetsError) as exc:
        if local:  # a copy that is there but does not read: say what datasets said
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"KodCode data {path} cannot be read: {reason}") from exc
        # offline without a cached copy (ConnectionError), or no such dataset
        raise UserError(f"KodCode data {source!r} is not available here ({type(exc).__name__}); {FETCH_HINT}") from exc
    finally:
        if not bars_were_off:
            hf_utils.enable_progress_bars()


def _fits(test: TestProgram) -> bool:
    return len(driver_source(test).encode()) <= sandbox.MAX_SOURCE_BYTES


def docs_of(rows: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """The task's fields of each row (module docstring, **Data**); a row with no callable test is skipped, and the
    number skipped is reported in one warning."""
    docs, skipped = [], 0
    for i, row in enumerate(rows):
        for key in ("question", "solution", "test"):
            if not isinstance(row.get(key), str):
                raise UserError(f"KodCode data {source!r}: row {i} has no string field {key!r}; is it KodCode's?")
        tests = test_functions(row["test"])
        if not tests:
            skipped += 1
            continue
        doc = {key: row[key] for key in ("question", "solution", "test")}
        if isinstance(row.get("question_id"), str):
            doc["question_id"] = row["question_id"]
        docs.append({**doc, "test_functions": tests})
    if skipped:
        warnings.warn(
            f"kodcode: skipped {skipped} of {len(rows)} rows of {source!r} whose test defines no test function "
            "without parameters",
            stacklevel=2,
        )
    return docs


class KodCodeTask(UnitTestCodeTask):
    """KodCode-Light-RL-10K (Xu et al., arXiv 2503.02951): Python functions to write, each checked by its pytest-style
    tests in the sandbox; a training split only, evaluated on HumanEval and MBPP."""

    name = "kodcode"
    description = (
        "KodCode-Light-RL-10K: Python problems with pytest-style tests, a training split for code RL (no "
        f"evaluation split: use humaneval, mbpp). Hub {HUB_ID} or a local copy in ${DATA_ENV}; CC BY-NC 4.0."
    )
    label = "KodCode"
    splits = ("train",)
    held_out: ClassVar[tuple[str, ...]] = ()
    protocols: ClassVar[tuple[str, ...]] = ("d1_train",)
    evaluated = False

    def __init__(self, data: str | None = None) -> None:
        """``data``: a local copy (directory or file) or a Hub id; default ``$STABLEDRL_KODCODE_DATA``, else
        :data:`HUB_ID`."""
        self.data = data or os.environ.get(DATA_ENV) or HUB_ID

    def docs_key(self, split: str) -> tuple[Any, ...]:
        """Docs are cached per data source, so a process that reads two copies keeps them apart."""
        return (*super().docs_key(split), self.data)

    def _read(self, split: str) -> list[dict[str, Any]]:
        """The rows' docs (:func:`docs_of`), less those whose reference solution's program is longer than the sandbox
        runs (it refuses sources over ``MAX_SOURCE_BYTES``): no completion of them could earn a test's reward."""
        docs = docs_of(read_rows(self.data), self.data)
        fitting = [doc for doc in docs if _fits(self.test_program(self.solution(doc), doc))]
        if len(fitting) < len(docs):
            warnings.warn(
                f"kodcode: skipped {len(docs) - len(fitting)} rows of {self.data!r} whose test program is longer than "
                f"the sandbox runs ({sandbox.MAX_SOURCE_BYTES} bytes)",
                stacklevel=2,
            )
        return fitting

    def eval_docs(self, limit: int | None = None) -> list[dict[str, Any]]:
        del limit
        raise UserError(
            "task 'kodcode' is a training split with no evaluation set; evaluate a code model on 'humaneval' or 'mbpp'"
        )

    def official_prompt(self, doc: Mapping[str, Any]) -> str:
        return kodcode_prompt(require(doc, "question", str, "the problem text"))

    def solution(self, doc: Mapping[str, Any]) -> str:
        return require(doc, "solution", str, "the reference solution")

    def _target(self, doc: Mapping[str, Any], protocol: str) -> str:
        return tagged_completion(REASONING, f"```python\n{self.solution(doc)}\n```", protocol)

    def test_program(self, code: str, doc: Mapping[str, Any]) -> TestProgram:
        """``code`` as module ``solution`` (its first function also under the test's first imported name, where the
        code lacks that name) and the row's test source (:data:`_PRELUDE`), then each test called: the program
        passes when every test does; each call is a unit of the reward."""
        test = require(doc, "test", str, "the pytest-style test source")
        names = require(doc, "test_functions", list, "the names of the test functions")
        if not names or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise UserError("field 'test_functions' must be a non-empty list of function names")
        imported, defined = first_import(test), FIRST_DEF.search(code)
        alias = (imported, defined.group(1)) if imported and defined else ()
        setup = _PRELUDE.format(stand_in=PYTEST_STAND_IN, code=code, alias=alias) + test
        calls = tuple(f"{name}()" for name in names)
        return TestProgram(setup + "\n" + "\n".join(calls), setup, calls)
