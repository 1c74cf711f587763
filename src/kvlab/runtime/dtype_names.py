"""The model dtypes' names (the one list: :data:`MODEL_DTYPES`), their short spellings (``bf16``, ``fp16``,
``fp32``, as ``kvlab plan`` and vLLM write them) and the names kvlab records instead; torch-free, read by the command
line's ``--dtype``, by :data:`kvlab.runtime.dtypes.DTYPES` and by the configs' refusals."""

from __future__ import annotations

# the model dtypes kvlab runs models in, by the names it records (the quantization chapter's is bfloat16); the one
# list: kvlab.runtime.dtypes.DTYPES maps them to torch dtypes, kvlab.eval.config checks against it
MODEL_DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32")
# the short spellings a --dtype reads as its name (kvlab plan's and vLLM's bf16/fp16/fp32); records keep the names
DTYPE_ALIASES: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def canonical_dtype(name: object) -> object:
    """``name`` as :data:`MODEL_DTYPES` names it, in any case: ``"bf16"``/``"BF16"`` -> ``"bfloat16"``, ``"fp16"`` ->
    ``"float16"``, ``"fp32"`` -> ``"float32"`` (:data:`DTYPE_ALIASES`), ``"Float16"`` -> ``"float16"``; any other value
    unchanged, for :func:`kvlab.runtime.dtypes.parse_dtype` to accept or refuse (and name as it was given).
    Every command's model ``--dtype`` reads its value through it, so a result records the canonical name."""
    if not isinstance(name, str):
        return name
    low = name.lower()
    if low in MODEL_DTYPES:
        return low
    return DTYPE_ALIASES.get(low, name)


def accepted_dtypes_text() -> str:
    """What a model ``--dtype`` accepts, for its refusal: ``"['bfloat16', 'float16', 'float32'] (or bf16, fp16, fp32;
    any case)"``."""
    return f"{list(MODEL_DTYPES)} (or {', '.join(DTYPE_ALIASES)}; any case)"


def alias_hint(dtype: object) -> str:
    """``" (did you mean 'bfloat16'?)"`` for a short spelling of :data:`DTYPE_ALIASES` or a name in another case
    (``"BFloat16"``), which the command line reads as the name (:func:`canonical_dtype`); else ``""``."""
    full = canonical_dtype(dtype)
    return f" (did you mean {full!r}?)" if full != dtype else ""
