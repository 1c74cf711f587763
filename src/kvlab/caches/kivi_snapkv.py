"""``KIVISnapKVCache``: SnapKV prefill compression composed with KIVI quantization, each kept token quantized once.

The prompt's float K/V are held for one step: the prefill attends to them as any KIVI prefill does (float K/V,
nothing quantized yet), kvlab attention then hands each layer the prefill's queries, SnapKV (arXiv:2404.14469 section 4,
:func:`kvlab.caches.snapkv.snapkv_scores`) picks the tokens each KV head keeps, and only those enter the KIVI state
(KIVI, arXiv:2402.02750 section 3): the kept tokens are quantized exactly once, in their first and only flush, and the
dropped ones are never quantized at all. Evicting *before* quantizing is what keeps "each token quantized once": a
token dropped from a packed key group (per-channel over ``G`` tokens) would otherwise force its group to be
re-quantized. Decoding then runs KIVI unchanged (residual window, flushes, the fused path included).

Positions are SnapKV's: kept tokens keep their original positions, the next token is at the prompt length.

Usage::

    kvlab.attention.enable(model)
    cache = KIVISnapKVCache(nbits=4, compression_ratio=0.5, config=model.config)
    model.generate(input_ids, cache=cache, max_new_tokens=64)
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.caches._rows import PaddingCheck
from kvlab.caches.crop import crop_unless_evicted
from kvlab.caches.kivi import KIVICache, KIVILayer
from kvlab.caches.scorer import QueryScoredCache, not_enabled, request_queries
from kvlab.caches.snapkv import SnapKVConfig, snapkv_keep


class KIVISnapKVLayer(KIVILayer):
    """A :class:`~kvlab.caches.kivi.KIVILayer` whose first update (the prefill) is SnapKV-compressed before any
    token is quantized. ``seen_tokens`` counts every token (positions), ``evicted_tokens`` the prompt tokens dropped
    per KV head."""

    cache_name = "KIVISnapKVCache"  # named in errors

    def __init__(self, config: Any, attention: str, snap: SnapKVConfig, **kwargs: Any):
        super().__init__(config, attention, **kwargs)
        self.snap = snap
        self.seen_tokens = self.evicted_tokens = 0
        self.pending = self.compressed = False
        self.prompt: tuple[torch.Tensor, torch.Tensor] | None = None  # the prompt's float K/V until scored

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefill: hold ``[B, H, t, D]`` float K/V, ask kvlab attention for the queries, return them as they
        are (the prefill attends to float K/V). Later updates: KIVI's.

        Raises:
            RuntimeError: the previous prefill's queries never arrived. ValueError: as :meth:`KIVILayer.update`;
                a padded batch whose prompt would be compressed (:class:`kvlab.caches._rows.PaddingCheck`).
        """
        if self.pending:
            raise not_enabled(self)
        tokens = key_states.shape[-2]
        if not self.compressed:
            self.compressed = True
            if self.snap.kept_tokens(tokens) < tokens:
                padding = PaddingCheck()
                padding.note(kwargs, self.seen_tokens, tokens, key_states.shape[0])
                padding.before_eviction(self.cache_name)
                self.state._check(key_states, value_states)
                if not self.is_initialized:
                    self.lazy_initialization(key_states, value_states)
                self.prompt = (key_states, value_states)
                self.seen_tokens += tokens
                request_queries(self, key_states, kwargs.get("kvlab_layer_idx"))
                return key_states, value_states
        self.seen_tokens += tokens
        return super().update(key_states, value_states, *args, **kwargs)

    def observe(self, query: torch.Tensor, scale: float) -> None:
        """Score the held prompt with ``query [B, Hq, prompt, D]``, keep the best tokens per KV head, quantize those."""
        keys, values = self.prompt
        tokens, kept = keys.shape[-2], self.snap.kept_tokens(keys.shape[-2])
        idx = snapkv_keep(query, keys, self.snap, scale)[..., None].expand(
            -1, -1, -1, keys.shape[-1]
        )  # [B, H, kept, D]
        self.state.append(keys.gather(2, idx), values.gather(2, idx))  # the kept tokens, quantized once
        self.keys, self.values = self.state.key_residual, self.state.value_residual
        self.evicted_tokens += tokens - kept
        self.prompt, self.pending = None, False

    def get_seq_length(self) -> int:
        """Every token seen (the next token's position), not the tokens held."""
        return self.seen_tokens

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)``: the held tokens plus the query, ending at the model's absolute position."""
        held = self.state.total_tokens
        return held + query_length, self.seen_tokens - held

    def reset(self) -> None:
        super().reset()
        self.seen_tokens = self.evicted_tokens = 0
        self.pending = self.compressed = False
        self.prompt = None

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' ``crop``: as KIVI's before any eviction; after it only a crop that removes nothing.

        Raises:
            TypeError: a non-integer argument. ValueError: a crop that removes tokens after eviction.
        """
        if crop_unless_evicted(self, tokens_to_remove) is None:
            return
        super().crop(tokens_to_remove)
        self.seen_tokens = self.state.total_tokens


class KIVISnapKVCache(QueryScoredCache, KIVICache):
    """KIVI quantization (keys per-channel, values per-token, residual window) over a SnapKV-compressed prompt.

    Args:
        nbits, group_size, residual_length: as :class:`KIVICache`.
        compression_ratio / token_budget, window_size, kernel_size, pooling: as :class:`~kvlab.caches.snapkv.SnapKVConfig`.
        kivi: :class:`KIVICache`'s other keywords, passed to it as given (``config``, ``attention``, ``key_bits``,
            ``value_bits``, ``dot``, ``block_tokens``).

    Raises:
        ValueError: as :class:`KIVICache` and :class:`~kvlab.caches.snapkv.SnapKVConfig`; during ``generate``, a
            left-padded batch whose prompt would be compressed (the padded rows named; docs/EVICTION.md).
        RuntimeError: a model not running :func:`kvlab.attention.enable` (at the second layer's update).

    Source: SnapKV (arXiv:2404.14469) section 4 then KIVI (arXiv:2402.02750) section 3.
    """

    def __init__(
        self,
        nbits: int | None = None,
        group_size: int = KIVI_DEFAULTS.group_size,
        residual_length: int = KIVI_DEFAULTS.residual_length,
        compression_ratio: float | None = None,
        token_budget: int | None = None,
        window_size: int = 32,
        kernel_size: int = 7,
        pooling: str = "max",
        **kivi: Any,
    ):
        self.snapkv_config = SnapKVConfig(compression_ratio, token_budget, window_size, kernel_size, pooling)
        self.snapkv_config.check_budget_covers_window()
        super().__init__(nbits, group_size, residual_length, **kivi)

    @property
    def _layer_factory(self) -> Callable[[], KIVISnapKVLayer]:
        """:attr:`KIVICache._layer_factory` for this cache's layers, each with the SnapKV settings."""
        return partial(KIVISnapKVLayer, self.kivi_config, self.attention, self.snapkv_config, dot=self.dot)

    def load(self, states) -> None:
        """Not available: the prompt is scored with the model's queries, so it needs a real prefill.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError(
            "KIVISnapKVCache needs a real prefill (its scores need the prompt's queries)"
        )

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, snapkv={self.snapkv_config})".replace(
            "KIVICache(", "KIVISnapKVCache(", 1
        )
