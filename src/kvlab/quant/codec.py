"""Group-wise asymmetric (min-max) integer quantization with real bit packing.

A tensor is cut into groups of ``group_size`` consecutive elements along one axis; each group keeps a
``scale`` and a ``zero`` (the group minimum) and every element becomes an unsigned code in ``[0, 2**nbits - 1]``::

    code = round(x / scale - zero / scale)          x_hat = zero + code * scale

This is the asymmetric quantizer of KIVI (arXiv:2402.02750, section 3.1, eq. 1). Codes are packed into ``uint8`` along
the **last** axis whatever the quantization axis is (4-bit: two codes a byte, 2-bit: four, 8-bit: one), so a
``[batch, kv_heads, tokens, head_dim]`` tensor stores ``[batch, kv_heads, tokens, head_dim * nbits // 8]`` bytes.

Metadata dtypes are chosen so that neither the scale nor the zero can overflow or underflow for any finite input
(see :func:`metadata_dtypes`): a bf16 group holding -70000 keeps a finite bf16 scale (fp16 would overflow at
65504), and an fp16 group of values near 1e-7 keeps its scale in bf16 (fp16 would flush it to a subnormal or 0).
A constant group has ``scale == 0`` and comes back exactly. The stored scale is rounded *up* to its dtype
(:func:`stored_scale`) and the codes are computed from the stored scale and zero, so the round trip stays within
half a step: ``|x - x_hat| <= scale / 2`` (:func:`quantize_groups` states the bound and its slack).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlab.runtime.checks import check_int

SUPPORTED_NBITS = (2, 4, 8)


def check_nbits(nbits: int) -> int:
    """Return ``nbits`` if it is one of :data:`SUPPORTED_NBITS`; raise ``ValueError`` naming it otherwise."""
    if isinstance(nbits, bool) or not isinstance(nbits, int) or nbits not in SUPPORTED_NBITS:
        raise ValueError(f"`nbits` must be one of {list(SUPPORTED_NBITS)}, got {nbits!r}")
    return nbits


def check_group_size(group_size: int) -> int:
    """Return ``group_size`` if it is a positive int; raise ``ValueError`` naming it otherwise."""
    return check_int("group_size", group_size, 1)


def metadata_dtypes(dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
    """Return ``(scale_dtype, zero_dtype)`` for inputs of ``dtype``.

    * ``bfloat16`` -> (bf16, bf16): bf16 has the exponent range of fp32, so no finite group overflows.
    * ``float16``  -> (bf16, fp16): the zero is a group minimum, hence an exact fp16 value; the scale can be far
      below fp16's normal range (values ~1e-7), so it is kept in bf16, which has fp32's range.
    * ``float32`` / ``float64`` -> the input dtype for both.

    16-bit metadata is what the byte ledger assumes for bf16/fp16 caches (``metadata_bytes = 2``).

    Raises:
        ValueError: for a non-floating dtype.
    """
    if dtype == torch.bfloat16:
        return torch.bfloat16, torch.bfloat16
    if dtype == torch.float16:
        return torch.bfloat16, torch.float16
    if dtype in (torch.float32, torch.float64):
        return dtype, dtype
    raise ValueError(f"quantization needs a floating tensor (bf16, fp16, fp32, fp64), got dtype {dtype}")


def metadata_bytes(dtype: torch.dtype) -> int:
    """Bytes of one scale (equal to one zero) for inputs of ``dtype``: 2 for bf16/fp16, else the dtype's size.

    KIVI (arXiv:2402.02750 section 3.1) keeps one scale and one zero per group in the model's 16-bit dtype; the
    dtypes are :func:`metadata_dtypes`' (bf16 scale for fp16 inputs, same size).

    Raises:
        ValueError: for a non-floating dtype (:func:`metadata_dtypes`).
    """
    scale_dtype, zero_dtype = metadata_dtypes(dtype)
    assert scale_dtype.itemsize == zero_dtype.itemsize
    return scale_dtype.itemsize


def pack_codes(codes: torch.Tensor, nbits: int) -> torch.Tensor:
    """Pack unsigned ``codes`` (``uint8``, each ``< 2**nbits``) along the last axis.

    Args:
        codes: ``[..., n]`` ``uint8`` with ``n * nbits % 8 == 0``.
        nbits: 2, 4 or 8.

    Returns:
        ``[..., n * nbits // 8]`` ``uint8``; code ``i`` of a byte sits at bits ``[i * nbits, (i + 1) * nbits)``.

    Raises:
        ValueError: unsupported ``nbits``, a 0-d tensor, a code outside ``[0, 2**nbits - 1]`` (it would spill into
            its neighbours' bits), or a last axis that does not fill whole bytes.
        TypeError: ``codes`` not an integer tensor.
    """
    check_nbits(nbits)
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"`codes` must be a torch.Tensor, got {type(codes).__name__}")
    if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
        raise TypeError(f"`codes` must be an integer tensor, got dtype {codes.dtype}")
    if codes.ndim == 0:
        raise ValueError("cannot pack a 0-d tensor of codes")
    if codes.numel():
        lo, hi = codes.min().item(), codes.max().item()
        if lo < 0 or hi >= 1 << nbits:
            raise ValueError(
                f"codes must be in [0, {(1 << nbits) - 1}] for {nbits} bits, got {hi if lo >= 0 else lo}"
            )
    return _pack(codes, nbits)


def _pack(codes: torch.Tensor, nbits: int) -> torch.Tensor:
    """:func:`pack_codes` without the checks (codes already ``uint8`` in range)."""
    if nbits == 8:
        return codes.to(torch.uint8)
    per_byte = 8 // nbits
    n = codes.shape[-1]
    if n % per_byte:
        raise ValueError(
            f"last axis ({n}) must be a multiple of {per_byte} to pack {nbits}-bit codes into bytes"
        )
    grouped = codes.to(torch.uint8).reshape(*codes.shape[:-1], n // per_byte, per_byte)  # [..., n/k, k]
    packed = grouped[..., 0].clone()
    for i in range(1, per_byte):
        packed |= grouped[..., i] << (i * nbits)
    return packed


def unpack_codes(packed: torch.Tensor, nbits: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: ``[..., m]`` ``uint8`` -> ``[..., m * 8 // nbits]`` ``uint8`` codes.

    Raises:
        ValueError: unsupported ``nbits`` or a 0-d tensor. TypeError: ``packed`` not a ``uint8`` tensor.
    """
    check_nbits(nbits)
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError(
            f"`packed` must be a uint8 tensor, got {getattr(packed, 'dtype', type(packed).__name__)}"
        )
    if packed.ndim == 0:
        raise ValueError("cannot unpack a 0-d tensor")
    if nbits == 8:
        return packed
    per_byte = 8 // nbits
    mask = (1 << nbits) - 1
    # scalar shifts (a broadcast shift tensor is an order of magnitude slower on CPU)
    parts = [packed & mask] + [(packed >> (i * nbits)) & mask for i in range(1, per_byte)]
    codes = torch.stack(parts, dim=-1)  # [..., m, k]
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)


@dataclass(frozen=True)
class QuantizedTensor:
    """A group-quantized tensor.

    Attributes:
        codes: ``uint8`` packed codes, ``shape[:-1] + (shape[-1] * nbits // 8,)``.
        scale: per-group scale; ``shape`` with the quantization axis divided by ``group_size``.
        zero: per-group minimum, same shape as ``scale``.
        nbits: bits per code (2, 4 or 8).
        group_size: elements per group along ``axis``.
        axis: the (non-negative) quantization axis.
        shape: shape of the original tensor.
        dtype: dtype of the original tensor (and of :func:`dequantize`'s output).
    """

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    nbits: int
    group_size: int
    axis: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Exact bytes held: packed codes + scales + zeros."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.zero))


def _group_view(x: torch.Tensor, axis: int, group_size: int) -> torch.Tensor:
    # [..., n (at axis), ...] -> [..., n / G, G] with the grouped axis moved last
    moved = x.movedim(axis, -1)
    return moved.reshape(*moved.shape[:-1], moved.shape[-1] // group_size, group_size)


def _check_quantize_args(x: torch.Tensor, nbits: int, group_size: int, axis: int) -> int:
    """:func:`quantize_groups`' argument checks; return the non-negative ``axis`` (errors as documented there)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`x` must be a torch.Tensor, got {type(x).__name__}")
    check_nbits(nbits)
    check_group_size(group_size)
    metadata_dtypes(x.dtype)  # raises for a non-floating dtype
    if x.is_meta:
        raise ValueError(
            "cannot quantize a tensor on the meta device (it holds no values): move it to a real device first"
        )
    if x.ndim == 0:
        raise ValueError("cannot quantize a 0-d tensor")
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"`axis` must be an int, got {axis!r}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"`axis` must be in [{-x.ndim}, {x.ndim - 1}] for a {x.ndim}-d tensor, got {axis}")
    ax = axis % x.ndim
    if x.shape[ax] % group_size:
        raise ValueError(
            f"group_size {group_size} must divide axis {axis} of length {x.shape[ax]} (shape {tuple(x.shape)})"
        )
    if (x.shape[-1] * nbits) % 8:
        raise ValueError(
            f"last axis ({x.shape[-1]}) times nbits ({nbits}) must be a multiple of 8 to pack codes"
        )
    if not torch.isfinite(x).all():
        raise ValueError("cannot quantize a tensor holding inf or NaN")
    return ax


def stored_scale(mn: torch.Tensor, mx: torch.Tensor, qmax: int, scale_dtype: torch.dtype) -> torch.Tensor:
    """The scale a group stores: ``(max - min) / qmax`` rounded **up** to a value of ``scale_dtype``.

    Rounding to nearest could store a scale just below ``(max - min) / qmax`` (bf16 keeps 8 significant bits), so
    the group's largest value would need a code above ``qmax`` and be clamped to it, off by up to
    ``qmax * (max - min) * 2**-9`` (half a step more at 8 bits). Rounded up, every value of the group is within
    ``qmax + 1/2`` steps of the minimum and the round-trip bound of :func:`quantize_groups` holds. Where
    ``scale_dtype`` is the working dtype (fp32/fp64 inputs) nothing is rounded.

    Args:
        mn, mx: per-group minimum and maximum in the working dtype (fp32, or fp64 for fp64 inputs).
        qmax: the largest code, ``2**nbits - 1``.
        scale_dtype: the storage dtype (:func:`metadata_dtypes`).

    Returns:
        ``mn``'s shape in ``scale_dtype``, ``>= 0`` (0 for a constant group).
    """
    # (mx - mn) may overflow for huge finite groups; mx/qmax - mn/qmax cannot (qmax >= 3).
    exact = mx / qmax - mn / qmax
    scale = exact.to(scale_dtype)
    if scale_dtype == exact.dtype:
        return scale
    # the next value up of a finite scale >= 0 is its bit pattern + 1 (what torch.nextafter(scale, inf) gives, with
    # plain integer ops every device runs for every dtype, so CPU and CUDA store the same scales and codes)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[scale.element_size()]
    up = (scale.view(bits) + 1).view(scale_dtype)
    return torch.where(scale.to(exact.dtype) < exact, up, scale)


def quantize_groups(x: torch.Tensor, nbits: int, group_size: int, axis: int = -1) -> QuantizedTensor:
    """Quantize ``x`` in groups of ``group_size`` consecutive elements along ``axis``.

    KIVI (arXiv:2402.02750) section 3.1-3.2: keys per-channel are ``axis=-2`` of ``[batch, kv_heads, tokens, head_dim]``
    (a group is ``group_size`` tokens of one channel), values per-token are ``axis=-1`` (a group is
    ``group_size`` channels of one token). The quantizer is KIVI's asymmetric min-max one (section 3.1):
    ``zero = min``, ``scale = (max - min) / (2**nbits - 1)``, ``code = round((x - zero) / scale)``.

    The scale is stored in its metadata dtype (:func:`metadata_dtypes`: bf16 for bf16/fp16 inputs) rounded up
    (:func:`stored_scale`), the zero exactly (a group minimum is an input value), and the codes are computed from
    the *stored* scale and zero, so every value is reachable and the round trip is bounded per element by

        ``|x - dequantize(q, torch.float32)| <= scale / 2``    (``scale``: the group's stored ``q.scale``)

    up to float32 arithmetic (a few ulps of the group's magnitude); ``dequantize(q)`` in a 16-bit dtype adds that
    dtype's own rounding of the result (half an ulp of ``|x_hat|``). A constant group (``scale == 0``) comes back
    exactly.

    Args:
        x: any floating tensor; ``x.shape[axis] % group_size == 0`` and ``x.shape[-1] * nbits % 8 == 0``.
        nbits: 2, 4 or 8.
        group_size: elements per group along ``axis``.
        axis: quantization axis (negative allowed).

    Returns:
        :class:`QuantizedTensor` whose ``scale``/``zero`` have ``x.shape`` with ``shape[axis] // group_size``.

    Raises:
        ValueError: unsupported ``nbits``, bad ``group_size``, ``axis`` out of range, a group size not dividing
            the axis, a last axis that does not pack into whole bytes, a non-floating or non-finite input, a tensor
            on the meta device.
        TypeError: ``x`` not a tensor, ``axis`` not an int.
    """
    ax = _check_quantize_args(x, nbits, group_size, axis)
    scale_dtype, zero_dtype = metadata_dtypes(x.dtype)
    qmax = (1 << nbits) - 1
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    g = _group_view(x.to(work), ax, group_size)  # [..., n/G, G]
    mn = g.amin(dim=-1)
    scale = stored_scale(mn, g.amax(dim=-1), qmax, scale_dtype)
    zero = mn.to(zero_dtype)
    s = scale.to(work).unsqueeze(-1)
    z = zero.to(work).unsqueeze(-1)
    safe = torch.where(
        s > 0, s, torch.ones_like(s)
    )  # constant group: scale 0 -> codes 0, x_hat = zero exactly
    codes = torch.round(g / safe - z / safe).clamp_(0, qmax).to(torch.uint8)  # [..., n/G, G]
    moved_shape = x.movedim(ax, -1).shape
    codes = codes.reshape(moved_shape).movedim(-1, ax)  # back to x's layout
    return QuantizedTensor(
        codes=_pack(codes.contiguous(), nbits),
        scale=scale.movedim(-1, ax).contiguous(),
        zero=zero.movedim(-1, ax).contiguous(),
        nbits=nbits,
        group_size=group_size,
        axis=ax,
        shape=tuple(x.shape),
        dtype=x.dtype,
    )


def expand_groups(meta: torch.Tensor, axis: int, group_size: int) -> torch.Tensor:
    """Repeat per-group metadata ``group_size`` times along ``axis`` (``[..., n/G, ...] -> [..., n, ...]``)."""
    return meta.repeat_interleave(group_size, dim=axis)


def dequantize(qt: QuantizedTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Reconstruct ``zero + code * scale`` with the shape of the original tensor.

    The dequantization of KIVI's asymmetric quantizer (arXiv:2402.02750 section 3.1, eq. 1), computed in float32
    (float64 for fp64 tensors) and cast once to ``dtype``. For ``qt = quantize_groups(x, ...)`` each element
    satisfies ``|x - dequantize(qt, torch.float32)| <= scale / 2`` with ``scale`` its group's stored ``qt.scale``
    (up to float32 arithmetic, a few ulps of the group's magnitude; see :func:`quantize_groups`); a 16-bit
    ``dtype`` adds its own rounding of the result, at most half an ulp of ``|x_hat|``.

    Args:
        qt: a :class:`QuantizedTensor`.
        dtype: output dtype (default: the original dtype).

    Returns:
        ``qt.shape`` tensor of ``dtype``; a constant group comes back bit-exact, and a group of huge finite
        values stays finite (saturating at the largest finite value of ``dtype``).

    Raises:
        ValueError: ``dtype`` not a floating torch dtype.
    """
    out_dtype = dtype or qt.dtype
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise ValueError(f"dequantize needs a floating output dtype, got dtype {out_dtype}")
    work = torch.float64 if qt.dtype == torch.float64 else torch.float32
    half = ((1 << qt.nbits) - 1) / 2
    scale = qt.scale.to(work)
    # zero + code * scale, taken around the group midpoint: code * scale alone reaches max - min, which overflows
    # `work` for a group spanning most of the dtype's range; mid and (code - half) * scale never do.
    mid = expand_groups(qt.zero.to(work) + half * scale, qt.axis, qt.group_size)
    scale = expand_groups(scale, qt.axis, qt.group_size)
    codes = unpack_codes(qt.codes, qt.nbits).to(work).sub_(half)
    out = mid + codes * scale
    # rounding may land just past the largest finite value: saturate there
    limit = min(torch.finfo(out_dtype).max, torch.finfo(work).max)
    out = out.clamp_(-limit, limit)
    return out.to(out_dtype)
