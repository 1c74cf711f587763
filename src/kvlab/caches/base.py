"""What every kvlab cache layer shares, beside transformers' ``CacheLayerMixin`` (``transformers.cache_utils``).

transformers puts a layer's shared behaviour in ``CacheLayerMixin`` and lets a strategy vary through hooks
(``QuantizedLayer._quantize`` / ``_dequantize``). :class:`KVLayer` does the same for kvlab's layers:

* batch rows: ``reorder_cache`` (beam search), ``batch_select_indices`` and ``batch_repeat_interleave`` check the
  index once (:func:`kvlab.caches._rows.batch_index`) and call one hook, :meth:`KVLayer._select_rows`, that moves
  every tensor the layer holds; :meth:`KVLayer._rows` says how many rows it holds;
* mask sizes of a cache holding every token it saw, no maximum length, no offloading.

:func:`check_full_attention` is the one check that a model has only full-attention layers (a sliding-window model
would attend to tokens these caches hold but the model's own mask drops, or the reverse).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import CacheLayerMixin

from kvlab.caches._rows import batch_index, check_repeats


def check_full_attention(config: Any, cache_name: str) -> int:
    """Refuse a model with any layer that is not full attention; return its number of layers.

    Args:
        config: the model's config (a multimodal config's text config is read).
        cache_name: the cache refusing it, named in the error (``"KIVICache"``).

    Raises:
        ValueError: a sliding-window (or other non-full-attention) layer type, or ``use_sliding_window`` with a
            ``sliding_window`` (Qwen2-style configs without ``layer_types``), named with the cache; ``config`` not a
            model config (:func:`kvlab.caches.rope.model_text_config`).
    """
    from kvlab.caches.rope import model_text_config

    text = model_text_config(config)
    layer_types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    bad = sorted(set(layer_types) - {"full_attention"})
    if not bad and getattr(text, "use_sliding_window", False) and getattr(text, "sliding_window", None):
        bad = [f"sliding_window={text.sliding_window}"]
    if bad:
        raise ValueError(f"{cache_name} supports full-attention layers only; the model has {bad}")
    return len(layer_types)


class KVLayer(CacheLayerMixin):
    """A kvlab cache layer: full attention, no maximum length, no offloading, batch rows through one hook.

    A subclass holding more than ``keys``/``values`` ``[batch, ...]`` extends :meth:`_select_rows` (and :meth:`_rows`
    when ``keys`` is not ``[batch, ...]``) besides transformers' ``lazy_initialization`` / ``update`` /
    ``get_seq_length`` / ``reset`` / ``crop``.
    """

    is_sliding = False
    is_compileable = False
    cache_name = "this cache"  # named in errors: "KIVICache"

    def _rows(self) -> int:
        """Batch rows held (hook): ``keys``' first dimension by default."""
        return self.keys.shape[0]

    def _select_rows(self, idx: torch.Tensor) -> None:
        """Keep rows ``idx`` (``[n]`` int64 on the layer's device, checked) of every tensor the layer holds (hook):
        ``keys`` and ``values`` ``[batch, ...]`` here; a layer holding more moves the rest too."""
        self.keys, self.values = self.keys.index_select(0, idx), self.values.index_select(0, idx)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Rows become ``beam_idx`` of the old rows (beam search); stored data moves, it is never re-encoded.

        Raises:
            TypeError: a non-integer index. ValueError: not 1-D, or a row outside the batch (nothing is changed).
        """
        if self.is_initialized:
            self._select_rows(batch_index(beam_idx, self._rows(), self.device))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the batch rows ``indices`` (as :meth:`reorder_cache`)."""
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each batch row ``repeats`` times (contrastive search, beam expansion): ``[B, ...]`` ->
        ``[B * repeats, ...]``.

        Raises:
            ValueError: ``repeats`` not a positive int (0 would drop every row).
        """
        check_repeats(repeats)
        if self.is_initialized:
            self.reorder_cache(torch.arange(self._rows(), device=self.device).repeat_interleave(repeats))

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)`` for mask creation: every stored token is attended to."""
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        """-1: the cache grows without a maximum."""
        return -1

    def offload(self) -> None:  # pragma: no cover - offloading is not supported
        raise NotImplementedError(f"{self.cache_name} does not support offloading")

    def prefetch(self) -> None:  # pragma: no cover
        raise NotImplementedError(f"{self.cache_name} does not support offloading")
