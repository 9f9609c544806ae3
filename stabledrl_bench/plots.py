"""Figures without pyplot's global state: every PNG the project writes is made and saved here.

Why not ``pyplot``: its global figure registry is not safe across threads and worker processes (the stress
experiments plot from workers), and it needs a backend switch; a bare ``Figure`` on the Agg canvas needs neither.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from stabledrl_bench.atomic import atomic_write_bytes


def new_figure(width: float, height: float) -> Any:
    """A matplotlib ``Figure`` of ``width`` x ``height`` inches on the Agg canvas (matplotlib imported lazily)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


Rect = tuple[float, float, float, float]

# matplotlib's log-axis tick locator overflows on values near the float64 limit (a ratio of 1e287 from an exploding
# run crashed a training run's plot, after 120 finished steps); such values are drawn at this ceiling instead.
LOG_AXIS_MAX = 1e200


def log_axis_values(values: list[float]) -> tuple[list[float], bool]:
    """``values`` with everything above :data:`LOG_AXIS_MAX` drawn at it, and whether any was."""
    return [min(v, LOG_AXIS_MAX) for v in values], any(v > LOG_AXIS_MAX for v in values)


def grid_margins(fig: Any, *, left: float = 0.55, right: float = 0.1, bottom: float = 0.3, top: float = 0.55) -> None:
    """Fixed margins in inches around a grid of small panels (``top`` leaves room for a title), instead of
    :meth:`~matplotlib.figure.Figure.tight_layout`, which measures every label and costs a third of a run's curves
    figure: that figure is written at the end of every training run, and a test suite trains hundreds of them."""
    width, height = fig.get_size_inches()
    fig.subplots_adjust(
        left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height, wspace=0.3, hspace=0.5
    )


def save_png(fig: Any, path: str | Path, *, dpi: int = 110, rect: Rect | None = None, tight: bool = True) -> Path:
    """Lay out ``fig`` (within ``rect`` of the figure, e.g. to leave room for a legend outside the axes; ``tight``
    False: as it is, e.g. after :func:`grid_margins`) and write it to ``path`` atomically (parent folders created);
    returns the path."""
    if tight:
        fig.tight_layout(rect=rect)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    path = Path(path)
    atomic_write_bytes(path, buffer.getvalue())
    return path
