"""Benchmark ``kernel``: achieved bandwidth of the quantized decode attention.

Decode attention is bandwidth-bound (docs/plan.md, "Roofline": arithmetic intensity ``g`` FLOP/byte for a GQA group of
``g``), so its figure of merit is bytes read per second against the device's measured copy bandwidth:

* ``kivi``: :func:`kvlab.attention.quantized.kivi_attention` of one query token over a KIVI layer of ``T`` tokens;
  bytes = packed codes + scales/zeros + full-precision residual (:meth:`KIVIState.nbytes_breakdown` ``total``);
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (GQA) over a bf16 K/V of the same ``T`` tokens;
  bytes = K + V;
* ``copy``: ``dst.copy_(src)`` of a large tensor, read + write bytes / time, the best of ``reps`` (the mechanics chapter's
  appendix [C] probe's convention: a streaming copy, not a reduction, and the fastest pass as the roof).

Kernel times are medians of ``reps`` calls after warm-up, KIVI and SDPA sampled alternately (rotated order). Target: on an H200, ``kivi`` >= 70 % of the
copy bandwidth at >= 32k tokens; on CPU the numbers are reported only. On the CPU a kernel whose bytes fit the
last-level cache is marked ``in_cache`` (its GB/s may come from that cache, not DRAM): a target counts it when it
falls short, never as met (:mod:`kvlab.bench.cache_resident`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from kvlab.bench.cache_resident import last_level_cache, mark_in_cache
from kvlab.bench.cells import bench_contexts, failed_cell
from kvlab.bench.cpu_targets import evaluate_cpu_targets
from kvlab.bench.decode import kivi_cpu_path
from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.runtime.checks import check_int
from kvlab.runtime.device import resolve_device, synchronize
from kvlab.runtime.dtypes import parse_dtype
from kvlab.runtime.timing import Snapshot, busy_warnings, contention

CPU_CONTEXTS = (1024, 4096, 16384, 32768)
CUDA_CONTEXTS = (4096, 16384, 32768, 65536, 131072)
QUICK_CONTEXTS = (512, 2048)
TARGET_FRACTION = 0.70  # kivi GB/s / copy GB/s, CUDA, at >= TARGET_MIN_CONTEXT tokens
TARGET_MIN_CONTEXT = 32768


def time_seconds(
    fn: Callable[[], Any], device: torch.device, reps: int, warmup: int = 2, inner: int = 1
) -> list:
    """Seconds per call of ``fn``: ``reps`` samples, each the mean of ``inner`` back-to-back calls (CUDA events on
    CUDA, ``time.perf_counter`` on CPU), after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(reps):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop) / 1000.0 / inner)
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) / inner)
    return samples


def interleaved_seconds(
    fns: list[Callable[[], Any]], device: torch.device, reps: int, warmup: int = 2, inner: int = 1
) -> list[list]:
    """:func:`time_seconds` of several functions sample by sample: each round takes one sample of every function,
    in an order rotated per round, so load from other processes falls on all of them alike. Returns one list of
    ``reps`` samples per function."""
    out: list[list] = [[] for _ in fns]
    for fn in fns:
        for _ in range(warmup):
            fn()
    for rnd in range(reps):
        order = list(range(len(fns)))
        order = order[rnd % len(fns) :] + order[: rnd % len(fns)]
        for i in order:
            out[i] += time_seconds(fns[i], device, reps=1, warmup=0, inner=inner)
    return out


def copy_bandwidth(device: torch.device, nbytes: int, reps: int = 5) -> dict:
    """Measured copy bandwidth: ``dst.copy_(src)`` of ``nbytes`` bytes, ``2 * nbytes`` (read + write) / time.

    Returns ``{"bytes", "best_gb_s", "median_gb_s"}`` (GB = 1e9 bytes); ``best_gb_s`` is the roof.
    """
    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    secs = time_seconds(lambda: dst.copy_(src), device, reps, warmup=1)
    moved = 2 * n * 4
    return {
        "bytes": n * 4,
        "best_gb_s": moved / min(secs) / 1e9,
        "median_gb_s": moved / statistics.median(secs) / 1e9,
    }


def _kernels(state, q, k, v, nbits, group_size, scale, backend, dev) -> dict:
    """``{name: (fn, bytes)}`` of one KIVI state: ``kivi<b>`` (:func:`kivi_attention` with ``backend``) and, on a
    CPU where the compiled kernel runs and takes the problem, ``kivi<b>-int8`` (its integer key scores and value
    sums, :mod:`kvlab.attention.cpu_kernel`)."""
    from kvlab.attention import cpu_kernel
    from kvlab.attention.quantized import kivi_attention

    segments = list(state.segments())
    kw, vw = state.key_residual, state.value_residual
    nbytes = state.nbytes_breakdown()["total"]
    out = {
        f"kivi{nbits}": (
            lambda: kivi_attention(q, segments, kw, vw, nbits, group_size, scale, backend=backend),
            nbytes,
        )
    }
    if (
        dev.type == "cpu"
        and cpu_kernel.unavailable_reason() is None
        and cpu_kernel.int8_supported(nbits, q.shape[-1])
        and cpu_kernel.unsupported(q, segments, kw, vw) is None  # a float16 layer: KeyError inside, every row
    ):
        offset = kw.shape[2] - 1
        out[f"kivi{nbits}-int8"] = (
            lambda: cpu_kernel.decode_attention(
                q, segments, kw, vw, nbits, group_size, scale, None, offset, dot="int8"
            ),
            nbytes,
        )
    return out


def _cell(context, shape, kivi, dtype, device, reps, inner, gen) -> dict:
    """One context: every kernel of :func:`_kernels` for each of ``kivi``'s bit widths, the float baseline
    (:func:`kvlab.attention.cpu_baseline.float_decode_attention` over the bf16 K/V, on the CPU) and SDPA,
    sampled interleaved. ``kivi``: ``(nbits tuple, group_size, residual_length, backend)``."""
    from kvlab.attention import cpu_baseline, cpu_kernel
    from kvlab.attention.cpu_roof import int_products
    from kvlab.quant.kivi import KIVIConfig, KIVIState

    nbits_list, group_size, residual_length, backend = kivi
    b, hq, hkv, d = shape["batch"], shape["q_heads"], shape["kv_heads"], shape["head_dim"]
    k = torch.randn(b, hkv, context, d, generator=gen).to(device, dtype)
    v = torch.randn(b, hkv, context, d, generator=gen).to(device, dtype)
    q = torch.randn(b, hq, 1, d, generator=gen).to(device, dtype)
    scale = d**-0.5
    breakdown, quantized = {}, {}
    with torch.inference_mode():
        fns = {}
        for nb in nbits_list:
            state = KIVIState(KIVIConfig(nb, group_size, residual_length))
            state.append(k, v)
            breakdown[nb] = state.nbytes_breakdown()
            quantized[f"kivi{nb}-int8"] = (context - state.key_residual.shape[2], nb)  # the window's are fp
            fns |= _kernels(state, q, k, v, nb, group_size, scale, backend, device)
        if (
            device.type == "cpu"
            and cpu_kernel.unavailable_reason() is None
            and cpu_baseline.float_unsupported(q, k, v) is None
        ):
            fns[f"float-{shape['dtype']}"] = (lambda: cpu_baseline.float_decode_attention(q, k, v, scale), 0)
        fns["sdpa"] = (
            lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=hq != hkv),
            0,
        )
        graphed, graph_errors = _graphed(fns) if device.type == "cuda" else ({}, {})
        fns |= graphed
        names = list(fns)
        secs = interleaved_seconds([fns[n][0] for n in names], device, reps, inner=inner)
    kernels = {}
    for name, samples in zip(names, secs, strict=True):
        nbytes = fns[name][1] or k.nbytes + v.nbytes
        med = statistics.median(samples)
        kernels[name] = {"bytes": nbytes, "us": med * 1e6, "gb_s": nbytes / med / 1e9}
        if name in quantized:  # the byte products its integer dots make
            kernels[name]["products"] = int_products(b * hq, quantized[name][0], d, quantized[name][1])
    row = _legacy_row(context, kernels, breakdown[nbits_list[0]], f"kivi{nbits_list[0]}")
    if graph_errors:
        row["graph_errors"] = graph_errors
    return row


def _graphed(fns: dict) -> tuple[dict, dict]:
    """CUDA only: ``({name + "-graph": (replay, bytes)}, {name: why it could not be captured})`` for the KIVI
    kernels and SDPA of ``fns``, each call captured once in a ``torch.cuda.CUDAGraph`` and timed by replaying it: the device's time for the work with the host's
    per-launch cost taken out (how a serving engine's graph-captured decode runs it, e.g. vLLM's CUDA graphs), beside
    the eager call a user's ``forward`` pays. A call that cannot be captured gets no column, and its reason is
    kept (the row's ``graph_errors``)."""
    out, errors = {}, {}
    for name, (fn, nbytes) in fns.items():
        if not (name.startswith("kivi") or name == "sdpa"):
            continue
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                fn()
        except RuntimeError as e:  # a host sync or CPU tensor inside the call: no graph column
            errors[name] = f"{type(e).__name__}: {e}"[:300]
            continue
        out[f"{name}-graph"] = (graph.replay, nbytes)
    return out, errors


def _legacy_row(context: int, kernels: dict, breakdown: dict, first: str) -> dict:
    """A row: the first bit width's ``kivi_*`` and SDPA's ``sdpa_*`` keys (as records before the integer path and
    the float baseline had them), and ``kernels``: every kernel's ``bytes``, ``us``, ``gb_s``."""
    kv, sd = kernels[first], kernels["sdpa"]
    return {
        "context": context,
        "status": "ok",
        "kivi_bytes": kv["bytes"],
        "kivi_bytes_breakdown": {key: breakdown[key] for key in ("codes", "scales_zeros", "residual")},
        "kivi_us": kv["us"],
        "kivi_gb_s": kv["gb_s"],
        "sdpa_bytes": sd["bytes"],
        "sdpa_us": sd["us"],
        "sdpa_gb_s": sd["gb_s"],
        "kivi_time_over_sdpa": kv["us"] / sd["us"],
        "kernels": kernels,
    }


def run(
    contexts: tuple[int, ...] | None = None,
    batch: int = 1,
    q_heads: int = 32,
    kv_heads: int = 8,
    head_dim: int = 128,
    dtype: str = "bfloat16",
    nbits: int | tuple[int, ...] | list[int] = (4, 2),
    group_size: int = KIVI_DEFAULTS.group_size,
    residual_length: int = KIVI_DEFAULTS.residual_length,
    reps: int = 11,
    copy_bytes: int | None = None,
    device: str | None = "cpu",
    quick: bool = False,
    progress: Any = None,
    seed: int = 0,
    backend: str = "auto",
    **_: object,
) -> dict:
    """Achieved GB/s of the KIVI decode attention and of SDPA on bf16, against the copy bandwidth.

    Args:
        contexts: tokens of the layer (default 1k..32k on CPU, 4k..128k on CUDA; ``quick``: 512 and 2048).
        batch / q_heads / kv_heads / head_dim / dtype: one attention layer, default Llama-3-8B's (GQA 32/8, 128).
        nbits: the KIVI bit width(s) measured side by side (default 4 and 2); group_size / residual_length: the
            KIVI settings.
        reps: timed samples per kernel (``quick``: 3); CUDA samples average 10 calls each.
        backend: :func:`kivi_attention`'s ``backend``: ``auto`` (Triton on CUDA when it can run; on the CPU the
            compiled kernel when it builds, torch otherwise), ``torch``, ``cpu-kernel`` or ``triton``.
        copy_bytes: bytes of the copy probe (default 256 MiB on CPU, 1 GiB on CUDA; ``quick``: 32 MiB).
        progress: optional ``callable(str)`` told about each cell before it runs.

    Returns:
        ``{"device", "shape", "settings", "copy", "rows", "target", "cpu_targets"}``; each row has ``kernels``:
        ``{name: {"bytes", "us", "gb_s", "fraction_of_copy"}}`` for ``kivi<b>`` (the ``backend`` path),
        ``kivi<b>-int8`` (the CPU kernel's integer path, where it runs), ``float-<dtype>`` (the float C
        baseline, CPU) and ``sdpa``; the first bit width's ``kivi_bytes``, ``kivi_us``, ``kivi_gb_s``,
        ``sdpa_bytes``, ``sdpa_us``, ``sdpa_gb_s``, ``kivi_time_over_sdpa``, ``kivi_fraction_of_copy`` /
        ``sdpa_fraction_of_copy`` (GB/s over ``copy["best_gb_s"]``, the higher of the copy probes before and after
        the kernels: :func:`_copy_both_ends`) as before; or ``status`` ``failed`` with
        ``error``. A kernel whose bytes fit the CPU's last-level cache (``last_level_cache``: ``{"bytes", "level",
        "source"}``, None off the CPU or where unknown) has ``in_cache: true`` (``kivi_in_cache`` /
        ``sdpa_in_cache`` on the row): its fraction of copy is not a DRAM figure (:mod:`kvlab.bench.cache_resident`). ``settings``: ``kivi_cpu_path`` (the CPU path ``auto`` took), ``int8_paths`` (the key/value path
        each ``-int8`` kernel ran: ``int8 (avx512)`` ...), ``isa`` and ``float_baseline``.
    Raises:
        ValueError: bad contexts, reps, device or dtype, or a layer shape, KIVI setting, copy size or backend
            that could not run (each named before anything is measured).
    """
    dev = resolve_device(device)
    contexts = bench_contexts(contexts, quick, dev.type, (QUICK_CONTEXTS, CPU_CONTEXTS, CUDA_CONTEXTS))
    if quick:
        reps = min(reps, 3)
    if reps < 1:
        raise ValueError(f"`reps` must be >= 1, got {reps!r}")
    if copy_bytes is None:
        copy_bytes = 32 * 2**20 if quick else (2**30 if dev.type == "cuda" else 256 * 2**20)
    torch_dtype = parse_dtype(dtype)
    nbits = (nbits,) if isinstance(nbits, int) else tuple(nbits)
    shape = dict(batch=batch, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype)
    _check_problem(shape, nbits, group_size, residual_length, copy_bytes, backend, dev, contexts)
    start = Snapshot.now()
    copy = copy_bandwidth(dev, copy_bytes, reps=max(3, min(reps, 7)))
    roof = int_roof_record(dev, nbits)
    gen = torch.Generator().manual_seed(seed)
    inner = 10 if dev.type == "cuda" else 1
    kivi = (nbits, group_size, residual_length, backend)
    rows = [_row(c, shape, kivi, torch_dtype, dev, reps, inner, gen, progress) for c in contexts]
    copy = _copy_both_ends(copy, copy_bandwidth(dev, copy_bytes, reps=max(3, min(reps, 7))))
    cache = last_level_cache() if dev.type == "cpu" else None  # a GPU kernel reads the GPU's memory
    for row in rows:
        _fractions(row, copy["best_gb_s"], roof and roof["products_per_s"])
        mark_in_cache(row, cache)
    result = _result(dev, shape, _settings(dev, kivi, reps, inner, head_dim, dtype), copy, roof, rows, start)
    result["last_level_cache"] = cache
    result["target"] = evaluate_target(result)
    result["cpu_targets"] = evaluate_cpu_targets(result)
    return result


def _result(dev, shape: dict, settings: dict, copy: dict, roof: dict | None, rows: list, start: Snapshot) -> dict:
    """The record's result of :func:`run` (before its targets): the integer paths and roof only where an integer
    kernel ran (a float16 layer runs none), and the busy-machine warnings of the run since ``start``."""
    ran = {name for r in rows for name in r.get("kernels", {})}
    if "int8_paths" in settings:  # a float16 layer or a failed row: no integer kernel to name, no roof to state
        settings["int8_paths"] = {n: p for n, p in settings["int8_paths"].items() if n in ran}
        roof = roof if settings["int8_paths"] else None
    threads = torch.get_num_threads() if dev.type == "cpu" else 1
    return {
        "device": str(dev),
        "device_type": dev.type,
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "shape": shape,
        "settings": settings,
        "copy": copy,
        "int_roof": roof,
        "contexts": [r["context"] for r in rows],
        "rows": rows,
        "warnings": busy_warnings(
            contention(start, Snapshot.now(), threads), "the copy bandwidth, the integer roof and every kernel time"
        )
        + _copy_warning(copy),
    }


def _settings(dev: torch.device, kivi: tuple, reps: int, inner: int, head_dim: int, dtype: str) -> dict:
    """The record's settings: the KIVI ones (``kivi``: ``(nbits tuple, group_size, residual_length, backend)``),
    samples, threads and the paths that ran (:func:`_cpu_paths`)."""
    nbits, group_size, residual_length, backend = kivi
    return {
        "nbits": list(nbits),
        "group_size": group_size,
        "residual_length": residual_length,
        "reps": reps,
        "calls_per_sample": inner,
        "backend": backend,
        "threads": torch.get_num_threads(),
        "kivi_cpu_path": kivi_cpu_path(dev) if backend in ("auto", "cpu-kernel") else None,
        **_cpu_paths(dev, nbits, head_dim, dtype, group_size),
    }


def _cpu_paths(dev: torch.device, nbits: tuple, head_dim: int, dtype: str, group_size: int) -> dict:
    """The record's names of the CPU paths: ``isa`` (:func:`kvlab.attention.cpu_kernel.isa`), ``int8_paths``
    (:func:`~kvlab.attention.cpu_kernel.key_score_path` of each bit width) and ``float_baseline``; empty off the
    CPU or where the kernel does not build."""
    from kvlab.attention import cpu_kernel

    if dev.type != "cpu" or cpu_kernel.unavailable_reason() is not None:
        return {}
    isa = cpu_kernel.isa()
    return {
        "isa": f"{isa} (best on this CPU: {cpu_kernel.best_isa()})",
        "int8_paths": {f"kivi{b}-int8": cpu_kernel.key_score_path(b, head_dim, "int8", group_size) for b in nbits},
        "float_baseline": f"C kernel over {dtype} K/V, fp32 accumulation ({isa})",
    }


def _check_copy_fits(copy_bytes: int, dev: torch.device) -> None:
    """Raise ``ValueError`` naming ``--copy-mib`` when the copy probe's two buffers (:func:`copy_bandwidth`) pass the
    free memory of ``dev`` (the machine's available memory on a CPU)."""
    from kvlab.lab.longrun import memory_refusal
    from kvlab.runtime.provenance import available_memory_bytes

    free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else available_memory_bytes()
    problem = memory_refusal(f"--copy-mib {copy_bytes // 2**20:,} (two buffers)", 2 * copy_bytes, free)
    if problem:
        raise ValueError(problem)


def _check_problem(
    shape: dict, nbits, group_size, residual_length, copy_bytes, backend, dev, contexts
) -> None:
    """Raise ``ValueError`` naming the flag of a layer shape, KIVI setting, copy-probe size or backend that could not
    run on ``dev`` at ``contexts`` (a zero head count divided by zero, a negative copy size crashed inside torch, an
    impossible nbits ran every cell to a failed row and exited 0, ``--backend triton`` on a CPU, a group of
    ``group_size x nbits`` bits that is not whole bytes, or ``--residual-length 0`` at a multiple of the group size
    failed every row after the copy probe), or a context below ``residual_length + group_size``, where KIVI holds
    every token in full precision and the ``kivi<b>`` rows timed no quantized token under the KIVI label)."""
    from kvlab.attention.quantized import BACKENDS
    from kvlab.quant import KIVIConfig

    for name in ("batch", "q_heads", "kv_heads", "head_dim"):
        check_int(name, shape[name], 1, flag="--" + name.replace("_", "-"))
    if shape["q_heads"] % shape["kv_heads"]:
        raise ValueError(  # each KV head serves a whole group of query heads
            f"`q_heads` (--q-heads) {shape['q_heads']} must be a multiple of `kv_heads` (--kv-heads) "
            f"{shape['kv_heads']}"
        )
    if not nbits or len(set(nbits)) != len(nbits):
        raise ValueError(f"--nbits must name distinct bit widths, got {list(nbits)}")
    head_dim = shape["head_dim"]
    for nb in nbits:
        KIVIConfig(nb, group_size, residual_length)  # nbits, group_size, residual_length, each named
        if head_dim % group_size or head_dim * nb % 8 or group_size * nb % 8:
            raise ValueError(
                f"--group-size {group_size} must divide --head-dim {head_dim} (values are grouped per token "
                f"along channels), and head_dim x nbits ({head_dim} x {nb}) and group_size x nbits "
                f"({group_size} x {nb}) must fill whole bytes"
            )
    short = [c for c in contexts if c < residual_length + group_size]
    if short:  # KIVI quantizes nothing below R + G tokens: a kivi<b> row would time the float window only
        raise ValueError(
            f"--contexts {short[0]} is below --residual-length {residual_length} + --group-size {group_size} "
            f"= {residual_length + group_size} tokens: KIVI keeps all of it in the full-precision window, so its "
            f"kivi rows would time no quantized token; give contexts >= {residual_length + group_size}"
        )
    empty = [c for c in contexts if residual_length == 0 and c % group_size == 0]
    if empty:  # every token quantized: no window holds the query's own token (each row failed on it)
        raise ValueError(
            f"--residual-length 0 quantizes all of --contexts {empty[0]} (a multiple of --group-size "
            f"{group_size}), leaving no full-precision window for the query's token: give --residual-length >= 1 "
            "or contexts that are not multiples of the group size"
        )
    if copy_bytes is not None:
        check_int("copy_bytes", copy_bytes, 1, flag="--copy-mib")
        _check_copy_fits(copy_bytes, dev)
    if backend not in BACKENDS:
        raise ValueError(f"`backend` (--backend) must be one of {list(BACKENDS)}, got {backend!r}")
    if backend == "triton":
        from kvlab.attention.triton_kivi import triton_refusal

        for nb in nbits:
            why = triton_refusal(torch.empty(0, device=dev), head_dim, nb, group_size)
            if why is not None:
                raise ValueError(f"`backend` (--backend) 'triton' cannot run --nbits {nb}: {why}")


def _row(context, shape, kivi, torch_dtype, dev, reps, inner, gen, progress) -> dict:
    """One context's :func:`_cell`; a failure is recorded (:func:`kvlab.bench.cells.failed_cell`) with the context.
    ``kivi``: ``(nbits tuple, group_size, residual_length, backend)``; ``progress`` (optional) is told first."""
    if progress:
        progress(f"kernel: {context} tokens")
    try:
        return _cell(context, shape, kivi, torch_dtype, dev, reps, inner, gen)
    except Exception as e:  # noqa: BLE001 - recorded per cell
        return {"context": context, **failed_cell(e)}
    finally:
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def _fractions(row: dict, copy_gb_s: float, products_per_s: float | None) -> None:
    """Add to a measured row every kernel's GB/s as a fraction of ``copy_gb_s`` and, for the integer kernels, their
    compute roof at ``products_per_s`` (:func:`_roofed`); a failed row is left as it is."""
    if row.get("status") == "failed":
        return
    row["kivi_fraction_of_copy"] = row["kivi_gb_s"] / copy_gb_s
    row["sdpa_fraction_of_copy"] = row["sdpa_gb_s"] / copy_gb_s
    for k in row["kernels"].values():
        k["fraction_of_copy"] = k["gb_s"] / copy_gb_s
        if "products" in k and products_per_s:
            _roofed(k, products_per_s, copy_gb_s)


COPY_DRIFT = 0.15  # the copy probes before and after the kernels differ by more: the record warns


def _copy_both_ends(before: dict, after: dict) -> dict:
    """The run's copy bandwidth from the probes before and after the kernels (:func:`copy_bandwidth` each):
    ``best_gb_s`` / ``median_gb_s`` the higher of the two (the conservative roof: a fraction of copy is never taken
    against a slow moment of the machine), ``before_best_gb_s`` / ``after_best_gb_s`` each probe's best, and
    ``drift`` (``after / before - 1``). On a shared 2-core VM the 2-thread probe read 31.9 GB/s in one run and 42.6
    in the next (2026-12-05): one probe could move a 50 %-of-copy verdict by a third."""
    return {
        "bytes": before["bytes"],
        "best_gb_s": max(before["best_gb_s"], after["best_gb_s"]),
        "median_gb_s": max(before["median_gb_s"], after["median_gb_s"]),
        "before_best_gb_s": before["best_gb_s"],
        "after_best_gb_s": after["best_gb_s"],
        "drift": after["best_gb_s"] / before["best_gb_s"] - 1.0,
    }


def _copy_warning(copy: dict) -> list[str]:
    """A warning when the copy probes before and after the kernels differ by more than :data:`COPY_DRIFT`."""
    if abs(copy.get("drift", 0.0)) <= COPY_DRIFT:
        return []
    return [
        f"the copy bandwidth moved during the run: {copy['before_best_gb_s']:.1f} GB/s before the kernels, "
        f"{copy['after_best_gb_s']:.1f} after ({copy['drift']:+.0%}); every fraction of copy uses the higher, and "
        "the kernel times may have moved with it: rerun on a quieter machine to compare"
    ]


def _roofed(kernel: dict, products_per_s: float, copy_gb_s: float) -> None:
    """Add an integer kernel's compute roof to its entry: ``roof_us`` (its byte products at ``products_per_s``, the
    least time this design takes on this CPU), ``fraction_of_roof`` (``roof_us`` over its time) and
    ``roof_fraction_of_copy`` (its bytes over ``roof_us`` as a fraction of the copy bandwidth: the most of
    :data:`CPU_FRACTION`'s measure this design can reach here)."""
    roof_s = kernel["products"] / products_per_s
    kernel["roof_us"] = roof_s * 1e6
    kernel["fraction_of_roof"] = roof_s * 1e6 / kernel["us"]
    kernel["roof_fraction_of_copy"] = kernel["bytes"] / roof_s / 1e9 / copy_gb_s


def int_roof_record(dev: torch.device, nbits: tuple) -> dict | None:
    """The integer compute roof of this run (:func:`kvlab.attention.cpu_roof.int_roof` on the threads a long call
    uses), or ``None`` off the CPU, without the compiled kernel, or on the scalar path: ``{"path", "threads",
    "products_per_s", "gmac_s"}`` (gmac_s: 1e9 byte products per second)."""
    from kvlab.attention import cpu_kernel, cpu_roof

    if dev.type != "cpu" or cpu_kernel.unavailable_reason() is not None or not nbits:
        return None
    threads = torch.get_num_threads()
    rate = cpu_roof.int_roof(threads)
    if rate is None:
        return None
    return {"path": cpu_kernel.isa(), "threads": threads, "products_per_s": rate, "gmac_s": rate / 1e9}


def evaluate_target(result: dict) -> dict:
    """Kernel target: on CUDA (an H200), KIVI attention >= 70 % of the copy bandwidth at every measured
    context >= 32768 tokens, a row marked ``kivi_in_cache`` not counted. On CPU the status is ``not applicable``
    (reported only)."""
    desc = (
        f"KIVI attention >= {TARGET_FRACTION:.0%} of copy bandwidth at >= {TARGET_MIN_CONTEXT} tokens (H200)"
    )
    if result["device_type"] != "cuda":
        return {"description": desc, "status": "not applicable", "detail": "CPU run: reported only"}
    fr = {
        r["context"]: r["kivi_fraction_of_copy"]
        for r in result["rows"]
        if r["status"] == "ok" and r["context"] >= TARGET_MIN_CONTEXT and not r.get("kivi_in_cache")
    }
    if not fr:  # a row whose KIVI bytes fit the cache (kvlab.bench.cache_resident) is no DRAM figure
        cached = any(r["status"] == "ok" and r["context"] >= TARGET_MIN_CONTEXT for r in result["rows"])
        detail = "every context >= 32768 fits the last-level cache" if cached else "no context >= 32768 measured"
        return {"description": desc, "status": "not measured", "detail": detail}
    detail = ", ".join(f"{v:.0%} at {c}" for c, v in sorted(fr.items()))
    first = f"kivi{result.get('settings', {}).get('nbits', ['?'])[0]}"
    graphs = {r["context"]: r.get("kernels", {}).get(f"{first}-graph") for r in result["rows"] if r["status"] == "ok"}
    graph = {c: k["fraction_of_copy"] for c, k in graphs.items() if k and not k.get("in_cache")}
    if graph:  # reported beside the target, which stays on the eager call a user's forward pays
        detail += "; CUDA-graph replay " + ", ".join(f"{v:.0%} at {c}" for c, v in sorted(graph.items()))
    status = "met" if all(v >= TARGET_FRACTION for v in fr.values()) else "not met"
    return {
        "description": desc,
        "status": status,
        "detail": f"{detail} on {result['device_name']}",
        "fractions": fr,
    }
