"""``kvlab lab video``: the autoregressive video KV cache lab (a toy block-causal denoiser, cached vs full
recompute, eviction, negative controls): its flags, its run and its two tables."""

from __future__ import annotations

import argparse

from kvlab.commands import fail, table
from kvlab.commands.lab.common import finish, print_verdict, status, value_table
from kvlab.runtime.checks import int_flag

VIDEO_FIELD_PREFIX = "video_"  # argparse dest of a `kvlab lab video` flag = prefix + VideoConfig field


class VideoParser(argparse.ArgumentParser):
    """``kvlab lab video``'s parser: its help shows :class:`~kvlab.lab.video_model.VideoConfig`'s defaults, read
    only when the help is printed (that import brings numpy, which every kvlab command would pay at start-up)."""

    def format_help(self) -> str:
        from kvlab.lab.video_model import VideoConfig

        defaults = VideoConfig()
        for action in self._actions:
            field = action.dest.removeprefix(VIDEO_FIELD_PREFIX)
            if action.dest != field and action.help and "(default" not in action.help:
                action.help += f" (default {getattr(defaults, field)})"
        return super().format_help()


# `kvlab lab video` flag, VideoConfig field it sets, help text
VIDEO_FLAGS = (
    ("--frames", "frames", "latent frames generated"),
    ("--height", "height", "latent tokens per frame, vertically"),
    ("--width", "width", "latent tokens per frame, horizontally"),
    ("--channels", "channels", "latent values per token"),
    ("--steps", "steps", "denoising steps per frame"),
    ("--layers", "n_layers", "transformer layers"),
    ("--q-heads", "q_heads", "query heads"),
    ("--kv-heads", "kv_heads", "K/V heads"),
    ("--head-dim", "head_dim", "channels per head (split between the t, h, w rotary axes)"),
    ("--window", "window_frames", "recent frames kept besides the sink frame when evicting"),
    ("--seed", "weight_seed", "random seed of the weights"),
    ("--noise-seed", "noise_seed", "random seed of the noise"),
)


def _video_flags(exc: ValueError) -> str:
    """The error with each config field named by the flag the user gave (`n_layers` -> --layers)."""
    message = str(exc)
    for flag, field, _ in VIDEO_FLAGS:
        message = message.replace(f"`{field}`", flag)
    return message


def register(subparsers) -> None:
    """Add ``kvlab lab video`` (one integer flag per :data:`VIDEO_FLAGS` field, unset flags keeping the config's
    defaults; run by :func:`run_video`) to ``subparsers``."""
    v = subparsers.add_parser(
        "video",
        help="autoregressive video: a frame KV cache across denoising steps vs full recompute",
        description="Generate a short latent video with a toy block-autoregressive denoiser (bidirectional "
        "inside a frame, causal across frames, 3D RoPE from (t, h, w) coordinates, a few denoising steps per "
        "frame) by full recompute and with a frame KV cache; check they agree to fp32 rounding, that a cache "
        "keeping a sink frame and a window of recent frames equals recompute under the same visibility, that "
        "three known mistakes do not, and account FLOPs and KV bytes (bytes tied to `kvlab video`).",
    )
    # --json may also come before `video` (`kvlab lab --json video`): SUPPRESS keeps the parent's value
    v.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print machine-readable JSON"
    )
    for flag, field, text in VIDEO_FLAGS:
        # not given: the field keeps VideoConfig's default
        v.add_argument(
            flag, dest=VIDEO_FIELD_PREFIX + field, type=int_flag(), default=argparse.SUPPRESS, metavar="N", help=text
        )
    v.set_defaults(func=run_video)


def run_video(args: argparse.Namespace) -> int:
    """``kvlab lab video``: exit 0 when every check passes, 1 when one fails, 2 on bad settings."""
    from dataclasses import fields

    from kvlab.lab.video import check_lab_config, run_video_lab
    from kvlab.lab.video_model import VideoConfig

    try:
        cfg = VideoConfig(
            **{
                f.name: getattr(args, VIDEO_FIELD_PREFIX + f.name)
                for f in fields(VideoConfig)
                if hasattr(args, VIDEO_FIELD_PREFIX + f.name)
            }
        )
        check_lab_config(cfg)
    except ValueError as exc:
        return fail(args, _video_flags(exc))
    try:
        with status("toy video denoiser: full recompute, frame KV cache, eviction, controls ...", args.json):
            result = run_video_lab(cfg)
    except ValueError as exc:
        return fail(args, _video_flags(exc))
    return finish(args, result, _print_video)


def _print_video(r: dict) -> None:
    from kvlab.runtime.console import stdout_console

    console = stdout_console()
    console.print(_video_checks_table(r))
    console.print(_video_cost_table(r))
    print_verdict(console, r["checks"])


def _video_checks_table(r: dict):
    """The video lab's exactness checks and controls, each with its relative error and the bound it meets."""
    cfg, tol = r["config"], r["tolerance"]
    t1 = table(
        f"Toy video denoiser: {cfg['frames']} frames of {cfg['height']}x{cfg['width']} tokens, "
        f"{cfg['steps']} denoising steps, {cfg['n_layers']} layers, {cfg['q_heads']} q / {cfg['kv_heads']} KV "
        f"heads, head_dim {cfg['head_dim']}, fp32; window = sink + {cfg['window_frames']} frames",
        "rel err",
        labels=("run", "compared with"),
    )
    for col in ("expected", "ok"):
        t1.add_column(col)
    checks = r["checks"]
    t1.add_row(
        "frame KV cache",
        "full recompute",
        f"{r['cached_vs_full']['rel_err']:.2e}",
        f"<= {tol:.0e}",
        str(checks["cached_equals_full_recompute"]),
    )
    t1.add_row(
        "evicting cache (sink + window)",
        "recompute, sink + window mask",
        f"{r['evicting_vs_windowed']['rel_err']:.2e}",
        f"<= {tol:.0e}",
        str(checks["evicting_equals_windowed_recompute"]),
    )
    t1.add_row(
        "positions from cache length, no eviction",
        "full recompute",
        f"{r['positions_from_length_without_eviction']:.2e}",
        f"<= {tol:.0e}",
        str(checks["positions_from_length_harmless_without_eviction"]),
    )
    bound = r["control_factor"] * tol
    for c in r["controls"]:
        t1.add_row(
            f"control: {c['mistake']}",
            c["reference"].replace("_", " "),
            f"{c['rel_err']:.2e}",
            f">= {bound:.0e}",
            str(c["failed_as_expected"]),
        )
    ctx = r["context"]
    t1.add_row(
        "for scale: eviction itself", "full recompute", f"{ctx['windowed_vs_full_rel_diff']:.2e}", "-", "-"
    )
    t1.add_row(
        "for scale: kept frames re-encoded",
        "evicting cache",
        f"{ctx['reencode_vs_evicting_rel_diff']:.2e}",
        "-",
        "-",
    )
    return t1


def _video_cost_table(r: dict):
    """The video lab's counted matmul FLOPs (full recompute, cache, evicting cache) and KV bytes."""
    f, ledger = r["flops"], r["ledger"]
    full_b, evict_b = r["kv_bytes_after_frame"]["full_history"], r["kv_bytes_after_frame"]["evicting"]
    rows = [
        ("full recompute", f"{f['full_recompute']:.4e}"),
        ("frame KV cache", f"{f['cached']:.4e}"),
        ("full recompute / cache", f"{f['ratio_full_over_cached']:.2f}x"),
        ("evicting cache", f"{f['evicting']:.4e}"),
        (
            "KV bytes per frame (lab / kvlab video)",
            f"{r['kv_bytes_per_frame']:,} / {ledger['kv_bytes_first_latent_frame']:,} B",
        ),
        (
            f"KV bytes after {len(full_b)} frames, every frame kept (lab / kvlab video)",
            f"{full_b[-1]:,} / {ledger['kv_bytes']:,} B",
        ),
        (
            f"KV bytes after {len(evict_b)} frames, sink + window (peak)",
            f"{evict_b[-1]:,} B ({max(evict_b):,})",
        ),
        ("frames held / logical time of the next frame", f"{r['cache_frame_t']} / {r['cache_next_frame_t']}"),
        ("wall clock, whole lab", f"{r['wall_s']:.2f} s"),
    ]
    return value_table(
        f"Matmul FLOPs, counted in the run (formula agrees: {r['checks']['flops_counted_equal_formula']}) and KV "
        "bytes (fp32)",
        "quantity",
        rows,
    )
