"""Attention over kvlab caches: fused KIVI decode attention (no float copy of the quantized history).

* :func:`kvlab.attention.quantized.kivi_attention` — the math (CPU/any torch device; the torch path in
  :mod:`kvlab.attention.torch_kivi`, the argument checks in :mod:`kvlab.attention.kivi_checks`).
* :func:`kvlab.attention.interface.enable` — plug it into a transformers model (``AttentionInterface``).
"""

from kvlab.attention.interface import enable, is_enabled
from kvlab.attention.quantized import kivi_attention

__all__ = ["enable", "is_enabled", "kivi_attention"]
