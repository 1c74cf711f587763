"""Per-step append cost of a growing ``torch.cat`` cache vs a preallocated cache written in place (docs/lab.md,
"Append cost").

``transformers``' ``DynamicLayer.update`` appends with ``torch.cat``: every step allocates a new tensor and
copies the whole history, so one append costs O(context). A static cache (``StaticLayer``, gpt-fast) allocates
the maximum length once and writes the new token's slot, O(1) per step. This module measures both, per step, at
several context lengths, for one layer's K and V.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable

import torch

from kvlab.runtime.checks import check_int
from kvlab.runtime.dtypes import DTYPES, parse_dtype
from kvlab.runtime.timing import (
    Snapshot,
    busy_warnings,
    contention,
    default_threads,
    interleaved,
    paired_ratio,
)


def measure_append_cost(
    contexts_tokens: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192),
    *,
    batch: int = 1,
    kv_heads: int = 8,
    head_dim: int = 128,
    dtype: str = "float32",
    steps: int = 8,
    seed: int = 0,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Time appending one token's K and V to a cache of ``T`` tokens, for each ``T`` in ``contexts_tokens``.

    Each cache holds K and V of shape ``[batch, kv_heads, tokens, head_dim]``. At context ``T`` both strategies
    run ``steps`` consecutive appends (``T .. T + steps - 1``) and the median per-step time is reported:

    - ``cat``: ``keys = torch.cat([keys, k_new], dim=-2)`` (and the same for values), as ``DynamicLayer.update``;
    - ``inplace``: ``keys[:, :, t] = k_new`` into a buffer preallocated at ``T + steps`` tokens.

    The two strategies' steps alternate (``cat, inplace, inplace, cat, ...``: the order rotated per step, as in
    :func:`kvlab.runtime.timing.interleaved`), so a busy period slows both alike; ``cat_over_inplace`` is the
    median of same-step ratios. ``threads`` torch threads are used (``None`` = :func:`kvlab.runtime.timing.
    default_threads`; the caller's setting is restored after); ``progress(step)`` is called as each context
    starts.

    Returns a JSON-serializable dict: ``contexts_tokens``, ``cat_us`` and ``inplace_us`` (median microseconds
    per step, K and V together), ``cat_bytes_copied`` (bytes ``torch.cat`` writes at the first step: the whole
    K and V history plus the new token), ``inplace_bytes_written`` (the new token's K and V), the shape and dtype,
    ``cat_over_inplace`` (paired median per context), ``threads``, ``contention`` (over all timed steps, see
    :func:`kvlab.runtime.timing.contention`) and ``warnings`` (non-empty when the machine was busy).

    Raises:
        ValueError: an empty or non-positive context list, ``steps`` < 1, an unknown ``dtype``, or a context whose
            caches would not fit in this machine's memory.
    """
    if not contexts_tokens or any(int(t) < 1 for t in contexts_tokens):
        raise ValueError(f"`contexts_tokens` must be positive token counts, got {contexts_tokens!r}")
    if steps < 1:
        raise ValueError(f"`steps` must be >= 1, got {steps!r}")
    threads = default_threads() if threads is None else threads
    check_int("threads", threads, 1)
    torch_dtype = parse_dtype(dtype)
    dtype = next(name for name, d in DTYPES.items() if d == torch_dtype)  # a torch.dtype given -> its name
    token_bytes = 2 * batch * kv_heads * head_dim * torch_dtype.itemsize  # K and V of one token
    _check_fits_in_memory(max(int(t) for t in contexts_tokens), steps, token_bytes)
    gen = torch.Generator().manual_seed(seed)
    report = progress or (lambda step: None)
    start = Snapshot.now()
    contexts, shape = [int(t) for t in contexts_tokens], (batch, kv_heads, head_dim)
    cat_us, inplace_us, ratios = _time_contexts(contexts, shape, torch_dtype, gen, steps, threads, report)
    cat_bytes = [(int(t) + 1) * token_bytes for t in contexts_tokens]  # written by the first append at T
    cont = contention(start, Snapshot.now(), threads)
    return {
        "contexts_tokens": [int(t) for t in contexts_tokens],
        "cat_us": cat_us,
        "inplace_us": inplace_us,
        "cat_bytes_copied": cat_bytes,
        "inplace_bytes_written": token_bytes,
        "shape": {"batch": batch, "kv_heads": kv_heads, "head_dim": head_dim},
        "dtype": dtype,
        "steps": steps,
        "cat_over_inplace": ratios,
        "threads": threads,
        "contention": cont,
        "warnings": busy_warnings(cont, "the append-cost curve"),
    }


def _check_fits_in_memory(longest: int, steps: int, token_bytes: int) -> None:
    """Refuse a context whose caches (the history, ``torch.cat``'s copy of it and the preallocated buffer, each
    ``longest + steps`` tokens of ``token_bytes`` B) exceed this machine's physical memory; no check without
    ``sysconf`` (Windows: the allocator decides).

    Raises:
        ValueError: the caches would not fit; the context and both sizes in GiB named.
    """
    needed = 3 * (longest + steps) * token_bytes
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return
    if needed > physical:
        raise ValueError(
            f"a context of {longest} tokens needs about {needed / 2**30:,.1f} GiB for its caches, more than "
            f"this machine's {physical / 2**30:,.1f} GiB of memory"
        )


def _time_contexts(contexts, shape, torch_dtype, gen, steps, threads, report):
    """``(cat_us, inplace_us, cat_over_inplace)`` per context: random K/V history ``[B, H, T, D]`` of ``shape``
    ``(B, H, D)`` from ``gen``, both strategies' ``steps`` appends interleaved at ``threads`` torch threads (the
    caller's count restored after)."""
    batch, kv_heads, head_dim = shape
    new_k = torch.randn(batch, kv_heads, 1, head_dim, generator=gen).to(torch_dtype)
    new_v = torch.randn(batch, kv_heads, 1, head_dim, generator=gen).to(torch_dtype)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    cat_us, inplace_us, ratios = [], [], []
    try:
        for context in contexts:
            report(f"append cost at {context:,} tokens")
            keys = torch.randn(batch, kv_heads, context, head_dim, generator=gen).to(torch_dtype)
            values = torch.randn(batch, kv_heads, context, head_dim, generator=gen).to(torch_dtype)
            times, _ = interleaved(_append_steps(keys, values, new_k, new_v, steps), steps, threads=threads)
            cat_us.append(statistics.median(times["cat"]) * 1e3)  # ms -> us
            inplace_us.append(statistics.median(times["inplace"]) * 1e3)
            ratios.append(paired_ratio(times["cat"], times["inplace"])["ratio"])
            del keys, values
    finally:
        torch.set_num_threads(previous_threads)
    return cat_us, inplace_us, ratios


def _append_steps(
    keys: torch.Tensor, values: torch.Tensor, new_k: torch.Tensor, new_v: torch.Tensor, steps: int
) -> dict[str, Callable[[], None]]:
    """One append step of each strategy, as callables for :func:`kvlab.runtime.timing.interleaved`, over
    ``keys``/``values`` ``[B, H, T, D]`` (not changed): ``cat`` grows its own tensors with ``torch.cat`` by
    ``new_k``/``new_v`` ``[B, H, 1, D]`` per call; ``inplace`` writes the next slot of a buffer preallocated at
    ``T + steps`` tokens. Each may be called ``steps`` times."""
    batch, kv_heads, context, head_dim = keys.shape
    grown = {"k": keys, "v": values}
    buf_k = torch.zeros(batch, kv_heads, context + steps, head_dim, dtype=keys.dtype)
    buf_v = torch.zeros_like(buf_k)
    buf_k[:, :, :context] = keys
    buf_v[:, :, :context] = values
    slot = [context]

    def cat() -> None:
        grown["k"] = torch.cat([grown["k"], new_k], dim=-2)  # [B, H, T, D] -> [B, H, T + 1, D], a full copy
        grown["v"] = torch.cat([grown["v"], new_v], dim=-2)

    def inplace() -> None:
        if slot[0] >= context + steps:
            raise RuntimeError(f"the preallocated buffer holds {steps} appends; all are used")
        buf_k[:, :, slot[0]] = new_k[:, :, 0]  # one slot written, history untouched
        buf_v[:, :, slot[0]] = new_v[:, :, 0]
        slot[0] += 1

    return {"cat": cat, "inplace": inplace}
