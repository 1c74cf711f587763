"""transformers ``Cache`` subclasses (one strategy per file) and a byte counter for any cache.

* :class:`kvlab.caches.kivi.KIVICache` — keys per-channel, values per-token, residual window (KIVI).
* :class:`kvlab.caches.paged.PagedCache` — K/V in physical blocks addressed by a block table (vLLM-style).

Both implement transformers' ``crop(n)`` (:mod:`kvlab.caches.crop` reads ``n``), so assisted and prompt-lookup
decoding run with them.
"""

from kvlab.caches.kivi import KIVICache, KIVILayer
from kvlab.caches.measure import cache_nbytes
from kvlab.caches.paged import PagedCache, PagedLayer

__all__ = ["KIVICache", "KIVILayer", "PagedCache", "PagedLayer", "cache_nbytes"]
