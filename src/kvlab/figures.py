"""All of kvlab's plots: the mechanics chapter's four figures (its appendix ``make_figures.py``), the lab's append-cost
curves, and the figures of a ``kvlab eval`` result.

Two layers. ``plot_*`` functions draw plain dicts (documented on each) into a PNG and know nothing of where the
numbers come from. ``*_data`` functions compute those dicts with :mod:`kvlab.plan`, :mod:`kvlab.paging` and
:mod:`kvlab.lab` in the same run, so every number on a figure was computed by kvlab when it was
drawn. :func:`write_figures` does both for ``kvlab figures``.

Matplotlib is used through its object API (``Figure`` + Agg canvas): no pyplot state, no display needed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.plan.scenario import (
    DEFAULT_CONTEXT_TOKENS,
    DEFAULT_GPU,
    DEFAULT_GPU_MEMORY_GIB,
    DEFAULT_MODEL,
    DEFAULT_RESERVE_GIB,
)
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


# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
# Lab: append cost
# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
def plot_append_cost(data: Mapping[str, Any], out_path: str | os.PathLike) -> Path:
    """Per-step append time of a growing ``torch.cat`` cache and of a preallocated in-place cache against context
    (docs/lab.md, "Append cost"). ``data``: the dict of :func:`kvlab.lab.append.measure_append_cost`."""
    fig = _figure(7.2, 4.6)
    ax = fig.subplots()
    contexts = data["contexts_tokens"]
    ax.plot(contexts, data["cat_us"], "-o", color=C_ALT, label="torch.cat (copies the history every step)")
    ax.plot(contexts, data["inplace_us"], "-s", color=C_MAIN, label="preallocated, written in place")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens already cached")
    ax.set_ylabel("time per append of one token's K and V (us)")
    shape = data["shape"]
    ax.set_title(
        f"Append cost per decode step (batch {shape['batch']}, {shape['kv_heads']} KV heads, "
        f"head_dim {shape['head_dim']}, {data['dtype']})",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.25, which="both")
    fig.tight_layout()
    return save_png(fig, out_path)


# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
# Lab: the autoregressive video KV cache
# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
def plot_video_cache(data: Mapping[str, Any], out_path: str | os.PathLike) -> Path:
    """Left: which frames a query frame reads under block-causal attention, split into those the sink + window
    cache keeps and those it evicted; right: KV bytes held after each frame, every frame kept vs sink + window
    (docs/lab.md, "kvlab lab video").

    ``data`` (:func:`video_cache_data`): ``frames``, ``tokens_per_frame``, ``window_frames``, ``visible_frames``
    (``[frames, frames]`` 0/1 of the evicting run), ``kv_bytes_after_frame`` (``full_history``, ``evicting``),
    ``kv_bytes_window``, ``title``.
    """
    from matplotlib.colors import ListedColormap

    frames, per = int(data["frames"]), int(data["tokens_per_frame"])
    kept = np.asarray(data["visible_frames"], dtype=bool)
    if kept.shape != (frames, frames):
        raise ValueError(f"`visible_frames` must be [{frames}, {frames}], got {list(kept.shape)}")
    causal = np.tril(np.ones((frames, frames), dtype=bool))
    state = np.where(kept, 2, np.where(causal, 1, 0))  # 0 future, 1 evicted, 2 read from the cache
    tokens = np.kron(state, np.ones((per, per), dtype=int))  # [frames * per, frames * per]

    fig = _figure(12.6, 4.9)
    ax1, ax2 = fig.subplots(1, 2)
    ax1.imshow(
        tokens, cmap=ListedColormap(["white", "#f4c7a9", C_MAIN]), vmin=0, vmax=2, interpolation="nearest"
    )
    for f in range(frames + 1):
        ax1.axhline(f * per - 0.5, color=C_GRAY, lw=0.5)
        ax1.axvline(f * per - 0.5, color=C_GRAY, lw=0.5)
    ticks = [f * per + per / 2 - 0.5 for f in range(frames)]
    ax1.set_xticks(ticks, [str(f) for f in range(frames)], fontsize=7)
    ax1.set_yticks(ticks, [str(f) for f in range(frames)], fontsize=7)
    ax1.set_xlabel(f"key frame t (sink = 0; {per} tokens each)")
    ax1.set_ylabel("query frame t")
    ax1.set_title(f"Sink + {data['window_frames']} frames: read (blue) vs evicted (orange)", fontsize=11)

    full, evicting = data["kv_bytes_after_frame"]["full_history"], data["kv_bytes_after_frame"]["evicting"]
    x = np.arange(1, len(full) + 1)
    ax2.plot(x, np.asarray(full) / 1024, "-o", color=C_ALT, lw=2, ms=4, label="every frame kept")
    ax2.plot(x, np.asarray(evicting) / 1024, "-s", color=C_MAIN, lw=2, ms=4, label="sink + window")
    ax2.axhline(
        data["kv_bytes_window"] / 1024,
        color=C_GRAY,
        ls=":",
        lw=1.4,
        label=f"1 + {data['window_frames']} frames (planner)",
    )
    ax2.set_xlabel("frames generated (each cached after its last denoising step)")
    ax2.set_ylabel("KV cache held (KiB, fp32)")
    ax2.set_title(data.get("title", "KV bytes over frames"), fontsize=10)
    ax2.set_ylim(0, max(full) / 1024 * 1.15)
    ax2.legend(fontsize=8, loc="upper left")
    ax2.grid(alpha=0.2)
    fig.tight_layout()
    return save_png(fig, out_path)


def video_cache_data(cfg: Any = None) -> dict:
    """Numbers of :func:`plot_video_cache` from one :func:`kvlab.lab.video.run_video_lab` run (``cfg`` a
    :class:`~kvlab.lab.video_model.VideoConfig`, ``None`` for the default), with its checks and errors."""
    from kvlab.lab.video import run_video_lab

    r = run_video_lab(cfg)
    c = r["config"]
    return {
        "frames": c["frames"],
        "tokens_per_frame": r["tokens_per_frame"],
        "window_frames": c["window_frames"],
        "visible_frames": r["visible_frames"],
        "kv_bytes_after_frame": r["kv_bytes_after_frame"],
        "kv_bytes_per_frame": r["kv_bytes_per_frame"],
        "kv_bytes_window": r["ledger"]["kv_bytes_window"],
        "cached_rel_err": r["cached_vs_full"]["rel_err"],
        "evicting_rel_err": r["evicting_vs_windowed"]["rel_err"],
        "controls_rel_err": {ctl["name"]: ctl["rel_err"] for ctl in r["controls"]},
        "all_passed": r["all_passed"],
        "title": f"KV held after each frame: {c['height']}x{c['width']} tokens, {c['n_layers']} layers, "
        f"{c['kv_heads']} KV heads x {c['head_dim']}, fp32",
    }


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
        ax.legend(fontsize=7.5)
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


# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
# Data: every number computed by kvlab in this run
# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
# The defaults of the figures are the planner's default scenario (kvlab.plan.scenario): Llama-3-8B in BF16, an
# A100-80GB whose whole memory is the assumed budget (not a measured free-memory figure), a 4 GiB reserve for
# activations and framework, an 8,192-token context.


def _spec(model: Any):
    from kvlab.plan import load_spec

    return load_spec(model)


def memory_ledger_data(
    model: Any = DEFAULT_MODEL,
    *,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    batches: tuple[int, ...] = (1, 8, 16, 32, 64, 128),
    contexts: tuple[int, ...] = tuple(512 * 2**i for i in range(9)),
    curve_batches: tuple[int, ...] = (1, 8),
    mha_batch: int = 8,
    budget_gib: float = DEFAULT_GPU_MEMORY_GIB,
    overhead_gib: float = DEFAULT_RESERVE_GIB,
    kv: str = "auto",
) -> dict:
    """Numbers of :func:`plot_memory_ledger` from the planner: weights (``kvlab.plan.weight_bytes``) and KV bytes
    (``kvlab.plan.kv_bytes``) of ``model`` per batch and per context, plus the same model with one KV head per
    query head (MHA) for comparison (docs/plan.md, "Ledger and fit")."""
    import dataclasses

    from kvlab.plan import kv_bytes, weight_bytes

    spec = _spec(model)
    mha = dataclasses.replace(spec, num_kv_heads=spec.num_attention_heads)
    weights = weight_bytes(spec).total_bytes
    budget, overhead = budget_gib * GIB, overhead_gib * GIB
    curves = [
        {
            "label": f"{spec.num_kv_heads} KV heads (GQA) batch={b}",
            "kv_bytes": [kv_bytes(spec, c, b, kv) for c in contexts],
        }
        for b in curve_batches
    ]
    curves.append(
        {
            "label": f"{mha.num_kv_heads} KV heads (MHA) batch={mha_batch}",
            "kv_bytes": [kv_bytes(mha, c, mha_batch, kv) for c in contexts],
            "dashed": True,
        }
    )
    return {
        "model": spec.name,
        "context_tokens": context_tokens,
        "weight_bytes": weights,
        "overhead_bytes": overhead,
        "budget_bytes": budget,
        "budget_label": f"assumed budget {budget_gib:g} GiB",
        "batches": list(batches),
        "kv_bytes": [kv_bytes(spec, context_tokens, b, kv) for b in batches],
        "contexts": list(contexts),
        "curves": curves,
        "kv_budget_bytes": budget - weights - overhead,
    }


def roofline_data(
    gpu: str = DEFAULT_GPU,
    model: Any = DEFAULT_MODEL,
    *,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    groups: tuple[int, ...] = (1, 4, 8),
    run_probe: bool = True,
    probe_kwargs: Mapping[str, Any] | None = None,
) -> dict:
    """Numbers of :func:`plot_roofline`: the table GPU's datasheet roofs with bf16 intensities, and (``run_probe``)
    this machine's measured fp32 roofs (``kvlab.plan.probe``) with fp32 intensities, i.e. half the bf16 ones
    (docs/plan.md, "Roofline"). Points: ideal decode attention ``I = 2g/p`` for each ``g`` in ``groups`` and
    the mechanics chapter's prefill model of ``model`` at ``context_tokens``."""
    from kvlab.plan import decode_attention_intensity, get_hardware, prefill_intensity

    spec = _spec(model)
    hw = get_hardware(gpu)
    if hw.peak_flops is None:
        raise ValueError(f"{hw.name} has no datasheet FLOP/s: a roofline needs one, choose another `gpu`")
    prefill = prefill_intensity(
        spec.num_layers,
        spec.num_attention_heads,
        spec.head_dim,
        spec.num_parameters,
        spec.dtype_bytes,
        context_tokens,
    )["intensity_flop_per_byte"]

    def points(p: float) -> list[dict]:
        decode = [{"label": f"decode g={g}", "intensity": decode_attention_intensity(g, p)} for g in groups]
        return decode + [
            {"label": f"prefill S={context_tokens}", "intensity": prefill * spec.dtype_bytes / p}
        ]

    panels = []
    if run_probe:
        from kvlab.plan.probe import probe

        local = probe(**dict(probe_kwargs or {}))
        panels.append(
            {
                "title": "this machine (probe, fp32)",
                "peak_flops": local.peak_flops,
                "bandwidth_bytes_s": local.bandwidth_bytes_s,
                "points": points(4.0),
                "probe": local.to_dict(),
            }
        )
    panels.append(
        {
            "title": f"{hw.name} (datasheet, bf16)",
            "peak_flops": hw.peak_flops,
            "bandwidth_bytes_s": hw.bandwidth_bytes_s,
            "points": points(2.0),
            "source": hw.source,
        }
    )
    return {
        "model": spec.name,
        "panels": panels,
        "suptitle": "Ideal fused attention: roofline upper bounds (points are not measured kernel performance)",
    }


def video_data(
    model: Any = DEFAULT_MODEL,
    *,
    seconds: tuple[float, ...] = (5, 10, 30),
    fps: int = 24,
    width: int = 1280,
    height: int = 720,
    temporal_compression: int = 4,
    spatial_compression: int = 8,
    budget_gib: float = DEFAULT_GPU_MEMORY_GIB,
    overhead_gib: float = DEFAULT_RESERVE_GIB,
    mask_frames: int = 5,
    mask_tokens_per_frame: int = 12,
) -> dict:
    """Numbers of :func:`plot_video` from ``kvlab.plan.video_kv``: tokens and KV bytes of one clip per duration
    with the whole history cached (docs/plan.md, "Video": 52.73 / 105.47 / 316.41 GiB for Llama-3-8B at 720p)."""
    from kvlab.plan import VideoClip, video_kv, weight_bytes

    spec = _spec(model)
    cases = []
    for s in seconds:
        clip = video_kv(spec, VideoClip(s, fps, width, height, temporal_compression, spatial_compression))
        cases.append({"label": f"{s:g} s", "tokens": clip["tokens"], "kv_bytes": clip["kv_bytes"]})
    budget = budget_gib * GIB
    return {
        "mask_frames": mask_frames,
        "mask_tokens_per_frame": mask_tokens_per_frame,
        "cases": cases,
        "budget_bytes": budget,
        "kv_budget_bytes": budget - weight_bytes(spec).total_bytes - overhead_gib * GIB,
        "title": f"{spec.name}, {width}x{height} {fps} fps, {temporal_compression}x temporal and "
        f"{spatial_compression}x{spatial_compression} spatial compression, whole history cached",
    }


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


# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════
# kvlab inspect: K/V ranges, per-channel outliers and FP8 loss per layer
# ══════════════════════════════════════════════════════════════════════════════════════════════════════════════


def plot_kv_inspect(report: Mapping[str, Any], out_path: str | os.PathLike) -> Path:
    """Two panels per layer of a ``kvlab inspect`` report (:func:`kvlab.eval.inspect.inspect_kv`): the largest
    channel magnitude over the median one for keys and values (the worst head; KIVI quantizes keys per-channel for
    this reason), and the share of K/V elements each FP8 format saturates or flushes to zero with scale 1.0 and with
    per-head calibrated scales."""
    fig = _figure(10.5, 4.2)
    ax_ch, ax_fp8 = fig.subplots(1, 2)
    layers = [entry["layer"] for entry in report["layers"]]
    x = np.arange(len(layers))
    ax_ch.bar(
        x - 0.2, [e["key_channel_ratio_max"] for e in report["layers"]], 0.4, color=C_MAIN, label="keys"
    )
    ax_ch.bar(
        x + 0.2, [e["value_channel_ratio_max"] for e in report["layers"]], 0.4, color=C_ALT, label="values"
    )
    factor = report["settings"]["outlier_factor"]
    ax_ch.axhline(factor, color=C_RED, lw=1, ls="--", label=f"outlier threshold ({factor:g} x median)")
    ax_ch.set_xticks(x, [str(n) for n in layers])
    ax_ch.set_xlabel("layer")
    ax_ch.set_ylabel("largest channel abs-max / median (worst head)")
    ax_ch.set_title("Per-channel outliers", fontsize=10)
    ax_ch.legend(fontsize=8)
    ax_ch.grid(alpha=0.25, axis="y")
    styles = {"1.0": "--", "per-head": "-"}
    for i, fmt in enumerate(report["fp8"]):
        for scale, ls in styles.items():
            lost = [
                100
                * sum(
                    h["fp8"][fmt][scale]["saturated_fraction"] + h["fp8"][fmt][scale]["underflow_fraction"]
                    for h in entry["heads"]
                )
                / len(entry["heads"])
                for entry in report["layers"]
            ]
            ax_fp8.plot(x, lost, ls, marker="o", color=SERIES_COLORS[i], label=f"{fmt}, scale {scale}")
    ax_fp8.set_xticks(x, [str(n) for n in layers])
    ax_fp8.set_xlabel("layer")
    ax_fp8.set_ylabel("K/V elements saturated or flushed to zero (%)")
    ax_fp8.set_title(
        f"FP8 range loss (per-head scales calibrated on {report['settings']['calibrate_tokens']} tokens)",
        fontsize=10,
    )
    ax_fp8.legend(fontsize=8)
    ax_fp8.grid(alpha=0.25)
    fig.suptitle(f"{report['model']['id_or_path']}: {report['tokens']} prompt tokens", fontsize=10)
    fig.tight_layout()
    return save_png(fig, out_path)
