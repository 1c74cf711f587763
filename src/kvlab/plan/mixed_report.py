"""``kvlab plan MODEL --kv-dtype mixed-<plan>``: KV bytes, fit and the closest ``vllm serve`` of a per-layer plan.

A plan (:mod:`kvlab.plan.mixed`, docs/MIXED.md) gives each layer its own K and V format, so the one-dtype ledger
(:mod:`kvlab.plan.ledger`) does not cover it; this module sums the plan's layers instead, with the same exact
per-layer bytes (:func:`kvlab.plan.mixed.plan_layer_bytes`, what ``MixedCache.nbytes()`` measures):

* bytes per token: each layer's long-context figure (``2 * kv_heads * head_dim * p``, KIVI's ``p = b/8 + 2m/G``
  with the residual window amortized away, as :func:`kvlab.plan.ledger.kv_bytes_per_token`), summed;
* bytes per request (one sequence of ``context`` tokens) and in total (``batch`` of them), exact;
* the peak while decoding: every KIVI layer of a plan shares ``G`` and ``R`` and so flushes at the same lengths,
  the FP8 and float layers only grow, so the most held at any length ``<= context`` is at ``context`` or just
  before the last flush below it (:func:`kvlab.plan.ledger.kv_bytes_peak`'s argument);
* fit: the largest batch at ``context`` and the longest context at ``batch`` whose peak fits the GPU's KV budget
  (:mod:`kvlab.plan.fit`'s budget: memory - reserve - weights).

``--emit vllm``: vLLM stores one ``--kv-cache-dtype`` and keeps the layers of ``--kv-cache-dtype-skip-layers``
in the model dtype (vllm-project/vllm ``vllm/model_executor/layers/attention/attention.py``: a skipped layer gets
``kv_cache_dtype="auto"``; docs.vllm.ai, Quantized KV Cache, "Skipping Specific Layers from KV-Cache
Quantization"). A plan of FP8 and float layers is exactly that; a plan with KIVI layers is not, and gets the
closest configuration vLLM can run, stated as such: its KIVI layers in fp8, its float layers skipped.

Pure Python; no torch.
"""

from __future__ import annotations

from typing import Any

from kvlab.cache_names import KIVI_DEFAULTS, parse_cache_name
from kvlab.plan.fit import longest_fitting
from kvlab.plan.hardware import memory_override_notes
from kvlab.plan.kv_formats import kv_dtype
from kvlab.plan.ledger import kv_elements_per_token_per_layer
from kvlab.plan.mixed import (
    MIXED_PREFIX,
    check_plan_name,
    family,
    find_plan,
    layer_formats,
    ledger_name,
    plan_layer_bytes,
    plan_summary,
)
from kvlab.plan.report_inputs import (
    NO_WEIGHTS,
    context_source,
    context_warnings,
    hardware_and_budget,
    model_notes,
    planned_context,
    planned_spec,
    shortfall_notes,
    vllm_key,
    weights_or_none,
)
from kvlab.plan.spec import ModelSpec


def resolve_plan(kv: str, spec: ModelSpec) -> tuple[str, list[tuple[str, str]], str]:
    """``(plan name, [(k, v)] per layer, source)`` of ``kv = "mixed-<plan>"`` for ``spec``.

    Raises:
        ValueError: an unknown plan (the known ones listed), a plan file that cannot be read, or a plan that does
            not fit the model (a layer it lacks, a layer without formats; :func:`kvlab.plan.mixed.layer_formats`),
            each message naming `kv_dtype` and the value (``kvlab plan`` says ``--kv-dtype``).
    """
    name = str(kv).removeprefix(MIXED_PREFIX)
    try:
        if ":" in name:  # a :setting outside the grammar (an empty value) is named as the registry names it
            parse_cache_name(str(kv), ("mixed",))
            plan_name, settings = name.split(":", 1)
            raise ValueError(
                f"the planner takes no settings on a per-layer plan (it sizes each layer's format at the KIVI "
                f"defaults, G and R in its table's title): drop ':{settings}' (--kv-dtype {MIXED_PREFIX}{plan_name})"
            )
        check_plan_name(name)
        plan, source = find_plan(name)
        formats = layer_formats(plan, spec.num_layers)
    except ValueError as exc:
        raise ValueError(f"`kv_dtype` {kv!r} for {spec.name} ({spec.num_layers} layers): {exc}") from None
    return name, formats, source


class MixedBytes:
    """Exact bytes of one plan on one model and rank: per layer, per request, peak (see the module docstring).

    Args:
        spec: the model (every layer full attention); formats: ``[(k, v)]`` per layer.
        group_size, residual_length: KIVI ``G`` and ``R`` of the plan's KIVI layers; tp: tensor-parallel ranks.

    Raises:
        ValueError: what :func:`kvlab.plan.mixed.plan_layer_bytes` refuses.
    """

    def __init__(
        self, spec: ModelSpec, formats: list[tuple[str, str]], group_size: int, residual_length: int, tp: int
    ):
        self.spec, self.formats, self.tp = spec, formats, tp
        self.kivi = {"group_size": group_size, "residual_length": residual_length}
        self.has_kivi = any(family(k) == "kivi" for k, _ in formats)
        self.layer_bytes(0)  # validates the model, the formats, G, R and tp once

    def layer_bytes(self, tokens: int, batch: int = 1) -> list[int]:
        """Bytes each layer holds for ``batch`` sequences of ``tokens`` tokens."""
        return plan_layer_bytes(self.spec, self.formats, tokens, batch, tp=self.tp, **self.kivi)

    def total(self, tokens: int, batch: int = 1) -> int:
        return sum(self.layer_bytes(tokens, batch))

    def peak(self, tokens: int, batch: int = 1) -> int:
        """The most held at any length ``<= tokens``: at ``tokens`` or just before the last KIVI flush below it."""
        now = self.total(tokens, batch)
        g, r = self.kivi["group_size"], self.kivi["residual_length"]
        if not self.has_kivi or tokens < r + g - 1:
            return now
        return max(now, self.total(r + (tokens - r + 1) // g * g - 1, batch))

    def per_token(self) -> float | int:
        """Long-context bytes per token, all layers (KIVI's residual window amortized away)."""
        elements = kv_elements_per_token_per_layer(self.spec, self.tp)
        value = sum(
            elements * kv_dtype(ledger_name(k, v), self.spec.dtype, **self.kivi).bytes_per_element
            for k, v in self.formats
        )
        return int(value) if value.denominator == 1 else float(value)

    def max_batch(self, context: int, free: int) -> int:
        """Most sequences of ``context`` tokens that fit in ``free`` bytes; 0 for a negative ``free`` (weights and
        reserve past the memory: :func:`kvlab.plan.report_inputs.shortfall_notes` says so)."""
        return 0 if free < 0 else free // self.peak(context)

    def max_context(self, batch: int, free: int) -> int:
        """Longest context whose ``batch`` sequences fit in ``free`` bytes at every length (0 if one token does
        not); every layer of a plan keeps all its tokens, so memory always limits it."""
        if self.peak(1, batch) > free:
            return 0
        return longest_fitting(lambda t: self.peak(t, batch) <= free)


def mixed_plan_report(
    model: str | ModelSpec, *, kv: str, context: int | None = None, batch: int | None = None, **options: Any
) -> dict[str, Any]:
    """:func:`kvlab.plan.report.plan_report` for ``kv = "mixed-<plan>"`` (same arguments): the plan's layers and
    formats, KV bytes per token, per request (``kv_bytes_per_request``) and in total, the peak, the fit and, with
    ``emit="vllm"``, the closest ``vllm serve`` command (``vllm``; :func:`vllm_for_plan`).

    Raises:
        ValueError: an unknown plan or one the model cannot hold (named with ``--kv-dtype``), ``keep_tokens``
            (a plan keeps every token) or ``measured_step_ms`` (no decode bound is computed for a plan), and what
            :func:`kvlab.plan.report.plan_report` refuses.
    """
    o = options
    for flag, key in (("--keep-tokens", "keep_tokens"), ("--measured-step-ms", "measured_step_ms")):
        if o.get(key) is not None:
            raise ValueError(f"{flag} {o[key]} does not apply to --kv-dtype {kv}: {_NOT_FOR_PLANS[key]}")
    spec = planned_spec(model, o.get("kv_heads"), context, batch)
    source = context_source(spec, context)  # how a refusal names a context not given
    context, context_notes = planned_context(spec, context)
    served_batch, batch = batch, 1 if batch is None else batch  # None: --max-num-seqs from the KV memory
    name, formats, source = resolve_plan(kv, spec)
    tp = o.get("tp", 1)
    sizes = MixedBytes(
        spec,
        formats,
        o.get("group_size", KIVI_DEFAULTS.group_size),
        o.get("residual_length", KIVI_DEFAULTS.residual_length),
        tp,
    )
    weights = weights_or_none(
        spec, o.get("weight_dtype", "auto"), o.get("weights_index"), o.get("weight_bytes_override")
    )
    hw, budget = hardware_and_budget(
        o.get("gpu"), o.get("bandwidth_gb_s"), o.get("tflops"), o.get("gpu_mem_gib"), o.get("reserve_gib", 0.0)
    )
    out: dict[str, Any] = {
        "spec": spec.summary(),
        "model": spec.name,
        "kv_dtype": {"name": kv, "plan": name, "plan_source": source, **sizes.kivi},
        "plan_layers": [{"layer": i, "k": k, "v": v} for i, (k, v) in enumerate(formats)],
        "plan_summary": plan_summary(formats),
        "context": context,
        "batch": batch,
        "tp": tp,
        **_bytes_keys(sizes, context, batch),
        "gpu": hw.to_dict(),
        "budget": None if budget is None else budget.to_dict(),
        "weight_bytes": None if weights is None else weights.total_bytes,
        "weight_bytes_per_gpu": None if weights is None else -(-weights.total_bytes // tp),
        "weight_bytes_source": None if weights is None else weights.source,
    }
    out.update(_fit(sizes, context, batch, budget, out["weight_bytes_per_gpu"]))
    out["notes"] = context_notes + list(spec.notes) + model_notes(spec, tp) + ([NO_WEIGHTS] if weights is None else [])
    out["notes"] += shortfall_notes(budget, out["weight_bytes_per_gpu"])
    out["notes"] += memory_override_notes(o.get("gpu"), o.get("gpu_mem_gib"))
    out["warnings"] = context_warnings(spec, {f"--context {context:,}": context})
    out["vllm"] = None
    if o.get("emit") == "vllm":
        out["vllm"] = vllm_for_plan(
            spec, formats, sizes, model, context, served_batch, tp, budget, weights, o, context_source=source
        )
        out["vllm"]["notes"] = context_notes + out["vllm"]["notes"]  # the command's --max-model-len
    return out


_NOT_FOR_PLANS = {
    "keep_tokens": "a mixed-precision plan keeps every token",
    "measured_step_ms": "kvlab plan computes no decode bound for a mixed-precision plan",
}


def _bytes_keys(sizes: MixedBytes, context: int, batch: int) -> dict[str, Any]:
    """The report's KV byte keys for one rank (``*_per_gpu``) and summed over the ``tp`` ranks."""
    tp = sizes.tp
    per_token = sizes.per_token()
    layers = sizes.layer_bytes(context, batch)
    return {
        "kv_bytes_per_token_per_gpu": per_token,
        "kv_bytes_per_token": per_token * tp,
        "kv_bytes_per_request_per_gpu": sizes.total(context),
        "kv_bytes_per_layer_per_gpu": layers,
        "kv_bytes_total_per_gpu": sum(layers),
        "kv_bytes_total": sum(layers) * tp,
        "kv_bytes_peak_per_gpu": sizes.peak(context, batch),
    }


def _fit(
    sizes: MixedBytes, context: int, batch: int, budget, weight_bytes_per_gpu: int | None
) -> dict[str, Any]:
    """KV budget per GPU, largest batch, longest context and whether the plan fits; None without a budget or
    weights."""
    if budget is None or weight_bytes_per_gpu is None:
        return dict.fromkeys(("kv_budget_bytes_per_gpu", "max_batch", "max_context", "fits"))
    free = budget.kv_budget_bytes(weight_bytes_per_gpu)
    return {
        "kv_budget_bytes_per_gpu": free,
        "max_batch": sizes.max_batch(context, free),
        "max_context": sizes.max_context(batch, free),
        "fits": sizes.peak(context, batch) <= free,
    }


def vllm_expression(formats: list[tuple[str, str]]) -> tuple[str, tuple[int, ...], list[int]]:
    """``(kvlab --kv-dtype, skipped layers, substituted layers)``: the vLLM cache closest to a plan.

    ``fp8-e4m3`` for the quantized layers (vLLM's ``fp8_e4m3``) with the float layers skipped
    (``--kv-cache-dtype-skip-layers``), or ``auto`` when every layer is float. Substituted: the KIVI layers, which
    vLLM has no format for and which run as fp8 (an empty list when the plan is expressed exactly).
    """
    floats = tuple(i for i, (k, _) in enumerate(formats) if family(k) == "float")
    kivi = [i for i, (k, _) in enumerate(formats) if family(k) == "kivi"]
    if len(floats) == len(formats):
        return "auto", (), []
    return "fp8-e4m3", floats, kivi


def vllm_for_plan(
    spec: ModelSpec,
    formats: list[tuple[str, str]],
    sizes: MixedBytes,
    model: Any,
    context: int,
    batch: int | None,
    tp: int,
    budget: Any,
    weights: Any,
    o: dict[str, Any],
    *,
    context_source: str | None = None,
) -> dict[str, Any]:
    """The ``vllm`` key of :func:`mixed_plan_report`: the command (:func:`kvlab.plan.vllm.vllm_serve_plan` with
    ``skip_layers``), the KV tokens vLLM would report under it and, for a plan it cannot express, ``closest``: what
    was changed and the bytes per token of both."""
    name, skip, substituted = vllm_expression(formats)
    per_gpu = None if weights is None else -(-weights.total_bytes // tp)
    out = vllm_key(
        spec,
        kv_dtype(name, spec.dtype),
        model,
        context,
        batch,
        tp,
        budget,
        weights,
        per_gpu,
        o.get("block_size", 16),
        skip,
        context_source=context_source,
    )
    out["expresses_plan"] = not substituted
    out["closest"] = None
    if substituted:
        served = [("float", "float") if i in skip else ("fp8-e4m3", "fp8-e4m3") for i in range(len(formats))]
        served_bytes = MixedBytes(spec, served, sizes.kivi["group_size"], sizes.kivi["residual_length"], tp)
        kinds = sorted({f"{k}/{v}" for i, (k, v) in enumerate(formats) if i in substituted})
        skipped = (
            f" and its float layer{'s' if len(skip) > 1 else ''} {', '.join(map(str, skip))} skipped"
            if skip
            else ""
        )
        n = len(substituted)
        out["closest"] = (
            f"closest vLLM configuration, not the plan: vLLM has no KIVI cache, so the plan's {n} "
            f"KIVI layer{'s' if n != 1 else ''} ({', '.join(kinds)} keys/values) {'are' if n != 1 else 'is'} "
            f"stored as fp8{skipped}: "
            f"{served_bytes.per_token():,} KV B/token/GPU against the plan's {sizes.per_token():,}"
        )
    return out
