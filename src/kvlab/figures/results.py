"""The figures of a ``kvlab eval`` result: the paired metrics of each matrix against context or residual window,
and the passkey heatmap; one colour per candidate across them."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.figures.base import (
    C_RED,
    SERIES_COLORS,
    _figure,
    legend,
    save_png,
)

# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
# Eval result figures
# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
EVAL_METRICS = (
    ("cache_bytes_ratio", "cache bytes / dynamic"),
    ("nll_delta", "NLL delta (nats/token)"),
    ("topk_overlap", "top-k overlap"),
    ("latency_ratio", "latency / dynamic"),
    ("kl_mean", "KL(dynamic || candidate) mean (nats)"),
    ("recall_drop", "copy recall drop vs dynamic (worst distance)"),
)


def gate_bounds(gates: Mapping[str, Any] | None) -> dict[str, tuple[str, float]]:
    """Map a result's ``gates`` to ``{metric: ("max" | "min", threshold)}``: a gate named ``max_<metric>`` is an
    upper bound on the row key ``<metric>``, ``min_<metric>`` a lower bound; other entries are ignored."""
    bounds = {}
    for key, value in (gates or {}).items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        for side in ("max", "min"):
            if key.startswith(side + "_"):
                bounds[key[len(side) + 1 :]] = (side, float(value))
    return bounds


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


BASELINE_CACHE = "dynamic"  # the uncompressed baseline: always the first series colour (C_MAIN)


def candidate_colors(names: Iterable[str]) -> dict[str, str]:
    """The one colour map of cache names: ``{name: colour}`` over every name given, baseline first, the rest in
    sorted order, cycling :data:`SERIES_COLORS`. Built from *all* candidates of a result (not one figure's), so a
    candidate has the same colour in ``eval_capacity.png``, ``eval_window.png`` and ``eval_passkey.png`` even when
    a matrix leaves some candidates out."""
    ordered = sorted(set(names), key=lambda n: (n != BASELINE_CACHE, n))
    return {name: SERIES_COLORS[i % len(SERIES_COLORS)] for i, name in enumerate(ordered)}


def result_colors(result: Mapping[str, Any]) -> dict[str, str]:
    """:func:`candidate_colors` over every candidate of every row of an eval ``result`` (all matrices)."""
    return candidate_colors(
        r["candidate"] for r in result.get("rows", []) if isinstance(r.get("candidate"), str)
    )


def plot_eval_matrix(
    result: Mapping[str, Any], matrix: str, x_key: str, x_label: str, out_path: str | os.PathLike
) -> Path | None:
    """Panels (cache-bytes ratio, NLL delta, top-k overlap, latency ratio, and KL mean and recall drop when the
    result has them) against ``x_key`` for every
    candidate of ``result["rows"]`` whose ``matrix`` equals ``matrix``, with each metric's gate from
    ``result["gates"]`` drawn as a dashed line (the failing side shaded). Rows without a finite value are left
    out. Returns ``None`` (no file) when the matrix has no rows.
    """
    rows = [r for r in result.get("rows", []) if r.get("matrix") == matrix and _finite(r.get(x_key))]
    if not rows:
        return None
    bounds = gate_bounds(result.get("gates"))
    settings = result.get("settings") if isinstance(result.get("settings"), Mapping) else {}
    top_k = settings.get("top_k")
    candidates = list(dict.fromkeys(r["candidate"] for r in rows))
    color_of = result_colors(result)  # the whole result's map, not this matrix's
    # the quantization chapter's four metrics always; the long-context ones when the result has them (older files do not)
    metrics = [m for i, m in enumerate(EVAL_METRICS) if i < 4 or any(_finite(r.get(m[0])) for r in rows)]
    ncols = 2 if len(metrics) <= 4 else 3
    fig = _figure(5.75 * ncols, 8.0)
    axes = fig.subplots(2, ncols).ravel()
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    for ax, (metric, label) in zip(axes, metrics):
        if metric == "topk_overlap" and top_k:
            label = f"top-{top_k} overlap"
        for name in candidates:
            color = color_of[name]
            points = sorted(
                (r[x_key], r[metric], r.get("eligible"))
                for r in rows
                if r["candidate"] == name and _finite(r.get(metric))
            )
            if points:
                xs, ys, eligible = zip(*points)
                ax.plot(xs, ys, "-o", ms=5, color=color, label=name)
                rejected = [(x, y) for x, y, e in zip(xs, ys, eligible) if e is False]
                if rejected:  # hollow marker: this cell fails a gate
                    ax.plot(*zip(*rejected), "o", ms=5, mfc="white", mec=color, ls="none")
        if metric in bounds:
            side, threshold = bounds[metric]
            ax.axhline(
                threshold,
                color=C_RED,
                ls="--",
                lw=1.4,
                label=f"gate: {'<=' if side == 'max' else '>='} {threshold:g}",
            )
            lo, hi = ax.get_ylim()
            lo, hi = min(lo, threshold), max(hi, threshold)
            pad = 0.08 * (hi - lo or 1.0)
            lo, hi = lo - pad, hi + pad
            failing = (threshold, hi) if side == "max" else (lo, threshold)
            ax.axhspan(*failing, color=C_RED, alpha=0.06)
            ax.set_ylim(lo, hi)
        ax.set_xscale("log", base=2)
        xticks = sorted({r[x_key] for r in rows})
        ax.set_xticks(xticks, [str(x) for x in xticks])
        ax.set_xlabel(x_label)
        ax.set_ylabel(label)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.25)
        legend(ax, fontsize=7.5)
    provenance = result.get("provenance") if isinstance(result.get("provenance"), Mapping) else {}
    model = provenance.get("model")
    model_name = (model.get("id_or_path") or model.get("name")) if isinstance(model, Mapping) else model
    fig.suptitle(
        f"{matrix} matrix"
        + (f" on {model_name}" if model_name else "")
        + " (hollow markers: rejected by a gate)",
        fontsize=12,
    )
    fig.tight_layout()
    return save_png(fig, out_path)


def passkey_grid(result: Mapping[str, Any]) -> dict[str, dict]:
    """The passkey grid of each candidate from a result's capacity rows: ``{candidate: {"depths": [...],
    "contexts": [...], "accuracy": [[...]], "correct": [[...]], "trials": [[...]]}}`` with one row per depth
    (fraction) and one column per context (tokens); None where a cell was not measured."""
    rows = [
        r
        for r in result.get("rows", [])
        if r.get("matrix") == "capacity" and isinstance(r.get("passkey"), Mapping)
    ]
    grid: dict[str, dict] = {}
    for name in dict.fromkeys(r["candidate"] for r in rows):
        mine = [r for r in rows if r["candidate"] == name]
        contexts = sorted({r["context_length"] for r in mine})
        depths = sorted({d["depth"] for r in mine for d in r["passkey"].get("depths", [])})
        cells = {(d["depth"], r["context_length"]): d for r in mine for d in r["passkey"].get("depths", [])}
        grid[name] = {"depths": depths, "contexts": contexts}
        for key in ("accuracy", "correct", "trials"):
            grid[name][key] = [
                [cells[(p, c)].get(key) if (p, c) in cells else None for c in contexts] for p in depths
            ]
    return grid


def plot_passkey_heatmap(result: Mapping[str, Any], out_path: str | os.PathLike) -> Path | None:
    """Passkey retrieval heatmaps, one panel per candidate: needle depth (rows) x context (columns), colour =
    accuracy, each cell annotated ``correct/trials`` (Mohtashami & Jaggi 2023's grid). Returns ``None`` (no file)
    when no capacity row has the passkey grid."""
    grid = passkey_grid(result)
    if not grid:
        return None
    n = len(grid)
    ncols = min(n, 4)
    nrows = math.ceil(n / ncols)
    width = max(len(g["contexts"]) for g in grid.values())
    fig = _figure(1.6 + ncols * (1.6 + 0.9 * width), 0.9 + nrows * 3.0)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    image = None
    color_of = result_colors(result)
    for idx, (ax, (name, g)) in enumerate(zip(axes, grid.items())):
        acc = np.array([[np.nan if v is None else v for v in row] for row in g["accuracy"]], dtype=float)
        image = ax.imshow(acc, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto", origin="upper")
        for i in range(acc.shape[0]):
            for j in range(acc.shape[1]):
                k, t = g["correct"][i][j], g["trials"][i][j]
                text = "-" if k is None else f"{k}/{t}"
                ax.text(j, i, text, ha="center", va="center", fontsize=8, color="black")
        ax.set_xticks(range(len(g["contexts"])), [str(c) for c in g["contexts"]])
        labels = [f"{100 * p:g} %" for p in g["depths"]] if idx % ncols == 0 else [""] * len(g["depths"])
        ax.set_yticks(range(len(g["depths"])), labels)
        ax.set_xlabel("context (tokens)")
        if idx % ncols == 0:
            ax.set_ylabel("needle depth")
        ax.set_title(name, fontsize=10, color=color_of.get(name, "black"))  # the candidate's line colour
    for ax in axes[n:]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=list(axes[:n]), shrink=0.85, label="passkey accuracy")
    fig.suptitle(
        "passkey retrieval through each cache (0 % = start of the prompt, 100 % = just outside the "
        "residual window)",
        fontsize=10,
    )
    return save_png(fig, out_path)


def plot_eval_figures(result: Mapping[str, Any], out_dir: str | os.PathLike) -> list[Path]:
    """The eval figures of one result: ``eval_capacity.png`` (metrics against context length),
    ``eval_window.png`` (the residual-window matrix: metrics against the residual length) and
    ``eval_passkey.png`` (the passkey heatmap per candidate, when the result has one)."""
    out_dir = Path(out_dir)
    paths = [
        plot_eval_matrix(
            result, "capacity", "context_length", "context length (tokens)", out_dir / "eval_capacity.png"
        ),
        plot_eval_matrix(
            result, "window", "residual_length", "residual window R (tokens)", out_dir / "eval_window.png"
        ),
        plot_passkey_heatmap(result, out_dir / "eval_passkey.png"),
    ]
    return [p for p in paths if p is not None]
