"""Code I/O: generated problems (deterministic, train and test disjoint by function), grading by execution in the
sandbox only, DiffuCoder's reward (format by ``ast`` without running anything, then the fraction of tests passed),
and one RL step of the tiny model on it."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SMALL, small_budget

from stabledrl_bench.core.models import build_tiny, save_diffusion_lm
from stabledrl_bench.core.models.tokenizer import alphabet
from stabledrl_bench.errors import UserError
from stabledrl_bench.experiments.presets import presets
from stabledrl_bench.tasks import code_io as task_module
from stabledrl_bench.tasks import get_task
from stabledrl_bench.tasks.base import DATA_DIR, PROTOCOLS
from stabledrl_bench.tasks.graders import code_io as grader
from stabledrl_bench.tasks.graders import sandbox

NO_SANDBOX = sandbox.available()
needs_sandbox = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox here: {NO_SANDBOX}")
TASK = get_task("code_io")
DOC = TASK.load("test", limit=1)[0]  # f(x) = 2*x+9


def _answer(program: str) -> str:
    return f"<answer>{program}</answer>"


# ----------------------------------------------------------------------------------------------- problems
def test_the_generator_is_deterministic_in_its_seed() -> None:
    first = task_module.make_problems(64, seed=3)
    assert first == task_module.make_problems(64, seed=3) != task_module.make_problems(64, seed=4)
    docs = TASK.generate(5, seed=7)
    assert [d["doc_id"] for d in docs] == [f"code_io/generated-7/{i}" for i in range(5)]
    assert TASK.generate(3, seed=7) == docs[:3]  # prefix-stable, as validation_docs expects
    assert len({json.dumps(p["examples"]) for p in task_module.make_problems(2000, seed=0)}) == 2000  # distinct
    with pytest.raises(TypeError):
        TASK.generate(2, seed=0, num_numbers=[3])


def test_the_committed_test_set_is_its_recipe() -> None:
    assert TASK.load("test") == [
        {"doc_id": f"code_io/test/{i}", "task": "code_io", **p}
        for i, p in enumerate(task_module.make_problems(**task_module.TEST_RECIPE))
    ]
    assert (DATA_DIR / task_module.TEST_FILE).is_file() and len(TASK.eval_docs()) == 256


def test_train_and_test_are_disjoint_by_function() -> None:
    """Every test problem's function is a held-out one, no training problem's is, and every family has both."""
    universe = task_module.universe()
    assert len(universe.expressions) == 213 == len({tuple(row) for row in universe.values.tolist()})  # distinct
    assert all(test and train for test, train in zip(universe.pool(True), universe.pool(False), strict=True))
    held_out = {e for e in universe.expressions if task_module.is_test_function(e)}
    assert len(held_out) == 56
    assert {d["function"] for d in TASK.load("test")} <= held_out
    training = TASK.generate(3000, seed=0) + TASK.load("train") + TASK.validation_docs(16, seed=1, source="generated")
    assert not held_out & {d["function"] for d in training}


def test_the_examples_determine_the_function_and_the_tests_check_more() -> None:
    universe = task_module.universe()
    index = {e: i for i, e in enumerate(universe.expressions)}
    for doc in TASK.load("test"):
        problem = TASK.gold(doc)
        shown = [x for x, _ in problem.examples]
        fits = (universe.values[:, shown] == [y for _, y in problem.examples]).all(axis=1)
        assert np.flatnonzero(fits).tolist() == [index[problem.function]]
        assert set(problem.examples) < set(problem.tests) and len(problem.tests) == task_module.HIDDEN
        assert all(universe.values[index[problem.function], x] == y for x, y in problem.tests)


def test_prompts_and_gold_completions_fit_the_tiny_model() -> None:
    """Every character is in the tiny tokenizer's alphabet; the tiny gold completion fits the 40-token canvas with
    its EOS, the prompt the tiny preset's 64-token prompt budget (with the three chat-template tokens)."""
    chars = set(alphabet())
    for doc in TASK.load("test"):
        for protocol in PROTOCOLS:
            assert set(TASK.user_message(doc, protocol) + TASK.target_completion(doc, protocol)) <= chars
        assert len(TASK.target_completion(doc, "tiny")) <= 39 and len(TASK.user_message(doc, "tiny")) + 3 <= 64
    assert TASK.user_message(DOC, "tiny") == " 4: 17  7: 23 13: 35 16: 41"
    assert TASK.target_completion(DOC, "tiny") == "<answer>def f(x):return 2*x+9</answer>"
    assert TASK.target_completion(DOC, "d1_train").endswith("<answer>\ndef f(x):\n    return 2*x+9\n</answer>\n")


def test_bad_gold_fields_are_one_line_errors() -> None:
    for bad in ({"function": "x+1"}, {**DOC, "tests": [[1, True]]}, {**DOC, "examples": []}):
        with pytest.raises(UserError):
            TASK.gold(bad)


# ----------------------------------------------------------------------------------------------- format
@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<answer>def f(x):return x+1</answer>", 1.0),
        ("<answer>\ndef f(n):\n    y = n * 2\n    return y\n</answer>", 1.0),
        ("def f(x):return x+1", 0.0),  # no answer tag
        ("<answer>def f(x) return x</answer>", 0.5),  # a syntax error
        ("<answer>def g(x):return x</answer>", 0.5),  # the wrong name
        ("<answer>def f(x, y):return x</answer>", 0.5),
        ("<answer>def f(*x):return x</answer>", 0.5),
        ("<answer>lambda x: x+1</answer>", 0.5),
        ("<answer>import os\ndef f(x):return x</answer>", 0.5),  # more than the definition
        ("<answer>async def f(x):return x</answer>", 0.5),
        ("<answer>" + "(" * 10_000 + "</answer>", 0.5),
    ],
)
def test_format_is_one_plain_definition_of_f(completion: str, expected: float) -> None:
    assert grader.format_score(grader.extract_program(completion)) == expected


def test_the_format_check_never_runs_the_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Definitions whose decorator or default would act when run (here: create a file) are judged by ``ast`` alone:
    nothing is executed, and ``exec``/``eval`` are never called."""
    marker = tmp_path / "ran"
    acts = f"__import__('pathlib').Path({str(marker)!r}).touch()"

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the format check executed code")

    monkeypatch.setattr(builtins, "exec", refuse)
    monkeypatch.setattr(builtins, "eval", refuse)
    for program in (f"@{acts}\ndef f(x):return x", f"def f(x={acts}):return x", f"{acts}\ndef f(x):return x"):
        assert grader.format_score(program) == 0.5
    assert grader.format_score(f"def f(x):\n    {acts}\n    return x") == 1.0  # its body would only run if called
    assert not marker.exists()


def test_malformed_completions_never_reach_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(grader, "sandbox_unavailable", lambda: None)
    monkeypatch.setattr(grader.sandbox, "run_program", lambda source, **kwargs: calls.append(source))
    texts = ["", "no tag", _answer("import os; os.system('rm -rf /')"), _answer("def f(x) return")]
    rewards = TASK.reward_many(texts, [DOC] * len(texts), "d1")
    assert [r.components for r in rewards] == [
        {"code_format": 0.0, "code": 0.0},
        {"code_format": 0.0, "code": 0.0},
        {"code_format": 0.25, "code": 0.0},
        {"code_format": 0.25, "code": 0.0},
    ]
    assert calls == []


def test_without_a_sandbox_the_task_stops_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """No program runs, confined or not, and the error says why in one line (even for a malformed batch)."""
    monkeypatch.setattr(grader, "sandbox_unavailable", lambda: "the sandbox needs Linux namespaces")
    monkeypatch.setattr(grader.sandbox, "run_program", lambda *a, **k: pytest.fail("ran a program"))
    for call in (
        lambda: TASK.reward(TASK.target_completion(DOC, "tiny"), DOC),
        lambda: TASK.grade("no tag", DOC),
    ):
        with pytest.raises(sandbox.SandboxUnavailable, match="needs Linux namespaces") as info:
            call()
        assert "\n" not in str(info.value) and "code_io" in str(info.value)


# -------------------------------------------------------------------------------------------- execution
@needs_sandbox
def test_every_gold_program_scores_full_marks_in_the_sandbox() -> None:
    docs = TASK.load("test")
    tiny = [TASK.target_completion(d, "tiny") for d in docs]
    assert all(r.total == 2.5 for r in TASK.reward_many(tiny, docs, "d1"))
    assert all(g.correct and g.score == 1.0 for g in TASK.grade_many(tiny, docs))
    few = docs[:4]
    for protocol in ("d1", "d1_train", "stabledrl"):
        texts = [TASK.target_completion(d, protocol) for d in few]
        assert all(g.correct for g in TASK.grade_many(texts, few))
        assert all(r.components["code"] == 2.0 for r in TASK.reward_many(texts, few, "stabledrl"))


@needs_sandbox
def test_wrong_and_hostile_programs_fail_alone(tmp_path: Path) -> None:
    """A wrong function passes only the tests it gets right; hostile ones (shell commands, files, infinite loops,
    forged results, exits) pass nothing they did not compute, and nothing happens outside the sandbox."""
    marker = tmp_path / "pwned"
    marker_text = repr(str(marker))
    tests = TASK.gold(DOC).tests
    line = "RESULTS:" + json.dumps([y for _, y in tests])
    cases = {
        "def f(x):return x+9": 0,  # right only at x = 0, which the tests do not hold
        "def f(x):return 2*x+9 if x < 10 else 0": sum(x < 10 for x, _ in tests),  # 5: inputs 2, 3, 4, 7, 8
        f"def f(x):\n    import os\n    os.system('touch ' + {marker_text})\n    return 2*x+9": 12,
        f"def f(x):\n    open({marker_text}, 'w').write('x')\n    return 2*x+9": 0,  # the host's path is not there
        "def f(x):\n    while True:\n        pass": 0,
        f"def f(x):\n    import os\n    os.write(1, b'{line}\\n')\n    os._exit(0)": 12,  # forging needs the answers
        f"def f(x):\n    print({line!r})\n    raise SystemExit(0)": 0,
        "def f(x):\n    return 2.0*x+9": 0,  # not an integer
        "def f(x):\n    return x > 3": 0,  # a bool is not an integer either
        "def f(x):\n    return 10**100": 0,
    }
    grades = TASK.grade_many([_answer(p) for p in cases], [DOC] * len(cases))
    for (program, expected), grade in zip(cases.items(), grades, strict=True):
        assert grade.details["passed"] == expected and grade.details["format"] == 1.0, (program, grade.details)
        assert grade.correct == (expected == 12)
    assert grades[4].details["status"] in ("error", "timeout")  # the infinite loop was stopped
    assert not marker.exists()


@needs_sandbox
def test_a_batch_runs_one_sandbox_program_per_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each well-formed completion is one program running all its tests; a second scoring reuses the results."""
    runs: list[str] = []
    real = grader.sandbox.run_program

    def counting(source: str, **kwargs: object) -> sandbox.Outcome:
        runs.append(source)
        return real(source, **kwargs)

    monkeypatch.setattr(grader.sandbox, "run_program", counting)
    grader._outputs.cache_clear()
    texts = [_answer(f"def f(x):return 2*x+{b}") for b in range(1, 10)] + ["no tag"] * 3
    rewards = TASK.reward_many(texts, [DOC] * len(texts), "d1")
    assert len(runs) == 9 and [r.total for r in rewards] == [0.5] * 8 + [2.5] + [0.0] * 3
    TASK.grade_many(texts, [DOC] * len(texts))
    assert len(runs) == 9


# -------------------------------------------------------------------------------------- preset, trainer
def test_the_tiny_preset_has_it_outside_the_default_run() -> None:
    table1 = presets("table1")
    tiny, smoke = table1["tiny"], table1["smoke"]
    assert "code_io" not in tiny.default_tasks() and tiny.tasks["code_io"].train_split == "generated"
    assert tiny.task_sft("code_io") == tiny.task_sft("countdown")  # Countdown's warm start, untuned
    assert tiny.tasks["code_io"].generator_options == {} and smoke.task_sft("code_io").max_steps == 10


@needs_sandbox
def test_one_rl_step_on_code_io_runs_the_real_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stabledrl_bench.training.config import TrainConfig
    from stabledrl_bench.training.optim import OptimConfig
    from stabledrl_bench.training.runlog import read_log
    from stabledrl_bench.training.trainer import RLTrainer

    model = tmp_path / "model"
    save_diffusion_lm(build_tiny(**SMALL), model)
    batches: list[int] = []
    real = grader.run_tests

    def spy(programs, tests, *, task):
        batches.append(len(programs))
        return real(programs, tests, task=task)

    monkeypatch.setattr(task_module, "run_tests", spy)
    cfg = TrainConfig(
        baseline="coupled_grpo",
        task="code_io",
        model=str(model),
        protocol="tiny",
        train_split="generated",
        budget=small_budget(max_steps=1, num_iterations=1, max_prompt_length=64),
        optim=OptimConfig(learning_rate=1e-3, lr_scheduler_type="constant", max_grad_norm=1.0),
        per_device_prompts=2,
        output_dir=str(tmp_path / "run"),
        progress=False,
    )
    RLTrainer(cfg).train()  # a random model writes no function, so its reward is 0: the step still runs through
    records = read_log(tmp_path / "run" / "log.jsonl")
    assert [r["step"] for r in records] == [1] and 0.0 <= records[0]["reward_mean"] <= 2.5
    assert sum(batches) >= 8  # the rollout's 2 prompts x 4 completions went through the task's sandboxed batch
