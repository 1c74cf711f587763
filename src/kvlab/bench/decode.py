"""Benchmark ``decode``: ms per decoded token against context for every cache, in one run.

Per context, the prompt is prefilled once, exactly (``DynamicCache``, SDPA, in chunks), and its keys/values are
written into a fresh cache of every kind with one ``update`` per layer: the state a single-chunk prefill leaves
(:func:`kvlab.bench.prepare.fill_cache`). Then ``warmup`` untimed and ``steps`` timed rounds follow; a round decodes the same next
token of the held-out continuation (teacher-forced) through every cache, in an order rotated each round, so load
from other processes falls on all caches alike. The median is TPOT without ``generate()``'s overhead (the
quantization chapter times the same forward inside ``generate``). Ratios divide each cache's median by ``dynamic``'s at the same
context. A cell that fails (out of memory, a backend error) is recorded with its error, never fatal.

Caches: any name of the cache registry (:mod:`kvlab.caches.registry`), in its grammar (``kivi-4-fused``) or the
spelling this benchmark used first (``kivi4-fused``, ``hqq4``); the defaults:

* ``dynamic`` — transformers ``DynamicCache``, SDPA attention (the baseline);
* ``kivi<N>-fused`` — :class:`kvlab.caches.KIVICache` ``attention="fused"`` with :func:`kvlab.attention.enable`:
  the attention reads packed codes, no float copy of the quantized history;
* ``kivi<N>-dequant`` — the same cache, ``attention="dequantize"``: the history is dequantized every step, SDPA;
* ``hqq<N>`` / ``quanto<N>`` — transformers ``QuantizedCache`` (HQQ axis 1 as in the quantization chapter, quanto axis 0),
  recorded as skipped when the backend is not installed;
* on request: ``kivi4:dot=int8`` — the fused KIVI cache on the CPU kernel's integer path; ``dynamic-ckernel`` —
  ``DynamicCache`` with its decode attention in kvlab's float C kernel (:mod:`kvlab.caches.float_kernel`), the
  fair float baseline. Each row of a cache whose kvlab attention chooses a path names the one that ran
  (``key_score_path``).

Target: ``kivi4-fused`` <= 1.10x ``dynamic`` at 4096 tokens on CPU; <= 1.0x at >= 32k tokens on an H200. In a record
with ``kivi4:dot=int8`` and ``dynamic-ckernel`` (CPU): the integer path's time per token <= the float kernel
baseline's at every context (:func:`evaluate_int8_target`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from kvlab.bench.cells import bench_contexts, failed_cell
from kvlab.bench.prepare import (
    BenchCandidate,
    bench_settings,
    check_model_shape,
    check_room,
    decode_step,
    exact_prefill,
    fill_cache,
    load_prompted_model,
    parse_candidates,
    set_attention,
)
from kvlab.bench.results import display_name as shown_name
from kvlab.caches.registry import CacheSettings
from kvlab.runtime.checks import check_int
from kvlab.runtime.device import resolve_device, synchronize
from kvlab.runtime.dtypes import cpu_matmul_mode, cpu_matmul_policy

DEFAULT_CANDIDATES = ("dynamic", "kivi4-fused", "kivi4-dequant", "kivi2-fused", "hqq4", "quanto4")
CPU_CONTEXTS = (1024, 2048, 4096, 8192, 16384)
CUDA_CONTEXTS = (1024, 4096, 16384, 32768, 65536, 131072)
QUICK_CONTEXTS = (256, 512)
TARGET_CPU_RATIO = 1.10  # kivi4-fused / dynamic at TARGET_CPU_CONTEXT tokens, CPU
TARGET_CPU_CONTEXT = 4096
TARGET_GPU_RATIO = 1.0  # kivi4-fused / dynamic at >= TARGET_GPU_MIN_CONTEXT tokens, H200
TARGET_GPU_MIN_CONTEXT = 32768
TARGET_CANDIDATE = "kivi4-fused"  # the records' key; shown as kivi-4-fused (kvlab.bench.results.display_name)
# CPU lead targets (quantized decode ahead of every peer at every context): kivi4-fused <= 1.00x dynamic at every context and <= 0.50x at 16384 tokens;
# kivi2-fused / kivi4-fused <= 0.9 from 4096 tokens on; both fused caches faster than hqq4 at every context
LEAD_MAX_RATIO, LEAD_LONG_CONTEXT, LEAD_LONG_RATIO = 1.00, 16384, 0.50
LEAD_BITS_MIN_CONTEXT, LEAD_BITS_RATIO = 4096, 0.9


def _time_context(model, cands, settings, ids, context, steps, warmup, chunk, device) -> dict[str, dict]:
    """Rows (without candidate/context) of every runnable candidate at ``context``, timed interleaved."""
    from kvlab.caches.measure import cache_nbytes

    out: dict[str, dict] = {}
    with torch.inference_mode():
        synchronize(device)
        t0 = time.perf_counter()
        source = exact_prefill(model, ids[:, :context], chunk)
        synchronize(device)
        prefill_s = time.perf_counter() - t0
        caches = {}
        for cand in cands:
            try:
                cache = cand.make(model.config, settings)
                t0 = time.perf_counter()
                fill_cache(cache, source)
                synchronize(device)
                out[cand.name] = {"fill_s": time.perf_counter() - t0, "times_ms": []}
                caches[cand.name] = (cand, cache)
            except Exception as e:  # noqa: BLE001 - recorded per cell
                out[cand.name] = failed_cell(e)
        del source
        for i in range(warmup + steps):
            token = ids[:, context + i : context + i + 1]
            names = list(caches)
            shift = i % max(1, len(names))
            for name in names[shift:] + names[:shift]:  # rotate the order: no cache always runs first
                cand, cache = caches[name]
                try:
                    out[name]["attention"] = set_attention(model, cand)
                    synchronize(device)
                    t0 = time.perf_counter()
                    decode_step(model, token, cache)
                    synchronize(device)
                    elapsed_ms = (time.perf_counter() - t0) * 1000.0
                except Exception as e:  # noqa: BLE001
                    out[name] = failed_cell(e)
                    del caches[name]
                    continue
                if i >= warmup:
                    out[name]["times_ms"].append(elapsed_ms)
    for name, (_, cache) in caches.items():
        times = out[name]["times_ms"]
        if callable(getattr(cache, "attention_paths", None)) and cache.attention_paths():
            out[name]["key_score_path"] = "; ".join(cache.attention_paths())  # what its kvlab attention ran
        out[name] |= {
            "status": "ok",
            "median_ms": statistics.median(times),
            "mean_ms": statistics.fmean(times),
            "min_ms": min(times),
            "prefill_s": prefill_s,
            "cache_bytes": cache_nbytes(cache),
        }
    return out


def profile_step(
    model: Any,
    cand: BenchCandidate,
    settings: CacheSettings,
    ids: torch.Tensor,
    context: int,
    chunk: int,
    steps: int = 8,
    top: int = 15,
) -> list[dict]:
    """``torch.profiler`` of ``steps`` decode steps after a prefill of ``context`` tokens (and two warm-up steps):
    the ``top`` operators by self CPU time, per step: ``[{"op", "calls", "self_cpu_ms", "cpu_total_ms"}]``."""
    from torch.profiler import ProfilerActivity, profile

    cache = cand.make(model.config, settings)
    with torch.inference_mode():
        fill_cache(cache, exact_prefill(model, ids[:, :context], chunk))
        set_attention(model, cand)
        for i in range(2):  # warm-up
            decode_step(model, ids[:, context + i : context + i + 1], cache)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(2, 2 + steps):
                decode_step(model, ids[:, context + i : context + i + 1], cache)
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [
        {
            "op": e.key,
            "calls": e.count / steps,
            "self_cpu_ms": e.self_cpu_time_total / 1000.0 / steps,
            "cpu_total_ms": e.cpu_time_total / 1000.0 / steps,
        }
        for e in rows
    ]


# Decode steps profile_step times (after two warm-up steps) when run() profiles.
PROFILE_STEPS = 8

# How run() times a cell, recorded in its result's settings.
TIMING = (
    "one exact prefill per context (DynamicCache, SDPA) written into every cache; then `warmup` + `steps` rounds, "
    "each decoding one token through every cache in rotated order; the median of the `steps` timed forwards"
)


def run(
    model: Any = None,
    contexts: tuple[int, ...] | None = None,
    candidates: tuple[str, ...] = DEFAULT_CANDIDATES,
    steps: int = 16,
    warmup: int = 3,
    device: str | None = "cpu",
    dtype: str = "bfloat16",
    prefill_chunk_tokens: int = 1024,
    cache_settings: CacheSettings | None = None,
    profile_context: int | None = None,
    quick: bool = False,
    progress: Any = None,
    cpu_matmul: str = "auto",
) -> dict:
    """Decode ms/token for every cache at every context, in one run.

    Args:
        model: ``None`` (bundled reference model), a model directory / hub id, or a ``torch.nn.Module``.
        contexts: prompt lengths in tokens; default 1k..16k on CPU, 1k..128k on CUDA, (256, 512) with ``quick``.
        candidates: cache names (see the module docstring); must include ``dynamic``.
        steps / warmup: timed and untimed rounds of single-token forwards (``quick``: 3 and 1).
        device: ``cpu``, ``cuda[:N]`` or ``auto``.
        prefill_chunk_tokens: the exact prefill runs in chunks of this many tokens (bounds its memory).
        cache_settings: the run-wide cache settings (``group_size``, ``residual_length``, ``hqq_group_size`` ...;
            ``None``: every family's defaults), each family reading those it takes (:class:`CacheSettings`).
        profile_context: when set, also profile 8 decode steps of ``dynamic`` and the target cache at this context
            (``torch.profiler``, top operators by self CPU time per step; it may exceed ``contexts``).
        progress: optional ``callable(str)`` told about each cell before it runs.
        cpu_matmul: ``auto`` / ``native`` / ``float32``: the Linear layers' GEMM path on a CPU, as in ``kvlab eval``
            (:func:`kvlab.runtime.dtypes.cpu_matmul_policy`; emulated bf16 pushes every ratio towards 1).

    Returns:
        ``{"device", "model", "settings", "contexts", "candidates", "prompt_source", "rows", "ratios", "target",
        "profile"}``. ``rows``: one per (candidate, context) with ``status`` (``ok``/``skipped``/``failed``),
        ``median_ms``, ``mean_ms``, ``min_ms``, ``times_ms``, ``prefill_s`` (the shared exact prefill), ``fill_s``
        (writing it into this cache), ``cache_bytes``, ``ratio_to_dynamic`` (median / dynamic's at that context) or
        ``error``. ``target``: the decode target. ``settings``: also ``kivi_cpu_path`` (:func:`kivi_cpu_path`),
        ``cpu_matmul`` and ``matmul_time_ratio_vs_float32`` (the GEMM path and why).

    Raises:
        ValueError: bad candidates, contexts (too long: :func:`_check_room`), steps, device, cpu_matmul, profile_context;
            an HQQ group size no prompt fits (once the model loads: :func:`kvlab.bench.prepare.check_model_shape`).
    """
    cands = parse_candidates(tuple(candidates))
    dev, contexts, steps, warmup = _run_plan(device, contexts, quick, steps, warmup, cpu_matmul, profile_context)
    settings = bench_settings(cache_settings, cands)
    n_ids = _check_room(model, dtype, dev, contexts, warmup + steps, profile_context, progress)
    lm, model_desc, ids, source = load_prompted_model(model, dtype, dev, n_ids)
    check_model_shape(cands, settings, model_desc, contexts)  # an --hqq-group-size failing every cell: refused
    gemm_record, gemms = cpu_matmul_policy(lm, cpu_matmul, dev)
    with gemms:
        rows = _decode_rows(
            lm, cands, settings, ids, contexts, steps, warmup, prefill_chunk_tokens, dev, progress
        )
        _add_ratios(rows)
        profile = _profiles(lm, settings, ids, profile_context, prefill_chunk_tokens)
    result = {
        "device": str(dev),
        "device_type": dev.type,
        "model": model_desc,
        "settings": {
            "steps": steps,
            "warmup": warmup,
            "prefill_chunk_tokens": prefill_chunk_tokens,
            "dtype": dtype,
            "timing": TIMING,
            "kivi_cpu_path": kivi_cpu_path(dev, cands),
            **gemm_record,
        },
        "contexts": list(contexts),
        "candidates": [c.describe(settings) | {"name": c.name} for c in cands],  # named as their rows
        "prompt_source": source,
        "rows": rows,
        "profile": profile,
        "profile_context": profile_context,
    }
    result["target"] = evaluate_target(result)
    return result


def _prompt_tokens(contexts: tuple[int, ...], rounds: int, profile_context: int | None) -> int:
    """Prompt tokens a run reads: each context plus its decoded tokens, and the profiled context plus the two
    warm-up and :data:`PROFILE_STEPS` profiled steps (it may lie beyond the timed contexts)."""
    return max(max(contexts) + rounds, (profile_context or 0) + 2 + PROFILE_STEPS) + 2


def _check_room(model, dtype, dev, contexts, rounds: int, profile_context, progress) -> int:
    """The prompt tokens of a run (:func:`_prompt_tokens`), refused before the model loads when they cannot be held
    (:func:`kvlab.bench.prepare.check_room`, naming ``profile_context`` when the profiled context is the longest,
    else ``contexts``)."""
    n_ids = _prompt_tokens(contexts, rounds, profile_context)
    if profile_context is not None and profile_context > max(contexts):
        check_room(model, dtype, dev, n_ids, profile_context, "profile_context", progress)
    else:
        check_room(model, dtype, dev, n_ids, max(contexts), "contexts", progress)
    return n_ids


def _run_plan(device, contexts, quick: bool, steps: int, warmup: int, cpu_matmul: str, profile_context):
    """``(device, contexts, steps, warmup)`` of a :func:`run`, checked before any model loads.

    Raises:
        ValueError: a bad device, context, ``steps`` < 1, ``warmup`` < 0, ``cpu_matmul`` or ``profile_context``
            (each named).
    """
    if profile_context is not None:
        check_int("profile_context", profile_context, 1)
    dev = resolve_device(device)
    contexts = bench_contexts(contexts, quick, dev.type, (QUICK_CONTEXTS, CPU_CONTEXTS, CUDA_CONTEXTS))
    if quick:
        steps, warmup = min(steps, 3), min(warmup, 1)
    if steps < 1 or warmup < 0:
        raise ValueError(f"`steps` must be >= 1 and `warmup` >= 0, got steps={steps!r}, warmup={warmup!r}")
    cpu_matmul_mode(cpu_matmul, None, torch.device("cpu"))  # a bad value is named before the model loads
    return dev, contexts, steps, warmup


def kivi_cpu_path(dev: torch.device, cands: list[BenchCandidate] | None = None) -> str | None:
    """Which path the fused caches' (KIVI, FP8) decode steps take on ``dev``'s CPU (the compiled kernel of
    :mod:`kvlab.attention.cpu_kernel`, or torch and why), for the record; ``None`` on other devices, and when
    ``cands`` (the run's caches) holds no fused cache: nothing took that path. A cache's key-score path is its own
    ``dot`` (``kivi4:dot=int8``; exact when it names none), named in its rows' ``key_score_path``."""
    if dev.type != "cpu":
        return None
    if cands is not None and not any(c.attention == "fused" for c in cands):
        return None
    from kvlab.attention import cpu_kernel

    return (
        cpu_kernel.describe() + " (a cache's key scores: its :dot= setting; each row's key_score_path: what ran)"
    )


def _decode_rows(
    lm, cands, settings, ids, contexts, steps, warmup, prefill_chunk_tokens, dev, progress
) -> list[dict]:
    """One row per (candidate, context), candidates in the order given within each context: the timed cells of
    :func:`_time_context`, ``skipped`` for a cache whose back-end is missing, ``failed`` for every cell of a
    context whose shared prefill failed."""
    skipped = {c.name: c.unavailable_reason() for c in cands if c.unavailable_reason()}
    runnable = [c for c in cands if c.name not in skipped]
    rows = []
    for context in contexts:
        if progress:
            progress(f"decode: {len(runnable)} caches at {context} tokens")
        try:
            cells = _time_context(
                lm, runnable, settings, ids, context, steps, warmup, prefill_chunk_tokens, dev
            )
        except Exception as e:  # noqa: BLE001 - the shared prefill failed: every cell of this context fails
            cells = {c.name: failed_cell(e) for c in runnable}
        finally:
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        for cand in cands:
            row: dict[str, Any] = {"candidate": cand.name, "context": context}
            if cand.name in skipped:
                row |= {"status": "skipped", "error": skipped[cand.name]}
            else:
                row |= cells[cand.name]
            rows.append(row)
    return rows


def _profiles(
    lm, settings, ids, profile_context: int | None, prefill_chunk_tokens: int
) -> dict[str, dict] | None:
    """:func:`profile_step` of ``dynamic`` and the target cache at ``profile_context`` (None: no profile); a failure
    is recorded as ``{"error": ...}`` for that cache."""
    if profile_context is None:
        return None
    profile = {}
    for name in ("dynamic", TARGET_CANDIDATE):
        cand = BenchCandidate.parse(name)
        try:
            profile[name] = profile_step(
                lm, cand, settings, ids, profile_context, prefill_chunk_tokens, PROFILE_STEPS
            )
        except Exception as e:  # noqa: BLE001
            profile[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
    return profile


def _add_ratios(rows: list[dict]) -> None:
    base = {r["context"]: r["median_ms"] for r in rows if r["candidate"] == "dynamic" and r["status"] == "ok"}
    for r in rows:
        if r["status"] == "ok" and r["context"] in base:
            r["ratio_to_dynamic"] = r["median_ms"] / base[r["context"]]


def evaluate_target(result: dict) -> dict:
    """The decode target on ``result["rows"]``: ``{"description", "status", "detail", ...}``.

    CPU: ``kivi4-fused`` median / ``dynamic`` median at 4096 tokens <= 1.10. CUDA: the same ratio <= 1.0 at every
    measured context >= 32768. ``status`` is ``met``, ``not met`` or ``not measured`` (cell missing or failed).
    """
    ratios = {
        r["context"]: r["ratio_to_dynamic"]
        for r in result["rows"]
        if r["candidate"] == TARGET_CANDIDATE and "ratio_to_dynamic" in r
    }
    if result["device_type"] == "cuda":
        desc = (
            f"{shown_name(TARGET_CANDIDATE)} decode <= {TARGET_GPU_RATIO:.2f}x dynamic at >= "
            f"{TARGET_GPU_MIN_CONTEXT} tokens (GPU)"
        )
        measured = {c: v for c, v in ratios.items() if c >= TARGET_GPU_MIN_CONTEXT}
        if not measured:
            return {"description": desc, "status": "not measured", "detail": "no context >= 32768 measured"}
        bad = {c: v for c, v in measured.items() if v > TARGET_GPU_RATIO}
        detail = ", ".join(f"{v:.3f}x at {c}" for c, v in sorted(measured.items()))
        return {
            "description": desc,
            "status": "not met" if bad else "met",
            "detail": detail,
            "ratios": measured,
        }
    desc = (
        f"{shown_name(TARGET_CANDIDATE)} decode <= {TARGET_CPU_RATIO:.2f}x dynamic at {TARGET_CPU_CONTEXT} tokens (CPU)"
    )
    if TARGET_CPU_CONTEXT not in ratios:
        missing = f"no {TARGET_CPU_CONTEXT}-token cell" if ratios else f"no {shown_name(TARGET_CANDIDATE)} cell"
        return {"description": desc, "status": "not measured", "detail": missing}
    ratio = ratios[TARGET_CPU_CONTEXT]
    return {
        "description": desc,
        "status": "met" if ratio <= TARGET_CPU_RATIO else "not met",
        "detail": f"{ratio:.3f}x",
        "ratio": ratio,
    }


def _ratios(result: dict, candidate: str) -> dict[int, float]:
    """``{context: median / dynamic's median}`` of ``candidate``'s measured cells."""
    return {
        r["context"]: r["ratio_to_dynamic"]
        for r in result["rows"]
        if r["candidate"] == candidate and "ratio_to_dynamic" in r
    }


# the CPU integer-path target: the int8 KIVI-4 cache's decode time <= the float C kernel baseline's, every context
INT8_CANDIDATE, FLOAT_KERNEL_CANDIDATE = "kivi4:dot=int8", "dynamic-ckernel"


def evaluate_int8_target(result: dict) -> list[dict]:
    """``kivi4:dot=int8`` median ms per token <= ``dynamic-ckernel``'s at every context both ran (CPU), in one
    ``{"description", "status", "detail"}``; ``status`` ``not measured`` where the integer path did not run (its
    rows' ``key_score_path``, named in the detail) or no context has both. ``[]`` for a record without both caches
    (older records, CUDA) and on CUDA."""
    names = {r["candidate"] for r in result["rows"]}
    if result.get("device_type") == "cuda" or not {INT8_CANDIDATE, FLOAT_KERNEL_CANDIDATE} <= names:
        return []
    desc = (
        f"{shown_name(INT8_CANDIDATE)} decode <= {FLOAT_KERNEL_CANDIDATE} (the float C kernel baseline) at every "
        "context (CPU)"
    )
    ok = {
        (r["candidate"], r["context"]): r
        for r in result["rows"]
        if r["candidate"] in (INT8_CANDIDATE, FLOAT_KERNEL_CANDIDATE) and r.get("status") == "ok"
    }
    contexts = sorted(c for n, c in ok if n == INT8_CANDIDATE and (FLOAT_KERNEL_CANDIDATE, c) in ok)
    ran = sorted({ok[(INT8_CANDIDATE, c)].get("key_score_path") or "nothing recorded" for c in contexts})
    if not contexts or not all(p.startswith("int8") for p in ran):
        why = (
            "no context with both caches"
            if not contexts
            else f"the integer path did not run: {'; '.join(ran)}"
        )
        return [{"description": desc, "status": "not measured", "detail": why}]
    ratio = {
        c: ok[(INT8_CANDIDATE, c)]["median_ms"] / ok[(FLOAT_KERNEL_CANDIDATE, c)]["median_ms"]
        for c in contexts
    }
    detail = ", ".join(f"{v:.2f}x at {c}" for c, v in ratio.items()) + f" ({'; '.join(ran)})"
    return [_verdict(desc, {c: v <= 1.0 for c, v in ratio.items()}, detail)]


def _verdict(desc: str, checks: dict[int, bool], detail: str) -> dict:
    if not checks:
        return {"description": desc, "status": "not measured", "detail": "no such cell measured"}
    bad = [c for c, ok in sorted(checks.items()) if not ok]
    miss = f"; misses at {', '.join(str(c) for c in bad)}" if bad else ""
    return {"description": desc, "status": "not met" if bad else "met", "detail": detail + miss}


def evaluate_lead_targets(result: dict) -> list[dict]:
    """The CPU lead targets of quantized decode on ``result["rows"]`` (one interleaved ``kvlab bench decode`` run):

    1. ``kivi4-fused`` <= :data:`LEAD_MAX_RATIO` x dynamic at every context, <= :data:`LEAD_LONG_RATIO` x at
       :data:`LEAD_LONG_CONTEXT`;
    2. ``kivi2-fused`` / ``kivi4-fused`` <= :data:`LEAD_BITS_RATIO` at every context >= :data:`LEAD_BITS_MIN_CONTEXT`
       (2-bit codes read half the bytes, so they should cost less);
    3. both fused caches faster than ``hqq4`` at every context.

    Returns:
        three ``{"description", "status", "detail"}`` dicts; ``status`` is ``met``, ``not met`` or ``not measured``
        (a cache or context missing). CUDA records get none (an empty list).
    """
    if result.get("device_type") == "cuda":
        return []
    k4, k2, hqq = (_ratios(result, c) for c in ("kivi4-fused", "kivi2-fused", "hqq4"))
    lead = {c: v <= (LEAD_LONG_RATIO if c == LEAD_LONG_CONTEXT else LEAD_MAX_RATIO) for c, v in k4.items()}
    if LEAD_LONG_CONTEXT not in k4:
        lead = {}
    bits = {c: k2[c] / k4[c] <= LEAD_BITS_RATIO for c in k4 if c in k2 and c >= LEAD_BITS_MIN_CONTEXT}
    peers = {c: max(k4[c], k2[c]) < hqq[c] for c in k4 if c in k2 and c in hqq}
    return [
        _verdict(
            f"kivi-4-fused <= {LEAD_MAX_RATIO:.2f}x dynamic at every context, <= {LEAD_LONG_RATIO:.2f}x at "
            f"{LEAD_LONG_CONTEXT} (CPU)",
            lead,
            ", ".join(f"{v:.2f}x at {c}" for c, v in sorted(k4.items())),
        ),
        _verdict(
            f"kivi-2-fused / kivi-4-fused <= {LEAD_BITS_RATIO} at >= {LEAD_BITS_MIN_CONTEXT} tokens (CPU)",
            bits,
            ", ".join(f"{k2[c] / k4[c]:.2f} at {c}" for c in sorted(bits)),
        ),
        _verdict(
            "kivi-4-fused and kivi-2-fused faster than hqq-4 at every context (CPU)",
            peers,
            ", ".join(f"{max(k4[c], k2[c]) / hqq[c]:.2f}x hqq-4 at {c}" for c in sorted(peers)),
        ),
    ]
