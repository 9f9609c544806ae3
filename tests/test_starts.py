"""Committed warm starts: saved with their settings and hashes, copied instead of trained where the settings match,
checked before every copy, trained where none matches."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import small_warm_start
from safetensors.torch import load_file

from stabledrl_bench.cli import main
from stabledrl_bench.core.models import load_diffusion_lm
from stabledrl_bench.errors import UserError
from stabledrl_bench.evaluation.native import weights_sha256
from stabledrl_bench.experiments import runner
from stabledrl_bench.experiments.runner import WARM_START_FILE, ensure_warm_start
from stabledrl_bench.experiments.starts import (
    START_FILE,
    committed_starts,
    file_sha256,
    find_start,
    save_start,
    start_name,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """A warm start trained in a comparison's run folder, then committed: (its run folder, the starts folder)."""
    root = tmp_path_factory.mktemp("committed")
    trained = root / "runs" / "table1-tiny" / "sudoku" / "s0" / "sft"
    ensure_warm_start(small_warm_start(), trained)
    assert start_name(trained) == "table1-tiny__sudoku__s0"
    with pytest.raises(UserError, match="not a warm start's run folder"):
        start_name(trained.parent.parent / "sft")  # runs/<comparison>/sudoku/sft: no seed folder
    save_start(trained, root / "starts")
    return trained, root / "starts"


def _no_training(monkeypatch) -> None:
    def refuse(spec, folder):
        raise AssertionError("a committed start was trained again")

    monkeypatch.setattr(runner, "_build_warm_start", refuse)


def test_a_saved_start_records_its_settings_machine_and_both_hashes(committed):
    trained, starts = committed
    folder = starts / "table1-tiny__sudoku__s0"
    record = json.loads((folder / START_FILE).read_text())
    built = json.loads((trained / WARM_START_FILE).read_text())
    assert record["spec"] == built["spec"] and record["spec_hash"] == small_warm_start().hash()
    assert record["file_sha256"] == file_sha256(trained / "final" / "model.safetensors")
    assert record["weights_sha256"] == weights_sha256(load_diffusion_lm(str(trained / "final")).model)
    assert record["sft_cpu_seconds"] > 0 and record["trained"]["hardware"]["cpu_count"] >= 1
    assert record["trained"]["hardware"]["capability"] == torch.backends.cpu.get_cpu_capability()
    assert (
        find_start(small_warm_start().hash(), starts) == folder
        and find_start(small_warm_start(steps=3).hash(), starts) is None
    )
    assert committed_starts(starts.parent / "absent") == {}  # e.g. installed from a wheel: every start is trained


def test_a_matching_start_is_copied_bit_for_bit_and_then_reused(committed, tmp_path, monkeypatch, capsys):
    trained, starts = committed
    _no_training(monkeypatch)
    final, info = ensure_warm_start(small_warm_start(), tmp_path / "sft", starts=starts)
    assert info["source"] == "committed" and info["copied_now"] and not info["built_now"]
    assert info["committed"] == str(starts / "table1-tiny__sudoku__s0")
    ours, theirs = load_file(final / "model.safetensors"), load_file(trained / "final" / "model.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert (final / "tokenizer.json").read_text() == (trained / "final" / "tokenizer.json").read_text()
    again, cached = ensure_warm_start(small_warm_start(), tmp_path / "sft", starts=starts)
    assert again == final and cached["source"] == "committed" and "copied_now" not in cached
    # a copy is not committed again: its record already names the start it came from
    with pytest.raises(UserError, match="is a copy of the committed start"):
        save_start(tmp_path / "sft", tmp_path / "elsewhere", "again")


def test_without_a_matching_start_or_with_none_asked_for_the_start_is_trained(committed, tmp_path):
    _, starts = committed
    _, other = ensure_warm_start(small_warm_start(steps=3), tmp_path / "other", starts=starts)
    assert other["built_now"] and other["source"] == "built"
    _, unasked = ensure_warm_start(small_warm_start(), tmp_path / "unasked", starts=None)  # --train-starts
    assert unasked["built_now"] and unasked["source"] == "built"


def test_a_damaged_start_is_one_error_line_and_never_copied(committed, tmp_path, monkeypatch):
    _, starts = committed
    _no_training(monkeypatch)
    damaged = tmp_path / "starts"
    shutil.copytree(starts, damaged)
    weights = damaged / "table1-tiny__sudoku__s0" / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"is not the committed start's .*--train-starts") as caught:
        ensure_warm_start(small_warm_start(), tmp_path / "sft", starts=damaged)
    assert "\n" not in str(caught.value) and not (tmp_path / "sft" / "final").exists()
    (damaged / "table1-tiny__sudoku__s0" / START_FILE).write_text('{"spec_hash": "x"}')
    with pytest.raises(UserError, match="not a committed start \\(no file_sha256\\)"):
        committed_starts(damaged)


def test_the_starts_command_lists_and_saves(committed, tmp_path, capsys):
    trained, starts = committed
    assert main(["starts", "--to", str(starts)]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith("table1-tiny__sudoku__s0") and f"settings {small_warm_start().hash()}" in listed
    assert "sudoku seed 0, 2 steps" in listed and "trained on " in listed and "not recorded" not in listed
    assert main(["starts", "save", str(trained), "--to", str(tmp_path / "new"), "--note", "made by a test"]) == 0
    assert (tmp_path / "new" / "table1-tiny__sudoku__s0" / "model" / "model.safetensors").is_file()
    assert main(["starts", "--to", str(tmp_path / "new")]) == 0
    assert "made by a test" in capsys.readouterr().out
    assert main(["starts", "save", str(tmp_path), "--to", str(tmp_path / "new")]) == 2
    assert "no finished warm start" in capsys.readouterr().err
