"""transformers ``Cache`` subclasses (one strategy per file) and a byte counter for any cache.

* :class:`kvlab.caches.kivi.KIVICache` — keys per-channel, values per-token, residual window (KIVI).
* :class:`kvlab.caches.paged.PagedCache` — K/V in physical blocks addressed by a block table (vLLM-style).

Both implement transformers' ``crop(n)`` (:mod:`kvlab.caches.crop` reads ``n``), so assisted and prompt-lookup
decoding run with them.

Evicting caches (their dropped tokens' bytes are freed; docs/EVICTION.md):

* :class:`kvlab.caches.sink.SinkCache` — attention sinks + newest window, positions inside the cache (StreamingLLM).
* :class:`kvlab.caches.snapkv.SnapKVCache` — the prompt compressed per KV head from its last queries (SnapKV).
* :class:`kvlab.caches.tova.TOVACache` — after every step, the tokens the current query reads least go (TOVA).
* :class:`kvlab.caches.kivi_snapkv.KIVISnapKVCache` — SnapKV on the prompt, then KIVI on what stays.
"""

from kvlab.caches.kivi import KIVICache, KIVILayer
from kvlab.caches.kivi_snapkv import KIVISnapKVCache
from kvlab.caches.measure import cache_nbytes
from kvlab.caches.paged import PagedCache, PagedLayer
from kvlab.caches.sink import SinkCache
from kvlab.caches.snapkv import SnapKVCache
from kvlab.caches.tova import TOVACache

__all__ = [
    "KIVICache",
    "KIVILayer",
    "KIVISnapKVCache",
    "PagedCache",
    "PagedLayer",
    "SinkCache",
    "SnapKVCache",
    "TOVACache",
    "cache_nbytes",
]
