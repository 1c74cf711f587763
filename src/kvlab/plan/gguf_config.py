"""A Hugging Face-style config from a GGUF header (:mod:`kvlab.plan.gguf`), so a ``.gguf`` plans like a
``config.json``.

The metadata keys read (``{arch}`` is ``general.architecture``) and the config keys they become are those of
transformers' ``GGUF_CONFIG_MAPPING`` (transformers/integrations/ggml.py), with llama.cpp's rules where the two
differ: ``head_dim`` is ``{arch}.attention.key_length`` when stated, else ``embedding_length / head_count`` (as
llama.cpp's ``n_embd_head_k``), and the LM head is tied when the file has no ``output.weight`` tensor.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvlab.plan.gguf import GGUFHeader, SkippedArray, file_type_name, read_gguf_header

GGUF_DTYPE = "bfloat16"  # the dtype the planner assumes a dequantized GGUF model (and its KV cache) runs in

# general.architecture -> transformers model_type (transformers' GGUF loader renames the same way: qwen2moe ->
# qwen2_moe, qwen3moe -> qwen3_moe, gemma3 -> gemma3_text).
MODEL_TYPES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen2moe": "qwen2_moe",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3_moe",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
    "starcoder2": "starcoder2",
    "falcon": "falcon",
    "stablelm": "stablelm",
    "nemotron": "nemotron",
    "lfm2": "lfm2",
}
# architectures whose LM head transformers always ties (its GGUF loader's exceptions)
_ALWAYS_TIED = ("falcon",)
# metadata suffix (after "{arch}.") -> config key, copied when present; the geometry keys are handled apart
_COPIED = {
    "context_length": "max_position_embeddings",
    "rope.freq_base": "rope_theta",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
}
# `{arch}.attention.layer_norm_epsilon` (LayerNorm models) under each config class's own name
_LAYER_NORM_EPS = {"falcon": "layer_norm_epsilon", "starcoder2": "norm_epsilon", "stablelm": "layer_norm_eps"}


def _scalar(path: Path, key: str, value: Any, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{path}: GGUF key `{key}` must be an integer >= {minimum}, got {value!r}")
    return value


def _per_layer(path: Path, key: str, value: Any, layers: int, *, minimum: int = 0) -> int | list[int]:
    """An integer key that llama.cpp also accepts as one value per layer: the int, or the per-layer list (a list
    whose values are all equal collapses to that value).

    Raises:
        ValueError: not an integer, or a list of the wrong length (the key and the file named).
    """
    if isinstance(value, list):
        if len(value) != layers:
            raise ValueError(
                f"{path}: GGUF key `{key}` must hold one value per layer ({layers}), got {len(value)} values"
            )
        values = [_scalar(path, f"{key}[{i}]", v, minimum=minimum) for i, v in enumerate(value)]
        return values[0] if len(set(values)) == 1 else values
    return _scalar(path, key, value, minimum=minimum)


def _needed(path: Path, meta: Mapping, arch: str, suffix: str) -> Any:
    key = f"{arch}.{suffix}"
    if key not in meta:
        raise ValueError(
            f"{path}: GGUF metadata has no `{key}`, which a {arch!r} model needs (the file may be incomplete or "
            "written by a converter that does not follow llama.cpp's keys)"
        )
    return meta[key]


def _summary(values: list[int]) -> str:
    return ", ".join(f"{v}" for v in values[:8]) + (", ..." if len(values) > 8 else "")


def config_from_gguf_header(header: GGUFHeader) -> dict[str, Any]:
    """The Hugging Face-style config dict of a GGUF header (see :func:`read_gguf_config`)."""
    path, meta = Path(header.path), header.metadata
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ValueError(f"{path}: GGUF metadata has no `general.architecture` (a string), got {arch!r}")
    if arch not in MODEL_TYPES:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not one the planner maps to a transformers model type "
            f"(it maps {', '.join(sorted(MODEL_TYPES))}); pass the model's config.json instead"
        )
    model_type = MODEL_TYPES[arch]
    layers = _scalar(path, f"{arch}.block_count", _needed(path, meta, arch, "block_count"), minimum=1)
    hidden = _scalar(
        path, f"{arch}.embedding_length", _needed(path, meta, arch, "embedding_length"), minimum=1
    )
    heads_key = f"{arch}.attention.head_count"
    heads = _per_layer(path, heads_key, _needed(path, meta, arch, "attention.head_count"), layers, minimum=1)
    if isinstance(heads, list):
        raise ValueError(
            f"{path}: GGUF key `{heads_key}` gives layers different query head counts ({_summary(heads)}); the "
            "planner holds one head count for every layer"
        )
    cfg: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [_ARCHITECTURES[model_type]],
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
    }
    _kv_heads(cfg, path, meta, arch, layers, heads)
    _head_dim(cfg, path, meta, arch, hidden, heads)
    ff_key = f"{arch}.feed_forward_length"
    if ff_key in meta:
        cfg["intermediate_size"] = _per_layer(path, ff_key, meta[ff_key], layers)
        if arch == "falcon":  # FalconConfig's name for it
            cfg["ffn_hidden_size"] = cfg["intermediate_size"]
    for suffix, name in _COPIED.items():
        if f"{arch}.{suffix}" in meta:
            cfg[name] = meta[f"{arch}.{suffix}"]
    if f"{arch}.attention.layer_norm_epsilon" in meta:
        cfg[_LAYER_NORM_EPS.get(arch, "layer_norm_eps")] = meta[f"{arch}.attention.layer_norm_epsilon"]
    _rope_scaling(cfg, meta, arch)
    _sliding(cfg, path, meta, arch, layers)
    vocab = meta.get(f"{arch}.vocab_size")
    tokens = meta.get("tokenizer.ggml.tokens")
    if vocab is not None:
        cfg["vocab_size"] = _scalar(path, f"{arch}.vocab_size", vocab, minimum=1)
    elif isinstance(tokens, list | SkippedArray):
        cfg["vocab_size"] = len(tokens)
    split = meta.get("split.count")
    names = {t.name for t in header.tensors}
    if isinstance(split, int) and split > 1:
        pass  # output.weight may sit in another shard: tying cannot be told from this one
    elif arch in _ALWAYS_TIED:
        cfg["tie_word_embeddings"] = True
    else:
        cfg["tie_word_embeddings"] = "output.weight" not in names
    cfg["torch_dtype"] = GGUF_DTYPE
    cfg["_gguf"] = {
        "file": path.name,
        "version": header.version,
        "architecture": arch,
        "name": meta.get("general.name"),
        "file_type": file_type_name(header),
        "tensor_types": dict(header.tensor_types),
        "tensor_count": len(header.tensors),
        "tensor_bytes": header.tensor_bytes,
        "file_bytes": header.file_bytes,
        "split_count": split if isinstance(split, int) else 1,
    }
    return cfg


_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "starcoder2": "Starcoder2ForCausalLM",
    "falcon": "FalconForCausalLM",
    "stablelm": "StableLmForCausalLM",
    "nemotron": "NemotronForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
}


def _kv_heads(cfg: dict, path: Path, meta: Mapping, arch: str, layers: int, heads: int) -> None:
    """``num_key_value_heads`` from ``{arch}.attention.head_count_kv`` (llama.cpp: absent means one per query
    head). A per-layer array with one value is that value; LFM2's zeros mark its convolution layers
    (``layer_types``). Falcon states ``multi_query`` / ``new_decoder_architecture`` from the count, since
    transformers' FalconConfig defaults would otherwise override it.

    Raises:
        ValueError: per-layer counts that differ between attention layers, or zeros outside LFM2.
    """
    key = f"{arch}.attention.head_count_kv"
    kv = _per_layer(path, key, meta[key], layers) if key in meta else heads
    if isinstance(kv, list):
        attention = sorted({v for v in kv if v})
        if arch == "lfm2" and len(attention) == 1:
            cfg["layer_types"] = ["full_attention" if v else "conv" for v in kv]
            kv = attention[0]
        else:
            raise ValueError(
                f"{path}: GGUF key `{key}` gives layers different KV head counts ({_summary(kv)}); the planner "
                f"holds one KV head count for every layer"
            )
    if kv == 0:
        raise ValueError(f"{path}: GGUF key `{key}` is 0: no layer would store K/V")
    if arch == "falcon":
        cfg["num_kv_heads"] = kv
        cfg["multi_query"] = kv == 1
        cfg["new_decoder_architecture"] = kv > 1
    cfg["num_key_value_heads"] = kv


def _head_dim(cfg: dict, path: Path, meta: Mapping, arch: str, hidden: int, heads: int) -> None:
    """``head_dim``: ``{arch}.attention.key_length`` when stated, else ``embedding_length / head_count``
    (llama.cpp's ``n_embd_head_k``).

    Raises:
        ValueError: a ``value_length`` other than the key length (K and V of different widths: the ledger holds
            one head width), or no key length while the width is not divisible by the heads.
    """
    k_key, v_key = f"{arch}.attention.key_length", f"{arch}.attention.value_length"
    if k_key in meta:
        head_dim = _scalar(path, k_key, meta[k_key], minimum=1)
    elif hidden % heads:
        raise ValueError(
            f"{path}: GGUF metadata has no `{k_key}` and `{arch}.embedding_length` ({hidden}) is not divisible "
            f"by `{arch}.attention.head_count` ({heads})"
        )
    else:
        head_dim = hidden // heads
    if v_key in meta and _scalar(path, v_key, meta[v_key], minimum=1) != head_dim:
        raise ValueError(
            f"{path}: GGUF keys `{v_key}` ({meta[v_key]}) and the key width ({head_dim}) differ; the planner "
            "holds one width for K and V"
        )
    cfg["head_dim"] = head_dim


def _rope_scaling(cfg: dict, meta: Mapping, arch: str) -> None:
    """``rope_scaling`` from ``{arch}.rope.scaling.type`` / ``.factor`` / ``.original_context_length``."""
    kind = meta.get(f"{arch}.rope.scaling.type")
    if not isinstance(kind, str) or kind == "none":
        return
    scaling: dict[str, Any] = {"rope_type": kind}
    if f"{arch}.rope.scaling.factor" in meta:
        scaling["factor"] = meta[f"{arch}.rope.scaling.factor"]
    if f"{arch}.rope.scaling.original_context_length" in meta:
        scaling["original_max_position_embeddings"] = meta[f"{arch}.rope.scaling.original_context_length"]
    cfg["rope_scaling"] = scaling


def _sliding(cfg: dict, path: Path, meta: Mapping, arch: str, layers: int) -> None:
    """``sliding_window`` from ``{arch}.attention.sliding_window``, and the layers that slide from
    ``{arch}.attention.sliding_window_pattern``: an int (every n-th layer global, Gemma 3's
    ``sliding_window_pattern``) or one bool per layer (true: sliding; gguf-py's ``add_sliding_window_pattern``).
    Without a pattern the model type's rule applies (Gemma 2 alternates, Gemma 3 slides 5 of 6 layers; see
    :mod:`kvlab.plan.spec`; a Qwen-family window stays off without ``use_sliding_window``, as in transformers'
    Qwen2 configs and llama.cpp, which reads no window for Qwen2)."""
    key = f"{arch}.attention.sliding_window"
    if key not in meta:
        return
    window = _scalar(path, key, meta[key])
    if window == 0:
        return
    cfg["sliding_window"] = window
    pattern_key = f"{arch}.attention.sliding_window_pattern"
    pattern = meta.get(pattern_key)
    if isinstance(pattern, list):
        if len(pattern) != layers or not all(isinstance(p, bool) for p in pattern):
            raise ValueError(
                f"{path}: GGUF key `{pattern_key}` must hold one bool per layer ({layers}), got {len(pattern)} values"
            )
        cfg["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
    elif pattern is not None:
        cfg["sliding_window_pattern"] = _scalar(path, pattern_key, pattern, minimum=1)


def read_gguf_config(path: str | os.PathLike) -> dict[str, Any]:
    """A Hugging Face-style config dict (the keys of transformers' ``config.json``) from a GGUF file's header.

    Read from the metadata (``{arch}`` = ``general.architecture``): ``model_type`` (:data:`MODEL_TYPES`),
    ``num_hidden_layers`` (``{arch}.block_count``), ``hidden_size`` (``.embedding_length``),
    ``num_attention_heads`` (``.attention.head_count``), ``num_key_value_heads`` (``.attention.head_count_kv``,
    a scalar or one per layer), ``head_dim`` (``.attention.key_length``, else hidden / heads),
    ``intermediate_size`` (``.feed_forward_length``), ``max_position_embeddings`` (``.context_length``, tokens),
    ``rope_theta`` (``.rope.freq_base``), ``rope_scaling``, ``sliding_window`` (``.attention.sliding_window``,
    tokens) and its layer pattern, ``rms_norm_eps``, MoE sizes (``.expert_count``, ``.expert_used_count``,
    ``.expert_feed_forward_length``, ``.expert_shared_feed_forward_length``), ``vocab_size`` (``.vocab_size``,
    else the length of ``tokenizer.ggml.tokens``) and ``tie_word_embeddings`` (true when the file has no
    ``output.weight`` tensor; not set for a shard of a split GGUF).

    ``torch_dtype`` is ``"bfloat16"``: a GGUF states no torch dtype (its weights are quantized, see
    ``_gguf.file_type``), and bf16 is what the dequantized model is run in; it is the planner's default KV dtype.
    ``_gguf`` records the file: ``file``, ``version``, ``architecture``, ``name``, ``file_type`` (``Q4_1``, ...),
    ``tensor_types`` ({ggml type: tensors}), ``tensor_count``, ``tensor_bytes`` (bytes of tensor data; None when
    a type is unknown to gguf-py), ``file_bytes`` and ``split_count``.

    Source: the GGUF spec, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md, and its key names in
    gguf-py's ``constants.Keys``.

    Raises:
        ValueError: one line naming the file: not a GGUF file (its first bytes shown), truncated or corrupt,
            an architecture the planner does not map, a needed key missing (the key named) or malformed, or the
            ``gguf`` package missing (``pip install gguf``).
        OSError: the file cannot be opened.
    """
    return config_from_gguf_header(read_gguf_header(path))
