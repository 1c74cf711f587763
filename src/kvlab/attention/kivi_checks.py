"""The argument checks of fused KIVI attention: one clear error naming the bad value before any kernel runs.

:func:`check_inputs` validates a :func:`kvlab.attention.quantized.kivi_attention` call (tensors, quantized
segments, mask); :func:`check_fused_settings` is the bits/group-size rule a KIVI cache checks before it hands
its blocks to the fused path; :func:`check_mask` and :func:`valid_tokens` are shared with the FP8 read of
:mod:`kvlab.attention.interface`. Source: KIVI (arXiv:2402.02750) section 3 (the key per-channel, value
per-token group layout the shapes follow).
"""

from __future__ import annotations

import numbers

import torch

from kvlab.quant.codec import check_group_size, check_nbits
from kvlab.quant.kivi import QuantSegmentView


def check_fused_settings(nbits: int, group_size: int, *, value_bits: int | None = None) -> None:
    """Raise ``ValueError`` if a value group (``group_size`` channels of one token) does not fill whole bytes at
    ``nbits``: the fused path unpacks value codes group by group, byte by byte (the dequantize path has no such
    limit); or if ``value_bits`` differs from ``nbits`` (the key bits): the fused path and its Triton kernel read
    keys and values at one width."""
    if value_bits is not None and value_bits != nbits:
        raise ValueError(
            f"fused KIVI attention (CPU path and Triton kernel) reads keys and values at one width; "
            f"key_bits={nbits}, value_bits={value_bits} (kivi-k{nbits}v{value_bits}) is not supported yet: use "
            f"attention='dequantize' (eval/bench: --kivi-attention dequantize or the -dequant variant)"
        )
    if group_size * nbits % 8:
        raise ValueError(
            f"fused KIVI attention needs group_size ({group_size}) times nbits ({nbits}) to fill whole bytes "
            f"(a multiple of 8): a value group is unpacked byte by byte; use attention='dequantize' or a larger "
            f"group_size"
        )


# a float mask entry is "masked" at or below this (transformers writes finfo.min, older code -1e4 or -inf)
MASKED_AT_MOST = -1e4


def check_inputs(
    query, segments, key_window, value_window, nbits, group_size, scaling, attention_mask, window_offset
) -> list[QuantSegmentView]:
    """Validate the arguments of :func:`kvlab.attention.quantized.kivi_attention`; return the segments as a list.

    ``query`` ``[B, Hq, q, D]``, ``key_window`` / ``value_window`` ``[B, Hkv, w, D]`` floating tensors on one device,
    ``segments`` quantized blocks ``[B, Hkv, n, ...]`` written with ``nbits`` / ``group_size``, ``scaling`` a finite
    real, ``attention_mask`` ``None`` or ``[1|B, 1, q, Q + w]``. Raises the ``ValueError`` / ``TypeError`` listed
    by :func:`kvlab.attention.quantized.kivi_attention` (each names the bad value).
    """
    _check_tensors(query, key_window, value_window, nbits, group_size, scaling)
    segments, quantized = _check_segments(query, segments, key_window, nbits, group_size)
    check_mask(query, key_window, attention_mask, window_offset, quantized + key_window.shape[2])
    return segments


def _check_tensors(query, key_window, value_window, nbits, group_size, scaling) -> None:
    """Types, shapes, devices of the query and the full-precision window; bits, group size and scaling."""
    check_nbits(nbits)
    check_group_size(group_size)
    for name, t in (("query", query), ("key_window", key_window), ("value_window", value_window)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4 or not t.dtype.is_floating_point:
            raise ValueError(
                f"`{name}` must be a floating [batch, {'q_heads, q_len' if name == 'query' else 'kv_heads, w'}, "
                f"head_dim] tensor, got {tuple(t.shape)} {t.dtype}"
            )
    b, hq, q_len, d = query.shape
    if key_window.shape != value_window.shape:
        raise ValueError(
            f"key_window {tuple(key_window.shape)} and value_window {tuple(value_window.shape)} must share a shape"
        )
    kb, hkv, w, kd = key_window.shape
    if kb != b or kd != d or hkv == 0 or hq % hkv:
        raise ValueError(
            f"query {tuple(query.shape)} does not fit key window {tuple(key_window.shape)} (same batch and "
            f"head_dim, q_heads a multiple of kv_heads)"
        )
    if key_window.device != query.device or value_window.device != query.device:
        raise ValueError(
            f"query ({query.device}) and key/value windows ({key_window.device}/{value_window.device}) must "
            f"share a device"
        )
    if isinstance(scaling, bool) or not isinstance(scaling, numbers.Real):
        raise TypeError(f"`scaling` must be a real number, got {scaling!r}")
    if scaling != scaling or scaling in (float("inf"), float("-inf")):
        raise ValueError(f"`scaling` must be finite, got {scaling!r}")


def _check_segments(query, segments, key_window, nbits, group_size) -> tuple[list[QuantSegmentView], int]:
    """Every quantized segment's tensors fit the query and window; returns ``(segments, quantized tokens)``."""
    b, _, _, d = query.shape
    _, hkv, _, _ = key_window.shape
    if segments is None:
        raise TypeError(
            "`segments` must be an iterable of QuantSegmentView (empty when nothing is quantized)"
        )
    segments = list(segments)
    if segments and (d % group_size or d * nbits % 8):
        raise ValueError(
            f"head_dim ({d}) must be a multiple of group_size ({group_size}) and fill bytes at {nbits} bits"
        )
    if segments:
        check_fused_settings(nbits, group_size)
    packed = d * nbits // 8
    quantized = 0
    for i, seg in enumerate(segments):
        n = seg.tokens
        expect = {
            "k_codes": (b, hkv, n, packed),
            "k_scale": (b, hkv, n // group_size, d),
            "k_zero": (b, hkv, n // group_size, d),
            "v_codes": (b, hkv, n, packed),
            "v_scale": (b, hkv, n, d // group_size),
            "v_zero": (b, hkv, n, d // group_size),
        }
        for name, shape in expect.items():
            t = getattr(seg, name)
            if n % group_size or tuple(t.shape) != shape:
                raise ValueError(
                    f"segment {i} ({n} tokens) does not fit nbits {nbits}, group_size {group_size} and the window "
                    f"{tuple(key_window.shape)}: {name} is {tuple(t.shape)}, expected {shape}"
                )
            if t.device != query.device:
                raise ValueError(f"segment {i} is on {t.device}, the query on {query.device}")
        quantized += n
    return segments, quantized


def check_mask(query, key_window, attention_mask, window_offset, total: int) -> None:
    """Check that ``attention_mask`` covers ``[1|B, 1, q_len, total]`` keys of a ``query`` ``[B, Hq, q_len, D]``
    (bool, True = attend, or additive float holding only 0 or values <= ``MASKED_AT_MOST``), or, without one, that
    the queries are the last of the ``key_window`` ``[B, Hkv, w, D]`` (``window_offset`` in ``[0, w - q_len]``).

    Raises:
        TypeError: a mask that is not a tensor, a ``window_offset`` that is not an int.
        ValueError: a mask of another dtype, shape or device, a per-head mask, a float mask entry that is neither
            0 nor <= ``MASKED_AT_MOST`` (its value and index named), ``q_len`` above ``w``, ``window_offset``
            out of range.
    """
    b, _, q_len, _ = query.shape
    w = key_window.shape[2]
    if attention_mask is not None:
        m = attention_mask
        if not isinstance(m, torch.Tensor):
            raise TypeError(f"`attention_mask` must be a torch.Tensor or None, got {type(m).__name__}")
        if m.dtype != torch.bool and not m.dtype.is_floating_point:
            raise ValueError(
                f"attention_mask must be bool (True = attend) or an additive float mask, got dtype {m.dtype}"
            )
        if m.ndim != 4 or m.shape[0] not in (1, b) or m.shape[2] != q_len or m.shape[3] != total:
            raise ValueError(
                f"attention_mask must be [1 or {b}, 1, {q_len}, {total}] ([batch, 1, q_len, quantized + window]), "
                f"got {tuple(m.shape)}"
            )
        if m.shape[1] != 1:
            raise ValueError(f"per-head attention masks are not supported, got mask shape {tuple(m.shape)}")
        if m.device != query.device:
            raise ValueError(f"attention_mask is on {m.device}, the query on {query.device}")
        if m.dtype != torch.bool:
            bad = ~((m == 0) | (m <= MASKED_AT_MOST))  # NaN compares False both ways: bad
            if bool(bad.any()):
                at = bad.nonzero()[0].tolist()
                raise ValueError(
                    f"a float attention_mask must hold 0 (attend) or a large negative value <= {MASKED_AT_MOST} "
                    f"(masked), got {m[tuple(at)].item()} at [{', '.join(map(str, at))}]; general additive "
                    f"biases are not supported, pass a bool mask"
                )
    elif q_len > 0:
        if q_len > w:
            raise ValueError(
                f"without an attention_mask the q_len ({q_len}) queries must be the last tokens of the window "
                f"({w}); pass a mask"
            )
        if window_offset is not None:
            if isinstance(window_offset, bool) or not isinstance(window_offset, int):
                raise TypeError(f"`window_offset` must be an int, got {window_offset!r}")
            if not 0 <= window_offset <= w - q_len:
                raise ValueError(
                    f"`window_offset` must be in [0, {w - q_len}] (window {w}, q_len {q_len}), got {window_offset}"
                )


def valid_tokens(attention_mask: torch.Tensor) -> torch.Tensor:
    """A mask passed by :func:`check_mask`, ``[1|B, 1, q, T]`` bool or additive float, as ``[1|B, q, T]`` bool
    (True = attend; a float entry attends where it is 0). Raises nothing: the mask is checked already."""
    m = attention_mask[:, 0]
    return m if m.dtype == torch.bool else m == 0
