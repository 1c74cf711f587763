"""kvlab's attention function for transformers' ``AttentionInterface``: fused KIVI attention, rotated FP8 reads,
else SDPA.

``enable(model)`` registers the function under the name ``"kvlab"`` (with SDPA's mask builder) and switches the
model to it. For every layer it then checks whether a cache in ``attention="fused"`` mode left something for it
(:func:`pending`): a :class:`kvlab.caches.KIVICache` its quantized prefix (:class:`PendingPrefix`: it runs
:func:`kvlab.attention.quantized.kivi_attention`, no float copy of the quantized history), an
:class:`kvlab.caches.fp8.FP8Cache` with a Hadamard rotation the rotation its K/V are stored in
(:class:`PendingRotation`: the query is rotated instead of every stored key, and the output rotated back);
otherwise it is exactly transformers' SDPA attention, so any other cache keeps working unchanged.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from kvlab.attention.quantized import kivi_attention
from kvlab.runtime.dtypes import float32_attention

NAME = "kvlab"
_local = threading.local()


@dataclass(kw_only=True)
class Handoff:
    """What a fused-mode cache layer hands to the attention of the same layer and step (read once)."""

    owner: Any = None  # the cache layer that wrote this entry
    consumed: bool = False
    # the keys the cache returned with this entry: the entry belongs to that call only
    key: torch.Tensor | None = None

    def matches(self, key: torch.Tensor) -> bool:
        """Whether ``key`` is the key window this entry was handed off with (the same tensor or a view of it)."""
        k = self.key
        return k is None or key is k or (key.shape == k.shape and key.data_ptr() == k.data_ptr())


@dataclass
class PendingPrefix(Handoff):
    """A fused-mode KIVI layer's quantized prefix (the key window is what the cache returned)."""

    segments: list  # QuantSegmentView, oldest first: the quantized prefix before this step's flush
    nbits: int
    group_size: int


@dataclass
class PendingRotation(Handoff):
    """A fused-mode FP8 layer's rotations: the keys and values it returned are ``K R_k`` and ``V R_v``."""

    key_rotation: torch.Tensor  # [head_dim, head_dim] fp32, orthonormal
    value_rotation: torch.Tensor  # [head_dim_v, head_dim_v] fp32, orthonormal


def check_handoff(
    layer_idx: int | None, owner: Any, cache: str, what: str, siblings: tuple | list = ()
) -> None:
    """Raise if ``owner`` (a cache layer) handed the attention of ``layer_idx`` something it never read: the model
    does not run kvlab attention (or changed the returned K/V before its attention: the entry matches only the
    tensor the cache returned) and the output computed from it is wrong. ``owner``'s entries (and its
    ``siblings``', the other layers of its cache) are dropped first. O(1) unless it raises. The last layer of a
    forward is checked only by the next forward, so the caches hand nothing off on a one-layer model (its only
    layer would go unchecked for a step): they run their dequantize path there.

    Args:
        layer_idx: the layer whose entry is checked (the same layer of the previous step).
        owner: the cache layer that would have written it.
        cache: the cache as the message names it (``"KIVICache(attention='fused')"``).
        what: what was handed off (``"quantized prefix"``).
        siblings: the other layers of ``owner``'s cache.

    Raises:
        RuntimeError: the entry is ``owner``'s and was not consumed.
    """
    table = pending()
    entry = table.get(layer_idx)
    if entry is None or entry.owner is not owner or entry.consumed:
        return
    for idx in [i for i, e in table.items() if e.owner is owner or any(e.owner is x for x in siblings)]:
        del table[idx]
    raise RuntimeError(
        f"{cache} needs kvlab attention on the model: call kvlab.attention.enable(model) first (layer {layer_idx}'s "
        f"{what} was never read; if kvlab attention is enabled, the model changed the K/V the cache returned before "
        f"its attention read them, e.g. repeated them per expert, and this cache cannot run on it)"
    )


def check_previous_layer(layers: list, layer_idx: int, cache: str, what: str) -> None:
    """:func:`check_handoff` for the layer before ``layer_idx`` in this forward (a cache's ``update`` calls it
    before its layer ``layer_idx`` runs); ``layers``: the cache's layers."""
    if 0 < layer_idx <= len(layers):
        check_handoff(layer_idx - 1, layers[layer_idx - 1], cache, what, siblings=layers)


def pending() -> dict[int, Handoff]:
    """This thread's hand-off table: layer index -> :class:`PendingPrefix` or :class:`PendingRotation`."""
    table = getattr(_local, "table", None)
    if table is None:
        table = _local.table = {}
    return table


def observers() -> dict[int, Any]:
    """This thread's query requests: layer index -> ``callback(query, key, scale)``, called once after that layer's
    next attention with the query states it used (SnapKV's observation window reads them)."""
    table = getattr(_local, "observers", None)
    if table is None:
        table = _local.observers = {}
    return table


def kvlab_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention signature: ``query [B, Hq, q, D]``, ``key/value [B, Hkv, kv, D]`` ->
    ``([B, q, Hq, D], None)``; then hands ``query`` to a cache that asked for it (:func:`observers`)."""
    out = _attend(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    observer = observers().pop(getattr(module, "layer_idx", None), None)
    if observer is not None:
        observer(query, key, scaling)
    return out


def sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention (``query [B, Hq, q, D]``, ``key/value [B, Hkv, kv, D]`` ->
    ``([B, q, Hq, D], None)``), in float32 on bf16/fp16 CPU tensors while
    :func:`kvlab.runtime.dtypes.float32_attention` holds (inputs and a float mask widened exactly, the output
    rounded back to the query's dtype); otherwise transformers' function unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.device.type == "cpu" and query.dtype in (torch.bfloat16, torch.float16) and float32_attention():
        if attention_mask is not None and attention_mask.dtype.is_floating_point:
            attention_mask = attention_mask.float()
        out, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
        return out.to(query.dtype), weights
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _attend(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention signature: ``query [B, Hq, q, D]``, ``key/value [B, Hkv, kv, D]`` ->
    ``([B, q, Hq, D], None)``."""
    layer_idx = getattr(module, "layer_idx", None)
    table = pending()
    entry = table.get(layer_idx)
    # an entry is read only with the key window it was handed off with: one left behind by a forward that failed
    # between the cache update and the attention is never applied to another cache's keys
    if entry is None or entry.consumed or not entry.matches(key):
        return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if isinstance(entry, PendingRotation):
        entry.consumed = True
        del table[layer_idx]
        return _rotated(
            module, query, key, value, attention_mask, entry, dropout=dropout, scaling=scaling, **kwargs
        )
    if kwargs.get("sliding_window") is not None:
        raise ValueError(
            f"fused KIVI attention supports full attention only, got sliding_window={kwargs['sliding_window']}"
        )
    if dropout:
        raise ValueError(f"fused KIVI attention does not apply attention dropout, got dropout={dropout}")
    entry.consumed = True
    del table[layer_idx]  # read once; the table must not keep the cache's blocks alive after the step
    if not entry.segments:  # nothing quantized yet (prefill): the window is the whole history, SDPA is exact
        return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = kivi_attention(
        query, entry.segments, key, value, entry.nbits, entry.group_size, scale, attention_mask
    )
    return out.transpose(1, 2).contiguous(), None


def _rotated(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    entry: PendingRotation,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA over keys and values stored rotated (``K R_k``, ``V R_v``): ``softmax((q R_k)(K R_k)^T) (V R_v) R_v^T``
    equals ``softmax(q K^T) V`` for orthonormal ``R``, at the cost of rotating the ``q`` query rows and the output
    instead of every stored token. ``query [B, Hq, q, D]``, ``key/value [B, Hkv, kv, D]`` -> ``([B, q, Hq, D],
    None)``; the rotations run in float32, the query is then cast to the keys' dtype (float32 when the cache
    returns float32 K/V) and the output to the query's."""
    q = (query.to(torch.float32) @ entry.key_rotation).to(key.dtype)
    out, _ = sdpa(module, q, key, value, attention_mask, **kwargs)
    return (out.to(torch.float32) @ entry.value_rotation.T).to(query.dtype), None


def register() -> None:
    """Register ``"kvlab"`` in transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, kvlab_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def enable(model: Any) -> Any:
    """Switch ``model`` to kvlab attention (fused KIVI where a fused KIVICache is used, SDPA otherwise).

    Returns the model. Raises whatever ``set_attn_implementation`` raises for models that do not support custom
    attention functions.
    """
    register()
    model.set_attn_implementation(NAME)
    return model


def is_enabled(model: Any) -> bool:
    """Whether ``model`` currently uses kvlab attention."""
    return getattr(model.config, "_attn_implementation", None) == NAME
