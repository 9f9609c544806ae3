"""The ``sensitivity`` command: which variants a protocol gets, how a change is paired by item, and the command end
to end on a small tiny model (scores of a random model are near 0; what is checked is the bookkeeping)."""

from __future__ import annotations

import json
import math

import pytest
from conftest import SMALL

from stabledrl_bench.cli import main
from stabledrl_bench.core.models import build_tiny, save_diffusion_lm
from stabledrl_bench.evaluation.native import evaluate
from stabledrl_bench.evaluation.protocols import get_protocol
from stabledrl_bench.evaluation.sensitivity import (
    EOSER_MIN_GAMMA,
    item_values,
    other_verdict,
    paired_change,
    run_sensitivity,
    variants,
)


def test_the_tiny_protocol_gets_one_variant_per_choice_it_can_change() -> None:
    # tiny: full attention, block 8, 2 tokens per step, greedy, static, chat template, no prefill; canvas 48
    names = [v.name for v in variants(get_protocol("tiny"), 48, temperature=0.7)]
    assert names == [
        "block 4",
        "block 16",
        "random remasking",
        "eos stop",
        "eos early rejection",
        "parallel decoding (Fast-dLLM)",
        "4 token(s) per step",
        "1 token(s) per step",
        "temperature 0.7",
        "no chat template",
    ]
    # the EOS confidence rule is a decode setting: CJ-GRPO's EOSER from the authors' factor 0.01
    (eoser,) = [v for v in variants(get_protocol("tiny"), 48, temperature=0.7) if v.name == "eos early rejection"]
    assert eoser.choice == "EOS handling" and eoser.decode == {"eos_min_gamma": EOSER_MIN_GAMMA} == {
        "eos_min_gamma": 0.01
    }
    # a block beyond the canvas is not offered (d1's 32 doubled on 48 tokens); d1 has a prefill to drop
    names = [v.name for v in variants(get_protocol("d1"), 48, temperature=0.7)]
    assert "block 16" in names and "block 64" not in names and "no prefill" in names
    # a block-diffusion protocol decodes in the model's blocks; its sampled base gets a greedy variant
    names = [v.name for v in variants(get_protocol("tracerl-dynamic"), 64, temperature=0.7)]
    assert names == ["2 token(s) per step", "greedy", "no chat template"]


def test_a_change_is_paired_by_item_and_averages_an_items_decodes() -> None:
    rows = [
        {"doc_id": "a#r0", "correct": True},
        {"doc_id": "a#r1", "correct": False},
        {"doc_id": "b#r0", "correct": True},
        {"doc_id": "b#r1", "correct": True},
    ]
    assert item_values(rows, lambda s: float(s["correct"])) == {"a": 0.5, "b": 1.0}
    # base a 1, b 0, c 1, d 1; variant (another order) a 1, b 1, c 0, d 1: differences 0, +1, -1, 0
    change, changed = paired_change({"a": 1, "b": 0, "c": 1, "d": 1}, {"d": 1, "c": 0, "b": 1, "a": 1})
    assert change.mean == 0.0 and changed == 2 and change.low < 0 < change.high
    with pytest.raises(ValueError, match="different items"):
        paired_change({"a": 1.0}, {"b": 1.0})


def test_the_second_verdict_is_the_tasks_other_grader() -> None:
    sudoku = [{"doc_id": "0", "correct": False, "score": 0.75, "details": {}}]
    label, read = other_verdict("sudoku", sudoku)
    assert label.startswith("exact answer") and read(sudoku[0]) == 0.0
    math_rows = [{"doc_id": "0", "correct": True, "score": 1.0, "details": {"d1": False}}]
    label, read = other_verdict("gsm8k", math_rows)
    assert label == "d1's answer parser" and read(math_rows[0]) == 0.0
    assert other_verdict("countdown", [{"doc_id": "0", "correct": True, "score": 1.0, "details": {}}]) is None


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("small-sensitivity")
    save_diffusion_lm(build_tiny(**SMALL), path)
    return path


def test_every_variant_decodes_the_same_items_and_records_its_change(small_model, one_thread) -> None:
    from stabledrl_bench.core.models import load_diffusion_lm

    dlm = load_diffusion_lm(small_model)
    proto = get_protocol("tiny")
    scores, refused = run_sensitivity(dlm, "sudoku", proto, canvas=16, limit=4, progress=False)
    assert refused == []
    base = evaluate(dlm, "sudoku", protocol=proto, max_completion_length=16, limit=4, progress=False)
    assert scores[0].variant.choice == "base" and scores[0].change is None
    assert math.isclose(scores[0].score, base.metrics["d1_accuracy"])  # Sudoku's cell: the partial-credit score
    by_name = {entry.variant.name: entry for entry in scores}
    assert by_name["random remasking"].settings["remasking"] == "random"  # recorded as decoded
    eoser = by_name["eos early rejection"].settings
    assert eoser["eos_min_gamma"] == 0.01 and "eos_max_gamma" not in eoser  # the rule's own field, only when set
    assert by_name["block 4"].settings["block_length"] == 4 and by_name["block 16"].settings["block_length"] == 16
    assert all(math.isclose(e.score - scores[0].score, e.change.mean, abs_tol=1e-12) for e in scores[1:])
    assert all(0 <= e.items_changed <= 4 for e in scores[1:])


def test_the_command_prints_writes_and_checks_the_records_weights(small_model, tmp_path, capsys) -> None:
    out = tmp_path / "report"
    argv = ["sensitivity", "--model", str(small_model), "--task", "sudoku", "--protocol", "tiny", "--length", "16"]
    assert main([*argv, "--limit", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| base | tiny (base) |" in printed and "| remasking rule | random remasking |" in printed
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["canvas"] == 16 and report["variants"][0]["change"] is None
    assert out.with_suffix(".md").read_text() in printed
    # a record whose weights are not the model's is refused in one line
    record = tmp_path / "record.json"
    evaluated = tmp_path / "results"
    assert main(["eval", "--model", "tiny", "--task", "sudoku", "--protocol", "tiny", "--length", "128",
                 "--max-completion-length", "16", "--limit", "2", "--results", str(evaluated)]) == 0  # fmt: skip
    record.write_text(next(evaluated.rglob("*.json")).read_text())
    capsys.readouterr()
    assert main(["sensitivity", "--record", str(record), "--model", str(small_model), "--limit", "2"]) == 2
    assert "does not hold the weights record" in capsys.readouterr().err
