"""The toy decoder of ``kvlab lab`` (docs/lab.md) in numpy, fp32.

A pre-norm decoder without positional encoding: per layer ``x += Attn(rmsnorm(x))`` then
``x += relu(x @ w1) @ w2``; grouped-query attention (``q_heads`` query heads share ``kv_heads`` KV heads);
an embedding table in, one output head out. It exists to show one fact: decoding with a KV cache (prefill,
then one token per step against cached K/V) computes the same thing as recomputing the whole prefix at every
step. Two generators do exactly that, :func:`generate_naive` and :func:`generate_cached`.

GQA is computed by reshaping the queries into ``[kv_heads, group, ...]`` against the shared K/V, so no KV
head is copied (the mechanics chapter's ``np.repeat`` copies them; the FLOPs are the same).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvlab.runtime.checks import check_int


class HeadShape:
    """The widths of a decoder config with ``q_heads`` query heads and ``kv_heads`` K/V heads of ``head_dim``
    channels and an FFN ``ffn_mult`` times the model width (a mixin of the toy decoder's and the toy video
    denoiser's frozen configs)."""

    def _check_heads(self) -> None:
        """Raises ValueError: ``q_heads`` not a multiple of ``kv_heads`` (GQA shares each K/V head by a group)."""
        if self.q_heads % self.kv_heads:
            raise ValueError(
                f"`q_heads` ({self.q_heads}) must be a multiple of `kv_heads`, got {self.kv_heads!r}"
            )

    @property
    def d_model(self) -> int:
        """Model width ``q_heads * head_dim``."""
        return self.q_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of the K (or V) projection, ``kv_heads * head_dim``."""
        return self.kv_heads * self.head_dim

    @property
    def ffn_width(self) -> int:
        """Hidden width of the FFN, ``ffn_mult * d_model``."""
        return self.ffn_mult * self.d_model

    @property
    def group_size(self) -> int:
        """GQA group ``g = q_heads / kv_heads``."""
        return self.q_heads // self.kv_heads


@dataclass(frozen=True)
class ToyConfig(HeadShape):
    """Shape of the toy decoder and of its generation run; defaults are the mechanics chapter's ``CFG`` (appendix [A]).

    Raises:
        ValueError: a field is not a positive int, or ``q_heads`` is not a multiple of ``kv_heads``.
    """

    n_layers: int = 4  # decoder blocks
    q_heads: int = 8  # query heads
    kv_heads: int = 2  # KV heads; == q_heads is MHA, 1 is MQA
    head_dim: int = 32  # channels per head
    ffn_mult: int = 4  # FFN width / model width
    prompt_tokens: int = 16  # prompt length
    new_tokens: int = 192  # tokens generated
    vocab_size: int = 32  # embedding rows and output-head columns
    weight_seed: int = 0  # numpy Generator seed of the weights
    prompt_seed: int = 7  # numpy Generator seed of the prompt

    def __post_init__(self) -> None:
        for name in (
            "n_layers",
            "q_heads",
            "kv_heads",
            "head_dim",
            "ffn_mult",
            "prompt_tokens",
            "new_tokens",
            "vocab_size",
        ):
            check_int(name, getattr(self, name), 1)
        self._check_heads()

    @property
    def max_tokens(self) -> int:
        """Prompt plus generated tokens: the preallocated cache length."""
        return self.prompt_tokens + self.new_tokens

    @property
    def kv_bytes_per_token(self) -> int:
        """Cached bytes per token, all layers, fp32: ``2 * n_layers * kv_heads * head_dim * 4``."""
        return 2 * self.n_layers * self.kv_heads * self.head_dim * 4


def peak_bytes(cfg: ToyConfig) -> int:
    """About the most memory the toy lab holds at once for ``cfg``: the preallocated caches (``max_tokens`` x
    ``kv_bytes_per_token``) and the reference forward's causal attention over ``max_tokens`` tokens (scores, masked
    scores and probabilities in float32 per query head, and the boolean mask)."""
    t = cfg.max_tokens
    return t * cfg.kv_bytes_per_token + 3 * cfg.q_heads * t * t * 4 + t * t


@dataclass(frozen=True)
class ToyWeights:
    """Weights of the toy decoder, fp32. ``layers[i]`` maps ``wq wk wv wo w1 w2`` to matrices:
    ``wq, wo: [d_model, d_model]``, ``wk, wv: [d_model, kv_width]``, ``w1: [d_model, ffn]``, ``w2: [ffn, d_model]``.
    """

    layers: tuple[dict[str, np.ndarray], ...]
    embedding: np.ndarray  # [vocab, d_model]
    head: np.ndarray  # [d_model, vocab]


def make_weights(cfg: ToyConfig) -> ToyWeights:
    """Draw N(0, 1/sqrt(d_model)) weights from ``default_rng(cfg.weight_seed)`` in the mechanics chapter's order
    (per layer wq, wk, wv, wo, w1, w2; then embedding, then head), so the mechanics chapter's run is reproduced."""
    rng = np.random.default_rng(cfg.weight_seed)
    d, kv, ffn = cfg.d_model, cfg.kv_width, cfg.ffn_width
    std = 1.0 / math.sqrt(d)
    shapes = {"wq": (d, d), "wk": (d, kv), "wv": (d, kv), "wo": (d, d), "w1": (d, ffn), "w2": (ffn, d)}
    layers = tuple(
        {name: rng.normal(0.0, std, shape).astype(np.float32) for name, shape in shapes.items()}
        for _ in range(cfg.n_layers)
    )
    embedding = rng.normal(0.0, std, (cfg.vocab_size, d)).astype(np.float32)
    head = rng.normal(0.0, std, (d, cfg.vocab_size)).astype(np.float32)
    return ToyWeights(layers, embedding, head)


def make_prompt(cfg: ToyConfig) -> list[int]:
    """``cfg.prompt_tokens`` token ids drawn uniformly from the vocabulary by ``default_rng(cfg.prompt_seed)``."""
    rng = np.random.default_rng(cfg.prompt_seed)
    return [int(t) for t in rng.integers(0, cfg.vocab_size, cfg.prompt_tokens)]


def rmsnorm(x: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """RMS normalization over the last axis, no gain."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _softmax(scores: np.ndarray) -> np.ndarray:
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return scores / scores.sum(axis=-1, keepdims=True)


def attention_full(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal GQA attention over a whole prefix, dense scores then masked (as the FLOP count assumes).

    ``q: [tokens, q_heads, head_dim]``, ``k, v: [kv_heads, tokens, head_dim]`` -> ``[tokens, q_heads * head_dim]``.
    """
    tokens, q_heads, head_dim = q.shape
    kv_heads = k.shape[0]
    group = q_heads // kv_heads
    q = q.reshape(tokens, kv_heads, group, head_dim).transpose(
        1, 2, 0, 3
    )  # -> [kv_heads, group, tokens, head_dim]
    scores = q @ k[:, None].transpose(0, 1, 3, 2) / np.float32(math.sqrt(head_dim))  # [kv_heads, group, t, t]
    future = np.triu(np.ones((tokens, tokens), dtype=bool), 1)
    probs = _softmax(np.where(future, -np.inf, scores))
    out = probs @ v[:, None]  # [kv_heads, group, tokens, head_dim]
    return out.transpose(2, 0, 1, 3).reshape(tokens, q_heads * head_dim)


def attention_step(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """One decode query against the cache (only ``q_t`` is new: earlier keys and values are read from the cache).

    ``q: [q_heads, head_dim]``, ``k, v: [kv_heads, tokens, head_dim]`` -> ``[q_heads * head_dim]``.
    """
    q_heads, head_dim = q.shape
    kv_heads = k.shape[0]
    q = q.reshape(kv_heads, q_heads // kv_heads, head_dim)  # [kv_heads, group, head_dim]
    scores = q @ k.transpose(0, 2, 1) / np.float32(math.sqrt(head_dim))  # [kv_heads, group, tokens]
    return (_softmax(scores) @ v).reshape(q_heads * head_dim)


def _ffn(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    return x + np.maximum(x @ w["w1"], 0.0) @ w["w2"]


def block_forward(
    x: np.ndarray, w: dict[str, np.ndarray], cfg: ToyConfig, cache: dict | None = None
) -> np.ndarray:
    """One block over a whole prefix, ``x: [tokens, d_model] -> [tokens, d_model]``; when ``cache`` is given
    (``{"k", "v"}: [kv_heads, max_tokens, head_dim]``), its K/V are written to slots ``[0, tokens)`` (prefill)."""
    tokens = x.shape[0]
    h = rmsnorm(x)
    q = (h @ w["wq"]).reshape(tokens, cfg.q_heads, cfg.head_dim)
    k = (
        (h @ w["wk"]).reshape(tokens, cfg.kv_heads, cfg.head_dim).transpose(1, 0, 2)
    )  # -> [kv_heads, t, head_dim]
    v = (h @ w["wv"]).reshape(tokens, cfg.kv_heads, cfg.head_dim).transpose(1, 0, 2)
    if cache is not None:
        cache["k"][:, :tokens] = k
        cache["v"][:, :tokens] = v
    x = x + attention_full(q, k, v) @ w["wo"]
    return _ffn(x, w)


def block_step(x: np.ndarray, w: dict[str, np.ndarray], cfg: ToyConfig, cache: dict, pos: int) -> np.ndarray:
    """One block for one new token at position ``pos``, ``x: [d_model] -> [d_model]``: its K/V are written in
    place to slot ``pos`` of the preallocated cache, then its query reads slots ``[0, pos]``."""
    h = rmsnorm(x)
    q = (h @ w["wq"]).reshape(cfg.q_heads, cfg.head_dim)
    cache["k"][:, pos] = (h @ w["wk"]).reshape(cfg.kv_heads, cfg.head_dim)
    cache["v"][:, pos] = (h @ w["wv"]).reshape(cfg.kv_heads, cfg.head_dim)
    x = x + attention_step(q, cache["k"][:, : pos + 1], cache["v"][:, : pos + 1]) @ w["wo"]
    return _ffn(x, w)


def new_cache(cfg: ToyConfig, max_tokens: int | None = None) -> list[dict[str, np.ndarray]]:
    """Preallocated per-layer cache ``{"k", "v"}: [kv_heads, max_tokens, head_dim]`` of fp32 zeros
    (``max_tokens`` defaults to ``cfg.max_tokens``)."""
    shape = (cfg.kv_heads, cfg.max_tokens if max_tokens is None else max_tokens, cfg.head_dim)
    return [{"k": np.zeros(shape, np.float32), "v": np.zeros(shape, np.float32)} for _ in range(cfg.n_layers)]


def full_forward_logits(weights: ToyWeights, cfg: ToyConfig, tokens: list[int]) -> np.ndarray:
    """Logits ``[vocab]`` at the last position of one full forward over ``tokens`` (no cache)."""
    h = weights.embedding[tokens]  # [tokens, d_model]
    for w in weights.layers:
        h = block_forward(h, w, cfg)
    return h[-1] @ weights.head


def generate_naive(weights: ToyWeights, cfg: ToyConfig, prompt: list[int]) -> tuple[list[int], np.ndarray]:
    """Greedy decoding by full recompute: every step runs the whole prefix again (O(S^3) work for S tokens).

    Returns the ``cfg.new_tokens`` generated ids and the logits ``[vocab]`` that chose the last one.
    """
    if not prompt:
        raise ValueError(f"`prompt` must hold at least one token, got {prompt!r}")
    tokens, generated, logits = list(prompt), [], None
    for _ in range(cfg.new_tokens):
        logits = full_forward_logits(weights, cfg, tokens)
        generated.append(int(np.argmax(logits)))
        tokens.append(generated[-1])
    return generated, logits


def generate_cached(weights: ToyWeights, cfg: ToyConfig, prompt: list[int]) -> tuple[list[int], np.ndarray]:
    """Greedy decoding with a preallocated KV cache: one prefill, then one token per step.

    The prefill already predicts the first new token, so ``new_tokens`` outputs need ``new_tokens - 1`` decode
    steps. Returns the generated ids and the logits ``[vocab]`` that chose the last one.
    """
    if not prompt:
        raise ValueError(f"`prompt` must hold at least one token, got {prompt!r}")
    cache = new_cache(cfg, len(prompt) + cfg.new_tokens)
    h = weights.embedding[prompt]
    for w, layer_cache in zip(weights.layers, cache):
        h = block_forward(h, w, cfg, layer_cache)
    logits = h[-1] @ weights.head
    generated = [int(np.argmax(logits))]
    for pos in range(len(prompt), len(prompt) + cfg.new_tokens - 1):
        x = weights.embedding[generated[-1]]
        for w, layer_cache in zip(weights.layers, cache):
            x = block_step(x, w, cfg, layer_cache, pos)
        logits = x @ weights.head
        generated.append(int(np.argmax(logits)))
    return generated, logits
