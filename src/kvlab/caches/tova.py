"""``TOVACache``: Token Omission Via Attention (arXiv:2401.06104), a decode-time eviction that frees its bytes.

TOVA section 3: after each step, while the cache holds more tokens than allowed, drop the tokens the *current* query
attends to least, the attention weights averaged over the layer's heads (one token set per layer, shared by its KV
heads). kvlab applies it after every forward: the prefill (scored by the prompt's last query, several tokens dropped
at once) and each decoded token (one token dropped once the cap is reached). The cap is a fixed ``token_budget``
(TOVA's multi-state size) or ``seen - int(seen * compression_ratio)`` tokens.

The query comes from kvlab attention (:func:`kvlab.attention.interface.observers`) through
:class:`~kvlab.caches.scorer.ScorerLayer`, as for :class:`~kvlab.caches.snapkv.SnapKVCache`; kept tokens keep their original positions; rows must be unpadded (a padded batch is refused
at its first eviction, :class:`kvlab.caches._rows.PaddingCheck`). ``get_seq_length()`` counts every token seen, not
the tokens held (:meth:`TOVACache.held_tokens`).

Usage::

    kvlab.attention.enable(model)
    cache = TOVACache(token_budget=512)
    model.generate(input_ids, cache=cache, max_new_tokens=2048)  # at most 512 tokens held per layer
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from transformers.cache_utils import Cache

from kvlab.caches.base import check_full_attention
from kvlab.caches.scorer import ScorerCache, ScorerLayer
from kvlab.caches.snapkv import SnapKVConfig


def tova_scores(query: torch.Tensor, keys: torch.Tensor, scale: float) -> torch.Tensor:
    """TOVA's scores: the last query's softmax weights over every held key, averaged over the query heads.

    Args:
        query: ``[batch, q_heads, q, head_dim]`` (the last row is the current query; it sees every key).
        keys: ``[batch, kv_heads, tokens, head_dim]``, ``q_heads`` a multiple of ``kv_heads``.
        scale: the attention's softmax scale.

    Returns:
        ``[batch, tokens]`` float32 weights (each row sums to 1).

    Source: TOVA (arXiv:2401.06104) section 3, "averaging across heads".
    """
    hq, hkv = query.shape[1], keys.shape[1]
    k = keys.float().repeat_interleave(hq // hkv, dim=1)  # [B, Hkv, T, D] -> [B, Hq, T, D]
    weights = (query[..., -1:, :].float() @ k.transpose(-1, -2) * scale).softmax(dim=-1)  # [B, Hq, 1, T]
    return weights[:, :, 0].mean(dim=1)  # [B, T]


class TOVALayer(ScorerLayer):
    """One layer of :class:`TOVACache`: ``keys``/``values`` ``[batch, kv_heads, <= cap, head_dim]`` between steps."""

    cache_name = "TOVACache"

    def cap(self) -> int:
        """Tokens allowed after this step: the budget, or the kept share of every token seen."""
        c = self.config
        if c.token_budget is not None:
            return c.token_budget
        return self.seen_tokens - int(self.seen_tokens * c.compression_ratio)

    def _wants_query(self) -> bool:
        """Every step that leaves the layer over its cap is scored."""
        return self.keys.shape[-2] > self.cap()

    def _kept(self, tokens: int) -> int:
        return self.cap()

    def keep(self, query: torch.Tensor, scale: float, kept: int) -> torch.Tensor:
        """The held tokens the current query attends to most: ``[B, 1, kept]``, the same for every KV head."""
        scores = tova_scores(query, self.keys, scale)  # [B, T]
        return scores.topk(kept, dim=-1).indices.sort(dim=-1).values[:, None]  # positions in order


class TOVACache(ScorerCache, Cache):
    """TOVA: after every step, the tokens the current query attends to least are dropped down to a cap.

    Args:
        token_budget: tokens held per layer between steps; or
        compression_ratio: in ``(0, 1)``: hold ``seen - int(seen * ratio)`` tokens (give exactly one).
        config: optional model config; a model with non-full-attention layers is refused.

    Raises:
        ValueError: both or neither of ``token_budget``/``compression_ratio``, a ratio outside ``(0, 1)``, a budget
            below 1 (named); a sliding-window model. During ``generate``: a left-padded batch at its first
            eviction (the padded rows named: a padded row would attend to its pad tokens once tokens are dropped;
            read from the ``position_ids`` transformers passes to ``update``, docs/EVICTION.md).
        RuntimeError: a model not running :func:`kvlab.attention.enable` (at the next layer's update).

    Notes:
        ``get_seq_length()`` returns every token seen (the next token's position), not the tokens held
        (:meth:`held_tokens`).

    Source: TOVA (arXiv:2401.06104) section 3; layout after kvpress (one method per file).
    """

    def __init__(
        self, token_budget: int | None = None, compression_ratio: float | None = None, config: Any = None
    ):
        # the budget's checks are SnapKV's (one of ratio / budget); TOVA has no observation window to cover
        self.snapkv_config = SnapKVConfig(compression_ratio=compression_ratio, token_budget=token_budget)
        if config is not None:
            check_full_attention(config, "TOVACache")
        super().__init__(layer_class_to_replicate=partial(TOVALayer, self.snapkv_config))

    def __repr__(self) -> str:
        return f"TOVACache({self.snapkv_config.budget_text()})"
