"""``FloatKernelCache`` (``dynamic-ckernel``): transformers' ``DynamicCache`` whose decode attention runs kvlab's
float C kernel instead of SDPA, the fair float baseline of the quantized CPU kernels.

The cache holds exactly what ``DynamicCache`` holds (K/V in the model dtype, every token); only the attention of a
one-token step differs: each layer hands its whole K/V to kvlab attention in the forward context
(:mod:`kvlab.attention.context`), which runs :func:`kvlab.attention.cpu_baseline.float_decode_attention` (bf16 /
fp16 / fp32 K/V read by the same vectorized, threaded C code style as the KIVI kernel, fp32 accumulation) where it
takes the call, SDPA otherwise (a prefill, a GPU, a padded batch, a head_dim it does not take).
:meth:`FloatKernelCache.attention_paths` says which ran, for the records. ``kvlab bench decode`` then reads the KIVI
kernel's time per token against a float kernel of the same make, not only against SDPA's single-query CPU path.

Source: the decode attention of FlashDecoding / vLLM's paged attention (one query, the full K/V read once per KV
head); :mod:`kvlab.attention.cpu_baseline`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from transformers import DynamicCache

from kvlab.attention.context import Handoff, current


@dataclass
class PendingFloat(Handoff):
    """A ``FloatKernelCache`` layer's K/V for the attention of its one-token step (the key is what it returned)."""

    cache: ClassVar[str] = "FloatKernelCache (dynamic-ckernel)"
    what: ClassVar[str] = "K/V"

    ran: dict | None = None  # the cache's record of what ran, {reason or "": words}

    def attend(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        """:func:`kvlab.attention.cpu_baseline.float_decode_attention` over ``key/value [B, Hkv, T, D]`` when it
        takes the call (one query token, every key attended, no dropout or sliding window), else SDPA."""
        from kvlab.attention import cpu_baseline, cpu_kernel
        from kvlab.attention.interface import sdpa

        why = _refusal(query, key, value, attention_mask, dropout, kwargs)
        if self.ran is not None and why not in self.ran:
            self.ran[why] = f"float C kernel ({cpu_kernel.isa()})" if why is None else f"sdpa ({why})"
        if why is not None:
            return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = cpu_baseline.float_decode_attention(query, key, value, scale)
        return out.transpose(1, 2).contiguous(), None


def _refusal(query, key, value, attention_mask, dropout, kwargs) -> str | None:
    """Why the float kernel does not take this attention call (``None`` when it does)."""
    from kvlab.attention import cpu_baseline, cpu_kernel
    from kvlab.attention.kivi_checks import valid_tokens

    if query.shape[2] != 1:
        return f"{query.shape[2]} query tokens: the kernel takes a decode step"
    if dropout or kwargs.get("sliding_window") is not None:
        return "dropout or a sliding window"
    if attention_mask is not None and (
        attention_mask.shape[-1] != key.shape[2] or not bool(valid_tokens(attention_mask).all())
    ):
        return "a mask that drops keys (padding)"
    return cpu_baseline.float_unsupported(query, key, value) or cpu_kernel.unavailable_reason()


class FloatKernelCache(DynamicCache):
    """``DynamicCache`` whose one-token steps hand their K/V to kvlab attention's float C kernel (the model must
    run :func:`kvlab.attention.enable`). Logits equal ``DynamicCache``'s up to fp32 rounding (the kernel sums in
    another order).

    Raises:
        RuntimeError: at the end of a forward of a model that does not run kvlab attention
            (:meth:`kvlab.attention.context.ForwardContext.check_read`).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._paths: dict = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """``DynamicCache.update``; a one-token step inside a forward context also files the layer's K/V for its
        attention (:class:`PendingFloat`)."""
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        ctx = current()
        if ctx is not None and key_states.shape[-2] == 1:
            ctx.hand_off(layer_idx, PendingFloat(key=keys, ran=self._paths))
        return keys, values

    def attention_paths(self) -> list[str]:
        """What this cache's decode attention ran so far, sorted, once each: ``"float C kernel (avx2)"`` or
        ``"sdpa (<why the kernel did not take it>)"``; ``[]`` before a decode step."""
        return sorted(set(self._paths.values()))
