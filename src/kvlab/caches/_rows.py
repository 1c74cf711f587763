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
        ValueError: a key or value that is not a 4-d tensor (its rank and shape named), or shapes that differ in
            batch, heads or tokens (both named).
    """
    shapes = tuple(getattr(x, "shape", None) for x in (key_states, value_states))
    if any(sh is None or len(sh) != 4 for sh in shapes):
        ranks = [f"{len(sh)}-d {tuple(sh)}" if sh is not None else type(x).__name__ for sh, x in
                 zip(shapes, (key_states, value_states))]
        raise ValueError(
            f"keys and values must be 4-d [batch, kv_heads, tokens, head_dim] tensors, got {ranks[0]} and {ranks[1]}"
        )
    if shapes[0][:3] != shapes[1][:3]:
        raise ValueError(
            f"keys and values must be [batch, kv_heads, tokens, head_dim] tensors agreeing in batch, heads and "
            f"tokens, got {shapes[0] and tuple(shapes[0])} and {shapes[1] and tuple(shapes[1])}"
        )


def step_positions(kwargs: dict) -> torch.Tensor | None:
    """The ``[batch or 1, tokens]`` ``position_ids`` transformers hands a cache layer's ``update`` (the attention
    module's keyword arguments arrive as ``kwargs={"position_ids": ..., ...}``), or ``None`` where the model passes
    none (or passes positions that are not 2-D, such as multimodal RoPE's ``[3, batch, tokens]``)."""
    inner = kwargs.get("kwargs")
    pos = inner.get("position_ids") if isinstance(inner, dict) else kwargs.get("position_ids")
    return pos if isinstance(pos, torch.Tensor) and pos.ndim == 2 else None


class PaddingCheck:
    """Whether a batch's rows are padded, noted at a layer's first update and read once, when eviction begins.

    transformers masks a cache by contiguous positions (``get_mask_sizes``' offset), so an evicting cache that
    keeps a left-padded row's pad tokens in slots the mask reads as real tokens lets the row attend to them. The
    cache never sees the attention mask, but it sees the step's ``position_ids`` (:func:`step_positions`):
    ``generate`` numbers a padded row's tokens from its first real token, so the row's last position falls short
    of the tokens the cache has counted. :meth:`note` keeps that comparison as a device tensor (no host sync);
    :meth:`before_eviction` reads it, once, and raises.
    """

    def __init__(self) -> None:
        self.off_rows: torch.Tensor | None = None  # [rows] bool: positions not continuing the cache's count
        self.rows = 0
        self.pending = False  # noted and not yet read

    def note(self, kwargs: dict, seen_tokens: int, tokens: int, rows: int) -> None:
        """Record the first update's positions: the cache had seen ``seen_tokens`` and receives ``tokens``."""
        pos = step_positions(kwargs)
        self.off_rows = None if pos is None else pos[:, -1] != seen_tokens + tokens - 1
        self.rows, self.pending = rows, True

    def before_eviction(self, cache_name: str) -> None:
        """Refuse a padded batch before the first eviction (later calls do nothing).

        A model call that hands the cache no ``position_ids`` (a direct forward without them; ``generate`` passes
        them) cannot be checked and is taken as unpadded: kvlab's own evaluations call the model so, on unpadded
        rows, and a warning there would only be noise.

        Raises:
            ValueError: a row whose positions do not continue the cache's count (a left-padded row), named.
        """
        if not self.pending:
            return
        self.pending = False
        if self.off_rows is None:  # a direct forward call: its caller numbers (and pads) its own rows
            return
        bad = self.off_rows.nonzero().flatten().tolist()
        if bad:
            raise ValueError(
                f"{cache_name} cannot evict from a padded batch: row(s) {bad} have position_ids that do not "
                "continue the tokens the cache has seen (left padding). transformers masks a cache by contiguous "
                "positions, so after eviction a padded row would attend to its pad tokens. Run rows of different "
                "lengths one at a time (or in batches of equal length, unpadded), or use a cache that does not "
                "evict (DynamicCache, KIVICache)"
            )
