"""Planner: KV memory ledger, fit, roofline and video accounting from a model's ``config.json`` or GGUF header
(no torch).

Modules
-------
spec       ModelSpec from config.json (file, directory, dict, hub id, preset) or a GGUF file; head_dim,
           MQA/GQA/MLA, sliding, hybrid and KV-shared layers
gguf       a config dict from a llama.cpp GGUF file's header (metadata and tensor infos; needs ``gguf``)
presets    public models' configs, written from their hub config.json
weights    parameter count from the config; exact bytes from safetensors headers
ledger     KV bytes per token / per layer kind / total; plain dtypes and KIVI; tensor parallel
fit        max batch at a context, max context at a batch, under a GPU budget
hardware   accelerator table (datasheet FLOP/s and bandwidth, memory as the device reports it) with sources
roofline   decode and prefill intensity, ridge point, decode step lower bound
video      tokens and KV of autoregressive video
probe      local numpy roofline probe (fp32 matmul FLOP/s, streaming GB/s)
vllm       `vllm serve` flags for a plan and the KV cache size vLLM would report

Example::

    from kvlab.plan import load_spec, kv_bytes_per_token, kv_bytes
    spec = load_spec("llama-3-8b")
    kv_bytes_per_token(spec)            # 131072
    kv_bytes(spec, tokens=8192)         # 1073741824 (1.0000 GiB)
"""

from kvlab.plan.fit import GpuBudget, budget_from_gib, budget_from_hardware, max_batch, max_context
from kvlab.plan.hardware import Hardware, custom_hardware, get_hardware
from kvlab.plan.kv_formats import KVDtype, kv_dtype
from kvlab.plan.ledger import (
    Ledger,
    build_ledger,
    kivi_bytes_per_head,
    kivi_kv_bytes,
    kivi_kv_bytes_breakdown,
    kv_bytes,
    kv_bytes_peak,
    kv_bytes_per_token,
    kv_heads_per_rank,
    paged_kv_bytes,
    quantized_tokens,
)
from kvlab.plan.load import load_spec
from kvlab.plan.roofline import (
    DecodeStepBound,
    decode_attention_intensity,
    decode_step_bound,
    model_decode_attention_intensity,
    prefill_intensity,
    ridge_point_flop_per_byte,
)
from kvlab.plan.spec import ModelSpec, spec_from_config
from kvlab.plan.video import VideoClip, video_kv
from kvlab.plan.vllm import VllmServePlan, vllm_serve_plan
from kvlab.plan.weights import WeightBytes, estimate_parameters, read_safetensors_bytes, weight_bytes

__all__ = [
    "DecodeStepBound",
    "GpuBudget",
    "Hardware",
    "KVDtype",
    "Ledger",
    "ModelSpec",
    "VideoClip",
    "VllmServePlan",
    "WeightBytes",
    "budget_from_gib",
    "budget_from_hardware",
    "build_ledger",
    "custom_hardware",
    "decode_attention_intensity",
    "decode_step_bound",
    "estimate_parameters",
    "get_hardware",
    "kivi_bytes_per_head",
    "kivi_kv_bytes",
    "kivi_kv_bytes_breakdown",
    "kv_bytes",
    "kv_bytes_peak",
    "kv_bytes_per_token",
    "kv_dtype",
    "kv_heads_per_rank",
    "load_spec",
    "max_batch",
    "max_context",
    "model_decode_attention_intensity",
    "paged_kv_bytes",
    "prefill_intensity",
    "quantized_tokens",
    "read_safetensors_bytes",
    "ridge_point_flop_per_byte",
    "spec_from_config",
    "video_kv",
    "vllm_serve_plan",
    "weight_bytes",
]
