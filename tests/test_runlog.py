"""Run logs and the plots of their curves: the multi-run reward plot, old logs read, huge ratios drawn."""

from __future__ import annotations

from pathlib import Path

from stabledrl_bench.plots import LOG_AXIS_MAX
from stabledrl_bench.reporting.curves import plot_curves, plot_runs
from stabledrl_bench.training.runlog import read_log


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


def test_curves_with_ratios_near_the_float_limit_are_drawn(tmp_path, monkeypatch):
    """An exploding run logged ratio_max 1.1e287: matplotlib's log-axis ticks overflowed and the run crashed after
    its last step. Such values are drawn at LOG_AXIS_MAX, and the subplot says so."""
    titles = []
    monkeypatch.setattr("matplotlib.axes.Axes.set_title", lambda ax, text, **kw: titles.append(text))
    records = [{"step": i, "ratio_max": v, "grad_norm": 0.5} for i, v in enumerate([10.7, 1.146e287, 3.0])]
    assert plot_curves(records, tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert titles == ["grad_norm", f"ratio_max (drawn at most {LOG_AXIS_MAX:g})"]
