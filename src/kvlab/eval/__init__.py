"""The paired float-vs-quantized KV-cache experiment behind ``kvlab eval`` (the quantization chapter's experiment).

``config`` (settings and gates), ``candidates`` (cache registry), ``metrics`` (latency, memory, quality),
``runner`` (both matrices and the decision), ``schema`` / ``io`` (result file), ``render`` (rich summary).
"""
