"""The compute roof of the CPU kernel's integer path: how fast this CPU runs the integer dot products of
:mod:`kvlab.attention.cpu_kernel`'s ``int8`` path with nothing else in the way, and how many of them a call makes.

``kvlab bench kernel`` puts this roof beside the copy bandwidth (the memory roof): a kernel's least time is the larger
of its bytes over the bandwidth and its byte products over :func:`int_roof` (the roofline model: S. Williams,
A. Waterman, D. Patterson, "Roofline: an insightful visual performance model for multicore architectures",
CACM 52(4), 2009). Where the compute roof is the larger, no kernel of this design reads its bytes at the copy
bandwidth's rate on this CPU, however well tuned.
"""

from __future__ import annotations

import time

from kvlab.attention import cpu_kernel


def int_products(q_rows: int, tokens: int, head_dim: int, nbits: int = 4) -> int:
    """Byte products the ``int8`` path computes for ``q_rows`` query rows (batch x query heads x query tokens) over
    ``tokens`` quantized tokens of ``head_dim`` channels at ``nbits`` (2 or 4): per key code and row, one per digit of
    the query (two for 4-bit keys, the 16-bit query's high and low byte; one for 2-bit keys, _kivi_int.c), and one
    per value code and row (8-bit weights): ``(digits + 1) * q_rows * tokens * head_dim``.

    Raises:
        ValueError: ``nbits`` not 2 or 4 (the widths the integer path takes).
    """
    if nbits not in (2, 4):
        raise ValueError(f"`nbits` must be 2 or 4 (the integer path's widths), got {nbits!r}")
    digits = 1 if nbits == 2 else 2
    return (digits + 1) * q_rows * tokens * head_dim


def int_roof(threads: int, path: str | None = None, rounds: int = 2_000_000, reps: int = 3) -> float | None:
    """Measured rate of instruction-set ``path``'s integer dot products on ``threads`` OpenMP threads, in byte
    products per second: the best of ``reps`` timed calls of ``kvlab_int_roof`` (_kivi_int.c: ``rounds`` rounds of
    8 independent dpbusd / maddubs+madd chains per thread, no loads). With :func:`int_products` it gives the least
    time an ``int8`` kernel call can take on this CPU. ``None`` for the scalar path (no vector dot product).

    Args:
        threads: OpenMP threads (a kernel call's :func:`kvlab.attention.cpu_kernel.threads`).
        path: one of :data:`kvlab.attention.cpu_kernel.ISAS` up to this CPU's best (default
            :func:`kvlab.attention.cpu_kernel.isa`, which honours ``KVLAB_CPU_ISA``).
    Raises:
        ValueError: ``threads``, ``rounds`` or ``reps`` not an int >= 1, or a ``path`` this CPU does not run.
        RuntimeError: the kernel is not available.
    """
    for name, value in (("threads", threads), ("rounds", rounds), ("reps", reps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be an int >= 1, got {value!r}")
    isas = cpu_kernel.ISAS
    runs = isas[: isas.index(cpu_kernel.best_isa()) + 1]
    path = path or cpu_kernel.isa()
    if path not in runs:
        raise ValueError(f"`path` must be one of {list(runs)} on this CPU, got {path!r}")
    fn, code, best = cpu_kernel._loaded("the CPU kernel").kvlab_int_roof, isas.index(path), None
    fn(code, rounds // 10 + 1, threads)  # wakes the threads and the vector units: not timed
    for _ in range(reps):
        start = time.perf_counter()
        done = fn(code, rounds, threads)
        secs = time.perf_counter() - start
        best = secs if best is None or secs < best else best
    return done / best if done else None
