"""Memory policies of the serving simulation (:mod:`kvlab.paging.simulate`) and the pool each gets in a budget.

A policy says how KV memory is handed out: contiguous reservation (one ``max_len`` block per request) or paged
blocks (vLLM's PagedAttention, Kwon et al., SOSP 2023), with prefix sharing, a quantized cache's bytes per token
(a KIVI cache's residual window charged per request, :mod:`kvlab.paging.residual`) or an evicting cache's cap.
:func:`pool_geometry` turns a policy and a :class:`~kvlab.paging.budget.KVBudget` into blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.paging.budget import KVBudget, default_budget
from kvlab.paging.residual import ResidualWindow, check_residual, peak_blocks, reservation_bytes, whole
from kvlab.paging.trace import Trace
from kvlab.plan.kv_formats import check_keep_tokens

POLICY_KINDS = ("contiguous", "paged")


@dataclass(frozen=True)
class Policy:
    """How the KV memory is managed.

    Args:
        name: label in the output.
        kind: ``contiguous`` (one block of ``max_len`` tokens per request, reserved at admission) or ``paged``.
        block_size_tokens: block size of a paged policy (ignored for contiguous).
        prefix_sharing: share full prompt blocks across requests by chained hash (paged only).
        kv_bytes_per_token: KV bytes per token; None takes the budget's, and its residual window (e.g. set it lower
            for a quantized cache).
        kv_dtype: label of the KV format, for the output; None: the budget's.
        keep_tokens: an evicting cache's cap N (paged, no prefix sharing): a request holds at most
            ``ceil(N / block_size_tokens)`` blocks, evicting at block granularity (its oldest block goes back to the
            pool when it needs a new one at the cap); a prefill keeps its newest ``min(T, cap blocks)`` tokens. None:
            every token is kept.
        residual: a KIVI cache's residual window (arXiv:2402.02750) at ``kv_bytes_per_token``: a request holding
            ``n`` tokens holds ``kvlab.paging.residual.request_blocks(n)`` blocks (its ``n - Q(n)`` newest tokens at
            the model dtype's bytes, the planner ledger's bytes rounded up to whole blocks); a contiguous policy
            reserves the most bytes a request reaches up to ``max_len``. None: every token costs
            ``kv_bytes_per_token``.

    Raises:
        ValueError: a bad kind, block size or bytes per token, prefix sharing without paging, ``keep_tokens``
            not an integer >= 1 (named as ``--keep-tokens``) or given with contiguous reservation or prefix sharing,
            or a ``residual`` without ``kv_bytes_per_token`` or cheaper per token than it.
    """

    name: str
    kind: str = "paged"
    block_size_tokens: int = 16
    prefix_sharing: bool = False
    kv_bytes_per_token: float | None = None
    kv_dtype: str | None = None
    keep_tokens: int | None = None
    residual: ResidualWindow | None = None

    def __post_init__(self) -> None:
        check_keep_tokens(self.keep_tokens)
        if self.keep_tokens is not None and (self.kind != "paged" or self.prefix_sharing):
            raise ValueError(
                f"policy {self.name!r}: `keep_tokens` (--keep-tokens) models a paged cache without prefix sharing "
                f"(evicted tokens leave shared prompt blocks undefined), got kind {self.kind!r}, "
                f"prefix_sharing={self.prefix_sharing}"
            )
        if self.kind not in POLICY_KINDS:
            raise ValueError(f"`kind` must be one of {list(POLICY_KINDS)}, got {self.kind!r}")
        if self.block_size_tokens < 1:
            raise ValueError(f"`block_size_tokens` must be >= 1, got {self.block_size_tokens!r}")
        if self.prefix_sharing and self.kind != "paged":
            raise ValueError(f"prefix sharing needs a paged policy, got kind {self.kind!r}")
        if self.kv_bytes_per_token is not None and not self.kv_bytes_per_token > 0:
            raise ValueError(f"`kv_bytes_per_token` must be > 0, got {self.kv_bytes_per_token!r}")
        if self.residual is not None and self.kv_bytes_per_token is None:
            raise ValueError(
                f"policy {self.name!r}: a `residual` window is charged on top of the policy's `kv_bytes_per_token`, "
                "got none (without both the policy takes the budget's)"
            )
        if self.kv_bytes_per_token is not None:
            check_residual(self.kv_bytes_per_token, self.residual)


def default_policies(block_size_tokens: int = 16, quant: KVBudget | None = None) -> list[Policy]:
    """The four policies compared: contiguous, paged, paged + prefix sharing, paged with a quantized cache.

    ``quant``: the planner's budget of the quantized cache (:func:`kvlab.paging.budget.planner_budget` at its KV
    dtype), whose bytes per token, residual window and name the quantized policy takes; default
    ``default_budget("kivi4")`` (Llama-3-8B, KIVI-4: 40,960 B per token plus a window of R = 128 tokens per
    request at bf16's 131,072 B).
    """
    quant = quant if quant is not None else default_budget("kivi4")
    return [
        Policy("contiguous", kind="contiguous"),
        Policy("paged", block_size_tokens=block_size_tokens),
        Policy("paged+prefix", block_size_tokens=block_size_tokens, prefix_sharing=True),
        Policy(
            f"paged+{quant.kv_dtype}",
            block_size_tokens=block_size_tokens,
            kv_bytes_per_token=quant.kv_bytes_per_token,
            kv_dtype=quant.kv_dtype,
            residual=quant.residual,
        ),
    ]

@dataclass(frozen=True)
class PoolGeometry:
    """The pool of one policy in one budget (:func:`pool_geometry`)."""

    kv_bytes_per_token: float  # one slot's bytes
    residual: ResidualWindow | None  # charged per request on top (KIVI), or None
    kv_dtype: str  # the KV format's name, for the output
    block_size: int  # slots per block: max_len for a contiguous policy
    num_blocks: int  # blocks the free KV bytes pay for
    max_tokens: int  # the most tokens one request's block table holds


def pool_geometry(trace: Trace, policy: Policy, budget: KVBudget, max_len: int) -> PoolGeometry:
    """The pool of ``policy`` in ``budget``: a paged block holds ``block_size_tokens`` slots at the policy's bytes per
    token (and a KIVI request takes extra blocks for its residual window, :mod:`kvlab.paging.residual`); a
    contiguous policy's block is one reservation of ``max_len`` tokens, its residual window's peak included. The
    pool holds as many blocks as the free KV bytes pay for.

    Raises:
        ValueError: the trace's largest request exceeds ``max_len`` or alone needs more blocks than the pool has.
    """
    own = policy.kv_bytes_per_token is not None  # else the budget's bytes and residual window
    bpt = whole(policy.kv_bytes_per_token if own else budget.kv_bytes_per_token)
    residual = policy.residual if own else budget.residual
    contiguous = policy.kind == "contiguous"
    bs = max_len if contiguous else policy.block_size_tokens
    block_bytes = reservation_bytes(max_len, bpt, residual) if contiguous else bs * bpt
    num_blocks = int(budget.free_bytes // block_bytes)
    peak = trace.peak_kv_tokens
    if peak > max_len:
        raise ValueError(f"a request holding {peak:,} KV tokens exceeds `max_len` {max_len:,}")
    if policy.keep_tokens is not None:  # a capped request holds at most ceil(N / bs) blocks
        peak = min(peak, -(-policy.keep_tokens // bs) * bs)
    need = 1 if contiguous else peak_blocks(peak, bs, bpt, residual)
    if need > num_blocks:
        window = "" if residual is None else f" (its residual window of {residual.describe()} included)"
        raise ValueError(
            f"policy {policy.name!r}: a request holding {peak:,} KV tokens needs {need:,} blocks{window}, "
            f"the pool has {num_blocks:,}"
        )
    kv_dtype = policy.kv_dtype or budget.kv_dtype
    return PoolGeometry(bpt, residual, kv_dtype, bs, num_blocks, peak)
