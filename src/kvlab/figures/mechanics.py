"""The mechanics chapter's figures (its appendix ``make_figures.py``): the memory ledger, the roofline and the
video KV memory (docs/plan.md); the paged layout is :mod:`kvlab.paging.figure`'s."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.figures.base import (
    C_ALT,
    C_GRAY,
    C_LIGHT,
    C_MAIN,
    C_RED,
    GIB,
    SERIES_COLORS,
    _figure,
    save_png,
)


# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
# Mechanics chapter figure 1: memory ledger
# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
def plot_memory_ledger(data: Mapping[str, Any], out_path: str | os.PathLike) -> Path:
    """Left: stacked weights / KV / overhead bytes per batch size against a GPU budget; right: KV bytes against
    context (log-log) for each curve, with the KV budget left after weights and overhead
    (docs/plan.md, "Ledger and fit").

    ``data``: ``model``, ``context_tokens``, ``weight_bytes``, ``overhead_bytes``, ``budget_bytes``,
    ``budget_label``, ``batches`` ``[n]``, ``kv_bytes`` ``[n]`` (KV at ``context_tokens`` per batch),
    ``contexts`` ``[m]``, ``curves``: ``[{"label", "kv_bytes": [m], "dashed": bool}]``, ``kv_budget_bytes``.
    """
    fig = _figure(12.6, 4.9)
    ax1, ax2 = fig.subplots(1, 2)
    _memory_per_batch(ax1, data)
    _kv_per_context(ax2, data)
    fig.tight_layout()
    return save_png(fig, out_path)


def _memory_per_batch(ax1, data: Mapping[str, Any]) -> None:
    """Left panel of :func:`plot_memory_ledger`: stacked weights / KV / reserve per batch against the budget."""
    batches, kv = list(data["batches"]), np.asarray(data["kv_bytes"], dtype=float) / GIB
    weights, overhead = data["weight_bytes"] / GIB, data["overhead_bytes"] / GIB
    budget = data["budget_bytes"] / GIB
    xs = np.arange(len(batches))
    ax1.bar(xs, [weights] * len(xs), color=C_MAIN, label=f"weights ({weights:.2f} GiB)")
    ax1.bar(xs, kv, bottom=weights, color=C_ALT, label=f"KV cache at {data['context_tokens']:,} tokens")
    ax1.bar(
        xs,
        [overhead] * len(xs),
        bottom=weights + kv,
        color=C_LIGHT,
        label=f"activations / framework reserve ({overhead:.0f} GiB)",
    )
    ax1.axhline(budget, color=C_RED, ls="--", lw=1.6)
    ax1.text(
        -0.4,
        budget * 1.02,
        data.get("budget_label", f"budget {budget:.0f} GiB"),
        color=C_RED,
        fontsize=9,
        va="bottom",
    )
    for x, total in zip(xs, weights + kv + overhead):
        ax1.text(
            x,
            total + budget * 0.01,
            f"{total:.0f}",
            ha="center",
            va="bottom",
            fontsize=8,
            color=C_RED if total > budget else "black",
        )
    ax1.set_xticks(xs, [str(b) for b in batches])
    ax1.set_xlabel("batch size")
    ax1.set_ylabel("GiB")
    ax1.set_title(f"{data['model']}: memory per batch size", fontsize=11)
    ax1.legend(fontsize=8, loc="upper left")
    ax1.set_ylim(0, max(budget, float(np.max(weights + kv + overhead))) * 1.15)


def _kv_per_context(ax2, data: Mapping[str, Any]) -> None:
    """Right panel of :func:`plot_memory_ledger`: KV bytes against context (log-log), the KV budget and the
    device budget as lines."""
    budget = data["budget_bytes"] / GIB
    contexts = np.asarray(data["contexts"], dtype=float)
    for i, curve in enumerate(data["curves"]):
        ax2.plot(
            contexts,
            np.asarray(curve["kv_bytes"], dtype=float) / GIB,
            "--s" if curve.get("dashed") else "-o",
            ms=3.5,
            color=SERIES_COLORS[i % len(SERIES_COLORS)],
            label=curve["label"],
        )
    kv_budget = data["kv_budget_bytes"] / GIB
    ax2.axhline(kv_budget, color=C_GRAY, ls=":", lw=1.4)
    ax2.text(
        contexts[-1],
        kv_budget / 1.12,
        f"KV budget {kv_budget:.1f} GiB",
        color=C_GRAY,
        fontsize=8.5,
        ha="right",
        va="top",
    )
    ax2.axhline(budget, color=C_RED, ls="--", lw=1.4)
    ax2.text(
        contexts[-1],
        budget * 1.12,
        data.get("budget_label", f"budget {budget:.0f} GiB"),
        color=C_RED,
        fontsize=8.5,
        ha="right",
        va="bottom",
    )
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("context per sequence (tokens)")
    ax2.set_ylabel("KV cache (GiB, log scale)")
    ax2.set_title("KV cache grows linearly with context and batch", fontsize=11)
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.25, which="both")


# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
# Mechanics chapter figure 2: roofline
# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
def plot_roofline(data: Mapping[str, Any], out_path: str | os.PathLike) -> Path:
    """One roofline panel per machine: ``min(peak, I * bandwidth)`` with its ridge point and the workload points
    placed on the roof (upper bounds, not measured kernel performance; docs/plan.md, "Roofline").

    ``data``: ``panels``: ``[{"title", "peak_flops", "bandwidth_bytes_s", "points": [{"label", "intensity"}]}]``
    (intensities in FLOP/byte for that panel's dtype), optional ``suptitle``.
    """
    panels = list(data["panels"])
    labels = list(dict.fromkeys(p["label"] for panel in panels for p in panel["points"]))
    color_of = {label: SERIES_COLORS[(i + 1) % len(SERIES_COLORS)] for i, label in enumerate(labels)}
    fig = _figure(6.3 * len(panels), 5.2)
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    for ax, panel in zip(axes, panels):
        peak, bw = float(panel["peak_flops"]), float(panel["bandwidth_bytes_s"])
        ridge = peak / bw
        unit, scale = ("TFLOP/s", 1e12) if peak >= 1e13 else ("GFLOP/s", 1e9)
        intensities = [float(p["intensity"]) for p in panel["points"]] + [ridge]
        lo = 10 ** math.floor(math.log10(min(intensities) / 3))
        hi = 10 ** math.ceil(math.log10(max(intensities) * 3))
        grid = np.logspace(math.log10(lo), math.log10(hi), 400)
        ax.plot(grid, np.minimum(peak, grid * bw) / scale, color=C_MAIN, lw=2.0)
        ax.axvspan(lo, ridge, color=C_LIGHT, alpha=0.3)
        ax.axvline(ridge, color=C_MAIN, ls=":", lw=1.2)
        ax.text(
            ridge * 1.1,
            peak / scale * 0.8,
            f"ridge {ridge:.3g} FLOP/B",
            color=C_MAIN,
            fontsize=8.5,
            rotation=90,
            va="top",
        )
        ax.text(lo * 1.3, peak / scale * 1.25, "bandwidth-bound", color=C_MAIN, fontsize=9)
        for point in panel["points"]:
            intensity = float(point["intensity"])
            y = min(peak, intensity * bw) / scale
            color = color_of[point["label"]]
            ax.plot(
                [intensity],
                [y],
                "o",
                ms=8,
                color=color,
                zorder=5,
                label=f"{point['label']}: I={intensity:.4g}, <= {y:.4g} {unit}",
            )
        ax.legend(fontsize=8, loc="lower right")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo * bw / scale, peak / scale * 2.2)
        ax.set_xlabel("arithmetic intensity I (FLOP / byte)")
        ax.set_ylabel(f"attainable upper bound ({unit})")
        ax.set_title(f"{panel['title']}: {peak / scale:.4g} {unit}, {bw / 1e9:.4g} GB/s", fontsize=10)
        ax.grid(alpha=0.25, which="both")
    fig.suptitle(
        data.get("suptitle", "Roofline upper bounds (points are not measured kernel performance)"),
        fontsize=12,
    )
    fig.tight_layout()
    return save_png(fig, out_path)


# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
# Mechanics chapter figure 4: video
# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
def block_causal_mask(frames: int, tokens_per_frame: int) -> np.ndarray:
    """``[n, n]`` boolean mask, ``n = frames * tokens_per_frame``: a query attends to every token of its own frame
    (bidirectional inside the block) and of earlier frames (causal across blocks);
    docs/lab.md, "kvlab lab video"."""
    if frames < 1 or tokens_per_frame < 1:
        raise ValueError(
            f"`frames` and `tokens_per_frame` must be >= 1, got {frames!r} and {tokens_per_frame!r}"
        )
    frame = np.arange(frames * tokens_per_frame) // tokens_per_frame
    return frame[None, :] <= frame[:, None]


def plot_video(data: Mapping[str, Any], out_path: str | os.PathLike) -> Path:
    """Left: the block-causal mask; right: KV bytes of one clip per duration against the budget lines.

    ``data``: ``mask_frames``, ``mask_tokens_per_frame``, ``cases``: ``[{"label", "tokens", "kv_bytes"}]``,
    ``budget_bytes``, ``kv_budget_bytes``, ``title`` (the assumptions).
    """
    fig = _figure(12.6, 4.9)
    ax1, ax2 = fig.subplots(1, 2)
    frames, per = int(data["mask_frames"]), int(data["mask_tokens_per_frame"])
    n = frames * per
    ax1.imshow(
        block_causal_mask(frames, per).astype(float), cmap="Blues", vmin=0, vmax=1.4, interpolation="nearest"
    )
    for f in range(frames + 1):
        ax1.axhline(f * per - 0.5, color=C_ALT, lw=1.0)
        ax1.axvline(f * per - 0.5, color=C_ALT, lw=1.0)
    centers = [f * per + per / 2 - 0.5 for f in range(frames)]
    ax1.set_xticks(centers, [f"frame {f + 1}" for f in range(frames)], fontsize=8)
    ax1.set_yticks(centers, [f"frame {f + 1}" for f in range(frames)], fontsize=8)
    ax1.set_xlabel("key / value position (time runs right)")
    ax1.set_ylabel("query position")
    ax1.set_title("Bidirectional inside a frame block, causal across blocks", fontsize=11)
    ax1.text(
        n * 0.55,
        n * 0.2,
        "upper right empty:\nno future frame is read",
        fontsize=8.5,
        color=C_MAIN,
        bbox={"fc": "white", "ec": C_MAIN, "alpha": 0.85},
    )

    cases = list(data["cases"])
    values = [c["kv_bytes"] / GIB for c in cases]
    bars = ax2.bar(
        [c["label"] for c in cases],
        values,
        color=[SERIES_COLORS[i + 1] for i in range(len(cases))],
        width=0.55,
    )
    budget, kv_budget = data["budget_bytes"] / GIB, data["kv_budget_bytes"] / GIB
    ax2.axhline(budget, color=C_RED, ls="--", lw=1.6, label=f"GPU budget {budget:.0f} GiB")
    ax2.axhline(kv_budget, color=C_GRAY, ls=":", lw=1.4, label=f"KV budget after weights {kv_budget:.1f} GiB")
    for bar, value, case in zip(bars, values, cases):
        ax2.text(
            bar.get_x() + bar.get_width() / 2,
            value * 1.02,
            f"{value:.2f} GiB\n{case['tokens']:,} tokens",
            ha="center",
            va="bottom",
            fontsize=8.5,
        )
    ax2.set_ylabel("KV cache of one clip (GiB)")
    ax2.set_title(data.get("title", "KV cache of one video clip"), fontsize=10)
    ax2.set_ylim(0, max(values + [budget]) * 1.3)
    ax2.legend(fontsize=8, loc="upper left")
    ax2.grid(alpha=0.2, axis="y")
    fig.tight_layout()
    return save_png(fig, out_path)
