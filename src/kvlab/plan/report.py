"""The reports behind ``kvlab plan``, ``kvlab roofline`` and ``kvlab video``: JSON-serializable dicts.

Each function resolves the model, hardware and dtypes, runs the ledger / fit / roofline / video code and returns
every number the CLI prints, so the CLI only formats. Pure Python; no torch (``--probe`` imports numpy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvlab.plan.config_fields import KV_KINDS, SHARED
from kvlab.plan.fit import budget_from_gib, budget_from_hardware, max_batch, max_context
from kvlab.plan.hardware import Hardware, custom_hardware, get_hardware
from kvlab.plan.ledger import build_ledger, kv_bytes_peak, kv_dtype
from kvlab.plan.load import load_spec
from kvlab.plan.roofline import (
    decode_step_bound,
    intensity_table,
    model_decode_attention_intensity,
    prefill_intensity,
)
from kvlab.plan.scenario import DEFAULT_GPU  # re-exported: commands and tests read it here
from kvlab.plan.spec import QUANTIZED_WEIGHTS_HINT, ModelSpec
from kvlab.plan.video import VideoClip, video_kv
from kvlab.plan.weights import UnknownWeightsError, WeightBytes, weight_bytes


def resolve_hardware(
    gpu: str | None, bandwidth_gb_s: float | None = None, tflops: float | None = None
) -> Hardware:
    """A table row by name, or a custom device when ``bandwidth_gb_s`` is given (``tflops`` optional).

    Raises:
        ValueError: ``gpu`` together with ``bandwidth_gb_s`` or ``tflops`` (a table row and a custom device: one
            would be silently dropped), naming both flags; ``tflops`` without ``bandwidth_gb_s``; an unknown
            ``gpu`` or a bad rate (:func:`kvlab.plan.hardware.get_hardware`, :func:`custom_hardware`).
    """
    custom = [
        f"{flag} {value:g}" if isinstance(value, int | float) else f"{flag} {value!r}"
        for flag, value in (("--bandwidth-gb-s", bandwidth_gb_s), ("--tflops", tflops))
        if value is not None
    ]
    if gpu is not None and custom:
        raise ValueError(
            f"--gpu {gpu} picks a datasheet row and {' and '.join(custom)} describe{'' if len(custom) > 1 else 's'} a custom device; pass one "
            f"(--gpu for a device in the table, see --list-gpus; --bandwidth-gb-s [--tflops] for one that is not)"
        )
    if bandwidth_gb_s is not None:
        return custom_hardware(bandwidth_gb_s, tflops)
    if tflops is not None:
        raise ValueError("--tflops needs --bandwidth-gb-s (a custom device); or pick --gpu from the table")
    return get_hardware(DEFAULT_GPU if gpu is None else gpu)


def _weights(spec: ModelSpec, weight_dtype: str, index: str | None, given: int | None) -> WeightBytes | None:
    try:
        return weight_bytes(spec, weight_dtype, index_path=index, override_bytes=given)
    except UnknownWeightsError:
        return None


_BOUND_KEYS = (
    "weight_bytes_read",
    "kv_bytes_read",
    "bytes_per_step",
    "flops_per_step",
    "bandwidth_bytes_s",
    "peak_flops",
    "decode_step_memory_bound_ms",
    "decode_step_compute_bound_ms",
    "decode_step_lower_bound_ms",
    "limiter",
    "tokens_per_s_upper_bound",
)
NO_WEIGHTS = "weight bytes unknown (the config has no vocab/intermediate sizes): pass --weight-bytes or --weights-index"


def _spec(model: str | ModelSpec, kv_heads: int | None) -> ModelSpec:
    spec = load_spec(model)
    return spec.with_kv_heads(kv_heads) if kv_heads is not None else spec


def _check_context_batch(context: int, batch: int) -> None:
    """Tokens per sequence and sequences must both be positive integers."""
    for name, value in (("context", context), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` (--{name}) must be a positive integer, got {value!r}")


def context_warnings(spec: ModelSpec, contexts: dict[str, int]) -> list[str]:
    """One warning when any of ``contexts`` (``{"--context 100,000": 100000}``: how the output names each, and its
    tokens) goes beyond the config's ``max_position_embeddings``, the window the model was trained for. Planned as
    asked, not refused (RoPE scaling can serve longer), but said. [] when all are within it or the config states
    no limit."""
    limit = spec.max_position_embeddings
    over = [name for name, tokens in contexts.items() if limit is not None and tokens > limit]
    if not over:
        return []
    return [
        f"{', '.join(over)} {'is' if len(over) == 1 else 'are'} beyond {spec.name}'s max_position_embeddings "
        f"{limit:,} (the config's context limit): counted as asked, but the model may not serve that many tokens "
        f"without RoPE scaling or another context extension"
    ]


def plan_report(
    model: str | ModelSpec,
    *,
    context: int = 8192,
    batch: int = 1,
    kv: str = "auto",
    group_size: int = 32,
    residual_length: int = 128,
    keep_tokens: int | None = None,
    gpu: str | None = None,
    gpu_mem_gib: float | None = None,
    reserve_gib: float = 0.0,
    tp: int = 1,
    weight_dtype: str = "auto",
    weights_index: str | None = None,
    weight_bytes_override: int | None = None,
    kv_heads: int | None = None,
    bandwidth_gb_s: float | None = None,
    tflops: float | None = None,
    measured_step_ms: float | None = None,
    emit: str | None = None,
    block_size: int = 16,
) -> dict[str, Any]:
    """Ledger, fit and decode bound of ``model`` serving ``batch`` x ``context`` tokens on ``tp`` GPUs.

    Top-level keys include ``kv_bytes_per_token``, ``kv_bytes_total``, ``weight_bytes``, ``max_batch``,
    ``max_context`` and ``decode_step_lower_bound_ms``; ``*_per_gpu`` keys are one rank's. With ``emit="vllm"``,
    ``vllm`` holds the ``vllm serve`` command for the plan and the KV cache vLLM would report
    (:func:`kvlab.plan.vllm.vllm_serve_plan`, blocks of ``block_size`` tokens). ``keep_tokens``: an evicting
    cache holding at most that many tokens per layer (:func:`kvlab.plan.ledger.kv_dtype`); bytes, fit and decode
    bound are the capped cache's, and ``max_context`` is None (not limited by memory) when the capped KV fits.
    ``warnings``: a ``context`` beyond the config's ``max_position_embeddings`` (:func:`context_warnings`; planned,
    not refused).

    Raises:
        ValueError: bad input (named), or ``emit="vllm"`` for a plan vLLM cannot run as planned.
    """
    if emit not in (None, "vllm"):
        raise ValueError(f"`emit` (--emit) must be 'vllm', got {emit!r}")
    _check_context_batch(context, batch)
    spec = _spec(model, kv_heads)
    kvd = kv_dtype(
        kv, spec.dtype, group_size=group_size, residual_length=residual_length, keep_tokens=keep_tokens
    )
    weights = _weights(spec, weight_dtype, weights_index, weight_bytes_override)
    ledger = build_ledger(spec, context, batch, weights, kvd, tp=tp)
    hw = resolve_hardware(gpu, bandwidth_gb_s, tflops)
    out: dict[str, Any] = {"spec": spec.summary(), **ledger.to_dict()}
    budget = _memory_budget(gpu_mem_gib, reserve_gib, hw)
    out["gpu"] = hw.to_dict()
    out["budget"] = None if budget is None else budget.to_dict()
    out.update(_fit(spec, context, batch, kvd, tp, budget, weights, ledger))
    limit = spec.max_position_embeddings
    out["max_context_above_model_limit"] = (
        None
        if limit is None or out["fits"] is None
        else (out["max_context"] is None or out["max_context"] > limit)
    )
    out["decode_attention_intensity"] = model_decode_attention_intensity(spec, kvd)
    notes = list(ledger.notes)
    if weights is None:
        out.update({k: None for k in _BOUND_KEYS})
        out["measured"] = None
        notes.append(NO_WEIGHTS)
    else:
        bound = decode_step_bound(
            spec, context, batch, weights.active_bytes, hw.bandwidth_bytes_s, hw.peak_flops, kvd, tp
        )
        out.update(bound.to_dict())
        out["measured"] = None if measured_step_ms is None else bound.compare(measured_step_ms)
    out["notes"] = _weight_source_notes(
        notes + _model_notes(spec, tp), weight_dtype, weights_index, weight_bytes_override
    ) + _keep_notes(kvd, context)
    out["warnings"] = context_warnings(spec, {f"--context {context}": context})
    out["vllm"] = None
    if emit == "vllm":
        out["vllm"] = _vllm(spec, kvd, model, context, batch, tp, budget, ledger, block_size)
    return out


def _memory_budget(gpu_mem_gib: float | None, reserve_gib: float, hw: Any):
    """The memory the plan fits into: ``gpu_mem_gib`` when given, else the device's reported memory, else None
    (a custom device without memory: no fit is computed)."""
    if gpu_mem_gib is not None:
        return budget_from_gib(gpu_mem_gib, reserve_gib)
    if hw.memory_bytes is not None:
        return budget_from_hardware(hw, reserve_gib)
    return None


_FIT_KEYS = (
    "kv_budget_bytes_per_gpu",
    "max_batch",
    "max_batch_allocated",
    "max_context",
    "max_context_allocated",
    "fits",
)


def _fit(spec, context, batch, kvd, tp, budget, weights, ledger) -> dict[str, Any]:
    """The fit keys of :func:`plan_report`: KV budget per GPU, largest batch and context (peak and allocated
    bytes) and whether the plan fits; every value None without a budget or without weight bytes."""
    fit: dict[str, Any] = dict.fromkeys(_FIT_KEYS)
    if budget is None or weights is None:
        return fit
    free = budget.kv_budget_bytes(ledger.weight_bytes_per_gpu)
    fit["kv_budget_bytes_per_gpu"] = free
    fit["max_batch"] = max_batch(spec, context, free, kvd, tp=tp)
    fit["max_batch_allocated"] = max_batch(spec, context, free, kvd, tp=tp, mode="allocated")
    fit["max_context"] = max_context(spec, batch, free, kvd, tp=tp)
    fit["max_context_allocated"] = max_context(spec, batch, free, kvd, tp=tp, mode="allocated")
    fit["fits"] = kv_bytes_peak(spec, context, batch, kvd, tp=tp) <= free
    return fit


def _weight_source_notes(
    notes: list[str], weight_dtype: str, weights_index: str | None, weight_bytes_override: int | None
) -> list[str]:
    """The quantized-checkpoint note without its "pass --weight-dtype ..." hint when the user passed one of them
    (the note then names the source used instead)."""
    if weight_bytes_override is not None:
        used = f"--weight-bytes {weight_bytes_override:,}"
    elif weights_index is not None:
        used = f"--weights-index {weights_index}"
    elif weight_dtype != "auto":
        used = f"--weight-dtype {weight_dtype}"
    else:
        return notes
    return [n.replace(QUANTIZED_WEIGHTS_HINT, f"; weights sized from {used}") for n in notes]


def _keep_notes(kvd: Any, context: int) -> list[str]:
    """A cap (``--keep-tokens`` N) not below ``context``: nothing is evicted at this context (the cap only bounds
    longer ones: ``max_context``)."""
    if kvd.keep_tokens is None or kvd.keep_tokens < context:
        return []
    return [
        f"--keep-tokens {kvd.keep_tokens:,} is not below --context {context:,}: the capped cache evicts nothing "
        f"at this context (bytes and bound are those of all {context:,} tokens; the cap only bounds longer contexts)"
    ]


def _model_notes(spec: ModelSpec, tp: int) -> list[str]:
    """Notes on what the decode bound and the per-GPU bytes assume: MoE routing, KV-shared layers, tensor
    parallelism (and the KV copies it makes when there are fewer KV heads than GPUs, or an MLA latent)."""
    notes = []
    if (
        spec.num_parameters
        and spec.num_active_parameters
        and spec.num_active_parameters < spec.num_parameters
    ):
        notes.append(
            "MoE: the decode bound reads only shared weights + the routed experts of one token (a lower "
            "bound; more experts are read at batch > 1)"
        )
    if spec.count(SHARED):
        notes.append("KV-shared layers re-read an earlier layer's cache; the bound counts those bytes once")
    if tp > 1:
        notes.append(f"tp={tp}: weights split evenly per GPU (approximation); KV per GPU as ranks hold it")
        if spec.kv_lora_rank is not None:
            copies, what = tp, "every GPU stores the whole MLA latent"
        else:
            copies = max(1, tp // spec.num_kv_heads)
            what = f"each KV head is stored on {copies} GPUs"
        if copies > 1:
            notes.append(
                f"tp={tp}: {what}, so KV summed over the {tp} GPUs is {copies} x the model's KV without "
                "tensor parallelism"
            )
    return notes


def _vllm(spec, kvd, model, context, batch, tp, budget, ledger, block_size) -> dict[str, Any]:
    """The ``vllm`` key of :func:`plan_report`: needs the GPU memory and the weights, as the fit does."""
    from kvlab.plan.vllm import vllm_model_argument, vllm_serve_plan

    if kvd.keep_tokens is not None:
        raise ValueError("--emit vllm plans vLLM, which keeps every token; --keep-tokens does not apply")
    if budget is None:
        raise ValueError("--emit vllm needs the GPU memory: pass --gpu-mem-gib or a --gpu from the table")
    if ledger.weights is None:
        raise ValueError(f"--emit vllm needs the weight bytes; {NO_WEIGHTS}")
    if isinstance(model, ModelSpec):
        raise ValueError("--emit vllm needs the model as a preset, a path or a hub id, not a ModelSpec")
    plan = vllm_serve_plan(
        spec,
        kvd,
        model=vllm_model_argument(model),
        context=context,
        batch=batch,
        tp=tp,
        memory_bytes=budget.memory_bytes,
        reserve_bytes=budget.reserve_bytes,
        weight_bytes_per_gpu=ledger.weight_bytes_per_gpu,
        block_size=block_size,
    )
    return {**plan.to_dict(), "predicted_log": _predicted_log(spec, model, plan, tp)}


def _predicted_log(spec: ModelSpec, model, plan, tp: int) -> dict[str, Any]:
    """What vLLM's startup log would say for ``plan`` once it profiles its activations
    (:mod:`kvlab.plan.vllm_memory`): each term, "Available KV cache memory", then the tokens and concurrency of
    that memory (:mod:`kvlab.plan.vllm_kv`); ``fits`` False with the shortfall when nothing is left."""
    from kvlab.plan.load import load_config
    from kvlab.plan.vllm_kv import vllm_kv_cache
    from kvlab.plan.vllm_memory import available_kv_memory, scheduler_defaults

    config = load_config(model)
    tokens, _ = scheduler_defaults(plan.memory_bytes, "serve", plan.max_model_len)
    terms = available_kv_memory(
        config,
        spec,
        total_bytes=plan.memory_bytes,
        total_source="the plan's GPU memory",
        gpu_memory_utilization=plan.gpu_memory_utilization,
        weight_bytes=plan.weight_bytes_per_gpu,
        weight_source="the plan's weights",
        tp=tp,
        max_num_batched_tokens=tokens,
        max_num_seqs=plan.max_num_seqs,
    )
    available = terms[-1].bytes
    out: dict[str, Any] = {"terms": [t.to_dict() for t in terms], "fits": available > 0}
    if available > 0:
        kv = vllm_kv_cache(
            spec,
            available,
            max_model_len=plan.max_model_len,
            tp=tp,
            block_size=plan.block_size,
            kv_cache_dtype=plan.kv_cache_dtype,
            max_num_batched_tokens=tokens,
        )
        out.update(kv_cache_tokens=kv.kv_cache_tokens, max_concurrency=kv.max_concurrency)
    else:
        out["shortfall_bytes"] = -available
    return out


def roofline_report(
    *,
    gpu: str | None = None,
    model: str | ModelSpec = "llama-3-8b",
    context: int = 8192,
    batch: int = 1,
    kv: str = "auto",
    group_size: int = 32,
    residual_length: int = 128,
    keep_tokens: int | None = None,
    tp: int = 1,
    weight_dtype: str = "auto",
    weights_index: str | None = None,
    weight_bytes_override: int | None = None,
    bandwidth_gb_s: float | None = None,
    tflops: float | None = None,
    measured_step_ms: float | None = None,
    run_probe: bool = False,
    probe_kwargs: dict | None = None,
) -> dict[str, Any]:
    """Ridge point, decode and prefill intensities, the decode step lower bound, and (``run_probe``) this
    machine's measured fp32 roofs (docs/plan.md, Roofline). ``warnings``: a ``context`` beyond
    the config's ``max_position_embeddings`` (:func:`context_warnings`; not refused).

    Raises:
        ValueError: bad input (named), e.g. a ``gpu`` together with a custom device (:func:`resolve_hardware`).
    """
    _check_context_batch(context, batch)
    hw = resolve_hardware(gpu, bandwidth_gb_s, tflops)
    spec = load_spec(model)
    kvd = kv_dtype(
        kv, spec.dtype, group_size=group_size, residual_length=residual_length, keep_tokens=keep_tokens
    )
    weights = _weights(spec, weight_dtype, weights_index, weight_bytes_override)
    p = float(kvd.bytes_per_element)
    ridge = hw.ridge_flop_per_byte
    out: dict[str, Any] = {
        "gpu": hw.to_dict(),
        "ridge_flop_per_byte": ridge,
        "model": spec.name,
        "context": context,
        "batch": batch,
        "kv_dtype": kvd.to_dict(),
        "decode_attention_intensity": model_decode_attention_intensity(spec, kvd),
        "decode_intensity_table": intensity_table(kv_bytes_per_element=p, ridge=ridge),
    }
    attention_layers = sum(1 for k in spec.layer_kinds if k in KV_KINDS or k == SHARED)
    out["prefill"] = (
        None
        if spec.num_parameters is None
        else prefill_intensity(
            attention_layers,
            spec.num_attention_heads,
            spec.head_dim,
            spec.num_parameters,
            spec.dtype_bytes,
            context,
        )
    )
    out["notes"] = _weight_source_notes(list(spec.notes), weight_dtype, weights_index, weight_bytes_override)
    out["notes"] += _keep_notes(kvd, context)
    if weights is None:
        out.update({k: None for k in _BOUND_KEYS})
        out.update(weight_bytes=None, weight_bytes_source=None, measured=None)
        out["notes"].append(NO_WEIGHTS)
    else:
        bound = decode_step_bound(
            spec, context, batch, weights.active_bytes, hw.bandwidth_bytes_s, hw.peak_flops, kvd, tp
        )
        out.update(bound.to_dict())
        out["weight_bytes"] = weights.total_bytes
        out["weight_bytes_source"] = weights.source
        out["measured"] = None if measured_step_ms is None else bound.compare(measured_step_ms)
    out["warnings"] = context_warnings(spec, {f"--context {context}": context})
    out["probe"] = _local_probe(out["prefill"], probe_kwargs) if run_probe else None
    return out


def _local_probe(prefill: dict[str, Any] | None, probe_kwargs: dict | None) -> dict[str, Any]:
    """The ``probe`` key of :func:`roofline_report`: this machine's measured fp32 roofs and what they bound."""
    from kvlab.plan.probe import probe

    result = probe(**(probe_kwargs or {}))
    local = result.to_dict()
    # the probe is fp32: p = 4, so I = 2g/4 (half the bf16 intensity, mechanics chapter [C4])
    local["decode_intensity_table"] = intensity_table(
        kv_bytes_per_element=4.0, ridge=result.ridge_flop_per_byte
    )
    if prefill is not None:
        i_fp32 = prefill["intensity_flop_per_byte"] / 2
        local["prefill_intensity_fp32"] = i_fp32
        local["prefill_bound"] = "memory" if i_fp32 < result.ridge_flop_per_byte else "compute"
    return local


def video_report(
    *,
    model: str | ModelSpec = "llama-3-8b",
    seconds: Sequence[float] = (5, 10, 30),
    fps: int = 24,
    width: int = 1280,
    height: int = 720,
    temporal_compression: int = 4,
    spatial_compression: int = 8,
    patch_size: int = 1,
    causal_first_frame: bool = False,
    kv: str = "auto",
    group_size: int = 32,
    residual_length: int = 128,
    batch: int = 1,
) -> dict[str, Any]:
    """Tokens and KV bytes of clips of each length in ``seconds`` (docs/plan.md, Video).
    ``warnings``: the clips whose tokens go beyond the config's ``max_position_embeddings`` (not refused).

    Raises:
        ValueError: a bad ``batch``, a clip length given twice (one row each would repeat), or what
            :class:`VideoClip`, :func:`load_spec` and :func:`kv_dtype` refuse.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"`batch` must be a positive integer, got {batch!r}")
    repeated = sorted({s for s in seconds if list(seconds).count(s) > 1}, key=str)
    if repeated:
        raise ValueError(
            f"`seconds` lists {', '.join(map(repr, repeated))} more than once, got {list(seconds)!r}"
        )
    spec = load_spec(model)
    kvd = kv_dtype(kv, spec.dtype, group_size=group_size, residual_length=residual_length)
    rows = []
    for s in seconds:
        clip = VideoClip(
            s, fps, width, height, temporal_compression, spatial_compression, patch_size, causal_first_frame
        )
        rows.append(video_kv(spec, clip, kvd, batch))
    return {
        "model": spec.name,
        "kv_dtype": kvd.to_dict(),
        "batch": batch,
        "clips": rows,
        "notes": list(spec.notes),
        "warnings": context_warnings(
            spec, {f"the {row['seconds']:g} s clip ({row['tokens']:,} tokens)": row["tokens"] for row in rows}
        ),
    }
