"""The figure of a sensitivity sweep (``kvlab sensitivity sweep``, docs/MIXED.md): per layer, the KL of the
continuation when only that layer's keys (top panel) or values (middle panel) are stored in each swept format,
and, given a plan (``kvlab sensitivity allocate``), the format it assigns to each layer's keys and values (bottom
strip). Every number drawn is read from the two files named; nothing is measured here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvlab.figures.base import C_GRAY, SERIES_COLORS, _figure, save_png
from kvlab.plan.mixed import FORMATS, layer_formats

SWEEP_KIND = "kvlab-sensitivity"
# a format's colour in both panels and in the assignment strip; float (not swept, no damage) is the light grey
FORMAT_COLORS = dict(zip(FORMATS, (*SERIES_COLORS[:4], "#e0e0e0")))
SHORT = {"kivi-2": "2", "kivi-4": "4", "kivi-8": "8", "fp8-e4m3": "F8", "float": "bf"}


def _shown(sweep: Mapping[str, Any], key: str) -> str:
    """A sweep field as an error shows it: ``none`` where the file lacks it (not Python's ``None``), ``null`` for
    JSON null, else its repr."""
    if key not in sweep:
        return "none"
    return "null" if sweep[key] is None else repr(sweep[key])


def sensitivity_figure_data(sweep: Mapping[str, Any], plan: Mapping[str, Any] | None = None) -> dict:
    """``{"model", "layers", "formats", "kl": {fmt: {"k": [L], "v": [L]}}, "ranked": {fmt: (layer, half)},
    "assignment": [(k, v)] * L or None, "prompts", "seconds"}`` from a sweep file's object and a plan's.

    Raises:
        ValueError: not a sweep file (``kind``), a format or half missing, a KL list whose length is not the
            sweep's layer count, a KL that is not a finite number >= 0, or a plan that does not fit the sweep's
            model (:func:`kvlab.plan.mixed.layer_formats`, naming the layer); each names the value.
    """
    if not isinstance(sweep, Mapping) or sweep.get("kind") != SWEEP_KIND:
        if not isinstance(sweep, Mapping):
            got = f"a JSON {type(sweep).__name__}"
        else:
            got = f"kind {sweep['kind']!r}" if "kind" in sweep else "no `kind`"
        raise ValueError(f"a sensitivity sweep file has kind {SWEEP_KIND!r}, got {got}")
    layers, formats, kl = sweep.get("layers"), sweep.get("formats"), sweep.get("kl")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise ValueError(f"the sweep's `layers` must be a positive integer, got {_shown(sweep, 'layers')}")
    if not isinstance(formats, list) or not formats or not isinstance(kl, Mapping):
        raise ValueError(
            f"the sweep needs `formats` (a list) and `kl` (an object), got formats {_shown(sweep, 'formats')} and kl "
            f"{'(an object)' if isinstance(kl, Mapping) else _shown(sweep, 'kl')}"
        )
    for fmt in formats:
        if not isinstance(fmt, str):  # a key of `kl` and a line's label
            raise ValueError(f"the sweep's `formats` must list format names, got {fmt!r}")
    if sweep.get("cost") is not None and not isinstance(sweep["cost"], Mapping):
        raise ValueError(f"the sweep's `cost` must be an object, got {_shown(sweep, 'cost')}")
    for fmt in formats:
        for half in ("k", "v"):
            values = (kl.get(fmt) or {}).get(half) if isinstance(kl.get(fmt), Mapping) else None
            if not isinstance(values, list) or len(values) != layers:
                got = "none" if values is None else (f"{len(values)}" if isinstance(values, list) else repr(values))
                raise ValueError(f"the sweep's kl[{fmt!r}][{half!r}] must list {layers} values, got {got}")
            bad = [x for x in values if not isinstance(x, int | float) or not math.isfinite(x) or x < 0]
            if bad:
                raise ValueError(f"the sweep's kl[{fmt!r}][{half!r}] holds {bad[0]!r}, not a KL >= 0")
    ranked = {
        fmt: max(((i, h) for h in "kv" for i in range(layers)), key=lambda ih: kl[fmt][ih[1]][ih[0]])
        for fmt in formats
    }
    return {
        "model": sweep.get("model", "?"),
        "layers": layers,
        "formats": list(formats),
        "kl": {fmt: {h: list(kl[fmt][h]) for h in "kv"} for fmt in formats},
        "ranked": ranked,
        "assignment": None if plan is None else layer_formats(plan, layers),
        "prompts": (sweep.get("cost") or {}).get("prompts"),
        "seconds": (sweep.get("cost") or {}).get("seconds"),
    }


def plot_sensitivity(data: Mapping[str, Any], out_path: str | os.PathLike) -> Path:
    """Draw :func:`sensitivity_figure_data`'s dict: KL against layer for keys and for values, one line per
    format (log axis; a KL of 0 is drawn at the axis floor), and the plan's assignment as a strip of K and V cells
    labelled by format (``2``/``4``/``8``: KIVI bits, ``F8``: fp8-e4m3, ``bf``: float)."""
    plan = data["assignment"] is not None
    fig = _figure(max(8.0, 0.32 * data["layers"] + 2.5), 7.4 if plan else 5.6)
    grid = fig.add_gridspec(3 if plan else 2, 1, height_ratios=[3, 3, 1.1] if plan else [3, 3])
    layers = list(range(data["layers"]))
    positive = [x for f in data["formats"] for h in "kv" for x in data["kl"][f][h] if x > 0]
    floor = min(positive) / 2 if positive else 1e-6
    for row, (half, name) in enumerate((("k", "keys"), ("v", "values"))):
        ax = fig.add_subplot(grid[row])
        for fmt in data["formats"]:
            ys = [max(x, floor) for x in data["kl"][fmt][half]]
            ax.plot(layers, ys, marker="o", ms=3, lw=1.2, color=FORMAT_COLORS.get(fmt, C_GRAY), label=fmt)
        ax.set_yscale("log")
        ax.set_xlim(-0.5, data["layers"] - 0.5)
        ax.set_ylabel(f"KL, {name} of one layer\ncompressed (nats)")
        ax.grid(True, which="major", alpha=0.3)
        if row == 0:
            cost = f", {data['prompts']} prompts" if data.get("prompts") else ""
            ax.set_title(
                f"{data['model']}: per-layer KV sensitivity (one layer half compressed, the rest float{cost})"
            )
        else:
            ax.legend(fontsize=8, ncol=len(data["formats"]), loc="upper left")
        ax.tick_params(labelbottom=not plan and row == 1)
    if plan:
        _assignment_strip(fig.add_subplot(grid[2]), data)
    else:
        fig.axes[-1].set_xlabel("layer")
    fig.tight_layout()
    return save_png(fig, out_path)


def _assignment_strip(ax, data: Mapping[str, Any]) -> None:
    """The plan's format per layer: row 0 keys, row 1 values, each cell coloured and labelled by its format."""
    from matplotlib.patches import Rectangle

    for i, pair in enumerate(data["assignment"]):
        for row, fmt in enumerate(pair):
            ax.add_patch(Rectangle((i - 0.5, row - 0.5), 1, 1, color=FORMAT_COLORS[fmt], ec="white", lw=0.8))
            text = "black" if fmt == "float" else "white"
            ax.text(i, row, SHORT[fmt], ha="center", va="center", fontsize=7, color=text)
    ax.set_xlim(-0.5, data["layers"] - 0.5)
    ax.set_ylim(1.5, -0.5)
    ax.set_yticks([0, 1], ["K", "V"])
    ax.set_xlabel("layer")
    ax.set_title("the plan's formats (2/4/8: KIVI bits, F8: fp8-e4m3, bf: float)", fontsize=9)
