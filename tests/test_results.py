"""Result records: round trip, validation, file naming, atomic writes, environment info.

``make_record`` / ``store`` build small synthetic records and are shared with ``test_leaderboard.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from stabledrl_bench.core.baseline import Baseline, register_baseline
from stabledrl_bench.errors import UserError
from stabledrl_bench.reporting import provenance
from stabledrl_bench.reporting.naming import model_short_name, result_path
from stabledrl_bench.reporting.provenance import ENV_PACKAGES, environment_info
from stabledrl_bench.reporting.results import load_results, load_samples, result_exists, write_result
from stabledrl_bench.reporting.schema import budget_hash


@register_baseline("test_rl_a")
class _TestRLA(Baseline):
    """Stand-in RL method: results may only name registered baselines."""


@register_baseline("test_rl_b")
class _TestRLB(Baseline):
    """Second stand-in RL method."""


ENV: dict[str, Any] = {
    "python": "3.11.2",
    "hardware": {"platform": "test", "machine": "x86_64", "cpu_count": 2, "gpus": []},
    "packages": {},
    "git": {"commit": None, "dirty": None},
    "argv": [],
}
BUDGET: dict[str, Any] = {
    "max_steps": 10,
    "prompts_per_step": 2,
    "num_generations": 4,
    "num_iterations": 1,
    "max_completion_length": 32,
    "diffusion_steps": 16,
    "block_length": 8,
    "temperature": 0.9,
    "max_prompt_length": 64,
}
TINY = {"family": "tiny", "name": "tiny-dlm", "checkpoint": None, "parameters": 1234}


def make_record(**overrides: Any) -> dict[str, Any]:
    """A valid Table 1 record without metrics (``store`` adds them from the samples)."""
    record = {
        "preset": "tiny",
        "comparison": "cmp",
        "table": "table1",
        "baseline": "test_rl_a",
        "task": "gsm8k",
        "length": 128,
        "max_completion_length": 32,
        "protocol": "d1",
        "seed": 0,
        "model": TINY,
        "budget": BUDGET,
        "settings": {"max_completion_length": 32, "steps": 16, "block_length": 8},
        "environment": ENV,
    }
    record.update(overrides)
    return record


def make_samples(correct: list[bool]) -> list[dict[str, Any]]:
    return [
        {
            "doc_id": i,
            "prompt": f"question {i}",
            "completion": "answer",
            "correct": flag,
            "score": float(flag),
            "extracted": "42" if flag else None,
            "details": {},
        }
        for i, flag in enumerate(correct)
    ]


def store(results_dir: Path, correct: list[bool], **overrides: Any) -> Path:
    """Write one synthetic evaluation whose accuracy is the mean of ``correct``."""
    record = make_record(**overrides)
    record["metrics"] = {"accuracy": sum(correct) / len(correct), "n": len(correct)}
    samples = make_samples(correct)
    for sample in samples if record["seed"] else []:  # as real seeds do, each seed decodes its own completions
        sample["completion"] += f" (seed {record['seed']})"
    return write_result(results_dir, record, samples)


def test_round_trip(tmp_path: Path) -> None:
    path = store(tmp_path, [True, False, True, True])
    (record,) = load_results(tmp_path)
    assert record["_path"] == str(path)
    assert record["metrics"] == {"accuracy": 0.75, "n": 4}
    assert record["budget_hash"] == budget_hash(BUDGET)
    assert record["schema"] == "stabledrl-bench/result/v2" and record["kind"] == "measured"
    assert record["sampling"] is None
    assert "per_sample_correct" not in json.loads(path.read_text())
    assert path.with_name(path.name.removesuffix(".json") + ".samples.jsonl").exists()
    samples = load_samples(record)
    assert [s["correct"] for s in samples] == [True, False, True, True]
    assert samples[0] == make_samples([True])[0]


def test_a_v1_record_is_read_under_the_current_names(tmp_path: Path) -> None:
    """Schema v1 called the decoded canvas ``actual_gen_length``; such files are read, never rewritten."""
    path = store(tmp_path, [True, False])
    record = json.loads(path.read_text())
    record["schema"] = "stabledrl-bench/result/v1"
    record["actual_gen_length"] = record.pop("max_completion_length")
    path.write_text(json.dumps(record))
    (loaded,) = load_results(tmp_path)
    assert loaded["schema"] == "stabledrl-bench/result/v2" and loaded["max_completion_length"] == 32
    assert "actual_gen_length" not in loaded and json.loads(path.read_text())["actual_gen_length"] == 32
    record["max_completion_length"] = 32  # both names at once is no valid v1 record
    path.write_text(json.dumps(record))
    with pytest.raises(UserError, match="unknown key"):
        load_results(tmp_path)


def test_file_name_and_result_exists(tmp_path: Path) -> None:
    key = make_record(seed=3, task="sudoku", length=256)
    assert not result_exists(tmp_path, key)
    path = store(tmp_path, [True], seed=3, task="sudoku", length=256)
    assert path == result_path(tmp_path, key)
    assert path.parent == tmp_path / "cmp"
    assert path.name.startswith("table1__tiny__test_rl_a__sudoku__L256__d1__s3__tiny-dlm-")
    assert result_exists(tmp_path, key)
    assert not result_exists(tmp_path, make_record(seed=4, task="sudoku", length=256))
    path.with_name(path.name.removesuffix(".json") + ".samples.jsonl").unlink()
    assert not result_exists(tmp_path, key)  # samples gone: not done


def test_result_path_distinguishes_checkpoints_with_same_short_name(tmp_path: Path) -> None:
    first = make_record(model={**TINY, "checkpoint": "x/run/final"})
    second = make_record(model={**TINY, "checkpoint": "y/run/final"})
    assert result_path(tmp_path, first) != result_path(tmp_path, second)
    assert model_short_name(first["model"]) == "run-final"
    assert model_short_name({"name": "GSAI-ML/LLaDA-8B-Instruct", "checkpoint": None}) == "LLaDA-8B-Instruct"


def test_budget_hash_is_canonical_sha256_prefix() -> None:
    expected = hashlib.sha256(b'{"a":1,"b":[1,2]}').hexdigest()[:12]
    assert budget_hash({"b": [1, 2], "a": 1}) == expected
    assert budget_hash({"a": 1, "b": [1, 2]}) == expected
    assert budget_hash({"a": 2, "b": [1, 2]}) != expected
    with pytest.raises(UserError):
        budget_hash({"a": float("nan")})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"table": "table3"}, "'table'"),
        ({"task": "nonesuch"}, "'nonesuch' is not a registered task"),
        ({"length": 100}, "'length'"),
        ({"table": "table2", "task": "aime24", "length": 2000}, "'sampling'"),
        ({"baseline": "not_a_method"}, "not registered"),
        ({"budget": None}, "needs a 'budget'"),
        ({"budget_hash": "0123456789ab"}, "does not match"),
        ({"model": {"name": "m"}}, r"\.json\.model: missing key\(s\) family, checkpoint, parameters"),
        ({"unexpected": 1}, r"unknown key\(s\) unexpected"),
        ({"seed": "0"}, r"\.json\.seed: expected an integer"),
        ({"budget": {"max_steps": 1}, "budget_hash": budget_hash({"max_steps": 1})}, r"'budget': missing key"),
        ({"budget": {**BUDGET, "x": 1}, "budget_hash": budget_hash({**BUDGET, "x": 1})}, r"unknown key\(s\) x"),
        ({"budget": {**BUDGET, "max_steps": 0}, "budget_hash": budget_hash({**BUDGET, "max_steps": 0})}, "positive"),
        ({"advantage": {"rule": "group_mean"}}, "'advantage' must be"),  # the rule and its options, both
        (
            {"baseline": "sft", "budget": None, "budget_hash": None, "advantage": {"rule": "r", "options": {}}},
            "a sft row has no 'advantage'",
        ),
    ],
)
def test_write_rejects_invalid_records(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message):
        store(tmp_path, [True, False], **overrides)
    assert not list(tmp_path.rglob("*.json*"))  # nothing written


def test_write_rejects_metrics_that_disagree_with_samples(tmp_path: Path) -> None:
    record = make_record()
    record["metrics"] = {"accuracy": 0.9, "n": 2}
    with pytest.raises(UserError, match=r"samples give 0\.5"):
        write_result(tmp_path, record, make_samples([True, False]))
    record["metrics"] = {"accuracy": 50.0, "n": 2}  # a percentage, not a fraction
    with pytest.raises(UserError, match=r"fraction in \[0, 1\]"):
        write_result(tmp_path, record, make_samples([True, False]))
    record["metrics"] = {"accuracy": 0.5, "n": 2, "top1": 0.9}  # a name no evaluator writes
    with pytest.raises(UserError, match=r"unknown metric\(s\) top1"):
        write_result(tmp_path, record, make_samples([True, False]))
    record["metrics"] = {"accuracy": 0.5, "n": 2, "pass@1": 0.5}  # pass@k of a greedy, once-decoded record
    with pytest.raises(
        UserError, match=r"'metrics.pass@1' needs 2\+ decodes per problem; settings.protocol.repeats is 1"
    ):
        write_result(tmp_path, record, make_samples([True, False]))
    record = make_record()
    del record["protocol"]
    record["metrics"] = {"accuracy": 0.5, "n": 2}
    with pytest.raises(UserError, match="result key is missing field"):
        write_result(tmp_path, record, make_samples([True, False]))


def test_reference_rows_need_no_budget(tmp_path: Path) -> None:
    store(tmp_path, [True], baseline="base", budget=None)
    (record,) = load_results(tmp_path)
    assert record["budget"] is None and record["budget_hash"] is None


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda text: text[: len(text) // 2], "unreadable result file"),
        (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "task"}), "missing key"),
        (lambda text: text.replace('"accuracy": 0.5', '"accuracy": 1.5'), "fraction"),
    ],
)
def test_corrupt_result_file_names_the_file(tmp_path: Path, corrupt: Any, message: str) -> None:
    path = store(tmp_path, [True, False])
    path.write_text(corrupt(path.read_text()))
    with pytest.raises(UserError, match=message) as info:
        load_results(tmp_path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_tampered_samples_are_detected(tmp_path: Path) -> None:
    path = store(tmp_path, [True, False])
    samples_path = path.with_name(path.name.removesuffix(".json") + ".samples.jsonl")
    samples_path.write_text(samples_path.read_text().replace("true", "false"))
    (record,) = load_results(tmp_path)
    with pytest.raises(UserError, match="sha256") as info:
        load_samples(record)
    assert str(samples_path) in str(info.value)


def test_stability_folder_is_ignored_but_other_json_is_not(tmp_path: Path) -> None:
    store(tmp_path, [True])
    (tmp_path / "stability").mkdir()
    (tmp_path / "stability" / "run.json").write_text("{not a result")
    assert len(load_results(tmp_path)) == 1
    (tmp_path / "notes.json").write_text("{}")
    with pytest.raises(UserError, match=r"notes\.json"):
        load_results(tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        load_results(tmp_path / "missing")


def test_interrupted_overwrite_never_leaves_an_inconsistent_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupt the second file (the JSON) of an overwrite: the result is 'not done', never old JSON + new samples."""
    store(tmp_path, [True, True])
    calls = []
    real_replace = os.replace

    def replace_then_fail_on_json(source: str, destination: str) -> None:
        calls.append(destination)
        if str(destination).endswith(".json"):
            raise KeyboardInterrupt
        real_replace(source, destination)

    monkeypatch.setattr(os, "replace", replace_then_fail_on_json)
    with pytest.raises(KeyboardInterrupt):
        store(tmp_path, [False, False])
    monkeypatch.undo()
    assert [Path(c).suffix for c in calls] == [".jsonl", ".json"]
    assert load_results(tmp_path) == []
    assert not result_exists(tmp_path, make_record())
    assert not list(tmp_path.rglob("*.tmp"))
    assert not list(tmp_path.rglob("*.samples.jsonl"))  # no orphan samples either
    store(tmp_path, [False, True])  # the rerun completes it
    assert load_results(tmp_path)[0]["metrics"]["accuracy"] == 0.5


def test_environment_info_keys() -> None:
    info = environment_info()
    assert set(info) >= {"python", "hardware", "packages", "git"}
    assert set(info["hardware"]) >= {"platform", "cpu_count", "gpus", "cpu", "cpu_signature", "capability", "threads"}
    # what decides a CPU run's bits besides the code (docs/regression.md): the thread count the run really used
    assert info["hardware"]["threads"] == torch.get_num_threads()
    assert info["hardware"]["capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(info["packages"]) == set(ENV_PACKAGES)
    assert info["packages"]["stabledrl_bench"] is not None
    assert set(info["git"]) == {"commit", "dirty"}
    commit = info["git"]["commit"]
    assert commit is None or (len(commit) == 40 and isinstance(info["git"]["dirty"], bool))
    json.dumps(info)  # stored inside every record


def test_generated_files_do_not_make_the_tree_dirty(tmp_path: Path) -> None:
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "leaderboard.md").write_text("old\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.json").write_text("{}")
    (tmp_path / "leaderboard.md").write_text("regenerated\n")
    assert provenance.git_state(tmp_path)["dirty"] is False
    (tmp_path / "runs2" / "s0").mkdir(parents=True)  # a second runs folder, a scratch note: not code
    (tmp_path / "runs2" / "s0" / "log.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("scratch\n")
    assert provenance.git_state(tmp_path)["dirty"] is False
    (tmp_path / "runs2" / "s0" / "plugin.py").write_text("x = 3\n")  # untracked code can change what runs
    assert provenance.git_state(tmp_path)["dirty"] is True
    (tmp_path / "runs2" / "s0" / "plugin.py").unlink()
    (tmp_path / "recipe.yaml").write_text("lr: 1\n")
    assert provenance.git_state(tmp_path)["dirty"] is True
    (tmp_path / "recipe.yaml").unlink()
    (tmp_path / "code.py").write_text("x = 2\n")
    assert provenance.git_state(tmp_path)["dirty"] is True


def test_code_counts_name_each_code_version_and_the_runs_that_recorded_none():
    clean, dirty = {"commit": "abcdef1234", "dirty": False}, {"commit": "abcdef1234", "dirty": True}
    assert provenance.code_counts([clean, None, dirty, clean, {}]) == {"abcdef1": 2, "unknown": 2, "abcdef1 dirty": 1}
