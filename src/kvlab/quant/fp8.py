"""FP8 codec: float8 e4m3 / e5m2 formats, calibrated scales, saturation and underflow.

The mechanics chapter's FP8 warning, in code: the two OCP FP8 formats trade mantissa for range —

* ``e4m3`` (``torch.float8_e4m3fn``): 3 mantissa bits (rounding error <= 2^-4 of a normal value), largest finite
  value 448, smallest subnormal 2^-9;
* ``e5m2`` (``torch.float8_e5m2``): 2 mantissa bits (<= 2^-3), largest finite 57344, smallest subnormal 2^-16.

A tensor ``x`` is stored as ``q = fp8(clamp(x / s, -max, max))`` and read back as ``q * s``. With ``s = 1.0`` (what
a serving engine does without calibration: vLLM's ``--kv-cache-dtype fp8`` with ``k_scale = v_scale = 1.0``) values
beyond ``max`` **saturate** and values below half the smallest subnormal **flush to zero**; a calibrated scale
``s = amax / max`` maps the largest magnitude seen to the format's largest value (per tensor, or per KV head).

Torch is imported here; the torch-free planner sizes FP8 caches from :data:`FORMATS` names only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# format -> the torch dtype attribute that stores it (OCP FP8: e4m3 without infinities, e5m2 IEEE-like)
FORMATS: dict[str, str] = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
# scale granularity -> what one scale covers: nothing (1.0), a whole layer's K (or V) of one sequence, one KV head
SCALES: tuple[str, ...] = ("none", "per-tensor", "per-head")
SCALE_DTYPE = torch.float32  # scales are metadata, kept in fp32 (4 B each) whatever the model dtype


def fp8_dtype(format: str) -> torch.dtype:
    """The torch dtype of an FP8 ``format`` (``"e4m3"`` -> ``torch.float8_e4m3fn``, ``"e5m2"`` -> ``float8_e5m2``).

    Raises:
        ValueError: an unknown ``format`` (the message lists the known ones), or a torch build without that dtype.
    """
    if not isinstance(format, str) or format not in FORMATS:
        raise ValueError(f"FP8 `format` must be one of {list(FORMATS)}, got {format!r}")
    attr = FORMATS[format]
    dtype = getattr(torch, attr, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(
            f"FP8 format {format!r} needs torch.{attr}, which this torch build ({torch.__version__}) lacks "
            f"(float8 dtypes arrived in torch 2.1)"
        )
    return dtype


def check_scale(scale: str) -> str:
    """Return ``scale`` if it is one of :data:`SCALES`; raise ``ValueError`` naming it otherwise."""
    if not isinstance(scale, str) or scale not in SCALES:
        raise ValueError(f"FP8 `scale` must be one of {list(SCALES)}, got {scale!r}")
    return scale


def format_range(format: str) -> tuple[float, float]:
    """``(largest finite value, smallest positive subnormal)`` of ``format``: ``torch.finfo``'s max and the value of
    the code ``0x01`` (the lowest mantissa bit with a zero exponent, in both formats).

    Raises:
        ValueError: as :func:`fp8_dtype`.
    """
    dtype = fp8_dtype(format)
    tiny = torch.ones(1, dtype=torch.uint8).view(dtype).to(SCALE_DTYPE)
    return float(torch.finfo(dtype).max), float(tiny)


def calibrate(x: torch.Tensor, format: str, scale: str) -> torch.Tensor | None:
    """Scales that map the largest magnitude of ``x`` to the largest value of ``format``.

    Args:
        x: ``[batch, kv_heads, tokens, head_dim]`` keys or values (the prefill).
        format: ``"e4m3"`` or ``"e5m2"``.
        scale: ``"none"`` (returns ``None``: scale 1.0, nothing stored), ``"per-tensor"`` (one scale per batch row:
            ``[batch, 1, 1, 1]``) or ``"per-head"`` (one per batch row and KV head: ``[batch, kv_heads, 1, 1]``).

    Returns:
        fp32 scales ``amax / max`` (1.0 where ``amax`` is 0), or ``None`` for ``scale="none"``.

    Raises:
        ValueError: an unknown ``format`` or ``scale``; ``x`` not a 4-D floating tensor, with no tokens or
            channels, or holding inf/NaN.
    """
    fmax, _ = format_range(format)
    if check_scale(scale) == "none":
        return None
    if not isinstance(x, torch.Tensor) or x.ndim != 4:
        raise ValueError(f"expected [batch, kv_heads, tokens, head_dim], got {getattr(x, 'shape', x)!r}")
    if not x.is_floating_point():
        raise ValueError(f"FP8 scales are calibrated on a floating tensor, got {x.dtype}")
    dims = (1, 2, 3) if scale == "per-tensor" else (2, 3)
    if any(x.shape[d] == 0 for d in dims):
        raise ValueError(f"no tokens or channels to calibrate on: x has shape {tuple(x.shape)}")
    amax = x.detach().abs().to(SCALE_DTYPE).amax(dim=dims, keepdim=True)  # [B, 1 or H, 1, 1]
    if not torch.isfinite(amax).all():  # NaN would give scale 1.0, inf a scale that zeroes every code
        raise ValueError("x holds inf or NaN: FP8 scales cannot be calibrated on it")
    s = amax / fmax
    tiny = torch.finfo(SCALE_DTYPE).tiny
    return torch.where(amax > 0, s.clamp_min(tiny), torch.ones_like(s))


@dataclass
class Encoded:
    """One FP8 encoding: the codes and what was lost on the way."""

    codes: torch.Tensor  # [..] in the FP8 dtype: clamp(x / scale) rounded
    saturated: torch.Tensor  # 0-d int64: elements with |x / scale| above the format's largest value (clamped)
    underflow: torch.Tensor  # 0-d int64: non-zero elements stored as zero (flushed)


def encode(x: torch.Tensor, format: str, scale: torch.Tensor | None = None) -> Encoded:
    """``fp8(clamp(x / scale, -max, max))``, counting saturated and flushed elements.

    Args:
        x: any floating tensor (``[batch, kv_heads, tokens, head_dim]`` in the caches).
        format: ``"e4m3"`` or ``"e5m2"``.
        scale: broadcastable fp32 scales (from :func:`calibrate`), or ``None`` for 1.0.

    Clamping first makes both formats saturate the same way (a plain cast gives e5m2 an infinity).

    Raises:
        ValueError: an unknown ``format``.
    """
    dtype = fp8_dtype(format)
    fmax, _ = format_range(format)
    y = x.to(SCALE_DTYPE)
    if scale is not None:
        y = y / scale
    over = y.abs() > fmax
    codes = y.clamp(-fmax, fmax).to(dtype)
    flushed = (codes.to(SCALE_DTYPE) == 0) & (y != 0)
    return Encoded(codes, over.sum(), flushed.sum())


def e4m3_to_float32(codes: torch.Tensor) -> torch.Tensor:
    """``float8_e4m3fn`` codes to fp32 exactly, through float16 bit patterns (torch's CPU cast converts element by
    element, ~3x slower on this path).

    The code ``s eeee mmm`` (bias 7) shifted left by 7 bits is the float16 pattern ``s 0eeee mmm0000000`` (bias 15),
    whose value is the e4m3 value times ``2^-8`` — for normal codes and, through float16's subnormals, for e4m3's
    subnormals too — so one multiplication by 256 (exact) restores it. The NaN codes (``0x7F``, ``0xFF``) would
    come out as 480; :func:`encode` never writes them (it clamps to +-448).

    Args:
        codes: any shape, ``torch.float8_e4m3fn``.

    Returns:
        fp32 tensor of the same shape, equal to ``codes.to(torch.float32)`` for every non-NaN code.

    Raises:
        ValueError: ``codes`` of another dtype.
    """
    if codes.dtype != torch.float8_e4m3fn:
        raise ValueError(f"expected float8_e4m3fn codes, got {codes.dtype}")
    u = codes.view(torch.uint8).to(torch.int16)
    bits = ((u & 0x7F) << 7) | ((u & 0x80) << 8)  # sign to bit 15, exponent and mantissa to bits 7-14
    return bits.view(torch.float16).to(SCALE_DTYPE) * 256.0


def decode(codes: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """``codes * scale`` in ``dtype`` (the scale multiplied in fp32, then one rounding to ``dtype``); e4m3 codes on
    the CPU go through :func:`e4m3_to_float32` (exact, faster than torch's cast)."""
    if codes.dtype == torch.float8_e4m3fn and codes.device.type == "cpu":
        y = e4m3_to_float32(codes)
    else:
        y = codes.to(SCALE_DTYPE)
    if scale is not None:
        y = y * scale
    return y.to(dtype)
