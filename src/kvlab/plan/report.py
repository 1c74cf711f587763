"""The reports behind ``kvlab plan``, ``kvlab roofline`` and ``kvlab video``: JSON-serializable dicts.

Each function resolves the model, hardware and dtypes, runs the ledger / fit / roofline / video code and returns
every number the CLI prints, so the CLI only formats. Pure Python; no torch (``--probe`` imports numpy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.plan.config_fields import KV_KINDS, SHARED, check_int_at_least, number_text
from kvlab.plan.fit import max_batch, max_context
from kvlab.plan.hardware import memory_override_notes
from kvlab.plan.kv_formats import PlannedName, kv_dtype
from kvlab.plan.ledger import build_ledger, kv_bytes_peak
from kvlab.plan.load import load_spec
from kvlab.plan.mixed import MIXED_PREFIX
from kvlab.plan.report_inputs import (
    NO_WEIGHTS,
    check_context_batch,
    context_source,
    context_warnings,
    hardware_and_budget,
    model_notes,
    planned_context,
    planned_spec,
    resolve_hardware,
    shortfall_notes,
    vllm_key,
    weights_or_none,
)
from kvlab.plan.roofline import (
    decode_step_bound,
    intensity_table,
    model_decode_attention_intensity,
    prefill_intensity,
)
from kvlab.plan.spec import QUANTIZED_WEIGHTS_HINT, ModelSpec
from kvlab.plan.video import VideoClip, video_kv

__all__ = [
    "plan_report",
    "roofline_report",
    "video_report",
]

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


def plan_report(
    model: str | ModelSpec,
    *,
    context: int | None = None,
    batch: int | None = None,
    kv: str | PlannedName = "auto",
    group_size: int = KIVI_DEFAULTS.group_size,
    residual_length: int = KIVI_DEFAULTS.residual_length,
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

    ``context`` None (not given): 8,192 tokens, or the model's context limit (``ModelSpec.context_limit``) where
    lower, noted (:func:`kvlab.plan.report_inputs.planned_context`). ``batch`` None (not given): 1 for the ledger, and with
    ``emit="vllm"`` the command's ``--max-num-seqs`` is the requests the KV memory holds at ``context``
    (:func:`kvlab.plan.vllm.vllm_serve_plan`); a given ``batch`` is ``--max-num-seqs`` as it is.

    Top-level keys include ``kv_bytes_per_token``, ``kv_bytes_total``, ``weight_bytes``, ``max_batch``,
    ``max_context`` and ``decode_step_lower_bound_ms``; ``*_per_gpu`` keys are one rank's. With ``emit="vllm"``,
    ``vllm`` holds the ``vllm serve`` command for the plan and the KV cache vLLM would report
    (:func:`kvlab.plan.vllm.vllm_serve_plan`, blocks of ``block_size`` tokens). ``keep_tokens``: an evicting
    cache holding at most that many tokens per layer (:func:`kvlab.plan.kv_formats.kv_dtype`); bytes, fit and decode
    bound are the capped cache's, and ``max_context`` is None (not limited by memory) when the capped KV fits.
    ``warnings``: a ``context`` beyond the model's context limit (:func:`context_warnings`; planned,
    not refused). ``kv``: a name :func:`kvlab.plan.kv_formats.kv_dtype` reads, or a
    :class:`~kvlab.plan.kv_formats.PlannedName` (a cache family's planner bytes, as ``kvlab plan`` asks the
    registry); ``kv="mixed-<plan>"``: the per-layer plan's report instead
    (:func:`kvlab.plan.mixed_report.mixed_plan_report`).

    Raises:
        ValueError: bad input (named), or ``emit="vllm"`` for a plan vLLM cannot run as planned (``kv_heads``:
            vLLM reads the config's heads).
    """
    arguments = dict(locals())
    _check_emit(emit, kv_heads)
    if str(kv).startswith(MIXED_PREFIX):  # a per-layer plan (docs/MIXED.md): kvlab.plan.mixed_report
        from kvlab.plan.mixed_report import mixed_plan_report

        return mixed_plan_report(**arguments)
    spec = planned_spec(model, kv_heads, context, batch)
    context, context_notes = planned_context(spec, context)
    served_batch, batch = batch, 1 if batch is None else batch  # None: --max-num-seqs from the KV memory
    kvd = kv_dtype(
        kv, spec.dtype, group_size=group_size, residual_length=residual_length, keep_tokens=keep_tokens
    )
    weights = weights_or_none(spec, weight_dtype, weights_index, weight_bytes_override)
    ledger = build_ledger(spec, context, batch, weights, kvd, tp=tp)
    hw, budget = hardware_and_budget(gpu, bandwidth_gb_s, tflops, gpu_mem_gib, reserve_gib)
    out: dict[str, Any] = {"spec": spec.summary(), **ledger.to_dict()}
    out["gpu"] = hw.to_dict()
    out["budget"] = None if budget is None else budget.to_dict()
    out.update(_fit(spec, context, batch, kvd, tp, budget, weights, ledger))
    out["decode_attention_intensity"] = model_decode_attention_intensity(spec, kvd)
    out.update(_bound(spec, context, batch, weights, hw, kvd, tp, measured_step_ms))
    notes = list(ledger.notes) + ([NO_WEIGHTS] if weights is None else []) + memory_override_notes(gpu, gpu_mem_gib)
    out["notes"] = context_notes + _weight_source_notes(
        notes + model_notes(spec, tp), weight_dtype, weights_index, weight_bytes_override
    ) + _keep_notes(kvd, context) + shortfall_notes(budget, None if weights is None else ledger.weight_bytes_per_gpu)
    out["warnings"] = context_warnings(spec, {f"--context {context:,}": context})
    out["vllm"] = None
    if emit == "vllm":
        out["vllm"] = vllm_key(
            spec, kvd, model, context, served_batch, tp, budget, weights, ledger.weight_bytes_per_gpu, block_size,
            context_source=context_source(spec, arguments["context"]),  # the context as given (None: not given)
        )
        out["vllm"]["notes"] = context_notes + out["vllm"]["notes"]  # the command's --max-model-len
    return out


def _check_emit(emit: str | None, kv_heads: int | None) -> None:
    """Raise ``ValueError`` for an ``emit`` other than ``"vllm"``, or ``"vllm"`` with the ``kv_heads`` what-if."""
    if emit not in (None, "vllm"):
        raise ValueError(f"`emit` (--emit) must be 'vllm', got {emit!r}")
    if emit == "vllm" and kv_heads is not None:  # vLLM builds the model its config describes
        raise ValueError(
            f"--emit vllm prints a command for the model as its config describes it, which vLLM reads; --kv-heads "
            f"{kv_heads} is a what-if vLLM would not see (its KV cache would have the config's heads): drop one"
        )


def _bound(spec, context, batch, weights, hw, kvd, tp, measured_step_ms) -> dict[str, Any]:
    """The decode step bound's keys and ``measured`` (its comparison with ``measured_step_ms``); each None
    without weight bytes."""
    if weights is None:
        return {**{k: None for k in _BOUND_KEYS}, "measured": None}
    bound = decode_step_bound(
        spec, context, batch, weights.active_bytes, hw.bandwidth_bytes_s, hw.peak_flops, kvd, tp
    )
    return {
        **bound.to_dict(),
        "measured": None if measured_step_ms is None else bound.compare(measured_step_ms),
    }


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
    bytes), whether the plan fits and whether its max context passes the config's limit; every value None
    without a budget or without weight bytes."""
    fit: dict[str, Any] = dict.fromkeys((*_FIT_KEYS, "max_context_above_model_limit"))
    if budget is None or weights is None:
        return fit
    free = budget.kv_budget_bytes(ledger.weight_bytes_per_gpu)
    fit["kv_budget_bytes_per_gpu"] = free
    fit["max_batch"] = max_batch(spec, context, free, kvd, tp=tp)
    fit["max_batch_allocated"] = max_batch(spec, context, free, kvd, tp=tp, mode="allocated")
    fit["max_context"] = max_context(spec, batch, free, kvd, tp=tp)
    fit["max_context_allocated"] = max_context(spec, batch, free, kvd, tp=tp, mode="allocated")
    fit["fits"] = kv_bytes_peak(spec, context, batch, kvd, tp=tp) <= free
    limit = spec.context_limit
    fit["max_context_above_model_limit"] = (
        None if limit is None else (fit["max_context"] is None or fit["max_context"] > limit)
    )
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


def roofline_report(
    *,
    gpu: str | None = None,
    model: str | ModelSpec = "llama-3-8b",
    context: int | None = None,
    batch: int = 1,
    kv: str | PlannedName = "auto",
    group_size: int = KIVI_DEFAULTS.group_size,
    residual_length: int = KIVI_DEFAULTS.residual_length,
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
    machine's measured fp32 roofs (docs/plan.md, Roofline). ``context`` None: 8,192 tokens, or the config's
    ``max_position_embeddings`` where lower, noted (:func:`kvlab.plan.report_inputs.planned_context`). ``warnings``: a ``context`` beyond
    the config's ``max_position_embeddings`` (:func:`context_warnings`; not refused), weights and KV beyond the
    GPU's memory (:func:`_fit_warnings`; the bound is still given).

    Raises:
        ValueError: bad input (named), e.g. a ``gpu`` together with a custom device (:func:`resolve_hardware`).
    """
    check_context_batch(context, batch)
    hw = resolve_hardware(gpu, bandwidth_gb_s, tflops)
    spec = load_spec(model)
    context, context_notes = planned_context(spec, context)
    kvd = kv_dtype(
        kv, spec.dtype, group_size=group_size, residual_length=residual_length, keep_tokens=keep_tokens
    )
    weights = weights_or_none(spec, weight_dtype, weights_index, weight_bytes_override)
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
    out["notes"] = context_notes + _weight_source_notes(
        list(spec.notes), weight_dtype, weights_index, weight_bytes_override
    )
    out["notes"] += _keep_notes(kvd, context)
    bound = _bound(spec, context, batch, weights, hw, kvd, tp, measured_step_ms)
    measured = bound.pop("measured")  # this report lists it after the weight bytes
    out.update(bound)
    out["weight_bytes"] = None if weights is None else weights.total_bytes
    out["weight_bytes_source"] = None if weights is None else weights.source
    out["measured"] = measured
    if weights is None:
        out["notes"].append(NO_WEIGHTS)
    out["warnings"] = context_warnings(spec, {f"--context {context:,}": context}) + _fit_warnings(out, hw, tp)
    out["probe"] = _local_probe(out["prefill"], probe_kwargs) if run_probe else None
    return out


def _fit_warnings(out: dict[str, Any], hw: Any, tp: int) -> list[str]:
    """A roofline whose weights and KV do not fit the GPU's memory (per GPU with ``tp``): its bound describes a setup
    that cannot run, which ``kvlab plan`` would say (the bound is computed all the same)."""
    memory = hw.memory_bytes
    if memory is None or out["weight_bytes"] is None or out.get("kv_bytes_read") is None:
        return []
    held = out["weight_bytes"] / tp + out["kv_bytes_read"]  # every weight and the whole cache on each GPU's share
    if held <= memory:
        return []
    gib = 1024**3
    return [
        f"the weights and KV need {held / gib:,.2f} GiB per GPU and {hw.name} has {memory / gib:,.2f} GiB: this setup "
        "does not fit (see `kvlab plan` for what fits); the decode bound is for memory it does not have"
    ]


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
    fps: int = VideoClip.fps,
    width: int = VideoClip.width,
    height: int = VideoClip.height,
    temporal_compression: int = VideoClip.temporal_compression,
    spatial_compression: int = VideoClip.spatial_compression,
    patch_size: int = VideoClip.patch_size,
    causal_first_frame: bool = VideoClip.causal_first_frame,
    kv: str | PlannedName = "auto",
    group_size: int = KIVI_DEFAULTS.group_size,
    residual_length: int = KIVI_DEFAULTS.residual_length,
    batch: int = 1,
) -> dict[str, Any]:
    """Tokens and KV bytes of clips of each length in ``seconds`` (docs/plan.md, Video); frame rate, size,
    compression and patch default to :class:`VideoClip`'s.
    ``warnings``: pixels and frames the tokens leave out (:meth:`VideoClip.rounding_warnings`: a width, height or
    frame count the compression does not divide is rounded down, not refused), then the clips whose tokens go
    beyond the config's ``max_position_embeddings`` (not refused).

    Raises:
        ValueError: a bad ``batch``, a clip length given twice (one row each would repeat), or what
            :class:`VideoClip`, :func:`load_spec` and :func:`kv_dtype` refuse.
    """
    check_int_at_least("batch", batch, 1)
    repeated = sorted({s for s in seconds if list(seconds).count(s) > 1}, key=str)
    if repeated:
        raise ValueError(
            f"`seconds` lists {', '.join(map(number_text, repeated))} more than once, got "
            f"{' '.join(map(number_text, seconds))}"
        )
    spec = load_spec(model)
    kvd = kv_dtype(kv, spec.dtype, group_size=group_size, residual_length=residual_length)
    rows, rounding = [], {}
    for s in seconds:
        clip = VideoClip(
            s, fps, width, height, temporal_compression, spatial_compression, patch_size, causal_first_frame
        )
        rows.append(video_kv(spec, clip, kvd, batch))
        rounding.update(dict.fromkeys(clip.rounding_warnings()))  # a width's is said once, not per clip
    return {
        "model": spec.name,
        "kv_dtype": kvd.to_dict(),
        "batch": batch,
        "clips": rows,
        "notes": list(spec.notes),
        "warnings": list(rounding)
        + context_warnings(
            spec, {f"the {row['seconds']:g} s clip ({row['tokens']:,} tokens)": row["tokens"] for row in rows}
        ),
    }
