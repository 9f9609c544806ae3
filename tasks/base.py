"""The task contract: data splits, prompts per evaluation protocol, reward profiles, graders, gold completions.

Conventions shared by every task (read these before calling a task from a trainer or an evaluator):

* **Docs** are plain dicts with a stable ``doc_id`` (``"<task>/<split>/<row>"``) and a ``task`` name, plus the
  task's gold fields (GSM8K/MATH/AIME ``answer``, Countdown ``numbers``/``target``, Sudoku
  ``puzzle``/``solution``); graders read only the gold fields, so any dict carrying them can be graded.
* **Protocols** (how a prompt is built) are ``d1`` (d1's evaluation prompts: one user message
  ``SYSTEM_PROMPT + "\\n\\n" + question``, chat template, ``<reasoning>`` prefill), ``d1_train`` (d1's RL
  training prompts, ``diffu-grpo/data_utils.py``: no prefill), ``stabledrl`` (the official StableDRL code's
  training prompts: the bare problem plus an instruction, chat template, no system prompt, no prefill),
  ``stabledrl_eval`` (what StableDRL's evaluation script ``math_metrics.py`` feeds the model: MATH problems with
  its single-backslash instruction, GSM8K questions bare), ``tracerl`` (TraceRL's evaluation prompt for math,
  ``sample/trado_sample.py``: the problem, then "Please reason step by step, and put your final answer within
  \\boxed{}.", chat template, no prefill) and ``tiny`` (very short prompts for a CPU character-level model,
  answer only: ``<answer>...</answer>``; Countdown's gold completion shows its first step before the tag, see
  :func:`.countdown.tiny_worked_solution`). TraceRL and StableDRL's script evaluate no Countdown or Sudoku:
  there ``tracerl`` reuses d1's message and ``stabledrl_eval`` StableDRL's training message.
* **Completions** passed to :meth:`Task.reward` and :meth:`Task.grade`, and returned by
  :meth:`Task.target_completion`, are the text generated *after* the prompt and its prefill (what a sampler
  decodes). Under ``d1`` the prefill ``<reasoning>`` is therefore not part of the completion. Graders do not
  depend on it; d1's tag-counting rewards were designed for ``d1_train`` prompts, which have no prefill.
* **Reward profiles** are functions ``profile(task, completions, docs) -> [RewardResult]`` registered by name in
  :data:`REWARD_PROFILES`: ``d1`` (``diffu-grpo/reward_func.py``) and ``stabledrl`` (``networks/llada_svpo.py``
  plus ``dataloaders/*``) call each task's ``d1_reward`` / ``stabledrl_reward``, reproduced component by
  component (docs/methods.md#reward-profiles); the total is the sum of the components, each reported separately.
  A new profile is one registered function (or an entry point in ``stabledrl_bench.reward_profiles``), not an
  edit of every task.
"""

from __future__ import annotations

import gzip
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..core.registry import Registry
from ..errors import UserError

DATA_DIR = Path(__file__).resolve().parent / "data"
PROTOCOLS: tuple[str, ...] = ("d1", "d1_train", "stabledrl", "stabledrl_eval", "tracerl", "tiny")
D1_PREFILL = "<reasoning>"
# Gold completions of the evaluation-only prompt protocols: no prefill and a free-form answer, which is what the
# ``stabledrl`` layout is (reasoning, then the boxed answer).
TARGET_LAYOUT = {"stabledrl_eval": "stabledrl", "tracerl": "stabledrl"}


@dataclass(frozen=True)
class PromptSpec:
    """A prompt as chat messages, whether to apply the chat template, and text to prefill the answer with."""

    messages: tuple[dict[str, str], ...]
    chat_template: bool
    prefill: str


@dataclass
class RewardResult:
    """A scalar reward and its named components (``total == sum(components.values())``)."""

    total: float
    components: dict[str, float]

    @classmethod
    def of(cls, **components: float) -> RewardResult:
        return cls(total=float(sum(components.values())), components={k: float(v) for k, v in components.items()})


@dataclass
class GradeResult:
    """An evaluation verdict.

    ``correct`` is the harness's verdict (math: math-verify; Countdown: the safe evaluator; Sudoku: the grid
    is a valid completion of the puzzle); ``score`` is the per-item metric (Sudoku: d1's cell accuracy,
    otherwise ``float(correct)``); ``details`` records the other verdicts, e.g. ``{"d1": bool,
    "math_verify": bool, "timed_out": bool}``.
    """

    correct: bool
    score: float
    extracted: str | None
    details: dict[str, Any] = field(default_factory=dict)


def one_line(text: str) -> str:
    """Collapse whitespace, so that d1's non-DOTALL format regexes can match the reasoning."""
    return " ".join(text.split())


def tagged_completion(reasoning: str, answer: str, protocol: str) -> str:
    """A gold completion in the ``<reasoning>/<answer>`` layout each protocol asks for.

    ``d1`` continues the ``<reasoning>`` prefill; ``d1_train`` is exactly the layout d1's strict format reward
    accepts (``^<reasoning>\\n.*?\\n</reasoning>\\n<answer>\\n.*?\\n</answer>\\n$``, single-line parts);
    ``tiny`` is the answer tag alone (a task may put a short worked step before it, as Countdown does).
    """
    if protocol == "d1":
        return f"\n{reasoning}\n</reasoning>\n<answer>\n{answer}\n</answer>"
    if protocol == "d1_train":
        return f"<reasoning>\n{one_line(reasoning)}\n</reasoning>\n<answer>\n{answer}\n</answer>\n"
    if protocol == "stabledrl":
        return f"<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n{answer}\n</answer>"
    if protocol == "tiny":
        return f"<answer>{answer}</answer>"
    raise UserError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")


def data_rng(seed: int) -> np.random.Generator:
    """The random generator of a procedural data generator: ``numpy.random.default_rng(seed)``, never global."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserError(f"seed must be a non-negative integer, got {seed!r}")
    return np.random.default_rng(seed)


def data_path(relative: str) -> Path:
    """A shipped data file's path, resolved relative to this package (never the working directory), or one error
    line when the installed package lacks it."""
    path = DATA_DIR / relative
    if not path.is_file():
        raise UserError(f"missing data file {path} (is the package installed with its data?)")
    return path


def read_json_lines(relative: str) -> list[dict[str, Any]]:
    """Rows of a shipped JSON-lines file (``.gz`` too), read as they are: no schema inferred across rows, so values
    of mixed types (the code tasks' examples and tests) stay what they are, unlike :func:`read_data_file`."""
    path = data_path(relative)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def read_data_file(relative: str, string_columns: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Rows of a shipped data file, read through ``datasets`` (works with ``HF_DATASETS_OFFLINE=1``).

    ``string_columns`` forces CSV columns to strings (Sudoku grids keep their leading zeros). The path is
    resolved relative to this package, never the working directory.
    """
    import datasets
    from datasets import utils as hf_utils

    path = data_path(relative)
    features = datasets.Features({c: datasets.Value("string") for c in string_columns}) if string_columns else None
    builder = "csv" if path.suffix == ".csv" else "json"
    bars_were_off = hf_utils.are_progress_bars_disabled()
    hf_utils.disable_progress_bars()
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train", features=features).to_list()
    finally:
        if not bars_were_off:
            hf_utils.enable_progress_bars()


RewardProfile = Callable[["Task", Sequence[str], Sequence[Mapping[str, Any]]], list[RewardResult]]


def _callable(name: str, profile: RewardProfile) -> RewardProfile:
    if not callable(profile):
        raise TypeError(f"reward profile {name!r} must be callable, got {profile!r}")
    return profile


# A profile scores a batch: profile(task, completions, docs) -> [RewardResult], so that a profile whose checks run
# in worker processes (math-verify) can keep every worker busy.
REWARD_PROFILES: Registry[RewardProfile] = Registry("reward profile", "reward_profiles", check=_callable)


@REWARD_PROFILES.register("d1")
def d1_profile(task: Task, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]) -> list[RewardResult]:
    """d1's rewards (``diffu-grpo/reward_func.py``): format and correctness components, per task."""
    return task.d1_rewards(completions, docs)


@REWARD_PROFILES.register("stabledrl")
def stabledrl_profile(task: Task, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]) -> list[RewardResult]:
    """The official StableDRL code's rewards: the task's base score plus ``anti_short_boxed``."""
    return task.stabledrl_rewards(completions, docs)


_DOCS: dict[tuple[Any, ...], tuple[dict[str, Any], ...]] = {}
_DOCS_LOCK = threading.Lock()


class Task(ABC):
    """One benchmark task. Subclasses set ``name`` and ``splits`` and implement the abstract hooks."""

    name: ClassVar[str]
    splits: ClassVar[tuple[str, ...]]
    # How tables show the task: its column label and, for a task outside the paper's columns, the note under the
    # table that says what the column measures. Read through column_label() / column_note(): only what a class
    # declares itself counts, so a plugin deriving from SudokuTask is not a second "Sudoku" column.
    label: ClassVar[str] = ""
    note: ClassVar[str] = ""
    eval_split: ClassVar[str] = "test"  # what the d1 protocol evaluates
    # The per-sample field a table cell averages: the fraction of ``correct`` answers, or the grade's ``score``
    # where the papers report a partial-credit metric (Sudoku's cell accuracy).
    headline_field: ClassVar[str] = "correct"
    # Splits a task's puzzle generator and training splits never contain (the evaluation sets).
    held_out: ClassVar[tuple[str, ...]] = ("test",)
    protocols: ClassVar[tuple[str, ...]] = PROTOCOLS
    # False for a training-only task (KodCode), whose eval_docs refuses and names the tasks that evaluate what it
    # trains: evaluation suites, lm-eval and the regression graders list only evaluated tasks (evaluation_tasks()).
    evaluated: ClassVar[bool] = True

    @classmethod
    def column_label(cls) -> str:
        """The label this class declares, else its registered name."""
        return vars(cls).get("label") or cls.name

    @classmethod
    def column_note(cls) -> str:
        """The note this class declares ("" if none)."""
        return vars(cls).get("note", "")

    # ------------------------------------------------------------------------------------------ data
    def load(self, split: str, limit: int | None = None) -> list[dict[str, Any]]:
        """Docs of ``split`` in file order (the first ``limit`` if given); each call returns fresh copies."""
        if split not in self.splits:
            raise UserError(f"task {self.name!r} has no split {split!r}; splits: {', '.join(self.splits)}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise UserError(f"limit must be a non-negative integer, got {limit!r}")
        key = self.docs_key(split)
        with _DOCS_LOCK:
            if key not in _DOCS:
                rows = self._read(split)
                _DOCS[key] = tuple(
                    {"doc_id": f"{self.name}/{split}/{i}", "task": self.name, **row} for i, row in enumerate(rows)
                )
            docs = _DOCS[key]
        selected = docs if limit is None else docs[:limit]
        return [{k: list(v) if isinstance(v, list) else v for k, v in doc.items()} for doc in selected]

    def docs_key(self, split: str) -> tuple[Any, ...]:
        """What the process-wide docs cache keys ``split``'s docs by: the task and split, plus whatever else selects
        the data (a task whose data path is an option adds it)."""
        return (self.name, split)

    def eval_docs(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The evaluation docs of the d1 protocol (``eval_split``; Sudoku: d1's 256-puzzle subset)."""
        return self.load(self.eval_split, limit)

    @abstractmethod
    def _read(self, split: str) -> list[dict[str, Any]]:
        """Rows of ``split`` as dicts of the task's fields (``doc_id`` and ``task`` are added by ``load``)."""

    # --------------------------------------------------------------------------------------- prompts
    def prompt(self, doc: Mapping[str, Any], protocol: str = "d1") -> PromptSpec:
        """The prompt of ``doc`` under ``protocol``: one user message, chat template, protocol prefill."""
        self._check_protocol(protocol)
        message = {"role": "user", "content": self.user_message(doc, protocol)}
        return PromptSpec(messages=(message,), chat_template=True, prefill=D1_PREFILL if protocol == "d1" else "")

    @abstractmethod
    def user_message(self, doc: Mapping[str, Any], protocol: str) -> str:
        """The user message text of ``doc`` under a (validated) ``protocol``."""

    def target_completion(self, doc: Mapping[str, Any], protocol: str = "d1") -> str:
        """The gold answer written as a completion in ``protocol``'s format (golden tests, SFT targets)."""
        self._check_protocol(protocol)
        return self._target(doc, TARGET_LAYOUT.get(protocol, protocol))

    @abstractmethod
    def _target(self, doc: Mapping[str, Any], protocol: str) -> str:
        """Gold completion under a (validated) ``protocol``."""

    def worked_solution(self, doc: Mapping[str, Any]) -> str | None:
        """The doc's own worked solution, the reasoning trace a method may draw hints from (IGPO); None where the
        task or split carries none (the default: puzzles and code have an answer, not a reference trace)."""
        del doc
        return None

    # ------------------------------------------------------------------------------ rewards, grading
    def reward(self, completion: str, doc: Mapping[str, Any], profile: str = "d1") -> RewardResult:
        """The RL reward of ``completion`` under the registered reward ``profile``, by component."""
        return self.reward_many([completion], [doc], profile)[0]

    def reward_many(
        self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]], profile: str = "d1"
    ) -> list[RewardResult]:
        """:meth:`reward` of each ``(completion, doc)`` pair, in order, identical to scoring them one by one.

        What a trainer calls for a rollout batch: a task whose reward runs in isolated worker processes
        (math-verify) checks the whole batch concurrently instead of keeping one worker busy at a time.
        """
        rule = REWARD_PROFILES.get(profile)
        _check_batch(completions, docs)
        for completion in completions:
            if not isinstance(completion, str):
                raise UserError(f"completion must be a string, got {type(completion).__name__}")
        return rule(self, completions, docs)

    @abstractmethod
    def d1_reward(self, completion: str, doc: Mapping[str, Any]) -> RewardResult:
        """d1's reward components for this task (``diffu-grpo/reward_func.py``)."""

    @abstractmethod
    def stabledrl_reward(self, completion: str, doc: Mapping[str, Any]) -> RewardResult:
        """The official StableDRL code's reward components for this task (base + ``anti_short_boxed``)."""

    def d1_rewards(self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]) -> list[RewardResult]:
        """:meth:`d1_reward` of each pair (d1's rewards need no worker process, so one by one)."""
        return [self.d1_reward(c, doc) for c, doc in zip(completions, docs, strict=True)]

    def stabledrl_rewards(self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]) -> list[RewardResult]:
        """:meth:`stabledrl_reward` of each pair; math tasks check the whole batch with math-verify at once."""
        return [self.stabledrl_reward(c, doc) for c, doc in zip(completions, docs, strict=True)]

    @abstractmethod
    def grade(self, completion: str, doc: Mapping[str, Any]) -> GradeResult:
        """Evaluation verdict of ``completion`` for ``doc`` (raises :class:`UserError` on bad gold fields)."""

    def grade_many(self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]) -> list[GradeResult]:
        """:meth:`grade` of each ``(completion, doc)`` pair, in order, identical to grading them one by one.

        What a trainer or an evaluator calls for a batch: a task graded in isolated worker processes
        (math-verify) checks the whole batch concurrently instead of keeping one worker busy at a time.
        """
        _check_batch(completions, docs)
        return self._grade_many(completions, docs)

    def _grade_many(self, completions: Sequence[str], docs: Sequence[Mapping[str, Any]]) -> list[GradeResult]:
        """Verdicts of same-length batches; one at a time unless a task has something to gain from a batch."""
        return [self.grade(c, doc) for c, doc in zip(completions, docs, strict=True)]

    def generate(self, n: int, seed: int, **kwargs: Any) -> list[dict[str, Any]]:
        """``n`` new training docs, deterministic in ``seed`` (only procedurally generated tasks)."""
        raise NotImplementedError(f"task {self.name!r} has no procedural generator")

    # -------------------------------------------------------------------------------------- validation
    def item_key(self, doc: Mapping[str, Any]) -> Any:
        """What makes two docs the same item: the prompt a model is shown (under the task's first protocol). A
        task whose items can be worded several ways overrides it (Countdown: numbers in any order, and target)."""
        return self.user_message(doc, self.protocols[0])

    def validation_docs(
        self,
        n: int,
        seed: int,
        *,
        source: str = "train",
        generator_options: Mapping[str, Any] | None = None,
        exclude: Collection[Any] = (),
    ) -> list[dict[str, Any]]:
        """``n`` docs to select checkpoints on: never an item of a held-out (test) split, nor one whose
        :meth:`item_key` is in ``exclude`` (e.g. a run's generated training pool).

        ``source`` ``"generated"``: the first fitting puzzles of the task's generator under ``seed``; any other
        value names a split, from which ``n`` fitting docs are drawn with ``seed`` (a training split: the run may
        train on those prompts too; the test set it never sees). Held-out items are removed here, by key, whatever
        the generator or the data files hold, so no validation doc is ever a test item.
        """
        if source in self.held_out:
            raise UserError(f"task {self.name!r}: split {source!r} is held out for testing; validate on another")
        banned = {self.item_key(doc) for split in self.held_out for doc in self.load(split)} | set(exclude)
        if source != "generated":
            fitting = [doc for doc in self.load(source) if self.item_key(doc) not in banned]
            if len(fitting) < n:
                raise UserError(f"task {self.name!r}: split {source!r} has {len(fitting)} validation docs, not {n}")
            chosen = sorted(data_rng(seed).choice(len(fitting), size=n, replace=False).tolist())
            return [fitting[i] for i in chosen]
        drawn = n
        while True:  # the generator's output for a seed is prefix-stable: draw more until n fit
            fitting = [
                doc
                for doc in self.generate(drawn, seed, **(generator_options or {}))
                if self.item_key(doc) not in banned
            ]
            if len(fitting) >= n:
                return fitting[:n]
            drawn = 2 * drawn + 16

    def _check_protocol(self, protocol: str) -> None:
        if protocol not in self.protocols:
            raise UserError(f"unknown protocol {protocol!r}; known: {', '.join(self.protocols)}")


def _check_batch(completions: Sequence[str], docs: Sequence[Mapping[str, Any]]) -> None:
    """A batch pairs each completion with its doc: a length mismatch is a caller's error, never truncated."""
    if len(completions) != len(docs):
        raise UserError(f"{len(completions)} completions for {len(docs)} docs")


def require(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    """``doc[key]`` if present with type ``kind`` (bools never count as numbers), else :class:`UserError`."""
    if not isinstance(doc, Mapping):
        raise UserError(f"doc must be a mapping, got {type(doc).__name__}")
    if key not in doc:
        raise UserError(f"missing field {key!r} ({what})")
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise UserError(f"field {key!r} must be {what}, got {type(value).__name__}")
    return value
