"""Quantization core: group-wise min-max codec with bit packing, the KIVI state, and the quantization chapter's exercise.

* :mod:`kvlab.quant.codec` — ``quantize_groups`` / ``dequantize`` along any axis, 2/4/8 bits, packed ``uint8``.
* :mod:`kvlab.quant.kivi` — ``KIVIConfig`` and ``KIVIState``: keys per-channel, values per-token, residual window.
* :mod:`kvlab.quant.strategies` — ``KVQuantizationStrategies``, the quantization chapter's exercise with its method names.
"""

from kvlab.quant.codec import (
    SUPPORTED_NBITS,
    QuantizedTensor,
    dequantize,
    metadata_bytes,
    metadata_dtypes,
    pack_codes,
    quantize_groups,
    unpack_codes,
)
from kvlab.quant.kivi import KIVIConfig, KIVIState
from kvlab.quant.strategies import KVQuantizationStrategies

__all__ = [
    "SUPPORTED_NBITS",
    "KIVIConfig",
    "KIVIState",
    "KVQuantizationStrategies",
    "QuantizedTensor",
    "dequantize",
    "metadata_bytes",
    "metadata_dtypes",
    "pack_codes",
    "quantize_groups",
    "unpack_codes",
]
