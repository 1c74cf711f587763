"""Checks shared by kvlab's caches for their batch-row operations and their ``update`` arguments, so that every
cache refuses the same bad input with the same words (a ``ValueError``/``TypeError`` naming the value, never an
``IndexError`` or ``RuntimeError`` from inside torch)."""

from __future__ import annotations

from typing import Any

import torch


def batch_index(index: Any, rows: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Check a batch-row index (``reorder_cache``, ``batch_select_indices``) against a batch of ``rows`` rows.

    Args:
        index: 1-D integer rows in ``[0, rows)``: a tensor or a sequence of ints (a row may repeat; a negative row
            is refused, not read from the end).
        rows: the batch size the index selects from.
        device: where the returned index goes (``None``: where it is).

    Returns:
        ``[n]`` int64 tensor on ``device``.

    Raises:
        TypeError: a float, complex or bool index.
        ValueError: an index that is not 1-D, or a row outside ``0 .. rows - 1`` (named with the batch size).
    """
    idx = index if isinstance(index, torch.Tensor) else torch.as_tensor(index)
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
        raise TypeError(f"batch index must hold integers, got dtype {idx.dtype}")
    if idx.ndim != 1:
        raise ValueError(f"batch index must be 1-D, got shape {tuple(idx.shape)}")
    bad = (idx < 0) | (idx >= rows)
    if bool(bad.any()):
        raise ValueError(f"batch index holds {idx[bad][0].item()}, outside a batch of {rows} rows")
    idx = idx.long()
    return idx if device is None else idx.to(device)


def check_repeats(repeats: Any) -> int:
    """Return ``repeats`` (``batch_repeat_interleave``) once checked.

    Raises:
        ValueError: not a positive int (``0`` would empty the cache, a negative count is torch's RuntimeError).
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"`repeats` must be a positive integer, got {repeats!r}")
    return repeats


def check_kv_pair(key_states: Any, value_states: Any) -> None:
    """Refuse keys/values that are not ``[batch, kv_heads, tokens, head_dim]`` tensors agreeing in batch, heads and
    tokens (``head_dim`` may differ between K and V).

    Raises:
        ValueError: naming both shapes.
    """
    shapes = tuple(getattr(x, "shape", None) for x in (key_states, value_states))
    if any(sh is None or len(sh) != 4 for sh in shapes) or shapes[0][:3] != shapes[1][:3]:
        raise ValueError(
            f"keys and values must be [batch, kv_heads, tokens, head_dim] tensors agreeing in batch, heads and "
            f"tokens, got {shapes[0] and tuple(shapes[0])} and {shapes[1] and tuple(shapes[1])}"
        )
