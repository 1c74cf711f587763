"""``TOVACache``: Token Omission Via Attention (arXiv:2401.06104), a decode-time eviction that frees its bytes.

TOVA §3: after each step, while the cache holds more tokens than allowed, drop the tokens the *current* query
attends to least, the attention weights averaged over the layer's heads (one token set per layer, shared by its KV
heads). kvlab applies it after every forward: the prefill (scored by the prompt's last query, several tokens dropped
at once) and each decoded token (one token dropped once the cap is reached). The cap is a fixed ``token_budget``
(TOVA's multi-state size) or ``seen - int(seen * compression_ratio)`` tokens.

The query comes from kvlab attention (:func:`kvlab.attention.interface.observers`), as for
:class:`~kvlab.caches.snapkv.SnapKVCache`; kept tokens keep their original positions; rows must be unpadded.

Usage::

    kvlab.attention.enable(model)
    cache = TOVACache(token_budget=512)
    model.generate(input_ids, cache=cache, max_new_tokens=2048)  # at most 512 tokens held per layer
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from kvlab.caches._rows import check_kv_pair
from kvlab.caches.snapkv import SnapKVCache, SnapKVLayer, _not_enabled, _Observer


def tova_scores(query: torch.Tensor, keys: torch.Tensor, scale: float) -> torch.Tensor:
    """TOVA's scores: the last query's softmax weights over every held key, averaged over the query heads.

    Args:
        query: ``[batch, q_heads, q, head_dim]`` (the last row is the current query; it sees every key).
        keys: ``[batch, kv_heads, tokens, head_dim]``, ``q_heads`` a multiple of ``kv_heads``.
        scale: the attention's softmax scale.

    Returns:
        ``[batch, tokens]`` float32 weights (each row sums to 1).

    Source: TOVA (arXiv:2401.06104) §3, "averaging across heads".
    """
    hq, hkv = query.shape[1], keys.shape[1]
    k = keys.float().repeat_interleave(hq // hkv, dim=1)  # [B, Hkv, T, D] -> [B, Hq, T, D]
    weights = (query[..., -1:, :].float() @ k.transpose(-1, -2) * scale).softmax(dim=-1)  # [B, Hq, 1, T]
    return weights[:, :, 0].mean(dim=1)  # [B, T]


class TOVALayer(SnapKVLayer):
    """One layer of :class:`TOVACache`: ``keys``/``values`` ``[batch, kv_heads, <= cap, head_dim]`` between steps."""

    cache_name = "TOVACache"

    def cap(self) -> int:
        """Tokens allowed after this step: the budget, or the kept share of every token seen."""
        c = self.config
        if c.token_budget is not None:
            return c.token_budget
        return self.seen_tokens - int(self.seen_tokens * c.compression_ratio)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``[B, H, t, D]`` states, return every held token's K/V; ask kvlab attention for this step's
        queries when the cache will be over its cap.

        Raises:
            ValueError: keys/values that are not 4-D or differ in batch, heads or tokens (both shapes named).
            RuntimeError: the previous step's queries never arrived (no kvlab attention).
        """
        check_kv_pair(key_states, value_states)
        if self.pending:
            raise _not_enabled(self)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = torch.cat((self.keys, key_states), dim=-2)
        self.values = torch.cat((self.values, value_states), dim=-2)
        self.seen_tokens += key_states.shape[-2]
        if self.keys.shape[-2] > self.cap():
            from kvlab.attention.interface import observers

            self.pending = True
            observers()[kwargs.get("kvlab_layer_idx")] = _Observer(self, self.keys)
        return self.keys, self.values

    def observe(self, query: torch.Tensor, scale: float) -> None:
        """Drop the held tokens the current query attends to least, down to :meth:`cap`."""
        kept = self.cap()
        scores = tova_scores(query, self.keys, scale)  # [B, T]
        keep = scores.topk(kept, dim=-1).indices.sort(dim=-1).values  # [B, kept], positions in order
        b, h, _, d = self.keys.shape
        idx = keep[:, None, :, None].expand(b, h, kept, d)  # the same tokens for every KV head of the layer
        self.evicted_tokens += self.keys.shape[-2] - kept
        self.keys, self.values = (
            self.keys.gather(2, idx),
            self.values.gather(2, idx),
        )  # new tensors: bytes freed
        self.pending = False


class TOVACache(SnapKVCache):
    """TOVA: after every step, the tokens the current query attends to least are dropped down to a cap.

    Args:
        token_budget: tokens held per layer between steps; or
        compression_ratio: in ``(0, 1)``: hold ``seen - int(seen * ratio)`` tokens (give exactly one).
        config: optional model config; a model with non-full-attention layers is refused.

    Raises:
        ValueError: both or neither of ``token_budget``/``compression_ratio``, a ratio outside ``(0, 1)``, a budget
            below 1 (named); a sliding-window model.
        RuntimeError: a model not running :func:`kvlab.attention.enable` (at the next layer's update).

    Source: TOVA (arXiv:2401.06104) §3; layout after kvpress (one method per file).
    """

    keeps_window = False  # no observation window: any budget >= 1 is held as given

    def __init__(
        self, token_budget: int | None = None, compression_ratio: float | None = None, config: Any = None
    ):
        super().__init__(compression_ratio=compression_ratio, token_budget=token_budget, config=config)
        self.layer_class_to_replicate = partial(TOVALayer, self.snapkv_config)

    def __repr__(self) -> str:
        c = self.snapkv_config
        what = (
            f"token_budget={c.token_budget}"
            if c.token_budget is not None
            else f"compression_ratio={c.compression_ratio}"
        )
        return f"TOVACache({what})"
