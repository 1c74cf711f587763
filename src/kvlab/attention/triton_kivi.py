"""Triton kernel: decode attention of query rows over one KIVI-quantized block, read as packed codes.

One program handles ``BLOCK_T`` tokens of one (batch row, KV head): it loads the packed ``uint8`` key codes, shifts
out each bit-field ("part"), rebuilds ``code * scale + zero`` in registers only (keys per-channel: one scale/zero
per G tokens per channel; values per-token: one per token per G channels), computes scores for all query heads of
the KV head with ``tl.dot``, a local softmax, and ``p @ V``; it writes its partial (max, sum, accumulator) for the
real query rows only. One launch per block writes into one partial buffer for all blocks (each block at its own
split offset), and the partials are merged once per call with the online-softmax rule (flash-decoding, split over
the token axis: Dao et al., "Flash-Decoding for long-context inference", 2023). Blocks are read in place through
their strides (a block's filled part is a strided view of its storage, never copied). Nothing float of the size of
the history is ever written to memory.

Channel order: byte ``j`` of a packed row holds channels ``j*k + i`` (``k = 8 // nbits`` codes a byte, part ``i`` at
bits ``[i*nbits, (i+1)*nbits)``, see :func:`kvlab.quant.codec.pack_codes`). The kernel works part by part, so the
query and the accumulator use a part-major channel order that the wrapper permutes in and out.

Optional: importing this module without Triton works; :data:`HAS_TRITON` says whether kernels can run. On a CPU
the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``), which is how the tests check it without a GPU.
"""

from __future__ import annotations

import torch

try:  # optional dependency
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised where triton is missing
    triton = tl = None
    HAS_TRITON = False

from kvlab.quant.kivi import QuantSegmentView

BLOCK_T = 64


if HAS_TRITON:

    @triton.jit
    def _kivi_block_kernel(
        q_ptr,
        kc_ptr,
        ks_ptr,
        kz_ptr,
        vc_ptr,
        vs_ptr,
        vz_ptr,
        valid_ptr,
        m_out,
        l_out,
        acc_out,
        n_tokens,
        split0,
        n_splits,
        m_rows,
        kc_bh,
        ks_bh,
        vc_bh,
        vs_bh,
        scaling,
        HAS_VALID: tl.constexpr,
        NBITS: tl.constexpr,
        PER_BYTE: tl.constexpr,
        DB: tl.constexpr,
        D: tl.constexpr,
        G: tl.constexpr,
        M_PAD: tl.constexpr,
        BT: tl.constexpr,
    ):
        bh = tl.program_id(0)  # batch row * kv_heads + kv head
        split = tl.program_id(1)  # which BT-token slice of the block
        t = split * BT + tl.arange(0, BT)  # [BT] token index in the block
        tmask = t < n_tokens
        jj = tl.arange(0, DB)  # [DB] byte index in a packed row
        rows = tl.arange(0, M_PAD)  # [M_PAD] query rows (padded to the dot's minimum)
        code_mask = (1 << NBITS) - 1
        kc_base = kc_ptr + bh.to(tl.int64) * kc_bh
        vc_base = vc_ptr + bh.to(tl.int64) * vc_bh
        ks_base = bh.to(tl.int64) * ks_bh
        vs_base = bh.to(tl.int64) * vs_bh
        scores = tl.zeros((M_PAD, BT), dtype=tl.float32)
        for i in tl.static_range(PER_BYTE):
            packed = tl.load(kc_base + t[:, None] * DB + jj[None, :], mask=tmask[:, None], other=0)
            code = ((packed >> (i * NBITS)) & code_mask).to(tl.float32)  # [BT, DB]
            chan = jj * PER_BYTE + i  # [DB] channel of this part
            meta = ks_base + (t // G)[:, None] * D + chan[None, :]  # keys: per-channel groups of G tokens
            s = tl.load(ks_ptr + meta, mask=tmask[:, None], other=0.0).to(tl.float32)
            z = tl.load(kz_ptr + meta, mask=tmask[:, None], other=0.0).to(tl.float32)
            k_hat = code * s + z  # registers only
            q = tl.load(q_ptr + bh * M_PAD * D + rows[:, None] * D + (i * DB + jj)[None, :])  # [M_PAD, DB]
            scores += tl.dot(q, tl.trans(k_hat), input_precision="ieee")
        scores = scores * scaling
        keep = tmask
        if HAS_VALID:
            b = bh  # valid is stored per (batch row, kv head) by the wrapper
            keep = keep & (tl.load(valid_ptr + b * n_tokens + t, mask=tmask, other=0) != 0)
        scores = tl.where(keep[None, :], scores, float("-inf"))
        m = tl.max(scores, axis=1)  # [M_PAD]
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        p = tl.exp(scores - m_safe[:, None])
        p = tl.where(keep[None, :], p, 0.0)
        row_sum = tl.sum(p, axis=1)
        real = rows < m_rows  # only the real query rows are written: padded rows cost no memory traffic
        out_base = (bh * n_splits + split0 + split) * m_rows
        tl.store(m_out + out_base + rows, m, mask=real)
        tl.store(l_out + out_base + rows, row_sum, mask=real)
        for i in tl.static_range(PER_BYTE):
            packed = tl.load(vc_base + t[:, None] * DB + jj[None, :], mask=tmask[:, None], other=0)
            code = ((packed >> (i * NBITS)) & code_mask).to(tl.float32)
            chan = jj * PER_BYTE + i
            meta = vs_base + t[:, None] * (D // G) + (chan // G)[None, :]  # values: per-token
            u = tl.load(vs_ptr + meta, mask=tmask[:, None], other=0.0).to(tl.float32)
            w = tl.load(vz_ptr + meta, mask=tmask[:, None], other=0.0).to(tl.float32)
            v_hat = code * u + w
            acc = tl.dot(p, v_hat, input_precision="ieee")  # [M_PAD, DB]
            tl.store(
                acc_out + out_base * D + rows[:, None] * D + (i * DB + jj)[None, :], acc, mask=real[:, None]
            )


def triton_refusal(query: torch.Tensor, head_dim: int, nbits: int, group_size: int) -> str | None:
    """Why :func:`kivi_partials` cannot run for these settings on ``query``'s device, or ``None`` when it can:
    Triton not installed, a device other than CUDA (the CPU only under ``TRITON_INTERPRET=1``), a packed row
    (``head_dim * nbits / 8`` bytes) that is not a power of two of at least 16 bytes, or a ``group_size`` that does
    not divide :data:`BLOCK_T`."""
    import os

    if not HAS_TRITON:
        return "Triton is not installed"
    if not (query.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return f"it runs on CUDA (on the CPU only under TRITON_INTERPRET=1), got device {query.device}"
    db = head_dim * nbits // 8
    if db < 16 or db & (db - 1):
        return f"head_dim x nbits / 8 ({head_dim} x {nbits} / 8 = {db} B) must be a power of two >= 16 B"
    if BLOCK_T % group_size:
        return f"group_size {group_size} must divide the kernel's {BLOCK_T}-token block"
    return None


def _bh_stride(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x`` ``[B, H, n, c]`` and the element stride between its (batch row, head) slabs, read in place where the
    slabs sit at one stride with rows of ``c`` packed elements (a block's filled part: a slice of its storage), else
    a contiguous copy."""
    b, h, _, c = x.shape
    if x.stride(3) == 1 and x.stride(2) == c and (b == 1 or x.stride(0) == h * x.stride(1)):
        return x, x.stride(1)
    x = x.contiguous()
    return x, x.stride(1)


def kivi_partials(
    qg: torch.Tensor,
    segments: list[QuantSegmentView],
    nbits: int,
    group_size: int,
    scaling: float,
    valids: list[torch.Tensor | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax partials of query rows over quantized blocks, from the Triton kernel (one launch per block, one
    merge for all of them).

    Args:
        qg: ``[B, Hkv, M, D]`` fp32 query rows (the query heads of each KV head, stacked).
        segments: the blocks (see :class:`kvlab.quant.kivi.QuantSegmentView`), ``n`` tokens each, a multiple of ``G``.
        valids: optional, one per segment: ``None`` or ``[B, n]`` bool, False for padded key positions.

    Returns:
        ``(m [B, Hkv, M, 1], l [B, Hkv, M, 1], acc [B, Hkv, M, D])`` with ``acc`` not yet divided by ``l``:
        the same quantities :class:`kvlab.attention.torch_kivi._OnlineSoftmax` accumulates.

    Raises:
        RuntimeError: Triton is not installed.
        ValueError: ``valids`` does not hold one entry per segment.
    """
    if not HAS_TRITON:
        raise RuntimeError("Triton is not installed: pip install triton (CUDA) or use the torch path")
    valids = [None] * len(segments) if valids is None else list(valids)
    if len(valids) != len(segments):
        raise ValueError(f"`valids` must hold one entry per segment ({len(segments)}), got {len(valids)}")
    b, h, m, d = qg.shape
    per_byte = 8 // nbits
    db = d * nbits // 8
    m_pad = max(16, 1 << (m - 1).bit_length())
    # part-major channel order: position i*DB + j holds channel j*per_byte + i
    perm = torch.arange(d, device=qg.device).view(db, per_byte).t().reshape(-1)
    q = torch.zeros(b * h, m_pad, d, device=qg.device, dtype=torch.float32)
    q[:, :m] = qg.reshape(b * h, m, d)[..., perm]
    splits = [-(-seg.tokens // BLOCK_T) for seg in segments]
    total = sum(splits)
    m_out = torch.empty(b * h, total, m, device=qg.device, dtype=torch.float32)
    l_out = torch.empty_like(m_out)
    acc_out = torch.empty(b * h, total, m, d, device=qg.device, dtype=torch.float32)
    no_valid = torch.empty(1, device=qg.device, dtype=torch.int8)
    split0 = 0
    for seg, n_split, valid in zip(segments, splits, valids):
        _launch(q, seg, valid, no_valid, (m_out, l_out, acc_out), split0, total, m, nbits, group_size, scaling)
        split0 += n_split
    return _merge(m_out, l_out, acc_out, perm, (b, h, m, d))


def _launch(q, seg, valid, no_valid, outs, split0, total, m, nbits, group_size, scaling) -> None:
    """One kernel launch over one block, writing its partials at splits ``[split0, split0 + ceil(n / BLOCK_T))``."""
    bh, m_pad, d = q.shape
    n = seg.tokens
    kc, kc_bh = _bh_stride(seg.k_codes)
    vc, vc_bh = _bh_stride(seg.v_codes)
    ks, ks_bh = _bh_stride(seg.k_scale)
    kz, kz_bh = _bh_stride(seg.k_zero)
    vs, vs_bh = _bh_stride(seg.v_scale)
    vz, vz_bh = _bh_stride(seg.v_zero)
    if (kz_bh, vz_bh) != (ks_bh, vs_bh):  # scale and zero share one stride in the kernel
        kz, vz = kz.contiguous(), vz.contiguous()
        ks, vs = ks.contiguous(), vs.contiguous()
        ks_bh, vs_bh = ks.stride(1), vs.stride(1)
    if valid is not None:
        b = valid.shape[0]
        valid_bh = valid[:, None, :].expand(b, bh // b, n).reshape(bh, n).to(torch.int8).contiguous()
    m_out, l_out, acc_out = outs
    _kivi_block_kernel[(bh, -(-n // BLOCK_T))](
        q, kc, ks, kz, vc, vs, vz,
        no_valid if valid is None else valid_bh,
        m_out, l_out, acc_out,
        n, split0, total, m, kc_bh, ks_bh, vc_bh, vs_bh, float(scaling),
        HAS_VALID=valid is not None,
        NBITS=nbits,
        PER_BYTE=8 // nbits,
        DB=d * nbits // 8,
        D=d,
        G=group_size,
        M_PAD=m_pad,
        BT=BLOCK_T,
    )  # fmt: skip


def _merge(m_out, l_out, acc_out, perm, shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The online-softmax merge of every split's partial (``m_out``/``l_out`` ``[BH, S, M]``, ``acc_out``
    ``[BH, S, M, D]`` part-major) into ``(m, l, acc)`` of ``shape`` ``(B, H, M, D)``, channels restored."""
    b, h, m, d = shape
    m_max = m_out.amax(dim=1, keepdim=True)
    m_safe = torch.where(torch.isfinite(m_max), m_max, torch.zeros_like(m_max))
    weight = torch.exp(m_out - m_safe)  # [BH, S, M]; exp(-inf) = 0 for empty splits
    row_sum = (weight * l_out).sum(dim=1)  # [BH, M]
    acc = torch.einsum("bsm,bsmd->bmd", weight, acc_out)  # [BH, M, D] part-major
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(d, device=perm.device)
    acc = acc[..., inverse]
    return m_max.reshape(b, h, m, 1), row_sum.reshape(b, h, m, 1), acc.reshape(b, h, m, d)
