"""The lm-eval task YAMLs load with ``TaskManager`` and run end to end against a stub model."""

from __future__ import annotations

from pathlib import Path

import lm_eval
import pytest
from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager

import stabledrl_bench.tasks
from stabledrl_bench.errors import UserError
from stabledrl_bench.tasks import get_task
from stabledrl_bench.tasks.graders import sandbox

LMEVAL_DIR = Path(stabledrl_bench.tasks.__file__).resolve().parent / "lmeval"
TASKS = [
    "dllm_gsm8k",
    "dllm_math500",
    "dllm_countdown",
    "dllm_sudoku",
    "dllm_aime24",
    "dllm_aime25",
    "dllm_countdown_large",  # generated sets, not d1's
    "dllm_sudoku_hard",
    "dllm_code_io",  # graded by running the answers in the sandbox
    "dllm_humaneval",  # StableDRL's code evaluation, run in the sandbox too
    "dllm_mbpp",
]
GENERATED = ("dllm_countdown_large", "dllm_sudoku_hard", "dllm_code_io")  # not d1's test sets
CODE = ("dllm_code_io", "dllm_humaneval", "dllm_mbpp")  # they run the answers
NOT_D1 = (*GENERATED, "dllm_humaneval", "dllm_mbpp")


class GoldLM(LM):
    """Answers every request with the gold completion of its doc, as a model continuing the d1 prefill would."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list = []

    def generate_until(self, requests):
        self.requests += requests
        return [get_task(r.doc["task"]).target_completion(r.doc, r.doc["prompt_protocol"]) for r in requests]

    def loglikelihood(self, requests):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError


@pytest.fixture(scope="module")
def manager() -> TaskManager:
    return TaskManager(include_path=str(LMEVAL_DIR), include_defaults=False)


def test_yamls_load(manager: TaskManager) -> None:
    assert set(TASKS) <= set(manager.all_tasks)
    loaded = manager.load(TASKS)["tasks"]
    sizes = {name: len(list(task.eval_docs)) for name, task in loaded.items()}
    assert sizes == {
        "dllm_gsm8k": 1319,
        "dllm_math500": 500,
        "dllm_countdown": 256,
        "dllm_sudoku": 256,
        "dllm_aime24": 30,
        "dllm_aime25": 30,
        "dllm_countdown_large": 1024,
        "dllm_sudoku_hard": 256,
        "dllm_code_io": 256,
        "dllm_humaneval": 164,
        "dllm_mbpp": 500,
    }
    d1_sets = [name for name in TASKS if name not in NOT_D1]
    assert sorted(manager.load(["dllm_d1"])["tasks"]) == sorted(d1_sets)  # the generated sets are not d1's
    config = loaded["dllm_sudoku"].config
    assert config.metadata["prefill"] == "<reasoning>" and config.metadata["chat_template"] is True
    assert config.num_fewshot == 0 and config.output_type == "generate_until"


def gold_run(manager: TaskManager, tasks: list[str], limit: int = 3, model: GoldLM | None = None) -> dict:
    """The ``,none`` metrics of each task when every request is answered with its gold completion."""
    results = lm_eval.simple_evaluate(
        model=model or GoldLM(),
        tasks=tasks,
        limit=limit,
        task_manager=manager,
        log_samples=False,
        random_seed=None,
        numpy_random_seed=None,
        torch_random_seed=None,
        fewshot_random_seed=None,
    )["results"]
    return {name: {k.split(",")[0]: v for k, v in results[name].items() if k.endswith(",none")} for name in tasks}


def test_end_to_end_with_gold_stub(manager: TaskManager) -> None:
    model = GoldLM()
    tasks = [name for name in TASKS if name not in CODE or sandbox.available() is None]  # they run code
    results = gold_run(manager, tasks, model=model)
    for name in tasks:
        metrics = results[name]
        expected = ["acc", "cell_acc", "exact_match"] if "sudoku" in name else ["acc", "acc_d1"]
        expected = ["acc", "score"] if name in CODE else expected
        assert {m: metrics[m] for m in expected} == dict.fromkeys(expected, 1.0), name
    assert len(model.requests) == 3 * len(tasks)
    for request in model.requests:  # the context is exactly the user message of the doc (d1's; StableDRL's for code)
        doc = request.doc
        assert doc["prompt_protocol"] == ("stabledrl_eval" if doc["task"] in ("humaneval", "mbpp") else "d1")
        assert request.args[0] == get_task(doc["task"]).prompt(doc, doc["prompt_protocol"]).messages[0]["content"]


def test_the_protocol_in_the_metadata_picks_the_prompts() -> None:
    """lm-eval merges ``--model_args`` into the task metadata: ``protocol=tracerl-static`` renders TraceRL's prompt
    and stamps it on the docs (the adapter checks the stamp); a protocol no task renders is one line."""
    manager = TaskManager(include_path=str(LMEVAL_DIR), include_defaults=False, metadata={"protocol": "tracerl-static"})
    task = manager.load(["dllm_gsm8k"])["tasks"]["dllm_gsm8k"]
    doc = next(iter(task.eval_docs))
    assert (doc["protocol"], doc["prompt_protocol"]) == ("tracerl-static", "tracerl")
    cot = "\nPlease reason step by step, and put your final answer within \\boxed{}."
    assert task.doc_to_text(doc) == doc["question"] + cot
    with pytest.raises(UserError, match="unknown evaluation protocol 'nope'") as info:
        TaskManager(include_path=str(LMEVAL_DIR), include_defaults=False, metadata={"protocol": "nope"}).load(
            ["dllm_sudoku"]
        )
    assert "\n" not in str(info.value)
