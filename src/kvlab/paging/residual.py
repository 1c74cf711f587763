"""A KIVI cache's full-precision residual window in the paged block accounting (no torch).

KIVI (arXiv:2402.02750, the residual window) keeps each sequence's newest tokens in the model dtype and quantizes
them a group of ``G`` at a time once more than ``R`` are waiting: of a request holding ``n`` tokens,
``Q(n) = kvlab.plan.quantized_tokens(n, G, R)`` are codes + scale/zero pairs and ``n - Q(n)`` (all ``n`` up to
``R``; then ``R`` to ``R + G - 1``) stay in the model dtype. The planner's ledger (:func:`kvlab.plan.kv_bytes`)
charges exactly that; its long-context bytes per token (:func:`kvlab.plan.kv_bytes_per_token`) leave the window
out. Here a request's bytes are both: ``Q(n)`` tokens at the quantized bytes per token and ``n - Q(n)`` at the
model dtype's (:func:`request_bytes`, equal to the ledger's ``kv_bytes`` with every layer holding every token).

Paging (vLLM, Kwon et al., SOSP 2023) hands out blocks of ``block_size`` tokens at the quantized bytes; a request
holds ``ceil(request_bytes(n) / block bytes)`` of them (:func:`request_blocks`): the ``ceil(n / block_size)``
blocks of its block table plus as many more as its residual window's extra bytes take, so what it holds exceeds
the ledger by less than one block. A contiguous reservation holds the most bytes a request reaches at any length
up to ``max_len`` (:func:`reservation_bytes`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from kvlab.paging.block_pool import BlockPool
from kvlab.paging.block_table import BlockTable
from kvlab.plan.ledger import quantized_tokens


@dataclass(frozen=True)
class ResidualWindow:
    """The newest tokens of every request a KIVI cache keeps in the model dtype (arXiv:2402.02750).

    Args:
        residual_length: ``R``, tokens (a multiple of ``group_size``; KIVI's default 128,
            :data:`kvlab.cache_names.KIVI_DEFAULTS`).
        group_size: ``G``, tokens quantized together once more than ``R`` wait (default 32).
        bytes_per_token: bytes one token of the window costs across all layers: the planner's bytes per token at
            the model dtype (Llama-3-8B in bf16: 131,072 B).
        dtype: the model dtype's name, for the output (``bf16``).

    Raises:
        ValueError: ``group_size`` < 1, ``residual_length`` not a non-negative multiple of it, or
            ``bytes_per_token`` not > 0 (each named with its value).
    """

    residual_length: int
    group_size: int
    bytes_per_token: float
    dtype: str

    def __post_init__(self) -> None:
        g, r = self.group_size, self.residual_length
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ValueError(f"`group_size` must be an integer >= 1, got {g!r}")
        if isinstance(r, bool) or not isinstance(r, int) or r < 0 or r % g:
            raise ValueError(f"`residual_length` must be a non-negative multiple of `group_size` ({g}), got {r!r}")
        if not self.bytes_per_token > 0:
            raise ValueError(f"residual `bytes_per_token` must be > 0, got {self.bytes_per_token!r}")

    def tokens(self, n: int) -> int:
        """Tokens of a request holding ``n`` that stay in the model dtype: ``n - Q(n)``."""
        return n - quantized_tokens(n, self.group_size, self.residual_length)

    def describe(self) -> str:
        """``R=128 tokens per request at bf16`` (and ``+ up to G - 1`` before a flush)."""
        return (
            f"R={self.residual_length} tokens per request at {self.dtype} (up to "
            f"{self.residual_length + self.group_size - 1:,} before a flush of G={self.group_size})"
        )

    def as_dict(self) -> dict:
        return asdict(self)


def check_residual(kv_bytes_per_token: float, residual: ResidualWindow | None) -> None:
    """Refuse a residual window cheaper per token than the quantized tokens (e.g. KIVI-8 with ``G`` = 2: 3 B per
    element of codes and scales against 2 B in bf16): every token holds a block slot at the quantized bytes, so
    the window's bytes could not be charged exactly.

    Raises:
        ValueError: naming both bytes per token.
    """
    if residual is not None and residual.bytes_per_token < kv_bytes_per_token:
        raise ValueError(
            f"the residual window's {residual.bytes_per_token:g} B/token ({residual.dtype}) is below the quantized "
            f"{kv_bytes_per_token:g} B/token at `group_size` {residual.group_size}: the paging simulator charges "
            "every token a slot at the quantized bytes and cannot model a window cheaper than its codes; use a "
            "larger group size"
        )


def request_bytes(tokens: int, kv_bytes_per_token: float, residual: ResidualWindow | None) -> float:
    """KV bytes of one request holding ``tokens`` tokens: ``tokens x kv_bytes_per_token``, or with a KIVI
    ``residual`` window ``Q x kv_bytes_per_token + (tokens - Q) x residual.bytes_per_token`` (the planner
    ledger's codes + scales/zeros + residual, :func:`kvlab.plan.kivi_bytes_per_head`)."""
    if residual is None:
        return tokens * kv_bytes_per_token
    full = residual.tokens(tokens)
    return (tokens - full) * kv_bytes_per_token + full * residual.bytes_per_token


def request_blocks(
    tokens: int, block_size_tokens: int, kv_bytes_per_token: float, residual: ResidualWindow | None
) -> int:
    """Blocks of ``block_size_tokens`` slots at ``kv_bytes_per_token`` one request holding ``tokens`` tokens needs:
    ``ceil(request_bytes / block bytes)``, rounded up once (``ceil(tokens / block_size_tokens)`` without a
    residual window)."""
    if residual is None:
        return -(-tokens // block_size_tokens)
    need = request_bytes(tokens, kv_bytes_per_token, residual)
    return int(-(-need // (block_size_tokens * kv_bytes_per_token)))


def reservation_bytes(max_len: int, kv_bytes_per_token: float, residual: ResidualWindow | None) -> float:
    """Bytes a contiguous reservation for requests of up to ``max_len`` tokens holds: the most
    :func:`request_bytes` reaches at any length ``<= max_len``. A window's bytes drop at each flush and grow in
    between (its bytes per token are at least the quantized ones, :func:`check_residual`), so the peak is at
    ``max_len`` or at the last length before a flush, within ``group_size`` tokens below it."""
    if residual is None:
        return max_len * kv_bytes_per_token
    lengths = range(max(0, max_len - residual.group_size), max_len + 1)
    return max(request_bytes(n, kv_bytes_per_token, residual) for n in lengths)


def per_request(lens: np.ndarray, residual: ResidualWindow | None, cost) -> np.ndarray:
    """``cost`` of every request length in ``lens`` (``[n]`` int64): without a residual window ``cost(lens)`` at once
    (the plain formulas are numpy arithmetic), with one ``cost(n)`` once per distinct length; int64 when every value
    is whole, else float64."""
    lens = np.asarray(lens)
    if residual is None:
        return np.asarray(cost(lens))
    values, inverse = np.unique(lens, return_inverse=True)
    costs = [cost(int(n)) for n in values.tolist()]
    whole = all(float(c).is_integer() for c in costs)
    table = np.array([int(c) for c in costs] if whole else costs, dtype=np.int64 if whole else np.float64)
    return table[inverse.reshape(-1)]


def whole(kv_bytes_per_token: float) -> float | int:
    """``kv_bytes_per_token`` as an int when it is whole (``2.0`` -> ``2``), so bytes stay exact integers."""
    return int(kv_bytes_per_token) if float(kv_bytes_per_token).is_integer() else kv_bytes_per_token


def peak_blocks(tokens: int, block_size_tokens: int, kv_bytes_per_token: float, residual: ResidualWindow | None) -> int:
    """The most blocks (:func:`request_blocks`) a request growing to ``tokens`` tokens holds at any length on the way:
    at ``tokens`` without a residual window, else at the peak of :func:`reservation_bytes`."""
    if residual is None:
        return request_blocks(tokens, block_size_tokens, kv_bytes_per_token, residual)
    lengths = range(max(0, tokens - residual.group_size), tokens + 1)
    return max(request_blocks(n, block_size_tokens, kv_bytes_per_token, residual) for n in lengths)


class ResidualCharge:
    """The blocks each request of a paged policy holds for its residual window, beyond the ``ceil(n / block_size)``
    of its block table: ``request_blocks(n) - ceil(n / block_size)`` full blocks of the same pool in a second
    :class:`~kvlab.paging.block_table.BlockTable` per request (so the pool's conservation and invariant checks see
    them), taken as the window grows and returned at a flush, when ``G`` of its tokens become codes.

    Args:
        pool: the policy's pool (blocks of ``block_size_tokens`` slots at ``kv_bytes_per_token``).
        n_requests: requests of the trace.
        kv_bytes_per_token: the quantized bytes per token (one slot).
        residual: the window.
        max_tokens: the most tokens a request's block table holds (the per-length tables run to it).
    """

    def __init__(
        self, pool: BlockPool, n_requests: int, kv_bytes_per_token: float, residual: ResidualWindow, max_tokens: int
    ) -> None:
        bs = self.bs = pool.block_size_tokens
        bpt = self.bpt = kv_bytes_per_token
        lengths = range(max_tokens + 1)
        # window blocks of a request holding n tokens, and the bytes its window adds to n slots
        self.extra = [request_blocks(n, bs, bpt, residual) - request_blocks(n, bs, bpt, None) for n in lengths]
        self.excess_bytes = [request_bytes(n, bpt, residual) - n * bpt for n in lengths]
        self.tables = [BlockTable(pool) for _ in range(n_requests)]
        self.held_total = 0  # window blocks of every request

    def held(self, r: int) -> int:
        """Window blocks request ``r`` holds."""
        return len(self.tables[r].blocks)

    def shrink(self, r: int, tokens: int) -> int:
        """Return to the pool the window blocks of ``r`` beyond what ``tokens`` tokens need (after a flush); the
        blocks it still has to take for them."""
        table, want = self.tables[r], self.extra[tokens]
        if len(table.blocks) > want:
            self.held_total -= len(table.blocks) - want
            table.truncate(want * self.bs)
        return want - len(table.blocks)

    def grow(self, r: int, tokens: int) -> None:
        """Take the window blocks ``r`` lacks for a block table of ``tokens`` tokens (the caller made sure they are
        free)."""
        more = self.extra[tokens] - len(self.tables[r].blocks)
        if more > 0:
            self.tables[r].append_tokens(more * self.bs)
            self.held_total += more

    def free(self, r: int) -> None:
        """Return every window block of ``r`` (finished or preempted)."""
        self.held_total -= len(self.tables[r].blocks)
        self.tables[r].free()

    def unpaid_slots(self, token_counts: list[int]) -> float:
        """Slots of every window block beyond the bytes the windows of requests holding ``token_counts`` tokens add
        (in slots of ``kv_bytes_per_token``): what the pool counts as filled (window blocks are full) less what the
        ledger charges."""
        excess = self.excess_bytes
        return self.held_total * self.bs - sum([excess[n] for n in token_counts]) / self.bpt
