"""``FP8Cache``: K/V stored as float8 (e4m3 or e5m2) with calibrated scales, cast back to the model dtype on read.

What serving engines ship as ``--kv-cache-dtype fp8`` (vLLM: ``fp8 | fp8_e4m3 | fp8_e5m2``, per-tensor or per-head
scales, 1.0 unless calibrated), measured the kvlab way: exact bytes (:meth:`FP8Cache.nbytes`: one byte per element
plus 4 B per scale, so half of a bf16 cache plus the scales) and the elements each layer saturated or flushed to
zero (:meth:`FP8Cache.counts`). Scales are computed once per sequence from its prefill (the first ``update`` of a
layer) and kept for every later token; a decode token beyond the prefill's range saturates and is counted. A token
is attended in full precision in the step that writes it and read back from FP8 afterwards (the prefill attends
with float K/V, as KIVI's and transformers' quantized caches do; ``kvlab eval`` can then share one float prefill).

The codec (formats, calibration, saturation) is :mod:`kvlab.quant.fp8`; the mechanics chapter's FP8 section says
why both formats and the scale matter.

Usage::

    cache = FP8Cache(format="e4m3", scale="per-head")
    model.generate(input_ids, cache=cache, max_new_tokens=64)
    cache.nbytes(), cache.nbytes_breakdown(), cache.counts()
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from transformers.cache_utils import Cache

from kvlab.caches.base import KVLayer
from kvlab.caches.crop import crop_keep, crop_kv
from kvlab.quant.fp8 import Encoded, calibrate, check_scale, decode, encode, fp8_dtype
from kvlab.quant.rotation import check_rotation, hadamard

ATTENTION_PATHS = ("dequantize", "fused")

COUNTS = ("key_saturated", "key_underflow", "value_saturated", "value_underflow", "elements")


class FP8Layer(KVLayer):
    """One layer: ``keys``/``values`` ``[batch, kv_heads, tokens, head_dim]`` in FP8, ``key_scale``/``value_scale``
    ``[batch, kv_heads or 1, 1, 1]`` fp32 (``None`` for ``scale="none"``); with ``rotation="hadamard"`` the codes
    hold ``K R`` and ``V R`` (``R``: :func:`kvlab.quant.rotation.hadamard` of the head_dim, ``key_rotation`` /
    ``value_rotation`` ``[head_dim, head_dim]`` fp32, a constant of the head_dim: not sequence state, not counted in
    the bytes) and the scales are calibrated on the rotated prefill. ``format``, ``scale``, ``rotation`` and
    ``attention``: as :class:`FP8Cache`, which checks them and holds their defaults."""

    cache_name = "FP8Cache"
    is_croppable = True

    def __init__(self, format: str, scale: str, rotation: str, attention: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.format, self.scale, self.rotation, self.attention = format, scale, rotation, attention
        self.key_scale: torch.Tensor | None = None
        self.value_scale: torch.Tensor | None = None
        self.key_rotation: torch.Tensor | None = None
        self.value_rotation: torch.Tensor | None = None
        self._counts: dict[str, torch.Tensor | int] = dict.fromkeys(COUNTS, 0)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Calibrate the scales on the first (prefill) states (rotated first with ``rotation="hadamard"``) and start
        empty FP8 storage.

        Raises:
            ValueError: ``rotation="hadamard"`` with a head_dim that is not a power of two (nothing is stored).
        """
        if self.rotation == "hadamard":
            self.key_rotation = hadamard(key_states.shape[-1], key_states.device)
            self.value_rotation = hadamard(value_states.shape[-1], value_states.device)
        self.dtype, self.device = key_states.dtype, key_states.device
        self.batch_size = key_states.shape[0]
        self.key_scale = calibrate(self._rotated(key_states, self.key_rotation), self.format, self.scale)
        self.value_scale = calibrate(
            self._rotated(value_states, self.value_rotation), self.format, self.scale
        )
        codes = fp8_dtype(self.format)
        b, h, _, d = key_states.shape
        self.keys = torch.empty(b, h, 0, d, dtype=codes, device=self.device)
        self.values = torch.empty(b, h, 0, value_states.shape[-1], dtype=codes, device=self.device)
        self.is_initialized = True

    def _check(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        for name, x in (("keys", key_states), ("values", value_states)):
            if not isinstance(x, torch.Tensor) or x.ndim != 4 or not x.dtype.is_floating_point:
                raise ValueError(
                    f"{name} must be a floating 4-d [batch, kv_heads, tokens, head_dim] tensor, got "
                    f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'ndim', 0)}-d {tuple(getattr(x, 'shape', ()))}"
                )
        if key_states.shape[:3] != value_states.shape[:3]:
            raise ValueError(
                f"keys {tuple(key_states.shape)} and values {tuple(value_states.shape)} differ in batch, heads or "
                f"tokens"
            )
        if self.is_initialized:
            want = (self.keys.shape[0], self.keys.shape[1], self.keys.shape[-1])
            got = (key_states.shape[0], key_states.shape[1], key_states.shape[-1])
            if got != want or key_states.dtype != self.dtype:
                raise ValueError(
                    f"appended states {tuple(key_states.shape)} {key_states.dtype} do not match the cache "
                    f"[{want[0]}, {want[1]}, *, {want[2]}] {self.dtype} (a cache holds one batch of one model: "
                    "call cache.reset() before reusing it for another)"
                )
        if not bool(torch.isfinite(key_states).all() & torch.isfinite(value_states).all()):
            raise ValueError(
                "keys/values hold inf or NaN: an FP8 cache cannot store them (nothing was stored)"
            )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``[B, H, t, D]`` states as FP8; return the ``[B, H, T + t, D]`` keys and values this step's
        attention reads: the ``T`` tokens stored before, decoded from FP8, followed by the ``t`` new tokens as
        given. A token is attended in full precision in the step that writes it (so a prefill attends with float
        K/V, as KIVI's and transformers' quantized caches do) and read back from FP8 in every later step.

        Raises:
            ValueError: non-4-D or non-floating states, K/V that differ in batch/heads/tokens, a shape or dtype
                change after the first call, or inf/NaN (nothing is stored then).
        """
        self._check(key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        layer_idx = kwargs.get("kvlab_layer_idx")
        if self.attention == "fused" and layer_idx is not None:
            return self._update_fused(key_states, value_states, layer_idx)
        # [B, H, T, D]: read back before the append (also fused mode without a layer index: nothing to hand off)
        held_k = self._read(self.keys, self.key_scale, self.key_rotation)
        held_v = self._read(self.values, self.value_scale, self.value_rotation)
        self._append(
            encode(self._rotated(key_states, self.key_rotation), self.format, self.key_scale),
            encode(self._rotated(value_states, self.value_rotation), self.format, self.value_scale),
        )
        return torch.cat((held_k, key_states), dim=-2), torch.cat((held_v, value_states), dim=-2)

    def _update_fused(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused path: append this step's tokens as FP8 and return only them (``[B, H, t, D]``, in the stored basis:
        ``K R`` / ``V R`` when rotated, float32 then) as the window; the ``T`` tokens stored before go to kvlab
        attention as codes (:class:`kvlab.attention.interface.PendingFP8`), which reads them in place (the CPU kernel
        of :mod:`kvlab.attention.cpu_kernel`, or decoded once in the attention elsewhere) and, when rotated, rotates
        the query rows and the output instead of the stored tokens. A prefill (nothing stored yet) returns the
        states as given and hands nothing off (with or without a forward context, :mod:`kvlab.attention.context`).

        Raises:
            RuntimeError: no forward context open while tokens are stored (nothing is appended then).
        """
        from kvlab.attention.context import current
        from kvlab.attention.interface import PendingFP8

        ctx = current()
        held_k, held_v = self.keys, self.values  # [B, H, T, D] codes before this step
        if ctx is None and held_k.shape[-2]:
            raise PendingFP8.unread_error(layer_idx, no_context=True, owner=self.cache_name)
        kr = self._rotated(key_states, self.key_rotation)  # [B, H, t, D]; fp32 when rotated
        vr = self._rotated(value_states, self.value_rotation)
        self._append(encode(kr, self.format, self.key_scale), encode(vr, self.format, self.value_scale))
        if not held_k.shape[-2]:
            return key_states, value_states
        entry = PendingFP8(
            key_codes=held_k,
            value_codes=held_v,
            key_scale=self.key_scale,
            value_scale=self.value_scale,
            key_rotation=self.key_rotation,
            value_rotation=self.value_rotation,
            key=kr,
            owner=self.cache_name,
        )
        ctx.hand_off(layer_idx, entry)
        return kr, vr

    def _append(self, k: Encoded, v: Encoded) -> None:
        """Append encoded ``[B, H, t, D]`` keys and values and count what they lost."""
        self.keys = torch.cat((self.keys, k.codes), dim=-2)  # [B, H, T + t, D]
        self.values = torch.cat((self.values, v.codes), dim=-2)
        c = self._counts
        c["key_saturated"] += k.saturated
        c["key_underflow"] += k.underflow
        c["value_saturated"] += v.saturated
        c["value_underflow"] += v.underflow
        c["elements"] += k.codes.numel()

    @staticmethod
    def _rotated(x: torch.Tensor, rotation: torch.Tensor | None) -> torch.Tensor:
        """``x @ R`` in fp32 (``x`` itself without a rotation)."""
        return x if rotation is None else x.to(torch.float32) @ rotation

    def _read(
        self, codes: torch.Tensor, scale: torch.Tensor | None, rotation: torch.Tensor | None
    ) -> torch.Tensor:
        """Stored codes back in the model dtype: ``codes * scale``, rotated back (``@ R.T``, in fp32) if rotated."""
        if rotation is None:
            return decode(codes, scale, self.dtype)
        return (decode(codes, scale, torch.float32) @ rotation.T).to(self.dtype)

    def get_seq_length(self) -> int:
        return self.keys.shape[-2] if self.is_initialized else 0

    def reset(self) -> None:
        """Drop the tokens, the scales and the counts (the next sequence calibrates its own)."""
        self.keys = self.values = self.key_scale = self.value_scale = None
        self.key_rotation = self.value_rotation = None
        self._counts = dict.fromkeys(COUNTS, 0)
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' ``crop`` (see :mod:`kvlab.caches.crop`): exact, the kept codes and the scales untouched.

        Raises:
            TypeError: ``tokens_to_remove`` not an integer.
        """
        crop_kv(self, tokens_to_remove)

    def _select_rows(self, idx: torch.Tensor) -> None:
        """Rows ``idx`` of the codes and their scales, moved together."""
        super()._select_rows(idx)
        if self.key_scale is not None:
            self.key_scale = self.key_scale.index_select(0, idx)
            self.value_scale = self.value_scale.index_select(0, idx)
        self.batch_size = self.keys.shape[0]

    def nbytes_breakdown(self) -> dict[str, int]:
        """``codes`` (1 B per stored K/V element), ``scales`` (4 B each), ``total``."""
        if not self.is_initialized:
            return {"codes": 0, "scales": 0, "total": 0}
        codes = sum(t.numel() * t.element_size() for t in (self.keys, self.values))
        scales = sum(
            t.numel() * t.element_size() for t in (self.key_scale, self.value_scale) if t is not None
        )
        return {"codes": codes, "scales": scales, "total": codes + scales}

    def counts(self) -> dict[str, int]:
        """Elements written so far: ``key_saturated`` / ``value_saturated`` (beyond the format's range after scaling,
        clamped), ``key_underflow`` / ``value_underflow`` (non-zero, stored as zero), ``elements`` (per K or V)."""
        return {name: int(value) for name, value in self._counts.items()}


class FP8Cache(Cache):
    """K/V in float8 with scales as metadata: half the bytes of bf16 plus 4 B per scale.

    Args:
        format: ``"e4m3"`` (``torch.float8_e4m3fn``: max 448, 3 mantissa bits) or ``"e5m2"``
            (``torch.float8_e5m2``: max 57344, 2 mantissa bits).
        scale: ``"per-head"`` (default: one fp32 scale per sequence, layer, KV head and K/V, calibrated on the
            prefill: ``amax / max``), ``"per-tensor"`` (one per sequence, layer and K/V) or ``"none"`` (scale 1.0,
            nothing stored: an engine without calibration).
        rotation: ``"none"`` (default: what serving engines store) or ``"hadamard"``: K and V rotated along the
            head dimension by an orthonormal randomized Hadamard matrix before rounding and rotated back on read
            (:mod:`kvlab.quant.rotation`: attention scores and outputs are unchanged by the rotation itself, and the
            rounding error of an outlier channel is spread over all channels; same bytes; one ``[T, D] @ [D, D]``
            product per layer, K and V, per step). Needs a power-of-two head_dim.
        attention: ``"dequantize"`` (default: ``update`` returns the whole history decoded to the model dtype, any
            attention reads it) or ``"fused"`` (``update`` returns only this step's tokens and hands the stored codes
            to kvlab attention, which reads them in place: on the CPU a compiled kernel converts each code in
            registers, no decoded copy of the history; with ``rotation="hadamard"`` it rotates the ``q`` query rows
            and the output instead of the ``T`` stored tokens; the model must run kvlab attention:
            :func:`kvlab.attention.enable`).

    Raises:
        ValueError: an unknown ``format``, ``scale``, ``rotation`` or ``attention``, a format this torch build
            lacks; at
            ``update``, what :meth:`FP8Layer.update` raises, and a head_dim that is not a power of two for
            ``rotation="hadamard"``.

    Notes:
        Left-padded batches: the prefill's pad tokens are stored and the ``amax`` calibration of their row includes
        them (the cache never sees the attention mask); a pad key or value larger than the row's real ones
        coarsens that row's scale (README, left padding).

    Source: the mechanics chapter's FP8 section (e4m3 vs e5m2 range and precision); vLLM's FP8 KV cache
    (``k_scale``/``v_scale``, 1.0 unless calibrated); OCP 8-bit floating point specification (the two formats);
    QuaRot (arXiv:2404.00456, section 4.2) for the rotation.
    """

    def __init__(
        self,
        format: str = "e4m3",
        scale: str = "per-head",
        rotation: str = "none",
        attention: str = "dequantize",
    ) -> None:
        fp8_dtype(format)  # raise for an unknown format or a torch without it, before any layer exists
        check_scale(scale)
        check_rotation(rotation)
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"`attention` must be one of {list(ATTENTION_PATHS)}, got {attention!r}")
        self.format, self.scale, self.rotation, self.attention = format, scale, rotation, attention
        super().__init__(layer_class_to_replicate=partial(FP8Layer, format, scale, rotation, attention))

    def __repr__(self) -> str:
        return (
            f"FP8Cache(format={self.format!r}, scale={self.scale!r}, rotation={self.rotation!r}, "
            f"attention={self.attention!r})"
        )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``Cache.update``; in fused mode it passes ``layer_idx`` down (the layer files its codes for that
        layer's attention in the forward context, :mod:`kvlab.attention.context`).

        Raises:
            ValueError: as :meth:`FP8Layer.update`.
            RuntimeError: fused mode with no forward context open while tokens are stored (a model without
                :func:`kvlab.attention.enable`; one with it raises at the end of a forward whose attention left a
                history unread).
        """
        if self.attention == "fused":
            kwargs["kvlab_layer_idx"] = layer_idx
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the newest tokens of every layer (transformers' ``Cache.crop``; see :mod:`kvlab.caches.crop`).

        Raises:
            TypeError: ``tokens_to_remove`` not an integer (nothing is changed).
        """
        crop_keep(tokens_to_remove, 0)
        for layer in self.layers:
            layer.crop(tokens_to_remove)

    def nbytes_breakdown(self) -> dict[str, int]:
        """Exact bytes held, summed over layers: ``codes``, ``scales``, ``total``."""
        out = {"codes": 0, "scales": 0, "total": 0}
        for layer in self.layers:
            for key, value in layer.nbytes_breakdown().items():
                out[key] += value
        return out

    def nbytes(self) -> int:
        """Exact bytes of the stored state: FP8 codes + fp32 scales, all layers."""
        return self.nbytes_breakdown()["total"]

    def counts(self) -> dict[str, int]:
        """:meth:`FP8Layer.counts` summed over layers, plus ``saturated_fraction`` and ``underflow_fraction`` (K and
        V together, as a fraction of every element written)."""
        out = dict.fromkeys(COUNTS, 0)
        for layer in self.layers:
            for key, value in layer.counts().items():
                out[key] += value
        n = 2 * out["elements"]
        out["saturated_fraction"] = (out["key_saturated"] + out["value_saturated"]) / n if n else 0.0
        out["underflow_fraction"] = (out["key_underflow"] + out["value_underflow"]) / n if n else 0.0
        return out
