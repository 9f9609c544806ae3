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
    problems, notes = verify_record(path, redecode=2, redecode_seed=5)
    assert problems == [] and len(notes) == 1 and notes[0].startswith("re-decoded 2 samples drawn with seed 5: ")
    assert main(["verify", "--results", str(tmp_path / "results"), "--redecode", "2"]) == 0
    assert "all 1 result records and 0 stability records add up" in capsys.readouterr().out

    def flip_first(samples):
        samples[0]["correct"] = not samples[0]["correct"]

    _rewrite(path, flip_first)
    problems, _ = verify_record(path)
    assert any("grader says" in p for p in problems)
    assert main(["verify", "--results", str(tmp_path / "results")]) == 2
    assert "1 of 1 result records and 0 stability records do not add up" in capsys.readouterr().err


def test_verify_catches_edited_completions_swapped_weights_and_unknown_commits(tmp_path: Path, checkpoint: Path):
    path = _evaluate(tmp_path / "results", checkpoint).path

    def edit_completion(samples):
        samples[2]["completion"] += " "  # graded the same: only decoding again can tell

    _rewrite(path, edit_completion)
    assert verify_record(path, weights=False) == ([], [])
    # the items re-decoded are drawn at random (seeded and printed), so a forger cannot leave the first N alone
    drawn = {seed: verify_record(path, redecode=1, redecode_seed=seed) for seed in range(12)}
    caught = [seed for seed, (problems, _) in drawn.items() if problems]
    assert caught and len(caught) < len(drawn)
    problems, notes = drawn[caught[0]]
    assert len(problems) == 1 and problems[0].endswith(": re-decoding gives another completion")
    doc = problems[0].split(":")[0].removeprefix("sample ")
    assert notes[0].endswith(f"seed {caught[0]}: {doc}")  # which item was drawn is printed

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


def _copy(path: Path, edit, *, rename: bool) -> Path:
    """A copy of a record (and its samples) with ``edit`` applied to its fields; ``rename`` also gives the copy the
    file name its new fields imply, as a careful forger would."""
    from stabledrl_bench.reporting.naming import result_path

    record = json.loads(path.read_text())
    edit(record)
    target = result_path(path.parent.parent, record) if rename else path.with_name("copy.json")
    samples = path.with_name(record["samples_file"]).read_bytes()
    record["samples_file"] = target.name[: -len(".json")] + ".samples.jsonl"
    target.with_name(record["samples_file"]).write_bytes(samples)
    target.write_text(json.dumps(record))
    return target


def _as_grpo(record: dict) -> None:
    """The SFT start's record passed off as a GRPO run (with the budget an RL record must state)."""
    from stabledrl_bench.core.budget import paper_budget

    record.update(baseline="grpo", budget=paper_budget().to_dict(), budget_hash=paper_budget().hash())


def _as_seed_1(record: dict) -> None:
    """Seed 0's record passed off as seed 1 everywhere its fields and path say the seed."""
    record["seed"] = 1
    record["model"]["checkpoint"] = record["model"]["checkpoint"].replace("/s0/", "/s1/")


@pytest.mark.parametrize(
    ("edit", "rename", "problem"),
    [
        (lambda r: _as_grpo(r), False, "its file name is not the one its fields give"),
        (lambda r: r.update(seed=1), False, "its file name is not the one its fields give"),
        (lambda r: _as_grpo(r), True, "its checkpoint path names ['sft'], not baseline 'grpo'"),
        (lambda r: r.update(seed=1), True, "its checkpoint path names seed ['s0'], not s1"),
        (lambda r: _as_seed_1(r), True, "seed 1 has the very completions and weights of seed 0"),
    ],
    ids=["baseline", "seed", "baseline-renamed", "seed-renamed", "seed-copy"],
)
def test_a_relabelled_record_is_caught_and_kept_off_the_board(tmp_path: Path, edit, rename, problem, capsys) -> None:
    checkpoint = tmp_path / "runs" / "verify" / "sudoku" / "s0" / "sft" / "final"  # laid out as reproduce does
    save_diffusion_lm(build_tiny(seed=1, **SMALL), checkpoint)
    results = tmp_path / "results"
    original = _evaluate(results, checkpoint).path
    assert main(["verify", "--results", str(results), "--no-weights"]) == 0
    capsys.readouterr()
    copy = _copy(original, edit, rename=rename)
    assert main(["verify", "--results", str(results), "--no-weights"]) == 2
    out = capsys.readouterr().out
    assert f"FAIL {copy}" in out and problem in out
    assert main(["leaderboard", "--results", str(results), "--out", str(tmp_path / "lb.md")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "python -m stabledrl_bench verify lists every such record" in err[0]


def test_verify_re_decodes_by_default_and_names_what_it_only_checked_for_consistency(tmp_path, checkpoint, capsys):
    """A record whose completions were all replaced and regraded consistently (hashes, metrics) passes every check
    that reads only the record; with its checkpoint here, the default verify decodes a few random prompts again
    (seed drawn and printed) and fails it. ``--redecode 0`` is the cheap mode, and the summary says which records
    were only checked for consistency, also when their checkpoint is not here."""
    from stabledrl_bench.cli import build_parser
    from stabledrl_bench.evaluation.verify import DEFAULT_REDECODE

    path = _evaluate(tmp_path / "results", checkpoint).path
    name = path.relative_to(tmp_path / "results")

    def replace_every_completion(samples):
        for sample in samples:
            sample["completion"] += " "  # graded the same: only decoding again can tell

    _rewrite(path, replace_every_completion)
    assert main(["verify", "--results", str(tmp_path / "results")]) == 2
    captured = capsys.readouterr()
    seed = int(captured.out.split("seed ")[1].split(" ")[0])
    assert f"re-decoding {DEFAULT_REDECODE} random prompts per record, seed {seed}" in captured.out
    assert captured.out.count("re-decoding gives another completion") == DEFAULT_REDECODE
    assert captured.err.strip() == "error: verify: 1 of 1 result records and 0 stability records do not add up (above)"

    assert main(["verify", "--results", str(tmp_path / "results"), "--redecode", "0"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == (
        "verify: all 1 result records and 0 stability records add up; checked for consistency only "
        f"(not re-decoded): 1 (--redecode 0): {name}"
    )
    checkpoint.rename(tmp_path / "elsewhere")
    assert main(["verify", "--results", str(tmp_path / "results")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"1 whose checkpoint is not here: {name}")
    verify_help = build_parser()._subparsers._group_actions[0].choices["verify"].format_help()
    assert f"(default {DEFAULT_REDECODE}; 0: consistency checks only)" in " ".join(verify_help.split())


def test_verify_names_the_opt_in_when_a_checkpoint_ships_its_own_code(tmp_path, checkpoint, monkeypatch, capsys):
    """A record whose checkpoint folder ships Python code is not re-decoded without the user's opt-in, and the
    summary names the flag that gives it (``verify`` takes it, as every command that loads a model does)."""
    from stabledrl_bench.core.models import backends
    from stabledrl_bench.evaluation import verify

    name = _evaluate(tmp_path / "results", checkpoint).path.relative_to(tmp_path / "results")

    def refuse(source, **_):  # what the loader says for a folder with code it would have to run
        monkeypatch.setattr(backends, "_code_files", lambda _source: ["modeling_x.py"])
        backends._not_native(str(source), "config.json lacks n_layers", strict=False, trust=False)

    monkeypatch.setattr(verify, "load_model_spec", refuse)
    assert main(["verify", "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert "weights not checked" in out and "--trust-remote-code" in out
    assert out.splitlines()[-1].endswith(
        f"1 whose checkpoint ships its own code (--trust-remote-code lets verify load it): {name}"
    )
    assert main(["verify", "--results", str(tmp_path / "results"), "--trust-remote-code", "--no-such-option"]) == 2
    assert capsys.readouterr().err.strip() == "error: unrecognized arguments: --no-such-option"
