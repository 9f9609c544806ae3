"""Atomic writes: a failure part-way (interrupt, full disk, a bug in the writer) leaves the previous file or folder
or none, never a partial one a later command would take for finished work, and a storage failure is one line."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from stabledrl_bench import atomic
from stabledrl_bench.atomic import atomic_folder, atomic_stream, atomic_write_text
from stabledrl_bench.cli import main
from stabledrl_bench.core.models import build_tiny, load_diffusion_lm, save_diffusion_lm
from stabledrl_bench.errors import UserError
from stabledrl_bench.training.checkpoint import export_model
from stabledrl_bench.training.runlog import RunLog, read_log


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_atomic_write_leaves_no_temporary_files(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert _names(tmp_path) == ["out.txt"]
    assert target.stat().st_mode & 0o777 == 0o644


def test_interrupted_atomic_write_keeps_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.txt"
    atomic_write_text(target, "previous")

    def interrupted(descriptor: int) -> None:
        assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # the temporary file exists by now
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, "new")
    assert target.read_text() == "previous"
    assert _names(tmp_path) == ["out.txt"]


def test_a_full_disk_is_one_line_naming_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    message = r"cannot write .*out\.jsonl: No space left on device$"
    with pytest.raises(UserError, match=message), atomic_stream(tmp_path / "out.jsonl") as handle:
        handle.write("a line\n")
    assert _names(tmp_path) == []


def test_a_stream_that_fails_part_way_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bad row"), atomic_stream(tmp_path / "out.jsonl") as handle:
        handle.write("graded\n")
        raise ValueError("bad row")
    assert _names(tmp_path) == []


def test_a_folder_replaces_the_old_one_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with atomic_folder(target) as folder:
        (folder / "config.json").write_text("{}")
        (folder / "old-only.bin").write_text("x")
    with pytest.raises(KeyboardInterrupt), atomic_folder(target) as folder:
        (folder / "config.json").write_text('{"new": 1}')
        raise KeyboardInterrupt
    assert _names(target) == ["config.json", "old-only.bin"] and (target / "config.json").read_text() == "{}"
    with atomic_folder(target) as folder:
        (folder / "config.json").write_text('{"new": 2}')
    assert _names(target) == ["config.json"]  # nothing of the old folder survives beside the new files
    assert _names(tmp_path) == ["model"] and (target / "model").exists() is False
    assert target.stat().st_mode & 0o777 == 0o755


def test_a_model_save_killed_part_way_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed save once left ``config.json`` and no weights, and the warm-start cache took it for a model."""
    dlm = build_tiny(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)

    def killed(*args, **kwargs) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(dlm.tokenizer, "save_pretrained", killed)
        with pytest.raises(KeyboardInterrupt):
            save_diffusion_lm(dlm, tmp_path / "init")
        fake = SimpleNamespace(unwrap_model=lambda m: m, get_state_dict=lambda m: m.state_dict(), is_main_process=True)
        with pytest.raises(KeyboardInterrupt):
            export_model(fake, dlm.model, dlm, tmp_path / "final")
    assert _names(tmp_path) == []
    export_model(fake, dlm.model, dlm, tmp_path / "final")
    assert load_diffusion_lm(tmp_path / "final").model.config.hidden_size == 16


def test_resuming_a_log_rewrites_it_atomically(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = RunLog(path)
    for step in (1, 2, 3):
        log.write({"step": step})
    RunLog(path, resume_step=2)
    assert [r["step"] for r in read_log(path)] == [1, 2]
    assert _names(tmp_path) == ["log.jsonl"]


def test_grade_writes_no_half_graded_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"completion": "<answer>4</answer>", "answer": "4"}) + "\n" for _ in range(3)))
    out = tmp_path / "graded.jsonl"

    def full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    assert main(["grade", "--task", "gsm8k", "--input", str(source), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: cannot write {out}: No space left on device"]
    assert _names(tmp_path) == ["in.jsonl"]


def test_the_cli_reports_a_storage_failure_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from stabledrl_bench import cli

    def read_only(args) -> int:
        raise OSError(errno.EROFS, "Read-only file system", "/results/x.json")

    monkeypatch.setitem(cli.COMMANDS, "leaderboard", read_only)
    assert main(["leaderboard"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: /results/x.json: Read-only file system"]

    def bug(args) -> int:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "internal.txt")

    monkeypatch.setitem(cli.COMMANDS, "leaderboard", bug)
    with pytest.raises(FileNotFoundError):  # not the storage failing: a bug keeps its traceback
        main(["leaderboard"])
