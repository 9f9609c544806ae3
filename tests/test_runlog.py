"""Run-log helpers: the multi-run reward plot."""

from __future__ import annotations

from pathlib import Path

from stabledrl_bench.training.runlog import plot_runs, read_log


def test_plot_runs_writes_one_png_and_ignores_runs_without_data(tmp_path: Path) -> None:
    runs = {"a": [{"step": i, "reward_mean": i / 10} for i in range(20)], "b": [{"step": 0, "loss": 1.0}]}
    path = plot_runs(runs, tmp_path / "sub" / "reward.png", title="t")
    assert path == tmp_path / "sub" / "reward.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_runs({"b": runs["b"]}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_logs_written_before_a_metric_rename_still_read(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"step": 1, "clip_frac": 0.25}\n')
    assert read_log(path) == [{"step": 1, "clip_ratio": 0.25}]
