"""Attention over a KIVI cache that never builds the float K/V of the quantized history.

For one KV head, with keys per-channel (group ``j`` of ``G`` tokens has scale ``s_j`` and zero ``z_j`` per channel)
and values per-token (token ``t`` has scale ``u_t,k`` and zero ``w_t,k`` per group ``k`` of ``G`` channels)::

    q · K_t   = (q ⊙ s_j) · code_t  +  q · z_j                       (the key scale/zero fold into the query)
    Σ_t p_t V_t[k-group] = Σ_t (p_t u_t,k) code_t[k-group]  +  Σ_t p_t w_t,k   (value scale/zero fold into p)

Unpacking also moves to the small side: a byte ``x = c_0 + 2^b c_1 + ...`` holds ``8 / b`` codes, and
``Σ_i a_i c_i = Σ_i (a_i - 2^b a_{i-1}) floor(x / 2^{ib})``, so the packed bytes are converted to fp32 once per
chunk and each further part is an exact in-place ``floor(tile / 2^b)``: no masks, no interleaving, one fp32 tile of
``chunk x D·b/8`` per KV head, reused for every chunk and block (the chunk is sized to at most 1/8 of the layer's
bf16 K+V and at least MIN_TILE_BYTES, :func:`chunk_tokens`). On the CPU the cost is the number of operators and
the bytes each matmul reads, so each part is one batched matmul over all key groups (two heads per item) and one
matmul over all value groups (their rows stacked, the codes in their own layout): a 2-bit block takes 4 matmuls
per chunk for keys and 4 for values, a 4-bit block 2 and 2. Decode-sized problems take every score at once
(``M x T`` floats), one softmax,
then ``p @ V`` block by block; larger ones (long prefill chunks over a quantized prefix) use the online softmax
(running max, running sum, rescaled accumulator) across chunks and the full-precision residual window. Query heads
of one KV head are stacked as rows (GQA without repeating K/V).

Backends: this module's pure-torch path runs anywhere; on the CPU, decode-sized calls (at most
``cpu_kernel.MAX_ROWS`` query rows per KV head) go by default to a compiled C kernel
(:mod:`kvlab.attention.cpu_kernel`: the same two folds, one call per layer instead of ~30 torch operators, built at
first use, torch when it cannot be built); on CUDA, the quantized blocks go to the Triton kernel
(:mod:`kvlab.attention.triton_kivi`) when it can run. ``kivi_attention(backend=...)`` picks one explicitly.

Sources: KIVI (arXiv:2402.02750) section 3.3 (fused dequantization into the matmul), FlashAttention/FlashDecoding online
softmax (arXiv:2205.14135 section 3.1).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from contextlib import contextmanager

import torch

from kvlab.attention import cpu_kernel
from kvlab.quant.codec import check_group_size, check_nbits
from kvlab.quant.kivi import QuantSegmentView

BACKENDS = ("auto", "torch", "cpu-kernel", "triton")
NEG_INF = float("-inf")
F32 = torch.float32
# decode-sized problems (query rows x keys) take the two-pass path; larger ones the online softmax
TWO_PASS_MAX_SCORES = 1 << 22
# Codes are unpacked into one reusable fp32 tile of ``chunk`` tokens x ``head_dim / codes per byte`` channels,
# the decode step's largest transient. The chunk is chosen so that the tile is at most 1/8 of the layer's bf16 K+V
# bytes (``chunk <= tokens * codes_per_byte / 8``), within [MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS], but never below
# MIN_TILE_BYTES: under ~100 KiB a smaller tile only adds operators (at 1024 tokens the bundled model's block
# took 4 chunks at 4 bits, ~290 us per layer, and 2 chunks ~250 us; the step's transient stays under 9 % of the
# bf16 cache, `kvlab bench memory`). Chunks of one block are balanced (no small remainder). Setting CHUNK_TOKENS
# to an int fixes the largest chunk instead (tests).
CHUNK_TOKENS: int | None = None
MIN_CHUNK_TOKENS = 256
MAX_CHUNK_TOKENS = 4096
MIN_TILE_BYTES = 112 << 10
# Decode problems whose tile is below this many floats run on one intra-op thread: their operators are too small to
# split, and waking the other threads costs more than the work (on a 2-core VM, the bundled model's attention at
# 1024 tokens took ~800 us with two threads and ~540 us with one; from 4096 tokens on two threads are slightly faster).
SERIAL_MAX_TILE = 1 << 16


@contextmanager
def _intra_op_threads(n: int | None):
    """Run the block with ``n`` intra-op threads (``None``: unchanged), restoring the previous count after."""
    prev = torch.get_num_threads()
    if n is None or n >= prev:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def chunk_tokens(total_tokens: int, nbits: int, group: int, token_bytes: int = 0) -> int:
    """Most tokens unpacked at a time for a layer holding ``total_tokens``: a positive multiple of ``group``.
    ``token_bytes``: tile bytes per token (``B * H * head_dim / codes per byte * 4``), for the MIN_TILE_BYTES floor."""
    if CHUNK_TOKENS is not None:
        c = CHUNK_TOKENS
    else:
        floor = max(MIN_CHUNK_TOKENS, MIN_TILE_BYTES // token_bytes) if token_bytes > 0 else MIN_CHUNK_TOKENS
        c = min(MAX_CHUNK_TOKENS, max(floor, total_tokens * (8 // nbits) // 8))
    return max(group, c // group * group)


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


def _chunk_step(tokens: int, chunk: int, group: int) -> int:
    """Tokens per chunk when a block of ``tokens`` is cut into chunks of at most ``chunk`` tokens (multiples of
    ``group``): as few chunks as fit, of balanced sizes, so no chunk is a small remainder."""
    count = -(-tokens // chunk)
    per_chunk = -(-tokens // count)
    return -(-per_chunk // group) * group


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


class _Scratch:
    """The reusable fp32 tile of one attention call and its views, made once per chunk shape.

    The tile holds one chunk of codes converted to fp32, ``chunk * B * H * D / k`` floats, and is reused for every
    chunk, part, block, and to convert the full-precision window (it is sized for the larger of the two): the
    decode step's largest transient. ``k = 8 / nbits`` codes share a byte.
    """

    def __init__(self, qg: torch.Tensor, chunk: int, nbits: int, group: int, window: int = 0):
        b, h, m, d = qg.shape
        self.b, self.h, self.m, self.d = b, h, m, d
        self.chunk, self.nbits, self.group = chunk, nbits, group
        self.k = 8 // nbits
        self.inv_base = 1.0 / (1 << nbits)
        self.tile = torch.empty(max(chunk * b * h * d // self.k, window * b * h * d), device=qg.device)
        # query channels by part: q_parts[..., i, j] is channel j*k + i (the order of the shifted parts)
        self.q_parts = qg.view(b, h, m, d // self.k, self.k).transpose(-1, -2)  # [B,H,M,k,P]
        # key groups of two heads share one item of the batched key matmul (rows of both heads against the tokens of
        # both; the cross blocks are dropped): half as many items, each twice as wide, which costs less than the
        # items it saves (at M = 2 rows, G = 32: ~20% less at 4 bits, ~30% at 2 bits)
        self.heads_per_item = 2 if b * h % 2 == 0 else 1
        self._views: dict = {}

    def key_tile(self, nj: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The tile as ``[nj, B, H, G, P]`` (keys of ``nj`` groups) and as the bmm operand ``[nj*B*H/hp, P, hp*G]``
        (``hp``: :attr:`heads_per_item`)."""
        v = self._views.get(("k", nj))
        if v is None:
            rows, g, p, hp = nj * self.b * self.h, self.group, self.d // self.k, self.heads_per_item
            tile = self.tile[: rows * g * p].view(nj, self.b, self.h, g, p)
            v = self._views[("k", nj)] = (tile, tile.view(rows // hp, hp * g, p).transpose(1, 2))
        return v

    def value_tile(self, nc: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The tile as ``[B, H, nc, D/k]`` (values of ``nc`` tokens, the codes' layout) and as the bmm operand
        ``[B*H, nc, D/k]``."""
        v = self._views.get(("v", nc))
        if v is None:
            p = self.d // self.k
            tile = self.tile[: self.b * self.h * nc * p].view(self.b, self.h, nc, p)
            v = self._views[("v", nc)] = (tile, tile.view(-1, nc, p))
        return v

    def next_part(self, tile: torch.Tensor) -> None:
        """Turn the fp32 tile of ``x >> i b`` into ``x >> (i + 1) b`` in place (exact: powers of two, floor)."""
        tile.mul_(self.inv_base).floor_()

    def window(self, states: torch.Tensor) -> torch.Tensor:
        """``states [B, H, w, D]`` converted to fp32 in the tile's memory (valid until the tile is reused)."""
        return self.tile[: states.numel()].view(states.shape).copy_(states)


def _key_scores(qg: torch.Tensor, seg: QuantSegmentView, scratch: _Scratch, out: torch.Tensor) -> None:
    """Scores of fp32 rows ``qg [B, H, M, D]`` (already scaled) against a block's packed keys, written into
    ``out [B, H, M, n]`` (``n = NG * G`` tokens), computed ``scratch.chunk`` tokens at a time.

    A byte ``x = c_0 + 2^b c_1 + ...`` holds ``k = 8 / b`` codes, so ``sum_i a_i c_i = sum_i (a_i - 2^b a_{i-1})
    (x >> i b)``: the query side absorbs the unpacking; the codes are converted to fp32 once per chunk and each
    further part is ``floor(previous / 2^b)`` in place, so there are no masks, no interleaving, and one fp32 tile.
    The zero term ``q . z_j`` is added while the group-major scores are written back token-major.
    """
    b, h, m, d = qg.shape
    group, nbits, k = scratch.group, scratch.nbits, scratch.k
    ng = seg.tokens // group
    p, bh = d // k, b * h
    # fold the per-channel scale into the query, one row set per key group: coef[j,b,h,m,i,:] = (q * s_j) of part i
    # (the bf16 scale is read as is: a mixed-dtype product is computed and stored in fp32)
    scale = seg.k_scale.permute(2, 0, 1, 3).view(ng, b, h, 1, p, k).transpose(-1, -2)  # [NG,B,H,1,k,P]
    coef = torch.mul(scale, scratch.q_parts[None], out=qg.new_empty(ng, b, h, m, k, p))  # [NG,B,H,M,k,P]
    for i in range(k - 1, 0, -1):  # descending: part i - 1 is still unmodified when part i reads it
        coef[..., i, :].sub_(coef[..., i - 1, :], alpha=1 << nbits)
    hp = scratch.heads_per_item
    coef = coef.view(ng * bh // hp, hp * m, d)
    bias = torch.matmul(qg, seg.k_zero.to(F32).transpose(-1, -2))  # [B,H,M,NG]
    rows = qg.new_empty(ng * bh // hp, hp * m, hp * group)  # group-major scores of head pairs
    codes = seg.k_codes.view(b, h, ng, group, p).permute(2, 0, 1, 3, 4)  # [NG,B,H,G,P] uint8
    step = _chunk_step(seg.tokens, scratch.chunk, group) // group  # groups per chunk
    for j0 in range(0, ng, step):
        j1 = min(ng, j0 + step)
        r0, r1 = j0 * bh // hp, j1 * bh // hp
        tile, tile_t = scratch.key_tile(j1 - j0)
        tile.copy_(codes[j0:j1])  # uint8 -> fp32, group-major
        acc, c = rows[r0:r1], coef[r0:r1]
        torch.bmm(c[..., :p], tile_t, out=acc)
        for i in range(1, k):
            scratch.next_part(tile)
            acc.baddbmm_(c[..., i * p : (i + 1) * p], tile_t)
    # [NG*BH/hp, hp*M, hp*G] -> keep each head's own block -> [BH/hp, hp, M, NG, G] token-major, plus the zero term
    pairs = rows.view(ng, bh // hp, hp, m, hp, group)
    grouped = torch.diagonal(pairs, dim1=2, dim2=4).permute(1, 4, 2, 0, 3)
    bias = bias.view(bh // hp, hp, m, ng, 1)
    torch.add(grouped, bias, out=out.view(bh // hp, hp, m, ng, group))


class _ValueSums:
    """Accumulates ``p @ V`` over packed value blocks: per-part sums ``[k, B*H, KG*M, D/k]`` and the zero term.

    With per-token groups of ``G`` channels, ``sum_t p_t V_t[c] = sum_t (p_t u_t,g) code_t[c] + sum_t p_t w_t,g``
    (``g``: the group of channel ``c``); the shifted parts ``x >> i b`` are summed separately and turned back into
    code sums once, at the end. The tile keeps the codes' own layout ``[B, H, n, D/k]`` (a plain copy) and each
    part is one matmul of the rows of every value group, ``p * u_g``, stacked (``KG * M`` rows) against all the
    bytes; only the blocks where row group and byte group agree are used. A matmul with few rows costs what
    reading the tile costs, so the unused blocks are nearly free, and 2-bit parts (8 bytes a group at G = 32)
    stay one wide matmul each instead of ``KG`` narrow ones.
    """

    def __init__(self, scratch: _Scratch, device: torch.device):
        b, h, m, d = scratch.b, scratch.h, scratch.m, scratch.d
        self.scratch = scratch
        self.kg = d // scratch.group
        self.parts = torch.zeros(scratch.k, b * h, self.kg * m, d // scratch.k, device=device)
        self.part_views = list(self.parts)
        self.zero = torch.zeros(b * h, m, self.kg, device=device)

    def add(self, pr: torch.Tensor, seg: QuantSegmentView) -> None:
        """Add ``pr [B, H, M, n]`` (probabilities of the block's ``n`` tokens) times the block's values."""
        sc = self.scratch
        b, h, m = sc.b, sc.h, sc.m
        n, kg, k = seg.tokens, self.kg, sc.k
        self.zero.baddbmm_(pr.reshape(b * h, m, n), seg.v_zero.to(F32).reshape(b * h, n, kg))
        # the per-token scale folds into p: pw[b,h,g,m,t] = p[b,h,m,t] * u[b,h,g,t] (bf16 scale, fp32 product)
        u = seg.v_scale.transpose(-1, -2)[:, :, :, None, :]  # [B,H,KG,1,n]
        pw = torch.mul(pr[:, :, None], u, out=pr.new_empty(b, h, kg, m, n)).view(b * h, kg * m, n)
        step = _chunk_step(n, sc.chunk, sc.group)
        for t0 in range(0, n, step):
            t1 = min(n, t0 + step)
            tile, tile_b = sc.value_tile(t1 - t0)
            tile.copy_(seg.v_codes[:, :, t0:t1])  # uint8 -> fp32, [B,H,nc,D/k]
            pc = pw[..., t0:t1]
            self.part_views[0].baddbmm_(pc, tile_b)
            for i in range(1, k):
                sc.next_part(tile)
                self.part_views[i].baddbmm_(pc, tile_b)

    def result(self) -> torch.Tensor:
        """``[B, H, M, D]`` fp32."""
        sc = self.scratch
        b, h, m, d, k = sc.b, sc.h, sc.m, sc.d, sc.k
        gp = sc.group // k  # bytes per value group
        # parts[i, (b,h), (g,m), (g',j)]: keep g == g'; a[b,h,m,g,j,i] is the sum of part i of channel g*G + j*k + i
        full = self.parts.view(k, b, h, self.kg, m, self.kg, gp)
        a = torch.diagonal(full, dim1=3, dim2=5).permute(1, 2, 3, 5, 4, 0)  # [B,H,M,KG,G/k,k]
        out = torch.add(a, self.zero.view(b, h, m, self.kg, 1, 1), out=a.new_empty(a.shape))
        if k > 1:  # sums of (x >> i b) -> sums of code i: part i minus 2^b part i + 1
            out[..., :-1].sub_(a[..., 1:], alpha=1 << sc.nbits)
        return out.view(b, h, m, d)


def _quantized_block(
    state: _OnlineSoftmax,
    qg: torch.Tensor,
    seg: QuantSegmentView,
    nbits: int,
    group: int,
    mask: torch.Tensor | None,
) -> None:
    """Accumulate one quantized block into ``state`` (online softmax). ``qg``: ``[B, H, M, D]`` fp32 rows, already
    multiplied by the softmax scale."""
    b, h, m, d = qg.shape
    n = seg.tokens
    scratch = _Scratch(qg, n, nbits, group)
    scores = torch.empty(b, h, m, n, device=qg.device)
    _key_scores(qg, seg, scratch, scores)
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    p = state.probs(scores)  # [B,H,M,n]
    values = _ValueSums(scratch, qg.device)
    values.add(p, seg)
    state.acc += values.result()


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
        backend: ``"torch"`` (the pure-torch path of this module), ``"cpu-kernel"`` (the compiled C kernel of
            :mod:`kvlab.attention.cpu_kernel`: CPU decode-sized calls, bf16/fp32 windows and metadata),
            ``"triton"`` (the kernel of :mod:`kvlab.attention.triton_kivi` for the quantized blocks; CUDA, or CPU
            under ``TRITON_INTERPRET=1``) or ``"auto"``: Triton on CUDA when it can run; on the CPU the C kernel
            for decode-sized calls when it builds (:func:`kvlab.attention.cpu_kernel.unavailable_reason` says why
            not), else torch.

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
    segments = _check_inputs(
        query, segments, key_window, value_window, nbits, group_size, scaling, attention_mask, window_offset
    )
    b, hq, q_len, d = query.shape
    hkv = key_window.shape[1]
    g = hq // hkv
    m = g * q_len
    if _use_cpu_kernel(query, segments, key_window, value_window, backend):
        valid = None if attention_mask is None else _valid_tokens(attention_mask)
        offset = key_window.shape[2] - q_len if window_offset is None else window_offset
        return cpu_kernel.decode_attention(
            query, segments, key_window, value_window, nbits, group_size, scaling, valid, offset
        )
    # [B, Hq, q, D] -> [B, Hkv, g*q, D]: query heads sharing a KV head become rows (GQA without repeat_kv); the
    # softmax scale is folded into the rows once
    qg = query.to(F32).reshape(b, hkv, m, d) * scaling
    use_triton = _use_triton(query, backend, nbits, group_size)
    out = _attend(
        qg,
        segments,
        key_window,
        value_window,
        nbits,
        group_size,
        attention_mask,
        window_offset,
        g,
        use_triton,
    )
    return out.reshape(b, hq, q_len, d).to(query.dtype)


def _attend(
    qg, segments, key_window, value_window, nbits, group_size, attention_mask, window_offset, g, use_triton
) -> torch.Tensor:
    """Scores of the ``[B, Hkv, g * q_len, D]`` scaled query rows against every block and the window: all at
    once (two-pass) for decode-sized problems, else the online softmax; returns ``[B, Hkv, g * q_len, D]`` fp32."""
    b, hkv, m, d = qg.shape
    q_len, w = m // g, key_window.shape[2]
    total = sum(seg.tokens for seg in segments) + w
    causal = None  # [m, w] bool, True = masked: the causal rule inside the window when no mask is given
    if attention_mask is None and q_len > 1:
        offset = w - q_len if window_offset is None else window_offset
        rows = torch.arange(q_len, device=qg.device).repeat(g)[:, None]  # query index of each row
        causal = torch.arange(w, device=qg.device)[None, :] > rows + offset
    if use_triton or m * total > TWO_PASS_MAX_SCORES:
        return _online(
            qg,
            segments,
            key_window,
            value_window,
            nbits,
            group_size,
            attention_mask,
            causal,
            g,
            q_len,
            use_triton,
        )
    chunk = chunk_tokens(total, nbits, group_size, b * hkv * d * nbits // 2)
    serial = chunk * b * hkv * d // (8 // nbits) < SERIAL_MAX_TILE
    with _intra_op_threads(1 if serial else None):
        return _two_pass(
            qg, segments, key_window, value_window, nbits, group_size, chunk, attention_mask, causal, g, q_len
        )


def _valid_tokens(attention_mask: torch.Tensor) -> torch.Tensor:
    """A checked ``[1|B, 1, q, T]`` bool or additive float mask as ``[1|B, q, T]`` bool (True = attend)."""
    m = attention_mask[:, 0]
    return m if m.dtype == torch.bool else m == 0


def _use_cpu_kernel(query, segments, key_window, value_window, backend: str) -> bool:
    """Whether the compiled CPU kernel (:mod:`kvlab.attention.cpu_kernel`) takes this call: ``backend="cpu-kernel"``
    (a ``RuntimeError`` naming the reason where it cannot), or ``"auto"`` for decode-sized CPU problems (at most
    ``cpu_kernel.MAX_ROWS`` query rows per KV head and ``TWO_PASS_MAX_SCORES`` scores) when it builds and loads."""
    if backend not in ("auto", "cpu-kernel") or (backend == "auto" and query.device.type != "cpu"):
        return False
    total = sum(seg.tokens for seg in segments) + key_window.shape[2]
    rows = query.shape[1] // key_window.shape[1] * query.shape[2]
    why = cpu_kernel.unsupported(query, segments, key_window, value_window)
    if why is None and rows * total > TWO_PASS_MAX_SCORES:
        why = f"{rows} rows x {total} keys is above the decode size ({TWO_PASS_MAX_SCORES} scores)"
    if why is None:
        why = cpu_kernel.unavailable_reason()
    if why is not None and backend == "cpu-kernel":
        raise RuntimeError(f"backend='cpu-kernel' cannot run this call: {why}")
    return why is None


def _use_triton(query: torch.Tensor, backend: str, nbits: int, group_size: int) -> bool:
    """Whether the quantized blocks go through the Triton kernel: ``backend="triton"`` (an error where it cannot
    run), or ``"auto"`` on CUDA where it can."""
    if not (backend == "triton" or (backend == "auto" and query.is_cuda)):
        return False
    from kvlab.attention.triton_kivi import triton_supported

    d = query.shape[-1]
    ok = triton_supported(query, d, nbits, group_size)
    if backend == "triton" and not ok:
        raise RuntimeError(
            f"the Triton KIVI kernel cannot run here (device {query.device}, head_dim {d}, "
            f"nbits {nbits}, group_size {group_size})"
        )
    return ok and (backend == "triton" or query.is_cuda)


def _online(
    qg, segments, key_window, value_window, nbits, group_size, attention_mask, causal, g, q_len, use_triton
) -> torch.Tensor:
    """Online softmax (running max, sum, rescaled accumulator) over the quantized blocks chunk by chunk, then
    the window; ``qg`` ``[B, Hkv, m, D]`` scaled rows -> ``[B, Hkv, m, D]`` fp32 (FlashAttention section 3.1)."""
    b, hkv, m, d = qg.shape
    quantized = sum(seg.tokens for seg in segments)
    total = quantized + key_window.shape[2]
    w_scores = torch.matmul(qg, key_window.to(F32).transpose(-1, -2))  # [B, Hkv, m, w]
    if attention_mask is not None:
        w_scores.masked_fill_(~_mask_rows(attention_mask, g, q_len, quantized, total), NEG_INF)
    elif causal is not None:
        w_scores.masked_fill_(causal, NEG_INF)
    state = _OnlineSoftmax(b, hkv, m, d, qg.device)
    start = 0
    for seg in segments:
        mask = _mask_rows(attention_mask, g, q_len, start, start + seg.tokens)
        if use_triton and (mask is None or q_len == 1):
            from kvlab.attention.triton_kivi import kivi_block_partials

            valid = None if mask is None else mask[:, 0, 0, :]  # [B, n]: one row decides for a decode step
            state.merge(*kivi_block_partials(qg, seg, nbits, group_size, 1.0, valid))
        else:
            off = start
            for c in _chunks(seg, group_size, chunk_tokens(total, nbits, group_size)):
                cmask = _mask_rows(attention_mask, g, q_len, off, off + c.tokens)
                _quantized_block(state, qg, c, nbits, group_size, cmask)
                off += c.tokens
        start += seg.tokens
    p = state.probs(w_scores)
    state.acc += torch.matmul(p, value_window.to(F32))
    return state.result()  # [B, Hkv, m, D]


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


def _check_inputs(
    query, segments, key_window, value_window, nbits, group_size, scaling, attention_mask, window_offset
) -> list[QuantSegmentView]:
    """Validate the arguments of :func:`kivi_attention` (see its Raises); return the segments as a list."""
    _check_tensors(query, key_window, value_window, nbits, group_size, scaling)
    segments, quantized = _check_segments(query, segments, key_window, nbits, group_size)
    _check_mask(query, key_window, attention_mask, window_offset, quantized + key_window.shape[2])
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


def _check_mask(query, key_window, attention_mask, window_offset, total: int) -> None:
    """The mask covers ``[batch, 1, q_len, total]`` keys (or, without one, the queries end the window)."""
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


def _two_pass(
    qg, segments, key_window, value_window, nbits, group_size, chunk, attention_mask, causal, g, q_len
):
    """Decode-sized problems: every score at once (``[B, Hkv, m, T]`` fp32, small), one softmax, then ``p @ V``
    block by block and chunk by chunk. Returns ``[B, Hkv, m, D]`` fp32."""
    b, hkv, m, d = qg.shape
    quantized = sum(seg.tokens for seg in segments)
    w = key_window.shape[-2]
    total = quantized + w
    # the tile holds at most one chunk of the largest block (a tile sized for an unused chunk costs page faults)
    longest = max((_chunk_step(seg.tokens, chunk, group_size) for seg in segments), default=group_size)
    scratch = _Scratch(qg, longest, nbits, group_size, window=w)
    scores = torch.empty(b, hkv, m, total, device=qg.device)
    start = 0
    for seg in segments:
        _key_scores(qg, seg, scratch, scores[..., start : start + seg.tokens])
        start += seg.tokens
    kw = scratch.window(key_window)
    bh = b * hkv  # 3-D views: bmm writes the window's scores in place (a 4-D matmul would go through a copy)
    torch.bmm(
        qg.view(bh, m, d), kw.view(bh, w, d).transpose(1, 2), out=scores.view(bh, m, total)[..., quantized:]
    )
    if attention_mask is not None:
        scores.masked_fill_(~_mask_rows(attention_mask, g, q_len, 0, total), NEG_INF)
    elif causal is not None:
        scores[..., quantized:].masked_fill_(causal, NEG_INF)
    p = torch.softmax(scores, dim=-1)
    if attention_mask is not None:
        p.nan_to_num_(0.0)  # rows with every key masked (padding) come out as 0, not NaN
    values = _ValueSums(scratch, qg.device)
    start = 0
    for seg in segments:
        values.add(p[..., start : start + seg.tokens], seg)
        start += seg.tokens
    out = values.result()
    out.view(bh, m, d).baddbmm_(
        p.view(bh, m, total)[..., quantized:], scratch.window(value_window).view(bh, w, d)
    )
    return out
