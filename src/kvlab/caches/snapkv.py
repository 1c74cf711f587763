"""``SnapKVCache``: SnapKV prefill compression (arXiv:2404.14469) — the prompt's K/V cut down to the tokens its last
queries attend to, per KV head, with the bytes really freed.

SnapKV section 4 (Algorithm 1): the last ``window_size`` queries of the prompt (the *observation window*) vote for the
prompt tokens before them: their attention weights (softmax over the causal prompt) are summed over the window,
pooled along the tokens (``kernel_size``, max pooling, so that a selected token keeps its neighbours: section 4.2
"clustering via pooling"), and averaged over the query heads of each KV head (GQA). Each KV head keeps its
top-scoring prompt tokens and the observation window; the other tokens' K/V are dropped, so the stored tensors
shrink to ``kept`` tokens (a new, smaller tensor per layer: the prompt's full K/V are freed). Decoding then appends
to the compressed cache as ``DynamicCache`` does. The defaults (window 32, kernel 7, max pooling) are SnapKV's
reference configuration; kvpress's ``SnapKVPress`` uses window 64, kernel 5 and average pooling.

**Getting the scores.** transformers hands a cache the keys and values, never the queries. kvpress recomputes the
window's queries from the attention module's input hidden states in a forward hook (``q_proj``, norm, RoPE: model
specific). This cache instead reads the queries the model already computed: with :func:`kvlab.attention.enable`
the model runs kvlab's attention function, which after the prefill's (unchanged, SDPA) attention hands this layer
its ``query`` states (:func:`kvlab.attention.interface.observers`); no projection is recomputed and any model
whose attention goes through transformers' ``AttentionInterface`` works. The scores are computed once per layer,
at the prefill, from the float prompt keys: nothing is quantized then, so no float copy of a quantized history is
built (the composition with KIVI compresses before KIVI quantizes anything). A model not running kvlab attention
is refused at the next layer's update.

**Positions.** Kept tokens keep their original positions (their keys are not re-rotated) and the next token's
position is the prompt length (``get_seq_length()`` counts every token seen): SnapKV drops context, not positions.
Rows of a batch must be unpadded (as for :class:`~kvlab.caches.sink.SinkCache`): a padded batch is refused when
the prompt is compressed (:class:`kvlab.caches._rows.PaddingCheck`).

Usage::

    kvlab.attention.enable(model)
    cache = SnapKVCache(compression_ratio=0.5)         # or token_budget=1024
    model.generate(input_ids, cache=cache, max_new_tokens=64)
    cache.nbytes()  # about half the prompt's bytes + the decoded tokens
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from transformers.cache_utils import Cache

from kvlab.caches.base import check_full_attention
from kvlab.caches.scorer import ScorerCache, ScorerLayer

POOLING = ("max", "avg")


@dataclass(frozen=True)
class SnapKVConfig:
    """How many prompt tokens SnapKV keeps and how it scores them.

    Raises:
        ValueError: both or neither of ``compression_ratio`` / ``token_budget``; a ratio outside ``(0, 1)``; a
            budget, window or kernel below 1; an even kernel; an unknown pooling (each value named).
    """

    compression_ratio: float | None = (
        None  # fraction of the prompt's tokens dropped, in (0, 1) (kvpress's meaning)
    )
    token_budget: int | None = None  # or: prompt tokens kept per KV head (the window included)
    window_size: int = 32  # observation window: the prompt's last queries, always kept
    kernel_size: int = 7  # pooling kernel along the tokens (odd: centred)
    pooling: str = "max"  # "max" (SnapKV) or "avg" (kvpress)

    def __post_init__(self) -> None:
        if (self.compression_ratio is None) == (self.token_budget is None):
            raise ValueError(
                f"give exactly one of `compression_ratio` and `token_budget`, got {self.compression_ratio!r} "
                f"and {self.token_budget!r}"
            )
        r = self.compression_ratio
        if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r < 1):
            raise ValueError(f"`compression_ratio` must be in (0, 1), got {r!r}")
        for name in ("token_budget", "window_size", "kernel_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"`{name}` must be an int >= 1, got {value!r}")
        if self.kernel_size % 2 == 0:
            raise ValueError(f"`kernel_size` must be odd (a centred window), got {self.kernel_size}")
        if self.pooling not in POOLING:
            raise ValueError(f"`pooling` must be one of {list(POOLING)}, got {self.pooling!r}")

    def budget_text(self) -> str:
        """What is kept, as a ``repr`` names it: ``"token_budget=512"`` or ``"compression_ratio=0.5"`` (exactly one
        is set)."""
        if self.token_budget is not None:
            return f"token_budget={self.token_budget}"
        return f"compression_ratio={self.compression_ratio}"

    def check_budget_covers_window(self) -> None:
        """Raise ``ValueError`` for a ``token_budget`` below ``window_size``: SnapKV always keeps its observation
        window, so such a budget would silently keep ``window_size`` tokens instead (TOVA, which has no window,
        does not call this)."""
        if self.token_budget is not None and self.token_budget < self.window_size:
            raise ValueError(
                f"`token_budget` ({self.token_budget}) must be at least `window_size` ({self.window_size}): SnapKV "
                f"always keeps its observation window"
            )

    def kept_tokens(self, prompt_tokens: int) -> int:
        """Prompt tokens kept per KV head: ``prompt - int(prompt * ratio)`` or the budget, never fewer than the
        observation window (nor more than the prompt)."""
        if self.compression_ratio is not None:
            kept = prompt_tokens - int(prompt_tokens * self.compression_ratio)
        else:
            kept = self.token_budget
        return min(prompt_tokens, max(kept, self.window_size))


def snapkv_scores(
    query_window: torch.Tensor, keys: torch.Tensor, scale: float, kernel_size: int = 7, pooling: str = "max"
) -> torch.Tensor:
    """SnapKV's votes of the observation window for the prompt tokens before it, per KV head.

    Args:
        query_window: ``[batch, q_heads, w, head_dim]``: the prompt's last ``w`` queries (RoPE applied).
        keys: ``[batch, kv_heads, tokens, head_dim]``: every prompt key (RoPE applied), ``tokens > w``;
            ``q_heads`` a multiple of ``kv_heads``.
        scale: the attention's softmax scale (``head_dim ** -0.5`` for most models).
        kernel_size, pooling: the pooling along the tokens (odd kernel; ``"max"`` or ``"avg"``).

    Returns:
        ``[batch, kv_heads, tokens - w]`` float32 scores: causal softmax weights of the window's queries summed over
        the window, pooled, averaged over the query heads sharing each KV head.

    Raises:
        ValueError: ``tokens <= w`` or heads that do not group.

    Source: SnapKV (arXiv:2404.14469) section 4.2, Algorithm 1 (``attn_weights.sum(dim=-2)``, ``pool1d``); GQA averaging as
    kvpress's ``SnapKVPress.score``.
    """
    b, hq, w, d = query_window.shape
    hkv, tokens = keys.shape[1], keys.shape[2]
    if tokens <= w or hq % hkv:
        raise ValueError(f"need tokens > window and q_heads % kv_heads == 0, got {tokens}, {w}, {hq}, {hkv}")
    k = keys.float().repeat_interleave(hq // hkv, dim=1)  # [B, Hkv, T, D] -> [B, Hq, T, D]
    logits = query_window.float() @ k.transpose(-1, -2) * scale  # [B, Hq, w, T]
    future = (
        torch.arange(tokens, device=keys.device)[None, :]
        > torch.arange(tokens - w, tokens, device=keys.device)[:, None]
    )
    logits = logits.masked_fill(future, float("-inf"))  # query i (position T - w + i) sees keys <= T - w + i
    votes = logits.softmax(dim=-1)[..., : tokens - w].sum(dim=-2)  # [B, Hq, T - w]
    pool = torch.nn.functional.max_pool1d if pooling == "max" else torch.nn.functional.avg_pool1d
    kwargs = {"count_include_pad": False} if pooling == "avg" else {}
    pooled = pool(votes.reshape(b * hq, 1, -1), kernel_size, stride=1, padding=kernel_size // 2, **kwargs)
    return pooled.reshape(b, hkv, hq // hkv, tokens - w).mean(dim=2)  # [B, Hkv, T - w]


def keep_indices(scores: torch.Tensor, kept: int, window: int) -> torch.Tensor:
    """Token indices kept per KV head, ascending: the ``kept - window`` best-scored prompt tokens, then the window.

    Args:
        scores: ``[batch, kv_heads, tokens - window]`` (:func:`snapkv_scores`).
        kept: tokens kept per head, ``window <= kept <= tokens``.
        window: the observation window (always kept).

    Returns:
        ``[batch, kv_heads, kept]`` int64 indices into the prompt's ``tokens``.
    """
    b, h, prefix = scores.shape
    top = scores.topk(kept - window, dim=-1).indices.sort(dim=-1).values  # [B, H, kept - window]
    tail = torch.arange(prefix, prefix + window, device=scores.device).expand(b, h, window)
    return torch.cat((top, tail), dim=-1)


def snapkv_keep(query: torch.Tensor, keys: torch.Tensor, config: SnapKVConfig, scale: float) -> torch.Tensor:
    """The prompt tokens SnapKV keeps per KV head: ``[batch, kv_heads, kept]`` ascending indices, from the
    prompt's queries ``[B, Hq, prompt, D]`` and keys ``[B, H, prompt, D]`` (:func:`snapkv_scores`,
    :func:`keep_indices`; ``kept`` = :meth:`SnapKVConfig.kept_tokens`)."""
    kept, w = config.kept_tokens(keys.shape[-2]), min(config.window_size, query.shape[-2])
    scores = snapkv_scores(query[..., -w:, :], keys, scale, config.kernel_size, config.pooling)
    return keep_indices(scores, kept, w)


class SnapKVLayer(ScorerLayer):
    """One layer of :class:`SnapKVCache`: ``keys``/``values`` ``[batch, kv_heads, tokens, head_dim]``; after the
    prefill, ``tokens`` is the prompt's kept tokens (each KV head its own) plus the decoded ones."""

    cache_name = "SnapKVCache"  # named in errors

    def _wants_query(self) -> bool:
        """Only the prompt (the first forward) is scored, when it holds more tokens than SnapKV keeps."""
        if self.compressed:
            return False
        self.compressed = True
        return self.config.kept_tokens(self.keys.shape[-2]) < self.keys.shape[-2]

    def _kept(self, tokens: int) -> int:
        return self.config.kept_tokens(tokens)

    def keep(self, query: torch.Tensor, scale: float, kept: int) -> torch.Tensor:
        """SnapKV's choice per KV head (:func:`snapkv_keep`): ``[B, H, kept]``."""
        return snapkv_keep(query, self.keys, self.config, scale)


class SnapKVCache(ScorerCache, Cache):
    """SnapKV: the prompt's K/V compressed once, after the prefill, per KV head; decoding appends.

    Args:
        compression_ratio: fraction of prompt tokens dropped, in ``(0, 1)``; or
        token_budget: prompt tokens kept per KV head (give exactly one).
        window_size, kernel_size, pooling: see :class:`SnapKVConfig`.
        config: optional model config; a model with non-full-attention layers is refused.

    Raises:
        ValueError: as :class:`SnapKVConfig`; a sliding-window model (with ``config``); during ``generate``, a
            left-padded batch whose prompt would be compressed (the padded rows named; docs/EVICTION.md).
        RuntimeError: at the second layer's update, a model not running :func:`kvlab.attention.enable`.

    Source: SnapKV (arXiv:2404.14469) section 4; layout after kvpress's ``snapkv_press.py`` (one method per file).
    """

    keeps_window = True  # SnapKV always keeps the observation window: a smaller token_budget is refused

    def __init__(
        self,
        compression_ratio: float | None = None,
        token_budget: int | None = None,
        window_size: int = 32,
        kernel_size: int = 7,
        pooling: str = "max",
        config: Any = None,
    ):
        self.snapkv_config = SnapKVConfig(compression_ratio, token_budget, window_size, kernel_size, pooling)
        if self.keeps_window:
            self.snapkv_config.check_budget_covers_window()
        if config is not None:
            check_full_attention(config, "SnapKVCache")
        super().__init__(layer_class_to_replicate=partial(SnapKVLayer, self.snapkv_config))

    def __repr__(self) -> str:
        c = self.snapkv_config
        return f"SnapKVCache({c.budget_text()}, window_size={c.window_size})"
