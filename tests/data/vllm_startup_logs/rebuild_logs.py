"""Write logs/<case id>.log: each case's figures in vLLM's own log wording, rebuilt from cases.jsonl (the case
quotes are excerpts; this puts every figure a case states on the line vLLM prints it on). Run from this folder."""

import json
from pathlib import Path

HERE = Path(__file__).parent


def lines(c: dict) -> list[str]:
    m = c["measured"]
    out = [f"# {c['id']}: rebuilt from cases.jsonl; source {c['source'].get('url') or c['source']['kind']}"]
    if c["vllm_version"]:
        out.append(
            f"INFO Initializing a V1 LLM engine (v{c['vllm_version']}) with config: model='{c['model_as_written']}'"
        )
    args = []
    if c["tensor_parallel_size"]:
        args.append(f"tensor_parallel_size={c['tensor_parallel_size']}")
    if c["kv_cache_dtype"]:
        args.append(f"kv_cache_dtype={c['kv_cache_dtype']}")
    if c["max_model_len"]:
        args.append(f"--max-model-len {c['max_model_len']}")
    if c["block_size"]:
        args.append(f"--block-size {c['block_size']}")
    if c["gpu_memory_utilization"] and c["engine"] == "V1":
        args.append(f"--gpu-memory-utilization {c['gpu_memory_utilization']}")
    nbt = (c.get("extra_flags") or {}).get("max_num_batched_tokens")
    if nbt:
        args.append(f"max_num_batched_tokens={nbt}")
    if args:
        out.append("INFO non-default args: " + " ".join(args))
    if m["model_weights_gib"] is not None:
        out.append(f"INFO Model loading took {m['model_weights_gib']} GiB memory")
    if c["engine"] == "V0":
        out.append(
            f"INFO Memory profiling results: total_gpu_memory={c['gpu_total_memory_gib_printed']}GiB "
            f"non_torch_memory={m['non_torch_gib']}GiB kv_cache_size={m['available_kv_cache_gib']}GiB "
            f"gpu_memory_utilization={c['gpu_memory_utilization']:.2f}"
        )
        out.append(f"INFO # GPU blocks: {m['num_gpu_blocks']}, # CPU blocks: 2048")
    else:
        if c["gpu_total_memory_gib_printed"]:
            out.append(
                f"INFO Free memory on device (0.0/{c['gpu_total_memory_gib_printed']} GiB) on startup."
            )
        if m["peak_activation_gib"] is not None:
            out.append(
                f"INFO Actual usage is {m['model_weights_gib']} GiB for weight, {m['peak_activation_gib']} GiB for "
                f"peak activation, {m['non_torch_gib']} GiB for non-torch memory, and {m['cuda_graph_gib']} GiB "
                "for CUDAGraph memory."
            )
        out.append(f"INFO Available KV cache memory: {m['available_kv_cache_gib']} GiB")
        if m["gpu_kv_cache_tokens"]:
            out.append(f"INFO GPU KV cache size: {m['gpu_kv_cache_tokens']:,} tokens")
    if m["max_concurrency"]:
        out.append(
            f"INFO Maximum concurrency for {m['max_concurrency_tokens_per_request']:,} tokens per request: "
            f"{m['max_concurrency']:.2f}x"
        )
    return out


for line in (HERE / "cases.jsonl").read_text().splitlines():
    case = json.loads(line)
    (HERE / "logs" / f"{case['id']}.log").write_text("\n".join(lines(case)) + "\n")
