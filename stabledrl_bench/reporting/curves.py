"""PNG plots of the curves in run logs (the records of a run's ``log.jsonl``): one run's curves, one metric of several
runs on one axis, and the moving average they are drawn with."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from stabledrl_bench.plots import LOG_AXIS_MAX, grid_margins, log_axis_values, new_figure, save_png

# Curves plotted for every run, when present in the log (the rest stays in the JSONL).
DEFAULT_CURVES = (
    "reward_mean",
    "loss",
    "grad_norm",
    "ratio_max",
    "drift",
    "clip_ratio",
    "learning_rate",
    "seconds",
)


def plot_curves(
    records: Sequence[dict],
    out_png: str | Path,
    *,
    keys: Sequence[str] = DEFAULT_CURVES,
    title: str = "",
    x_key: str = "step",
) -> Path | None:
    """One small subplot per metric against the optimizer step; returns the PNG path (None if no data)."""
    present = [k for k in keys if any(finite(r.get(k)) for r in records)]
    if not present:
        return None
    cols = min(4, len(present))
    rows = math.ceil(len(present) / cols)
    fig = new_figure(3.2 * cols, 2.4 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, key in zip(axes.flat, present, strict=False):
        xs, ys = _points(records, x_key, key)
        clipped = False
        log = key in ("grad_norm", "ratio_max") and all(y > 0 for y in ys)
        if log:
            ys, clipped = log_axis_values(ys)
        ax.plot(xs, ys, lw=1.2)
        ax.set_title(f"{key} (drawn at most {LOG_AXIS_MAX:g})" if clipped else key, fontsize=9)
        if log:
            ax.set_yscale("log")
        ax.tick_params(which="both", labelsize=7)  # a log axis labels minor ticks too
    for ax in list(axes.flat)[len(present) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    grid_margins(fig)
    return save_png(fig, out_png, tight=False)


def plot_runs(
    runs: dict[str, Sequence[dict]],
    out_png: str | Path,
    *,
    key: str = "reward_mean",
    window: int = 10,
    title: str = "",
    x_key: str = "step",
    x_label: str | None = None,
) -> Path | None:
    """One metric of several runs on one axis (trailing moving average over ``window`` points), the legend beside
    the axis; None if no data. ``x_label`` says what the x values count (default: ``x_key``)."""
    curves = {}
    for label, records in runs.items():
        xs, ys = _points(records, x_key, key)
        if xs:
            curves[label] = (xs, running_mean(ys, window))
    if not curves:
        return None
    fig = new_figure(8.0, 3.6)
    ax = fig.subplots()
    for label, (xs, ys) in curves.items():
        ax.plot(xs, ys, lw=1.4, label=label)
    ax.set_xlabel(x_label or x_key, fontsize=9)
    ax.set_ylabel(f"{key} ({window}-point moving average)", fontsize=9)
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return save_png(fig, out_png)


def _points(records: Sequence[dict], x_key: str, key: str) -> tuple[list, list]:
    pts = [(r[x_key], r[key]) for r in records if x_key in r and finite(r.get(key))]
    return [p[0] for p in pts], [p[1] for p in pts]


def running_mean(values: Sequence[float | None], window: int) -> list[float | None]:
    """Trailing mean over the last ``window`` finite values (None until there is one)."""
    out, kept = [], []
    for value in values:
        if finite(value):
            kept.append(value)
        recent = kept[-window:]
        out.append(sum(recent) / len(recent) if recent else None)
    return out


def finite(value) -> bool:
    """A real number that is not NaN or infinite (bools and None are not)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
