"""Model spec: the few numbers of a transformers ``config.json`` that size the KV cache.

A :class:`ModelSpec` is read from the model's own config (a file, a directory, a dict, a hub id, or a built-in
preset), or from a llama.cpp GGUF file's header (:mod:`kvlab.plan.gguf` turns its metadata into the same config
keys), so that the traps of hand-typed calculators do not apply:

* Every quantity is read under every name the transformers config classes and vLLM's ``ModelConfig`` read it
  by (``LAYER_NAMES``, ``HIDDEN_NAMES``, ``HEAD_NAMES``, ``KV_HEAD_NAMES``, ``HEAD_DIM_NAMES``: GPT-2, MPT/DBRX,
  ChatGLM, Falcon, OLMo, PLaMo, Mistral ``params.json``); two names for one quantity must agree.
* ``head_dim`` (or ``kv_channels``, ``hidden_size_per_head``, ``attention_head_dim``) is read when present;
  ``hidden_size / num_attention_heads`` is only the fallback (Mistral-Small-24B: 128 in the config, 160 derived;
  gpt-oss-20b: 64 vs 45).
* KV heads follow vLLM ``ModelConfig.get_total_num_kv_heads``: none stated means multi-head attention;
  ``multi_query`` means one KV head (the default of Falcon and GPT-BigCode configs, unless Falcon's
  ``new_decoder_architecture``); ChatGLM's ``multi_query_group_num`` counts when ``multi_query_attention`` is on;
  MPT/DBRX read ``attn_config.kv_n_heads``. Where the loaders' defaults disagree, the config is refused with the
  field named, never guessed.
* MLA (DeepSeek-V2 arXiv:2405.04434 §2.1): a layer caches one latent of ``kv_lora_rank + qk_rope_head_dim``
  values per token, not K and V per head.
* Sliding-window layers (``sliding_window`` with ``layer_types``, ``sliding_window_pattern`` or a model-type
  default; ``use_sliding_window: false`` turns it off, whatever ``sliding_window`` holds, 0 included), chunked
  layers (Llama 4), layers without KV (Mamba, recurrent or linear-attention layers of hybrids: Jamba, Bamba
  ``attn_layer_indices``, RecurrentGemma ``block_types``) and KV-shared layers (Gemma-3n ``num_kv_shared_layers``)
  are told apart.

Pure Python; no torch.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvlab.plan.config_fields import (  # re-exported: the spec's public names
    CHUNKED,
    DTYPE_BYTES,
    FULL,
    HEAD_DIM_NAMES,
    HEAD_NAMES,
    HIDDEN_NAMES,
    KV_HEAD_NAMES,
    KV_KINDS,
    LAYER_KINDS,
    LAYER_NAMES,
    NO_KV,
    POSITION_NAMES,
    SHARED,
    SLIDING,
    decoder_config,
)
from kvlab.plan.gguf import GGUF_DTYPE, is_gguf_file, read_gguf_config
from kvlab.plan.weights import estimate_parameters, read_safetensors_bytes

# Values of `layer_types` / `layers_block_type` and the kind they mean.
_LAYER_TYPE_KIND = {
    "full_attention": FULL,
    "attention": FULL,
    "global_attention": FULL,
    "global": FULL,
    "sliding_attention": SLIDING,
    "sliding_window_attention": SLIDING,
    "local_attention": SLIDING,
    "local": SLIDING,
    "chunked_attention": CHUNKED,
    "linear_attention": NO_KV,
    "mamba": NO_KV,
    "mamba2": NO_KV,
    "conv": NO_KV,
    "recurrent": NO_KV,
    "rwkv": NO_KV,
    "mlp": NO_KV,
    "moe": NO_KV,
}
# Nemotron-H style `hybrid_override_pattern`: one character per layer.
_PATTERN_KIND = {"*": FULL, "M": NO_KV, "-": NO_KV, "E": NO_KV}


@dataclass(frozen=True)
class ModelSpec:
    """What sizes a decoder's KV cache, read from its ``config.json`` (see :func:`spec_from_config`).

    Per token, a layer of kind ``full``/``sliding``/``chunked`` stores :attr:`kv_elements_per_token_per_layer`
    values: ``2 * num_kv_heads * head_dim`` (K and V, ``[batch, kv_heads, tokens, head_dim]`` each) or, for MLA,
    one latent of ``kv_lora_rank + qk_rope_head_dim``. ``shared`` and ``none`` layers store nothing.
    """

    name: str  # preset name, path or hub id the spec was read from
    num_layers: int  # decoder layers, including those without KV
    hidden_size: int  # residual stream width
    num_attention_heads: int  # query heads
    num_kv_heads: int  # K/V heads of an attention layer (1 for MQA; unused when MLA)
    head_dim: int  # width of one K (and V) head; for MLA the query/key head width (nope + rope)
    layer_kinds: tuple[str, ...]  # one of LAYER_KINDS per layer
    dtype: str = "bfloat16"  # the config's torch dtype name: the default KV dtype
    sliding_window: int | None = None  # tokens a sliding layer keeps
    attention_chunk_size: int | None = None  # tokens per chunk of a chunked layer
    kv_lora_rank: int | None = None  # MLA latent rank r (None: not MLA)
    qk_rope_head_dim: int | None = None  # MLA decoupled RoPE key width, cached next to the latent
    model_type: str = ""  # the config's model_type
    max_position_embeddings: int | None = None  # the config's context limit, when stated
    num_parameters: int | None = None  # estimated from the config (kvlab.plan.weights), None if unknown
    num_active_parameters: int | None = None  # parameters used per token (MoE: routed experts only)
    num_decode_flop_parameters: int | None = None  # parameters a decode token multiplies by (2 FLOP each):
    #   active less the embedding lookups, the LM head once whether tied or not; None if unknown
    checkpoint_bytes: int | None = None  # bytes of the safetensors weights next to the config (or of a GGUF's
    #   tensor data), when read
    checkpoint_source: str | None = None  # the file(s) checkpoint_bytes was read from
    checkpoint_format: str = "safetensors"  # "safetensors" or "GGUF": what checkpoint_source is
    notes: tuple[str, ...] = field(default=())  # what the reader assumed or ignored, for the user

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        if len(self.layer_kinds) != self.num_layers:
            raise ValueError(
                f"`layer_kinds` must have one entry per layer ({self.num_layers}), got {len(self.layer_kinds)}"
            )
        for i, kind in enumerate(self.layer_kinds):
            if kind not in LAYER_KINDS:
                raise ValueError(f"`layer_kinds[{i}]` must be one of {LAYER_KINDS}, got {kind!r}")
        if SLIDING in self.layer_kinds and not _positive_int(self.sliding_window):
            raise ValueError(f"sliding layers need a positive `sliding_window`, got {self.sliding_window!r}")
        if CHUNKED in self.layer_kinds and not _positive_int(self.attention_chunk_size):
            raise ValueError(
                f"chunked layers need a positive `attention_chunk_size`, got {self.attention_chunk_size!r}"
            )
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ValueError(
                "MLA needs both `kv_lora_rank` and `qk_rope_head_dim`, got "
                f"{self.kv_lora_rank!r} and {self.qk_rope_head_dim!r}"
            )
        if not self.is_mla and self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"`num_key_value_heads` ({self.num_kv_heads}) must divide `num_attention_heads` "
                f"({self.num_attention_heads})"
            )
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"`dtype` must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (one cached latent per layer instead of K and V)."""
        return self.kv_lora_rank is not None

    @property
    def dtype_bytes(self) -> int:
        """Bytes of one element in the config's dtype (the default KV cache dtype)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def gqa_group(self) -> int:
        """``g = num_attention_heads / num_kv_heads``: query heads sharing one KV head (1 = MHA)."""
        return self.num_attention_heads // self.num_kv_heads

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        """Values one token adds to one KV-holding layer (all heads): ``2 * kv_heads * head_dim`` or, for MLA,
        ``kv_lora_rank + qk_rope_head_dim`` (mechanics chapter §3.3; DeepSeek-V2 §2.1.3)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    def count(self, kind: str) -> int:
        """Number of layers of ``kind``."""
        return sum(1 for k in self.layer_kinds if k == kind)

    @property
    def kv_layers(self) -> int:
        """Layers that store K/V of their own (full, sliding or chunked)."""
        return sum(1 for k in self.layer_kinds if k in KV_KINDS)

    def with_kv_heads(self, num_kv_heads: int) -> ModelSpec:
        """A what-if copy with another KV head count (e.g. ``num_attention_heads`` for the MHA variant)."""
        if self.is_mla:
            raise ValueError(
                "an MLA model caches a latent, not KV heads; `num_kv_heads` cannot be overridden"
            )
        return replace(
            self, num_kv_heads=num_kv_heads, notes=self.notes + (f"KV heads overridden to {num_kv_heads}",)
        )

    def summary(self) -> dict[str, Any]:
        """JSON-serializable description of the spec."""
        kinds = {k: self.count(k) for k in LAYER_KINDS if self.count(k)}
        return {
            "name": self.name,
            "model_type": self.model_type,
            "num_layers": self.num_layers,
            "layer_kinds": kinds,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_kv_heads": None if self.is_mla else self.num_kv_heads,
            "head_dim": self.head_dim,
            "mla_latent_dim": self.kv_elements_per_token_per_layer if self.is_mla else None,
            "sliding_window": self.sliding_window,
            "attention_chunk_size": self.attention_chunk_size,
            "dtype": self.dtype,
            "max_position_embeddings": self.max_position_embeddings,
            "num_parameters": self.num_parameters,
            "num_active_parameters": self.num_active_parameters,
            "num_decode_flop_parameters": self.num_decode_flop_parameters,
            "notes": list(self.notes),
        }


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


# model types whose config class defaults `multi_query` to True (transformers FalconConfig, GPTBigCodeConfig;
# vLLM's RWConfig for the original Falcon checkpoints)
_MULTI_QUERY_DEFAULT = ("falcon", "RefinedWeb", "RefinedWebModel", "gpt_bigcode")
# model types whose model code reads `multi_query` before any KV head count (transformers FalconAttention and
# GPTBigCodeAttention; the Falcon RW remote code), as vLLM's ModelConfig does: a count next to it is ignored
_MULTI_QUERY_FIRST = ("falcon", "RefinedWeb", "RefinedWebModel", "gpt_bigcode")


def _as_int(name: str, value: Any, minimum: int) -> int:
    """``value`` of config field ``name`` as an int >= ``minimum``; errors name the field."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value != int(value)
    ):
        raise ValueError(f"config field `{name}` must be an integer, got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"config field `{name}` must be >= {minimum}, got {value!r}")
    return int(value)


def _read(cfg: Mapping, names: tuple[str, ...], *, minimum: int = 1) -> tuple[int, str] | None:
    """``(value, name)`` of the non-null fields among ``names``, or None when there is none.

    Raises:
        ValueError: a field that is not an integer >= ``minimum``, or two of ``names`` with different values
            (the config says two things; which one the model uses cannot be known).
    """
    found = [(n, _as_int(n, cfg[n], minimum)) for n in names if cfg.get(n) is not None]
    if not found:
        return None
    for name, value in found[1:]:
        if value != found[0][1]:
            raise ValueError(
                f"config fields `{found[0][0]}` ({found[0][1]}) and `{name}` ({value}) disagree: the planner "
                "cannot tell which one the model uses"
            )
    return found[0][1], found[0][0]


def _field(cfg: Mapping, names: tuple[str, ...], *, required: bool = True, minimum: int = 1) -> int | None:
    """The value of ``names`` in ``cfg`` (see :func:`_read`) as an int >= ``minimum``; errors name the field."""
    got = _read(cfg, names, minimum=minimum)
    if got is not None:
        return got[0]
    if required:
        alts = f" (nor {', '.join(f'`{n}`' for n in names[1:])})" if len(names) > 1 else ""
        raise ValueError(f"config has no `{names[0]}`{alts}")
    return None


def _dtype_name(cfg: Mapping, notes: list[str]) -> str:
    for key in ("dtype", "torch_dtype"):
        value = cfg.get(key)
        if value is None:
            continue
        name = str(value).removeprefix("torch.")
        if name not in DTYPE_BYTES:
            raise ValueError(f"config field `{key}` must be a float dtype name, got {value!r}")
        return name
    notes.append("config states no dtype; bfloat16 assumed")
    return "bfloat16"


def _attn_config_kv_heads(cfg: Mapping, num_heads: int) -> int | None:
    """KV heads of an MPT/DBRX config, read from its nested ``attn_config`` (vLLM ``get_total_num_kv_heads``).

    MPT (llm-foundry): ``attn_type`` ``multiquery_attention`` has one KV head, ``grouped_query_attention`` has
    ``kv_n_heads``, ``multihead_attention`` (the default) has one per query head. DBRX always states
    ``kv_n_heads``: transformers' ``DbrxAttentionConfig`` defaults it to 1, vLLM to the query heads, so a DBRX
    config without it is refused.
    """
    model_type = str(cfg.get("model_type", ""))
    attn = cfg.get("attn_config")
    if attn is not None and not isinstance(attn, Mapping):
        raise ValueError(f"config field `attn_config` must be an object, got {attn!r}")
    attn = attn or {}
    if model_type not in ("mpt", "dbrx") and "kv_n_heads" not in attn and "attn_type" not in attn:
        return None
    kv = attn.get("kv_n_heads")
    kv = None if kv is None else _as_int("attn_config.kv_n_heads", kv, 1)
    if model_type == "dbrx":
        if kv is None:
            raise ValueError(
                "config field `attn_config.kv_n_heads` is missing: transformers' DbrxConfig defaults it to 1, "
                f"vLLM to the {num_heads} query heads; state it"
            )
        return kv
    attn_type = attn.get("attn_type")
    types = ("multihead_attention", "multiquery_attention", "grouped_query_attention")
    if attn_type is not None and attn_type not in types:
        raise ValueError(f"config field `attn_config.attn_type` must be one of {types}, got {attn_type!r}")
    if attn_type == "grouped_query_attention":
        if kv is None:
            raise ValueError("config field `attn_config.kv_n_heads` is needed with grouped_query_attention")
        return kv
    implied = 1 if attn_type == "multiquery_attention" else num_heads
    if kv is not None and kv != implied:
        if attn_type is None:
            raise ValueError(
                f"config field `attn_config.kv_n_heads` ({kv}) without `attn_config.attn_type`: transformers' "
                f"MPT reads multi-head attention ({num_heads} KV heads), vLLM reads {kv}; state `attn_type`"
            )
        raise ValueError(
            f"config fields `attn_config.attn_type` ({attn_type}: {implied} KV heads) and "
            f"`attn_config.kv_n_heads` ({kv}) disagree"
        )
    return implied


def _kv_heads(cfg: Mapping, num_heads: int, notes: list[str]) -> tuple[int, str]:
    """KV heads of an attention layer, under every name transformers and vLLM read (``KV_HEAD_NAMES``,
    ChatGLM's ``multi_query_group_num``, MPT/DBRX ``attn_config.kv_n_heads``, ``multi_query``).

    Sources: vLLM ``ModelConfig.get_total_num_kv_heads`` (Falcon's ``new_decoder_architecture`` ignores
    ``multi_query``; MPT/DBRX read ``attn_config``; otherwise the first of ``n_head_kv``, ``num_kv_heads``,
    ``num_key_value_heads``, ``multi_query_group_num``, else the query heads) and the transformers config
    classes (FalconConfig and GPTBigCodeConfig default ``multi_query`` to True).

    Returns ``(kv_heads, field)``: the count and the config field it was read from.

    Raises:
        ValueError: the config states the KV heads in ways that disagree, or leaves them to defaults on which
            the loaders disagree (the message names the fields).
    """
    model_type = str(cfg.get("model_type", ""))
    if cfg.get("block_configs") is not None:  # DeciLM / Nemotron-NAS: per-layer attention settings
        raise ValueError(
            "config field `block_configs` sets attention per layer (DeciLM/Nemotron-NAS); the planner holds one "
            "KV head count for every layer and cannot read it"
        )
    stated = _read(cfg, KV_HEAD_NAMES)
    from_attn_config = _attn_config_kv_heads(cfg, num_heads)
    if from_attn_config is not None:
        if stated is not None and stated[0] != from_attn_config:
            raise ValueError(
                f"config fields `{stated[1]}` ({stated[0]}) and `attn_config.kv_n_heads` ({from_attn_config}) "
                "disagree"
            )
        return from_attn_config, "attn_config.kv_n_heads"
    if cfg.get("new_decoder_architecture"):  # Falcon-40B style: grouped KV heads, `multi_query` ignored
        return (num_heads, "num_attention_heads") if stated is None else stated
    multi_query = cfg.get("multi_query")
    explicit = multi_query is not None
    if multi_query is None and model_type in _MULTI_QUERY_DEFAULT:
        multi_query = True
    if multi_query:  # Falcon-7B, GPT-BigCode: one KV head shared by every query head
        if stated is not None and stated[0] != 1:
            if model_type not in _MULTI_QUERY_FIRST or (model_type == "RefinedWeb" and not explicit):
                raise ValueError(
                    f"config fields `multi_query` ({'true' if explicit else f'true by {model_type!r} default'}: one "
                    f"KV head) and `{stated[1]}` ({stated[0]}) disagree, and the loaders read them differently "
                    "(vLLM's ModelConfig takes multi_query first, this model type's code the head count; vLLM's "
                    "RWConfig switches on Falcon's new decoder architecture for hidden_size 8192 only); state "
                    "`multi_query` false or `new_decoder_architecture`"
                )
            notes.append(
                f"`{stated[1]}` ({stated[0]}) not read: `multi_query` is true, so every query head shares one KV "
                f"head ({model_type}'s model code and vLLM both read multi_query first)"
            )
        return 1, "multi_query"
    if cfg.get("multi_query_group_num") is not None:  # ChatGLM
        groups = _as_int("multi_query_group_num", cfg["multi_query_group_num"], 1)
        switch = cfg.get("multi_query_attention")
        if switch is False:
            notes.append(
                f"`multi_query_group_num` {groups} ignored: `multi_query_attention` is false (one KV head per "
                "query head, as ChatGLM's model code reads it)"
            )
            groups = num_heads
        elif switch is None:
            if model_type == "chatglm":
                raise ValueError(
                    f"config field `multi_query_group_num` ({groups}) without `multi_query_attention`: ChatGLM's "
                    "config class defaults the switch to false (one KV head per query head), vLLM's ModelConfig "
                    f"reads {groups} KV heads; state `multi_query_attention`"
                )
            notes.append(
                f"{groups} KV heads read from `multi_query_group_num` (as vLLM's ModelConfig reads it; the config "
                "has no `multi_query_attention`)"
            )
        if stated is not None and stated[0] != groups:
            raise ValueError(
                f"config fields `{stated[1]}` ({stated[0]}) and `multi_query_group_num` ({groups}) disagree"
            )
        return groups, "multi_query_group_num"
    return (num_heads, "num_attention_heads") if stated is None else stated


def _map_layer_types(values: Any, key: str, num_layers: int) -> list[str]:
    if not isinstance(values, list | tuple) or len(values) != num_layers:
        got = len(values) if isinstance(values, list | tuple) else values
        raise ValueError(f"config field `{key}` must list one entry per layer ({num_layers}), got {got!r}")
    kinds = []
    for i, value in enumerate(values):
        kind = _LAYER_TYPE_KIND.get(str(value).lower())
        if kind is None:
            raise ValueError(f"config field `{key}[{i}]` is not a known layer type, got {value!r}")
        kinds.append(kind)
    return kinds


def _layer_kinds(cfg: Mapping, num_layers: int, window: int | None, notes: list[str]) -> list[str]:
    """One kind per layer from the config's layer-type fields (see the module docstring for the rules)."""
    model_type = str(cfg.get("model_type", ""))
    if cfg.get("layer_types") is not None:
        return _map_layer_types(cfg["layer_types"], "layer_types", num_layers)
    if isinstance(cfg.get("layers_block_type"), list | tuple):
        return _map_layer_types(cfg["layers_block_type"], "layers_block_type", num_layers)
    if cfg.get("hybrid_override_pattern") is not None:
        pattern = cfg["hybrid_override_pattern"]
        if not isinstance(pattern, str) or len(pattern) != num_layers:
            raise ValueError(
                f"config field `hybrid_override_pattern` must be a string of {num_layers} characters, got {pattern!r}"
            )
        for i, ch in enumerate(pattern):
            if ch not in _PATTERN_KIND:
                raise ValueError(
                    f"config field `hybrid_override_pattern[{i}]` must be one of '*M-E', got {ch!r}"
                )
        return [_PATTERN_KIND[ch] for ch in pattern]
    if (
        cfg.get("attn_layer_indices") is not None or model_type == "bamba"
    ):  # Bamba: attention at listed layers
        indices = cfg.get("attn_layer_indices") or []
        if not isinstance(indices, list | tuple) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers for i in indices
        ):
            raise ValueError(
                f"config field `attn_layer_indices` must list layer numbers below {num_layers}, got {indices!r}"
            )
        return [FULL if i in set(indices) else NO_KV for i in range(num_layers)]
    if (
        cfg.get("block_types") is not None
    ):  # RecurrentGemma: a pattern cycled over the layers, local attention
        types = cfg["block_types"]
        table = {"recurrent": NO_KV, "attention": SLIDING}
        if not isinstance(types, list | tuple) or not types or any(t not in table for t in types):
            raise ValueError(
                f"config field `block_types` must list 'recurrent'/'attention' blocks, got {types!r}"
            )
        return [table[types[i % len(types)]] for i in range(num_layers)]
    if cfg.get("attn_layer_period") is not None:  # Jamba: attention every `period`-th layer
        period = _field(cfg, ("attn_layer_period",))
        offset = _field(cfg, ("attn_layer_offset",), required=False, minimum=0) or 0
        if offset >= period:
            raise ValueError(
                f"config field `attn_layer_offset` must be < attn_layer_period ({period}), got {offset}"
            )
        return [FULL if i % period == offset else NO_KV for i in range(num_layers)]
    if window is None:
        return [FULL] * num_layers
    pattern = _field(cfg, ("sliding_window_pattern", "_sliding_window_pattern"), required=False)
    if pattern is not None:  # Gemma 3: every `pattern`-th layer is global
        return [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    if model_type == "gemma2":  # Gemma 2: alternating, layer 0 sliding
        return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]
    if model_type in ("gemma3", "gemma3_text"):
        return [SLIDING if (i + 1) % 6 else FULL for i in range(num_layers)]
    if cfg.get("max_window_layers") is not None:  # Qwen2 family: layers >= max_window_layers slide
        first = _field(cfg, ("max_window_layers",), minimum=0)
        return [SLIDING if i >= first else FULL for i in range(num_layers)]
    notes.append(f"`sliding_window` {window} applied to every layer (no per-layer pattern in the config)")
    return [SLIDING] * num_layers


def _sliding_window(cfg: Mapping, notes: list[str]) -> int | None:
    """Tokens a sliding layer keeps, 0 when the config says 0 without switching sliding off, or None when off.

    ``use_sliding_window: false`` switches sliding attention off whatever ``sliding_window`` holds (Qwen2 family;
    transformers writes ``"sliding_window": 0`` or null next to it, e.g. Qwen2-MoE), and a Qwen-family config
    without the switch and without ``layer_types`` is off too (transformers' Qwen2 configs default the switch to
    false; vLLM ``ModelConfig.get_hf_config_sliding_window`` returns None for a false switch).

    Raises:
        ValueError: ``sliding_window`` is not a non-negative integer (the message names it).
    """
    raw = cfg.get("sliding_window")
    model_type = str(cfg.get("model_type", ""))
    use = cfg.get("use_sliding_window")
    off = use is False or (use is None and model_type.startswith("qwen") and cfg.get("layer_types") is None)
    window = None if raw is None else _as_int("sliding_window", raw, 0)
    if off:
        if window:
            notes.append(
                f"`sliding_window` {window} is off (`use_sliding_window` is {use!r}): all layers full"
            )
        return None
    return window


def spec_from_config(config: Mapping, name: str = "config") -> ModelSpec:
    """Read a :class:`ModelSpec` from a transformers config dict.

    Args:
        config: the parsed ``config.json`` (nested ``text_config`` is used for multimodal models; GPT-2 names
            ``n_layer``/``n_embd``/``n_head`` are understood).
        name: what to call the model in reports.

    Raises:
        ValueError: a missing or malformed field; the message names it.
    """
    cfg, notes = decoder_config(config)
    if cfg.get("is_encoder_decoder"):
        raise ValueError(
            "config field `is_encoder_decoder` is true: the planner sizes decoder-only self-attention caches, "
            "not an encoder-decoder's cross-attention"
        )
    num_layers = _num_layers(cfg)
    hidden = _field(cfg, HIDDEN_NAMES)
    heads = _field(cfg, HEAD_NAMES)
    kv_heads, kv_heads_field = _kv_heads(cfg, heads, notes)
    head_dim, kv_lora_rank, rope_dim = _head_geometry(cfg, hidden, heads, kv_heads, kv_heads_field, notes)
    kinds, window, chunk = _attention_layout(cfg, num_layers, notes)
    params = estimate_parameters(cfg, kinds, kv_heads=kv_heads, head_dim=None if kv_lora_rank else head_dim)
    notes.extend(params.notes)
    _note_quantized_checkpoint(cfg, config, notes)
    return ModelSpec(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        layer_kinds=tuple(kinds),
        dtype=_dtype_name(cfg, notes),
        sliding_window=window if SLIDING in kinds else None,
        attention_chunk_size=chunk,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope_dim,
        model_type=str(cfg.get("model_type", "")),
        max_position_embeddings=_max_positions(cfg),
        num_parameters=params.total,
        num_active_parameters=params.active,
        num_decode_flop_parameters=params.decode_flop,
        notes=tuple(notes),
    )


# Most decoder layers a config may have. Published decoders have ~12 to ~130 (GPT-3 96, PaLM 118, Llama-3.1-405B
# 126); the planner keeps one entry per layer in Python lists, so 1e5 layers (~1,000x the deepest model) still plans
# in about a second, while 1e8 took minutes and 1e30 overflowed inside `[kind] * n`.
MAX_LAYERS = 100_000


def _num_layers(cfg: Mapping) -> int:
    """The layer count (every name of LAYER_NAMES), or the length of a per-layer list (Nemotron-H).

    Raises:
        ValueError: no layer count, one that is not an integer >= 1, or one above :data:`MAX_LAYERS` (the field
            and its value named).
    """
    got = _read(cfg, LAYER_NAMES)
    if got is not None:
        num_layers, field = got[0], f"config field `{got[1]}`"
    else:  # Nemotron-H: the layer count is the length of its per-layer list
        key = next((k for k in ("layers_block_type", "layer_types") if isinstance(cfg.get(k), list)), None)
        if key is None or not cfg[key]:
            return _field(cfg, LAYER_NAMES)  # raises: no layer count
        num_layers, field = len(cfg[key]), f"the length of config field `{key}`"
    if num_layers > MAX_LAYERS:
        raise ValueError(
            f"{field} must be at most {MAX_LAYERS:,} layers, got {num_layers:,} (published models have under 200)"
        )
    return num_layers


def _head_geometry(
    cfg: Mapping, hidden: int, heads: int, kv_heads: int, kv_heads_field: str, notes: list[str]
) -> tuple[int, int | None, int | None]:
    """``(head_dim, kv_lora_rank, qk_rope_head_dim)``: MLA's (DeepSeek-V2 §2.1) latent rank and RoPE part, or a
    stated ``head_dim`` (noted when it differs from hidden / heads), else hidden / heads.

    Raises:
        ValueError: no ``head_dim`` and hidden not divisible by heads, or KV heads not dividing query heads.
    """
    kv_lora_rank = _field(cfg, ("kv_lora_rank",), required=False)
    if kv_lora_rank is not None:
        rope_dim = _field(cfg, ("qk_rope_head_dim",))
        nope = _field(cfg, ("qk_nope_head_dim",), required=False, minimum=0) or 0
        notes.append(
            f"MLA: one latent of {kv_lora_rank} + {rope_dim} values per token per layer, not K and V"
        )
        return nope + rope_dim, kv_lora_rank, rope_dim
    stated = _read(cfg, HEAD_DIM_NAMES)
    if stated is None:
        if hidden % heads:
            raise ValueError(
                f"config has no `head_dim` (nor {', '.join(f'`{n}`' for n in HEAD_DIM_NAMES[1:])}) and "
                f"`hidden_size` ({hidden}) is not divisible by `num_attention_heads` ({heads})"
            )
        head_dim = hidden // heads
    else:
        head_dim, head_dim_name = stated
        if head_dim != hidden / heads:
            notes.append(
                f"head_dim {head_dim} read from `{head_dim_name}` (hidden_size / heads would give "
                f"{hidden / heads:g})"
            )
    if heads % kv_heads:
        raise ValueError(
            f"config field `{kv_heads_field}` ({kv_heads} KV heads) must divide `num_attention_heads` ({heads})"
        )
    return head_dim, None, None


def _attention_layout(
    cfg: Mapping, num_layers: int, notes: list[str]
) -> tuple[list[str], int | None, int | None]:
    """``(layer kinds, sliding window, attention chunk size)``: each layer's kind (full, sliding, chunked, shared,
    none), the window of sliding layers and the chunk of chunked ones, with a note for shared and KV-free layers.

    Raises:
        ValueError: a window of 0 while sliding is on, sliding layers without a window, too many shared layers,
            or no layer that stores K/V.
    """
    window = _sliding_window(cfg, notes)
    if cfg.get("block_types") is not None and window is None:  # RecurrentGemma's local attention window
        window = _field(cfg, ("attention_window_size",))
    kinds = _layer_kinds(cfg, num_layers, window or None, notes)
    if window == 0:
        explicit = any(cfg.get(k) is not None for k in ("layer_types", "layers_block_type"))
        if SLIDING in kinds or not explicit:
            raise ValueError(
                "config field `sliding_window` is 0 while sliding attention is not switched off "
                f"(`use_sliding_window` is {cfg.get('use_sliding_window')!r}): neither a window nor off"
            )
        window = None
    if SLIDING in kinds and window is None:
        raise ValueError("config lists sliding layers but `sliding_window` is null or off")
    chunk = _field(cfg, ("attention_chunk_size",)) if CHUNKED in kinds else None
    kinds = _share_last_layers(cfg, kinds, num_layers, notes)
    no_kv = kinds.count(NO_KV)
    if no_kv:
        notes.append(
            f"{no_kv} of {num_layers} layers hold no per-token KV (Mamba/linear/MLP); their fixed per-sequence "
            "state is not counted"
        )
    if not any(k in KV_KINDS for k in kinds):
        raise ValueError("config describes no layer that stores K/V")
    return kinds, window, chunk


def _share_last_layers(cfg: Mapping, kinds: list[str], num_layers: int, notes: list[str]) -> list[str]:
    """``kinds`` with the last ``num_kv_shared_layers`` KV layers marked shared (they reuse earlier layers' K/V).

    Raises:
        ValueError: ``num_kv_shared_layers`` is not below the layer count.
    """
    shared = _field(cfg, ("num_kv_shared_layers",), required=False, minimum=0) or 0
    if not shared:
        return kinds
    if shared >= num_layers:
        raise ValueError(f"config field `num_kv_shared_layers` must be < {num_layers} layers, got {shared}")
    notes.append(f"last {shared} layers reuse earlier layers' K/V (`num_kv_shared_layers`): not charged")
    return kinds[: num_layers - shared] + [
        SHARED if k != NO_KV else NO_KV for k in kinds[num_layers - shared :]
    ]


def _note_quantized_checkpoint(cfg: Mapping, config: Mapping, notes: list[str]) -> None:
    """Note a quantized checkpoint: weight bytes from a parameter count assume one dtype for every weight."""
    if cfg.get("quantization_config") is not None or config.get("quantization_config") is not None:
        qc = cfg.get("quantization_config") or config.get("quantization_config")
        method = qc.get("quant_method", "?") if isinstance(qc, Mapping) else qc
        notes.append(
            f"checkpoint is quantized ({method}); weight bytes from the parameter count assume one dtype for "
            f"all weights{QUANTIZED_WEIGHTS_HINT}"
        )


# the end of the quantized-checkpoint note; the report replaces it with the weight source the user gave
QUANTIZED_WEIGHTS_HINT = ": pass --weight-dtype or --weights-index"


def _max_positions(cfg: Mapping) -> int | None:
    """The config's context limit (the first of ``POSITION_NAMES`` present), or None."""
    for name in POSITION_NAMES:
        if cfg.get(name) is not None:
            return _as_int(name, cfg[name], 1)
    return None


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _looks_like_path(text: str) -> bool:
    """``./x``, ``../x``, ``/x``, ``~/x``, ``x/``, ``*.json`` or ``*.gguf``: meant as a local path, never a preset or
    hub id."""
    return text.startswith(("./", "../", "/", "~", ".\\", "..\\")) or text.lower().endswith(
        ("/", "\\", ".json", ".gguf")
    )


# GGUF file types whose weights are plain floats (the rest are quantized)
_GGUF_PLAIN_TYPES = ("F32", "F16", "BF16", "F64")


def _gguf_spec(path: Path) -> ModelSpec:
    """The :class:`ModelSpec` of a GGUF file: its header read by :func:`kvlab.plan.gguf.read_gguf_config`, then
    :func:`spec_from_config`; ``checkpoint_bytes`` is the file's tensor data (the weights as llama.cpp holds
    them, quantized or not; None for a shard of a split GGUF), with notes on the KV dtype assumed and on the
    quantized weights.

    Raises:
        ValueError: see :func:`kvlab.plan.gguf.read_gguf_config` (each names the file); a config field the spec
            refuses is named with the file.
    """
    cfg = read_gguf_config(path)
    info = cfg["_gguf"]
    try:
        spec = spec_from_config(cfg, name=str(path))
    except ValueError as e:
        raise ValueError(f"{path} (GGUF header read as a config): {e}") from None
    notes = list(spec.notes)
    notes.append(
        f"GGUF states no torch dtype: the KV cache is sized in {GGUF_DTYPE}, the dtype of the dequantized model "
        "(llama.cpp's default f16 KV cache takes the same 2 B per value; pass --kv-dtype for another)"
    )
    if info["split_count"] > 1 or info["tensor_bytes"] is None:
        why = (
            f"shard of a {info['split_count']}-file split GGUF"
            if info["split_count"] > 1
            else f"its tensor types include one unknown to this gguf package ({info['tensor_types']})"
        )
        notes.append(
            f"GGUF weights are {info['file_type']}; the file's tensor bytes are not the model's ({why}), so weight "
            f"bytes come from the parameter count{QUANTIZED_WEIGHTS_HINT}"
        )
        return replace(spec, notes=tuple(notes))
    if info["file_type"] not in _GGUF_PLAIN_TYPES:
        notes.append(
            f"GGUF weights are {info['file_type']}: weight bytes default to the file's {info['tensor_bytes']:,} B "
            f"of tensor data (quantized, as llama.cpp holds them), not a dequantized copy{QUANTIZED_WEIGHTS_HINT}"
        )
    return replace(
        spec,
        checkpoint_bytes=info["tensor_bytes"],
        checkpoint_source=f"{path.name} ({info['file_type']})",
        checkpoint_format="GGUF",
        notes=tuple(notes),
    )


def load_spec(model: str | os.PathLike | Mapping | ModelSpec) -> ModelSpec:
    """Resolve ``model`` to a :class:`ModelSpec`.

    ``model`` may be a :class:`ModelSpec`, a config dict, a preset name or its hub id (case-insensitive, see
    :mod:`kvlab.plan.presets`), a ``config.json`` path, a GGUF file (a ``.gguf`` path, or any file that starts
    with the GGUF magic: its header is read by :func:`kvlab.plan.gguf.read_gguf_config`, torch-free, and its
    tensor data bytes set :attr:`ModelSpec.checkpoint_bytes`), a model directory (its safetensors weights, when
    present, set :attr:`ModelSpec.checkpoint_bytes`), or a hub id (``org/name``) whose ``config.json`` is fetched
    with ``huggingface_hub`` when that package is importable (cached copy first; online only when allowed).

    Raises:
        ValueError: nothing matches ``model`` (a path-like ``model``, see :func:`_looks_like_path`, that does not
            exist is reported as a missing directory, config or GGUF file, never looked up on the hub), the config
            is malformed (the message names the field), or a GGUF file that is not one, is cut short, lacks a key
            or needs the ``gguf`` package (the message names the file).
    """
    from kvlab.plan import presets

    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return spec_from_config(model, name=str(model.get("_name_or_path") or "config"))
    text = os.fspath(model)
    if not text.strip():
        raise ValueError(
            f"`model` must name a preset, a config.json, a GGUF file, a directory or a hub id, got {text!r}"
        )
    preset = presets.find(text)
    if preset is not None:
        return spec_from_config(preset.config, name=preset.name)
    path = Path(text).expanduser()
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = (
                f" (it holds {', '.join(ggufs[:3])}{', ...' if len(ggufs) > 3 else ''}: pass the file)"
                if ggufs
                else ""
            )
            raise ValueError(f"directory {path} has no config.json{hint}")
        spec = spec_from_config(_read_json(config_path), name=str(path))
        found = read_safetensors_bytes(path)
        if found is not None:
            spec = replace(spec, checkpoint_bytes=found[0], checkpoint_source=found[1])
        return spec
    if path.is_file():
        if path.suffix.lower() == ".gguf" or is_gguf_file(path):
            return _gguf_spec(path)
        return spec_from_config(_read_json(path), name=str(path))
    if _looks_like_path(text):
        kinds = {".json": "config file", ".gguf": "GGUF file"}
        kind = next((k for end, k in kinds.items() if text.lower().endswith(end)), "model directory")
        raise ValueError(f"{kind} {text!r} does not exist (looked for {path.resolve()})")
    if _HUB_ID.match(text):
        return spec_from_config(_hub_config(text), name=text)
    raise ValueError(
        f"model {text!r} is not a preset, a config.json, a GGUF file, a directory or a hub id; presets: "
        f"{', '.join(presets.names())}"
    )


def _hub_config(repo_id: str) -> dict:
    """``config.json`` of a hub model via ``huggingface_hub`` (never required: a clear error without it)."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as e:
        raise ValueError(
            f"{repo_id!r} looks like a hub id but huggingface_hub is not installed; pass a config.json path"
        ) from e
    try:
        path = hf_hub_download(repo_id, "config.json", local_files_only=True)
    except Exception:
        from kvlab.runtime.hub import hub_offline_reason

        offline = hub_offline_reason()
        if offline is not None:  # fail now, not after huggingface_hub's ~25 s of retries
            raise ValueError(
                f"{repo_id!r} is not in the local Hugging Face cache and the hub cannot be reached ({offline}); "
                f"pass a config.json path or a preset"
            ) from None
        try:
            path = hf_hub_download(repo_id, "config.json")
        except Exception as e:
            raise ValueError(f"could not fetch config.json of {repo_id!r} from the hub: {e}") from e
    return _read_json(Path(path))
