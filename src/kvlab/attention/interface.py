"""kvlab's attention function for transformers' ``AttentionInterface``: fused KIVI attention, fused FP8 reads,
else SDPA.

``enable(model)`` registers the function under the name ``"kvlab"`` (with SDPA's mask builder) and switches the
model to it. For every layer it then checks whether a cache in ``attention="fused"`` mode left something for it
(:func:`pending`): a :class:`kvlab.caches.KIVICache` its quantized prefix (:class:`PendingPrefix`: it runs
:func:`kvlab.attention.quantized.kivi_attention`, no float copy of the quantized history), an
:class:`kvlab.caches.fp8.FP8Cache` its float8 history (:class:`PendingFP8`: read in place by the CPU kernel of
:mod:`kvlab.attention.cpu_kernel`; with a Hadamard rotation the query is rotated instead of every stored key, and
the output rotated back);
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

    def check_call(self, dropout: float, kwargs: dict) -> None:
        """Refuse (``ValueError``) an attention call this entry cannot serve, before it is consumed (hook)."""

    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """Attention of ``query [B, Hq, q, D]`` over what was handed off and the window ``key/value [B, Hkv, t,
        D]`` -> ``([B, q, Hq, D], None)`` (hook: each kind of hand-off reads its own history)."""
        raise NotImplementedError(f"{type(self).__name__} must implement attend")


@dataclass
class PendingPrefix(Handoff):
    """A fused-mode KIVI layer's quantized prefix (the key window is what the cache returned)."""

    segments: list  # QuantSegmentView, oldest first: the quantized prefix before this step's flush
    nbits: int
    group_size: int

    def check_call(self, dropout: float, kwargs: dict) -> None:
        """Fused KIVI attention is full attention without dropout.

        Raises:
            ValueError: a sliding window or a dropout probability.
        """
        if kwargs.get("sliding_window") is not None:
            raise ValueError(
                f"fused KIVI attention supports full attention only, got sliding_window={kwargs['sliding_window']}"
            )
        if dropout:
            raise ValueError(f"fused KIVI attention does not apply attention dropout, got dropout={dropout}")

    def attend(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        """:func:`kvlab.attention.quantized.kivi_attention` over the quantized prefix and the window; SDPA while
        nothing is quantized yet (prefill: the window is the whole history, exact)."""
        if not self.segments:
            return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = kivi_attention(
            query, self.segments, key, value, self.nbits, self.group_size, scale, attention_mask
        )
        return out.transpose(1, 2).contiguous(), None


@dataclass
class PendingFP8(Handoff):
    """A fused-mode FP8 layer's history: the ``T`` tokens stored before this step as codes (the key and value it
    returned are this step's tokens only, the window); with a rotation, all of them are in the rotated basis
    (``K R_k``, ``V R_v``)."""

    key_codes: torch.Tensor  # [B, Hkv, T, D] float8 (e4m3fn or e5m2)
    value_codes: torch.Tensor  # [B, Hkv, T, D] float8
    key_scale: torch.Tensor | None  # [B, Hkv or 1, 1, 1] fp32, None = 1.0
    value_scale: torch.Tensor | None
    key_rotation: torch.Tensor | None = None  # [D, D] fp32 orthonormal, None = not rotated
    value_rotation: torch.Tensor | None = None

    def attend(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        """Attention over the FP8 history then the window (:func:`_fp8`)."""
        return _fp8(
            module, query, key, value, attention_mask, self, dropout=dropout, scaling=scaling, **kwargs
        )


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
    """This thread's hand-off table: layer index -> :class:`PendingPrefix` or :class:`PendingFP8`."""
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
    entry.check_call(dropout, kwargs)  # refused before it is consumed: the cache's check still sees it unread
    entry.consumed = True
    del table[layer_idx]  # read once; the table must not keep the cache's blocks alive after the step
    return entry.attend(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def _fp8(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    entry: PendingFP8,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention over an FP8 history (``entry``: ``T`` tokens of codes) followed by the window ``key/value
    [B, Hkv, t, D]`` (this step's tokens): ``query [B, Hq, q, D]`` -> ``([B, q, Hq, D], None)``.

    Decode-sized CPU calls (:func:`kvlab.attention.cpu_kernel.fp8_unsupported`) run the compiled kernel, which reads
    the codes in place; anything else (a GPU, a prefill chunk after the first, dropout, a sliding window) decodes
    the codes once here and runs :func:`sdpa`. With a rotation, ``softmax((q R_k)(K R_k)^T) (V R_v) R_v^T`` equals
    ``softmax(q K^T) V`` for orthonormal ``R``: the query rows and the output are rotated (fp32), not the history.

    Raises:
        ValueError: a mask that does not cover ``[1 or B, 1, q, T + t]`` keys (the kernel path checks it as
            :func:`kvlab.attention.quantized.kivi_attention` does).
    """
    from kvlab.attention import cpu_kernel
    from kvlab.attention.kivi_checks import check_mask, valid_tokens
    from kvlab.quant.fp8 import decode

    q = query if entry.key_rotation is None else query.to(torch.float32) @ entry.key_rotation
    rows = query.shape[1] // key.shape[1] * query.shape[2]
    kernel = (
        not dropout
        and kwargs.get("sliding_window") is None
        and rows <= cpu_kernel.MAX_ROWS
        and cpu_kernel.fp8_unsupported(q, entry.key_codes, key) is None
        and cpu_kernel.unavailable_reason() is None
    )
    if kernel:
        t = entry.key_codes.shape[2]
        check_mask(q, key, attention_mask, None, t + key.shape[2])
        valid = None if attention_mask is None else valid_tokens(attention_mask)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = cpu_kernel.fp8_decode_attention(
            q, entry.key_codes, entry.value_codes, entry.key_scale, entry.value_scale, key, value, scale, valid,
            key.shape[2] - query.shape[2],
        ).transpose(1, 2)  # fmt: skip
    else:
        k = torch.cat((decode(entry.key_codes, entry.key_scale, key.dtype), key), dim=-2)
        v = torch.cat((decode(entry.value_codes, entry.value_scale, value.dtype), value), dim=-2)
        out, _ = sdpa(module, q.to(k.dtype), k, v, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if entry.value_rotation is not None:
        out = out.to(torch.float32) @ entry.value_rotation.T
    return out.to(query.dtype).contiguous(), None


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
