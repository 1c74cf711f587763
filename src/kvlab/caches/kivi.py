"""``KIVICache``: a transformers ``Cache`` holding keys per-channel and values per-token in 2/4/8 bits.

KIVI (arXiv:2402.02750): keys are quantized per-channel in groups of ``group_size`` tokens, values per-token in
groups of ``group_size`` channels, and the newest ``residual_length`` (up to ``residual_length + group_size - 1``)
tokens stay in the model dtype. Unlike transformers' ``QuantizedCache`` it (1) uses different axes for K and V,
(2) keeps the newest prefill tokens in full precision, (3) quantizes each token exactly once — a flush writes only
the new G-aligned chunk, never re-quantizing history — and (4) reports its exact bytes with :meth:`nbytes`.
:meth:`KIVICache.crop` rolls tokens back (assisted / speculative and prompt-lookup decoding): exact inside the
residual window; a cut inside a quantized group keeps that group's earlier tokens as their dequantized values, which
are quantized a second time when they are flushed again (the one exception to "exactly once").

Usage::

    cache = KIVICache(nbits=4, group_size=32, residual_length=128)
    cache = KIVICache(key_bits=8, value_bits=4)  # keys and values at their own widths ("kivi-k8v4")
    model.generate(input_ids, cache=cache, max_new_tokens=64)  # past_key_values=cache before transformers 5.24
    cache.nbytes(), cache.nbytes_breakdown()
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from transformers.cache_utils import Cache

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.caches.base import KVLayer, check_full_attention
from kvlab.caches.crop import crop_keep
from kvlab.quant.kivi import KIVIConfig, KIVIState
from kvlab.runtime.checks import check_int

ATTENTION_PATHS = ("dequantize", "fused")


class KIVILayer(KVLayer):
    """One layer of :class:`KIVICache`; the state is a :class:`kvlab.quant.kivi.KIVIState`.

    :meth:`update` takes ``[batch, kv_heads, tokens, head_dim]`` keys/values and returns the keys/values the
    attention of this step must read: the quantized prefix as it stood before the call (dequantized) followed by
    the full-precision residual window including the new tokens, ``[batch, kv_heads, seq_len, head_dim]``.
    """

    cache_name = "KIVICache"
    # crop works at any length (assisted decoding checks this flag): exact inside the residual window; a cut into
    # the quantized prefix restores the kept part of the cut group as its dequantized values (see :meth:`crop`)
    is_croppable = True

    def __init__(self, config: KIVIConfig, attention: str = "dequantize", dot: str = "exact", **kwargs: Any):
        super().__init__(**kwargs)
        self.config = config
        self.attention = attention
        self.dot = dot  # the fused CPU kernel's key-score path (kvlab.attention.cpu_kernel.dot_path)
        self.paths: dict = {}  # what the fused attention ran, filled by it (kivi_attention's `ran`)
        self.state = KIVIState(config)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.dtype = key_states.dtype
        self.batch_size = key_states.shape[0]
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``[B, H, t, D]`` states; return the ``[B, H, seq_len, D]`` keys and values for this step.

        Raises:
            ValueError: a ``group_size`` that does not divide head_dim, or a shape/dtype change between calls.
        """
        if not self.is_initialized:
            self.state._check(key_states, value_states)  # fail before touching anything
            self.lazy_initialization(key_states, value_states)
        layer_idx = kwargs.get("kvlab_layer_idx")
        if self.attention == "fused" and layer_idx is not None:
            return self._update_fused(key_states, value_states, layer_idx)
        prefix = self.state.dequantize_prefix()  # quantized tokens as they stand before this call
        key_window, value_window = self.state.append(key_states, value_states)
        self.keys, self.values = self.state.key_residual, self.state.value_residual
        if prefix is None:
            return key_window, value_window
        return torch.cat((prefix[0], key_window), dim=-2), torch.cat((prefix[1], value_window), dim=-2)

    def _update_fused(self, key_states, value_states, layer_idx):
        """Fused path: hand the quantized prefix to kvlab attention in this forward's context
        (:mod:`kvlab.attention.context`); return only the full-precision window. While nothing is quantized (a
        prefill) the window is the whole history: it is returned, as the dequantize path would, and nothing is
        handed off (so no context is needed).

        Raises:
            RuntimeError: no forward context open while tokens are quantized (nothing is appended then).
        """
        from kvlab.attention.context import current
        from kvlab.attention.interface import PendingPrefix

        ctx = current()
        # views of blocks as they stand; the flush below writes beyond them
        segments = list(self.state.segments())
        if ctx is None and segments:
            raise PendingPrefix.unread_error(layer_idx, no_context=True, owner=self.cache_name)
        key_window, value_window = self.state.append(key_states, value_states)
        self.keys, self.values = self.state.key_residual, self.state.value_residual
        if segments:
            entry = PendingPrefix(
                segments=segments,
                nbits=self.config.key_bits,
                group_size=self.config.group_size,
                key=key_window,
                owner=self.cache_name,
                dot=self.dot,
                ran=self.paths,
            )
            ctx.hand_off(layer_idx, entry)
        return key_window, value_window

    def get_seq_length(self) -> int:
        """Tokens stored (quantized + residual)."""
        return self.state.total_tokens

    def reset(self) -> None:
        """Drop every stored token, keeping the settings."""
        self.state = KIVIState(self.config)
        self.keys = self.values = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' ``crop``: ``-n`` drops the newest ``n`` tokens, ``0`` nothing, a positive ``n`` keeps the
        first ``n`` (``max_length``); see :mod:`kvlab.caches.crop` and :meth:`kvlab.quant.kivi.KIVIState.crop`.

        Raises:
            TypeError: ``tokens_to_remove`` not an integer.
        """
        keep = crop_keep(tokens_to_remove, self.get_seq_length())
        if not self.is_initialized or keep == self.get_seq_length():
            return
        self.state.crop(keep)
        self.keys, self.values = self.state.key_residual, self.state.value_residual

    def _rows(self) -> int:
        return self.batch_size

    def _select_rows(self, idx: torch.Tensor) -> None:
        """Rows ``idx`` of the quantized data and the residual window (moved, never re-quantized)."""
        self.state.index_select_batch(idx)
        self.keys, self.values = self.state.key_residual, self.state.value_residual
        self.batch_size = self.state.key_residual.shape[0]


def _check_dot(dot: object, attention: str) -> None:
    """Refuse a key-score path outside :data:`kvlab.cache_names.KIVI_DOT_PATHS`, or an integer one without
    fused attention (only the fused kernel reads the codes: the dequantize path would run SDPA and call it int8)."""
    from kvlab.cache_names import KIVI_DOT_PATHS

    if dot not in KIVI_DOT_PATHS:
        raise ValueError(f"`dot` must be one of {list(KIVI_DOT_PATHS)}, got {dot!r}")
    if dot != "exact" and attention != "fused":
        raise ValueError(f"`dot`={dot!r} is a path of fused attention, got attention={attention!r}")


def _width(nbits: int | None, key_bits: int | None, value_bits: int | None) -> int:
    """``nbits`` of a :class:`KIVICache` (4 when not given); an explicit ``nbits`` that both explicit widths
    override is refused (``nbits=2, key_bits=8, value_bits=8`` once became an 8-bit cache without a word)."""
    given = {n: b for n, b in (("key_bits", key_bits), ("value_bits", value_bits)) if b is not None}
    if nbits is not None and len(given) == 2 and any(b != nbits for b in given.values()):
        raise ValueError(
            f"`nbits`={nbits!r} conflicts with key_bits={key_bits!r}, value_bits={value_bits!r}: give `nbits` "
            "(both halves) or `key_bits` and `value_bits`, not all three"
        )
    return 4 if nbits is None else nbits


class KIVICache(Cache):
    """KIVI-quantized KV cache for any transformers decoder with full attention.

    Args:
        nbits: bits per code: 2, 4 or 8 (keys and values); default 4.
        key_bits, value_bits: bits per key / value code, 2, 4 or 8, each defaulting to ``nbits``: keys are the more
            sensitive half (per-channel outliers), so e.g. ``key_bits=8, value_bits=4``. The fused attention path
            (and its Triton kernel) reads one width for both and refuses different ones; use ``"dequantize"``.
        group_size: ``G``: tokens per key group (per-channel) and channels per value group (per-token); must
            divide head_dim (checked at the first update).
        residual_length: ``R``: newest tokens kept in the model dtype; a multiple of ``G``.
        block_tokens: quantized storage grows in blocks of this many tokens (see :class:`KIVIConfig`).
        config: optional model config; when given, layers are created up front and a model with sliding-window
            or non-attention layers is rejected.
        attention: ``"dequantize"`` (default: ``update`` returns float K/V of the whole history, works with any
            attention implementation) or ``"fused"`` (``update`` returns only the full-precision window and
            :func:`kvlab.attention.enable`'d attention reads the packed codes directly; no float copy of the
            quantized history is ever built).
        dot: the key-score path the fused attention asks the compiled CPU kernel for
            (:func:`kvlab.attention.cpu_kernel.dot_path`): ``"exact"`` (default: fp32 dot products, the
            reference), ``"int8"`` or ``"int8-keys"`` (integer dot products over the packed codes); only with
            ``attention="fused"``. What ran is :meth:`attention_paths`.

    Raises:
        ValueError: unsupported ``nbits``/``key_bits``/``value_bits`` (named), an unknown ``dot`` or one other than
            ``"exact"`` without fused attention, an ``nbits`` that ``key_bits`` and
            ``value_bits`` both contradict, fused attention with ``key_bits != value_bits``, ``residual_length`` not a multiple of ``group_size``, a model whose
            layers are not all full attention (with ``config``), ``attention="fused"`` with ``group_size * nbits``
            not a multiple of 8; at the first update, a head_dim that ``group_size`` does not divide (e.g.
            head_dim 96 with G 64).

    Notes:
        Speculative (assisted, prompt-lookup) decoding on this cache is not lossless relative to the same cache's
        greedy decoding, though :meth:`crop` rolls rejected drafts back: (1) the verification step appends the
        drafts, and when they overflow the residual window the flush quantizes the oldest ``G`` tokens, which the
        greedy cache would still hold in full precision for a few steps; the crop does not restore them (the state
        equals a greedy one only when that one would hold as many quantized tokens,
        :meth:`kvlab.quant.kivi.KIVIState.crop`); (2) a cut into a quantized group moves the group's kept tokens,
        dequantized, back into the window, where a later flush quantizes them again with a new group's range. The
        attention reads other values than greedy decoding does, so the generated tokens can differ; both are lossy
        against a float cache.

        Left-padded batches: pad tokens are stored and enter the key groups (per-channel over ``G`` tokens) that
        hold them, widening those groups' ranges; the cache cannot see the attention mask (README, left padding).

    Source: KIVI (arXiv:2402.02750) section 3.
    """

    def __init__(
        self,
        nbits: int | None = None,
        group_size: int = KIVI_DEFAULTS.group_size,
        residual_length: int = KIVI_DEFAULTS.residual_length,
        block_tokens: int | None = None,
        config: Any = None,
        attention: str = "dequantize",
        key_bits: int | None = None,
        value_bits: int | None = None,
        dot: str = "exact",
    ):
        nbits = _width(nbits, key_bits, value_bits)
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"`attention` must be one of {list(ATTENTION_PATHS)}, got {attention!r}")
        _check_dot(dot, attention)
        self.attention, self.dot = attention, dot
        self.kivi_config = KIVIConfig(
            nbits, group_size, residual_length, block_tokens, key_bits=key_bits, value_bits=value_bits
        )
        if attention == "fused":
            from kvlab.attention.kivi_checks import check_fused_settings

            c = self.kivi_config
            check_fused_settings(c.key_bits, group_size, value_bits=c.value_bits)
        if config is not None:
            from kvlab.caches.rope import model_text_config

            n_layers = check_full_attention(config, "KIVICache")
            text = model_text_config(config)
            head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
            self.kivi_config.check_head_dim(head_dim)
            super().__init__(layers=[self._layer_factory() for _ in range(n_layers)])
        else:
            super().__init__(layer_class_to_replicate=self._layer_factory)

    @property
    def _layer_factory(self) -> Callable[[], KIVILayer]:
        """What makes one layer of this cache: its settings, attention path and ``dot`` bound to its layer type (a
        subclass's own: :class:`~kvlab.caches.kivi_snapkv.KIVISnapKVCache`); no reference back to the cache."""
        return partial(KIVILayer, self.kivi_config, self.attention, self.dot)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ):
        """Cache.update, passing ``layer_idx`` down so the fused path can hand its prefix to the attention.

        Raises:
            ValueError: as :meth:`KIVILayer.update`, or a layer's first update bringing a different number of tokens
                than layer 0 holds (a cache loaded with fewer layers than the model has).
            RuntimeError: fused mode with no forward context open while tokens are quantized (a model without
                :func:`kvlab.attention.enable`; one with it raises at the end of a forward whose attention left a
                prefix unread, :meth:`kvlab.attention.context.ForwardContext.check_read`).
            ValueError: ``layer_idx`` not an int >= 0 (it was an IndexError from transformers for -1, a TypeError
                here for ``'a'``).
        """
        check_int("layer_idx", layer_idx, 0)
        if layer_idx > 0 and self.layers and self.layers[0].is_initialized:
            fresh = layer_idx >= len(self.layers) or not self.layers[layer_idx].is_initialized
            held = self.layers[0].get_seq_length()
            if fresh and isinstance(key_states, torch.Tensor) and key_states.ndim == 4:
                if key_states.shape[-2] != held:
                    raise ValueError(
                        f"layer {layer_idx} receives its first {key_states.shape[-2]} token(s) while layer 0 holds "
                        f"{held}: every layer must hold the same tokens (was the cache loaded with fewer layers "
                        f"than the model has?)"
                    )
        if self.attention == "fused":
            kwargs["kvlab_layer_idx"] = layer_idx  # the layer hands its prefix to this layer's attention
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def load(self, states) -> None:
        """Write per-layer ``(keys, values)`` into the empty cache outside a forward pass, one append per layer (as
        a single-chunk prefill of the same tokens would): e.g. to copy a ``DynamicCache`` prefill computed once into
        several caches. Nothing is handed to the attention, so a fused cache can decode right after. Every layer is
        checked before anything is written.

        Args:
            states: iterable of ``(keys, values)``, each ``[batch, kv_heads, tokens, head_dim]``, layer 0 first, one
                per layer of the model (e.g. ``[(layer.keys, layer.values) for layer in dynamic_cache.layers]``);
                every layer with the same batch and tokens.

        Raises:
            ValueError: no layers; a cache that already holds tokens (call :meth:`reset` first); fewer layers than
                the cache has (built with a model config, or used before) or more than a config-built cache has;
                layers with different batch sizes or token counts; what :meth:`update` raises for bad
                shapes/dtypes or inf/NaN (the message names the layer).
            TypeError: an item that is not a ``(keys, values)`` pair.
        """
        states = list(states)
        if not states:
            raise ValueError("load() got no layers (an exhausted iterator?)")
        for idx, item in enumerate(states):
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise TypeError(
                    f"layer {idx}: expected a (keys, values) pair, got {type(item).__name__}"
                    + (f" of length {len(item)}" if isinstance(item, (tuple, list)) else "")
                )
        held = [layer.get_seq_length() for layer in self.layers]
        if any(held):
            i = next(i for i, n in enumerate(held) if n)
            raise ValueError(
                f"load() needs an empty cache; layer {i} holds {held[i]} tokens (call reset() first)"
            )
        n = len(self.layers)
        if self.layer_class_to_replicate is None and len(states) > n:
            raise ValueError(f"layer {n} is beyond this cache's {n} layers")
        if len(states) < n:
            raise ValueError(
                f"load() got {len(states)} layer{'s' * (len(states) != 1)} for a cache of {n} layers: every "
                f"layer must be loaded"
            )
        first = states[0][0]
        for idx, (keys, values) in enumerate(states):
            state = self.layers[idx].state if idx < n else KIVIState(self.kivi_config)
            try:
                state._check(keys, values)
            except (TypeError, ValueError) as e:
                raise type(e)(f"layer {idx}: {e}") from None
            if keys.shape[0] != first.shape[0] or keys.shape[-2] != first.shape[-2]:
                raise ValueError(
                    f"layer {idx} has batch {keys.shape[0]} and {keys.shape[-2]} tokens, layer 0 has batch "
                    f"{first.shape[0]} and {first.shape[-2]} tokens: every layer must hold the same tokens"
                )
        for idx, (keys, values) in enumerate(states):
            while len(self.layers) <= idx:
                self.layers.append(self.layer_class_to_replicate())
            layer = self.layers[idx]
            if not layer.is_initialized:
                layer.lazy_initialization(keys, values)
            layer.state.append(keys, values)
            layer.keys, layer.values = layer.state.key_residual, layer.state.value_residual

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the newest tokens of every layer (assisted / speculative decoding rolls back rejected drafts).

        Args:
            tokens_to_remove: transformers' ``Cache.crop`` argument: ``-n`` removes the newest ``n`` tokens (all of
                them when ``n`` is at least the tokens held), ``0`` removes nothing, a positive ``n`` keeps the first
                ``n`` tokens (``max_length`` as in transformers 5.0's ``DynamicCache.crop``).

        What holds afterwards, per layer, with ``k`` tokens kept and ``Q`` tokens quantized before the crop:

        * ``k >= Q``: only the residual window is shortened; the state equals a cache that never received the
          dropped tokens (when that cache would also hold ``Q`` quantized tokens).
        * ``k < Q``: quantized groups past the cut are freed; groups before it keep their codes untouched; the
          ``k % G`` kept tokens of the cut group move to the residual window as their dequantized values (no token
          is re-quantized by the crop). The keys/values that attention reads afterwards are, bit for bit, the
          first ``k`` of those it read before, so further decoding (until the next flush) gives the logits of a
          ``DynamicCache`` holding those dequantized tokens. The restored tokens are quantized again when a later
          flush reaches them (``KIVIState.restored_tokens`` counts them).

        ``nbytes()``/``nbytes_breakdown()`` count only the kept tokens; freed blocks are released, the unused
        tail of the last kept block is ``allocated_unused``. The fused path needs nothing more: the next step hands
        the kept blocks to kvlab attention.

        Raises:
            TypeError: ``tokens_to_remove`` not an integer (nothing is changed).

        Source: transformers ``Cache.crop`` / ``DynamicLayer.crop``; KIVI (arXiv:2402.02750) section 3.2 for the groups.
        """
        crop_keep(tokens_to_remove, 0)  # refuse a bad argument before any layer changes
        for layer in self.layers:
            layer.crop(tokens_to_remove)

    def __repr__(self) -> str:
        c = self.kivi_config
        bits = (
            f"nbits={c.nbits}" if c.nbits is not None else f"key_bits={c.key_bits}, value_bits={c.value_bits}"
        )
        return f"KIVICache({bits}, group_size={c.group_size}, residual_length={c.residual_length})"

    def attention_paths(self) -> list[str]:
        """What the fused attention of this cache's layers ran so far, sorted, once each
        (:func:`kvlab.attention.quantized.path_words`: ``"int8 (avx2)"``, ``"exact"``, ``"exact (torch: ...)"``);
        ``[]`` where none ran (the dequantize path, or nothing quantized yet)."""
        return sorted({words for layer in self.layers for words in getattr(layer, "paths", {}).values()})

    def nbytes_breakdown(self) -> dict[str, int]:
        """Exact bytes held, summed over layers: ``codes``, ``scales_zeros``, ``residual``, ``total``, plus
        ``allocated_unused`` (block and residual capacity not yet filled; not in ``total``)."""
        out = {"codes": 0, "scales_zeros": 0, "residual": 0, "total": 0, "allocated_unused": 0}
        out.update(key_codes=0, value_codes=0)  # the two halves of `codes` (key_bits vs value_bits)
        for layer in self.layers:
            for key, value in layer.state.nbytes_breakdown().items():
                out[key] += value
        return out

    def nbytes(self) -> int:
        """Exact bytes of the stored state: packed codes + scales/zeros + residual window, all layers."""
        return self.nbytes_breakdown()["total"]

    def quantized_tokens(self, layer_idx: int = 0) -> int:
        """Tokens held quantized in layer ``layer_idx``."""
        return self.layers[layer_idx].state.quantized_tokens if layer_idx < len(self.layers) else 0
