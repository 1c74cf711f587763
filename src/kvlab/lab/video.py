"""The autoregressive video KV cache experiment behind ``kvlab lab video`` (docs/lab.md).

The chapter argues, and says it did not implement, that a block-causal video denoiser can cache its history only
when the history's input, position, noise condition and weights are fixed; that the current block must be
recomputed at every denoising step; and that 3D RoPE positions must be kept as logical coordinates, above all
after eviction. This experiment runs the toy denoiser of :mod:`kvlab.lab.video_model` through the generators of
:mod:`kvlab.lab.video_cache` and checks, in the run:

1. the cached run equals full recompute (relative error <= ``tolerance``, fp32 rounding);
2. the evicting cache (sink + window) equals full recompute under the sink + window mask;
3. each of the chapter's three mistakes (noisy history K/V, positions from the cache length after eviction, the
   current block's K/V reused across steps) differs from its reference by far more (>= ``control_factor`` x
   ``tolerance``), while positions from the length are harmless without eviction;
4. counted FLOPs equal the formulas of :mod:`kvlab.lab.video_flops`;
5. the bytes one cached frame holds equal the planner's (:func:`kvlab.plan.video.video_kv`, what ``kvlab video``
   prints) for the same layers, heads, head_dim, dtype and tokens per frame, and the evicting cache's bytes stay
   flat at ``1 + window`` frames.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from kvlab.lab.video_cache import generate_cached, generate_full, visible_frames
from kvlab.lab.video_flops import cached_generation_flops, full_generation_flops
from kvlab.lab.video_model import FlopCounter, VideoConfig, make_noise, make_weights
from kvlab.runtime.blas import blas_threads

TOLERANCE = 1e-5  # max relative error of an exact path: fp32 rounding
CONTROL_FACTOR = 100  # a negative control must miss by at least this many tolerances

CONTROLS = (
    {
        "name": "noisy_history",
        "mistake": "history K/V taken from the frame's last noisy denoising step, not a clean pass",
        "reference": "full_recompute",
        "options": {"history": "noisy"},
    },
    {
        "name": "positions_from_length",
        "mistake": "new frame's RoPE time = frames held in the evicting cache, not its logical index",
        "reference": "windowed_recompute",
        "options": {"positions": "from_length", "evict": True},
    },
    {
        "name": "current_block_reused",
        "mistake": "current block's K/V computed at its first denoising step and reused at the later ones",
        "reference": "full_recompute",
        "options": {"current_block": "reuse"},
    },
)


def compare(candidate: np.ndarray, reference: np.ndarray) -> dict:
    """``max_abs_diff``, ``ref_scale`` (max ``|reference|``) and ``rel_err`` (their ratio) of two latent stacks
    ``[frames, tokens_per_frame, channels]``.

    Raises:
        ValueError: the shapes differ.
    """
    if candidate.shape != reference.shape:
        raise ValueError(f"shapes differ: {candidate.shape} vs {reference.shape}")
    max_diff = float(np.max(np.abs(candidate.astype(np.float64) - reference)))
    scale = float(np.max(np.abs(reference)))
    return {
        "max_abs_diff": max_diff,
        "ref_scale": scale,
        "rel_err": max_diff / scale if scale > 0 else float("inf"),
    }


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def ledger_check(cfg: VideoConfig) -> dict:
    """The planner's bytes for the toy's shapes: the model as :meth:`VideoConfig.model_config`, the clip as
    ``frames`` frames of ``height x width`` latent tokens (1 fps, no temporal or spatial compression, patch 1).

    Returns ``model_config``, ``kvlab_video_args`` (the same numbers from the command line, with the config
    written to ``CONFIG.json``), ``kv_bytes_first_latent_frame`` and ``kv_bytes`` (every frame kept) from
    :func:`kvlab.plan.video.video_kv`, and ``kv_bytes_window`` (sink + window frames) from
    :func:`kvlab.plan.ledger.kv_bytes`.
    """
    from kvlab.plan.ledger import kv_bytes
    from kvlab.plan.load import load_spec
    from kvlab.plan.video import VideoClip, video_kv

    spec = load_spec(cfg.model_config())
    clip = VideoClip(
        seconds=cfg.frames,
        fps=1,
        width=cfg.width,
        height=cfg.height,
        temporal_compression=1,
        spatial_compression=1,
        patch_size=1,
    )
    planned = video_kv(spec, clip, "auto")
    args = ["video", "--model", "CONFIG.json", "--seconds", str(cfg.frames), "--fps", "1"]
    args += ["--width", str(cfg.width), "--height", str(cfg.height)]
    args += ["--temporal-compression", "1", "--spatial-compression", "1", "--json"]
    return {
        "model_config": cfg.model_config(),
        "kvlab_video_args": args,
        "tokens_per_frame": planned["tokens_per_frame"],
        "kv_bytes_first_latent_frame": planned["kv_bytes_first_latent_frame"],
        "kv_bytes": planned["kv_bytes"],
        "kv_bytes_window": kv_bytes(spec, (1 + cfg.window_frames) * cfg.tokens_per_frame, 1, "auto"),
    }


# The lab recomputes every frame from scratch as its reference (attention cost grows with the square of the video's
# tokens): a toy's size. 16,384 tokens is 1,024 frames of the default 4 x 4 tokens.
LAB_MAX_TOKENS = 16_384


def check_lab_config(cfg: VideoConfig) -> None:
    """Refuse a config the lab cannot check: ``frames`` < ``window_frames + 3`` leaves no frame denoised after an
    eviction at a time that differs from the cache length, so the position control could not fail; ``steps`` < 2
    leaves the first-step K/V control equal to the right run; and a video of
    more than :data:`LAB_MAX_TOKENS` tokens (``frames * height * width``), which the full-recompute reference
    cannot hold.

    Raises:
        ValueError: naming ``frames`` and ``window_frames``, ``steps``, or ``frames``, ``height`` and ``width``.
    """
    tokens = cfg.frames * cfg.tokens_per_frame
    if tokens > LAB_MAX_TOKENS:
        raise ValueError(
            f"`frames` x `height` x `width` ({cfg.frames} x {cfg.height} x {cfg.width} = {tokens:,} tokens) must "
            f"be at most {LAB_MAX_TOKENS:,}: the lab recomputes the whole video for every frame as its reference"
        )
    if cfg.frames < cfg.window_frames + 3:
        raise ValueError(
            f"`frames` ({cfg.frames}) must be >= `window_frames` + 3 ({cfg.window_frames + 3}) so that frames "
            "are denoised after an eviction"
        )
    if cfg.steps < 2:
        raise ValueError(
            f"`steps` ({cfg.steps}) must be >= 2: with one denoising step the control that reuses the K/V of the "
            "first step equals the right run and could not fail"
        )


def run_video_lab(cfg: VideoConfig | None = None) -> dict:
    """Run the experiment and return a JSON-serializable dict; every number is computed in this run.

    Args:
        cfg: the denoiser and the run; ``None`` is the default (12 frames of 4 x 4 tokens, 4 steps, 3 layers,
            GQA 4/2, head_dim 32, window 3).

    Returns:
        ``config``; ``tolerance``; ``cached_vs_full`` and ``evicting_vs_windowed`` (``max_abs_diff``,
        ``ref_scale``, ``rel_err``); ``controls`` (``name``, ``mistake``, ``reference``, ``rel_err``,
        ``failed_as_expected``); ``positions_from_length_without_eviction``; ``context`` (how far eviction and
        re-encoding move the video, for scale); ``flops`` (counted and formula of each run, ratios);
        ``kv_bytes_per_frame``, ``kv_bytes_after_frame`` (``full_history`` and ``evicting``, bytes held after
        frame ``f`` was stored), ``evicted_frame_t``, ``cache_frame_t``, ``visible_frames`` (``[frames, frames]``
        of the evicting run); ``ledger`` (:func:`ledger_check`); ``seconds`` per run; ``checks`` and
        ``all_passed``; ``blas_threads`` (numpy's OpenBLAS threads during the run, None where none was found).

    Raises:
        ValueError: a config :func:`check_lab_config` refuses.
    """
    cfg = VideoConfig() if cfg is None else cfg
    check_lab_config(cfg)
    # its matrices are a few frames of 16 tokens: numpy's OpenBLAS threads only spin-wait, and with another process
    # on a 2-core machine the run took 80-88 s instead of 10 (a new user's measurement); one thread, restored after
    with blas_threads(BLAS_THREADS) as set_to:
        result = _run(cfg)
    result["blas_threads"] = set_to
    return result


# numpy BLAS threads of the video lab (kvlab.runtime.blas.blas_threads)
BLAS_THREADS = 1


def _run(cfg: VideoConfig) -> dict:
    """The body of :func:`run_video_lab` (checked config, BLAS threads set)."""
    start = time.perf_counter()
    weights, noise = make_weights(cfg), make_noise(cfg)
    counters = {name: FlopCounter() for name in ("full", "cached", "windowed", "evicting", "reencode")}
    seconds, (full, cached, windowed, evicting, reencoded) = _generate_runs(weights, cfg, noise, counters)
    references = {"full_recompute": full, "windowed_recompute": windowed}

    controls = _run_controls(weights, cfg, noise, references)
    from_length_kept = generate_cached(weights, cfg, noise, positions="from_length")
    harmless = compare(from_length_kept.latents, full)["rel_err"]

    flops = _flops(counters, cfg)
    per_frame = cached.cache.entries[0].nbytes
    ledger = ledger_check(cfg)
    cached_vs_full = compare(cached.latents, full)
    evicting_vs_windowed = compare(evicting.latents, windowed)
    checks = _checks(
        cfg, cached_vs_full, evicting_vs_windowed, controls, harmless, flops, ledger, cached, evicting
    )
    return {
        "config": dataclasses.asdict(cfg),
        "tokens_per_frame": cfg.tokens_per_frame,
        "tolerance": TOLERANCE,
        "control_factor": CONTROL_FACTOR,
        "cached_vs_full": cached_vs_full,
        "evicting_vs_windowed": evicting_vs_windowed,
        "controls": controls,
        "positions_from_length_without_eviction": harmless,
        "context": {
            "windowed_vs_full_rel_diff": compare(windowed, full)["rel_err"],
            "reencode_vs_evicting_rel_diff": compare(reencoded, evicting.latents)["rel_err"],
        },
        "flops": flops,
        "kv_bytes_per_token": cfg.kv_bytes_per_token,
        "kv_bytes_per_frame": per_frame,
        "kv_bytes_after_frame": {
            "full_history": cached.kv_bytes_after_frame,
            "evicting": evicting.kv_bytes_after_frame,
        },
        "evicted_frame_t": evicting.cache.evicted_t,
        "cache_frame_t": evicting.cache.frame_t,
        "cache_next_frame_t": evicting.cache.next_frame_t,
        "visible_frames": visible_frames(cfg.frames, cfg.window_frames).astype(int).tolist(),
        "ledger": ledger,
        "seconds": seconds,
        "wall_s": time.perf_counter() - start,
        "checks": checks,
        "all_passed": all(checks.values()),
    }


def _generate_runs(weights, cfg: VideoConfig, noise, counters: dict) -> tuple[dict[str, float], tuple]:
    """The five runs of the lab, each counting its FLOPs in ``counters``: full recompute, frame KV cache,
    windowed recompute, evicting cache (each timed) and the re-encoding variant of windowed recompute.

    Returns:
        ``(seconds per timed run, (full, cached, windowed, evicting, reencoded))``.
    """
    window = cfg.window_frames
    seconds = {}
    seconds["full_recompute"], full = _timed(lambda: generate_full(weights, cfg, noise, fc=counters["full"]))
    seconds["cached"], cached = _timed(lambda: generate_cached(weights, cfg, noise, fc=counters["cached"]))
    seconds["windowed_recompute"], windowed = _timed(
        lambda: generate_full(weights, cfg, noise, window_frames=window, fc=counters["windowed"])
    )
    seconds["evicting"], evicting = _timed(
        lambda: generate_cached(weights, cfg, noise, window_frames=window, fc=counters["evicting"])
    )
    reencoded = generate_full(
        weights, cfg, noise, window_frames=window, reencode=True, fc=counters["reencode"]
    )
    return seconds, (full, cached, windowed, evicting, reencoded)


def _run_controls(weights, cfg: VideoConfig, noise, references: dict) -> list[dict]:
    """Run each deliberate mistake of :data:`CONTROLS` and measure how far it lands from its reference run
    (``references``: ``full_recompute`` and ``windowed_recompute`` latents); each must exceed
    ``CONTROL_FACTOR * TOLERANCE``."""
    controls = []
    for control in CONTROLS:
        options = dict(control["options"])
        run_window = cfg.window_frames if options.pop("evict", False) else None
        run = generate_cached(weights, cfg, noise, window_frames=run_window, **options)
        err = compare(run.latents, references[control["reference"]])["rel_err"]
        controls.append(
            {
                "name": control["name"],
                "mistake": control["mistake"],
                "reference": control["reference"],
                "rel_err": err,
                "failed_as_expected": err >= CONTROL_FACTOR * TOLERANCE,
                "frame_t_used": run.frame_t_used,
            }
        )
    return controls


def _flops(counters: dict, cfg: VideoConfig) -> dict:
    """Counted matmul FLOPs of each run next to its formula, and the two ratios the lab reports."""
    window = cfg.window_frames
    flops = {
        "full_recompute": counters["full"].flops,
        "full_recompute_formula": full_generation_flops(cfg),
        "cached": counters["cached"].flops,
        "cached_formula": cached_generation_flops(cfg),
        "windowed_recompute": counters["windowed"].flops,
        "windowed_recompute_formula": full_generation_flops(cfg, window),
        "evicting": counters["evicting"].flops,
        "evicting_formula": cached_generation_flops(cfg, window),
        "reencode": counters["reencode"].flops,
        "reencode_formula": full_generation_flops(cfg, window, reencode=True),
    }
    flops["ratio_full_over_cached"] = flops["full_recompute"] / flops["cached"]
    flops["ratio_windowed_over_evicting"] = flops["windowed_recompute"] / flops["evicting"]
    return flops


def _checks(
    cfg: VideoConfig,
    cached_vs_full,
    evicting_vs_windowed,
    controls,
    harmless,
    flops,
    ledger,
    cached,
    evicting,
) -> dict[str, bool]:
    """The lab's pass/fail checks: exactness of both caches, every control failing, FLOPs equal to their
    formulas, bytes equal to the planner's ledger, eviction flat at sink + window, logical positions kept."""
    per_frame = cached.cache.entries[0].nbytes
    bytes_full, bytes_evicting = cached.kv_bytes_after_frame, evicting.kv_bytes_after_frame
    return {
        "cached_equals_full_recompute": cached_vs_full["rel_err"] <= TOLERANCE,
        "evicting_equals_windowed_recompute": evicting_vs_windowed["rel_err"] <= TOLERANCE,
        "every_control_fails": all(c["failed_as_expected"] for c in controls),
        "positions_from_length_harmless_without_eviction": harmless <= TOLERANCE,
        "flops_counted_equal_formula": all(
            flops[name] == flops[f"{name}_formula"]
            for name in ("full_recompute", "cached", "windowed_recompute", "evicting", "reencode")
        ),
        "bytes_per_frame_equal_ledger": per_frame
        == ledger["kv_bytes_first_latent_frame"]
        == cfg.kv_bytes_per_frame,
        "full_history_bytes_equal_ledger": bytes_full[-1] == ledger["kv_bytes"],
        "evicting_bytes_flat_at_window": bytes_evicting
        == [min(f + 1, 1 + cfg.window_frames) * per_frame for f in range(cfg.frames)],
        "logical_positions_kept": evicting.frame_t_used == list(range(cfg.frames))
        and evicting.cache.next_frame_t == cfg.frames,
    }
