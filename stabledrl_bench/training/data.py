"""The stream of training prompts: a shuffled pass over a task's training docs, resumable exactly.

Every process draws the same global batch and takes its own slice, so the data a run sees does not depend on
the number of processes. The order comes from a private ``torch.Generator``; its state and the position in the
current permutation are part of every checkpoint.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import torch

from stabledrl_bench.errors import UserError

GENERATED = "generated"


def training_docs(
    task, split: str, seed: int, pool_size: int = 10_000, generator_options: dict[str, Any] | None = None
) -> list[dict]:
    """Docs for RL/SFT: a named split, or ``generated`` = a deterministic procedural pool (Countdown, Sudoku).

    ``generator_options`` go to the task's generator (e.g. ``num_numbers: [3]`` for d1's 3-number Countdown). A
    generated pool is made once per process for the same task, seed, size and options (:func:`_generated_pool`).
    """
    if split == GENERATED:
        try:
            options = json.dumps(generator_options or {}, sort_keys=True)
            return [dict(doc) for doc in _generated_pool(type(task), pool_size, seed, options)]  # callers own copies
        except NotImplementedError as exc:
            raise UserError(f"task {task.name!r} has no generator; use a data split such as 'train'") from exc
        except TypeError as exc:
            raise UserError(f"task {task.name!r}: bad generator_options {generator_options}: {exc}") from exc
    docs = task.load(split)
    if not docs:
        raise UserError(f"task {task.name!r} split {split!r} is empty")
    return docs


@lru_cache(maxsize=4)
def _generated_pool(task_type: type, pool_size: int, seed: int, options: str) -> tuple[dict, ...]:
    """``task_type().generate(pool_size, seed, **options)``, kept for the next run of this process that asks for the
    same pool: the methods of one seed share it, and a worker of ``reproduce`` trains them one after another (10,000
    Sudoku puzzles with their solution counts take about half a second, Countdown's 1-3 s). Keyed by the task's
    class: a registry task has no state beyond it (``get_task`` builds each with its defaults)."""
    return tuple(task_type().generate(pool_size, seed=seed, **json.loads(options)))


class PromptStream:
    """Endless shuffled epochs over ``docs``; ``next(n)`` returns the next ``n`` docs (global batch)."""

    def __init__(self, docs: list[dict], seed: int) -> None:
        self.docs = docs
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = 0
        self.position = 0
        self.order = torch.randperm(len(docs), generator=self.generator).tolist()

    def next(self, n: int) -> list[dict]:
        batch = []
        while len(batch) < n:
            if self.position == len(self.order):
                self.epoch += 1
                self.position = 0
                self.order = torch.randperm(len(self.docs), generator=self.generator).tolist()
            take = min(n - len(batch), len(self.order) - self.position)
            batch.extend(self.docs[i] for i in self.order[self.position : self.position + take])
            self.position += take
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "order": list(self.order),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = state["epoch"]
        self.position = state["position"]
        self.order = list(state["order"])
        self.generator.set_state(state["generator"])
