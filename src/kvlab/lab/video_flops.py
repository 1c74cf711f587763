"""Analytic matmul FLOPs of the toy video denoiser's generators (2 FLOPs per multiply-add, as :mod:`kvlab.lab.flops`).

2 FLOPs per multiply-add; only matrix products count; attention is dense, ``q_tokens x k_tokens`` scores then a
mask, as :func:`kvlab.lab.video_model.attend` computes it. ``T`` is ``tokens_per_frame``, ``S`` the denoising
steps, ``F`` the frames. The runs count their FLOPs as they spend them (:class:`~kvlab.lab.video_model.FlopCounter`);
these formulas must give the same integers.

* full recompute, frame ``f``: ``S`` forwards over its ``n_f`` context frames (``f + 1``; with ``reencode``, the
  sink, the window and itself), the output projection on the current frame only;
* cached, frame ``f`` with ``c_f`` frames cached (``f``, or ``min(f, 1 + window)`` when evicting): ``S`` forwards
  of ``T`` queries against ``(c_f + 1) T`` keys, then the clean pass that stores the frame's K/V — every layer but
  the last in full, the last one only its K and V projections, no output projection.
"""

from __future__ import annotations

import numpy as np

from kvlab.lab.video_cache import visible_frames
from kvlab.lab.video_model import VideoConfig


def projection_flops_per_token(cfg: VideoConfig) -> int:
    """``wq wk wv wo w1 w2`` FLOPs of one token through one layer."""
    d, kv, ffn = cfg.d_model, cfg.kv_width, cfg.ffn_width
    return 2 * (d * d + 2 * d * kv + d * d + 2 * d * ffn)


def attention_flops(cfg: VideoConfig, q_tokens: int, k_tokens: int) -> int:
    """``QK^T`` and ``PV`` of one layer: ``2 * 2 * q_heads * head_dim * q_tokens * k_tokens``."""
    return 4 * cfg.q_heads * cfg.head_dim * q_tokens * k_tokens


def io_flops_per_token(cfg: VideoConfig) -> int:
    """``w_in`` (or ``w_out``) of one token: ``2 * channels * d_model``."""
    return 2 * cfg.channels * cfg.d_model


def full_step_flops(cfg: VideoConfig, context_frames: int) -> int:
    """One full-recompute denoising step over ``context_frames`` frames (the current one included).

    Raises:
        ValueError: ``context_frames`` < 1.
    """
    if context_frames < 1:
        raise ValueError(f"`context_frames` must be >= 1, got {context_frames!r}")
    n, t = context_frames * cfg.tokens_per_frame, cfg.tokens_per_frame
    layers = cfg.n_layers * (n * projection_flops_per_token(cfg) + attention_flops(cfg, n, n))
    return n * io_flops_per_token(cfg) + layers + t * io_flops_per_token(cfg)


def _block_layer_flops(cfg: VideoConfig, cached_frames: int) -> int:
    """One layer's FLOPs for a frame's ``T`` tokens attending to ``cached_frames`` cached frames and the frame itself:
    projections plus attention.

    Raises:
        ValueError: ``cached_frames`` < 0.
    """
    if cached_frames < 0:
        raise ValueError(f"`cached_frames` must be >= 0, got {cached_frames!r}")
    t = cfg.tokens_per_frame
    return t * projection_flops_per_token(cfg) + attention_flops(cfg, t, (cached_frames + 1) * t)


def cached_step_flops(cfg: VideoConfig, cached_frames: int) -> int:
    """One cached denoising step: ``T`` queries against ``cached_frames`` cached frames plus the block itself.

    Raises:
        ValueError: ``cached_frames`` < 0.
    """
    t = cfg.tokens_per_frame
    return 2 * t * io_flops_per_token(cfg) + cfg.n_layers * _block_layer_flops(cfg, cached_frames)


def clean_pass_flops(cfg: VideoConfig, cached_frames: int) -> int:
    """The pass that stores a finished frame's K/V from its clean latent: ``w_in``, every layer but the last in
    full, the last layer's K and V projections (``2 * 2 * d_model * kv_width`` per token), no ``w_out``.

    Raises:
        ValueError: ``cached_frames`` < 0.
    """
    t = cfg.tokens_per_frame
    full_layers = (cfg.n_layers - 1) * _block_layer_flops(cfg, cached_frames)
    return t * io_flops_per_token(cfg) + full_layers + t * 4 * cfg.d_model * cfg.kv_width


def full_generation_flops(cfg: VideoConfig, window_frames: int | None = None, reencode: bool = False) -> int:
    """:func:`kvlab.lab.video_cache.generate_full`: ``sum_f S * full_step_flops(n_f)``. A window alone changes the
    mask, not the dense work (``n_f = f + 1``); with ``reencode`` only the visible frames are fed."""
    if reencode:
        context = visible_frames(cfg.frames, window_frames).sum(axis=1)
    else:
        context = np.arange(1, cfg.frames + 1)
    return sum(cfg.steps * full_step_flops(cfg, int(n)) for n in context)


def cached_frames_before(cfg: VideoConfig, frame: int, window_frames: int | None = None) -> int:
    """Frames held in the cache while frame ``frame`` is denoised: ``frame``, or ``min(frame, 1 + window)``."""
    return frame if window_frames is None else min(frame, 1 + window_frames)


def cached_generation_flops(cfg: VideoConfig, window_frames: int | None = None) -> int:
    """:func:`kvlab.lab.video_cache.generate_cached` (clean history, logical positions, recomputed block):
    ``sum_f S * cached_step_flops(c_f) + clean_pass_flops(c_f)``."""
    total = 0
    for f in range(cfg.frames):
        c = cached_frames_before(cfg, f, window_frames)
        total += cfg.steps * cached_step_flops(cfg, c) + clean_pass_flops(cfg, c)
    return total
