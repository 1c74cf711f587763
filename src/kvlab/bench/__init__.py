"""Benchmarks: one module per name, each exposing ``run(**opts) -> dict`` (JSON-serializable); ``kvlab bench``
dispatches to them. Speed targets live here, never in timed unit tests.

* ``decode`` — ms/token against context for every cache, ratios to ``DynamicCache``;
* ``memory`` — decode-phase transient bytes per cache (exact tensor accounting on CPU, CUDA peak stats);
* ``flush`` — time of a flushing append against history length, KIVI vs transformers' QuantizedCache;
* ``kernel`` — achieved GB/s of the KIVI decode attention and SDPA against the measured copy bandwidth;
  :mod:`kvlab.bench.cache_resident` marks a kernel whose bytes fit the CPU's last-level cache (not a DRAM figure);
* ``paging`` — the paging simulator's targets; ``lab`` — the toy decoder's speedup.

:mod:`kvlab.bench.results` writes the result records, :mod:`kvlab.bench.docs` renders ``docs/PERFORMANCE.md``.
"""
