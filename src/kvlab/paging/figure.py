"""The mechanics chapter's paged-layout figure: logical blocks mapped to a physical pool, and concurrency per policy.

Left: each request's logical blocks (contiguous) above the physical block pool (allocation order), a grey line
from every logical block to its physical block, and the fill of each block (only the last block of a request is
partial). Right: requests admitted under the same budget by contiguous reservation vs paging, with utilization.
Every number comes from the ``static_result`` passed in (:func:`kvlab.paging.static.run_static`).
"""

from __future__ import annotations

import os
from pathlib import Path

from kvlab.runtime.atomic import atomic_write

C_MAIN = "#1f4e79"  # dark blue: paging
C_ALT = "#c1440e"  # orange red
C_GREEN = "#2e7d32"
C_PURPLE = "#7b1fa2"
C_GRAY = "#8a8a8a"  # contiguous reservation, reference lines
C_RED = "#b71c1c"  # gain labels
SEQ_COLORS = (C_MAIN, C_ALT, C_GREEN, C_PURPLE, C_GRAY)
WORKLOAD_LABELS = {"uniform": "uniform\n512-4096 tokens", "heavy": "heavy tail\n80% short"}
GIB = 1024**3
FIGURE_SUFFIXES = (".png", ".svg", ".pdf")  # the formats plot_paged_layout writes, picked by the suffix


def _draw_layout(ax, demo: dict) -> None:
    import matplotlib.patches as mpatches

    bs = demo["block_size"]
    seqs = demo["seqs"]
    physical = demo["physical"]
    n_seq, n_phys = len(seqs), len(physical)
    fill = {p["block_id"]: p["fill"] for p in physical}
    w, h, gap = 0.82, 0.62, 0.06
    ax.set_xlim(-0.6, n_phys * (w + gap) + 0.8)
    ax.set_ylim(-0.5, n_seq + 2.6)
    ax.axis("off")
    ax.set_title(
        "Logical blocks -> physical blocks: a request grows non-contiguously", fontsize=11, loc="left"
    )
    y_pool = 0.15
    for i, seq in enumerate(seqs):
        color = SEQ_COLORS[i % len(SEQ_COLORS)]
        y = n_seq - i + 1.35
        ax.text(-0.5, y + h / 2, f"request {i + 1}", fontsize=8.5, ha="right", va="center")
        for j, block_id in enumerate(seq["block_ids"]):
            x = j * (w + gap)
            used = fill[block_id]
            ax.add_patch(
                mpatches.Rectangle((x, y), w, h, facecolor=color, alpha=0.30, edgecolor=color, lw=1.2)
            )
            ax.add_patch(mpatches.Rectangle((x, y), w * used / bs, h, facecolor=color, alpha=0.85))
            if used < bs:
                ax.text(
                    x + w / 2,
                    y + h / 2,
                    f"{used}/{bs}",
                    fontsize=6.4,
                    ha="center",
                    va="center",
                    color="black",
                )
            x_phys = block_id * (w + gap) + w / 2
            ax.annotate(
                "",
                xy=(x_phys, y_pool + h),
                xytext=(x + w / 2, y),
                arrowprops={"arrowstyle": "-", "color": C_GRAY, "lw": 0.7, "alpha": 0.55},
            )
    ax.text(-0.5, y_pool + h / 2, "physical pool", fontsize=8.5, ha="right", va="center")
    for p in physical:
        x = p["block_id"] * (w + gap)
        if p["owner"] is None:
            ax.add_patch(
                mpatches.Rectangle((x, y_pool), w, h, facecolor="white", edgecolor=C_GRAY, lw=1.0, hatch="//")
            )
        else:
            color = SEQ_COLORS[p["owner"] % len(SEQ_COLORS)]
            ax.add_patch(
                mpatches.Rectangle((x, y_pool), w, h, facecolor=color, alpha=0.30, edgecolor=color, lw=1.2)
            )
            ax.add_patch(mpatches.Rectangle((x, y_pool), w * p["fill"] / bs, h, facecolor=color, alpha=0.85))
        ax.text(x + w / 2, y_pool - 0.28, str(p["block_id"]), fontsize=6.4, ha="center", color=C_GRAY)
    ax.text(n_phys * (w + gap) + 0.1, y_pool + h / 2, "free", fontsize=8, va="center", color=C_GRAY)
    ax.text(
        0,
        n_seq + 2.2,
        f"block size {bs}: only each request's last block is partly filled (labels: used/capacity)",
        fontsize=8.5,
        color=C_GRAY,
    )


def _draw_concurrency(ax, section_a: dict, config: dict) -> None:
    import numpy as np

    names = [k for k, v in section_a.items() if isinstance(v, dict)]
    kc = [section_a[k]["k_cont"] for k in names]
    kp = [section_a[k]["k_paged"] for k in names]
    uc = [section_a[k]["util_cont"] for k in names]
    up = [section_a[k]["util_paged"] for k in names]
    xs = np.arange(len(names))
    wbar = 0.36
    max_len = config.get("max_len")
    bs = config.get("block_size")
    ax.bar(xs - wbar / 2, kc, wbar, color=C_GRAY, label=f"contiguous (reserve {max_len:,} tokens)")
    ax.bar(xs + wbar / 2, kp, wbar, color=C_MAIN, label=f"paged (block {bs})")
    top = max(kp + kc)
    for i, (a, b) in enumerate(zip(kc, kp)):
        ax.text(i - wbar / 2, a + top * 0.015, f"{a}\nutil {uc[i]:.1%}", ha="center", fontsize=8)
        ax.text(
            i + wbar / 2, b + top * 0.015, f"{b}\nutil {up[i]:.1%}", ha="center", fontsize=8, color=C_MAIN
        )
        ax.text(
            i,
            max(a, b) + top * 0.14,
            f"{b / a:.2f}x",
            ha="center",
            fontsize=10,
            color=C_RED,
            fontweight="bold",
        )
    ax.set_xticks(xs)
    ax.set_xticklabels([WORKLOAD_LABELS.get(k, k) for k in names], fontsize=9)
    ax.set_ylabel(f"concurrent requests in the same {section_a['budget_bytes'] / GIB:.2f} GiB")
    ax.set_title("Paging removes reservation waste: more requests fit", fontsize=11)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_ylim(0, top * 1.42)
    ax.grid(alpha=0.2, axis="y")


def plot_paged_layout(static_result: dict, path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Draw the paged-layout figure from a :func:`run_static` result and write it to ``path`` (PNG/SVG/PDF).

    Args:
        static_result: needs ``demo`` (:func:`kvlab.paging.static.demo_layout`), ``A`` and ``config``.
        path: output file; its suffix picks the format. Written atomically.
        overwrite: replace an existing file (otherwise a ValueError).

    Returns:
        The written path.

    Raises:
        ValueError: a suffix other than .png, .svg or .pdf, a ``path`` that is a folder or exists (without
            ``overwrite``), a folder of ``path`` that does not exist (it is not created, as
            :func:`kvlab.paging.trace.save_trace`) or is a file, or a ``static_result`` lacking a key.
    """
    path = Path(path)
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise ValueError(f"the figure's suffix must be .png, .svg or .pdf, got {path.name!r}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory; pass a file name")
    if path.exists() and not overwrite:
        raise ValueError(f"{path} exists; pass overwrite=True to replace it")
    if not path.parent.is_dir():
        blocked = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        if blocked is not None:
            raise ValueError(f"{path}: {blocked} is a file, not a folder")
        raise ValueError(f"{path}: folder {path.parent} does not exist; create it first")
    for key in ("demo", "A", "config"):
        if key not in static_result:
            raise ValueError(f"`static_result` lacks {key!r}: pass the dict returned by run_static()")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(12.6, 5.0), dpi=130)
    grid = fig.add_gridspec(1, 2, width_ratios=[1.25, 1.0])
    _draw_layout(fig.add_subplot(grid[0, 0]), static_result["demo"])
    _draw_concurrency(fig.add_subplot(grid[0, 1]), static_result["A"], static_result["config"])
    fig.tight_layout()
    try:
        atomic_write(
            path, lambda f: fig.savefig(f, format=path.suffix[1:] or "png", bbox_inches="tight"), binary=True
        )
    finally:
        plt.close(fig)
    return path
