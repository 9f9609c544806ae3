"""KodCode-Light-RL-10K as a training split: loaded through ``datasets.load_dataset`` from local copies written here
in the dataset's schema (the data are not shipped), the d1-family prompt, the tests run in the sandbox with the
completion imported as ``solution``, DiffuCoder's reward by hand, hostile completions, and the one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stabledrl_bench.errors import UserError
from stabledrl_bench.tasks import TASKS, evaluation_tasks, get_task
from stabledrl_bench.tasks import kodcode as module
from stabledrl_bench.tasks.graders import sandbox

NO_SANDBOX = sandbox.available()
needs_sandbox = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox here: {NO_SANDBOX}")


def _row(question_id: str, question: str, solution: str, test: str, name: str) -> dict[str, Any]:
    """A row with KodCode-Light-RL-10K's columns (those this task reads, and some it ignores)."""
    return {
        "version": "v1.0",
        "style": "instruct",
        "subset": "Prefill",
        "question_id": question_id,
        "question": question,
        "solution": solution,
        "test": test,
        "test_info": [
            {"function_name": name, "parameter_list": "(a, b)", "function_declaration": "", "docstring": None}
        ],
        "gpt_pass_sequence": [1, 1, 1],
        "gpt_pass_trial_num": 3,
        "gpt_difficulty": "easy",
        "gpt_pass_percentage": 1.0,
    }


ADD = _row(
    "Prefill_1_I",
    "Write a function add(a, b) that returns the sum of a and b.",
    "def add(a, b):\n    return a + b\n",
    "from solution import add\n\ndef test_add_positive():\n    assert add(2, 3) == 5\n\n"
    "def test_add_negative():\n    assert add(-1, -1) == -2\n",
    "add",
)
# Two names imported in one line, pytest's raises and approx, a parametrized test (not called: pytest would supply x)
STATS = _row(
    "Prefill_2_I",
    "Write mean(values) and safe_div(a, b); safe_div raises ZeroDivisionError when b is 0.",
    "def mean(values):\n    return sum(values) / len(values)\n\n\ndef safe_div(a, b):\n    return a / b\n",
    "import pytest\nfrom solution import mean, safe_div\n\n\ndef test_mean():\n    assert mean([1, 2, 4]) == "
    "pytest.approx(2.3333333)\n\n\ndef test_safe_div_by_zero():\n    with pytest.raises(ZeroDivisionError, "
    "match='division'):\n        safe_div(1, 0)\n\n\ndef test_safe_div():\n    assert safe_div(6, 3) == 2\n\n\n"
    "@pytest.mark.parametrize('x', [1, 2])\ndef test_param(x):\n    assert safe_div(x, x) == 1\n",
    "mean",
)
# The hostile row: its tests import everything and the module itself, which completions below try to subvert
HOSTILE = _row(
    "Prefill_3_I",
    "Write a function twice(x) that returns 2 * x.",
    "def twice(x):\n    return 2 * x\n",
    "from solution import *\nimport solution\n\n\ndef test_twice():\n    assert twice(4) == 8\n\n\n"
    "def test_twice_via_the_module():\n    assert solution.twice(-1) == -2\n",
    "twice",
)
ROWS = [ADD, STATS, HOSTILE]
ADD_PROMPT = (
    "\nRespond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n\n\n"
    "You are a coding expert. You will be given a coding problem to solve. Solve it step by step. \n\n"
    "Write a function add(a, b) that returns the sum of a and b."
)


def _fence(code: str) -> str:
    return f"<reasoning>\nI add them.\n</reasoning>\n<answer>\n```python\n{code}\n```\n</answer>"


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def kodcode(tmp_path: Path) -> module.KodCodeTask:
    return module.KodCodeTask(str(_jsonl(tmp_path / "kodcode.jsonl", ROWS)))


# ------------------------------------------------------------------------------------------------ loading
def test_registered_as_a_training_split_that_evaluation_lists_leave_out() -> None:
    assert "kodcode" in TASKS and "kodcode" not in evaluation_tasks()
    assert evaluation_tasks() == [name for name in TASKS if name != "kodcode"]
    assert "CC BY-NC 4.0" in module.KodCodeTask.description and module.HUB_ID in module.KodCodeTask.description
    with pytest.raises(UserError, match=r"^task 'kodcode' is a training split .* 'humaneval' or 'mbpp'$"):
        get_task("kodcode").eval_docs()


def test_local_files_load_through_load_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same ``load_dataset`` path reads a folder (as a Hub snapshot is) and a parquet file; the environment
    variable points the registered task at a copy; two copies in one process keep their own docs."""
    import datasets

    folder = tmp_path / "snapshot"
    folder.mkdir()
    _jsonl(folder / "train.jsonl", ROWS)
    parquet = tmp_path / "kodcode.parquet"
    datasets.Dataset.from_list(ROWS[:2]).to_parquet(str(parquet))
    monkeypatch.setenv(module.DATA_ENV, str(folder))
    assert module.KodCodeTask().data == str(folder)
    for task, rows in ((get_task("kodcode"), 3), (module.KodCodeTask(str(parquet)), 2)):
        docs = task.load("train")
        assert [d["doc_id"] for d in docs] == [f"kodcode/train/{i}" for i in range(rows)]
        assert docs[0] == {
            "doc_id": "kodcode/train/0",
            "task": "kodcode",
            "question": ADD["question"],
            "solution": ADD["solution"],
            "test": ADD["test"],
            "question_id": "Prefill_1_I",
            "test_functions": ["test_add_positive", "test_add_negative"],
        }
        assert docs[1]["test_functions"] == ["test_mean", "test_safe_div_by_zero", "test_safe_div"]


def test_missing_data_is_one_line_saying_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline (the test session sets HF_HUB_OFFLINE and HF_DATASETS_OFFLINE), with no copy of a Hub id: one line,
    naming the download command and the variable (an id no cache holds, so the test does not depend on whether this
    machine has KodCode cached; the real id takes the same path)."""
    monkeypatch.setenv(module.DATA_ENV, "stabledrl-tests/no-such-kodcode")
    with pytest.raises(UserError) as info:
        get_task("kodcode").load("train")
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        "KodCode data 'stabledrl-tests/no-such-kodcode' is not available here (ConnectionError); get it with "
        "`hf download KodCode/KodCode-Light-RL-10K --repo-type dataset --local-dir DIR` (huggingface_hub's CLI) "
        "where there is internet, then set STABLEDRL_KODCODE_DATA=DIR"
    )


def test_corrupt_rows(tmp_path: Path) -> None:
    """A row without KodCode's string fields is a corrupt file (one error naming the row); a row whose test cannot
    be called (does not parse, or has no test function without parameters) is skipped and counted."""
    broken = {**ADD, "test": None}
    with pytest.raises(UserError, match=r"^KodCode data '.*': row 1 has no string field 'test'; is it KodCode's\?$"):
        module.KodCodeTask(str(_jsonl(tmp_path / "broken.jsonl", [ADD, broken]))).load("train")
    unparsable = {**ADD, "test": "def test_x(:\n"}
    fixtures_only = {**ADD, "test": "def test_x(tmp_path):\n    assert tmp_path\n"}
    rows = [ADD, unparsable, fixtures_only]
    with pytest.warns(UserWarning, match=r"^kodcode: skipped 2 of 3 rows of '.*' whose test defines no test function"):
        docs = module.KodCodeTask(str(_jsonl(tmp_path / "skips.jsonl", rows))).load("train")
    assert [d["question"] for d in docs] == [ADD["question"]]
    with pytest.raises(UserError, match=r"a KodCode file must be \.json, \.jsonl, \.parquet"):
        module.KodCodeTask(str(_jsonl(tmp_path / "rows.csv", ROWS))).load("train")
    not_json = tmp_path / "not.json"
    not_json.write_text("{ this is not json")
    with pytest.raises(UserError, match=r"^KodCode data .*not\.json cannot be read: "):
        module.KodCodeTask(str(not_json)).load("train")


def test_rows_too_long_for_the_sandbox_are_skipped(tmp_path: Path) -> None:
    """The driver holds the program twice (whole, and as setup for the units): a 40,000-character test is over the
    sandbox's 65,536-byte limit, a 20,000-character one is not."""
    long_test = ADD["test"] + "\n\ndef test_long():\n    assert add(0, 0) == len('{}') - {}\n"
    rows = [{**ADD, "test": long_test.format("x" * n, n)} for n in (20_000, 40_000)]
    with pytest.warns(
        UserWarning, match=r"^kodcode: skipped 1 rows of .* longer than the sandbox runs \(65536 bytes\)"
    ):
        docs = module.KodCodeTask(str(_jsonl(tmp_path / "long.jsonl", rows))).load("train")
    assert [len(d["test"]) for d in docs] == [len(rows[0]["test"])]


def test_test_functions_follow_pytest_naming() -> None:
    source = "def helper():\n    pass\n\ndef test_a():\n    pass\n\nclass TestB:\n    def test_c(self):\n        pass\n"
    assert module.test_functions(source + "def test_d(*args):\n    pass\n\ndef testE():\n    pass\n") == [
        "test_a",
        "testE",
    ]
    assert module.first_import("import pytest\nfrom solution import b, a\n") == "b"
    assert module.first_import("from solution import *\n") is None


# ------------------------------------------------------------------------------------------------ prompts
def test_prompt_is_the_d1_family_training_prompt(kodcode: module.KodCodeTask) -> None:
    doc = kodcode.load("train", limit=1)[0]
    spec = kodcode.prompt(doc, "d1_train")
    assert spec.messages == ({"role": "user", "content": ADD_PROMPT},)
    assert spec.chat_template and spec.prefill == ""
    with pytest.raises(UserError, match="unknown protocol 'd1'; known: d1_train"):
        kodcode.prompt(doc, "d1")
    assert kodcode.target_completion(doc, "d1_train") == (
        "<reasoning>\nWrite the function the tests import, then check it against the examples in the question.\n"
        "</reasoning>\n<answer>\n```python\ndef add(a, b):\n    return a + b\n\n```\n</answer>\n"
    )


# ------------------------------------------------------------------------------------------ rewards, grading
@needs_sandbox
def test_every_reference_solution_earns_the_full_reward(kodcode: module.KodCodeTask) -> None:
    """0.5 x format 1.0 + 2.0 x all tests passed = 2.5, for every row (STATS: pytest's stand-in and two imported
    names; HOSTILE: a star import and the module itself), under both reward profiles."""
    docs = kodcode.load("train")
    completions = [kodcode.target_completion(doc, "d1_train") for doc in docs]
    for reward in kodcode.reward_many(completions, docs, "d1"):
        assert reward.components == {"code_format": 0.5, "code": 2.0} and reward.total == 2.5
    assert all(grade.correct for grade in kodcode.grade_many(completions, docs))
    units = [grade.details["units"] for grade in kodcode.grade_many(completions, docs)]  # the parametrized test: none
    assert units == [2, 3, 2]
    stabledrl = kodcode.reward_many(completions, docs, "stabledrl")
    assert [r.components["code"] for r in stabledrl] == [2.0, 2.0, 2.0]


@needs_sandbox
def test_rewards_by_hand(kodcode: module.KodCodeTask) -> None:
    add, stats, _ = kodcode.load("train")
    half = "def add(a, b):\n    return abs(a) + abs(b)"  # right on (2, 3), wrong on (-1, -1)
    renamed = "def plus(a, b):\n    return a + b"  # bound to the imported name, as the d1-family code renames it
    no_raise = (
        "def mean(values):\n    return sum(values) / len(values)\n\ndef safe_div(a, b):\n    return a / b if b else 0"
    )
    rewards = kodcode.reward_many(
        [_fence(half), _fence(renamed), _fence("def add(a, b) return"), half, _fence(no_raise)],
        [add, add, add, add, stats],
    )
    assert [(r.components, r.total) for r in rewards] == [
        ({"code_format": 0.5, "code": 1.0}, 1.5),  # 0.5 x 1.0 + 2.0 x 1/2
        ({"code_format": 0.5, "code": 2.0}, 2.5),
        ({"code_format": 0.25, "code": 0.0}, 0.25),  # a syntax error: 0.5 x 0.5, not run
        ({"code_format": 0.0, "code": 0.0}, 0.0),  # no fence: not run
        ({"code_format": 0.5, "code": pytest.approx(4.0 / 3)}, pytest.approx(0.5 + 4.0 / 3)),  # 2.0 x 2/3
    ]
    grade = kodcode.grade(_fence(half), add)
    assert not grade.correct and (grade.details["passed_units"], grade.details["units"]) == (1, 2)


# A completion that forges the driver's report: it looks for the token in the interpreter and prints a "passed"
# line with it, then leaves before any test runs.
FORGE = (
    "import os, sys, __main__\n"
    "token = next((v for v in vars(__main__).values() if isinstance(v, str) and len(v) == 32), '')\n"
    'sys.__stdout__.write(token + \'{"result": "passed", "units": null}\\n\')\n'
    "sys.__stdout__.flush()\n"
    "os._exit(0)"
)


@needs_sandbox
@pytest.mark.parametrize(
    "code",
    [
        "import os\nos._exit(0)",  # leaving before the tests is no pass
        "raise SystemExit(0)",
        FORGE,
        "print('passed')\ndef twice(x):\n    return 0",  # printing proves nothing
        # rebinding the test's names from the solution: the test source runs after the import, its defs win
        "import sys\nsys.modules['solution'].test_twice = lambda: None\ndef twice(x):\n    return 0",
        # rebinding what the sandbox's driver runs the tests and writes its report with forges nothing
        "import builtins\nbuiltins.exec = lambda *args, **kwargs: None\ndef twice(x):\n    return 0",
        'import json\njson.dumps = lambda obj: \'{"result": "passed", "units": null}\'\ndef twice(x):\n    return 0',
        "import __main__\n__main__.UNITS = ['pass'] * len(__main__.UNITS)\ndef twice(x):\n    return 0",
        "import __main__\n__main__._units = lambda *args: [True, True]\ndef twice(x):\n    return 0",
        "while True:\n    pass",  # stopped by the CPU timer
    ],
)
def test_hostile_completions_earn_nothing(kodcode: module.KodCodeTask, code: str) -> None:
    hostile = kodcode.load("train")[2]
    reward = kodcode.reward(_fence(code), hostile, "d1")
    assert reward.components == {"code_format": 0.5, "code": 0.0}
    assert not kodcode.grade(_fence(code), hostile).correct
