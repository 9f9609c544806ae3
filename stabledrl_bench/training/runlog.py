"""Per-step diagnostics: an append-only JSONL log and PNG plots of the curves people actually look at."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from stabledrl_bench.atomic import atomic_write_text
from stabledrl_bench.migrations import upgraded_log_record
from stabledrl_bench.plots import LOG_AXIS_MAX, log_axis_values, new_figure, save_png

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


class RunLog:
    """Appends one JSON object per line; on resume, lines beyond the resumed step are dropped first.

    A new run into a folder that holds the log of an earlier one (stopped before it saved a checkpoint to resume
    from) keeps that log beside the new one, as ``log.1.jsonl`` (``.2``, ...), and says so: a log is never
    overwritten silently.
    """

    def __init__(self, path: str | Path, *, resume_step: int | None = None, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            if self.path.is_file() and self.path.stat().st_size:
                kept = _set_aside(self.path)
                print(f"note: {self.path} held the log of an earlier run that saved nothing to resume; kept as {kept}")
            self.path.write_text("")
        elif self.path.exists():
            kept = [r for r in read_log(self.path) if r.get("step", 0) <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as fh:
            fh.write(json.dumps(record, default=_json_default) + "\n")


def _set_aside(path: Path) -> Path:
    """Rename ``path`` (``log.jsonl``) to the first free ``log.<n>.jsonl`` beside it; returns the new path."""
    n = 1
    while (kept := path.with_name(f"{path.stem}.{n}{path.suffix}")).exists():
        n += 1
    path.rename(kept)
    return kept


def _json_default(obj):
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def read_log(path: str | Path) -> list[dict]:
    """Records of a JSONL log; a truncated last line (killed mid-write) is ignored; old metric names are renamed."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        records.append(upgraded_log_record(record))
    return records


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
        ax.tick_params(labelsize=7)
        if log:
            ax.set_yscale("log")
    for ax in list(axes.flat)[len(present) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    return save_png(fig, out_png)


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
