"""The KV memory vLLM finds on a GPU: "Available KV cache memory" from the device, the utilization and the model.

vLLM's v1 worker (``vllm/v1/worker/gpu_worker.py``, ``determine_available_memory``) profiles one forward pass of
``max_num_batched_tokens`` dummy tokens and one dummy sampler pass, then gives the KV cache

    available = gpu_memory_utilization x total - weights - peak activation - non-torch memory

CUDA-graph memory is printed next to these terms but not taken out (the v0.10.2 and v0.26 logs of docs/plan.md
add up without it; vLLM V0 logs likewise). Each term here is a :class:`MemoryTerm` with what it assumes:

* total: the device's memory as torch reports it (the log's ``total_gpu_memory`` / "Free memory on device
  (free/total GiB)") where given, else the hardware table's;
* weights: given (the log's "Model loading took X GiB", or a safetensors index), else kvlab's estimate;
* peak activation: the larger of the forward pass and the sampler pass. The forward pass holds, per token and
  rank, the gated MLP's ``2 I`` and ``I`` intermediates (MoE: ``top_k x (3 I_moe + H)``, fused-MoE caches), the
  QKV projection and three ``H``-wide hidden states, in the model dtype. The sampler pass holds ``S =
  min(max_num_seqs, max_num_batched_tokens)`` rows of fp32 logits over the vocabulary and the copies its
  top-k/top-p sort makes; kvlab counts 9 such [S, vocab] fp32 buffers, a count calibrated on the Qwen3-0.6B
  H100 log (5.56 GiB at S = 1024) and checked on gpt-oss-20b (predicted 6.90 GiB, log 7.38) and Llama-3.3-70B
  TP2 (4.40 GiB, log 4.84);
* non-torch memory (CUDA context, NCCL buffers): 0.13 GiB on one GPU, 0.55 GiB per GPU with ``tp > 1``, as the
  llm-d H100 logs print;
* the scheduler's defaults where not given (vLLM's ``EngineArgs``, V1): on a GPU of 70 GiB or more
  ``max_num_batched_tokens`` 8192 and ``max_num_seqs`` 1024 for ``vllm serve`` (16384 and 1024 for the Python
  ``LLM`` class), else 2048 and 256 (8192 and 256); vLLM V0 profiled ``max(max_model_len, 2048)`` tokens and
  256 sequences.

Pure Python; no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvlab.plan.config_fields import decoder_config
from kvlab.plan.ledger import kv_heads_per_rank
from kvlab.plan.spec import ModelSpec

GIB = 1024**3
SAMPLER_COPIES = (
    9  # [S, vocab] fp32 buffers alive at the sampler's peak (calibrated: see the module docstring)
)
NON_TORCH_BYTES = {1: int(0.13 * GIB), 2: int(0.55 * GIB)}  # per GPU, one GPU / tp > 1 (llm-d H100 logs)
BIG_GPU_BYTES = 70 * GIB  # vLLM's EngineArgs threshold for the larger scheduler defaults
ENTRYPOINTS = ("serve", "llm", "v0")


@dataclass(frozen=True)
class MemoryTerm:
    """One term of vLLM's KV memory arithmetic, bytes per GPU, with where it came from."""

    name: str  # total, budget, weights, activation_peak, non_torch, cuda_graph, available
    bytes: int  # per GPU (negative only for a shortfall)
    source: str  # "log", "given", "kvlab" (modelled)
    assumes: str  # what the figure rests on

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "bytes": self.bytes,
            "gib": self.bytes / GIB,
            "source": self.source,
            "assumes": self.assumes,
        }


def scheduler_defaults(total_bytes: int, entrypoint: str, max_model_len: int) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` vLLM uses when not given (see the module docstring).

    Raises:
        ValueError: an ``entrypoint`` not in :data:`ENTRYPOINTS`.
    """
    if entrypoint not in ENTRYPOINTS:
        raise ValueError(f"`entrypoint` must be one of {ENTRYPOINTS}, got {entrypoint!r}")
    if entrypoint == "v0":
        return max(max_model_len, 2048), 256
    big = total_bytes >= BIG_GPU_BYTES
    if entrypoint == "serve":
        return (8192, 1024) if big else (2048, 256)
    return (16384, 1024) if big else (8192, 256)


def _int(cfg: Mapping, *names: str) -> int | None:
    for name in names:
        value = cfg.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def activation_peak(
    config: Mapping, spec: ModelSpec, *, tokens: int, seqs: int, tp: int = 1
) -> tuple[int, str]:
    """``(bytes, how)``: the profiled activation peak per GPU (module docstring), and which pass sets it.

    Raises:
        ValueError: the config has no ``vocab_size`` (the sampler term needs it).
    """
    cfg, _ = decoder_config(config)
    vocab = _int(cfg, "vocab_size", "padded_vocab_size")
    if vocab is None:
        raise ValueError("config has no `vocab_size`: the sampler's activation peak cannot be modelled")
    b, hidden = spec.dtype_bytes, spec.hidden_size
    inter = _int(cfg, "intermediate_size", "ffn_hidden_size") or 4 * hidden
    experts = _int(cfg, "num_local_experts", "n_routed_experts", "num_experts")
    top_k = _int(cfg, "num_experts_per_tok", "experts_per_token", "top_k_experts")
    mlp = 3 * inter // tp
    if experts and top_k:
        moe_inter = _int(cfg, "moe_intermediate_size") or inter
        mlp = max(mlp, top_k * (3 * moe_inter // tp + hidden))
    kv = 0 if spec.is_mla else kv_heads_per_rank(spec, tp) * spec.head_dim
    qkv = spec.num_attention_heads * spec.head_dim // tp + 2 * kv
    forward = tokens * b * (mlp + qkv + 3 * hidden)
    rows = min(seqs, tokens)
    sampler = SAMPLER_COPIES * rows * vocab * 4
    if sampler >= forward:
        return sampler, f"sampler pass: {SAMPLER_COPIES} x [{rows:,} seqs, {vocab:,} vocab] fp32"
    return forward, f"forward pass: {tokens:,} tokens x {b * (mlp + qkv + 3 * hidden):,} B (MLP, QKV, hidden)"


def available_kv_memory(
    config: Mapping,
    spec: ModelSpec,
    *,
    total_bytes: int,
    total_source: str,
    gpu_memory_utilization: float,
    weight_bytes: int,
    weight_source: str,
    tp: int = 1,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    non_torch_bytes: int | None = None,
) -> list[MemoryTerm]:
    """The terms of "Available KV cache memory" per GPU, the last one ``available`` (negative: the model does
    not fit at this utilization; its magnitude is the shortfall).

    Raises:
        ValueError: a utilization outside (0, 1], or a negative memory or weight figure.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"`gpu_memory_utilization` must be in (0, 1], got {gpu_memory_utilization!r}")
    if total_bytes <= 0 or weight_bytes < 0:
        raise ValueError(
            f"memory must be > 0 and weights >= 0 bytes, got {total_bytes!r} and {weight_bytes!r}"
        )
    budget = int(gpu_memory_utilization * total_bytes)
    peak, how = activation_peak(config, spec, tokens=max_num_batched_tokens, seqs=max_num_seqs, tp=tp)
    if non_torch_bytes is None:
        non_torch = NON_TORCH_BYTES[1 if tp == 1 else 2]
        non_torch_src, non_torch_how = "kvlab", "CUDA context and NCCL buffers as the llm-d H100 logs print"
    else:
        non_torch, non_torch_src, non_torch_how = non_torch_bytes, "given", "given"
    available = budget - weight_bytes - peak - non_torch
    return [
        MemoryTerm("total", total_bytes, total_source, "the device's memory as torch reports it"),
        MemoryTerm("budget", budget, "kvlab", f"{gpu_memory_utilization:g} x total"),
        MemoryTerm("weights", weight_bytes, weight_source, "one GPU's share of the weights"),
        MemoryTerm("activation_peak", peak, "kvlab", how),
        MemoryTerm("non_torch", non_torch, non_torch_src, non_torch_how),
        MemoryTerm("available", available, "kvlab", "budget - weights - activation peak - non-torch"),
    ]
