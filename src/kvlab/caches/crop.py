"""The argument of ``Cache.crop``, read the way transformers reads it, for every kvlab cache.

transformers' ``Cache.crop(n)`` (5.x ``cache_utils``): a **negative** ``n`` removes the last ``|n|`` tokens (all of
them when ``|n|`` is at least the tokens held), and ``0`` removes nothing (``generate`` calls ``crop(0)`` after
every step when it defers its stop decision). A **positive** ``n`` is ``max_length`` as transformers 5.0's
``DynamicCache.crop(max_length)`` defined it: keep the first ``n`` tokens, nothing to do when ``n`` is at least the
tokens held (the newest transformers refuses a positive ``n``; kvlab keeps the older callers working).
"""

from __future__ import annotations

import operator
from typing import Any


def crop_keep(n: int, held: int) -> int:
    """Tokens a cache holding ``held`` tokens keeps after ``crop(n)`` (see the module docstring).

    Args:
        n: transformers' crop argument: ``< 0`` removes ``-n`` tokens, ``0`` nothing, ``> 0`` keeps at most ``n``.
            Any integer (a Python, NumPy or 0-d integer torch scalar).
        held: tokens the cache holds now (``>= 0``).

    Returns:
        The tokens left, in ``[0, held]``: ``max(held + n, 0)`` for ``n < 0``, ``held`` for ``0``, ``min(n, held)``
        for ``n > 0``.

    Raises:
        TypeError: ``n`` is not an integer (a float, a bool or 0-d bool tensor, a tensor of several elements).
    """
    if isinstance(n, bool) or str(getattr(n, "dtype", "")) in ("bool", "torch.bool"):  # True is not 1 token
        raise TypeError(f"`crop` takes an integer number of tokens, got {n!r}")
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"`crop` takes an integer number of tokens, got {n!r}") from None
    assert held >= 0, held
    if n < 0:
        return max(held + n, 0)
    if n == 0:
        return held
    return min(n, held)


def crop_kv(layer: Any, n: int) -> None:
    """``crop(n)`` of a layer that holds ``keys``/``values`` ``[batch, kv_heads, tokens, head_dim]`` as they are
    (float K/V, or FP8 codes beside per-head scales that do not depend on the tokens): the first
    :func:`crop_keep` tokens stay, exact.

    Raises:
        TypeError: ``n`` is not an integer (nothing is changed).
    """
    keep = crop_keep(n, layer.get_seq_length())
    if layer.is_initialized:
        layer.keys, layer.values = layer.keys[:, :, :keep], layer.values[:, :, :keep]


def crop_unless_evicted(layer: Any, n: int) -> int | None:
    """Tokens an evicting layer keeps after ``crop(n)``, or None when the crop removes nothing. The layer counts
    ``seen_tokens`` (every token received) and ``evicted_tokens``; it can crop only while it has evicted none.

    Raises:
        TypeError: ``n`` is not an integer.
        ValueError: a crop that removes tokens after eviction began (the evicted tokens cannot come back), naming
            the layer's ``cache_name``.
    """
    keep = crop_keep(n, layer.seen_tokens)
    if keep == layer.seen_tokens:
        return None
    if layer.evicted_tokens:
        raise ValueError(
            f"{layer.cache_name} cannot crop to {keep} tokens after evicting {layer.evicted_tokens}: "
            "evicted tokens are gone"
        )
    return keep
