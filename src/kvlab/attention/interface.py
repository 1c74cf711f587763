"""kvlab's attention function for transformers' ``AttentionInterface``: fused KIVI attention, fused FP8 reads,
else SDPA.

``enable(model)`` registers the function under the name ``"kvlab"`` (with SDPA's mask builder), switches the
model to it, and opens one forward context per forward of the model (:mod:`kvlab.attention.context`). For every
layer the attention then takes what a cache in ``attention="fused"`` mode handed it in that context: a
:class:`kvlab.caches.KIVICache` its quantized prefix (:class:`PendingPrefix`: it runs
:func:`kvlab.attention.quantized.kivi_attention`, no float copy of the quantized history), an
:class:`kvlab.caches.fp8.FP8Cache` its float8 history (:class:`PendingFP8`: read in place by the CPU kernel of
:mod:`kvlab.attention.cpu_kernel`; with a Hadamard rotation the query is rotated instead of every stored key, and
the output rotated back); and it gives its query states to a cache that asked for them (the context's observers).
Otherwise it is exactly transformers' SDPA attention, so any other cache keeps working unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvlab.attention.context import Handoff, current, install_hooks
from kvlab.attention.quantized import kivi_attention
from kvlab.runtime.dtypes import float32_attention

NAME = "kvlab"


@dataclass
class PendingPrefix(Handoff):
    """A fused-mode KIVI layer's quantized prefix (the key window is what the cache returned)."""

    cache: ClassVar[str] = "KIVICache(attention='fused')"
    what: ClassVar[str] = "quantized prefix"

    segments: list  # QuantSegmentView, oldest first: the quantized prefix before this step's flush
    nbits: int
    group_size: int
    dot: str | None = None  # the CPU kernel's key-score path (kivi_attention's `dot`)
    ran: dict | None = None  # the layer's record of the paths that ran (kivi_attention's `ran`)

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
        """:func:`kvlab.attention.quantized.kivi_attention` over the quantized prefix (at least one segment: a
        cache with nothing quantized hands nothing off) and the window."""
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = kivi_attention(
            query, self.segments, key, value, self.nbits, self.group_size, scale, attention_mask,
            dot=self.dot, ran=self.ran,
        )  # fmt: skip
        return out.transpose(1, 2).contiguous(), None


@dataclass
class PendingFP8(Handoff):
    """A fused-mode FP8 layer's history: the ``T`` tokens stored before this step as codes (the key and value it
    returned are this step's tokens only, the window); with a rotation, all of them are in the rotated basis
    (``K R_k``, ``V R_v``)."""

    cache: ClassVar[str] = "FP8Cache(attention='fused')"
    what: ClassVar[str] = "FP8 history"

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
    ``([B, q, Hq, D], None)``.

    In an open forward context (:func:`kvlab.attention.context.current`) it takes the layer's hand-off, when it came
    with this very ``key`` (:meth:`kvlab.attention.context.ForwardContext.take`), and runs its ``attend``; SDPA
    otherwise (no context, no entry, or K/V the model changed after the cache returned them, e.g. repeated per
    expert: the entry then stays unread and the context's check at the end of the forward raises). Then it hands
    ``query`` to the layer's observer, if a cache asked for it.

    Raises:
        ValueError: a call the entry cannot serve (:meth:`PendingPrefix.check_call`: dropout, a sliding window),
            before the entry is taken.
    """
    layer_idx = getattr(module, "layer_idx", None)
    ctx = current()
    entry = None if ctx is None else ctx.take(layer_idx, key)
    if entry is None:
        out = sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    else:
        entry.check_call(
            dropout, kwargs
        )  # refused before it is taken: the context's check still sees it unread
        ctx.done(layer_idx)
        out = entry.attend(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    observer = None if ctx is None else ctx.observers.pop(layer_idx, None)
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
    """Switch ``model`` to kvlab attention (fused KIVI/FP8 where a fused cache is used, SDPA otherwise) and open one
    forward context per forward of it (:func:`kvlab.attention.context.install_hooks`; kept if the model is later
    switched to another attention, so a fused cache there fails at the end of its forward instead of reading wrong).

    Returns the model. Raises whatever ``set_attn_implementation`` raises for models that do not support custom
    attention functions (then no hook is added).
    """
    register()
    model.set_attn_implementation(NAME)
    install_hooks(model)
    return model


def is_enabled(model: Any) -> bool:
    """Whether ``model`` currently uses kvlab attention."""
    return getattr(model.config, "_attn_implementation", None) == NAME
