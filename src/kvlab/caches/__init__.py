"""transformers ``Cache`` subclasses (one strategy per file) and a byte counter for any cache.

* :class:`kvlab.caches.kivi.KIVICache` — keys per-channel, values per-token, residual window (KIVI).
* :class:`kvlab.caches.paged.PagedCache` — K/V in physical blocks addressed by a block table (vLLM-style).
* :class:`kvlab.caches.fp8.FP8Cache` — K/V in float8 e4m3/e5m2 with calibrated or unit scales.
* :class:`kvlab.caches.mixed.MixedCache` — each layer's keys and values in the format a per-layer plan gives it.
* :class:`kvlab.caches.float_kernel.FloatKernelCache` — ``DynamicCache`` whose decode attention runs in kvlab's float
  C kernel (``dynamic-ckernel``, the fair float baseline of the CPU kernel's paths).

Each implements transformers' ``crop(n)`` (:mod:`kvlab.caches.crop` reads ``n``), so assisted and prompt-lookup
decoding run with them.

Evicting caches (their dropped tokens' bytes are freed; docs/EVICTION.md):

* :class:`kvlab.caches.sink.SinkCache` — attention sinks + newest window, positions inside the cache (StreamingLLM).
* :class:`kvlab.caches.snapkv.SnapKVCache` — the prompt compressed per KV head from its last queries (SnapKV).
* :class:`kvlab.caches.tova.TOVACache` — after every step, the tokens the current query reads least go (TOVA).
* :class:`kvlab.caches.kivi_snapkv.KIVISnapKVCache` — SnapKV on the prompt, then KIVI on what stays.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module: imported on first use, so that ``kvlab.caches.registry`` (torch-free: the CLI builds its help
# from it) can be imported without torch
_EXPORTS = {
    "KIVICache": "kvlab.caches.kivi",
    "KIVILayer": "kvlab.caches.kivi",
    "KIVISnapKVCache": "kvlab.caches.kivi_snapkv",
    "FP8Cache": "kvlab.caches.fp8",
    "FloatKernelCache": "kvlab.caches.float_kernel",
    "MixedCache": "kvlab.caches.mixed",
    "PagedCache": "kvlab.caches.paged",
    "PagedLayer": "kvlab.caches.paged",
    "SinkCache": "kvlab.caches.sink",
    "SnapKVCache": "kvlab.caches.snapkv",
    "TOVACache": "kvlab.caches.tova",
    "cache_nbytes": "kvlab.caches.measure",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kvlab.caches' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
