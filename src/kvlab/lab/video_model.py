"""A toy block-autoregressive video denoiser in numpy, fp32 (docs/lab.md, "kvlab lab video").

Frames of ``height x width`` latent tokens with ``channels`` values each are generated one frame (one block) at a
time. Inside a frame attention is bidirectional, across frames it is causal; each frame is denoised in ``steps``
steps with CausVid's few-step sampler (Yin et al., arXiv:2412.07772; the same in Self-Forcing, Huang et al.,
arXiv:2506.08009): predict the clean latent, re-noise it to the next noise level with fresh noise
(flow matching: ``x = (1 - sigma) * x0 + sigma * noise``), repeat. The noise level reaches every token as a
sinusoidal timestep embedding added to its input (real models modulate with it, AdaLN; adding it is enough to make
the condition part of every K/V). Positions are 3D RoPE from explicit ``(t, h, w)`` coordinates, the head
dimension split between the axes as Wan 2.1 splits it (``rope_apply``: of ``c = head_dim / 2`` rotation pairs,
``c // 3`` for h, ``c // 3`` for w, the rest for t).

Per layer: ``x += Attn(rmsnorm(x))``, ``x += relu(rmsnorm(x) @ w1) @ w2``; grouped-query attention (``q_heads``
query heads share ``kv_heads`` K/V heads); ``w_in`` maps a latent token to the model width, ``w_out`` maps the
last hidden state back to a predicted clean latent. The two ways of running it — a full forward over every frame
under a frame-visibility mask, and the current block against a frame KV cache — are in
:mod:`kvlab.lab.video_cache`. Every matrix product goes through :class:`FlopCounter` so the FLOPs of a run are
counted as they are spent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvlab.lab.toy import HeadShape
from kvlab.runtime.checks import check_int


@dataclass(frozen=True)
class VideoConfig(HeadShape):
    """Shape of the toy video denoiser and of its generation run.

    Raises:
        ValueError: a size that is not a positive int (a seed that is not an int >= 0), ``q_heads`` not a
            multiple of ``kv_heads``, a ``head_dim`` that is odd or gives an axis no RoPE pair (< 6), a
            ``rope_theta`` that is not a finite number > 1.
    """

    frames: int = 12  # latent frames generated, one block each
    height: int = 4  # latent tokens per frame, vertically
    width: int = 4  # latent tokens per frame, horizontally
    channels: int = 8  # latent values per token
    steps: int = 4  # denoising steps per frame
    n_layers: int = 3  # transformer blocks
    q_heads: int = 4  # query heads
    kv_heads: int = 2  # K/V heads (GQA group q_heads / kv_heads)
    head_dim: int = 32  # channels per head, split between the t, h, w rotary axes
    ffn_mult: int = 4  # FFN width / model width
    window_frames: int = 3  # history frames kept besides the sink when the cache evicts
    rope_theta: float = 10000.0  # RoPE base of every axis
    weight_seed: int = 0  # numpy Generator seed of the weights
    noise_seed: int = 1  # numpy Generator seed of the initial and re-noising noise

    def __post_init__(self) -> None:
        for name in (
            "frames",
            "height",
            "width",
            "channels",
            "steps",
            "n_layers",
            "q_heads",
            "kv_heads",
            "head_dim",
            "ffn_mult",
            "window_frames",
        ):
            check_int(name, getattr(self, name), 1)
        check_int("weight_seed", self.weight_seed, 0)
        check_int("noise_seed", self.noise_seed, 0)
        self._check_heads()
        if self.head_dim % 2 or self.head_dim < 6:
            raise ValueError(
                f"`head_dim` must be even and >= 6 (one rotary pair per t, h, w axis), got {self.head_dim!r}"
            )
        theta = self.rope_theta
        if (
            isinstance(theta, bool)
            or not isinstance(theta, int | float)
            or not math.isfinite(theta)
            or theta <= 1
        ):
            raise ValueError(f"`rope_theta` must be a finite number > 1, got {theta!r}")

    @property
    def tokens_per_frame(self) -> int:
        """Tokens of one latent frame, ``height * width``."""
        return self.height * self.width

    @property
    def rope_pairs(self) -> tuple[int, int, int]:
        """Rotation pairs of the ``(t, h, w)`` axes: Wan 2.1's split of ``c = head_dim / 2`` pairs into
        ``(c - 2 * (c // 3), c // 3, c // 3)`` (32 channels: 6, 5, 5 pairs = 12, 10, 10 channels)."""
        c = self.head_dim // 2
        return (c - 2 * (c // 3), c // 3, c // 3)

    @property
    def sigmas(self) -> np.ndarray:
        """Noise level of each denoising step, ``[steps]``: ``1, 1 - 1/S, ..., 1/S`` (4 steps: 1, .75, .5, .25,
        Self-Forcing's timesteps 1000, 750, 500, 250 over 1000)."""
        return (1.0 - np.arange(self.steps) / self.steps).astype(np.float32)

    @property
    def kv_bytes_per_token(self) -> int:
        """Cached bytes per token, all layers, fp32: ``2 * n_layers * kv_heads * head_dim * 4``."""
        return 2 * self.n_layers * self.kv_heads * self.head_dim * 4

    @property
    def kv_bytes_per_frame(self) -> int:
        """Cached bytes of one frame, all layers, fp32: ``kv_bytes_per_token * tokens_per_frame``."""
        return self.kv_bytes_per_token * self.tokens_per_frame

    def model_config(self) -> dict:
        """A transformers-style ``config.json`` of this denoiser's attention, for ``kvlab video --model``: the
        planner reads the same layers, heads, head_dim and dtype (fp32) and must size the same KV bytes."""
        return {
            "model_type": "llama",
            "architectures": ["ToyVideoDenoiser"],
            "num_hidden_layers": self.n_layers,
            "hidden_size": self.d_model,
            "num_attention_heads": self.q_heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.ffn_width,
            "vocab_size": self.channels,
            "torch_dtype": "float32",
        }


class FlopCounter:
    """Runs matrix products and counts their FLOPs: 2 per multiply-add, ``2 * out.size * a.shape[-1]``
    (as :mod:`kvlab.lab.flops`; elementwise work, norms and softmax are not counted)."""

    def __init__(self) -> None:
        self.flops = 0  # FLOPs of every product run so far

    def mm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b`` (batched as numpy broadcasts it), counted."""
        out = a @ b
        self.flops += 2 * out.size * a.shape[-1]
        return out


@dataclass(frozen=True)
class VideoWeights:
    """Weights of the toy denoiser, fp32. ``layers[i]`` maps ``wq wk wv wo w1 w2`` to matrices:
    ``wq, wo: [d_model, d_model]``, ``wk, wv: [d_model, kv_width]``, ``w1: [d_model, ffn]``, ``w2: [ffn, d_model]``.
    """

    layers: tuple[dict[str, np.ndarray], ...]
    w_in: np.ndarray  # [channels, d_model]: latent token -> model width
    w_out: np.ndarray  # [d_model, channels]: last hidden state -> predicted clean latent


def make_weights(cfg: VideoConfig) -> VideoWeights:
    """Draw N(0, 1/sqrt(fan_in)) weights from ``default_rng(cfg.weight_seed)`` (per layer wq, wk, wv, wo, w1, w2;
    then w_in, w_out)."""
    rng = np.random.default_rng(cfg.weight_seed)
    d, kv, ffn, c = cfg.d_model, cfg.kv_width, cfg.ffn_width, cfg.channels
    shapes = {"wq": (d, d), "wk": (d, kv), "wv": (d, kv), "wo": (d, d), "w1": (d, ffn), "w2": (ffn, d)}
    layers = tuple(
        {name: rng.normal(0.0, 1 / math.sqrt(s[0]), s).astype(np.float32) for name, s in shapes.items()}
        for _ in range(cfg.n_layers)
    )
    w_in = rng.normal(0.0, 1 / math.sqrt(c), (c, d)).astype(np.float32)
    w_out = rng.normal(0.0, 1 / math.sqrt(d), (d, c)).astype(np.float32)
    return VideoWeights(layers, w_in, w_out)


def make_noise(cfg: VideoConfig) -> np.ndarray:
    """Every Gaussian the sampler draws, ``[frames, steps, tokens_per_frame, channels]`` fp32 from
    ``default_rng(cfg.noise_seed)``: ``[f, 0]`` is frame ``f``'s starting noise, ``[f, s]`` (``s >= 1``) the fresh
    noise of the re-noising before step ``s``. Drawn up front so every generator sees the same noise."""
    rng = np.random.default_rng(cfg.noise_seed)
    shape = (cfg.frames, cfg.steps, cfg.tokens_per_frame, cfg.channels)
    return rng.standard_normal(shape).astype(np.float32)


def frame_coords(cfg: VideoConfig, t: int) -> np.ndarray:
    """``(t, h, w)`` of every token of the frame at logical time ``t``, ``[tokens_per_frame, 3]`` int64, raster
    order (``h`` major). ``t`` is the frame's index in the whole video, kept after eviction (3D RoPE needs
    time/height/width coordinates that the cache length cannot supply).

    Raises:
        ValueError: ``t`` is not an int >= 0.
    """
    check_int("t", t, 0)
    h, w = np.meshgrid(np.arange(cfg.height), np.arange(cfg.width), indexing="ij")
    coords = np.empty((cfg.tokens_per_frame, 3), np.int64)
    coords[:, 0], coords[:, 1], coords[:, 2] = t, h.ravel(), w.ravel()
    return coords


def rope_angles(cfg: VideoConfig, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cosines and sines of 3D RoPE, each ``[tokens, head_dim // 2]`` fp32, for ``coords: [tokens, 3]``.

    Axis ``a`` with ``n_a`` pairs (:attr:`VideoConfig.rope_pairs`) rotates its pair ``i`` by
    ``coords[:, a] * theta ** (-i / n_a)``, as Wan 2.1's ``rope_params`` with the axis's own channel count; the
    angles are computed in float64, then rounded once.

    Raises:
        ValueError: ``coords`` is not ``[tokens, 3]``.
    """
    if getattr(coords, "ndim", None) != 2 or coords.shape[1] != 3:
        raise ValueError(
            f"`coords` must be [tokens, 3] (t, h, w), got shape {getattr(coords, 'shape', None)}"
        )
    parts = []
    for axis, pairs in enumerate(cfg.rope_pairs):
        inv_freq = cfg.rope_theta ** (-np.arange(pairs, dtype=np.float64) / pairs)
        parts.append(coords[:, axis, None].astype(np.float64) * inv_freq)  # [tokens, pairs]
    angles = np.concatenate(parts, axis=1)  # [tokens, head_dim // 2]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate adjacent channel pairs ``(x[2i], x[2i+1])`` of ``x: [tokens, heads, head_dim]`` by the angles of
    :func:`rope_angles` (``cos, sin: [tokens, head_dim // 2]``); returns a new ``[tokens, heads, head_dim]``."""
    a, b = x[..., 0::2], x[..., 1::2]  # [tokens, heads, head_dim // 2]
    cos, sin = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def timestep_embedding(cfg: VideoConfig, sigma: float) -> np.ndarray:
    """Sinusoidal embedding ``[d_model]`` fp32 of the timestep ``1000 * sigma`` (Wan 2.1's
    ``sinusoidal_embedding_1d``: cosines then sines of ``timestep * 10000 ** (-i / half)``); a clean frame has
    ``sigma = 0``."""
    half = cfg.d_model // 2
    angle = 1000.0 * float(sigma) * 10000.0 ** (-np.arange(half, dtype=np.float64) / half)
    return np.concatenate([np.cos(angle), np.sin(angle), np.zeros(cfg.d_model % 2)]).astype(np.float32)


def rmsnorm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """RMS normalization over the last axis, no gain."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _softmax(scores: np.ndarray) -> np.ndarray:
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return scores / scores.sum(axis=-1, keepdims=True)


def embed(weights: VideoWeights, cfg: VideoConfig, latents: np.ndarray, sigmas: np.ndarray, fc: FlopCounter):
    """Input of the first layer for ``latents: [frames, tokens_per_frame, channels]`` at noise levels
    ``sigmas: [frames]``: ``latent @ w_in + timestep_embedding(sigma)`` -> ``[frames * tokens_per_frame, d_model]``."""
    frames = latents.shape[0]
    h = fc.mm(latents.reshape(frames * cfg.tokens_per_frame, cfg.channels), weights.w_in)
    temb = np.stack([timestep_embedding(cfg, s) for s in sigmas])  # [frames, d_model]
    return h + np.repeat(temb, cfg.tokens_per_frame, axis=0)


def project_qkv(h, w, cfg: VideoConfig, cos, sin, fc: FlopCounter, *, need_q: bool = True):
    """Q, K, V of ``h: [tokens, d_model]`` with RoPE applied to Q and K.

    Returns ``q: [tokens, q_heads, head_dim]`` (``None`` when not ``need_q``) and ``k, v: [kv_heads, tokens,
    head_dim]``; ``cos, sin: [tokens, head_dim // 2]`` from :func:`rope_angles` of the tokens' coordinates.
    """
    n = h.shape[0]
    x = rmsnorm(h)
    k = apply_rope(fc.mm(x, w["wk"]).reshape(n, cfg.kv_heads, cfg.head_dim), cos, sin).transpose(1, 0, 2)
    v = fc.mm(x, w["wv"]).reshape(n, cfg.kv_heads, cfg.head_dim).transpose(1, 0, 2)  # -> [kv_heads, n, hd]
    q = None
    if need_q:
        q = apply_rope(fc.mm(x, w["wq"]).reshape(n, cfg.q_heads, cfg.head_dim), cos, sin)
    return q, k, v


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray | None, fc: FlopCounter):
    """GQA attention, dense scores then masked (the FLOP count assumes it).

    ``q: [q_tokens, q_heads, head_dim]``, ``k, v: [kv_heads, k_tokens, head_dim]``, ``visible: [q_tokens,
    k_tokens]`` bool or ``None`` (every key visible) -> ``[q_tokens, q_heads * head_dim]``.
    """
    nq, q_heads, head_dim = q.shape
    kv_heads = k.shape[0]
    q = q.reshape(nq, kv_heads, q_heads // kv_heads, head_dim).transpose(1, 2, 0, 3)  # -> [kvh, g, nq, hd]
    scores = fc.mm(q, k[:, None].transpose(0, 1, 3, 2)) / np.float32(math.sqrt(head_dim))  # [kvh, g, nq, nk]
    if visible is not None:
        scores = np.where(visible, scores, -np.inf)
    out = fc.mm(_softmax(scores), v[:, None])  # [kvh, g, nq, hd]
    return out.transpose(2, 0, 1, 3).reshape(nq, q_heads * head_dim)


def attention_ffn(h, q, k, v, visible, w, fc: FlopCounter) -> np.ndarray:
    """The rest of a layer after Q/K/V: ``h += attend(q, k, v) @ wo``, then ``h += relu(rmsnorm(h) @ w1) @ w2``;
    ``h: [tokens, d_model] -> [tokens, d_model]``."""
    h = h + fc.mm(attend(q, k, v, visible, fc), w["wo"])
    return h + fc.mm(np.maximum(fc.mm(rmsnorm(h), w["w1"]), 0.0), w["w2"])


def predict_clean(weights: VideoWeights, h: np.ndarray, fc: FlopCounter) -> np.ndarray:
    """Predicted clean latent of the last hidden states ``h: [tokens, d_model]`` -> ``[tokens, channels]``."""
    return fc.mm(rmsnorm(h), weights.w_out)


def renoise(cfg: VideoConfig, x0: np.ndarray, noise: np.ndarray, step: int) -> np.ndarray:
    """Input of denoising step ``step >= 1``: the prediction ``x0`` re-noised to that step's level with fresh
    noise, ``(1 - sigma) * x0 + sigma * noise`` (flow matching, as CausVid's and Self-Forcing's samplers do)."""
    sigma = cfg.sigmas[step]
    return (np.float32(1.0) - sigma) * x0 + sigma * noise
