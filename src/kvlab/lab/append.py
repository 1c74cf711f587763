"""Per-step append cost of a growing ``torch.cat`` cache vs a preallocated cache written in place (mechanics chapter §05).

``transformers``' ``DynamicLayer.update`` appends with ``torch.cat``: every step allocates a new tensor and
copies the whole history, so one append costs O(context). A static cache (``StaticLayer``, gpt-fast) allocates
the maximum length once and writes the new token's slot, O(1) per step. This module measures both, per step, at
several context lengths, for one layer's K and V.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from kvlab.runtime.dtypes import DTYPES, parse_dtype


def measure_append_cost(
    contexts_tokens: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192),
    *,
    batch: int = 1,
    kv_heads: int = 8,
    head_dim: int = 128,
    dtype: str = "float32",
    steps: int = 8,
    seed: int = 0,
) -> dict:
    """Time appending one token's K and V to a cache of ``T`` tokens, for each ``T`` in ``contexts_tokens``.

    Each cache holds K and V of shape ``[batch, kv_heads, tokens, head_dim]``. At context ``T`` both strategies
    run ``steps`` consecutive appends (``T .. T + steps - 1``) and the median per-step time is reported:

    - ``cat``: ``keys = torch.cat([keys, k_new], dim=-2)`` (and the same for values), as ``DynamicLayer.update``;
    - ``inplace``: ``keys[:, :, t] = k_new`` into a buffer preallocated at ``T + steps`` tokens.

    Returns a JSON-serializable dict: ``contexts_tokens``, ``cat_us`` and ``inplace_us`` (median microseconds
    per step, K and V together), ``cat_bytes_copied`` (bytes ``torch.cat`` writes at the first step: the whole
    K and V history plus the new token), ``inplace_bytes_written`` (the new token's K and V), the shape and dtype.

    Raises:
        ValueError: an empty or non-positive context list, ``steps`` < 1, an unknown ``dtype``, or a context whose
            caches would not fit in this machine's memory.
    """
    if not contexts_tokens or any(int(t) < 1 for t in contexts_tokens):
        raise ValueError(f"`contexts_tokens` must be positive token counts, got {contexts_tokens!r}")
    if steps < 1:
        raise ValueError(f"`steps` must be >= 1, got {steps!r}")
    torch_dtype = parse_dtype(dtype)
    dtype = next(name for name, d in DTYPES.items() if d == torch_dtype)  # a torch.dtype given -> its name
    token_bytes = 2 * batch * kv_heads * head_dim * torch_dtype.itemsize  # K and V of one token
    _check_fits_in_memory(max(int(t) for t in contexts_tokens), steps, token_bytes)
    gen = torch.Generator().manual_seed(seed)
    new_k = torch.randn(batch, kv_heads, 1, head_dim, generator=gen).to(torch_dtype)
    new_v = torch.randn(batch, kv_heads, 1, head_dim, generator=gen).to(torch_dtype)

    cat_us, inplace_us, cat_bytes = [], [], []
    for context in (int(t) for t in contexts_tokens):
        keys = torch.randn(batch, kv_heads, context, head_dim, generator=gen).to(torch_dtype)
        values = torch.randn(batch, kv_heads, context, head_dim, generator=gen).to(torch_dtype)
        cat_us.append(_median_cat_us(keys, values, new_k, new_v, steps))
        cat_bytes.append((context + 1) * token_bytes)  # written by the first append at this context
        inplace_us.append(_median_inplace_us(keys, values, new_k, new_v, steps))
        del keys, values

    return {
        "contexts_tokens": [int(t) for t in contexts_tokens],
        "cat_us": cat_us,
        "inplace_us": inplace_us,
        "cat_bytes_copied": cat_bytes,
        "inplace_bytes_written": token_bytes,
        "shape": {"batch": batch, "kv_heads": kv_heads, "head_dim": head_dim},
        "dtype": dtype,
        "steps": steps,
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


def _median_cat_us(
    keys: torch.Tensor, values: torch.Tensor, new_k: torch.Tensor, new_v: torch.Tensor, steps: int
) -> float:
    """Median microseconds of one ``torch.cat`` append of ``new_k``/``new_v`` ``[B, H, 1, D]`` to ``keys``/``values``
    ``[B, H, T, D]``, over ``steps`` consecutive appends (the caller's tensors are not changed)."""
    times = []
    for _ in range(steps):
        start = time.perf_counter_ns()
        keys = torch.cat([keys, new_k], dim=-2)  # [B, H, T, D] -> [B, H, T + 1, D], a full copy
        values = torch.cat([values, new_v], dim=-2)
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def _median_inplace_us(
    keys: torch.Tensor, values: torch.Tensor, new_k: torch.Tensor, new_v: torch.Tensor, steps: int
) -> float:
    """Median microseconds of writing ``new_k``/``new_v`` ``[B, H, 1, D]`` into one slot of a buffer preallocated
    at ``T + steps`` tokens and holding ``keys``/``values`` ``[B, H, T, D]``, over ``steps`` consecutive slots."""
    batch, kv_heads, context, head_dim = keys.shape
    buf_k = torch.zeros(batch, kv_heads, context + steps, head_dim, dtype=keys.dtype)
    buf_v = torch.zeros_like(buf_k)
    buf_k[:, :, :context] = keys
    buf_v[:, :, :context] = values
    times = []
    for pos in range(context, context + steps):
        start = time.perf_counter_ns()
        buf_k[:, :, pos] = new_k[:, :, 0]  # one slot written, history untouched
        buf_v[:, :, pos] = new_v[:, :, 0]
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3
