"""Triton kernel: decode attention of query rows over one KIVI-quantized block, read as packed codes.

One program handles ``BLOCK_T`` tokens of one (batch row, KV head): it loads the packed ``uint8`` key codes, shifts
out each bit-field ("part"), rebuilds ``code * scale + zero`` in registers only (keys per-channel: one scale/zero
per G tokens per channel; values per-token: one per token per G channels), computes scores for all query heads of
the KV head with ``tl.dot``, a local softmax, and ``p @ V``; it writes its partial (max, sum, accumulator). The
partials of all programs are merged with the online-softmax rule (flash-decoding, split over the token axis).
Nothing float of the size of the history is ever written to memory.

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
        n_splits,
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
        ng = n_tokens // G
        scores = tl.zeros((M_PAD, BT), dtype=tl.float32)
        for i in tl.static_range(PER_BYTE):
            packed = tl.load(
                kc_ptr + bh * n_tokens * DB + t[:, None] * DB + jj[None, :], mask=tmask[:, None], other=0
            )
            code = ((packed >> (i * NBITS)) & code_mask).to(tl.float32)  # [BT, DB]
            chan = jj * PER_BYTE + i  # [DB] channel of this part
            meta = bh * ng * D + (t // G)[:, None] * D + chan[None, :]  # keys: per-channel groups of G tokens
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
        out_base = (bh * n_splits + split) * M_PAD
        tl.store(m_out + out_base + rows, m)
        tl.store(l_out + out_base + rows, row_sum)
        for i in tl.static_range(PER_BYTE):
            packed = tl.load(
                vc_ptr + bh * n_tokens * DB + t[:, None] * DB + jj[None, :], mask=tmask[:, None], other=0
            )
            code = ((packed >> (i * NBITS)) & code_mask).to(tl.float32)
            chan = jj * PER_BYTE + i
            meta = (
                bh * n_tokens * (D // G) + t[:, None] * (D // G) + (chan // G)[None, :]
            )  # values: per-token
            u = tl.load(vs_ptr + meta, mask=tmask[:, None], other=0.0).to(tl.float32)
            w = tl.load(vz_ptr + meta, mask=tmask[:, None], other=0.0).to(tl.float32)
            v_hat = code * u + w
            acc = tl.dot(p, v_hat, input_precision="ieee")  # [M_PAD, DB]
            tl.store(acc_out + out_base * D + rows[:, None] * D + (i * DB + jj)[None, :], acc)


def triton_supported(query: torch.Tensor, head_dim: int, nbits: int, group_size: int) -> bool:
    """Whether :func:`kivi_block_partials` can run for these settings on ``query``'s device."""
    if not HAS_TRITON:
        return False
    import os

    on_device = query.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    db = head_dim * nbits // 8
    return on_device and db >= 16 and (db & (db - 1)) == 0 and BLOCK_T % group_size == 0


def kivi_block_partials(
    qg: torch.Tensor,
    seg: QuantSegmentView,
    nbits: int,
    group_size: int,
    scaling: float,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax partials of query rows over one quantized block, from the Triton kernel.

    Args:
        qg: ``[B, Hkv, M, D]`` fp32 query rows (the query heads of each KV head, stacked).
        seg: the block (see :class:`kvlab.quant.kivi.QuantSegmentView`), ``n`` tokens, a multiple of ``G``.
        valid: optional ``[B, n]`` bool, False for padded key positions.

    Returns:
        ``(m [B, Hkv, M, 1], l [B, Hkv, M, 1], acc [B, Hkv, M, D])`` with ``acc`` not yet divided by ``l``:
        the same quantities :class:`kvlab.attention.torch_kivi._OnlineSoftmax` accumulates.

    Raises:
        RuntimeError: Triton is not installed or cannot run here (see :func:`triton_supported`).
    """
    if not HAS_TRITON:
        raise RuntimeError("Triton is not installed: pip install triton (CUDA) or use the torch path")
    b, h, m, d = qg.shape
    n = seg.tokens
    per_byte = 8 // nbits
    db = d * nbits // 8
    m_pad = max(16, 1 << (m - 1).bit_length())
    # part-major channel order: position i*DB + j holds channel j*per_byte + i
    perm = torch.arange(d, device=qg.device).view(db, per_byte).t().reshape(-1)
    q = torch.zeros(b * h, m_pad, d, device=qg.device, dtype=torch.float32)
    q[:, :m] = qg.reshape(b * h, m, d)[..., perm]
    splits = -(-n // BLOCK_T)
    m_out = torch.empty(b * h, splits, m_pad, device=qg.device, dtype=torch.float32)
    l_out = torch.empty_like(m_out)
    acc_out = torch.empty(b * h, splits, m_pad, d, device=qg.device, dtype=torch.float32)
    if valid is not None:
        valid_bh = valid[:, None, :].expand(b, h, n).reshape(b * h, n).to(torch.int8).contiguous()
    else:
        valid_bh = torch.empty(1, device=qg.device, dtype=torch.int8)
    _kivi_block_kernel[(b * h, splits)](
        q,
        seg.k_codes.contiguous(),
        seg.k_scale.contiguous(),
        seg.k_zero.contiguous(),
        seg.v_codes.contiguous(),
        seg.v_scale.contiguous(),
        seg.v_zero.contiguous(),
        valid_bh,
        m_out,
        l_out,
        acc_out,
        n,
        splits,
        float(scaling),
        HAS_VALID=valid is not None,
        NBITS=nbits,
        PER_BYTE=per_byte,
        DB=db,
        D=d,
        G=group_size,
        M_PAD=m_pad,
        BT=BLOCK_T,
    )
    # merge the splits (online-softmax rule), drop padded rows, restore the channel order
    m_all = m_out[:, :, :m]  # [BH, S, M]
    m_max = m_all.amax(dim=1, keepdim=True)
    m_safe = torch.where(torch.isfinite(m_max), m_max, torch.zeros_like(m_max))
    weight = torch.exp(m_all - m_safe)  # [BH, S, M]; exp(-inf) = 0 for empty splits
    row_sum = (weight * l_out[:, :, :m]).sum(dim=1)  # [BH, M]
    acc = (weight[..., None] * acc_out[:, :, :m]).sum(dim=1)  # [BH, M, D] part-major
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(d, device=qg.device)
    acc = acc[..., inverse]
    return m_max.reshape(b, h, m, 1), row_sum.reshape(b, h, m, 1), acc.reshape(b, h, m, d)
