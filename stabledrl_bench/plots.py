"""Figures without pyplot's global state: every PNG the project writes is made and saved here.

Why not ``pyplot``: its global figure registry is not safe across threads and worker processes (the stress
experiments plot from workers), and it needs a backend switch; a bare ``Figure`` on the Agg canvas needs neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def new_figure(width: float, height: float) -> Any:
    """A matplotlib ``Figure`` of ``width`` x ``height`` inches on the Agg canvas (matplotlib imported lazily)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Any, path: str | Path, *, dpi: int = 110) -> Path:
    """Lay out ``fig`` and write it to ``path`` (parent folders created); returns the path."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
