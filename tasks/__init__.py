"""Benchmark tasks: GSM8K, MATH500, AIME 2024/2025, Countdown and 4x4 Sudoku (also on larger or harder
generated test sets), Code I/O (generated one-line Python functions), HumanEval and MBPP as the official
StableDRL evaluation runs them, and KodCode-Light-RL-10K, a training split for code RL (no evaluation set; its data
are not shipped); the code tasks are graded by running the code in the sandbox.

Each task loads its shipped data (``data/``, see ``data/README.md``), builds prompts per protocol (``d1``,
``d1_train``, ``stabledrl``, ``tiny``), computes rewards per profile (``d1``, ``stabledrl``), grades completions
and writes gold completions; Countdown, Sudoku and Code I/O also generate new problems. The contract is
:class:`~stabledrl_bench.tasks.base.Task`.
"""

from __future__ import annotations

from ..core.registry import Registry, subclass_check
from .aime import Aime24Task, Aime25Task
from .base import REWARD_PROFILES, GradeResult, PromptSpec, RewardResult, Task
from .code_benchmarks import HumanEvalTask, MBPPTask
from .code_io import CodeIOTask
from .countdown import CountdownLargeTask, CountdownTask
from .gsm8k import GSM8KTask
from .kodcode import KodCodeTask
from .math500 import Math500Task
from .sudoku import SudokuHardTask, SudokuTask

# Packages add tasks through the ``stabledrl_bench.tasks`` entry-point group (a Task subclass, or a module that
# registers one with ``TASKS.register``).
TASKS: Registry[type[Task]] = Registry("task", "tasks", check=subclass_check(Task))
_PAPER = (GSM8KTask, Math500Task, CountdownTask, SudokuTask, Aime24Task, Aime25Task)
# the paper's test sets, then larger/harder generated ones, then tasks outside the paper, then training-only ones
for _cls in (*_PAPER, CountdownLargeTask, SudokuHardTask, CodeIOTask, HumanEvalTask, MBPPTask, KodCodeTask):
    TASKS.register(_cls.name, _cls)


def list_tasks() -> list[str]:
    """Names of the available tasks (built-ins first, then plugins)."""
    return list(TASKS)


def evaluation_tasks() -> list[str]:
    """The tasks with an evaluation set (every one but the training-only tasks such as KodCode), registry order."""
    return [name for name, cls in TASKS.items() if cls.evaluated]


def get_task(name: str) -> Task:
    """A task instance with default options (:class:`UserError` for an unknown name)."""
    return TASKS.get(name)()


__all__ = [
    "REWARD_PROFILES",
    "TASKS",
    "GradeResult",
    "PromptSpec",
    "RewardResult",
    "Task",
    "evaluation_tasks",
    "get_task",
    "list_tasks",
]
