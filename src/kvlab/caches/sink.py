"""``SinkCache``: attention sinks + a window of the newest tokens (StreamingLLM), for transformers 5 ``generate()``.

StreamingLLM (arXiv:2309.17453 section 3.2) keeps the first ``num_sink_tokens`` tokens (the "attention sinks") and the newest
``window_length`` tokens, so the cache holds at most ``num_sink_tokens + window_length`` tokens however long the
stream runs: once the window is full, each new token evicts the oldest window token and the bytes stay flat.

**Positions.** StreamingLLM gives tokens their positions *inside the cache*: with sinks ``[0, 1, 2, 3]`` and window
tokens ``[6, 7, 8]``, decoding token 9 uses positions ``0..7``, not the original ``0, 1, 2, 3, 6, 7, 8, 9`` (see
docs/EVICTION.md: after eviction the storage length is no longer a token's original
position). With RoPE only the distance between query and key counts, and inside the cache that distance changes for
the sinks alone: a window token and the query moved together, so their distance is the original one, while every
evicted token brings the sinks one position closer to the query. So this cache:

* keeps the window keys exactly as the model rotated them (no re-rotation, no rounding added to them);
* keeps the sink keys as rotated at their original positions and returns them rotated forward by the number of
  tokens evicted so far, ``E`` (:class:`kvlab.caches.rope.KeyRotation`, one rotation from the stored keys, computed
  from float64 angles, so no error accumulates over a long stream);
* lets the model keep its own absolute ``position_ids`` (``get_seq_length()`` counts every token seen, as
  transformers' ``DynamicSlidingWindowLayer`` does), which ``generate`` and a plain ``forward`` both derive.

The attention scores are then those of StreamingLLM's positions inside the cache. transformers 4.x's ``SinkCache``
reached the same positions the other way: it re-rotated every kept window key one position back at each step
(``_get_rerotation_cos_sin``), and ``prepare_inputs_for_generation`` cut the attention mask to the window so the new
query's ``position_ids`` were its index inside the cache (``window_length - 1`` once full). That re-rotates the whole
window at every step (rounding accumulates on keys kept long, in bf16) and depends on ``generate`` cutting the mask,
which transformers 5 no longer does. The alternative, keeping every token's original position, lets the distance
between query and sinks grow without bound: the model is then asked for distances beyond those it was trained on,
which is what StreamingLLM's positions avoid. (The absolute ``position_ids`` still grow; RoPE angles at very large
positions lose float32 precision in the model's own rotary embedding, not in this cache.)

**What a step attends to.** A step's queries see every token held before the step plus the step's new tokens
(causally); eviction happens after the step. A prefill longer than the cache thus attends to the whole prompt, as
StreamingLLM's own runs do, and leaves only the sinks and the newest ``window_length`` tokens behind.

**Limits.** Full-attention RoPE decoders whose RoPE type is in :data:`kvlab.caches.rope.ROPE_TYPES`; a model with
sliding-window (or other non-full) attention layers is refused. Rows of a batch must be unpadded once eviction has
begun: the attention mask of the sink slots is read at the positions of evicted tokens (transformers masks by
contiguous positions), so the pad tokens sitting in a left-padded row's sink slots would become visible. A padded
batch is refused at the step that would first evict (:class:`kvlab.caches._rows.PaddingCheck`, from the
``position_ids`` transformers passes to ``update``; docs/EVICTION.md).

Usage::

    cache = SinkCache(num_sink_tokens=4, window_length=256, config=model.config)
    model.generate(input_ids, cache=cache, max_new_tokens=2048)
    cache.nbytes()  # flat once 4 + 256 tokens are held
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from transformers.cache_utils import Cache

from kvlab.caches._rows import PaddingCheck, check_kv_pair
from kvlab.caches.base import KVLayer, check_full_attention
from kvlab.caches.crop import crop_keep, crop_unless_evicted
from kvlab.caches.rope import KeyRotation
from kvlab.runtime.checks import check_int


class SinkLayer(KVLayer):
    """One layer of :class:`SinkCache`.

    State: ``sink_keys``/``sink_values`` ``[batch, kv_heads, <= num_sink_tokens, head_dim]`` (keys rotated at their
    original positions ``0..S-1``), ``keys``/``values`` ``[batch, kv_heads, <= window_length, head_dim]`` (the
    newest tokens, keys as the model rotated them), ``seen_tokens`` (every token received) and ``evicted_tokens``.
    """

    cache_name = "SinkCache"
    is_croppable = False  # only while nothing was evicted; assisted decoding checks this flag up front

    def __init__(self, num_sink_tokens: int, window_length: int, rotation: KeyRotation | None, **kwargs: Any):
        super().__init__(**kwargs)
        self.num_sink_tokens = num_sink_tokens
        self.window_length = window_length
        self.rotation = rotation
        self.sink_keys = self.sink_values = None
        self.seen_tokens = 0  # tokens received since the last reset (the model's next absolute position)
        self.evicted_tokens = 0  # E: window tokens dropped so far; sinks sit E positions nearer the query
        self.padding = PaddingCheck()  # a padded batch is refused when eviction begins

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        empty = key_states[..., :0, :]  # [B, H, 0, D]
        self.sink_keys = self.keys = empty
        self.sink_values = self.values = value_states[..., :0, :]
        self.is_initialized = True

    def held_tokens(self) -> int:
        """Tokens stored now: sinks + window (``<= num_sink_tokens + window_length`` between steps)."""
        return 0 if not self.is_initialized else self.sink_keys.shape[-2] + self.keys.shape[-2]

    def _sinks_for_query(self) -> torch.Tensor:
        """Sink keys at their positions inside the cache: rotated forward by the tokens evicted so far."""
        if self.evicted_tokens == 0 or self.sink_keys.shape[-2] == 0:
            return self.sink_keys
        assert self.rotation is not None, "a cache with sinks is built with a rotation"
        return self.rotation.rotate(self.sink_keys, self.evicted_tokens)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``[B, H, t, D]`` states; return the ``[B, H, held + t, D]`` keys/values this step attends to
        (sinks, window, new tokens), then evict down to ``num_sink_tokens + window_length`` tokens.

        Raises:
            ValueError: keys/values that are not 4-D or differ in batch, heads or tokens (both shapes named); a
                batch, head or head_dim change between calls; a padded batch when eviction begins
                (:class:`kvlab.caches._rows.PaddingCheck`: the step's ``position_ids``, read from ``kwargs``, do
                not continue the tokens seen).
        """
        check_kv_pair(key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        elif key_states.shape[:2] != self.keys.shape[:2] or key_states.shape[-1] != self.keys.shape[-1]:
            raise ValueError(
                f"keys of shape {tuple(key_states.shape)} do not continue a cache of "
                f"{tuple(self.keys.shape[:2])} rows/heads and head_dim {self.keys.shape[-1]} "
                f"(call cache.reset() before reusing a cache for another batch)"
            )
        if self.seen_tokens == 0:
            self.padding.note(kwargs, 0, key_states.shape[-2], key_states.shape[0])
        if self.evicted_tokens == 0 and self.held_tokens() + key_states.shape[-2] > self.get_max_length():
            self.padding.before_eviction(self.cache_name)
        keys = torch.cat((self._sinks_for_query(), self.keys, key_states), dim=-2)  # [B, H, held + t, D]
        values = torch.cat((self.sink_values, self.values, value_states), dim=-2)
        self.seen_tokens += key_states.shape[-2]
        # sinks fill first (the window is empty until they are full)
        need = self.num_sink_tokens - self.sink_keys.shape[-2]
        if need > 0:
            self.sink_keys = torch.cat((self.sink_keys, key_states[..., :need, :]), dim=-2)
            self.sink_values = torch.cat((self.sink_values, value_states[..., :need, :]), dim=-2)
            key_states, value_states = key_states[..., need:, :], value_states[..., need:, :]
        held, new = self.keys.shape[-2], key_states.shape[-2]
        drop = max(held + new - self.window_length, 0)  # oldest window tokens evicted by this step
        if new:
            # one copy holding exactly the kept tokens (no view into a larger tensor keeps evicted bytes alive)
            self.keys = torch.cat(
                (self.keys[..., min(drop, held) :, :], key_states[..., max(drop - held, 0) :, :]), -2
            )
            self.values = torch.cat(
                (self.values[..., min(drop, held) :, :], value_states[..., max(drop - held, 0) :, :]), -2
            )
        self.evicted_tokens += drop
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)``: the held tokens plus the query, ending at the model's absolute position.

        transformers builds the mask over ``kv_offset + arange(kv_length)`` against query positions starting at
        ``get_seq_length()`` (every token seen), so the held tokens all precede the queries and the new tokens are
        causal among themselves.
        """
        held = self.held_tokens()
        return held + query_length, self.seen_tokens - held

    def get_seq_length(self) -> int:
        """Every token seen (the next token's absolute position), not the tokens held (see :meth:`held_tokens`)."""
        return self.seen_tokens

    def get_max_length(self) -> int:
        """``num_sink_tokens + window_length``: the most tokens held between steps."""
        return self.num_sink_tokens + self.window_length

    def reset(self) -> None:
        """Drop every stored token, keeping the settings."""
        self.keys = self.values = self.sink_keys = self.sink_values = None
        self.seen_tokens = self.evicted_tokens = 0
        self.padding = PaddingCheck()
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' ``crop`` (see :mod:`kvlab.caches.crop`), possible only while nothing was evicted.

        Raises:
            TypeError: a non-integer argument.
            ValueError: a crop that removes tokens after eviction began (the evicted tokens cannot come back).
        """
        keep = crop_unless_evicted(self, tokens_to_remove)
        if keep is None or not self.is_initialized:
            return
        sinks = min(keep, self.sink_keys.shape[-2])
        self.sink_keys, self.sink_values = self.sink_keys[..., :sinks, :], self.sink_values[..., :sinks, :]
        self.keys, self.values = self.keys[..., : keep - sinks, :], self.values[..., : keep - sinks, :]
        self.seen_tokens = keep

    def _select_rows(self, idx: torch.Tensor) -> None:
        """Rows ``idx`` of the sinks and the window."""
        self.sink_keys, self.sink_values = (
            self.sink_keys.index_select(0, idx),
            self.sink_values.index_select(0, idx),
        )
        super()._select_rows(idx)

    def nbytes(self) -> int:
        """Bytes of the stored sinks and window (keys and values)."""
        if not self.is_initialized:
            return 0
        return sum(
            t.numel() * t.element_size() for t in (self.sink_keys, self.sink_values, self.keys, self.values)
        )


class SinkCache(Cache):
    """Attention sinks + a window of the newest tokens, with StreamingLLM's positions inside the cache.

    Args:
        num_sink_tokens: ``S >= 0``: the first tokens kept for the whole stream (StreamingLLM uses 4).
        window_length: ``W >= 1``: the newest tokens kept. The cache holds at most ``S + W`` tokens between steps.
        config: the model config. Needed when ``S > 0`` (the sinks are re-rotated with the model's RoPE, read from
            ``config.rope_parameters``); when given, layers are created up front and a model with sliding-window
            layers or an unhandled RoPE type is refused.

    Raises:
        ValueError: ``num_sink_tokens < 0``, ``window_length < 1`` or not ints (the value is named); ``S > 0``
            without ``config``; a model with non-full-attention layers; a RoPE type other than
            :data:`kvlab.caches.rope.ROPE_TYPES` (the type is named). During ``generate``: a left-padded batch at
            the step that would first evict (the padded rows named; see Notes).

    Notes:
        Rows must be unpadded once eviction begins: transformers masks a cache by contiguous positions, so after
        eviction a padded row's pad tokens would sit in slots the mask reads as real tokens. The cache sees no
        attention mask; it reads the ``position_ids`` transformers passes to ``update`` (a padded row's positions
        start at its first real token) and refuses the batch; a model that passes none gets a warning for a batch
        of two or more rows. ``get_seq_length()`` returns every token seen (the next token's absolute position),
        not the tokens held: :meth:`held_tokens` gives those.

    Source: StreamingLLM (arXiv:2309.17453) section 3.2; docs/EVICTION.md (positions are kept
    apart from storage). See the module docstring for the positions and the comparison with transformers 4.x.
    """

    def __init__(self, num_sink_tokens: int = 4, window_length: int = 256, config: Any = None):
        check_int("num_sink_tokens", num_sink_tokens, 0)
        check_int("window_length", window_length, 1)
        self.num_sink_tokens, self.window_length = num_sink_tokens, window_length
        rotation = None
        if config is not None:
            n_layers = check_full_attention(config, "SinkCache")
            if num_sink_tokens > 0:
                rotation = KeyRotation(config)
        elif num_sink_tokens > 0:
            raise ValueError(
                f"SinkCache with num_sink_tokens={num_sink_tokens} needs the model config (config=model.config): "
                f"its sink keys are re-rotated with the model's RoPE"
            )
        make = partial(SinkLayer, num_sink_tokens, window_length, rotation)
        if config is not None:
            super().__init__(layers=[make() for _ in range(n_layers)])
        else:
            super().__init__(layer_class_to_replicate=make)

    def __repr__(self) -> str:
        return f"SinkCache(num_sink_tokens={self.num_sink_tokens}, window_length={self.window_length})"

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' ``crop``; only before eviction begins (see :meth:`SinkLayer.crop`).

        Raises:
            TypeError / ValueError: as :meth:`SinkLayer.crop` (nothing is changed).
        """
        crop_keep(tokens_to_remove, 0)
        if tokens_to_remove != 0 and any(layer.evicted_tokens for layer in self.layers):
            self.layers[0].crop(tokens_to_remove)  # raises, naming the evicted tokens
        for layer in self.layers:
            layer.crop(tokens_to_remove)

    def held_tokens(self, layer_idx: int = 0) -> int:
        """Tokens stored in layer ``layer_idx`` (sinks + window)."""
        return self.layers[layer_idx].held_tokens() if layer_idx < len(self.layers) else 0

    def evicted_tokens(self, layer_idx: int = 0) -> int:
        """Tokens evicted from layer ``layer_idx`` so far."""
        return self.layers[layer_idx].evicted_tokens if layer_idx < len(self.layers) else 0

    def nbytes(self) -> int:
        """Exact bytes of the stored keys and values, all layers: ``(S + W) * 2 * kv_heads * head_dim * itemsize``
        per layer once the window is full."""
        return sum(layer.nbytes() for layer in self.layers)
