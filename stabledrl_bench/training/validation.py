"""Checkpoint selection during RL: a periodic evaluation on validation docs, never the test set.

Why: most papers report the best checkpoint over training (d1 the best per length, SPG the best average over the
three lengths), chosen on the test set itself, while a run here ends with its ``final`` weights. To put a measured
row beside such a number honestly, the trainer can evaluate the policy every ``every`` optimizer steps (at rollout
boundaries, and always at the last step) on validation docs of its task (:meth:`Task.validation_docs`: never a
test item; for generated tasks not one of the run's training puzzles either), keep the history, and export the
weights with the highest validation score to ``<output_dir>/best``. Evaluation records then say which statistic
they are (``selection``: ``final`` or ``best``), and the leaderboard labels every row.

The score is the mean over the validation tasks and canvases of each task's headline value (Sudoku: d1 cell
accuracy; others: accuracy), decoded greedily or as the protocol says, with the evaluator's keyed random streams:
a validation uses no random number of training, so a run trains the same with validation on or off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stabledrl_bench.config import require_positive
from stabledrl_bench.core.models import DiffusionLM
from stabledrl_bench.errors import UserError
from stabledrl_bench.evaluation.native import evaluate
from stabledrl_bench.evaluation.protocols import get_protocol
from stabledrl_bench.processes import keyed_generator
from stabledrl_bench.tasks import Task, get_task


@dataclass
class ValidationConfig:
    """When and on what a run evaluates its checkpoints (``every`` 0: never, the default)."""

    every: int = 0  # optimizer steps between validations, rounded to rollout boundaries; the last step always counts
    tasks: list[str] = field(default_factory=list)  # default: the run's task
    lengths: list[int] = field(default_factory=list)  # canvases (tokens decoded); default: the budget's
    items: int = 64  # validation docs per task
    protocol: str = "d1"  # evaluation protocol (decoding and prompts)
    batch_size: int = 16

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 0:
            raise UserError(f"validation.every must be an integer >= 0 (0 = no validation), got {self.every!r}")
        require_positive(**{"validation.items": self.items, "validation.batch_size": self.batch_size})
        require_positive(**{f"validation.lengths[{i}]": length for i, length in enumerate(self.lengths)})
        get_protocol(self.protocol)  # an unknown protocol fails before training starts


class Validator:
    """The validation docs of a run (drawn once) and the score of a policy on them."""

    def __init__(
        self,
        config: ValidationConfig,
        *,
        task: Task,
        train_split: str,
        generator_options: dict[str, Any],
        training_docs: list[dict[str, Any]],
        canvas: int,
        seed: int,
    ) -> None:
        self.config = config
        self.seed = seed
        self.lengths = config.lengths or [canvas]
        self.docs: dict[str, list[dict[str, Any]]] = {}
        for name in config.tasks or [task.name]:
            other = get_task(name)
            if name == task.name:  # the training task: its own source, without the run's generated puzzles
                source, options = train_split, generator_options
                exclude = {task.item_key(doc) for doc in training_docs} if train_split == "generated" else set()
            else:
                source, options, exclude = ("generated" if _generates(other) else "train"), {}, set()
            draw_seed = int(keyed_generator(seed, "validation", name).initial_seed())
            self.docs[name] = other.validation_docs(
                config.items, draw_seed, source=source, generator_options=options, exclude=exclude
            )

    def describe(self) -> dict[str, Any]:
        """What a record says about the selection (its ``validation`` field, with the chosen step and score)."""
        return {
            "every": self.config.every,
            "tasks": list(self.docs),
            "lengths": list(self.lengths),
            "items": self.config.items,
            "protocol": self.config.protocol,
        }

    def score(self, dlm: DiffusionLM) -> dict[str, Any]:
        """``{"score": mean of the cells, "cells": {"<task>@<canvas>": headline value}}`` of ``dlm`` (collective
        under a launch: every process decodes its share)."""
        cells = {}
        for name, docs in self.docs.items():
            field_name = "score_mean" if get_task(name).headline_field == "score" else "accuracy"
            for length in self.lengths:
                outcome = evaluate(
                    dlm,
                    name,
                    protocol=self.config.protocol,
                    max_completion_length=length,
                    batch_size=self.config.batch_size,
                    seed=self.seed,
                    progress=False,
                    docs=docs,
                )
                cells[f"{name}@{length}"] = outcome.metrics[field_name]
        return {"score": sum(cells.values()) / len(cells), "cells": cells}


def _generates(task: Task) -> bool:
    """Whether ``task`` has a procedural generator (its validation docs are then fresh puzzles)."""
    return type(task).generate is not Task.generate
