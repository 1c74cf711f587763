"""Per-architecture quirks of ``config.json``: how many KV heads an attention layer has and what kind each layer is.

* KV heads follow vLLM ``ModelConfig.get_total_num_kv_heads``: none stated means multi-head attention;
  ``multi_query`` means one KV head (the default of Falcon and GPT-BigCode configs, unless Falcon's
  ``new_decoder_architecture``); ChatGLM's ``multi_query_group_num`` counts when ``multi_query_attention`` is on;
  MPT/DBRX read ``attn_config.kv_n_heads``. Where the loaders' defaults disagree, the config is refused with the
  field named, never guessed.
* Sliding-window layers (``sliding_window`` with ``layer_types``, ``sliding_window_pattern`` or a model-type
  default; ``use_sliding_window: false`` turns it off, whatever ``sliding_window`` holds, 0 included), chunked
  layers (Llama 4), layers without KV (Mamba, recurrent or linear-attention layers of hybrids: Jamba, Bamba
  ``attn_layer_indices``, RecurrentGemma ``block_types``) and KV-shared layers (Gemma-3n ``num_kv_shared_layers``)
  are told apart.

:mod:`kvlab.plan.spec` calls :func:`kv_heads_of` and :func:`attention_layout`. Pure Python; no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvlab.plan.config_fields import (
    CHUNKED,
    FULL,
    KV_HEAD_NAMES,
    KV_KINDS,
    NO_KV,
    SHARED,
    SLIDING,
    as_int,
    field_int,
    read_int,
)

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


# model types whose config class defaults `multi_query` to True (transformers FalconConfig, GPTBigCodeConfig;
# vLLM's RWConfig for the original Falcon checkpoints)
_MULTI_QUERY_DEFAULT = ("falcon", "RefinedWeb", "RefinedWebModel", "gpt_bigcode")


# model types whose model code reads `multi_query` before any KV head count (transformers FalconAttention and
# GPTBigCodeAttention; the Falcon RW remote code), as vLLM's ModelConfig does: a count next to it is ignored
_MULTI_QUERY_FIRST = ("falcon", "RefinedWeb", "RefinedWebModel", "gpt_bigcode")


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
    kv = None if kv is None else as_int("attn_config.kv_n_heads", kv, 1)
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


def kv_heads_of(cfg: Mapping, num_heads: int, notes: list[str]) -> tuple[int, str]:
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
    stated = read_int(cfg, KV_HEAD_NAMES)
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
        groups = as_int("multi_query_group_num", cfg["multi_query_group_num"], 1)
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
        period = field_int(cfg, ("attn_layer_period",))
        offset = field_int(cfg, ("attn_layer_offset",), required=False, minimum=0) or 0
        if offset >= period:
            raise ValueError(
                f"config field `attn_layer_offset` must be < attn_layer_period ({period}), got {offset}"
            )
        return [FULL if i % period == offset else NO_KV for i in range(num_layers)]
    if window is None:
        return [FULL] * num_layers
    pattern = field_int(cfg, ("sliding_window_pattern", "_sliding_window_pattern"), required=False)
    if pattern is not None:  # Gemma 3: every `pattern`-th layer is global
        return [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    if model_type == "gemma2":  # Gemma 2: alternating, layer 0 sliding
        return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]
    if model_type in ("gemma3", "gemma3_text"):
        return [SLIDING if (i + 1) % 6 else FULL for i in range(num_layers)]
    if cfg.get("max_window_layers") is not None:  # Qwen2 family: layers >= max_window_layers slide
        first = field_int(cfg, ("max_window_layers",), minimum=0)
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
    window = None if raw is None else as_int("sliding_window", raw, 0)
    if off:
        if window:
            notes.append(
                f"`sliding_window` {window} is off (`use_sliding_window` is {use!r}): all layers full"
            )
        return None
    return window


def attention_layout(
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
        window = field_int(cfg, ("attention_window_size",))
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
    chunk = field_int(cfg, ("attention_chunk_size",)) if CHUNKED in kinds else None
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
    shared = field_int(cfg, ("num_kv_shared_layers",), required=False, minimum=0) or 0
    if not shared:
        return kinds
    if shared >= num_layers:
        raise ValueError(f"config field `num_kv_shared_layers` must be < {num_layers} layers, got {shared}")
    notes.append(f"last {shared} layers reuse earlier layers' K/V (`num_kv_shared_layers`): not charged")
    return kinds[: num_layers - shared] + [
        SHARED if k != NO_KV else NO_KV for k in kinds[num_layers - shared :]
    ]
