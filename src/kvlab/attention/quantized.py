"""Attention over a KIVI cache that never builds the float K/V of the quantized history.

For one KV head, with keys per-channel (group ``j`` of ``G`` tokens has scale ``s_j`` and zero ``z_j`` per channel)
and values per-token (token ``t`` has scale ``u_t,k`` and zero ``w_t,k`` per group ``k`` of ``G`` channels)::

    q · K_t   = (q ⊙ s_j) · code_t  +  q · z_j                       (the key scale/zero fold into the query)
    Σ_t p_t V_t[k-group] = Σ_t (p_t u_t,k) code_t[k-group]  +  Σ_t p_t w_t,k   (value scale/zero fold into p)

so each quantized block is read as packed ``uint8`` codes, unpacked chunk by chunk into small integer-valued
tiles, and multiplied directly; the softmax is computed online across blocks and the full-precision residual
window (flash-decoding style split over the token axis: running max, running sum, rescaled accumulator).
Query heads of one KV head are stacked as rows (GQA without repeating K/V). Sources: KIVI (arXiv:2402.02750) §3.3
(fused dequantization into the matmul), FlashAttention/FlashDecoding online softmax (arXiv:2205.14135 §3.1).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from kvlab.quant.codec import unpack_codes
from kvlab.quant.kivi import QuantSegmentView

NEG_INF = float("-inf")
# decode-sized problems (query rows x keys) take the two-pass path; larger ones the online softmax
TWO_PASS_MAX_SCORES = 1 << 22
# blocks are unpacked this many tokens at a time: the fp32 tile of codes is the decode step's largest transient
CHUNK_TOKENS = 1024


def _chunks(seg: QuantSegmentView, group: int, chunk_tokens: int):
    """Split a block view into views of at most ``chunk_tokens`` tokens (a multiple of ``group``)."""
    step = max(group, chunk_tokens // group * group)
    if seg.tokens <= step:
        yield seg
        return
    for s in range(0, seg.tokens, step):
        e = min(seg.tokens, s + step)
        yield QuantSegmentView(
            k_codes=seg.k_codes[:, :, s:e],
            k_scale=seg.k_scale[:, :, s // group : e // group],
            k_zero=seg.k_zero[:, :, s // group : e // group],
            v_codes=seg.v_codes[:, :, s:e],
            v_scale=seg.v_scale[:, :, s:e],
            v_zero=seg.v_zero[:, :, s:e],
            tokens=e - s,
        )


def _mask_rows(
    mask: torch.Tensor | None, groups: int, q_len: int, start: int, stop: int
) -> torch.Tensor | None:
    """Columns ``[start, stop)`` of a ``[B, 1|Hkv*g?, q, kv]`` mask as ``[B, 1, g*q, n]`` (bool: True = attend)."""
    if mask is None:
        return None
    m = mask[..., start:stop]
    if m.dtype != torch.bool:
        m = m == 0  # additive float mask: 0 = attend, large negative = masked
    b, h, q, n = m.shape
    if h != 1:
        raise ValueError(f"per-head attention masks are not supported, got mask shape {tuple(mask.shape)}")
    return m[:, :, None].expand(b, 1, groups, q, n).reshape(b, 1, groups * q, n)


class _OnlineSoftmax:
    """Running max / sum / accumulator over key chunks for ``[B, H, M, D]`` outputs (fp32)."""

    def __init__(self, b: int, h: int, m: int, d: int, device: torch.device):
        self.m = torch.full((b, h, m, 1), NEG_INF, device=device)
        self.l = torch.zeros((b, h, m, 1), device=device)
        self.acc = torch.zeros((b, h, m, d), device=device)

    def probs(self, scores: torch.Tensor) -> torch.Tensor:
        """Fold ``scores [B, H, M, n]`` into the running max; return ``exp(scores - max)`` and rescale state."""
        m_new = torch.maximum(self.m, scores.amax(dim=-1, keepdim=True))
        safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        alpha = torch.exp(
            torch.where(torch.isfinite(self.m), self.m - safe, torch.full_like(self.m, NEG_INF))
        )
        p = torch.exp(scores - safe)
        self.l = self.l * alpha + p.sum(dim=-1, keepdim=True)
        self.acc = self.acc * alpha
        self.m = m_new
        return p

    def merge(self, m: torch.Tensor, row_sum: torch.Tensor, acc: torch.Tensor) -> None:
        """Fold a chunk's partial ``(max [B,H,M,1], sum [B,H,M,1], unnormalised acc [B,H,M,D])`` into the state."""
        m_new = torch.maximum(self.m, m)
        safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        a_old = torch.where(torch.isfinite(self.m), torch.exp(self.m - safe), torch.zeros_like(self.m))
        a_new = torch.where(torch.isfinite(m), torch.exp(m - safe), torch.zeros_like(m))
        self.l = self.l * a_old + row_sum * a_new
        self.acc = self.acc * a_old + acc * a_new
        self.m = m_new

    def result(self) -> torch.Tensor:
        return self.acc / self.l.clamp_min(torch.finfo(torch.float32).tiny)


def _block_scores(
    qg: torch.Tensor, seg: QuantSegmentView, nbits: int, group: int, scaling: float
) -> torch.Tensor:
    """Scaled scores ``[B, H, M, n]`` of fp32 query rows ``qg [B, H, M, D]`` against a block's packed keys."""
    b, h, m, d = qg.shape
    n = seg.tokens
    ng = n // group
    # keys: scores[b,h,m,t] = (q ⊙ s_j)·code_t + q·z_j, with j = t // G
    k_codes = unpack_codes(seg.k_codes, nbits).to(torch.float32).view(b, h, ng, group, d)  # [B,H,NG,G,D]
    qs = qg[:, :, None] * seg.k_scale.to(torch.float32)[:, :, :, None, :]  # [B,H,NG,M,D]
    scores = torch.matmul(qs, k_codes.transpose(-1, -2))  # [B,H,NG,M,G]
    qz = torch.matmul(qg, seg.k_zero.to(torch.float32).transpose(-1, -2))  # [B,H,M,NG]
    scores = scores.permute(0, 1, 3, 2, 4) + qz[..., None]  # [B,H,M,NG,G]
    return scores.reshape(b, h, m, n) * scaling


def _block_values(p: torch.Tensor, seg: QuantSegmentView, nbits: int, group: int) -> torch.Tensor:
    """``p @ V`` for probabilities ``p [B, H, M, n]`` over a block's packed values: ``[B, H, M, D]`` fp32."""
    b, h, m, n = p.shape
    packed = seg.v_codes.shape[-1]
    d = packed * 8 // nbits
    kg = d // group
    # values: out[m, k, :] = Σ_t (p_t u_t,k) code_t[k, :] + Σ_t p_t w_t,k
    v_codes = unpack_codes(seg.v_codes, nbits).to(torch.float32).view(b, h, n, kg, group)  # [B,H,n,KG,G]
    pw = (p[..., None] * seg.v_scale.to(torch.float32)[:, :, None]).permute(0, 1, 4, 2, 3)  # [B,H,KG,M,n]
    out = torch.matmul(pw, v_codes.permute(0, 1, 3, 2, 4))  # [B,H,KG,M,G]
    out = out.permute(0, 1, 3, 2, 4).reshape(b, h, m, d)  # [B,H,M,D]
    pz = torch.matmul(p, seg.v_zero.to(torch.float32))  # [B,H,M,KG]
    return out + pz.repeat_interleave(group, dim=-1)


def _quantized_block(
    state: _OnlineSoftmax,
    qg: torch.Tensor,
    seg: QuantSegmentView,
    nbits: int,
    group: int,
    mask: torch.Tensor | None,
    scaling: float,
) -> None:
    """Accumulate one quantized block into ``state`` (online softmax). ``qg``: ``[B, H, M, D]`` fp32 rows."""
    scores = _block_scores(qg, seg, nbits, group, scaling)
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    p = state.probs(scores)  # [B,H,M,n]
    state.acc += _block_values(p, seg, nbits, group)


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
        backend: ``"torch"``, ``"triton"`` (the kernel of :mod:`kvlab.attention.triton_kivi` for the quantized
            blocks; CUDA, or CPU under ``TRITON_INTERPRET=1``) or ``"auto"`` (Triton on CUDA when it can run).

    Returns:
        ``[batch, q_heads, q_len, head_dim]`` in ``query.dtype``.

    Raises:
        ValueError: q_heads not a multiple of kv_heads, mismatched head_dim, per-head masks, unknown backend.
        RuntimeError: ``backend="triton"`` where the kernel cannot run.
    """
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"`backend` must be 'auto', 'torch' or 'triton', got {backend!r}")
    b, hq, q_len, d = query.shape
    hkv, w = key_window.shape[1], key_window.shape[2]
    if hq % hkv or key_window.shape[-1] != d:
        raise ValueError(f"query {tuple(query.shape)} does not fit key window {tuple(key_window.shape)}")
    g = hq // hkv
    # [B, Hq, q, D] -> [B, Hkv, g*q, D]: query heads sharing a KV head become rows (GQA without repeat_kv)
    qg = query.to(torch.float32).reshape(b, hkv, g * q_len, d)
    segments = list(segments)
    use_triton = False
    if backend != "torch":
        from kvlab.attention.triton_kivi import kivi_block_partials, triton_supported

        ok = triton_supported(query, d, nbits, group_size)
        if backend == "triton" and not ok:
            raise RuntimeError(
                f"the Triton KIVI kernel cannot run here (device {query.device}, head_dim {d}, "
                f"nbits {nbits}, group_size {group_size})"
            )
        use_triton = ok and (backend == "triton" or query.is_cuda)
    # full-precision window scores, with the causal rule inside the window when no mask is given
    quantized = sum(seg.tokens for seg in segments)
    w_scores = torch.matmul(qg, key_window.to(torch.float32).transpose(-1, -2)) * scaling  # [B,Hkv,g*q,w]
    if attention_mask is not None:
        w_scores = w_scores.masked_fill(
            ~_mask_rows(attention_mask, g, q_len, quantized, quantized + w), NEG_INF
        )
    elif q_len > 1:
        offset = w - q_len if window_offset is None else window_offset
        rows = torch.arange(q_len, device=query.device).repeat(g)[:, None]  # query index of each row
        cols = torch.arange(w, device=query.device)[None, :]
        w_scores = w_scores.masked_fill(cols > rows + offset, NEG_INF)
    v_window = value_window.to(torch.float32)
    if not use_triton and g * q_len * (quantized + w) <= TWO_PASS_MAX_SCORES:
        chunks = [c for seg in segments for c in _chunks(seg, group_size, CHUNK_TOKENS)]
        out = _two_pass(qg, chunks, w_scores, v_window, nbits, group_size, scaling, attention_mask, g, q_len)
    else:
        state = _OnlineSoftmax(b, hkv, g * q_len, d, query.device)
        start = 0
        for seg in segments:
            mask = _mask_rows(attention_mask, g, q_len, start, start + seg.tokens)
            if use_triton and (mask is None or q_len == 1):
                valid = (
                    None if mask is None else mask[:, 0, 0, :]
                )  # [B, n]: one row decides for a decode step
                state.merge(*kivi_block_partials(qg, seg, nbits, group_size, scaling, valid))
            else:
                for i, c in enumerate(_chunks(seg, group_size, CHUNK_TOKENS)):
                    off = start + i * max(group_size, CHUNK_TOKENS // group_size * group_size)
                    cmask = _mask_rows(attention_mask, g, q_len, off, off + c.tokens)
                    _quantized_block(state, qg, c, nbits, group_size, cmask, scaling)
            start += seg.tokens
        p = state.probs(w_scores)
        state.acc += torch.matmul(p, v_window)
        out = state.result()  # [B, Hkv, g*q, D]
    return out.reshape(b, hq, q_len, d).to(query.dtype)


def _two_pass(
    qg, segments, w_scores, v_window, nbits, group, scaling, attention_mask, g, q_len
) -> torch.Tensor:
    """Decode-sized problems: all scores at once (they are ``M x T`` floats, small), one softmax, then ``p @ V``
    block by block. Same result as the online softmax with fewer operations; keys and values are each unpacked once."""
    parts, start = [], 0
    for seg in segments:
        scores = _block_scores(qg, seg, nbits, group, scaling)
        mask = _mask_rows(attention_mask, g, q_len, start, start + seg.tokens)
        parts.append(scores if mask is None else scores.masked_fill(~mask, NEG_INF))
        start += seg.tokens
    parts.append(w_scores)
    p = torch.softmax(torch.cat(parts, dim=-1), dim=-1).nan_to_num_(0.0)  # [B,H,M,T]; fully masked rows -> 0
    out = torch.matmul(p[..., start:], v_window)
    start = 0
    for seg in segments:
        out += _block_values(p[..., start : start + seg.tokens], seg, nbits, group)
        start += seg.tokens
    return out
