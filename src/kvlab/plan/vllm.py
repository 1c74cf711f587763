"""``vllm serve`` flags for a plan, and the KV cache size vLLM would report for that memory (no vLLM needed).

vLLM's v1 engine sizes its KV cache this way (``vllm/v1/worker/gpu_worker.py``, ``vllm/v1/core/kv_cache_utils.py``,
``vllm/v1/kv_cache_interface.py``):

* the engine may use ``gpu_memory_utilization x`` the device's total memory; the KV cache gets what is left after
  the weights, the profiled activation peak and non-torch allocations;
* one block holds ``block_size`` tokens of one layer on one GPU: its page is
  ``2 x block_size x KV heads per rank x head_size x dtype bytes`` (K and V; ``max(1, KV heads // tp)`` heads per
  rank), or ``block_size x (kv_lora_rank + qk_rope_head_dim) x dtype bytes`` for an MLA latent;
* ``num_blocks = available memory // page // layers`` (:func:`kvlab.plan.vllm_kv.vllm_kv_cache`, which also
  groups hybrid models as vLLM does) and the log line ``GPU KV cache size: N tokens`` says
  ``num_blocks x block_size`` (later versions log ``max_concurrency x max_model_len``, the same number when
  ``max_model_len`` is a multiple of ``block_size``); ``Maximum concurrency for L tokens per request`` is
  ``num_blocks / ceil(L / block_size)``.

Only models whose every layer is full attention are covered: vLLM's hybrid KV cache manager groups sliding,
chunked, shared and Mamba layers with other page sizes. Pure Python; no torch.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvlab.plan.config_fields import (
    FULL,
    LAYER_KINDS,
    VLLM_DEFAULT_MAX_LEN,
    check_int_at_least,
    decoder_config,
    rope_scaling_of,
)
from kvlab.plan.kv_formats import KVDtype
from kvlab.plan.spec import ModelSpec
from kvlab.plan.vllm_kv import vllm_kv_cache
from kvlab.plan.vllm_memory import scheduler_defaults

VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)  # vllm.config.cache.BlockSize
_VLLM_DTYPE = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16", "float32": "float32"}
_CANONICAL = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32"}


@dataclass(frozen=True)
class VllmServePlan:
    """A ``vllm serve`` command for a plan and the KV cache vLLM would build with it, on one GPU of ``tp``."""

    args: tuple[str, ...]  # argv after the program name: ("serve", MODEL, "--dtype", ...)
    max_model_len: int  # --max-model-len: tokens per sequence (the plan's context)
    max_num_seqs: int  # --max-num-seqs: requests vLLM runs at a time (the plan's batch, or what the KV holds)
    tensor_parallel_size: int  # --tensor-parallel-size (the plan's tp)
    block_size: int  # --block-size: tokens per KV block
    kv_cache_dtype: str  # --kv-cache-dtype: "auto" (the model dtype) or "fp8"
    gpu_memory_utilization: float  # --gpu-memory-utilization: fraction of the device's memory vLLM may use
    memory_bytes: int  # the device's memory the plan assumed
    weight_bytes_per_gpu: int  # one GPU's share of the weights
    kv_memory_bytes_per_gpu: int  # utilization x memory - weights: vLLM's KV memory with no activations
    page_size_bytes: int  # one block of one layer on one GPU
    num_layers: int  # layers holding KV
    num_gpu_blocks: int  # blocks per layer that fit in kv_memory_bytes_per_gpu
    kv_cache_tokens: int  # "GPU KV cache size: N tokens"
    max_concurrency: float  # "Maximum concurrency for max_model_len tokens per request"
    notes: tuple[str, ...] = field(default=())
    kv_cache_dtype_skip_layers: tuple[
        int, ...
    ] = ()  # --kv-cache-dtype-skip-layers: layers in the model dtype
    # (page bytes of one block of one layer, layers with that page): one pair unless layers are skipped
    layer_pages: tuple[tuple[int, int], ...] = ()

    @property
    def command_line(self) -> str:
        """The shell-quoted command: ``vllm serve MODEL --flag value ...``."""
        return shlex.join(["vllm", *self.args])

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": ["vllm", *self.args],
            "command_line": self.command_line,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "tensor_parallel_size": self.tensor_parallel_size,
            "block_size": self.block_size,
            "kv_cache_dtype": self.kv_cache_dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "memory_bytes": self.memory_bytes,
            "weight_bytes_per_gpu": self.weight_bytes_per_gpu,
            "kv_memory_bytes_per_gpu": self.kv_memory_bytes_per_gpu,
            "page_size_bytes": self.page_size_bytes,
            "num_layers": self.num_layers,
            "num_gpu_blocks": self.num_gpu_blocks,
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": self.max_concurrency,
            "kv_cache_dtype_skip_layers": list(self.kv_cache_dtype_skip_layers),
            "layer_pages": [{"page_size_bytes": p, "layers": n} for p, n in self.layer_pages],
            "notes": list(self.notes),
        }


def vllm_model_argument(model: str | os.PathLike) -> str:
    """What ``vllm serve`` is given for ``model``: a preset's hub id, a model directory (a ``config.json`` path
    names its directory), or ``model`` itself (a hub id).

    Raises:
        ValueError: ``model`` is a file not named ``config.json`` (vLLM reads ``<directory>/config.json``, so its
            folder would not be the model this plan read).
    """
    from kvlab.plan import presets

    text = os.fspath(model)
    preset = presets.find(text)
    if preset is not None:
        return preset.hub_id
    path = Path(text).expanduser()
    if path.is_file():
        if path.name != "config.json":
            raise ValueError(
                f"--emit vllm serves a model directory or hub id; {path} is a file not named config.json, so its "
                f"folder {path.parent} is not the model planned (copy it to <model dir>/config.json)"
            )
        return str(path.parent)
    return text


def vllm_max_model_len(spec: ModelSpec, config: Mapping | None = None) -> int | None:
    """The longest ``--max-model-len`` vLLM starts ``spec`` with, in tokens: the smallest position field of the
    config (:attr:`ModelSpec.max_position_embeddings`, named by :attr:`ModelSpec.position_field`:
    :func:`kvlab.plan.config_fields.position_limit`; a pooling model's capped by its tokenizer's
    ``model_max_length``), or vLLM's default 2,048 where ``config`` states none, times the RoPE ``factor``
    (``rope_scaling`` or ``rope_parameters``) unless its type is ``su``, ``longrope`` or ``llama3`` (``yarn``: its
    ``original_max_position_embeddings`` times the factor; :func:`kvlab.plan.config_fields.rope_scaling_of`, which
    :attr:`ModelSpec.context_limit` holds for a spec read from ``config``). Without ``config``,
    :attr:`ModelSpec.context_limit` (None where the spec states no limit). A longer ``--max-model-len`` makes vLLM
    refuse to start ("User-specified max_model_len ... is greater than the derived max_model_len") unless
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``. Source: vLLM's ``_get_and_verify_max_len`` (``vllm/config.py``; since
    moved to ``vllm/config/model.py``).
    """
    if config is None:
        return spec.context_limit
    return rope_scaling_of(decoder_config(config)[0], spec.max_position_embeddings or VLLM_DEFAULT_MAX_LEN)[0]


def _cache_dtype(spec: ModelSpec, kvd: KVDtype) -> tuple[str, str]:
    """``(--dtype, --kv-cache-dtype)`` that store K/V as ``kvd``.

    Raises:
        ValueError: a KV dtype vLLM cannot store for this model (named with its flag).
    """
    model_dtype = _VLLM_DTYPE.get(spec.dtype)
    if model_dtype is None:
        raise ValueError(
            f"--emit vllm needs a 16/32-bit model dtype for vLLM's --dtype, the config says {spec.dtype!r}"
        )
    if kvd.is_kivi:
        raise ValueError(
            f"vLLM has no KIVI cache: --kv-dtype {kvd.cache_name} has no --kv-cache-dtype; use auto ({spec.dtype}) or "
            "fp8"
        )
    if kvd.name == _CANONICAL[spec.dtype]:
        return model_dtype, "auto"
    if kvd.name == "fp8":
        if spec.is_mla:
            raise ValueError(
                "--kv-dtype fp8 with MLA: vLLM's fp8 latent layout depends on the attention backend (e.g. 656 B "
                "per token for fp8_ds_mla), so the plan's bytes would not be vLLM's; use --kv-dtype auto"
            )
        return model_dtype, "fp8"
    if (
        kvd.fp8_scale is not None
    ):  # kvlab's FP8Cache names: vLLM's fp8_e4m3 / fp8_e5m2 store the same 1 B/element
        if spec.is_mla:
            raise ValueError(
                f"--kv-dtype {kvd.name} with MLA: vLLM's fp8 latent layout depends on the attention backend, so the "
                "plan's bytes would not be vLLM's; use --kv-dtype auto"
            )
        if kvd.name.endswith("-hadamard"):
            raise ValueError(
                f"--kv-dtype {kvd.name}: vLLM does not rotate K/V before its fp8 cache, so no vllm flag stores "
                f"what this cache stores; --kv-dtype {kvd.name.removesuffix('-hadamard')} has the same bytes"
            )
        return model_dtype, "fp8_" + kvd.name.split("-")[1]
    raise ValueError(
        f"vLLM stores K/V in the model dtype ({spec.dtype}, --kv-cache-dtype auto) or in fp8; --kv-dtype "
        f"{kvd.name} has no vllm flag"
    )


def vllm_serve_plan(
    spec: ModelSpec,
    kvd: KVDtype,
    *,
    model: str,
    context: int,
    batch: int | None,
    tp: int,
    memory_bytes: int,
    reserve_bytes: int,
    weight_bytes_per_gpu: int,
    block_size: int = 16,
    skip_layers: tuple[int, ...] = (),
    context_limit: int | None = None,
    context_source: str | None = None,
) -> VllmServePlan:
    """The ``vllm serve`` command that runs ``spec`` as planned, and the KV cache vLLM would report for its memory.

    Args:
        spec: the model; every layer must be full attention (or MLA).
        kvd: the plan's KV dtype: the model dtype, fp8, or an FP8Cache name (``fp8-e4m3``, ``fp8_e5m2``, ``-tensor``,
            ``-unscaled``: vLLM's ``fp8_e4m3`` / ``fp8_e5m2``; per-tensor adds ``--calculate-kv-scales``).
        model: what ``vllm serve`` loads (:func:`vllm_model_argument`).
        context, tp: ``--max-model-len``, ``--tensor-parallel-size``.
        batch: ``--max-num-seqs``, the most requests vLLM runs at a time; None: the requests of ``context``
            tokens the KV memory holds, at most vLLM's default (:func:`_max_num_seqs`).
        memory_bytes: one GPU's memory, as the plan assumed it.
        reserve_bytes: bytes of it the plan keeps back; ``--gpu-memory-utilization`` is
            ``(memory - reserve) / memory`` rounded down to 4 decimals, so vLLM never takes more than planned.
        weight_bytes_per_gpu: one GPU's share of the weights.
        block_size: tokens per KV block, one of :data:`VLLM_BLOCK_SIZES` (vLLM's CUDA default is 16).
        skip_layers: decoder layers kept in the model dtype next to an fp8 ``kvd``:
            ``--kv-cache-dtype-skip-layers i j ...`` (vLLM's flag takes one or more values, space-separated:
            docs.vllm.ai, Quantized KV Cache, "Skipping Specific Layers from KV-Cache Quantization").
        context_limit: the longest ``--max-model-len`` vLLM takes for the model (:func:`vllm_max_model_len`);
            None: not checked.
        context_source: how a refusal names ``context`` where ``--context`` was not given (``"the default
            context 8,192 tokens (no --context given)"``, :func:`kvlab.plan.report_inputs.context_source`); None:
            ``--context N``, the flag as given.

    Raises:
        ValueError: a layer kind, KV dtype or block size vLLM would size differently, nothing left for KV, a KV
            cache that cannot hold one ``context``-token request (vLLM refuses to start), a ``context`` beyond
            ``context_limit`` (vLLM refuses to start; both numbers named), or ``skip_layers`` with a KV dtype that
            is not fp8 or naming a layer the model lacks; the message names the flag or the value.
    """
    _check_serve_inputs(spec, context, 1 if batch is None else batch, tp, memory_bytes, reserve_bytes, block_size)
    named = context_source or f"--context {context:,}"
    _check_context_limit(spec, context, context_limit, named)
    dtype, cache_dtype = _cache_dtype(spec, kvd)
    _check_skip_layers(skip_layers, cache_dtype)
    utilization, kv_memory = _kv_memory(memory_bytes, reserve_bytes, weight_bytes_per_gpu)
    kv = vllm_kv_cache(spec, kv_memory, max_model_len=context, tp=tp, block_size=block_size,
                       kv_cache_dtype=cache_dtype, kv_cache_dtype_skip_layers=skip_layers)  # fmt: skip
    util_text = f"{utilization:.4f}".rstrip("0").rstrip(".")
    _check_one_request_fits(context, kv.num_blocks, block_size, named)
    seqs, seqs_note = _max_num_seqs(batch, memory_bytes, context, kv.max_concurrency)
    flags = {"--dtype": dtype, "--max-model-len": context, "--kv-cache-dtype": cache_dtype}
    flags.update({"--block-size": block_size, "--gpu-memory-utilization": util_text, "--max-num-seqs": seqs})
    flags["--tensor-parallel-size"] = tp
    return VllmServePlan(
        args=_serve_args(model, flags, skip_layers, kvd),
        max_model_len=context,
        max_num_seqs=seqs,
        tensor_parallel_size=tp,
        block_size=block_size,
        kv_cache_dtype=cache_dtype,
        gpu_memory_utilization=float(util_text),
        memory_bytes=memory_bytes,
        weight_bytes_per_gpu=weight_bytes_per_gpu,
        kv_memory_bytes_per_gpu=kv_memory,
        page_size_bytes=kv.page_size_bytes,
        num_layers=kv.group_size,
        num_gpu_blocks=kv.num_blocks,
        kv_cache_tokens=kv.kv_cache_tokens,
        max_concurrency=kv.max_concurrency,
        notes=(seqs_note, *_serve_notes(context, seqs, kv.kv_cache_tokens), *_fp8_notes(kvd)),
        kv_cache_dtype_skip_layers=tuple(skip_layers),
        layer_pages=tuple((s.page_size_bytes, n) for s, n in kv.groups),
    )


def _serve_args(model: str, flags: dict[str, Any], skip_layers: tuple[int, ...], kvd: KVDtype) -> tuple[str, ...]:
    """The argv after ``vllm``: ``serve MODEL``, ``flags`` as ``--flag value``, the skipped layers, and
    ``--calculate-kv-scales`` for a per-tensor FP8 cache (one scale per layer from vLLM's first forward)."""
    args = ("serve", model, *(str(x) for flag, value in flags.items() for x in (flag, value)))
    if skip_layers:
        args += ("--kv-cache-dtype-skip-layers", *map(str, skip_layers))
    if kvd.fp8_scale == "per-tensor":
        args += ("--calculate-kv-scales",)
    return args


def _check_skip_layers(skip_layers: tuple[int, ...], cache_dtype: str) -> None:
    """Raise ``ValueError`` for skipped layers next to a ``--kv-cache-dtype`` that quantizes none."""
    if skip_layers and not cache_dtype.startswith("fp8"):
        raise ValueError(
            f"--kv-cache-dtype-skip-layers {' '.join(map(str, skip_layers))} keeps layers out of a quantized cache; "
            f"--kv-cache-dtype {cache_dtype} quantizes none"
        )


def _kv_memory(memory_bytes: int, reserve_bytes: int, weight_bytes_per_gpu: int) -> tuple[float, int]:
    """``(--gpu-memory-utilization, KV memory per GPU)``: what vLLM may use less the weights' share.

    Raises:
        ValueError: the weights leave nothing for the KV cache (named by ``--reserve-gib``, which set the
            utilization).
    """
    utilization = _gpu_memory_utilization(memory_bytes, reserve_bytes)
    kv_memory = int(utilization * memory_bytes) - weight_bytes_per_gpu
    if kv_memory <= 0:  # the plan's --reserve-gib sets the utilization: the user never gave that flag
        raise ValueError(
            f"--reserve-gib {reserve_bytes / 2**30:g} leaves --gpu-memory-utilization {utilization:g} for vLLM, "
            f"{int(utilization * memory_bytes):,} of {memory_bytes:,} B: the weights ({weight_bytes_per_gpu:,} B per "
            "GPU) do not fit, nothing is left for the KV cache"
        )
    return utilization, kv_memory


def check_block_size(block_size: int, what: str = "--block-size") -> None:
    """Raise ``ValueError`` naming ``what`` (the flag, or a log's setting) unless ``block_size`` is one of
    :data:`VLLM_BLOCK_SIZES` (tokens per KV block, ``vllm.config.cache.BlockSize``)."""
    if isinstance(block_size, bool) or block_size not in VLLM_BLOCK_SIZES:
        raise ValueError(
            f"{what} must be one of {list(VLLM_BLOCK_SIZES)} (vLLM's BlockSize), got {block_size!r}"
        )


def _check_serve_inputs(
    spec: ModelSpec, context: int, batch: int, tp: int, memory_bytes: int, reserve_bytes: int, block_size: int
) -> None:
    """Refuse what ``vllm serve`` would size differently or not take (see :func:`vllm_serve_plan`'s Raises)."""
    check_block_size(block_size)
    other = {k: spec.count(k) for k in LAYER_KINDS if k != FULL and spec.count(k)}
    if other:
        kinds = ", ".join(f"{n} {k}" for k, n in other.items())
        raise ValueError(
            f"--emit vllm covers models whose every layer is full attention; this one has {kinds} layers, which "
            "vLLM's hybrid KV cache manager sizes in groups of other page sizes"
        )
    for name, value in (("context", context), ("batch", batch), ("tp", tp)):
        check_int_at_least(name, value, 1)
    if not 0 <= reserve_bytes < memory_bytes:
        raise ValueError(
            f"the reserve ({reserve_bytes:,} B) must be below the GPU memory ({memory_bytes:,} B)"
        )


def _gpu_memory_utilization(memory_bytes: int, reserve_bytes: int) -> float:
    """``--gpu-memory-utilization``: ``(memory - reserve) / memory`` rounded down to 4 decimals, so vLLM never
    takes more than the plan left.

    Raises:
        ValueError: the reserve leaves less than vLLM's smallest step (0.0001).
    """
    utilization = math.floor((memory_bytes - reserve_bytes) * 10_000 / memory_bytes) / 10_000
    if utilization <= 0:
        raise ValueError(
            f"the reserve leaves {memory_bytes - reserve_bytes:,} B of {memory_bytes:,} B: below vLLM's smallest "
            "--gpu-memory-utilization step (0.0001)"
        )
    return utilization


def _fp8_notes(kvd: KVDtype) -> tuple[str, ...]:
    """How vLLM's FP8 scales differ from the kvlab FP8Cache the plan names (vLLM docs, "Quantized KV Cache")."""
    if kvd.fp8_scale == "none":
        return (
            "vLLM's fp8 scales are 1.0 unless the checkpoint carries calibrated ones, as kvlab's -unscaled cache",
        )
    if kvd.fp8_scale == "per-tensor":
        return (
            "--calculate-kv-scales: vLLM computes one K and one V scale per layer from the first forward it runs "
            "and keeps them for every request; kvlab's -tensor cache calibrates on each sequence's own prefill",
        )
    if kvd.fp8_scale == "per-head":
        return (
            "per-head scales: vLLM reads them from a checkpoint calibrated with llm-compressor (Flash Attention "
            "backend only); without such a checkpoint it runs with scale 1.0, i.e. kvlab's -unscaled cache. kvlab's "
            "per-head cache calibrates on each sequence's prefill; measure both with kvlab eval",
        )
    return ()


def _check_one_request_fits(context: int, num_blocks: int, block_size: int, named: str) -> None:
    """vLLM checks that one ``--max-model-len`` request fits in its KV cache before it serves anything.

    Raises:
        ValueError: ``num_blocks`` blocks of ``block_size`` tokens hold fewer than ``context`` tokens; the
            message names the context as ``named`` says it (``--context 8,192``, or where a default came from).
    """
    if num_blocks < -(-context // block_size):
        raise ValueError(
            f"one request of {named} needs more KV than the {num_blocks * block_size:,} tokens the KV "
            f"cache holds per GPU ({num_blocks:,} blocks of {block_size}): vLLM refuses to start (max_model_len "
            f"larger than the KV cache); pass a lower --context, or give the KV more memory (--gpu-mem-gib, --tp, "
            f"--kv-dtype fp8)"
        )


def _check_context_limit(spec: ModelSpec, context: int, limit: int | None, named: str) -> None:
    """Raise ``ValueError`` naming both numbers where ``context`` (``--max-model-len``, said as ``named``) is beyond
    ``limit``, the longest vLLM starts the model with (:func:`vllm_max_model_len`): the command would not run."""
    if limit is not None and context > limit:
        raise ValueError(
            f"{named} is beyond {spec.name}'s limit of {limit:,} tokens ({spec.limit_words(limit)}): vLLM refuses "
            f"--max-model-len {context:,} (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, at the risk of wrong outputs); "
            f"pass --context {limit} or less, or drop --context to plan at the model's limit"
        )


def _max_num_seqs(batch: int | None, memory_bytes: int, context: int, concurrency: float) -> tuple[int, str]:
    """``(--max-num-seqs, a note saying what it means)``.

    ``--max-num-seqs`` is the most requests vLLM runs at a time, the rest waiting in its queue (vLLM docs, Engine
    Arguments: "Maximum number of sequences to be processed in a single iteration"). It is ``batch`` where given,
    else the requests of ``context`` tokens the KV memory holds (the floor of ``concurrency``), at most vLLM's own
    default for the device (:func:`kvlab.plan.vllm_memory.scheduler_defaults`: 256, or 1,024 from 70 GiB; a
    larger count only raises the sampler's profiled memory). 1 when nothing was given limited the server to one
    request at a time."""
    what = "the most requests vLLM runs at a time (more wait in its queue)"
    if batch is not None:
        return batch, f"--max-num-seqs {batch:,} (--batch {batch:,}): {what}; drop --batch to size it by the KV memory"
    default = scheduler_defaults(memory_bytes, "serve", context)[1]
    seqs = min(math.floor(concurrency), default)
    why = (
        f"the {math.floor(concurrency):,} requests of {context:,} tokens the KV memory holds"
        if seqs < default
        else f"vLLM's default on this device (the KV memory holds {math.floor(concurrency):,} requests of "
        f"{context:,} tokens)"
    )
    return seqs, f"--max-num-seqs {seqs:,}: {what}; {why}; --batch N sets it"


def _serve_notes(context: int, batch: int, tokens: int) -> tuple[str, ...]:
    """What the user should know about the command: vLLM's own measurement, a batch that does not fit in
    ``tokens`` of KV."""
    notes = [
        "vLLM measures the device's total memory itself (torch.cuda.mem_get_info, somewhat below nvidia-smi's "
        "figure) and takes its activation peak, CUDA graphs and non-torch memory out of the KV memory too: it "
        "will report fewer tokens than this upper bound",
    ]
    if tokens < batch * context:
        notes.append(
            f"{batch:,} sequences of {context:,} tokens need {batch * context:,} tokens of KV, more than the "
            f"{tokens:,} that fit: vLLM will run fewer sequences at a time (preempting the rest)"
        )
    return tuple(notes)
