"""Exact bytes held by any KV cache object (kvlab's, transformers' dynamic and quantized caches)."""

from __future__ import annotations

from typing import Any

import torch


def _tensors(obj: Any, seen: set[int], depth: int = 0):
    """Yield every distinct tensor reachable from ``obj`` through attributes, lists, tuples and dicts."""
    if depth > 6 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        flatten = getattr(obj, "__tensor_flatten__", None)
        if flatten is not None:  # wrapper subclasses (quanto's QTensor): count the inner tensors
            names, _ = flatten()
            for name in names:
                yield from _tensors(getattr(obj, name), seen, depth + 1)
        else:
            yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, seen, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, seen, depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module):
        for v in vars(obj).values():
            yield from _tensors(v, seen, depth + 1)


def cache_nbytes(cache: Any) -> int:
    """Bytes of tensor storage held by ``cache``.

    A cache with an ``nbytes()`` method (kvlab's caches) answers itself. Otherwise (``DynamicCache``,
    transformers' ``QuantizedCache`` with HQQ/quanto layers) every distinct tensor storage reachable from its layers
    is counted once, whatever the backend's layout (codes, scales, zeros, residual).

    Raises:
        TypeError: ``cache`` has neither ``nbytes()`` nor ``layers``.
    """
    if callable(getattr(cache, "nbytes", None)):
        return int(cache.nbytes())
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"cannot measure a {type(cache).__name__}: it has no `nbytes()` and no `layers`")
    storages: dict[int, int] = {}
    seen: set[int] = set()
    for layer in layers:
        for t in _tensors(layer, seen):
            if t.device.type == "meta":
                continue
            try:
                storage = t.untyped_storage()
                storages[storage.data_ptr() or id(storage)] = storage.nbytes()
            except RuntimeError:  # a storage-less tensor: count its elements
                storages[id(t)] = t.numel() * t.element_size()
    return sum(storages.values())
