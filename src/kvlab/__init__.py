"""kvlab: measure, compress and plan the KV cache of transformer decoders.

Subpackages
-----------
quant      group-wise quantization with bit packing; the KIVI state (keys per-channel, values per-token)
caches     transformers ``Cache`` subclasses (``KIVICache``, ``PagedCache``)
attention  reference and quantized decode attention
plan       KV memory ledger, fit, roofline, video accounting (no torch)
paging     block pool, block tables, static and dynamic simulators (no torch)
lab        the mechanics chapter's toy decoder: cached vs full recompute
eval       the paired float-vs-quantized cache experiment
"""

__version__ = "0.1.0"
