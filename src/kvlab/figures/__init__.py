"""All of kvlab's plots: the mechanics chapter's four figures (its appendix ``make_figures.py``), the lab's append-cost
curves, and the figures of a ``kvlab eval`` result.

Two layers. ``plot_*`` functions draw plain dicts (documented on each) into a PNG and know nothing of where the
numbers come from. ``*_data`` functions compute those dicts with :mod:`kvlab.plan`, :mod:`kvlab.paging` and
:mod:`kvlab.lab` in the same run, so every number on a figure was computed by kvlab when it was
drawn. :func:`write_figures` does both for ``kvlab figures``.

One module per subject, every public name importable from ``kvlab.figures``: :mod:`~kvlab.figures.base` (palette,
figure and PNG helpers), :mod:`~kvlab.figures.mechanics` (memory ledger, roofline, video),
:mod:`~kvlab.figures.data` (their numbers), :mod:`~kvlab.figures.lab` (append cost, video KV cache),
:mod:`~kvlab.figures.results` (an eval result's figures), :mod:`~kvlab.figures.kv_inspect` (``kvlab inspect``);
this module lists the files ``kvlab figures`` writes and writes them.

Matplotlib is used through its object API (``Figure`` + Agg canvas): no pyplot state, no display needed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.figures.base import (
    C_ALT,
    C_GRAY,
    C_GREEN,
    C_LIGHT,
    C_MAIN,
    C_PURPLE,
    C_RED,
    DPI,
    GIB,
    SERIES_COLORS,
    save_png,
)
from kvlab.figures.data import (
    memory_ledger_data,
    roofline_data,
    video_data,
)
from kvlab.figures.kv_inspect import (
    plot_kv_inspect,
)
from kvlab.figures.lab import (
    plot_append_cost,
    plot_video_cache,
    video_cache_data,
)
from kvlab.figures.mechanics import (
    block_causal_mask,
    plot_memory_ledger,
    plot_roofline,
    plot_video,
)
from kvlab.figures.results import (
    BASELINE_CACHE,
    EVAL_METRICS,
    candidate_colors,
    gate_bounds,
    passkey_grid,
    plot_eval_figures,
    plot_eval_matrix,
    plot_passkey_heatmap,
    result_colors,
)
from kvlab.runtime.atomic import atomic_write

# every figure's public name, importable from kvlab.figures as before the package was split by subject
__all__ = [
    "BASELINE_CACHE",
    "C_ALT",
    "C_GRAY",
    "C_GREEN",
    "C_LIGHT",
    "C_MAIN",
    "C_PURPLE",
    "C_RED",
    "DPI",
    "EVAL_FIGURE_FILES",
    "EVAL_METRICS",
    "FIGURE_FILES",
    "FIGURE_NAMES",
    "GIB",
    "SERIES_COLORS",
    "block_causal_mask",
    "candidate_colors",
    "figure_files",
    "figure_steps",
    "gate_bounds",
    "memory_ledger_data",
    "passkey_grid",
    "plot_append_cost",
    "plot_eval_figures",
    "plot_eval_matrix",
    "plot_kv_inspect",
    "plot_memory_ledger",
    "plot_passkey_heatmap",
    "plot_roofline",
    "plot_video",
    "plot_video_cache",
    "result_colors",
    "roofline_data",
    "save_png",
    "video_cache_data",
    "video_data",
    "write_figures",
]

FIGURE_NAMES = ("memory_ledger", "roofline", "paged_layout", "video", "video_cache", "append_cost")


# file names write_figures draws (the eval figures' names are plot_eval_figures')
FIGURE_FILES = {
    "memory_ledger": "fig_memory_ledger.png",
    "roofline": "fig_roofline.png",
    "paged_layout": "fig_paged_layout.png",
    "video": "fig_video.png",
    "video_cache": "fig_video_cache.png",
    "append_cost": "fig_append_cost.png",
    "data": "figures.json",
}
EVAL_FIGURE_FILES = ("eval_capacity.png", "eval_window.png", "eval_passkey.png")


def figure_files(*, result: Mapping[str, Any] | None = None, append: bool = True) -> list[str]:
    """The file names :func:`write_figures` writes with these settings (checked for existing files before any
    work). With a ``result``, every eval figure it may draw is listed."""
    names = [f for key, f in FIGURE_FILES.items() if append or key != "append_cost"]
    return names + (list(EVAL_FIGURE_FILES) if result is not None else [])


def figure_steps(*, result: Mapping[str, Any] | None = None, append: bool = True) -> int:
    """How many times :func:`write_figures` calls its ``progress`` callback with these settings."""
    return 6 + bool(append) + (result is not None)


def write_figures(
    out_dir: str | os.PathLike,
    *,
    result: Mapping[str, Any] | None = None,
    run_probe: bool = True,
    append: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Compute and draw the mechanics chapter's four figures (``fig_memory_ledger.png``, ``fig_roofline.png``,
    ``fig_paged_layout.png``, ``fig_video.png``), the video KV cache lab's ``fig_video_cache.png``, the lab's
    ``fig_append_cost.png`` (``append``) and, given an
    eval ``result``, its figures; write every number drawn to ``figures.json`` next to them.
    Existing files of the same names are replaced (atomically): ``kvlab figures`` checks :func:`figure_files`
    first and refuses without ``--force``.

    ``progress(step)`` is called as each of the :func:`figure_steps` steps starts.

    Returns ``{name: path}``.
    """
    import json

    from kvlab.paging.figure import plot_paged_layout
    from kvlab.paging.static import run_static

    report = progress or (lambda step: None)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {}
    paths: dict[str, Path] = {}
    report("memory ledger")
    data["memory_ledger"] = memory_ledger_data()
    paths["memory_ledger"] = plot_memory_ledger(
        data["memory_ledger"], out_dir / FIGURE_FILES["memory_ledger"]
    )
    report("roofline" + (" (probing this machine)" if run_probe else ""))
    data["roofline"] = roofline_data(run_probe=run_probe)
    paths["roofline"] = plot_roofline(data["roofline"], out_dir / FIGURE_FILES["roofline"])
    report("paged layout")
    data["paged_layout"] = run_static()
    paths["paged_layout"] = plot_paged_layout(
        data["paged_layout"], out_dir / FIGURE_FILES["paged_layout"], overwrite=True
    )
    report("video memory")
    data["video"] = video_data()
    paths["video"] = plot_video(data["video"], out_dir / FIGURE_FILES["video"])
    report("video KV cache lab")
    data["video_cache"] = video_cache_data()
    paths["video_cache"] = plot_video_cache(data["video_cache"], out_dir / FIGURE_FILES["video_cache"])
    if append:
        from kvlab.lab.append import measure_append_cost

        report("append cost: torch.cat vs in place")
        data["append_cost"] = measure_append_cost()
        paths["append_cost"] = plot_append_cost(data["append_cost"], out_dir / FIGURE_FILES["append_cost"])
    if result is not None:
        report("eval result figures")
        for path in plot_eval_figures(result, out_dir):
            paths[path.stem] = path
    report("figures.json")
    atomic_write(out_dir / "figures.json", lambda f: json.dump(data, f, indent=1, default=_json_default))
    paths["data"] = out_dir / "figures.json"
    return paths


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)
