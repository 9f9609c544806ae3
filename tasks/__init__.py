"""Benchmark tasks: GSM8K, MATH500, AIME 2024/2025, Countdown and 4x4 Sudoku.

Each task loads its shipped data (``data/``, see ``data/README.md``), builds prompts per protocol (``d1``,
``d1_train``, ``stabledrl``, ``tiny``), computes rewards per profile (``d1``, ``stabledrl``), grades completions
and writes gold completions; Countdown and Sudoku also generate new puzzles. The contract is
:class:`~stabledrl_bench.tasks.base.Task`.
"""

from __future__ import annotations

from ..errors import UserError
from .aime import Aime24Task, Aime25Task
from .base import GradeResult, PromptSpec, RewardResult, Task
from .countdown import CountdownTask
from .gsm8k import GSM8KTask
from .math500 import Math500Task
from .sudoku import SudokuTask

TASKS: dict[str, type[Task]] = {
    cls.name: cls for cls in (GSM8KTask, Math500Task, CountdownTask, SudokuTask, Aime24Task, Aime25Task)
}


def list_tasks() -> list[str]:
    """Names of the available tasks."""
    return list(TASKS)


def get_task(name: str) -> Task:
    """A task instance with default options (:class:`UserError` for an unknown name)."""
    if name not in TASKS:
        raise UserError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[name]()


__all__ = ["TASKS", "GradeResult", "PromptSpec", "RewardResult", "Task", "get_task", "list_tasks"]
