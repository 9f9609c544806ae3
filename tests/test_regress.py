"""``regress``: the committed golden references hold, and every kind of numeric change makes it fail by name.

The mutation tests pin a few cases into a temporary folder from the unmutated code (in this process, one thread),
then change one thing -- a loss by a relative 1e-6, an estimator's mask draw, the sampler's unmasking order, the
optimizer step, a grader's verdict -- and check that ``regress`` exits 1 naming the case, the step and the field.
The comparison rules across platforms are tested on hand-made references.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conftest import install_plugin

from stabledrl_bench.cli import main
from stabledrl_bench.core.baseline import BASELINES
from stabledrl_bench.regression.cases import GROUPS, all_cases
from stabledrl_bench.regression.command import compare, report, run_cases
from stabledrl_bench.regression.golden import (
    REFERENCES,
    Observation,
    Row,
    compare_case,
    platform_info,
    same_platform,
    write_references,
)

# the shipped methods; other test modules register stand-ins into the same registry when they are collected
BUILT_IN = [name for name in BASELINES if BASELINES.get(name).__module__.startswith("stabledrl_bench.")]


def regress(*args: str) -> int:
    return main(["regress", "--jobs", "1", *args])


def failing_rows(capsys) -> list[list[str]]:
    """The table rows printed with a failing verdict, split into their columns."""
    out = capsys.readouterr().out
    return [line.split() for line in out.splitlines() if line.rstrip().endswith(("FAIL", "missing", "error"))]


# ------------------------------------------------------------------------------------------------ committed references
@pytest.fixture(scope="module")
def measured() -> dict[str, Observation]:
    """Every golden case of the shipped code, run once in this process (one thread, as ``regress --jobs 1``): the
    committed check compares all of them, and the mutation tests pin a few of them as their own references. (The
    stand-ins other test modules register into the same registry have no committed references: left out.)"""
    cases = [case for case in all_cases() if case.params.get("baseline") in (None, *BUILT_IN)]
    return run_cases(cases, jobs=1, progress=False)


def test_the_committed_references_hold(measured, capsys) -> None:
    """The whole check, as ``regress`` runs it without a selection: every case agrees with its committed reference,
    and no committed reference is left without its case."""
    status = report(compare(REFERENCES, measured, filtered=False), verbose=False, references=REFERENCES)
    out = capsys.readouterr().out
    assert status == 0, out[-6000:]
    assert f"regress: {len(measured)} of {len(measured)} cases agree" in out
    assert {path.parent.name for path in REFERENCES.glob("*/*.json")} == set(GROUPS)


# ------------------------------------------------------------------------------------------------ mutations
@pytest.fixture(scope="module")
def pinned(measured, tmp_path_factory) -> Path:
    """The cases the mutations touch, pinned from the unmutated code's measurements, as ``regress --update`` pins
    them."""
    root = tmp_path_factory.mktemp("references")
    kept = {
        key: values
        for key, values in measured.items()
        if key.split("/")[0] in ("forced", "samplers", "sft") or key.startswith(("rl/grpo@", "rl/grpo+"))
    }
    write_references(root, kept, {}, "unmutated")
    return root


def test_an_unchanged_code_passes_its_own_references(pinned, capsys) -> None:
    assert regress("--references", str(pinned), "--groups", "samplers") == 0
    assert not failing_rows(capsys)


@pytest.mark.parametrize("baseline", BUILT_IN)
def test_a_loss_changed_by_one_part_in_a_million_fails_by_name(baseline, pinned, monkeypatch, capsys) -> None:
    cls = BASELINES.get(baseline)
    loss = cls.loss

    def mutated(self, inputs):
        value, metrics = loss(self, inputs)
        return value * (1 + 1e-6), metrics

    monkeypatch.setattr(cls, "loss", mutated)
    assert regress("--references", str(pinned), "--baselines", baseline, "--groups", "forced") == 1
    rows = failing_rows(capsys)
    assert [f"forced/{baseline}@full", "loss", "loss"] in [row[:3] for row in rows], rows


def test_a_mutated_loss_fails_an_rl_run_at_its_step(pinned, monkeypatch, capsys) -> None:
    cls = BASELINES.get("grpo")
    loss = cls.loss
    monkeypatch.setattr(cls, "loss", lambda self, inputs: (lambda v, m: (v * (1 + 1e-6), m))(*loss(self, inputs)))
    assert regress("--references", str(pinned), "--baselines", "grpo", "--groups", "rl") == 1
    rows = [row for row in failing_rows(capsys) if row[0] == "rl/grpo@tiny-full"]
    assert rows and rows[0][1:3] == ["step", "1"], rows  # "step 1" is where the change first shows


def test_a_changed_mask_draw_fails_every_estimator_that_draws(pinned, monkeypatch, capsys) -> None:
    from stabledrl_bench.core import estimators

    uniform = estimators._uniform
    monkeypatch.setattr(estimators, "_uniform", lambda gen, shape, device: 1.0 - uniform(gen, shape, device))
    assert regress("--references", str(pinned), "--groups", "forced") == 1
    failed = {row[0] for row in failing_rows(capsys)}
    assert {"forced/estimator:spg_block@full", "forced/estimator:espo_elbo@full", "forced/spg@full"} <= failed


def test_a_changed_unmasking_order_fails_the_samplers(pinned, monkeypatch, capsys) -> None:
    from stabledrl_bench.core import sampling

    top = sampling._top_by_confidence
    monkeypatch.setattr(sampling, "_top_by_confidence", lambda confidence, count: top(-confidence, count))
    assert regress("--references", str(pinned), "--groups", "samplers") == 1
    rows = failing_rows(capsys)
    assert ["samplers/exact-greedy@full", "decode", "tokens"] in [row[:3] for row in rows], rows
    assert any(row[:3] == ["samplers/cached-greedy@block", "decode", "unmask_order"] for row in rows), rows


def test_a_changed_optimizer_step_fails_sft_and_rl(pinned, monkeypatch, capsys) -> None:
    """AdamW's eps from 1e-8 to 1e-4: comparable to the smaller gradient entries, so the first update of many weights
    changes by a visible fraction and the second step's loss moves on every platform. (eps x 1.01 moved it by less
    than one float32 rounding step on some CPUs: whether it showed depended on the platform's kernels.)"""
    from stabledrl_bench.training import optim

    build = optim.build_optimizer

    def mutated(model, cfg):
        optimizer = build(model, cfg)
        for group in optimizer.param_groups:
            group["eps"] *= 1e4
        return optimizer

    for module in ("stabledrl_bench.training.sft", "stabledrl_bench.training.assembly"):
        monkeypatch.setattr(f"{module}.build_optimizer", mutated)
    # the two cases it is about (`--cases`): the other warm starts would show the same
    assert regress("--references", str(pinned), "--cases", "sft/full,sft/warm-start:table1-sudoku") == 1
    rows = failing_rows(capsys)
    assert {row[0] for row in rows} == {"sft/full", "sft/warm-start:table1-sudoku"}, rows
    assert ["sft/full", "step", "2", "loss"] in [row[:4] for row in rows], rows
    assert ["sft/warm-start:table1-sudoku", "step", "2", "loss"] in [row[:4] for row in rows], rows
    for row in rows:  # the move is far beyond rounding: a platform's kernels cannot hide it
        if row[:4] == ["sft/full", "step", "2", "loss"]:
            assert abs(float(row[4]) - float(row[5])) > 1e-5 * abs(float(row[4])), row
    assert regress("--references", str(pinned), "--cases", "rl/grpo@tiny-full") == 1
    # the first optimizer step moves the weights, so the second step's numbers differ
    assert any(row[0] == "rl/grpo@tiny-full" and row[1:3] == ["step", "2"] for row in failing_rows(capsys))


def test_a_changed_warm_start_recipe_fails_its_cases_only(pinned, monkeypatch, capsys) -> None:
    """The tiny preset's own warm start is pinned from its first step: a recipe change (here one puzzle fewer per
    batch) fails each preset task's case, and the golden SFT cases, which start from committed weights, still pass."""
    from stabledrl_bench.experiments.presets import Preset

    task_sft = Preset.task_sft

    def mutated(self, task):
        config = task_sft(self, task)
        return None if config is None else dataclasses.replace(config, batch_size=config.batch_size - 1)

    monkeypatch.setattr(Preset, "task_sft", mutated)
    assert regress("--references", str(pinned), "--groups", "sft") == 1
    failing = {row[0] for row in failing_rows(capsys)}
    assert {case for case in failing if case.startswith("sft/warm-start:")} == {
        f"sft/warm-start:{case}"
        for case in (
            "table1-sudoku",
            "table1-countdown",
            "table1-countdown_large",
            "table1-sudoku_hard",
            "table1-code_io",
            "table2-sudoku",
        )
    }
    assert not failing & {"sft/full", "sft/block"}


def test_a_changed_grader_verdict_fails_the_graders(tmp_path, monkeypatch, capsys) -> None:
    from stabledrl_bench.tasks import sudoku

    assert regress("--update", "--reason", "unmutated", "--references", str(tmp_path), "--groups", "graders") == 0
    grade = sudoku.grade_sudoku

    def lenient(completion, puzzle, solution):
        result = grade(completion, puzzle, solution)
        return result if result.correct or not completion else dataclasses.replace(result, correct=True)

    monkeypatch.setattr(sudoku, "grade_sudoku", lenient)
    assert regress("--references", str(tmp_path), "--groups", "graders") == 1
    rows = failing_rows(capsys)
    assert ["graders/sudoku", "doc", "0", "wrong.correct", "False", "True"] in [row[:6] for row in rows], rows


# ------------------------------------------------------------------------------------------------ plugins, usage
PLUGIN = """
from stabledrl_bench.baselines.grpo import GRPO
from stabledrl_bench.core.baseline import register_baseline


@register_baseline("sdrl_test_pinned")
class Pinned(GRPO):
    description = "GRPO under another name, to pin"
"""


def test_a_plugin_method_is_pinned_with_one_command(plugin_dir, tmp_path, capsys) -> None:
    install_plugin(
        plugin_dir,
        "stabledrl_bench.baselines",
        "sdrl_test_pinned",
        "sdrl_test_plugin_pin",
        "sdrl_test_plugin_pin",
        PLUGIN,
    )
    refs = tmp_path / "ci-references"
    args = ("--references", str(refs), "--baselines", "sdrl_test_pinned", "--groups", "forced")
    assert regress(*args) == 1  # nothing pinned yet
    assert failing_rows(capsys)[0][:4] == ["forced/sdrl_test_pinned@full", "-", "-", "-"]
    assert regress(*args, "--update", "--reason", "first pin of my method") == 0
    capsys.readouterr()
    assert regress(*args) == 0
    history = [json.loads(line) for line in (refs / "updates.jsonl").read_text().splitlines()]
    assert history[-1]["reason"] == "first pin of my method" and history[-1]["platform"] == platform_info()


def test_usage_errors_are_one_line(tmp_path, capsys) -> None:
    for args, message in (
        (["--update"], "--update needs --reason"),
        (["--reason", "x"], "--reason goes with --update"),
        (["--groups", "nope"], "unknown regress group"),
        (["--baselines", "ppo"], "unknown baseline 'ppo'"),
        (["--invariance", "nope"], "unknown invariance class"),
        (["--groups", "sft", "--cases", "sft/full,rl/*"], "--cases: no case matches rl/* (`regress --list`)"),
    ):
        assert regress("--references", str(tmp_path), *args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


# ------------------------------------------------------------------------------------------------ comparison rules
def _reference(values: dict, **platform) -> dict:
    return {"platform": {**platform_info(), **platform}, "values": values}


def test_on_the_reference_platform_every_bit_counts() -> None:
    ref = _reference({"step 1": {"loss": 0.5, "grad.sha": "aa"}})
    assert same_platform(ref["platform"], platform_info())
    rows = compare_case("rl/x", ref, {"step 1": {"loss": 0.5000001, "grad.sha": "aa"}}, bitwise=True, rtol=None)
    assert [(r.where, r.field, r.verdict) for r in rows] == [("step 1", "loss", "FAIL")]
    assert (
        compare_case("rl/x", ref, {"step 1": {"loss": 0.5, "grad.sha": "aa"}}, bitwise=True, rtol=None)[0].verdict
        == "ok"
    )
    assert (
        compare_case("rl/x", ref, {"step 1": {"loss": -0.0 + 0.5, "grad.sha": "ab"}}, bitwise=True, rtol=None)[
            0
        ].verdict
        == "FAIL"
    )


def test_a_cpu_behind_the_same_generic_name_is_another_platform() -> None:
    here = platform_info()
    assert here["cpu_signature"]  # this machine has a /proc/cpuinfo
    assert not same_platform({**here, "cpu_signature": "family 6 model 1 stepping 1 flags 000000000000"}, here)
    older = {key: value for key, value in here.items() if key != "cpu_signature"}  # pinned before it was recorded
    assert same_platform(older, here) and same_platform(here, older)


def test_elsewhere_numbers_get_the_measured_tolerance_and_float_hashes_are_not_compared() -> None:
    ref = _reference({"loss": {"loss": 1.0, "grad.sum": 10.0, "grad.sha": "aa", "keep": "k1"}}, cpu="another cpu")
    assert not same_platform(ref["platform"], platform_info())
    close = {"loss": {"loss": 1.0 + 5e-7, "grad.sum": 10.0 + 5e-6, "grad.sha": "bb", "keep": "k1"}}
    assert [r.verdict for r in compare_case("forced/x", ref, close, bitwise=False, rtol=1e-6)] == ["ok"]
    far = {"loss": {"loss": 1.0 + 5e-6, "grad.sum": 10.0, "grad.sha": "aa", "keep": "k2"}}
    rows = compare_case("forced/x", ref, far, bitwise=False, rtol=1e-6)
    assert sorted((r.field, r.verdict) for r in rows) == [("keep", "FAIL"), ("loss", "FAIL")]
    # no measured tolerance: numbers are not judged, integer hashes still are
    rows = compare_case("forced/x", ref, close, bitwise=False, rtol=None)
    assert {r.verdict for r in rows} == {"n/c"}


def test_elsewhere_a_sampled_run_is_compared_up_to_its_first_different_token() -> None:
    ref = _reference(
        {
            "step 1": {"tokens": "t1", "loss": 1.0},
            "step 2": {"tokens": "t2", "loss": 2.0},
            "final": {"weights.sum": 3.0},
        },
        cpu="another cpu",
    )
    same_start = {
        "step 1": {"tokens": "t1", "loss": 1.0},
        "step 2": {"tokens": "x", "loss": 9.0},
        "final": {"weights.sum": 7.0},
    }
    rows = compare_case("rl/x", ref, same_start, bitwise=False, rtol=1e-6)
    assert [(r.where, r.verdict) for r in rows] == [("step 2", "n/c")] and "sampled tokens differ" in rows[0].field
    wrong_start = {**same_start, "step 1": {"tokens": "t1", "loss": 1.5}}
    rows = compare_case("rl/x", ref, wrong_start, bitwise=False, rtol=1e-6)
    assert ("step 1", "loss", "FAIL") in [(r.where, r.field, r.verdict) for r in rows]
    assert (
        compare_case(
            "graders/x", _reference({"d": {"ok": True}}, cpu="x"), {"d": {"ok": False}}, bitwise=False, rtol=1
        )[0].verdict
        == "FAIL"
    )


def test_a_case_that_raises_or_has_no_reference_fails() -> None:
    assert compare_case("rl/x", None, {"a": {"b": 1}}, bitwise=True, rtol=None)[0].verdict == "missing"
    row = compare_case("rl/x", _reference({}), {"error": {"message": "ValueError: boom"}}, bitwise=True, rtol=None)[0]
    assert isinstance(row, Row) and row.failed and "boom" in row.now


# ------------------------------------------------------------------------------------------------ invariance
def test_the_cheap_invariance_classes_hold(capsys) -> None:
    threads = torch.get_num_threads()
    names = "gradient-checkpointing,estimator-chunking,padding,pad-free,resume,exact-cache,eval-batching"
    assert main(["regress", "--invariance", names]) == 0, capsys.readouterr().out[-3000:]
    assert torch.get_num_threads() == threads
    out = capsys.readouterr().out
    assert "7 of 7 classes hold" in out


# ------------------------------------------------------------------------------------------------ verify --rerun
def test_verify_rerun_remakes_a_record_and_names_what_differs(tmp_path, capsys) -> None:
    results, runs = tmp_path / "results", tmp_path / "runs"
    common = ["--preset", "smoke", "--tasks", "sudoku", "--seeds", "0", "--runs", str(runs), "--limit", "2"]
    common += ["--workers", "1"]  # in this process: worker processes would each import everything again
    assert (
        main(
            [
                "reproduce",
                "table1",
                *common,
                "--baselines",
                "grpo",
                "--results",
                str(results),
                "--leaderboard",
                str(tmp_path / "lb.md"),
            ]
        )
        == 0
    )
    record = next(results.rglob("*__grpo__sudoku__L128__*.json"))
    capsys.readouterr()
    assert main(["verify", "--rerun", str(record)]) == 0
    out = capsys.readouterr().out
    assert "weights:     identical" in out and "verify --rerun: reproduced bit for bit" in out
    # the platform that decides the bits, both sides: this CPU at the tiny model's one thread (reproduce's policy)
    here = f"({torch.backends.cpu.get_cpu_capability()}, 1 threads)"
    assert f"{here} recorded" in out and f"{here} now" in out
    # a forged completion, its samples hash made consistent: the rerun names it
    data = json.loads(record.read_text())
    samples = record.with_name(data["samples_file"])
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    rows[0]["completion"] = "<answer>1234123412341234</answer>"
    samples.write_text("".join(json.dumps(row) + "\n" for row in rows))
    import hashlib

    data["samples_sha256"] = hashlib.sha256(samples.read_bytes()).hexdigest()
    data["environment"]["hardware"]["threads"] += 1  # and made with another thread count
    record.write_text(json.dumps(data, indent=2))
    assert main(["verify", "--rerun", str(record), "--rerun-runs", str(runs)]) == 1
    out = capsys.readouterr().out
    assert f"completions: {len(rows) - 1} of {len(rows)} identical" in out and "NOT reproduced" in out
    assert "2 threads) recorded" in out
    assert "the record names another CPU or thread count" in out
