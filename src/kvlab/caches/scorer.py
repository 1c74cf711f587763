"""The base of kvlab's query-scored evicting caches (SnapKV, TOVA, SnapKV under KIVI): a subclass only scores.

As kvpress's ``ScorerPress`` (whose subclasses implement ``score()`` and nothing else), :class:`ScorerLayer` holds
``keys``/``values`` ``[batch, kv_heads, tokens, head_dim]``, asks kvlab attention for the queries of a step when its
hook :meth:`ScorerLayer._wants_query` says so (:class:`QueryRequest`), and when they arrive keeps the tokens its hook
:meth:`ScorerLayer.keep` picks, ``_kept()`` of them, freeing the rest. :class:`QueryScoredCache` is the cache-level
half: it names each layer's request by layer index; the forward context (:mod:`kvlab.attention.context`) refuses,
at the end of the forward, a model whose attention never answered one (:class:`ScorerCache` adds the held tokens
and bytes of :class:`ScorerLayer` layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvlab.caches._rows import PaddingCheck, check_kv_pair, check_repeats
from kvlab.caches.base import KVLayer
from kvlab.caches.crop import crop_keep, crop_unless_evicted


@dataclass
class QueryRequest:
    """A layer's request for the queries of one step, answered by
    :func:`kvlab.attention.interface.kvlab_attention_forward` from the forward context's observers
    (:class:`kvlab.attention.context.ForwardContext`)."""

    layer: Any  # the layer that scores with them (its ``observe(query, scale)``)
    key: torch.Tensor  # the keys the cache returned for this step: the request belongs to that call only

    def __call__(self, query: torch.Tensor, key: torch.Tensor, scale: float | None) -> None:
        """Score with ``query [B, Hq, q, D]`` when ``key`` is the key the cache returned
        (:func:`kvlab.attention.context.same_tensor`; K/V a model changed, e.g. per expert, leave it unanswered)."""
        from kvlab.attention.context import same_tensor

        if same_tensor(key, self.key):
            self.layer.observe(query, scale if scale is not None else query.shape[-1] ** -0.5)

    def unread_error(self) -> RuntimeError:
        """The error when no attention answered this request in its forward (:func:`not_enabled`)."""
        return not_enabled(self.layer)


def not_enabled(owner: object) -> RuntimeError:
    """The error of a query-scored cache (``owner``: the cache or one of its layers) whose queries never came."""
    name = type(owner).__name__.replace("Layer", "Cache")
    return RuntimeError(
        f"{name} needs kvlab attention on the model (kvlab.attention.enable(model)): the queries it scores tokens "
        "with never reached the cache, so nothing was evicted"
    )


def request_queries(layer: Any, keys: torch.Tensor, layer_idx: int | None) -> None:
    """Ask kvlab attention for this step's queries of layer ``layer_idx`` (answered by ``layer.observe``) in this
    forward's context (:mod:`kvlab.attention.context`); the end of the forward raises if none came.

    Raises:
        RuntimeError: no forward context is open (a model without :func:`kvlab.attention.enable`, or a cache
            updated outside a forward and outside :func:`kvlab.attention.context.forward_context`).
    """
    from kvlab.attention.context import current

    ctx = current()
    if ctx is None:
        raise not_enabled(layer)
    layer.pending = True
    ctx.observers[layer_idx] = QueryRequest(layer, keys)


class ScorerLayer(KVLayer):
    """One layer of a query-scored evicting cache; ``config`` is the method's (e.g. a ``SnapKVConfig``).

    Hooks: :meth:`_wants_query` (after an append: score this step?), :meth:`_kept` (tokens to keep of ``tokens``),
    :meth:`keep` (which: ``[batch, kv_heads or 1, kept]`` ascending indices from the query).
    """

    is_croppable = False

    def __init__(self, config: Any, **kwargs: Any):
        super().__init__(**kwargs)
        self.config = config
        self.seen_tokens = 0  # tokens received (the next token's position)
        self.evicted_tokens = 0  # tokens dropped per KV head
        self.pending = False  # this step's queries are awaited from kvlab attention
        self.compressed = False  # the prompt has been handled (scored, or too short to score)
        self.padding = PaddingCheck()  # a padded batch is refused when eviction begins

    def _wants_query(self) -> bool:
        raise NotImplementedError

    def _kept(self, tokens: int) -> int:
        raise NotImplementedError

    def keep(self, query: torch.Tensor, scale: float, kept: int) -> torch.Tensor:
        raise NotImplementedError

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys, self.values = key_states[..., :0, :], value_states[..., :0, :]
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``[B, H, t, D]`` states and return every held token's K/V (this step attends to all of them);
        ask kvlab attention for this step's queries when :meth:`_wants_query` says so (scored right after the
        step's attention, :meth:`observe`).

        Raises:
            ValueError: keys/values that are not 4-D or differ in batch, heads or tokens (both shapes named).
            ValueError: a padded batch at the first step that evicts (:class:`kvlab.caches._rows.PaddingCheck`).
            RuntimeError: the previous step's queries never arrived (the model does not run kvlab attention).
        """
        check_kv_pair(key_states, value_states)
        if self.pending:
            raise not_enabled(self)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.seen_tokens == 0:
            self.padding.note(kwargs, 0, key_states.shape[-2], key_states.shape[0])
        self.keys = torch.cat((self.keys, key_states), dim=-2)
        self.values = torch.cat((self.values, value_states), dim=-2)
        self.seen_tokens += key_states.shape[-2]
        if self._wants_query():
            self.padding.before_eviction(self.cache_name)
            request_queries(self, self.keys, kwargs.get("kvlab_layer_idx"))
        return self.keys, self.values

    def observe(self, query: torch.Tensor, scale: float) -> None:
        """Keep the tokens :meth:`keep` picks with ``query [B, Hq, q, D]`` (new tensors: the others' bytes freed)."""
        b, h, tokens, d = self.keys.shape
        kept = self._kept(tokens)
        idx = self.keep(query, scale, kept)[..., None].expand(b, h, kept, d)  # [B, H, kept, D]
        self.keys, self.values = self.keys.gather(2, idx), self.values.gather(2, idx)
        self.evicted_tokens += tokens - kept
        self.pending = False

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)``: the held tokens plus the query, ending at the model's absolute position."""
        held = self.held_tokens()
        return held + query_length, self.seen_tokens - held

    def held_tokens(self) -> int:
        """Tokens stored per KV head."""
        return self.keys.shape[-2] if self.is_initialized else 0

    def get_seq_length(self) -> int:
        """Every token seen (the next token's position), not the tokens held."""
        return self.seen_tokens

    def reset(self) -> None:
        self.keys = self.values = None
        self.seen_tokens = self.evicted_tokens = 0
        self.pending = self.compressed = False
        self.padding = PaddingCheck()
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' ``crop``: only ``0`` (a no-op) after an eviction; before it, as ``DynamicCache``.

        Raises:
            TypeError: a non-integer argument. ValueError: a crop after tokens were evicted.
        """
        keep = crop_unless_evicted(self, tokens_to_remove)
        if keep is None or not self.is_initialized:
            return
        self.keys, self.values = self.keys[..., :keep, :], self.values[..., :keep, :]
        self.seen_tokens = keep

    def nbytes(self) -> int:
        """Bytes of the stored keys and values."""
        if not self.is_initialized:
            return 0
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()


class QueryScoredCache:
    """Cache-level half of a query-scored cache (mixed in before a transformers ``Cache`` subclass): each layer's
    update carries its index (``kvlab_layer_idx``, naming its query request in the forward context)."""

    needs_own_prefill = (
        True  # its prefill scores the prompt with the model's queries: a copied prefill cannot
    )

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """``Cache.update``, passing ``layer_idx`` to the layer.

        Raises:
            RuntimeError: as :func:`request_queries`, or a layer whose previous request was never answered.
        """
        kwargs["kvlab_layer_idx"] = layer_idx
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def evicted_tokens(self, layer_idx: int = 0) -> int:
        """Tokens dropped per KV head in layer ``layer_idx``."""
        return self.layers[layer_idx].evicted_tokens if layer_idx < len(self.layers) else 0

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' ``crop``, layer by layer (each refuses one after its eviction).

        Raises:
            TypeError: a non-integer argument. ValueError: a crop after tokens were evicted.
        """
        crop_keep(tokens_to_remove, 0)
        for layer in self.layers:
            layer.crop(tokens_to_remove)


class ScorerCache(QueryScoredCache):
    """:class:`QueryScoredCache` of :class:`ScorerLayer` layers: their held tokens and bytes."""

    def held_tokens(self, layer_idx: int = 0) -> int:
        """Tokens stored per KV head in layer ``layer_idx``."""
        return self.layers[layer_idx].held_tokens() if layer_idx < len(self.layers) else 0

    def nbytes(self) -> int:
        """Exact bytes of the stored keys and values, all layers."""
        return sum(layer.nbytes() for layer in self.layers)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each batch row ``repeats`` times in every layer.

        Raises:
            ValueError: ``repeats`` not a positive int (also before any layer exists).
        """
        check_repeats(repeats)
        super().batch_repeat_interleave(repeats)
