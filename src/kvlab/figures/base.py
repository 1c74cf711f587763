"""The figures' shared parts: the mechanics chapter's palette (its appendix ``make_figures.py``), named by role,
the resolution, and the figure and atomic-PNG helpers every figure module draws with."""

from __future__ import annotations

import os
from pathlib import Path

from kvlab.runtime.atomic import atomic_write

GIB = float(1024**3)

# The mechanics chapter's palette (make_figures.py), named by role.
C_MAIN = "#1f4e79"  # dark blue: main series, weights
C_ALT = "#c1440e"  # orange-red: comparison series, KV cache
C_GREEN = "#2e7d32"
C_PURPLE = "#7b1fa2"
C_GRAY = "#8a8a8a"  # reference lines
C_LIGHT = "#bcd7ee"  # light blue: fills, overhead
C_RED = "#b71c1c"  # budgets and gates
SERIES_COLORS = (C_MAIN, C_ALT, C_GREEN, C_PURPLE, "#00838f", "#6d4c41", C_GRAY)

DPI = 130


def _figure(width_in: float, height_in: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), dpi=DPI)


def save_png(fig, out_path: str | os.PathLike) -> Path:
    """Write ``fig`` to ``out_path`` as PNG atomically (:func:`kvlab.runtime.atomic.atomic_write`)."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(out_path, lambda f: fig.savefig(f, format="png", bbox_inches="tight"), binary=True)


def legend(ax, **kwargs) -> None:
    """``ax.legend(**kwargs)`` where ``ax`` has a labelled artist; nothing where it has none. matplotlib warns "No
    artists with labels found to put in legend" there, and its ``warn_external`` attributes the warning to the
    calling kvlab module, so the filter that hides other libraries' warnings (:func:`kvlab.commands.
    quiet_third_party`, by module) does not catch it: ``kvlab figures --result`` on a result with only the
    baseline row printed it (a panel whose metric the baseline has not, e.g. the cache-bytes ratio)."""
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(**kwargs)
