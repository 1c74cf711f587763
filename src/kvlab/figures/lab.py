"""The lab's figures: the append cost of a growing cache (docs/lab.md, "Append cost") and the autoregressive
video KV cache lab, with the numbers the latter draws."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.figures.base import (
    C_ALT,
    C_GRAY,
    C_MAIN,
    _figure,
    save_png,
)


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
