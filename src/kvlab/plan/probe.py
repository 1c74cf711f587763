"""Local roofline probe with numpy (the mechanics chapter's appendix [C], ``probe_peak``): fp32 matmul FLOP/s and streaming GB/s.

Compute: the fastest of ``repeat`` ``n x n`` fp32 matmuls, ``2 n^3`` FLOP each. Bandwidth: the fastest of
several streaming passes (``np.copyto`` and ``np.add(x, 1, out=y)``) over an array far larger than the caches,
counting one read and one write per element. A scalar reduction such as ``x.sum()`` is latency-bound and
underestimates bandwidth about threefold (mechanics chapter [C]), so it is not used. Large, regular kernels only: small
operators do not reach these roofs. Default sizes run in a few seconds on two cores.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvlab.plan.config_fields import check_int_at_least
from kvlab.runtime.blas import get_blas_threads
from kvlab.runtime.timing import Snapshot, busy_warnings, contention


@dataclass(frozen=True)
class ProbeResult:
    """Measured fp32 roofs of this machine."""

    peak_flops: float  # best fp32 matmul FLOP/s
    bandwidth_bytes_s: float  # best streaming read+write bytes/s
    matmul_n: int  # matrix side of the matmul
    stream_bytes: int  # bytes of the streamed array (read once and written once per pass)
    seconds: float  # wall time of the whole probe
    cpu_count: int | None  # os.cpu_count() when probed
    warnings: tuple[str, ...] = ()  # the machine was busy while timing (kvlab.runtime.timing.busy_warnings)

    @property
    def ridge_flop_per_byte(self) -> float:
        return self.peak_flops / self.bandwidth_bytes_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "dtype": "float32",
            "peak_gflops": self.peak_flops / 1e9,
            "bandwidth_gb_s": self.bandwidth_bytes_s / 1e9,
            "ridge_flop_per_byte": self.ridge_flop_per_byte,
            "matmul_n": self.matmul_n,
            "stream_bytes": self.stream_bytes,
            "probe_seconds": self.seconds,
            "cpu_count": self.cpu_count,
            "warnings": list(self.warnings),
            "method": "best of n x n fp32 matmuls (2 n^3 FLOP); best of copyto / add streaming passes (read + write)",
        }


def probe(matmul_n: int = 2048, stream_elements: int = 20_000_000, repeat: int = 3) -> ProbeResult:
    """Measure fp32 matmul FLOP/s and streaming bandwidth (mechanics chapter [C] ``probe_peak``).

    Args:
        matmul_n: side of the square matrices (2048: ~17 GFLOP per matmul).
        stream_elements: fp32 elements of the streamed array (20M: 80 MB, past any CPU cache).
        repeat: timed runs of each kernel; the fastest counts.

    Returns:
        The roofs, with ``warnings`` naming a roof measured while other processes took CPU time (the same check and
        words as ``kvlab eval`` and ``kvlab lab``: :func:`kvlab.runtime.timing.busy_warnings`); a busy machine gives
        lower roofs (27 GFLOP/s under load, 98 minutes later on one 2-core machine).

    Raises:
        ValueError: a non-positive size or repeat.
    """
    for name, value in (("matmul_n", matmul_n), ("stream_elements", stream_elements), ("repeat", repeat)):
        check_int_at_least(name, value, 1)
    start = time.perf_counter()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((matmul_n, matmul_n), dtype=np.float32)
    b = rng.standard_normal((matmul_n, matmul_n), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, b, out=out)  # warm-up
    best, cpus = float("inf"), os.cpu_count() or 1
    before = Snapshot.now()
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    peak_flops = 2.0 * matmul_n**3 / best
    # the matmul runs numpy's BLAS threads (every CPU by default), the streaming passes one thread
    busy = [contention(before, Snapshot.now(), min(cpus, get_blas_threads() or cpus), cpus)]
    before = Snapshot.now()

    x = rng.standard_normal(stream_elements, dtype=np.float32)
    y = np.empty_like(x)
    best = float("inf")
    for kernel in (lambda: np.copyto(y, x), lambda: np.add(x, 1.0, out=y)):
        kernel()  # warm-up: touch the output pages
        for _ in range(repeat + 1):
            t0 = time.perf_counter()
            kernel()
            best = min(best, time.perf_counter() - t0)
    bandwidth = 2 * x.nbytes / best  # one read + one write
    busy.append(contention(before, Snapshot.now(), 1, cpus))
    warnings = busy_warnings(busy[0], "the measured GFLOP/s", None) + busy_warnings(busy[1], "the measured GB/s", None)
    return ProbeResult(
        peak_flops=peak_flops,
        bandwidth_bytes_s=bandwidth,
        matmul_n=matmul_n,
        stream_bytes=int(x.nbytes),
        seconds=time.perf_counter() - start,
        cpu_count=os.cpu_count(),
        warnings=tuple(warnings),
    )
