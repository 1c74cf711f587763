"""The model dtypes' short spellings (``bf16``, ``fp16``, ``fp32``, as ``kvlab plan`` and vLLM write them) and the
names kvlab records instead; torch-free, read by the command line's ``--dtype`` and by the configs' refusals."""

from __future__ import annotations

# the short spellings a --dtype reads as its name (kvlab plan's and vLLM's bf16/fp16/fp32); records keep the names
DTYPE_ALIASES: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def canonical_dtype(name: object) -> object:
    """``name`` as :data:`kvlab.runtime.dtypes.DTYPES` names it: ``"bf16"`` -> ``"bfloat16"``, ``"fp16"`` -> ``"float16"``, ``"fp32"`` ->
    ``"float32"`` (:data:`DTYPE_ALIASES`); any other value unchanged, for :func:`kvlab.runtime.dtypes.parse_dtype` to accept or
    refuse.
    Every command's model ``--dtype`` reads its value through it, so a result records the canonical name."""
    return DTYPE_ALIASES.get(name, name) if isinstance(name, str) else name


def alias_hint(dtype: object) -> str:
    """``" (did you mean 'bfloat16'?)"`` for a short spelling of :data:`DTYPE_ALIASES`, else ``""``."""
    full = canonical_dtype(dtype)
    return f" (did you mean {full!r}?)" if full != dtype else ""
