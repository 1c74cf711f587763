"""``kvlab video``: tokens and KV bytes of autoregressive video clips (the report from
:func:`kvlab.plan.report.video_report`)."""

from __future__ import annotations

import argparse

from kvlab.commands import flag_values
from kvlab.commands.plan.flags import add_kv_flags, kv_kwargs, report
from kvlab.commands.plan.render import print_video
from kvlab.plan.scenario import DEFAULT_MODEL
from kvlab.runtime.checks import int_flag


def register(subparsers) -> None:
    """Add ``kvlab video`` (clip lengths, fps, resolution, compression and patch size, KV flags; run by
    :func:`run_video`) to ``subparsers``."""
    v = subparsers.add_parser(
        "video",
        help="tokens and KV bytes of autoregressive video clips (every frame kept in the cache)",
        description="Turn clips (seconds, fps, resolution) into tokens through temporal and spatial "
        "compression and a patch size, and size their KV cache on a model (whole history kept).",
    )
    v.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"preset, config.json, .gguf file, directory or hub id (default {DEFAULT_MODEL})",
    )
    v.add_argument(
        "--seconds",
        type=float,
        nargs="+",
        default=[5, 10, 30],
        help="clip lengths (default 5 10 30); seconds x fps must be a whole number of frames (else refused); "
        "frames past the last whole latent frame (a count --temporal-compression does not divide; with "
        "--causal-first-frame, not 1 + a multiple) are dropped, with a warning",
    )
    v.add_argument("--fps", type=int_flag(), default=24, help="frames per second (default 24)")
    side = "a multiple of --spatial-compression x --patch-size (else rounded down to one, with a warning)"
    v.add_argument("--width", type=int_flag(), default=1280, help=f"pixels (default 1280); {side}")
    v.add_argument("--height", type=int_flag(), default=720, help=f"pixels (default 720); {side}")
    v.add_argument("--temporal-compression", type=int_flag(), default=4, help="frames per latent frame (default 4)")
    v.add_argument(
        "--spatial-compression", type=int_flag(), default=8, help="pixels per latent, per side (default 8)"
    )
    v.add_argument("--patch-size", type=int_flag(), default=1, help="latents per token, per side (default 1)")
    v.add_argument(
        "--causal-first-frame",
        action="store_true",
        help="causal VAE: latent frames = 1 + (frames - 1) // temporal (default frames // temporal)",
    )
    v.add_argument("--batch", type=int_flag(), default=1, help="clips (default 1)")
    add_kv_flags(v)
    v.add_argument("--json", action="store_true", help="print machine-readable JSON")
    v.set_defaults(func=run_video)


def run_video(args: argparse.Namespace) -> int:
    """``kvlab video``: tokens and KV bytes of each clip (:func:`kvlab.plan.report.video_report`; tables or
    ``--json``). Exit 2 for a setting or model file the planner refuses, named by its flag."""
    from kvlab.plan.report import video_report

    def build() -> dict:  # the flags are read inside: a refused value is reported as the planner's errors are
        clips = flag_values(args, "model", "seconds", "fps", "width", "height", "batch")
        to_tokens = flag_values(
            args, "temporal_compression", "spatial_compression", "patch_size", "causal_first_frame"
        )
        return video_report(**clips, **to_tokens, **kv_kwargs(args))

    return report(args, build, print_video)
