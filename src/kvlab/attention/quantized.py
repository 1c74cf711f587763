"""Fused KIVI attention, the entry: attention of a query over the quantized blocks and full-precision window of a
KIVI cache that never builds the float K/V of the quantized history. It checks the arguments
(:mod:`kvlab.attention.kivi_checks`) and picks the backend that runs the math.

Backends: the pure-torch path runs anywhere; on the CPU, decode-sized calls (at most
``cpu_kernel.MAX_ROWS`` query rows per KV head) go by default to a compiled C kernel
(:mod:`kvlab.attention.cpu_kernel`: the same two folds, one call per layer instead of ~30 torch operators, built at
first use, torch when it cannot be built); on CUDA, the quantized blocks go to the Triton kernel
(:mod:`kvlab.attention.triton_kivi`) when it can run. ``kivi_attention(backend=...)`` picks one explicitly; the
pure-torch path is :mod:`kvlab.attention.torch_kivi`.

Sources: KIVI (arXiv:2402.02750) section 3.3 (fused dequantization into the matmul), FlashAttention/FlashDecoding online
softmax (arXiv:2205.14135 section 3.1).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from kvlab.attention import cpu_kernel, torch_kivi
from kvlab.attention.kivi_checks import check_inputs, valid_tokens
from kvlab.quant.kivi import QuantSegmentView

BACKENDS = ("auto", "torch", "cpu-kernel", "triton")


def kivi_attention(
    query: torch.Tensor,
    segments: Iterable[QuantSegmentView],
    key_window: torch.Tensor,
    value_window: torch.Tensor,
    nbits: int,
    group_size: int,
    scaling: float,
    attention_mask: torch.Tensor | None = None,
    window_offset: int | None = None,
    backend: str = "auto",
    dot: str | None = None,
    ran: dict | None = None,
) -> torch.Tensor:
    """Attention of ``query`` over quantized blocks followed by a full-precision window.

    Args:
        query: ``[batch, q_heads, q_len, head_dim]``.
        segments: quantized prefix blocks, oldest first (:meth:`kvlab.quant.kivi.KIVIState.segments`), each
            ``[batch, kv_heads, n, ...]``; their tokens precede the window.
        key_window / value_window: ``[batch, kv_heads, w, head_dim]`` in full precision; the query tokens are the
            last ``q_len`` of them.
        nbits / group_size: the KIVI settings the segments were written with.
        scaling: softmax scale (usually ``head_dim ** -0.5``).
        attention_mask: ``None`` (causal), or ``[batch, 1, q_len, Q + w]`` bool (True = attend) or additive float.
        window_offset: ignored unless ``attention_mask`` is None; tokens of the window before the first query
            (default ``w - q_len``), used for the causal rule inside the window.
        backend: ``"torch"`` (the pure-torch path of this module), ``"cpu-kernel"`` (the compiled C kernel of
            :mod:`kvlab.attention.cpu_kernel`: CPU decode-sized calls, bf16/fp32 windows and metadata),
            ``"triton"`` (the kernel of :mod:`kvlab.attention.triton_kivi` for the quantized blocks; CUDA, or CPU
            under ``TRITON_INTERPRET=1``) or ``"auto"``: Triton on CUDA when it can run; on the CPU the C kernel
            for decode-sized calls when it builds (:func:`kvlab.attention.cpu_kernel.unavailable_reason` says why
            not), else torch.
        dot: the compiled CPU kernel's key-score path (:func:`kvlab.attention.cpu_kernel.dot_path`: ``"exact"``,
            ``"int8"``, ``"int8-keys"``; ``None``: exact); the torch and Triton paths
            are exact whatever it says.
        ran: when given, a dict this call adds to (once per backend, bits, head_dim and ``dot``) the words of
            the path that ran, :func:`path_words` (a record's ``key_score_path``): what ran, not what was asked.

    Returns:
        ``[batch, q_heads, q_len, head_dim]`` in ``query.dtype``.

    Raises:
        ValueError: a non-4-D or non-floating query/window, shapes that do not fit each other (batch, kv heads,
            head_dim, q_heads not a multiple of kv_heads), segments not written with this ``nbits``/``group_size``
            for this batch/heads/head_dim, ``group_size * nbits`` not a multiple of 8, a mask that is not ``[1 or batch, 1, q_len, Q + w]`` bool or float
            (per-head masks included), a float mask holding anything but 0 or a large negative value (<= -1e4),
            ``q_len`` larger than the window or a ``window_offset`` outside ``[0, w - q_len]`` for the causal rule,
            an unknown backend.
        TypeError: ``scaling`` not a real number, ``window_offset`` not an int.
        RuntimeError: ``backend="triton"`` or ``"cpu-kernel"`` where that kernel cannot run (the reason is named).
    """
    if backend not in BACKENDS:
        raise ValueError(f"`backend` must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    segments = check_inputs(
        query, segments, key_window, value_window, nbits, group_size, scaling, attention_mask, window_offset
    )
    b, hq, q_len, d = query.shape
    hkv = key_window.shape[1]
    g, m = hq // hkv, hq // hkv * q_len
    refused = _cpu_kernel_refusal(query, segments, key_window, value_window, backend)
    if refused is None:
        if ran is not None:
            _note(ran, ("cpu-kernel", nbits, d, dot), "", group_size)
        valid = None if attention_mask is None else valid_tokens(attention_mask)
        offset = key_window.shape[2] - q_len if window_offset is None else window_offset
        return cpu_kernel.decode_attention(
            query, segments, key_window, value_window, nbits, group_size, scaling, valid, offset, dot=dot
        )
    # [B, Hq, q, D] -> [B, Hkv, g*q, D]: query heads sharing a KV head become rows (GQA without repeat_kv); the
    # softmax scale is folded into the rows once
    qg = query.to(torch.float32).reshape(b, hkv, m, d) * scaling
    use_triton = _use_triton(query, backend, nbits, group_size)
    if ran is not None:
        _note(ran, ("triton" if use_triton else "torch", nbits, d, dot), refused)
    out = torch_kivi.attend(
        qg, segments, key_window, value_window, nbits, group_size, attention_mask, window_offset, g, use_triton
    )  # fmt: skip
    return out.reshape(b, hq, q_len, d).to(query.dtype)


def path_words(
    backend: str, nbits: int, head_dim: int, dot: str | None, why: str = "", group_size: int | None = None
) -> str:
    """What a call of :func:`kivi_attention` ran, in words for a record: the compiled CPU kernel's key-score path
    (:func:`kvlab.attention.cpu_kernel.key_score_path`: ``"int8 (avx2)"``, ``"exact"``, or ``"exact (int8 does
    not take ...)"``), or ``"exact (torch: <why the kernel did not take it>)"`` / ``"exact (triton)"``, with what
    was asked where it is not what ran. A path that ran the integer dot products starts with ``"int8"``, one that
    ran fp32 ones with ``"exact"``.

    Raises:
        ValueError: a bad ``dot`` or ``KVLAB_CPU_ISA`` (:func:`kvlab.attention.cpu_kernel.dot_path`).
    """
    if backend == "cpu-kernel":
        return cpu_kernel.key_score_path(nbits, head_dim, dot, group_size)
    asked = cpu_kernel.dot_path(dot)
    note = f"; {asked} asked, a path of the CPU kernel only" if asked != "exact" else ""
    return f"exact ({backend}{': ' + why if why and backend == 'torch' else ''}{note})"


def _note(ran: dict, key: tuple, why: str | None, group_size: int | None = None) -> None:
    """Add :func:`path_words` of ``key`` ``(backend, nbits, head_dim, dot)`` (and ``group_size``) to ``ran`` once."""
    if key not in ran:
        ran[key] = path_words(*key, why or "", group_size=group_size)


def _cpu_kernel_refusal(query, segments, key_window, value_window, backend: str) -> str | None:
    """``None`` when the compiled CPU kernel (:mod:`kvlab.attention.cpu_kernel`) takes this call, else why not:
    ``backend="cpu-kernel"`` (a ``RuntimeError`` naming the reason where it cannot), or ``"auto"`` for
    decode-sized CPU problems (at most ``cpu_kernel.MAX_ROWS`` query rows per KV head and
    ``torch_kivi.TWO_PASS_MAX_SCORES`` scores) when it builds and loads."""
    if backend not in ("auto", "cpu-kernel"):
        return f"backend={backend!r}"
    if backend == "auto" and query.device.type != "cpu":
        return f"device {query.device}"
    total = sum(seg.tokens for seg in segments) + key_window.shape[2]
    rows = query.shape[1] // key_window.shape[1] * query.shape[2]
    why = cpu_kernel.unsupported(query, segments, key_window, value_window)
    if why is None and rows * total > torch_kivi.TWO_PASS_MAX_SCORES:
        why = f"{rows} rows x {total} keys is above the decode size ({torch_kivi.TWO_PASS_MAX_SCORES} scores)"
    if why is None:
        why = cpu_kernel.unavailable_reason()
    if why is not None and backend == "cpu-kernel":
        raise RuntimeError(f"backend='cpu-kernel' cannot run this call: {why}")
    return why


def _use_triton(query: torch.Tensor, backend: str, nbits: int, group_size: int) -> bool:
    """Whether the quantized blocks go through the Triton kernel: ``backend="triton"`` (an error where it cannot
    run), or ``"auto"`` on CUDA where it can."""
    if not (backend == "triton" or (backend == "auto" and query.is_cuda)):
        return False
    from kvlab.attention.triton_kivi import triton_refusal

    d = query.shape[-1]
    why = triton_refusal(query, d, nbits, group_size)
    if backend == "triton" and why is not None:
        raise RuntimeError(
            f"the Triton KIVI kernel cannot run here (device {query.device}, head_dim {d}, "
            f"nbits {nbits}, group_size {group_size}): {why}"
        )
    ok = why is None
    return ok and (backend == "triton" or query.is_cuda)
