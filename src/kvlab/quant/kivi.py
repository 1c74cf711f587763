"""The KIVI state of one attention layer: keys per-channel, values per-token, a full-precision residual window.

KIVI (Liu et al., arXiv:2402.02750) section 3.2-3.3 and Algorithm 1:

* **keys per-channel** — a group is ``G`` consecutive tokens of one channel (outlier channels get their own range);
* **values per-token** — a group is ``G`` consecutive channels of one token;
* the **residual window** keeps the newest tokens in the model dtype. With ``T`` tokens in the residual after an
  append, the oldest ``((T - R) // G) * G`` tokens are flushed when ``T > R`` (``R`` = ``residual_length``,
  a multiple of ``G``), so the residual holds between ``R`` and ``R + G - 1`` tokens once it has filled.
  Prefill follows the same rule: its newest ``R`` (up to ``R + G - 1``) tokens stay in full precision.

Flushed chunks are always G-aligned from token 0, so streaming tokens one at a time produces exactly the same
codes, scales and zeros as one call with all of them. Quantized data is written once into storage blocks (a block
holds the chunk that opens it plus room for a quarter of the history, at most ``block_tokens``) and is never
rewritten or moved, so a flush costs O(new tokens), not O(history). The residual window lives in one storage of
up to ``R + G`` tokens (grown geometrically while the window fills) that decode steps write in place.

:meth:`KIVIState.crop` keeps a prefix of the tokens (speculative-decoding rollback): exact inside the residual
window; a cut inside the quantized prefix drops whole groups and moves the kept part of the cut group, dequantized,
back into the residual window (those tokens are quantized a second time when they are flushed again).

Keys and values may use different widths (``key_bits``, ``value_bits``: keys are the more sensitive half, as
llama.cpp's ``-ctk q8_0 -ctv q4_0`` assumes). Byte ledger per layer, per batch row, per KV head, with ``Q`` quantized
tokens out of ``T`` (``D`` head_dim, ``b_k``/``b_v`` key/value bits, ``m`` metadata bytes, ``p`` cache dtype bytes)::

    Q*D*(b_k + b_v)/8  +  2*m*Q*D/G (keys: scale+zero per G tokens per channel)
               +  2*m*Q*D/G (values: scale+zero per G channels per token)  +  2*(T-Q)*D*p (residual)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.quant.codec import (
    SUPPORTED_NBITS,
    QuantizedTensor,
    check_group_size,
    check_nbits,
    dequantize,
    metadata_dtypes,
    quantize_groups,
)
from kvlab.runtime.checks import check_int

DEFAULT_BLOCK_TOKENS = 4096


@dataclass(frozen=True)
class KIVIConfig:
    """Settings of a KIVI cache.

    Attributes:
        nbits: bits per code, 2, 4 or 8 (keys and values).
        key_bits, value_bits: bits per key / value code, 2, 4 or 8; default ``nbits``. When they differ, ``nbits``
            is set to ``None`` (no single width).
        group_size: ``G``, tokens per key group and channels per value group.
        residual_length: ``R``, newest tokens kept in full precision; a multiple of ``G`` (0 allowed).
        block_tokens: quantized storage grows in blocks of this many tokens (a multiple of ``G``); default: the
            smallest multiple of ``G`` that is at least 4096.

    Raises:
        ValueError: unsupported ``nbits``/``key_bits``/``value_bits`` (the message names which), non-positive
            ``group_size``, ``residual_length`` negative or not a
            multiple of ``group_size``, ``block_tokens`` not a positive multiple of ``group_size``.

    Source: KIVI (arXiv:2402.02750) section 3.2-3.3 (keys per-channel and values per-token in groups of ``G``, the
    newest ``R`` tokens kept in full precision) and section 4 for the defaults ``G = 32``, ``R = 128``
    (:data:`kvlab.cache_names.KIVI_DEFAULTS`); separate ``key_bits`` / ``value_bits`` as llama.cpp's
    ``-ctk`` / ``-ctv`` (see the module docstring).
    """

    nbits: int | None = 4
    group_size: int = KIVI_DEFAULTS.group_size
    residual_length: int = KIVI_DEFAULTS.residual_length
    block_tokens: int | None = None
    key_bits: int | None = None  # bits per key code; None = nbits
    value_bits: int | None = None  # bits per value code; None = nbits

    def __post_init__(self) -> None:
        if self.nbits is not None:  # checked even when key_bits and value_bits are both given
            check_nbits(self.nbits)
        for name in ("key_bits", "value_bits"):
            bits = getattr(self, name)
            if bits is None:
                if self.nbits is None:
                    raise ValueError(f"`{name}` is needed when `nbits` is None")
                bits = check_nbits(self.nbits)
            elif not isinstance(bits, int) or isinstance(bits, bool) or bits not in SUPPORTED_NBITS:
                raise ValueError(f"`{name}` must be one of {list(SUPPORTED_NBITS)}, got {bits!r}")
            object.__setattr__(self, name, bits)
        object.__setattr__(self, "nbits", self.key_bits if self.key_bits == self.value_bits else None)
        check_group_size(self.group_size)
        r, g = self.residual_length, self.group_size
        check_int("residual_length", r, 0)
        if r % g:
            raise ValueError(f"`residual_length` ({r}) must be a multiple of `group_size` ({g})")
        if self.block_tokens is None:
            object.__setattr__(self, "block_tokens", -(-DEFAULT_BLOCK_TOKENS // g) * g)
        b = self.block_tokens
        if isinstance(b, bool) or not isinstance(b, int) or b <= 0 or b % g:
            raise ValueError(f"`block_tokens` must be a positive multiple of `group_size` ({g}), got {b!r}")

    def quantized_tokens(self, tokens: int) -> int:
        """``Q(T)``: tokens held quantized when ``T`` tokens are stored (``((T - R) // G) * G`` if ``T > R``)."""
        if tokens <= self.residual_length:
            return 0
        return (tokens - self.residual_length) // self.group_size * self.group_size

    def check_head_dim(self, head_dim: int) -> None:
        """Raise ``ValueError`` if ``head_dim`` cannot be grouped by ``group_size`` or packed by ``nbits``."""
        if head_dim < 1:
            raise ValueError(f"head_dim must be >= 1, got {head_dim}")
        if head_dim % self.group_size:
            raise ValueError(
                f"`group_size` ({self.group_size}) must divide head_dim ({head_dim}): values are quantized "
                f"per-token in groups of `group_size` channels"
            )
        for name, bits in (("key_bits", self.key_bits), ("value_bits", self.value_bits)):
            if head_dim * bits % 8:
                raise ValueError(f"head_dim ({head_dim}) times {name} ({bits}) must be a multiple of 8")


@dataclass
class QuantBlock:
    """One storage block of ``capacity`` quantized tokens (shapes for ``[batch, kv_heads, tokens, head_dim]``)."""

    k_codes: torch.Tensor  # [B, H, cap, D*b_k/8] uint8, keys packed along head_dim
    k_scale: torch.Tensor  # [B, H, cap/G, D]  per-channel scale (one per G tokens)
    k_zero: torch.Tensor  # [B, H, cap/G, D]  per-channel group minimum
    v_codes: torch.Tensor  # [B, H, cap, D*b_v/8] uint8, values packed along head_dim
    v_scale: torch.Tensor  # [B, H, cap, D/G]  per-token scale (one per G channels)
    v_zero: torch.Tensor  # [B, H, cap, D/G]  per-token group minimum
    filled: int = 0  # tokens written so far (a multiple of G)
    view: QuantSegmentView | None = field(default=None, repr=False)  # the filled part, rebuilt when it grows

    @property
    def capacity(self) -> int:
        return self.k_codes.shape[-2]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.k_codes, self.k_scale, self.k_zero, self.v_codes, self.v_scale, self.v_zero)


@dataclass
class QuantSegmentView:
    """Read-only view of the filled part of a block: ``tokens`` quantized tokens (see :class:`QuantBlock`)."""

    k_codes: torch.Tensor
    k_scale: torch.Tensor
    k_zero: torch.Tensor
    v_codes: torch.Tensor
    v_scale: torch.Tensor
    v_zero: torch.Tensor
    tokens: int


@dataclass
class KIVIState:
    """Quantized blocks + full-precision residual window of one layer.

    Use :meth:`append` with ``[batch, kv_heads, tokens, head_dim]`` keys and values; it flushes the oldest
    G-aligned chunks beyond the residual window (see the module docstring for the rule).

    Raises (from :meth:`append`):
        ValueError: K/V shape mismatch, non-4-D input, a batch/head/head_dim/dtype/device change after the first
            append, a head_dim that ``group_size`` does not divide, or inf/NaN in the new tokens (nothing is
            stored then).
    """

    config: KIVIConfig
    blocks: list[QuantBlock] = field(default_factory=list)
    quantized_tokens: int = 0  # Q: tokens held in blocks
    flushes: int = 0  # number of append calls that flushed at least one chunk
    restored_tokens: int = 0  # tokens crops restored from their codes into the residual window (cumulative)
    # residual window storage: [B, H, <= R + G, D] in the model dtype, written in place by single-token appends
    _kbuf: torch.Tensor | None = field(default=None, repr=False)
    _vbuf: torch.Tensor | None = field(default=None, repr=False)
    _start: int = (
        0  # first residual token in the buffers (the tokens before it were flushed by the last append)
    )
    _count: int = 0  # residual tokens

    @property
    def key_residual(self) -> torch.Tensor | None:
        """Full-precision keys of the residual window, ``[B, H, r, D]`` (a view, valid until the next append)."""
        return None if self._kbuf is None else self._kbuf[:, :, self._start : self._start + self._count]

    @property
    def value_residual(self) -> torch.Tensor | None:
        """Full-precision values of the residual window, ``[B, H, r, D]`` (a view, valid until the next append)."""
        return None if self._vbuf is None else self._vbuf[:, :, self._start : self._start + self._count]

    @property
    def residual_tokens(self) -> int:
        return self._count

    @property
    def total_tokens(self) -> int:
        return self.quantized_tokens + self.residual_tokens

    def _check(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
            raise TypeError(
                f"keys and values must be torch.Tensor, got {type(keys).__name__} and {type(values).__name__}"
            )
        if keys.ndim != 4 or values.ndim != 4:
            raise ValueError(
                f"keys and values must be 4-d [batch, kv_heads, tokens, head_dim] tensors, got {keys.ndim}-d "
                f"{tuple(keys.shape)} and {values.ndim}-d {tuple(values.shape)}"
            )
        if keys.shape != values.shape:
            raise ValueError(
                f"keys and values must share a [batch, kv_heads, tokens, head_dim] shape, got "
                f"{tuple(keys.shape)} and {tuple(values.shape)}"
            )
        if keys.dtype != values.dtype:
            raise ValueError(f"keys ({keys.dtype}) and values ({values.dtype}) must share a dtype")
        metadata_dtypes(keys.dtype)  # raises for non-floating dtypes
        if self.key_residual is None:
            self.config.check_head_dim(keys.shape[-1])
        else:
            ref = self.key_residual
            if keys.shape[:2] != ref.shape[:2] or keys.shape[-1] != ref.shape[-1] or keys.dtype != ref.dtype:
                raise ValueError(
                    f"appended states {tuple(keys.shape)} {keys.dtype} do not match the cache "
                    f"[{ref.shape[0]}, {ref.shape[1]}, *, {ref.shape[-1]}] {ref.dtype} (a cache holds one batch "
                    f"of one model: call cache.reset() before reusing it for another)"
                )
            if keys.device != ref.device or values.device != ref.device:
                raise ValueError(
                    f"appended states on {keys.device}/{values.device} do not match the cache on {ref.device}"
                )
        if keys.device != values.device:
            raise ValueError(f"keys ({keys.device}) and values ({values.device}) must share a device")
        # refuse inf/NaN when it arrives: in the residual window it would poison every later attention step and
        # make the flush that reaches it fail. The fp32 sum of the new tokens is finite unless one of them is not (or
        # the sum overflows: then the exact search below finds nothing and nothing is refused): two reductions and
        # one host read per append (an isfinite pass, two all() and an and cost twice as much on a decode step).
        if keys.numel() and not math.isfinite(
            float(keys.sum(dtype=torch.float32) + values.sum(dtype=torch.float32))
        ):
            for name, x in (("keys", keys), ("values", values)):
                bad = (~torch.isfinite(x)).nonzero()
                if len(bad):
                    at = bad[0].tolist()
                    raise ValueError(
                        f"{name} hold {x[tuple(at)].item()} at [{', '.join(map(str, at))}] "
                        f"([batch, kv_head, token of this append, channel]): KIVI cannot store inf or NaN"
                    )

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``keys``/``values`` ``[B, H, t, D]`` and flush what overflows the residual window.

        Returns:
            ``(key_window, value_window)``: the full-precision residual window *before* this call's flush, with the
            new tokens at its end, ``[B, H, r + t, D]``. Attention for the current step reads the quantized prefix
            as it was before the call plus this window, so tokens flushed by this call are still seen exactly once.
            When the window fits the residual storage (decode steps) it is a view of that storage, valid until the
            next ``append``: no copy of the window is made per step.
        """
        self._check(keys, values)
        self._compact()
        t = keys.shape[-2]
        r = self._count
        in_place = self._kbuf is not None and r + t <= self._kbuf.shape[-2]
        if in_place:
            self._kbuf[:, :, r : r + t] = keys
            self._vbuf[:, :, r : r + t] = values
            key_window, value_window = self._kbuf[:, :, : r + t], self._vbuf[:, :, : r + t]
        elif r == 0:
            key_window, value_window = keys, values
        else:  # more new tokens than the storage holds (prefill, chunked prefill): one temporary window
            key_window = torch.cat((self.key_residual, keys), dim=-2)
            value_window = torch.cat((self.value_residual, values), dim=-2)
        n = r + t
        cfg = self.config
        flush = (n - cfg.residual_length) // cfg.group_size * cfg.group_size if n > cfg.residual_length else 0
        if flush:
            self._write(key_window[..., :flush, :], value_window[..., :flush, :])
            self.flushes += 1
        if in_place:  # the flushed tokens stay in front until the next append moves the rest down
            self._start, self._count = flush, n - flush
        else:
            rest = n - flush
            if self._kbuf is None or self._kbuf.shape[-2] < rest:
                # grow geometrically up to R + G (a short prompt under a huge R does not reserve R tokens up front)
                b, h, _, d = keys.shape
                cap = max(rest, min(cfg.residual_length + cfg.group_size, max(2 * rest, cfg.group_size)))
                self._kbuf = keys.new_zeros(b, h, cap, d)
                self._vbuf = values.new_zeros(b, h, cap, d)
            self._kbuf[:, :, :rest] = key_window[..., flush:, :]
            self._vbuf[:, :, :rest] = value_window[..., flush:, :]
            self._start, self._count = 0, rest
        return key_window, value_window

    def _compact(self) -> None:
        """Move the residual to the front of its storage (after a flush), in pieces that never overlap."""
        start, count = self._start, self._count
        if not start:
            return
        for s in range(0, count, start):
            e = min(count, s + start)
            self._kbuf[:, :, s:e] = self._kbuf[:, :, start + s : start + e]
            self._vbuf[:, :, s:e] = self._vbuf[:, :, start + s : start + e]
        self._start = 0

    def _new_block(self, like: torch.Tensor, pending: int) -> QuantBlock:
        # A block fits the chunk being written (a prefill lands in one block) plus a quarter of the history it
        # completes, capped at block_tokens: the flushes that follow land in the same block, so the fused attention
        # visits few blocks, while at most ~25 % of the quantized bytes are reserved ahead (reported as
        # allocated_unused). Blocks are never moved or rewritten.
        cfg = self.config
        b, h, _, d = like.shape
        g = cfg.group_size
        quarter = -(-((self.quantized_tokens + pending) // 4) // g) * g
        cap = min(cfg.block_tokens, max(g, pending + quarter))
        scale_dtype, zero_dtype = metadata_dtypes(like.dtype)
        k_packed, v_packed = d * cfg.key_bits // 8, d * cfg.value_bits // 8
        dev = like.device
        return QuantBlock(
            k_codes=torch.empty(b, h, cap, k_packed, dtype=torch.uint8, device=dev),
            k_scale=torch.empty(b, h, cap // g, d, dtype=scale_dtype, device=dev),
            k_zero=torch.empty(b, h, cap // g, d, dtype=zero_dtype, device=dev),
            v_codes=torch.empty(b, h, cap, v_packed, dtype=torch.uint8, device=dev),
            v_scale=torch.empty(b, h, cap, d // g, dtype=scale_dtype, device=dev),
            v_zero=torch.empty(b, h, cap, d // g, dtype=zero_dtype, device=dev),
        )

    def _write(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Quantize a G-aligned chunk ``[B, H, n, D]`` and write it into blocks (no existing data is touched)."""
        cfg = self.config
        g = cfg.group_size
        n = keys.shape[-2]
        assert n % g == 0 and self.quantized_tokens % g == 0
        qk = quantize_groups(keys, cfg.key_bits, g, axis=-2)  # keys per-channel: groups of G tokens
        qv = quantize_groups(values, cfg.value_bits, g, axis=-1)  # values per-token: groups of G channels
        done = 0
        while done < n:
            if not self.blocks or self.blocks[-1].filled == self.blocks[-1].capacity:
                self.blocks.append(self._new_block(keys, n - done))
            blk = self.blocks[-1]
            take = min(n - done, blk.capacity - blk.filled)
            s, e = blk.filled, blk.filled + take
            blk.k_codes[:, :, s:e] = qk.codes[:, :, done : done + take]
            blk.k_scale[:, :, s // g : e // g] = qk.scale[:, :, done // g : (done + take) // g]
            blk.k_zero[:, :, s // g : e // g] = qk.zero[:, :, done // g : (done + take) // g]
            blk.v_codes[:, :, s:e] = qv.codes[:, :, done : done + take]
            blk.v_scale[:, :, s:e] = qv.scale[:, :, done : done + take]
            blk.v_zero[:, :, s:e] = qv.zero[:, :, done : done + take]
            blk.filled = e
            done += take
        self.quantized_tokens += n

    def segments(self) -> Iterator[QuantSegmentView]:
        """Views of the filled part of every block, oldest first."""
        g = self.config.group_size
        for blk in self.blocks:
            f = blk.filled
            if f == 0:
                continue
            if blk.view is None or blk.view.tokens != f:
                blk.view = QuantSegmentView(
                    k_codes=blk.k_codes[:, :, :f],
                    k_scale=blk.k_scale[:, :, : f // g],
                    k_zero=blk.k_zero[:, :, : f // g],
                    v_codes=blk.v_codes[:, :, :f],
                    v_scale=blk.v_scale[:, :, :f],
                    v_zero=blk.v_zero[:, :, :f],
                    tokens=f,
                )
            yield blk.view

    def _dequantize_view(
        self, seg: QuantSegmentView, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Float copy of one segment view: ``([B, H, n, D], [B, H, n, D])`` in ``dtype`` (elementwise, so a slice of
        a segment dequantizes to the same bits as the same tokens of the whole segment)."""
        cfg = self.config
        b, h = seg.k_codes.shape[:2]
        shape = (b, h, seg.tokens, self.key_residual.shape[-1])
        src = self.key_residual.dtype
        g = cfg.group_size
        keys = QuantizedTensor(seg.k_codes, seg.k_scale, seg.k_zero, cfg.key_bits, g, 2, shape, src)
        values = QuantizedTensor(seg.v_codes, seg.v_scale, seg.v_zero, cfg.value_bits, g, 3, shape, src)
        return dequantize(keys, dtype), dequantize(values, dtype)

    def dequantize_prefix(self, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Float copy of the quantized prefix: ``([B, H, Q, D], [B, H, Q, D])``, or ``None`` when ``Q == 0``."""
        if self.quantized_tokens == 0:
            return None
        dtype = dtype or self.key_residual.dtype
        parts = [self._dequantize_view(seg, dtype) for seg in self.segments()]
        if len(parts) == 1:
            return parts[0]
        return torch.cat([k for k, _ in parts], dim=-2), torch.cat([v for _, v in parts], dim=-2)

    def _group_view(self, start: int) -> QuantSegmentView:
        """The quantized group of tokens ``[start, start + G)`` (``start`` a multiple of G below Q) as a view."""
        g = self.config.group_size
        assert start % g == 0 and 0 <= start < self.quantized_tokens
        offset = 0
        for blk in self.blocks:  # groups never straddle blocks: capacities and fills are multiples of G
            if start < offset + blk.filled:
                s = start - offset
                return QuantSegmentView(
                    k_codes=blk.k_codes[:, :, s : s + g],
                    k_scale=blk.k_scale[:, :, s // g : s // g + 1],
                    k_zero=blk.k_zero[:, :, s // g : s // g + 1],
                    v_codes=blk.v_codes[:, :, s : s + g],
                    v_scale=blk.v_scale[:, :, s : s + g],
                    v_zero=blk.v_zero[:, :, s : s + g],
                    tokens=g,
                )
            offset += blk.filled
        raise AssertionError(f"group at {start} not found in {self.quantized_tokens} quantized tokens")

    def crop(self, tokens: int) -> None:
        """Keep the first ``tokens`` stored tokens and drop the rest (speculative-decoding rollback, prefix reuse).

        * ``tokens >= Q`` (the cut falls in the residual window): the window is shortened; exact, nothing else moves.
        * ``tokens < Q`` (the cut falls in the quantized prefix): the residual window and every quantized group past
          the cut are dropped; whole groups before the cut keep their codes, scales and zeros untouched; the kept
          ``tokens % G`` tokens of the cut group are restored into the residual window as their **dequantized**
          values (a key group's scale and zero span all G tokens, so the group cannot stay quantized with fewer).
          Nothing is re-quantized by the crop, so the keys/values attention reads afterwards equal, bit for bit,
          the first ``tokens`` of what it read before (:meth:`dequantize_prefix` followed by the window).

        Precision consequence: the restored tokens are the dequantized values, not the originals. They stay in the
        residual window and are quantized a second time when a later append flushes them (with the new tokens of
        their group), so a crop into the quantized prefix breaks "each token quantized exactly once" for at most
        ``G - 1`` tokens per crop; :attr:`restored_tokens` counts them. Block capacity freed by the cut stays with
        the last kept block (``allocated_unused``) and later flushes write into it.

        Args:
            tokens: tokens to keep, in ``[0, total_tokens]``.

        Raises:
            TypeError: ``tokens`` not an int. ValueError: ``tokens`` outside ``[0, total_tokens]`` (nothing changes).

        Source: transformers ``DynamicLayer.crop`` (keep a prefix of the sequence axis); KIVI (arXiv:2402.02750) section 3.2
        for the group layout that decides what survives a cut.
        """
        if isinstance(tokens, bool) or not isinstance(tokens, int):
            raise TypeError(f"`tokens` to keep must be an int, got {tokens!r}")
        total = self.total_tokens
        if not 0 <= tokens <= total:
            raise ValueError(f"`tokens` to keep must be in [0, {total}] (tokens stored), got {tokens}")
        q = self.quantized_tokens
        if tokens >= q:  # inside the residual window: exact
            self._count = tokens - q
            return
        g = self.config.group_size
        keep_q = tokens // g * g  # whole groups kept
        part = tokens - keep_q  # kept tokens of the cut group
        restored = None
        if part:
            # [B, H, G, D] -> first `part` tokens, in the dtype attention read them in
            k_hat, v_hat = self._dequantize_view(self._group_view(keep_q), self.key_residual.dtype)
            restored = k_hat[..., :part, :], v_hat[..., :part, :]
        kept, offset = [], 0
        for blk in self.blocks:
            if offset >= keep_q:
                break  # this block and the ones after it are freed
            if offset + blk.filled > keep_q:
                blk.filled = keep_q - offset
                blk.view = None
            kept.append(blk)
            offset += blk.filled
        self.blocks = kept
        self.quantized_tokens = keep_q
        assert self._kbuf is not None and self._kbuf.shape[-2] >= g > part  # storage exists once Q > 0
        self._start, self._count = 0, part
        if restored is not None:
            self._kbuf[:, :, :part] = restored[0]
            self._vbuf[:, :, :part] = restored[1]
            self.restored_tokens += part

    def nbytes_breakdown(self) -> dict[str, int]:
        """Exact bytes of the stored state, measured from the tensors.

        Keys: ``codes`` (packed K and V codes of the ``Q`` quantized tokens; ``key_codes`` + ``value_codes``, not
        in ``total`` again), ``scales_zeros`` (their metadata),
        ``residual`` (full-precision window), ``total`` (the sum of those three), and ``allocated_unused``
        (block capacity reserved beyond ``Q`` plus residual storage beyond the window's tokens; not in ``total``).
        """
        key_codes = value_codes = meta = allocated = 0
        for seg in self.segments():
            key_codes += seg.k_codes.numel()  # uint8: one byte per element
            value_codes += seg.v_codes.numel()
            meta += sum(
                t.numel() * t.element_size() for t in (seg.k_scale, seg.k_zero, seg.v_scale, seg.v_zero)
            )
        for blk in self.blocks:
            allocated += sum(t.numel() * t.element_size() for t in blk.tensors())
        residual = 0
        if self._kbuf is not None:
            residual = sum(t.numel() * t.element_size() for t in (self.key_residual, self.value_residual))
            allocated += self._kbuf.numel() * self._kbuf.element_size() * 2
        codes = key_codes + value_codes
        return {
            "codes": codes,
            "key_codes": key_codes,
            "value_codes": value_codes,
            "scales_zeros": meta,
            "residual": residual,
            "total": codes + meta + residual,
            "allocated_unused": allocated - codes - meta - residual,
        }

    def index_select_batch(self, index: torch.Tensor) -> torch.Tensor:
        """Reorder/select batch rows of every block and the residual (beam search, batch selection).

        Args:
            index: 1-D integer rows in ``[0, batch)`` (a tensor or a sequence of ints).

        Returns:
            The index as a tensor (for callers that reuse it).

        Raises:
            TypeError: a non-integer index. ValueError: not 1-D, or a row outside the batch (nothing is changed).
        """
        if not isinstance(index, torch.Tensor):
            index = torch.as_tensor(index)
        if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
            raise TypeError(f"batch index must hold integers, got dtype {index.dtype}")
        if index.ndim != 1:
            raise ValueError(f"batch index must be 1-D, got shape {tuple(index.shape)}")
        index = index.long()
        if self._kbuf is not None and index.numel():
            batch = self._kbuf.shape[0]
            bad = (index < 0) | (index >= batch)
            if bool(bad.any()):
                raise ValueError(
                    f"batch index holds {index[bad][0].item()}, outside a batch of {batch} (rows 0..{batch - 1})"
                )
        for blk in self.blocks:
            for name in ("k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero"):
                t = getattr(blk, name)
                setattr(blk, name, t.index_select(0, index.to(t.device)))
            blk.view = None
        if self._kbuf is not None:
            self._kbuf = self._kbuf.index_select(0, index.to(self._kbuf.device))
            self._vbuf = self._vbuf.index_select(0, index.to(self._vbuf.device))
        return index
