"""Generate a video with the toy denoiser two ways: full recompute, and a frame KV cache (docs/lab.md,
"kvlab lab video").

Full recompute (:func:`generate_full`): at every denoising step of frame ``f`` the model runs over every frame
``0..f`` — the history from its final clean latents at noise level 0, the current frame from its noisy latent —
under a frame-visibility mask, and only the current frame's prediction is used.

Cached (:func:`generate_cached`): the history is read from a :class:`FrameKVCache`. A history frame may be cached
only once its input, position, noise condition and the weights are fixed: after the frame's last denoising step
its clean latent is run once more at noise level 0 and that pass's K/V are stored (CausVid, arXiv:2412.07772, and
Self-Forcing, arXiv:2506.08009, do the same "clean context" pass). The current block's K/V change at every step
(its input is a different noisy latent), so they are recomputed at every step and never stored.

With ``window_frames`` the cache keeps the first frame (a sink, after StreamingLLM's attention sinks,
arXiv:2309.17453) and the newest ``window_frames`` frames; the others are evicted. Each stored frame keeps its
logical time ``t`` and its tokens' ``(t, h, w)`` coordinates: the next frame's time is the newest stored ``t``
plus one, never the number of frames held. The exact reference of an evicting cache is a full recompute under
the mask in which every frame sees the sink and its ``window_frames`` predecessors (:func:`visible_frames`): a
frame's K/V were computed when it could see the frames it saw then, so re-encoding only the frames now kept
(``reencode=True``) is a different computation.

Deliberate mistakes (negative controls) are options of :func:`generate_cached` so they run through
the same code as the correct path: ``history="noisy"`` stores the K/V of a frame's last noisy step instead of the
clean pass, ``positions="from_length"`` takes the new frame's time from the number of frames cached, and
``current_block="reuse"`` keeps the current block's K/V of its first step for all later steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvlab.lab.video_model import (
    FlopCounter,
    VideoConfig,
    VideoWeights,
    attention_ffn,
    embed,
    frame_coords,
    predict_clean,
    project_qkv,
    renoise,
    rope_angles,
)
from kvlab.runtime.checks import check_int

HISTORY_MODES = ("clean", "noisy")
POSITION_MODES = ("logical", "from_length")
CURRENT_BLOCK_MODES = ("recompute", "reuse")


def visible_frames(frames: int, window_frames: int | None = None) -> np.ndarray:
    """``[frames, frames]`` bool: may a query of frame ``i`` (row) read frame ``j`` (column)?

    Block-causal (``j <= i``: the own frame bidirectionally, earlier frames causally); with
    ``window_frames`` only the sink ``j == 0`` and the newest ``i - window_frames <= j`` of those.

    Raises:
        ValueError: ``frames`` < 1 or ``window_frames`` < 1.
    """
    check_int("frames", frames, 1)
    i, j = np.arange(frames)[:, None], np.arange(frames)[None, :]
    visible = j <= i
    if window_frames is not None:
        check_int("window_frames", window_frames, 1)
        visible &= (j == 0) | (j >= i - window_frames)
    return visible


@dataclass(slots=True)
class FrameEntry:
    """One cached frame: its K/V for every layer and the positions they were rotated with."""

    t: int  # logical time of the frame in the whole video (its RoPE t coordinate)
    coords: np.ndarray  # [tokens_per_frame, 3] int64: (t, h, w) its keys were rotated with (t == .t if right)
    keys: list[np.ndarray]  # per layer [kv_heads, tokens_per_frame, head_dim], RoPE applied
    values: list[np.ndarray]  # per layer [kv_heads, tokens_per_frame, head_dim]

    @property
    def nbytes(self) -> int:
        """Bytes of the stored K and V (the coordinates are metadata, not counted)."""
        return sum(a.nbytes for a in self.keys) + sum(a.nbytes for a in self.values)


@dataclass
class FrameKVCache:
    """A KV cache of whole frames with logical positions; optionally a sink frame plus a window.

    ``window_frames=None`` keeps every frame. Otherwise, after each :meth:`append`, the oldest frame other than the
    first one appended (the sink) is evicted while more than ``1 + window_frames`` frames are held.

    Raises:
        ValueError: ``window_frames`` not ``None`` or an int >= 1.
    """

    n_layers: int  # layers whose K/V each entry holds
    window_frames: int | None = None  # frames kept besides the sink; None: keep all
    entries: list[FrameEntry] = field(default_factory=list)  # held frames, oldest first
    evicted_t: list[int] = field(default_factory=list)  # logical times of the frames evicted so far

    def __post_init__(self) -> None:
        w = self.window_frames
        if w is not None:
            check_int("window_frames", w, 1)

    def append(self, entry: FrameEntry) -> list[int]:
        """Store ``entry`` after the newest frame, then evict down to the window; returns the evicted times.

        Raises:
            ValueError: ``entry.t`` is not after the newest held frame's ``t``, or ``entry`` holds K/V for a
                different number of layers.
        """
        if len(entry.keys) != self.n_layers or len(entry.values) != self.n_layers:
            raise ValueError(
                f"entry holds K/V of {len(entry.keys)}/{len(entry.values)} layers, the cache has {self.n_layers}"
            )
        if self.entries and entry.t <= self.entries[-1].t:
            raise ValueError(f"frame t={entry.t} is not after the newest cached frame t={self.entries[-1].t}")
        self.entries.append(entry)
        evicted = []
        while self.window_frames is not None and len(self.entries) > 1 + self.window_frames:
            evicted.append(self.entries.pop(1).t)  # entries[0] is the sink
        self.evicted_t.extend(evicted)
        return evicted

    @property
    def next_frame_t(self) -> int:
        """Logical time of the next frame: the newest stored ``t`` + 1 (0 when empty), read from the entries."""
        return self.entries[-1].t + 1 if self.entries else 0

    @property
    def frames_held(self) -> int:
        """Frames stored now (after eviction this is less than :attr:`next_frame_t`)."""
        return len(self.entries)

    @property
    def frame_t(self) -> list[int]:
        """Logical times of the held frames, oldest first."""
        return [e.t for e in self.entries]

    @property
    def nbytes(self) -> int:
        """Bytes of every stored K and V."""
        return sum(e.nbytes for e in self.entries)

    def layer_kv(self, layer: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """K and V of every held frame for ``layer``, each ``[kv_heads, frames_held * tokens_per_frame,
        head_dim]`` in frame order; ``(None, None)`` when the cache is empty."""
        if not self.entries:
            return None, None
        keys = np.concatenate([e.keys[layer] for e in self.entries], axis=1)
        values = np.concatenate([e.values[layer] for e in self.entries], axis=1)
        return keys, values

    def position_ids(self) -> np.ndarray:
        """``(t, h, w)`` of every held token, ``[frames_held * tokens_per_frame, 3]`` int64."""
        return (
            np.concatenate([e.coords for e in self.entries]) if self.entries else np.zeros((0, 3), np.int64)
        )


@dataclass(frozen=True)
class CachedRun:
    """What :func:`generate_cached` returns."""

    latents: np.ndarray  # [frames, tokens_per_frame, channels]: the generated clean latents
    cache: FrameKVCache  # the cache after the last frame was stored
    kv_bytes_after_frame: list[int]  # cache.nbytes after frame f was stored, f = 0..frames-1
    frame_t_used: list[int]  # the RoPE time coordinate each frame was denoised and cached with


def _block_forward(weights, cfg, cache, latent, sigma, t, fc, *, kv_only=False, frozen_kv=None):
    """The current block (one frame, ``latent: [tokens_per_frame, channels]`` at noise level ``sigma``, time
    ``t``) through every layer against the cache. Returns the predicted clean latent ``[tokens_per_frame,
    channels]`` (``None`` with ``kv_only``, which stops after the last layer's K/V) and the block's per-layer
    ``(k, v)``, each ``[kv_heads, tokens_per_frame, head_dim]``. ``frozen_kv`` replaces the block's own K/V by
    those of an earlier step (the ``current_block="reuse"`` mistake)."""
    cos, sin = rope_angles(cfg, frame_coords(cfg, t))
    h = embed(weights, cfg, latent[None], np.array([sigma], np.float32), fc)  # [tokens_per_frame, d_model]
    block_kv = []
    for layer, w in enumerate(weights.layers):
        last = layer == cfg.n_layers - 1
        q, k, v = project_qkv(h, w, cfg, cos, sin, fc, need_q=not (kv_only and last))
        if frozen_kv is not None:
            k, v = frozen_kv[layer]
        block_kv.append((k, v))
        if kv_only and last:
            return None, block_kv
        past_k, past_v = cache.layer_kv(layer)
        if past_k is not None:
            k, v = np.concatenate([past_k, k], axis=1), np.concatenate([past_v, v], axis=1)
        h = attention_ffn(h, q, k, v, None, w, fc)  # the cache holds exactly the visible frames
    return predict_clean(weights, h, fc), block_kv


def generate_cached(
    weights: VideoWeights,
    cfg: VideoConfig,
    noise: np.ndarray,
    *,
    window_frames: int | None = None,
    history: str = "clean",
    positions: str = "logical",
    current_block: str = "recompute",
    fc: FlopCounter | None = None,
) -> CachedRun:
    """Generate ``cfg.frames`` frames block by block against a :class:`FrameKVCache`.

    Args:
        weights, cfg: the denoiser (:func:`kvlab.lab.video_model.make_weights`).
        noise: ``[frames, steps, tokens_per_frame, channels]`` from :func:`kvlab.lab.video_model.make_noise`.
        window_frames: ``None`` keeps every frame; an int keeps the sink and the newest ``window_frames``.
        history: ``"clean"`` stores each finished frame's K/V from one extra pass over its clean latent at noise
            level 0; ``"noisy"`` (a mistake) stores the K/V its last denoising step computed.
        positions: ``"logical"`` denoises the next frame at ``cache.next_frame_t``; ``"from_length"`` (a mistake)
            rotates it with ``cache.frames_held``, which is wrong once frames were evicted (the entry still records
            the frame's logical ``t``, and its ``coords`` show the time actually used).
        current_block: ``"recompute"`` computes the block's K/V at every step; ``"reuse"`` (a mistake) keeps the
            K/V of its first step for the later steps.
        fc: counts the FLOPs spent (a new counter when ``None``).

    Returns:
        :class:`CachedRun`: latents ``[frames, tokens_per_frame, channels]``, the cache, bytes held after each
        frame was stored and the time each frame was denoised at.

    Raises:
        ValueError: a mode outside its choices, or ``noise`` not of shape ``[frames, steps, tokens, channels]``.
    """
    _check_noise(cfg, noise)
    for name, value, choices in (
        ("history", history, HISTORY_MODES),
        ("positions", positions, POSITION_MODES),
        ("current_block", current_block, CURRENT_BLOCK_MODES),
    ):
        if value not in choices:
            raise ValueError(f"`{name}` must be one of {list(choices)}, got {value!r}")
    fc = FlopCounter() if fc is None else fc
    cache = FrameKVCache(cfg.n_layers, window_frames)
    latents = np.empty((cfg.frames, cfg.tokens_per_frame, cfg.channels), np.float32)
    kv_bytes, times = [], []
    for f in range(cfg.frames):
        t_logical = cache.next_frame_t
        t = t_logical if positions == "logical" else cache.frames_held  # the RoPE time the frame gets
        x, first_kv = noise[f, 0], None
        for step in range(cfg.steps):
            frozen = first_kv if current_block == "reuse" else None
            x0, block_kv = _block_forward(weights, cfg, cache, x, cfg.sigmas[step], t, fc, frozen_kv=frozen)
            first_kv = block_kv if first_kv is None else first_kv
            if step + 1 < cfg.steps:
                x = renoise(cfg, x0, noise[f, step + 1], step + 1)
        latents[f] = x0
        if history == "clean":
            _, block_kv = _block_forward(weights, cfg, cache, x0, 0.0, t, fc, kv_only=True)
        keys, values = [k for k, _ in block_kv], [v for _, v in block_kv]
        cache.append(FrameEntry(t_logical, frame_coords(cfg, t), keys, values))
        kv_bytes.append(cache.nbytes)
        times.append(t)
    return CachedRun(latents, cache, kv_bytes, times)


def generate_full(
    weights: VideoWeights,
    cfg: VideoConfig,
    noise: np.ndarray,
    *,
    window_frames: int | None = None,
    reencode: bool = False,
    fc: FlopCounter | None = None,
) -> np.ndarray:
    """Generate ``cfg.frames`` frames by full recompute: every denoising step of frame ``f`` runs the model over
    the history (clean latents, noise level 0) and the current noisy frame, ``[frames, tokens_per_frame,
    channels]`` returned.

    Args:
        window_frames: ``None``: block-causal over every frame. An int: every frame sees only the sink and its
            ``window_frames`` predecessors (:func:`visible_frames`) — the evicting cache's exact reference.
        reencode: with ``window_frames``, feed only the frames the current one sees (sink, window, itself) and
            let them see each other block-causally: the kept frames re-encoded from scratch, which is *not* what an
            evicting cache holds (reported for contrast).
        fc: counts the FLOPs spent (a new counter when ``None``).

    Raises:
        ValueError: ``noise`` of the wrong shape, ``reencode`` without ``window_frames``.
    """
    _check_noise(cfg, noise)
    if reencode and window_frames is None:
        raise ValueError("`reencode` needs `window_frames`")
    fc = FlopCounter() if fc is None else fc
    visible_all = visible_frames(cfg.frames, window_frames)
    latents = np.empty((cfg.frames, cfg.tokens_per_frame, cfg.channels), np.float32)
    for f in range(cfg.frames):
        if reencode:
            frame_ids = np.flatnonzero(visible_all[f])  # sink, window, current
            visible = visible_frames(len(frame_ids))
        else:
            frame_ids = np.arange(f + 1)
            visible = visible_all[: f + 1, : f + 1]
        token_frame = np.repeat(np.arange(len(frame_ids)), cfg.tokens_per_frame)
        visible_tokens = visible[token_frame][:, token_frame]  # [tokens, tokens]
        cos, sin = rope_angles(cfg, np.concatenate([frame_coords(cfg, int(t)) for t in frame_ids]))
        sigmas = np.zeros(len(frame_ids), np.float32)
        x = noise[f, 0]
        for step in range(cfg.steps):
            sigmas[-1] = cfg.sigmas[step]
            inputs = np.concatenate([latents[frame_ids[:-1]], x[None]])  # [frames_in, tokens, channels]
            h = embed(weights, cfg, inputs, sigmas, fc)
            for w in weights.layers:
                q, k, v = project_qkv(h, w, cfg, cos, sin, fc)
                h = attention_ffn(h, q, k, v, visible_tokens, w, fc)
            x0 = predict_clean(weights, h[-cfg.tokens_per_frame :], fc)
            if step + 1 < cfg.steps:
                x = renoise(cfg, x0, noise[f, step + 1], step + 1)
        latents[f] = x0
    return latents


def _check_noise(cfg: VideoConfig, noise: np.ndarray) -> None:
    expected = (cfg.frames, cfg.steps, cfg.tokens_per_frame, cfg.channels)
    if getattr(noise, "shape", None) != expected:
        raise ValueError(
            f"`noise` must have shape {list(expected)} [frames, steps, tokens, channels], "
            f"got {list(getattr(noise, 'shape', [])) or type(noise).__name__}"
        )
