"""Integrity: results carry the hash of the weights they measured, are reused only for the same weights and
settings, and ``verify`` catches records that do not add up (forged flags, swapped checkpoints, edited
completions, unknown commits)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from stabledrl_bench.cli import main
from stabledrl_bench.core.models import build_tiny, load_diffusion_lm, save_diffusion_lm
from stabledrl_bench.evaluation.native import evaluate_and_record, model_record, weights_sha256
from stabledrl_bench.evaluation.verify import verify_record

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def _evaluate(results: Path, checkpoint: Path, *, limit: int = 4, force: bool = False, protocol: str = "tiny"):
    dlm = load_diffusion_lm(checkpoint)
    key = {
        "comparison": "verify",
        "table": "table1",
        "preset": "tiny",
        "baseline": "sft",
        "task": "sudoku",
        "length": 128,
        "sampling": None,
        "protocol": protocol,
        "seed": 0,
        "model": model_record(dlm, str(checkpoint)),
    }
    return evaluate_and_record(
        dlm,
        results_dir=results,
        key=key,
        max_completion_length=8,
        budget=None,
        limit=limit,
        skip_existing=not force,
        progress=False,
    )


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt"
    save_diffusion_lm(build_tiny(seed=1, **SMALL), path)
    return path


def test_weights_hash_follows_the_bytes_not_the_path() -> None:
    a, b = build_tiny(seed=1, **SMALL).model, build_tiny(seed=1, **SMALL).model
    assert weights_sha256(a) == weights_sha256(b)
    with torch.no_grad():
        b.lm_head.weight[0, 0] += 1e-6
    assert weights_sha256(a) != weights_sha256(b)
    assert weights_sha256(a) != weights_sha256(build_tiny(seed=1, **SMALL).model.double())


def test_results_are_reused_only_for_the_same_weights_and_settings(tmp_path: Path, checkpoint: Path) -> None:
    first = _evaluate(tmp_path / "results", checkpoint)
    assert not first.reused and first.note == "no stored result"
    again = _evaluate(tmp_path / "results", checkpoint)
    assert again.reused and again.path == first.path
    assert not _evaluate(tmp_path / "results", checkpoint, limit=3).reused  # other number of samples
    # A fresh clone retrains the same path with other weights: measured again, not reused.
    save_diffusion_lm(build_tiny(seed=2, **SMALL), checkpoint)
    other = _evaluate(tmp_path / "results", checkpoint, limit=3)
    assert not other.reused and other.note == "the stored result measured other weights"
    record = json.loads(other.path.read_text())
    assert record["model"]["weights_sha256"] == weights_sha256(load_diffusion_lm(checkpoint).model)
    assert not _evaluate(tmp_path / "results", checkpoint, limit=3, force=True).reused


def test_results_record_their_decoding_mode_and_older_records_stay_reusable(tmp_path: Path, checkpoint: Path):
    fast = _evaluate(tmp_path / "results", checkpoint, protocol="tiny-fast")
    settings = json.loads(fast.path.read_text())["settings"]
    assert (settings["cache"], settings["strategy"], settings["stop_at_eos"]) == ("dual", "dynamic", True)
    assert settings["protocol"]["cache"] == "dual" and settings["protocol"]["name"] == "tiny-fast"
    exact = _evaluate(tmp_path / "results", checkpoint)
    settings = json.loads(exact.path.read_text())["settings"]
    assert (settings["cache"], settings["strategy"], settings["stop_at_eos"]) == ("none", "static", False)
    # a record written before the decoding modes existed (no such fields) means exact decoding: reused
    record = json.loads(exact.path.read_text())
    del record["settings"]["cache"], record["settings"]["protocol"]["cache"]
    del record["settings"]["protocol"]["stop_at_eos"]
    record["settings"]["gen_length"] = record["settings"].pop("max_completion_length")  # the name it had then
    exact.path.write_text(json.dumps(record))
    assert _evaluate(tmp_path / "results", checkpoint).reused
    assert verify_record(exact.path, redecode=2)[0] == []
    # the approximate decode is reproducible from its record: re-decoding gives the stored completions
    assert verify_record(fast.path, redecode=2)[0] == []


def _rewrite(path: Path, edit) -> None:
    """Edit a record's samples and make the sha256, accuracy and score mean agree again (a careful forger)."""
    record = json.loads(path.read_text())
    samples_path = path.with_name(record["samples_file"])
    samples = [json.loads(line) for line in samples_path.read_text().splitlines()]
    edit(samples)
    text = "".join(json.dumps(s) + "\n" for s in samples)
    samples_path.write_text(text)
    record["samples_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    record["metrics"]["accuracy"] = sum(s["correct"] for s in samples) / len(samples)
    path.write_text(json.dumps(record))


def test_verify_passes_a_genuine_record_and_catches_forgeries(tmp_path: Path, checkpoint: Path, capsys) -> None:
    path = _evaluate(tmp_path / "results", checkpoint).path
    assert verify_record(path, redecode=4) == ([], [])
    assert main(["verify", "--results", str(tmp_path / "results"), "--redecode", "2"]) == 0
    assert "all 1 result records add up" in capsys.readouterr().out

    def flip_first(samples):
        samples[0]["correct"] = not samples[0]["correct"]

    _rewrite(path, flip_first)
    problems, _ = verify_record(path)
    assert any("grader says" in p for p in problems)
    assert main(["verify", "--results", str(tmp_path / "results")]) == 2
    assert "1 of 1 result records do not add up" in capsys.readouterr().err


def test_verify_catches_edited_completions_swapped_weights_and_unknown_commits(tmp_path: Path, checkpoint: Path):
    path = _evaluate(tmp_path / "results", checkpoint).path

    def edit_completion(samples):
        samples[0]["completion"] += " "  # graded the same: only decoding again can tell

    _rewrite(path, edit_completion)
    assert verify_record(path, weights=False) == ([], [])
    problems, _ = verify_record(path, redecode=1)
    assert len(problems) == 1 and problems[0].endswith(": re-decoding gives another completion")

    record = json.loads(path.read_text())
    record["environment"]["git"] = {"commit": "0" * 40, "dirty": False}
    path.write_text(json.dumps(record))
    assert verify_record(path, weights=False)[0] == ["recorded commit 000000000000 is not in this repository"]

    save_diffusion_lm(build_tiny(seed=2, **SMALL), checkpoint)
    assert any("holds other weights" in p for p in verify_record(path)[0])
    (checkpoint / "model.safetensors").unlink()
    assert any("cannot load the model" in p for p in verify_record(path)[0])
    checkpoint.rename(tmp_path / "elsewhere")
    assert verify_record(path)[1] == [f"checkpoint {checkpoint} is not here: weights not checked"]
