"""The paired float-vs-quantized KV-cache experiment behind ``kvlab eval`` (docs/EVAL.md), one job per module.

``config`` (settings and gates), ``candidates`` (a cache name as the run uses it), ``cells`` (which cells run
which caches: the one matrix rule), ``measure`` (one cell's untimed measurement and interleaved timing),
``metrics`` / ``divergence`` (generate, NLL, top-k, KL), ``longctx`` (recall and passkey probes), ``probes`` (where
the probe jobs run and how their results reach the cells), ``rows`` (a timed cell's rows), ``decision`` (gates,
selection, warnings; torch-free), ``records`` (row and failure records, the result's status), ``runner`` (the
driver), ``model_info`` (what a run records and checks about its model), ``schema`` / ``io`` / ``resume`` (the
result file), ``render`` / ``decision_words`` / ``margins`` (the reports), ``inspect`` (``kvlab inspect``).
"""
