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


# the GEMM timed by matmul_time_ratio: a prefill-like [tokens, hidden] x [hidden, out] product
_RATIO_SHAPE = (512, 256, 1024)


def matmul_time_ratio(
    dtype: str | torch.dtype, device: str | torch.device = "cpu", rounds: int = 3
) -> float | None:
    """How many times longer a ``dtype`` matmul takes than a float32 one on this CPU, with the current torch threads.

    CPUs without native bfloat16/float16 matrix instructions (x86 without AVX512-BF16 or AMX, for example an
    AVX2-only EPYC) run torch's bfloat16 GEMMs through a slow path: measured here on such a 2-core machine, a
    ``[512, 256] x [256, 768]`` product took 8x the float32 time. A run in that dtype then spends its time in
    prefill, and its latencies describe the emulation, not a bf16 serving CPU. The product timed is
    ``[512, 256] x [256, 1024]`` (tokens x hidden x out), best of ``rounds`` after one untimed call per dtype.

    Args:
        dtype: the model dtype (:func:`parse_dtype` names or a ``torch.dtype``).
        device: where the model runs; only a CPU is timed.
        rounds: timed calls per dtype (>= 1).

    Returns:
        ``t(dtype) / t(float32)`` (> 0), or None for float32 itself or a non-CPU device.

    Raises:
        ValueError: an unknown dtype, or ``rounds`` < 1 (each named).
    """
    import time

    dt = parse_dtype(dtype)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"`rounds` must be a positive integer, got {rounds!r}")
    if dt == torch.float32 or torch.device(device).type != "cpu":
        return None
    tokens, hidden, out = _RATIO_SHAPE
    gen = torch.Generator().manual_seed(0)
    x32 = torch.randn(tokens, hidden, generator=gen)
    w32 = torch.randn(out, hidden, generator=gen)
    best = {}
    with torch.inference_mode():
        for d in (torch.float32, dt):
            x, w = x32.to(d), w32.to(d)
            torch.nn.functional.linear(x, w)  # untimed: one-time dispatch and allocation
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                torch.nn.functional.linear(x, w)
                times.append(time.perf_counter() - t0)
            best[d] = min(times)
    return best[dt] / max(best[torch.float32], 1e-9)
