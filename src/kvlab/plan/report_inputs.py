"""What the planner's reports share: the model, hardware, weights and GPU budget they resolve, the warnings and
notes they attach, and the ``--emit vllm`` key (:mod:`kvlab.plan.report` for one KV dtype,
:mod:`kvlab.plan.mixed_report` for a per-layer plan). Pure Python; no torch.
"""

from __future__ import annotations

from typing import Any

from kvlab.plan.config_fields import SHARED, check_int_at_least
from kvlab.plan.fit import GpuBudget, budget_from_hardware, gib_budget
from kvlab.plan.hardware import Hardware, custom_hardware, get_hardware
from kvlab.plan.load import load_spec
from kvlab.plan.scenario import DEFAULT_CONTEXT_TOKENS, DEFAULT_GPU
from kvlab.plan.spec import ModelSpec
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


def weights_or_none(
    spec: ModelSpec, weight_dtype: str, index: str | None, given: int | None
) -> WeightBytes | None:
    """The weight bytes of ``spec`` (:func:`kvlab.plan.weights.weight_bytes`: ``given`` bytes, an ``index``
    file, or the parameter count in ``weight_dtype``), or None when the config cannot give them."""
    try:
        return weight_bytes(spec, weight_dtype, index_path=index, override_bytes=given)
    except UnknownWeightsError:
        return None


NO_WEIGHTS = "weight bytes unknown (the config has no vocab/intermediate sizes): pass --weight-bytes or --weights-index"


def planned_spec(
    model: str | ModelSpec, kv_heads: int | None, context: int | None, batch: int | None
) -> ModelSpec:
    """The spec of ``model`` (:func:`kvlab.plan.load.load_spec`) for ``batch`` sequences of ``context`` tokens
    (None: not given, the defaults of :func:`planned_context`), with ``kv_heads`` KV heads when given (the
    ``--kv-heads`` what-if).

    Raises:
        ValueError: ``context`` or ``batch`` given and not a positive integer (:func:`check_context_batch`, checked
            before the model is read), or what :func:`kvlab.plan.load.load_spec` refuses.
    """
    check_context_batch(context, batch)
    spec = load_spec(model)
    return spec.with_kv_heads(kv_heads) if kv_heads is not None else spec


def check_context_batch(context: int | None, batch: int | None) -> None:
    """Tokens per sequence and sequences must both be positive integers where given (None: not given).

    Raises:
        ValueError: naming ``--context`` or ``--batch`` and the value.
    """
    for name, value in (("context", context), ("batch", batch)):
        if value is not None:
            check_int_at_least(name, value, 1, flag=f"--{name}")


def planned_context(spec: ModelSpec, context: int | None) -> tuple[int, list[str]]:
    """``(tokens per sequence, notes)``: ``context`` where given; where None (no ``--context``) kvlab's default
    :data:`~kvlab.plan.scenario.DEFAULT_CONTEXT_TOKENS` (8,192), or the model's context limit where that is lower
    (:attr:`~kvlab.plan.spec.ModelSpec.context_limit`: ``max_position_embeddings`` with its ``rope_scaling`` as vLLM
    derives it; gpt2: 1,024), with a note saying which and why. A default beyond the model's limit was warned about
    as if the user had asked for it; 4,096 positions with a linear factor 4 were planned at 4,096 though vLLM
    serves 16,384."""
    limit = spec.context_limit
    if context is not None:
        return context, []
    if limit is None or limit >= DEFAULT_CONTEXT_TOKENS:
        return DEFAULT_CONTEXT_TOKENS, []
    return limit, [
        f"context {limit:,} tokens: {spec.name}'s {spec.limit_words()} (no --context given; kvlab's default "
        f"{DEFAULT_CONTEXT_TOKENS:,} is beyond the model's limit)"
    ]


def context_source(spec: ModelSpec, context: int | None) -> str | None:
    """How a refusal names the context :func:`planned_context` plans for ``context`` when ``--context`` was not
    given (``context`` None): ``"the default context 8,192 tokens (no --context given)"``, or ``"the context 1,024
    tokens (gpt2's max_position_embeddings; no --context given)"`` where the model's limit set it. None where
    ``context`` was given: the refusal names ``--context N`` as the user typed it."""
    if context is not None:
        return None
    planned, _ = planned_context(spec, None)
    if planned == DEFAULT_CONTEXT_TOKENS:
        return f"the default context {planned:,} tokens (no --context given)"
    return f"the context {planned:,} tokens ({spec.name}'s {spec.limit_words()}; no --context given)"


def context_warnings(spec: ModelSpec, contexts: dict[str, int]) -> list[str]:
    """One warning when any of ``contexts`` (``{"--context 100,000": 100000}``: how the output names each, and its
    tokens) goes beyond the model's context limit (:attr:`~kvlab.plan.spec.ModelSpec.context_limit`): the config's
    ``max_position_embeddings``, the window the model was trained for, or with the config's ``rope_scaling`` the
    longer limit vLLM derives from it (it was warned about at ``max_position_embeddings`` "without RoPE scaling"
    though the config scales it). Planned as asked, not refused, but said. [] when all are within it or the
    config states no limit."""
    limit = spec.context_limit
    over = [name for name, tokens in contexts.items() if limit is not None and tokens > limit]
    if not over:
        return []
    verb = "is" if len(over) == 1 else "are"
    if limit == spec.max_position_embeddings and spec.rope_scaling is None:
        return [
            f"{', '.join(over)} {verb} beyond {spec.name}'s {spec.position_field or 'max_position_embeddings'} "
            f"{limit:,} (the config's context limit): counted as asked, but the model may not serve that many tokens "
            f"without RoPE scaling or another context extension"
        ]
    return [
        f"{', '.join(over)} {verb} beyond {spec.name}'s context limit {limit:,} ({spec.limit_words()}, as vLLM "
        f"derives its longest max_model_len): counted as asked, but the model may not serve that many tokens"
    ]


def hardware_and_budget(
    gpu: str | None,
    bandwidth_gb_s: float | None,
    tflops: float | None,
    gpu_mem_gib: float | None,
    reserve_gib: float,
) -> tuple[Hardware, GpuBudget | None]:
    """The device (:func:`resolve_hardware`) and the memory the plan fits into: ``gpu_mem_gib`` when given, else
    the device's reported memory, else None (a custom device without memory: no fit is computed).

    Raises:
        ValueError: what :func:`resolve_hardware` refuses, then a bad ``gpu_mem_gib`` or ``reserve_gib``
            (:func:`kvlab.plan.fit.budget_from_gib`, :func:`~kvlab.plan.fit.budget_from_hardware`), named by
            these parameters (`gpu_mem_gib`, `reserve_gib`).
    """
    hw = resolve_hardware(gpu, bandwidth_gb_s, tflops)
    if gpu_mem_gib is not None:
        return hw, gib_budget(gpu_mem_gib, reserve_gib, "gpu_mem_gib")
    if hw.memory_bytes is not None:
        return hw, budget_from_hardware(hw, reserve_gib)
    return hw, None


def shortfall_notes(budget: GpuBudget | None, weight_bytes_per_gpu: int | None) -> list[str]:
    """The ``does not fit`` note where the weights and reserve exceed the memory (:meth:`GpuBudget.shortfall_note`:
    a fit of 0 sequences that is not a KV limit); none without a budget or weights."""
    if budget is None or weight_bytes_per_gpu is None:
        return []
    note = budget.shortfall_note(weight_bytes_per_gpu)
    return [note] if note else []


def model_notes(spec: ModelSpec, tp: int) -> list[str]:
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


def vllm_key(
    spec, kvd, model, context, batch, tp, budget, weights, weight_bytes_per_gpu, block_size, skip_layers=(),
    *, context_source: str | None = None,
) -> dict[str, Any]:
    """The ``vllm`` key of :func:`kvlab.plan.report.plan_report` (and of a mixed plan's report): needs the GPU memory and the
    weights, as the fit does; ``skip_layers``: ``--kv-cache-dtype-skip-layers``
    (:func:`kvlab.plan.vllm.vllm_serve_plan`); ``batch`` None: ``--max-num-seqs`` from the KV memory; a ``context``
    beyond the longest vLLM takes (:func:`kvlab.plan.vllm.vllm_max_model_len`) is refused; ``context_source``: how
    those refusals name a context not given (:func:`context_source`)."""
    from kvlab.plan.load import load_config
    from kvlab.plan.vllm import vllm_max_model_len, vllm_model_argument, vllm_serve_plan

    if kvd.keep_tokens is not None:
        raise ValueError("--emit vllm plans vLLM, which keeps every token; --keep-tokens does not apply")
    if budget is None:
        raise ValueError("--emit vllm needs the GPU memory: pass --gpu-mem-gib or a --gpu from the table")
    if weights is None:
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
        weight_bytes_per_gpu=weight_bytes_per_gpu,
        block_size=block_size,
        skip_layers=tuple(skip_layers),
        context_limit=vllm_max_model_len(spec, load_config(model)),
        context_source=context_source,
    )
    return {**plan.to_dict(), "predicted_log": predicted_log(spec, model, plan, tp)}


def predicted_log(spec: ModelSpec, model, plan, tp: int) -> dict[str, Any]:
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
            kv_cache_dtype_skip_layers=plan.kv_cache_dtype_skip_layers,
        )
        out.update(kv_cache_tokens=kv.kv_cache_tokens, max_concurrency=kv.max_concurrency)
    else:
        out["shortfall_bytes"] = -available
    return out
