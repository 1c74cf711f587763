"""The figure of a ``kvlab inspect`` report: K/V ranges, per-channel outliers and FP8 loss per layer."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.figures.base import (
    C_ALT,
    C_MAIN,
    C_RED,
    SERIES_COLORS,
    _figure,
    save_png,
)

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
