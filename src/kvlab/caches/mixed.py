"""``MixedCache``: each layer holds its keys and values in the format a plan gives it (KIVI bits, FP8, float).

Per-layer precision as KVQuant (arXiv:2401.18079) keeps sensitive parts in higher precision and KVTuner / ZipCache
allocate bits per layer; the plan comes from a measured sweep (``kvlab sensitivity``, docs/MIXED.md). The plan
format and its names are :mod:`kvlab.plan.mixed` (torch-free; its :func:`~kvlab.plan.mixed.plan_kv_bytes` equals
:meth:`MixedCache.nbytes`). Each layer is one of kvlab's own layer objects, so quantization is theirs:

* both KIVI (``kivi-N``, keys and values at their own widths): :class:`kvlab.caches.kivi.KIVILayer`;
* both ``fp8-e4m3``: :class:`kvlab.caches.fp8.FP8Layer` (per-head scales calibrated on the prefill);
* both ``float``: a transformers ``DynamicLayer`` in the model dtype.

Every layer returns dequantized K/V to the model's attention (the dequantize path of each family); nothing is handed
to kvlab attention, so any attention implementation reads it.

Usage::

    cache = MixedCache({"layers": {"0": {"k": "float", "v": "float"}, "*": {"k": "kivi-4", "v": "kivi-2"}}},
                       config=model.config)
    model.generate(input_ids, cache=cache, max_new_tokens=64)  # past_key_values=cache before transformers 5.24
    cache.nbytes(), cache.nbytes_breakdown()
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers.cache_utils import Cache, DynamicLayer

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.caches.base import KVLayer, check_full_attention
from kvlab.caches.crop import crop_keep, crop_kv
from kvlab.caches.fp8 import FP8Layer
from kvlab.caches.kivi import KIVILayer
from kvlab.plan.mixed import family, kivi_bits, layer_formats
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


def _layer(k: str, v: str, group_size: int, residual_length: int) -> Any:
    """The layer object for one ``(k, v)`` pair of formats (of one family: :func:`kvlab.plan.mixed.check_pair`)."""
    if family(k) == "kivi":
        config = KIVIConfig(
            nbits=None,
            key_bits=kivi_bits(k),
            value_bits=kivi_bits(v),
            group_size=group_size,
            residual_length=residual_length,
        )
        return KIVILayer(config, "dequantize")
    if family(k) == "fp8":
        return FP8Layer("e4m3", "per-head", "none", "dequantize")
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

    Raises:
        ValueError: a plan naming a layer the model lacks, an unknown format, K and V of different families in one
            layer, a layer without formats (:func:`kvlab.plan.mixed.layer_formats`: one line naming the value); a
            model whose layers are not all full attention; no ``config``; KIVI settings ``KIVIConfig`` refuses, or
            a head_dim that ``group_size`` does not divide.

    Source: KIVI (arXiv:2402.02750, section 3) and the mechanics chapter's FP8 section for the formats; KVQuant
    (arXiv:2401.18079) and KVTuner for precision chosen per layer; docs/MIXED.md for how kvlab chooses it.
    """

    def __init__(
        self,
        plan: Mapping,
        config: Any = None,
        group_size: int = KIVI_DEFAULTS.group_size,
        residual_length: int = KIVI_DEFAULTS.residual_length,
    ):
        if config is None:
            raise ValueError(
                "MixedCache needs the model config (model.config): a plan's formats are per layer"
            )
        from kvlab.caches.rope import model_text_config

        n_layers = check_full_attention(config, "MixedCache")
        text = model_text_config(config)
        self.formats = layer_formats(plan, n_layers)
        self.group_size, self.residual_length = group_size, residual_length
        layers = [_layer(k, v, group_size, residual_length) for k, v in self.formats]
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        for layer in layers:
            if isinstance(layer, KIVILayer):
                layer.config.check_head_dim(head_dim)
        super().__init__(layers=layers)

    def __repr__(self) -> str:
        return f"MixedCache({len(self.layers)} layers, G={self.group_size}, R={self.residual_length})"

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
