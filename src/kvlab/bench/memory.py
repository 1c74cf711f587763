"""Benchmark ``memory``: decode-phase transient bytes per cache.

The transient of one decode step is the peak of bytes allocated during the step minus the bytes still allocated
after it: scratch that exists only while the step runs (a dequantized float copy of the history, unpacked code
tiles, attention scores, a ``torch.cat`` double buffer). The cache's own growth is retained, so it is not counted.

* CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (the caching allocator's exact
  bytes of live tensors), minus ``memory_allocated`` after the step.
* CPU: :class:`kvlab.runtime.tensor_bytes.TensorBytesTracker`, exact tensor accounting with a
  ``TorchDispatchMode``: every storage an operator creates is added once (deduplicated by ``data_ptr``); every
  storage an operator reads or creates is subtracted when it is freed (``weakref.finalize`` on the storage
  object, which torch keeps alive exactly as long as the storage). Memory an operator allocates and frees internally is invisible to it.

Two steps are measured per cell: a plain step, and for caches that flush in chunks the next step that flushes
(KIVI quantizes a ``G``-token chunk; transformers' ``QuantizedCache`` re-quantizes the whole history). The ratio
to the bf16 ``DynamicCache`` bytes at the same context is the target: <= 10 % for ``kivi4-fused``.
Every cache starts from the same exact prefill (:func:`kvlab.bench.prepare.fill_cache`).
"""

from __future__ import annotations

from typing import Any

import torch

from kvlab.bench import prepare
from kvlab.bench.cells import bench_contexts, failed_cell
from kvlab.bench.decode import DEFAULT_CANDIDATES
from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.caches.registry import CacheSettings
from kvlab.runtime.checks import check_int
from kvlab.runtime.device import resolve_device, synchronize
from kvlab.runtime.tensor_bytes import TensorBytesTracker  # the CPU measurement

CPU_CONTEXTS = (1024, 4096, 16384)
CUDA_CONTEXTS = (4096, 32768, 131072)
QUICK_CONTEXTS = (256, 512)
TARGET_RATIO = 0.10  # transient / bf16 DynamicCache bytes, kivi4-fused
TARGET_CANDIDATE = "kivi4-fused"
TOP_OPS = 6  # operators listed by bytes allocated during a measured step (CPU)
MAX_STEPS_TO_FLUSH = 512  # give up looking for a flushing step after this many decode steps


def measure_step(fn: Any, device: torch.device) -> dict:
    """Run ``fn()`` once and return ``peak_bytes``, ``retained_bytes`` and ``transient_bytes`` (peak - retained),
    all relative to the bytes allocated before the call; the value ``fn`` returns counts as retained. On CPU also
    ``allocated_by_op``: the operators that allocated the most bytes during the call."""
    if device.type == "cuda":
        synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        retained = torch.cuda.memory_allocated(device) - base
    else:
        with TensorBytesTracker() as tracker:
            out = fn()
        peak, retained = tracker.peak_bytes, tracker.current_bytes
        top = sorted(tracker.allocated_by_op.items(), key=lambda kv: kv[1], reverse=True)[:TOP_OPS]
    del out
    result = {
        "peak_bytes": int(peak),
        "retained_bytes": int(retained),
        "transient_bytes": int(peak - retained),
    }
    if device.type != "cuda":
        result["allocated_by_op"] = dict(top)  # the operators that allocated most during the step (bytes)
    return result


def steps_to_flush(cache: Any) -> int | None:
    """Decode steps before the next one that flushes (0: the next step flushes), or ``None`` for caches that never
    flush. KIVI flushes when its residual reaches ``R + G`` tokens; transformers' ``QuantizedCache`` when its
    residual reaches ``R`` tokens (then it re-quantizes everything)."""
    layer = cache.layers[0] if getattr(cache, "layers", None) else None
    if layer is None:
        return None
    state = getattr(layer, "state", None)
    if state is not None and hasattr(state, "residual_tokens"):  # kvlab KIVILayer
        cfg = state.config
        return cfg.residual_length + cfg.group_size - 1 - state.residual_tokens
    if hasattr(layer, "residual_length") and hasattr(layer, "_quantized_keys"):  # transformers QuantizedLayer
        held = layer.keys.shape[-2] if layer.keys is not None and layer.keys.dim() == 4 else 0
        return max(0, layer.residual_length - 1 - held)
    return None


def bf16_cache_bytes(model_desc: dict, tokens: int, batch: int = 1) -> int:
    """Bytes of a bf16 ``DynamicCache`` holding ``tokens`` tokens: ``2 (K, V) * layers * kv_heads * head_dim *
    tokens * batch * 2 bytes`` (docs/plan.md, "Ledger and fit")."""
    return 2 * model_desc["layers"] * model_desc["kv_heads"] * model_desc["head_dim"] * tokens * batch * 2


def _measure_cell(model, cand, settings, ids, context, warmup, source, device, flush_step) -> dict:
    from kvlab.caches.measure import cache_nbytes

    cache = cand.make(model.config, settings)
    pos = context

    def step():
        nonlocal pos
        out = prepare.decode_step(model, ids[:, pos : pos + 1], cache)
        pos += 1
        return out

    with torch.inference_mode():
        prepare.fill_cache(cache, source)
        prepare.set_attention(model, cand)
        for _ in range(warmup):
            step()
        if steps_to_flush(cache) == 0:  # the plain step must not flush
            step()
        plain = measure_step(step, device)
        out: dict[str, Any] = {"status": "ok", "plain_step": plain, "cache_bytes": cache_nbytes(cache)}
        out["tokens_after_plain_step"] = pos
        todo = steps_to_flush(cache) if flush_step else None
        if todo is not None and todo <= MAX_STEPS_TO_FLUSH:
            for _ in range(todo):
                step()
            out["flush_step"] = measure_step(step, device)
            out["tokens_after_flush_step"] = pos
        elif todo is not None:
            out["flush_step"] = None
            out["flush_step_note"] = f"next flush {todo} steps away (> {MAX_STEPS_TO_FLUSH}); not measured"
    return out


# How a step's memory is measured, by device (False: CPU, True: CUDA); recorded in the result.
METHODS = {
    False: "exact tensor accounting (TorchDispatchMode + weakref.finalize on storages)",
    True: "torch.cuda.max_memory_allocated - memory_allocated after the step",
}


def run(
    model: Any = None,
    contexts: tuple[int, ...] | None = None,
    candidates: tuple[str, ...] = DEFAULT_CANDIDATES,
    warmup: int = 2,
    device: str | None = "cpu",
    dtype: str = "bfloat16",
    prefill_chunk_tokens: int = 1024,
    cache_settings: CacheSettings | None = None,
    flush_step: bool = True,
    quick: bool = False,
    progress: Any = None,
) -> dict:
    """Decode-phase transient bytes of every cache at every context.

    Args:
        model / candidates / device / dtype / prefill_chunk_tokens / cache settings: as
            :func:`kvlab.bench.decode.run`.
        contexts: prompt lengths; default (1024, 4096, 16384) on CPU, (4096, 32768, 131072) on CUDA, (256, 512)
            with ``quick``.
        warmup: untimed decode steps after the prefill.
        flush_step: also measure the next flushing step of KIVI / transformers' quantized caches.
        progress: optional ``callable(str)`` told about each cell before it runs.

    Returns:
        ``{"device", "method", "model", "contexts", "candidates", "rows", "target"}``; each ``ok`` row has
        ``plain_step`` and (for flushing caches) ``flush_step`` with ``peak_bytes``, ``retained_bytes``,
        ``transient_bytes``; ``cache_bytes`` (after the plain step); ``bf16_cache_bytes`` (a bf16
        ``DynamicCache`` of the same tokens); ``transient_bytes`` (the larger of the two steps) and
        ``transient_ratio`` (that / ``bf16_cache_bytes``).

    Raises:
        ValueError: bad candidates, contexts, device or HQQ group size (:func:`kvlab.bench.prepare.check_model_shape`);
            contexts too long for the free memory (before the model loads: :func:`kvlab.bench.prepare.check_room`).
    """
    dev = resolve_device(device)
    contexts = bench_contexts(contexts, quick, dev.type, (QUICK_CONTEXTS, CPU_CONTEXTS, CUDA_CONTEXTS))
    if quick:
        warmup = min(warmup, 1)
    check_int("warmup", warmup, 0)
    cands = prepare.parse_candidates(tuple(candidates))
    settings = prepare.bench_settings(cache_settings, cands)
    kivi = {"group_size": KIVI_DEFAULTS.group_size, "residual_length": KIVI_DEFAULTS.residual_length}
    kivi |= {k: v for k, v in settings.values().items() if k in kivi}  # the tokens a KIVI cache needs to flush
    extra = warmup + 2 + (kivi["residual_length"] + kivi["group_size"] + 2 if flush_step else 0)
    prepare.check_room(model, dtype, dev, max(contexts) + extra, max(contexts), progress=progress)
    lm, model_desc, ids, prompt_source = prepare.load_prompted_model(model, dtype, dev, max(contexts) + extra)
    prepare.check_model_shape(cands, settings, model_desc, contexts)  # an --hqq-group-size failing every cell
    rows = []
    for context in contexts:
        try:
            with torch.inference_mode():
                # shared by every cache
                source = prepare.exact_prefill(lm, ids[:, :context], prefill_chunk_tokens)
        except Exception as e:  # noqa: BLE001 - every cell of this context fails
            source = f"the shared prefill failed: {failed_cell(e)['error']}"
        for cand in cands:
            row: dict[str, Any] = {"candidate": cand.name, "context": context}
            reason = cand.unavailable_reason()
            if reason:
                rows.append(row | {"status": "skipped", "error": reason})
                continue
            if progress:
                progress(f"memory: {cand.name} at {context} tokens")
            row |= _row(lm, cand, settings, ids, context, warmup, source, dev, flush_step, model_desc)
            rows.append(row)
        source = None  # free this context's prefill before the next one
    result = {
        "device": str(dev),
        "device_type": dev.type,
        "method": METHODS[dev.type == "cuda"],
        "model": model_desc,
        "settings": {"warmup": warmup, "prefill_chunk_tokens": prefill_chunk_tokens, "dtype": dtype},
        "contexts": list(contexts),
        "candidates": [c.describe(settings) for c in cands],
        "prompt_source": prompt_source,
        "rows": rows,
    }
    result["target"] = evaluate_target(result)
    return result


def _row(lm, cand, settings, ids, context, warmup, source, dev, flush_step, model_desc) -> dict[str, Any]:
    """One cell: :func:`_measure_cell` plus the attention implementation, the larger step transient and its
    ratio to a bf16 ``DynamicCache`` of the same tokens; ``source`` is the context's exact prefill, or the
    message of its failure (every cell of the context then fails with it). A failure is recorded."""
    row: dict[str, Any] = {}
    try:
        if isinstance(source, str):
            raise RuntimeError(source)
        row |= _measure_cell(lm, cand, settings, ids, context, warmup, source, dev, flush_step)
        row["attention"] = lm.config._attn_implementation
        steps = [s for s in (row["plain_step"], row.get("flush_step")) if s]
        row["transient_bytes"] = max(s["transient_bytes"] for s in steps)
        row["bf16_cache_bytes"] = bf16_cache_bytes(model_desc, row["tokens_after_plain_step"])
        row["transient_ratio"] = row["transient_bytes"] / row["bf16_cache_bytes"]
    except Exception as e:  # noqa: BLE001 - recorded per cell
        row |= failed_cell(e)
    finally:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return row


def evaluate_target(result: dict) -> dict:
    """Memory target: ``kivi4-fused`` transient (the larger of the plain and the flushing step) <= 10 % of
    the bf16 ``DynamicCache`` bytes, at every measured context. ``status``: ``met``, ``not met`` (with the
    contexts that miss it) or ``not measured``."""
    desc = f"{TARGET_CANDIDATE} decode-phase transient <= {TARGET_RATIO:.0%} of the bf16 cache bytes"
    ratios = {
        r["context"]: r["transient_ratio"]
        for r in result["rows"]
        if r["candidate"] == TARGET_CANDIDATE and r["status"] == "ok"
    }
    if not ratios:
        return {"description": desc, "status": "not measured", "detail": f"no {TARGET_CANDIDATE} cell"}
    missed = sorted(c for c, v in ratios.items() if v > TARGET_RATIO)
    detail = ", ".join(f"{v:.1%} at {c}" for c, v in sorted(ratios.items()))
    status = "met" if not missed else "not met"
    if missed:
        detail += f"; missed at {missed}"
    return {"description": desc, "status": status, "detail": detail, "ratios": ratios}
