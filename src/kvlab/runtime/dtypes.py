"""Model dtypes by name: the three kvlab runs models in."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,  # the quantization chapter's model dtype
    "float16": torch.float16,
    "float32": torch.float32,
}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"``, ``"float16"``, ``"float32"`` (or the matching ``torch.dtype``) -> ``torch.dtype``.

    Raises:
        ValueError: any other value, named in the message.
    """
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
    elif isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"`dtype` must be one of {sorted(DTYPES)}, got {dtype!r}")
