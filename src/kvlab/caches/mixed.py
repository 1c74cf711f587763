"""``MixedCache``: each layer holds its keys and values in the format a plan gives it (KIVI bits, FP8, float).

Per-layer precision as KVQuant (arXiv:2401.18079) keeps sensitive parts in higher precision and KVTuner / ZipCache
allocate bits per layer; the plan comes from a measured sweep (``kvlab sensitivity``, docs/MIXED.md). The plan
format and its names are :mod:`kvlab.plan.mixed` (torch-free; its :func:`~kvlab.plan.mixed.plan_kv_bytes` equals
:meth:`MixedCache.nbytes`). Each layer is one of kvlab's own layer objects, so quantization is theirs:

* both KIVI (``kivi-N``, keys and values at their own widths): :class:`kvlab.caches.kivi.KIVILayer`;
* both ``fp8-e4m3``: :class:`kvlab.caches.fp8.FP8Layer` (per-head scales calibrated on the prefill);
* both ``float``: a transformers ``DynamicLayer`` in the model dtype.

Two attention paths, as :class:`kvlab.caches.KIVICache`'s ``attention``: ``"dequantize"`` (default) returns every
layer's history as K/V in the model dtype, so any attention implementation reads it; ``"fused"`` hands each layer's
quantized history to kvlab attention in the forward's context (:mod:`kvlab.attention.context`; the model must run
:func:`kvlab.attention.enable`): a KIVI layer its packed prefix at its own bits
(:class:`~kvlab.attention.interface.PendingPrefix`), an FP8 layer its codes
(:class:`~kvlab.attention.interface.PendingFP8`), a float layer nothing (SDPA). A KIVI layer the fused reader cannot
take (keys and values at different widths, ``kivi-k8v4``-style; or ``group_size * bits`` not a multiple of 8) stays
on the dequantize path in a fused cache; :attr:`MixedCache.layer_attention` says which path each layer takes
(:func:`kvlab.plan.mixed.layer_attention`). Both paths hold the same bytes.

Usage::

    cache = MixedCache({"layers": {"0": {"k": "float", "v": "float"}, "*": {"k": "kivi-4", "v": "kivi-2"}}},
                       config=model.config)
    model.generate(input_ids, cache=cache, max_new_tokens=64)  # past_key_values=cache before transformers 5.24
    cache.nbytes(), cache.nbytes_breakdown()
    kvlab.attention.enable(model)  # the fused path: kvlab attention reads each layer's codes in place
    model.generate(input_ids, cache=MixedCache(plan, config=model.config, attention="fused"), max_new_tokens=64)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers.cache_utils import Cache, DynamicLayer

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.caches.base import KVLayer, check_full_attention
from kvlab.caches.crop import crop_keep, crop_kv
from kvlab.caches.fp8 import FP8Layer
from kvlab.caches.kivi import ATTENTION_PATHS, KIVILayer
from kvlab.plan.mixed import family, kivi_bits, layer_attention, layer_formats
from kvlab.quant.kivi import KIVIConfig


class FloatLayer(KVLayer, DynamicLayer):
    """A ``DynamicLayer`` (``keys``/``values`` ``[batch, kv_heads, tokens, head_dim]`` in the model dtype) whose
    ``crop`` reads its argument as kvlab's other layers do (:mod:`kvlab.caches.crop`: a positive ``n`` keeps the
    first ``n`` tokens) and whose batch rows are :class:`~kvlab.caches.base.KVLayer`'s (indices checked)."""

    is_croppable = True
    cache_name = "MixedCache"

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' ``crop`` (``-n`` drops the newest ``n``, a positive ``n`` keeps the first ``n``).

        Raises:
            TypeError: ``tokens_to_remove`` not an integer.
        """
        crop_kv(self, tokens_to_remove)

    def nbytes(self) -> int:
        """Bytes of the stored keys and values."""
        if not self.is_initialized:
            return 0
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values))


def _layer(k: str, v: str, group_size: int, residual_length: int, path: str) -> Any:
    """The layer object for one ``(k, v)`` pair of formats (of one family: :func:`kvlab.plan.mixed.check_pair`),
    read on ``path`` (:func:`kvlab.plan.mixed.layer_attention`: ``"fused"``, ``"dequantize"`` or ``"float"``)."""
    attention = "fused" if path == "fused" else "dequantize"
    if family(k) == "kivi":
        config = KIVIConfig(
            nbits=None,
            key_bits=kivi_bits(k),
            value_bits=kivi_bits(v),
            group_size=group_size,
            residual_length=residual_length,
        )
        return KIVILayer(config, attention)
    if family(k) == "fp8":
        return FP8Layer("e4m3", "per-head", "none", attention)
    return FloatLayer()


def _layer_bytes(layer: Any) -> int:
    if isinstance(layer, KIVILayer):
        return layer.state.nbytes_breakdown()["total"]
    if isinstance(layer, FP8Layer):
        return layer.nbytes_breakdown()["total"]
    return layer.nbytes()


class MixedCache(Cache):
    """A KV cache whose layers each store K and V in the formats of a plan (:mod:`kvlab.plan.mixed`).

    Args:
        plan: the plan's JSON object (``{"layers": {"0": {"k": "kivi-8", "v": "kivi-4"}, "*": {...}}}``).
        config: the model config (``model.config``): the layers are made up front, one per decoder layer.
        group_size, residual_length: KIVI ``G`` and ``R`` of every KIVI layer (as :class:`kvlab.caches.KIVICache`).
        attention: ``"dequantize"`` (default: every layer returns its history as float K/V, any attention reads
            them) or ``"fused"`` (each layer that can hands its codes to kvlab attention: see the module docstring;
            :attr:`layer_attention` lists each layer's path). Same stored bytes either way.

    Raises:
        ValueError: a plan naming a layer the model lacks, an unknown format, K and V of different families in one
            layer, a layer without formats (:func:`kvlab.plan.mixed.layer_formats`: one line naming the value); a
            model whose layers are not all full attention; no ``config``; KIVI settings ``KIVIConfig`` refuses, or
            a head_dim that ``group_size`` does not divide; an unknown ``attention``.
        RuntimeError: fused mode, at a decode step, with no forward context open (a model without
            :func:`kvlab.attention.enable`), or a forward whose attention left a layer's hand-off unread (as
            :class:`kvlab.caches.KIVICache` and :class:`kvlab.caches.fp8.FP8Cache` in fused mode).

    Source: KIVI (arXiv:2402.02750, section 3) and the mechanics chapter's FP8 section for the formats; KVQuant
    (arXiv:2401.18079) and KVTuner for precision chosen per layer; docs/MIXED.md for how kvlab chooses it.
    """

    def __init__(
        self,
        plan: Mapping,
        config: Any = None,
        group_size: int = KIVI_DEFAULTS.group_size,
        residual_length: int = KIVI_DEFAULTS.residual_length,
        attention: str = "dequantize",
    ):
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"`attention` must be one of {list(ATTENTION_PATHS)}, got {attention!r}")
        if config is None:
            raise ValueError(
                "MixedCache needs the model config (model.config): a plan's formats are per layer"
            )
        from kvlab.caches.rope import model_text_config

        n_layers = check_full_attention(config, "MixedCache")
        text = model_text_config(config)
        self.formats = layer_formats(plan, n_layers)
        self.group_size, self.residual_length = group_size, residual_length
        self.attention = attention
        # per layer: "fused" (hands its codes to kvlab attention), "dequantize" or "float"
        self.layer_attention = [layer_attention(k, v, attention, group_size) for k, v in self.formats]
        layers = [
            _layer(k, v, group_size, residual_length, path)
            for (k, v), path in zip(self.formats, self.layer_attention)
        ]
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        for layer in layers:
            layer.cache_name = "MixedCache"  # its errors (a fused layer's hand-off) name this cache
            if isinstance(layer, KIVILayer):
                layer.config.check_head_dim(head_dim)
        super().__init__(layers=layers)

    def __repr__(self) -> str:
        return (
            f"MixedCache({len(self.layers)} layers, G={self.group_size}, R={self.residual_length}, "
            f"attention={self.attention!r})"
        )

    def update(self, key_states, value_states, layer_idx: int, *args: Any, **kwargs: Any):
        """``Cache.update`` (``[B, H, t, D]`` keys/values in, the K/V this step's attention reads out); a layer on
        the fused path gets ``layer_idx`` to file its hand-off under (:mod:`kvlab.attention.context`) and returns
        only its full-precision window (KIVI) or this step's tokens (FP8).

        Raises:
            ValueError: as the layer's ``update`` (bad shapes or dtypes, inf/NaN for FP8).
            RuntimeError: a fused layer holding quantized tokens with no forward context open.
        """
        if 0 <= layer_idx < len(self.layer_attention) and self.layer_attention[layer_idx] == "fused":
            kwargs["kvlab_layer_idx"] = layer_idx
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the newest tokens of every layer (transformers' ``Cache.crop``; see :mod:`kvlab.caches.crop`): a
        KIVI layer as :meth:`kvlab.caches.KIVICache.crop`, FP8 and float layers exactly.

        Raises:
            TypeError: ``tokens_to_remove`` not an integer (nothing is changed).
        """
        crop_keep(tokens_to_remove, 0)
        for layer in self.layers:
            layer.crop(tokens_to_remove)

    def nbytes_layers(self) -> list[int]:
        """Exact bytes each layer holds (codes + scales/zeros + residual window; FP8 codes + scales; float K/V)."""
        return [_layer_bytes(layer) for layer in self.layers]

    def nbytes_breakdown(self) -> dict[str, int]:
        """Exact bytes held by the layers of each family (``kivi``, ``fp8``, ``float``) and their ``total``."""
        out = {"kivi": 0, "fp8": 0, "float": 0, "total": 0}
        for (k, _), n in zip(self.formats, self.nbytes_layers()):
            out[family(k)] += n
            out["total"] += n
        return out

    def nbytes(self) -> int:
        """Exact bytes of the stored state, all layers (equal to :func:`kvlab.plan.mixed.plan_kv_bytes`)."""
        return self.nbytes_breakdown()["total"]
