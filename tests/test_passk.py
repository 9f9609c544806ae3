"""pass@k and maj@k: the estimators against enumeration and hand-computed values, sampled protocols, the native
evaluator and ``verify``, the lm-eval path, ``reproduce --pass-k`` and the leaderboard's sampled block."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import lm_eval
import pytest
from lm_eval.tasks import TaskManager
from test_lmeval_tasks import LMEVAL_DIR, TASKS
from test_results import store
from test_verify import SMALL, _evaluate, _rewrite

from stabledrl_bench.core.models import build_tiny, save_diffusion_lm
from stabledrl_bench.errors import UserError
from stabledrl_bench.evaluation.lmeval_adapter import DiffusionEvalLM
from stabledrl_bench.evaluation.protocols import get_protocol, sampled_protocol
from stabledrl_bench.evaluation.verify import verify_record
from stabledrl_bench.experiments.comparison import comparison
from stabledrl_bench.experiments.presets import presets
from stabledrl_bench.reporting.leaderboard import build_leaderboard
from stabledrl_bench.reporting.passk import (
    k_values,
    maj_at_k,
    majority_correct,
    pass_at_k,
    sampled_metrics,
    votes_by_problem,
)
from stabledrl_bench.reporting.results import load_results, write_result
from stabledrl_bench.tasks import get_task

NO_PUBLISHED = {"schema": "stabledrl-bench/published/v1"}


# ------------------------------------------------------------------------------------------------ estimators
def enumerated_pass_at_k(flags: list[bool], k: int) -> float:
    """The definition itself: the fraction of the k-subsets of the n samples that hold a correct one."""
    subsets = list(itertools.combinations(flags, k))
    return sum(any(subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_equals_enumeration_over_every_subset(n: int) -> None:
    for correct in range(n + 1):
        flags = [True] * correct + [False] * (n - correct)
        for k in range(1, n + 1):
            assert pass_at_k(n, correct, k) == pytest.approx(enumerated_pass_at_k(flags, k), abs=1e-12)


def test_pass_at_k_hand_values_and_bad_input() -> None:
    assert pass_at_k(4, 1, 1) == 0.25 and pass_at_k(4, 1, 2) == 0.5 and pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(10, 3, 8) == 1.0  # only 7 wrong samples: any 8 hold a correct one
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)  # no overflow of C(200, 100)
    for bad in [(4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_majority_vote_by_hand() -> None:
    right, wrong = ("7", True), ("3", False)
    assert majority_correct([wrong, right, wrong]) is False  # a correct minority does not win
    assert majority_correct([right, wrong]) is True and majority_correct([wrong, right]) is False  # ties: first
    assert majority_correct([(None, False), (None, False), right]) is True  # no answer, no vote
    assert majority_correct([(None, False), (None, False)]) is False  # nobody votes: wrong
    votes = [right, wrong, wrong, right]
    assert maj_at_k(votes, 1) == 0.5  # four groups of one: T F F T
    assert maj_at_k(votes, 2) == 0.5  # [7 3] -> 7 (first), [3 7] -> 3
    assert maj_at_k(votes, 4) == 1.0  # 2-2 tie, 7 seen first
    assert maj_at_k([right, wrong, wrong], 2) == 1.0  # one group of two; the third sample left over
    with pytest.raises(ValueError):
        maj_at_k(votes, 5)


def test_k_values_and_problem_means() -> None:
    assert k_values(16) == (1, 2, 4, 8, 16) and k_values(3) == (1, 2, 3) and k_values(2) == (1, 2)
    problems = [[("1", True), ("2", False), ("2", False), ("2", False)], [("5", True)] * 4]
    metrics = sampled_metrics(problems)
    assert metrics["pass@1"] == pytest.approx((0.25 + 1.0) / 2)  # pass@1 is the mean accuracy of all samples
    assert metrics["pass@4"] == 1.0 and metrics["maj@4"] == 0.5 and metrics["pass@2"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="same positive number"):
        sampled_metrics([[("1", True)], [("1", True), ("1", True)]])
    rows = [{"doc_id": f"{d}#r{r}", "extracted": str(r), "correct": r == 0} for d in ("a#r1", "b") for r in (0, 1)]
    assert votes_by_problem(rows) == {"a#r1": [("0", True), ("1", False)], "b": [("0", True), ("1", False)]}


# ------------------------------------------------------------------------------------------------ protocols
def test_sampled_protocols_are_named_built_and_checked() -> None:
    proto = get_protocol("tiny-n8-t0.7")
    assert (proto.temperature, proto.repeats, proto.pass_at_k) == (0.7, 8, True)
    assert proto == sampled_protocol("tiny", 8, 0.7) and proto.block_length == get_protocol("tiny").block_length
    for bad, message in [
        ("tiny-n8-t0.70", "write it 'tiny-n8-t0.7'"),
        ("tiny-n1-t1", "at least 2 samples"),
        ("tiny-n4-t0", "temperature"),
        ("tracerl-dynamic-n4-t1", "already repeats"),
        ("nothing-n4-t1", "unknown evaluation protocol 'nothing'"),
    ]:
        with pytest.raises(UserError, match=message):
            get_protocol(bad)


# --------------------------------------------------------------------------------------- native and verify
def test_native_sampled_evaluation_records_pass_at_k_that_verify_recomputes(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    save_diffusion_lm(build_tiny(seed=1, **SMALL), checkpoint)
    recorded = _evaluate(tmp_path / "results", checkpoint, protocol="tiny-n4-t1", limit=3)
    (record,) = load_results(tmp_path / "results")
    samples = [json.loads(line) for line in recorded.path.with_name(record["samples_file"]).read_text().splitlines()]
    assert [s["doc_id"].rsplit("#", 1)[1] for s in samples[:4]] == ["r0", "r1", "r2", "r3"]
    assert record["settings"]["temperature"] == 1.0 and record["settings"]["protocol"]["pass_at_k"] is True
    assert len({s["completion"] for s in samples[:4]}) > 1  # sampled: the four decodes of a problem differ
    by_problem = [samples[i : i + 4] for i in range(0, 12, 4)]
    for k in (1, 2, 4):  # independent of the estimator module: enumerate the k-subsets of each problem
        expected = sum(enumerated_pass_at_k([s["correct"] for s in rows], k) for rows in by_problem) / 3
        assert record["metrics"][f"pass@{k}"] == pytest.approx(expected, abs=1e-12)
    assert {f"maj@{k}" for k in (1, 2, 4)} <= set(record["metrics"])
    assert verify_record(recorded.path)[0] == []
    # a forged pass@k (samples left alone) and a k the samples cannot give are caught
    original = recorded.path.read_text()
    forged = json.loads(original)
    forged["metrics"]["pass@4"] = 1.0 - forged["metrics"]["pass@4"] + 1e-3
    recorded.path.write_text(json.dumps(forged))
    assert any("metrics.pass@4" in p for p in verify_record(recorded.path)[0])
    forged["metrics"] = {**record["metrics"], "pass@3": 0.5}  # a k this evaluator never reports for 4 decodes
    recorded.path.write_text(json.dumps(forged))
    assert any("pass@3 is not one the samples give" in p for p in verify_record(recorded.path)[0])
    forged["metrics"] = {**record["metrics"], "pass@8": 0.5}  # more than the decodes: refused on loading
    recorded.path.write_text(json.dumps(forged))
    assert any("needs 8+ decodes per problem" in p for p in verify_record(recorded.path)[0])
    recorded.path.write_text(original)

    def mark_all_correct(rows):  # flags that disagree with the grader
        for row in rows:
            row["correct"] = True

    _rewrite(recorded.path, mark_all_correct)
    assert verify_record(recorded.path)[0]


def test_records_refuse_bad_sampled_metrics(tmp_path: Path) -> None:
    path = store(tmp_path, [True, False])
    record = json.loads(path.read_text())
    samples = [json.loads(line) for line in path.with_name(record["samples_file"]).read_text().splitlines()]
    record["settings"]["protocol"] = {"repeats": 2}  # two decodes of one problem
    for metrics, message in [
        ({"pass@2": 1.5}, "fraction"),
        ({"pass@0": 0.5}, "unknown metric"),
        ({"top@2": 0.5}, "unknown metric"),
        ({"maj@4": 0.5}, r"needs 4\+ decodes per problem; settings.protocol.repeats is 2"),
    ]:
        bad = {k: v for k, v in record.items() if k not in ("schema", "created", "samples_file", "samples_sha256")}
        bad["metrics"] = {**record["metrics"], **metrics}
        with pytest.raises(UserError, match=message):
            write_result(tmp_path / "other", bad, samples)
    bad["metrics"] = {**record["metrics"], "pass@2": 0.5, "maj@1": 0.5}
    write_result(tmp_path / "other", bad, samples)  # the same record with valid sampled metrics is written


# ------------------------------------------------------------------------------------------------ lm-eval
def test_lm_eval_pass16_tasks_load_and_score_like_the_native_estimators() -> None:
    manager = TaskManager(include_path=str(LMEVAL_DIR), include_defaults=False)
    names = [f"{task}_pass16" for task in TASKS]
    assert sorted(manager.load(["dllm_pass16"])["tasks"]) == sorted(names)
    loaded = manager.load(["dllm_sudoku_pass16"])["tasks"]["dllm_sudoku_pass16"]
    assert loaded.config.repeats == 16 and loaded.config.metadata["protocol"] == "d1"
    from stabledrl_bench.tasks.lmeval.utils import process_results

    doc = get_task("countdown").eval_docs(limit=1)[0]
    gold = get_task("countdown").target_completion(doc, "d1")
    decodes = [gold] * 3 + ["<answer>1+1</answer>"] * 13
    metrics = process_results(doc, [decodes])
    grades = get_task("countdown").grade_many(decodes, [doc] * 16)
    assert metrics == {"acc": 3 / 16} | sampled_metrics([[(g.extracted, g.correct) for g in grades]])
    assert metrics["pass@16"] == 1.0 and metrics["pass@1"] == 3 / 16


class GoldTimesLM(lm_eval.api.model.LM):
    """Answers the first decode of every request with the gold completion, the rest with a wrong one."""

    def generate_until(self, requests):
        seen: set[int] = set()
        out = []
        for r in requests:
            first = id(r) not in seen
            seen.add(id(r))
            out.append(get_task(r.doc["task"]).target_completion(r.doc, "d1") if first else "<answer>0</answer>")
        return out

    def loglikelihood(self, requests):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError


def test_lm_eval_pass16_end_to_end_and_the_adapter_checks_repeats() -> None:
    manager = TaskManager(include_path=str(LMEVAL_DIR), include_defaults=False)
    results = lm_eval.simple_evaluate(model=GoldTimesLM(), tasks=["dllm_sudoku_pass16"], limit=2, task_manager=manager)
    metrics = {k.split(",")[0]: v for k, v in results["results"]["dllm_sudoku_pass16"].items() if "stderr" not in k}
    assert metrics["pass@16"] == 1.0 and metrics["pass@1"] == pytest.approx(1 / 16) and metrics["maj@16"] == 0.0
    model = DiffusionEvalLM(pretrained=build_tiny(seed=0, **SMALL), protocol="tiny-n8-t1", max_completion_length=8)
    request = argparse.Namespace(args=("prompt", {"until": []}), repeats=16)
    with pytest.raises(UserError, match="decodes 8 times per problem, but the task repeats its requests 16 times"):
        model.generate_until([request])


# ---------------------------------------------------------------------------------------------- reproduce
def test_reproduce_pass_k_adds_one_sampled_protocol_per_preset_protocol() -> None:
    def names(run) -> list[tuple[str, list[int]]]:
        return [(protocol.name, list(lengths)) for protocol, lengths in run.evaluations()]

    assert names(comparison("table1", preset="tiny")) == [("tiny", [128, 256, 512])]
    run = comparison("table1", preset="tiny", pass_k=8, temperature=0.9, pass_k_lengths="128")
    assert names(run) == [("tiny", [128, 256, 512]), ("tiny-n8-t0.9", [128])]
    assert run.evaluations()[1][1] == {128: presets("table1")["tiny"].lengths[128]}
    table2 = comparison("table2", preset="tiny", pass_k=4)
    static, dynamic = presets("table2")["tiny"].protocols
    assert names(table2) == [
        (static, [2000]),
        (dynamic, [2000]),
        (f"{static}-n4-t1", [2000]),
        (f"{dynamic}-n4-t1", [2000]),
    ]
    assert [p.sampling for p, _ in table2.evaluations()] == ["static", "dynamic", "static", "dynamic"]
    for options, message in [({"pass_k_lengths": "100"}, "unknown length"), ({"pass_k": 1}, "at least 2 samples")]:
        with pytest.raises(UserError, match=message):
            comparison("table1", preset="tiny", **{"pass_k": 8, **options})


# -------------------------------------------------------------------------------------------- leaderboard
SAMPLED_SETTINGS = {
    "max_completion_length": 32,
    "steps": 16,
    "block_length": 8,
    "temperature": 1.0,
    "protocol": {"attention": "full", "pass_at_k": True, "repeats": 2},
}


def store_sampled(results_dir: Path, baseline: str, per_problem: list[list[bool]], **extra) -> None:
    """A ``d1-n2-t1`` record: ``per_problem[i]`` holds problem i's two decodes."""
    flags = [flag for flags in per_problem for flag in flags]
    path = store(results_dir, flags, baseline=baseline, protocol="d1-n2-t1", settings=SAMPLED_SETTINGS, **extra)
    record = json.loads(path.read_text())
    samples_path = path.with_name(record["samples_file"])
    rows = [json.loads(line) for line in samples_path.read_text().splitlines()]
    for i, row in enumerate(rows):  # problem i // 2, decode i % 2
        row["doc_id"] = f"{i // 2}#r{i % 2}"
    record["metrics"] |= sampled_metrics(list(votes_by_problem(rows).values()))
    record = {k: v for k, v in record.items() if k not in ("schema", "created", "samples_file", "samples_sha256")}
    path.unlink()
    samples_path.unlink()
    write_result(results_dir, record, rows)


def test_sampled_records_get_their_own_block_change_table_and_plot(tmp_path: Path) -> None:
    store(tmp_path, [True, False], baseline="sft", budget=None)  # greedy rows stay in their table
    store_sampled(tmp_path, "sft", [[True, False], [False, False]], budget=None)
    store_sampled(tmp_path, "test_rl_a", [[True, True], [False, False]])
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED, plots_dir=tmp_path / "plots", markdown_dir=tmp_path)
    greedy = markdown[: markdown.index("SAMPLED DECODING")]
    assert "d1-n2-t1" not in greedy.split("**Measured by this code — comparison `cmp`**")[-1].split("\n\n")[1]
    block = markdown[markdown.index("SAMPLED DECODING") :]
    assert "| sft | start | tiny-dlm | d1-n2-t1 | 0 | 25.0 [0.0, 50.0] | 50.0 [0.0, 100.0] |" in block
    # test_rl_a: pass@1 = (1 + 0) / 2 = 50, pass@2 = 50, maj@2 = 50; change from sft, paired by problem
    assert "| test_rl_a | final | +25.0" in block and "GSM8K 128 pass@2" in block
    assert (tmp_path / "plots" / "table1__cmp__passk.png").stat().st_size > 1000
    # over runs: one seed, so no verdict; the pass@1 change per problem is +50 and 0
    runs = block[block.index("**Change from the start over runs**") :]
    assert "| test_rl_a | final | 1 | +25.0 [+0.0, +50.0] not resolved |" in runs
    assert "0 of the 3 comparisons above are resolved" in runs


def test_sampled_changes_over_runs_resample_the_seeds(tmp_path: Path) -> None:
    """Two seeds, each raising pass@1 from 0 to 1 on both problems: above the start over runs, and said so."""
    for seed in (0, 1):
        store_sampled(tmp_path, "sft", [[False, False]] * 2, budget=None, seed=seed)
        store_sampled(tmp_path, "test_rl_a", [[True, True]] * 2, seed=seed)
    markdown = build_leaderboard(tmp_path, NO_PUBLISHED)
    assert "| test_rl_a | final | 2 | +100.0 [+100.0, +100.0] above |" in markdown
    assert "test_rl_a is above its start in GSM8K 128 pass@1: +100.0 [+100.0, +100.0] points over 2 runs" in markdown
