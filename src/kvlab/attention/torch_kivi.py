"""The pure-torch path of fused KIVI attention: scores and ``p @ V`` computed from the packed codes, never the float K/V.

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

:func:`attend` is the entry (called by :func:`kvlab.attention.quantized.kivi_attention` after its checks and
backend choice); in the online softmax the quantized blocks can go to the Triton kernel
(:mod:`kvlab.attention.triton_kivi`) instead of the torch matmuls.

Sources: KIVI (arXiv:2402.02750) section 3.3 (fused dequantization into the matmul), FlashAttention/FlashDecoding online
softmax (arXiv:2205.14135 section 3.1).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from kvlab.quant.kivi import QuantSegmentView

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


def attend(
    qg, segments, key_window, value_window, nbits, group_size, attention_mask, window_offset, g, use_triton
) -> torch.Tensor:
    """Scores of the ``[B, Hkv, g * q_len, D]`` scaled query rows ``qg`` (fp32, query heads sharing a KV head
    stacked as rows, already multiplied by the softmax scale) against every block and the window: all at once
    (two-pass) for decode-sized problems, else the online softmax (FlashAttention, arXiv:2205.14135 section 3.1);
    returns ``[B, Hkv, g * q_len, D]`` fp32.

    The arguments are those of :func:`kvlab.attention.quantized.kivi_attention`, already checked there (this
    function raises nothing of its own); ``g``: query heads per KV head; ``use_triton``: the online path's
    quantized blocks go to :func:`kvlab.attention.triton_kivi.kivi_partials`."""
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
    on_triton, valids = [], []  # blocks the Triton kernel takes: one launch each, one merge for all
    start = 0
    for seg in segments:
        mask = _mask_rows(attention_mask, g, q_len, start, start + seg.tokens)
        if use_triton and (mask is None or q_len == 1):
            on_triton.append(seg)
            valids.append(None if mask is None else mask[:, 0, 0, :])  # [B, n]: one row decides a decode step
        else:
            off = start
            for c in _chunks(seg, group_size, chunk_tokens(total, nbits, group_size)):
                cmask = _mask_rows(attention_mask, g, q_len, off, off + c.tokens)
                _quantized_block(state, qg, c, nbits, group_size, cmask)
                off += c.tokens
        start += seg.tokens
    if on_triton:
        from kvlab.attention.triton_kivi import kivi_partials

        state.merge(*kivi_partials(qg, on_triton, nbits, group_size, 1.0, valids))
    p = state.probs(w_scores)
    state.acc += torch.matmul(p, value_window.to(F32))
    return state.result()  # [B, Hkv, m, D]


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
