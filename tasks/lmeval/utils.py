"""lm-eval glue for the harness's tasks (``lm_eval --include_path tasks/`` or ``TaskManager(include_path=...)``).

The YAMLs next to this file implement the evaluation protocols (docs/protocols.md), d1's by default: zero-shot,
GSM8K 1,319, MATH500 500, Countdown 256, Sudoku the 256 of 500 d1 draws, plus AIME 2024/2025, and three generated
sets that are not d1's: Countdown on 1,024 cd3-like puzzles (``dllm_countdown_large``), Sudoku on 256 12-blank
puzzles (``dllm_sudoku_hard``; see ``stabledrl_bench.tasks.countdown`` and ``.sudoku``) and Code I/O's 256 problems
(``dllm_code_io``, graded by running each answer in the sandbox; ``stabledrl_bench.tasks.code_io``), and HumanEval
and MBPP under StableDRL's code evaluation (``dllm_humaneval``, ``dllm_mbpp``: protocol ``stabledrl-code``, run in
the sandbox; ``stabledrl_bench.tasks.code_benchmarks``). Data come from
the package's shipped files (resolved relative to the package, never the working directory), so nothing is
downloaded.
``doc_to_text`` returns the *user message* (under d1: d1 system prompt + question); the model adapter applies the
chat template and the prefill (d1: ``<reasoning>``). ``process_results`` grades with the harness's graders and
reports both the robust verdict (``acc``) and d1's (``acc_d1``).

The protocol comes from the task metadata, ``d1`` in each YAML. lm-eval merges ``--model_args`` into it, so
``--model_args ...,protocol=tracerl-static`` renders TraceRL's prompts for a block-diffusion model; each doc
records the protocol and its prompt protocol (``protocol``, ``prompt_protocol``), and the adapter refuses a
request rendered for another protocol than its own.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import datasets

import stabledrl_bench.evaluation.lmeval_adapter  # noqa: F401  (registers the "stabledrl_dllm" model for the lm_eval CLI)
from stabledrl_bench.errors import UserError
from stabledrl_bench.evaluation.protocols import get_protocol
from stabledrl_bench.reporting.passk import sampled_metrics
from stabledrl_bench.tasks import Task, get_task
from stabledrl_bench.tasks.countdown import CountdownTask
from stabledrl_bench.tasks.sudoku import SudokuTask

PROTOCOL = "d1"


@cache
def _task(name: str) -> Task:
    return get_task(name)


def _dataset(task: str, metadata: dict[str, Any]) -> datasets.DatasetDict:
    """The task's evaluation docs as the ``test`` split, stamped with the protocol whose prompts they render
    (``metadata``: the YAML's, with lm-eval's ``--model_args`` / ``--metadata`` merged in, passed as keywords)."""
    protocol = get_protocol(str(metadata.get("protocol", PROTOCOL)))
    if protocol.prompt_protocol not in _task(task).protocols:
        raise UserError(
            f"task {task} has no {protocol.prompt_protocol!r} prompts for protocol {protocol.name} (it has "
            f"{', '.join(_task(task).protocols)})"
        )
    stamp = {"protocol": protocol.name, "prompt_protocol": protocol.prompt_protocol}
    docs = [doc | stamp for doc in _task(task).eval_docs()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def load_gsm8k(**metadata: Any) -> datasets.DatasetDict:
    return _dataset("gsm8k", metadata)


def load_math500(**metadata: Any) -> datasets.DatasetDict:
    return _dataset("math500", metadata)


def load_countdown(**metadata: Any) -> datasets.DatasetDict:
    return _dataset("countdown", metadata)


def load_sudoku(**metadata: Any) -> datasets.DatasetDict:
    return _dataset("sudoku", metadata)


def load_countdown_large(**metadata: Any) -> datasets.DatasetDict:
    return _dataset("countdown_large", metadata)


def load_sudoku_hard(**metadata: Any) -> datasets.DatasetDict:
    return _dataset("sudoku_hard", metadata)


def load_code_io(**metadata: Any) -> datasets.DatasetDict:
    return _dataset("code_io", metadata)


def load_humaneval(**metadata: Any) -> datasets.DatasetDict:
    return _dataset("humaneval", metadata)


def load_mbpp(**metadata: Any) -> datasets.DatasetDict:
    return _dataset("mbpp", metadata)


def load_aime24(**metadata: Any) -> datasets.DatasetDict:
    return _dataset("aime24", metadata)


def load_aime25(**metadata: Any) -> datasets.DatasetDict:
    return _dataset("aime25", metadata)


def load_registered(**metadata: Any) -> datasets.DatasetDict:
    """``dllm_task``: any registered task (a plugin's too), named by ``--metadata '{"harness_task": "<task>"}'``."""
    name = metadata.get("harness_task")
    if not isinstance(name, str):
        raise UserError(
            'dllm_task: name the task to evaluate with --metadata \'{"harness_task": "<task>"}\' '
            "(`python -m stabledrl_bench list tasks` lists them)"
        )
    return _dataset(name, metadata)


def doc_to_text(doc: dict[str, Any]) -> str:
    """The user message of the doc's prompt protocol (d1: the task's d1 system prompt, a blank line, the question)."""
    return _task(doc["task"]).prompt(doc, doc.get("prompt_protocol", PROTOCOL)).messages[0]["content"]


def doc_to_target(doc: dict[str, Any]) -> str:
    """The gold answer, for logs (grading reads the doc's gold fields directly)."""
    name = doc["task"]
    if name == "gsm8k":
        return doc["gold"]
    if isinstance(_task(name), CountdownTask):
        return str(doc["target"])
    if isinstance(_task(name), SudokuTask):
        return doc["solution"]
    if "answer" in doc:
        return str(doc["answer"])
    # a task with other gold fields: its gold completion, in the layout of the prompts the doc was rendered with
    return _task(name).target_completion(doc, doc.get("prompt_protocol", PROTOCOL))


def process_registered(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """``dllm_task``'s metrics, which every task has: ``acc`` (the grader's verdict) and ``score`` (its per-item
    score, e.g. Sudoku's cell accuracy; the verdict again for most tasks). Several decodes (a ``*_pass16`` task
    built on it): as :func:`process_results`."""
    if isinstance(results[0], list):
        return process_results(doc, results)
    grade = _task(doc["task"]).grade(results[0], doc)
    return {"acc": float(grade.correct), "score": float(grade.score)}


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """Per-document metrics (averaged by lm-eval).

    Math tasks: ``acc`` (math-verify), ``acc_d1`` (d1's parser), ``timed_out``; Countdown: ``acc`` (safe
    evaluator, every number once), ``acc_d1``; Sudoku: ``acc`` (a valid completion of the puzzle),
    ``cell_acc`` (d1's metric; all d1 test puzzles have 8 blanks, so its mean equals d1's micro average) and
    ``exact_match`` (the reference solution).

    Several decodes of the document (the ``*_pass16`` tasks): ``acc`` over all of them, and ``pass@k`` and
    ``maj@k`` from the same estimators as the native evaluator.
    """
    if isinstance(results[0], list):  # the *_pass16 tasks' take_first_k filter hands over all decodes as one list
        grades = _task(doc["task"]).grade_many(results[0], [doc] * len(results[0]))
        votes = [(grade.extracted, bool(grade.correct)) for grade in grades]
        return {"acc": sum(correct for _, correct in votes) / len(votes)} | sampled_metrics([votes])
    grade = _task(doc["task"]).grade(results[0], doc)
    metrics = {"acc": float(grade.correct)}
    if isinstance(_task(doc["task"]), SudokuTask):
        return {**metrics, "cell_acc": grade.score, "exact_match": float(grade.details["exact_match"])}
    metrics["acc_d1"] = float(grade.details["d1"])
    if "timed_out" in grade.details:
        metrics["timed_out"] = float(grade.details["timed_out"])
    return metrics
