"""The figure of a ``kvlab tasks`` result: task score against the bytes each cache holds, one panel per task, one
line per cache family swept over its settings (docs/TASKS.md).

The x axis is the *measured* × dyn (the cache's bytes over the float cache's, after the context is filled, as
``kvlab eval``'s × dyn), not a nominal compression ratio, so quantization, eviction and their composition share one axis.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvlab.figures.base import C_GRAY, SERIES_COLORS, _figure, legend, save_png

FLOAT = "dynamic"
LINESTYLES = ("-", "--", ":", "-.")  # one per context length


def skip_reason(result: Mapping[str, Any]) -> str | None:
    """Why :func:`plot_task_scores` draws nothing for ``result`` (``None`` when it draws): a result with no measured
    cell, e.g. one stopped (Ctrl-C) in its first cell or whose every task was too long for its contexts. Callers that
    draw several figures skip this one with this line instead of failing (docs/TASKS.md)."""
    cells = result.get("cells")
    if not isinstance(cells, list) or not cells:
        return f"the tasks result (status {result.get('status', 'complete')}) has no measured cell to draw"
    return None


def task_figure_data(result: Mapping[str, Any]) -> dict:
    """``{task: {"contexts": {context: {"informative": bool, "float": score, "lines": {family: [(ratio, score,
    name), ...]}}}}}`` from a result's ``cells`` and ``candidates`` (points of a line sorted by ratio).

    Raises:
        ValueError: a result without ``cells`` or a cell without the float cache.
    """
    cells = result.get("cells")
    if not isinstance(cells, list) or not cells:
        raise ValueError("the result has no measured cells to draw")
    lines_of = {n: c.get("line", n) for n, c in result.get("candidates", {}).items()}
    min_float = result.get("min_float_score")
    min_float = 0.5 if min_float is None else min_float  # null (the schema's "not stored") as absent
    out: dict = {}
    for cell in cells:
        rows = cell["caches"]
        if FLOAT not in rows:
            raise ValueError(f"cell {cell.get('task')}@{cell.get('context')} has no {FLOAT!r} row")
        base = rows[FLOAT]["score"]
        entry = {"informative": base >= min_float, "float": base, "lines": {}}
        for name, row in rows.items():
            if name != FLOAT:
                entry["lines"].setdefault(lines_of.get(name, name), []).append(
                    (row["cache_bytes_ratio"], row["score"], name)
                )
        for pts in entry["lines"].values():
            pts.sort()
        out.setdefault(cell["task"], {"contexts": {}})["contexts"][cell["context"]] = entry
    return out


def plot_task_scores(result: Mapping[str, Any], out_path: str | os.PathLike) -> Path:
    """Draw :func:`task_figure_data` to ``out_path`` (PNG, written atomically): per task, score (0-1) against the
    measured × dyn (cache bytes / the float cache's, log scale), a line per family and context, the float cache as a grey star; a context
    where the float cache scores below the result's ``min_float_score`` is marked "not informative".

    Raises:
        ValueError: as :func:`task_figure_data`.
    """
    data = task_figure_data(result)
    families = sorted({f for t in data.values() for c in t["contexts"].values() for f in c["lines"]})
    colors = {f: SERIES_COLORS[i % len(SERIES_COLORS)] for i, f in enumerate(families)}
    cols = min(3, len(data))
    rows = math.ceil(len(data) / cols)
    fig = _figure(4.2 * cols, 3.2 * rows)
    for i, (task, t) in enumerate(data.items()):
        ax = fig.add_subplot(rows, cols, i + 1)
        notes = []
        for j, (context, c) in enumerate(sorted(t["contexts"].items())):
            style = LINESTYLES[j % len(LINESTYLES)]
            ax.plot([1.0], [c["float"]], marker="*", color=C_GRAY, markersize=10, linestyle="none")
            for fam, pts in c["lines"].items():
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                ax.plot(xs, ys, marker="o", markersize=3, linestyle=style, color=colors[fam],
                        label=f"{fam} ({context})", alpha=1.0 if c["informative"] else 0.35)  # fmt: skip
            if not c["informative"]:
                notes.append(f"not informative at {context}")
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.03, 1.03)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("× dyn (cache bytes / dynamic's, measured)", fontsize=7)
        ax.set_ylabel("score (RULER, mean)", fontsize=7)
        ax.tick_params(labelsize=7)
        if notes:
            ax.text(0.02, 0.02, "; ".join(notes), transform=ax.transAxes, fontsize=6, color=C_GRAY)
        if i == 0:
            legend(ax, fontsize=5, ncol=2, loc="best")  # where it hides the fewest points
    fig.tight_layout()
    return save_png(fig, out_path)
