"""Config field names, layer kinds and the field readers shared by the spec reader and the weight estimator.

:mod:`kvlab.plan.spec` (KV geometry), :mod:`kvlab.plan.architectures` (per-architecture quirks) and
:mod:`kvlab.plan.weights` (parameter count) read the same ``config.json`` fields; they take the names and the
readers (:func:`as_int`, :func:`read_int`, :func:`field_int`) from here, so none imports another's internals.
The planner's modules also take :func:`check_int_at_least` from here, the one check of a count they are given,
and :func:`number_text`, the one way a number they name in a message is written.

Pure Python; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Layer kinds, one per decoder layer.
FULL = "full"  # attention over every past token: stores K/V for the whole context
SLIDING = "sliding"  # attention over the last `sliding_window` tokens
CHUNKED = "chunked"  # attention inside fixed chunks of `attention_chunk_size` tokens (Llama 4)
SHARED = "shared"  # attention that reuses the K/V of an earlier layer: stores nothing (Gemma-3n)
NO_KV = "none"  # no attention (Mamba, linear attention, MLP-only block): no per-token cache
LAYER_KINDS = (FULL, SLIDING, CHUNKED, SHARED, NO_KV)
KV_KINDS = (FULL, SLIDING, CHUNKED)  # kinds that store K/V of their own

DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "float64": 8,
}

# Every name under which the transformers config classes (their fields and ``attribute_map``) and vLLM's
# ``ModelConfig`` (``get_num_layers``, ``get_total_num_attention_heads``, ``get_total_num_kv_heads``,
# ``get_head_size``) read the same quantity. A config naming one quantity twice with different values is refused.
# GPT-2/Falcon, ChatGLM, MPT/DBRX/OLMo
LAYER_NAMES = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HIDDEN_NAMES = ("hidden_size", "n_embd", "d_model", "dim")  # GPT-2, MPT/DBRX, Mistral params.json
# GPT-2/Falcon, MPT/DBRX/OLMo, XGLM
HEAD_NAMES = ("num_attention_heads", "n_head", "n_heads", "num_heads", "attention_heads")
KV_HEAD_NAMES = (
    "num_key_value_heads",  # Llama and most transformers configs
    "num_kv_heads",  # Falcon (new decoder architecture)
    "n_head_kv",  # Falcon RW configs
    "n_kv_heads",  # OLMo (hf_olmo), Mistral params.json
)
HEAD_DIM_NAMES = (
    "head_dim",  # most configs
    "kv_channels",  # ChatGLM, Qwen (v1): Megatron's width of one head
    "hidden_size_per_head",  # PLaMo
    "attention_head_dim",  # Zamba2
)
# the fields vLLM derives a model's context limit from, in its order; it takes the smallest stated (and a stated
# `model_max_length`, Command-R's, over them): vLLM's `_get_and_verify_max_len` (vllm/config/model.py), possible_keys
POSITION_NAMES = (
    "max_position_embeddings",  # OPT, Llama and most
    "n_positions",  # GPT-2
    "max_seq_len",  # MPT
    "seq_length",  # ChatGLM2
    "model_max_length",  # Command-R
    "max_target_positions",  # Whisper
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# the context limit vLLM assumes where a config states none of POSITION_NAMES (it logs a warning)
VLLM_DEFAULT_MAX_LEN = 2048


def decoder_config(config: Mapping) -> tuple[dict, list[str]]:
    """The decoder part of a config: ``text_config`` (or ``llm_config``) of a multimodal model, else the config.

    Returns ``(decoder_dict, notes)``; the outer ``torch_dtype``/``dtype`` is inherited when the inner one is
    missing.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"a config must be a JSON object (dict), got {type(config).__name__}")
    for key in ("text_config", "llm_config", "language_config"):
        inner = config.get(key)
        if inner is None:
            continue
        if not isinstance(inner, Mapping):
            raise ValueError(f"config field `{key}` must be an object, got {inner!r}")
        from kvlab.plan.architecture_defaults import fill_defaults

        merged = dict(inner)
        for dkey in ("torch_dtype", "dtype"):
            if merged.get(dkey) is None and config.get(dkey) is not None:
                merged[dkey] = config[dkey]
        note = f"decoder read from `{key}`; other towers (vision, audio) are not counted"
        return merged, [note, *fill_defaults(merged, key)]
    return dict(config), []


_AT_LEAST = {0: "a non-negative integer", 1: "a positive integer"}


def number_text(value: Any) -> str:
    """A number as kvlab's messages show it: an int with thousands separators (``8,192``), a float in its short
    form (``2.4``, not ``2.4000000000000004``; ``1e+30``; a whole float as the int: ``5``), at most 12 significant
    digits; anything else (NaN, a string, None) as its repr, so a bad value is named as it was given."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return repr(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return repr(value)
    if value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.12g}"


def count_text(count: Any, noun: str, plural: str | None = None) -> str:
    """``count`` as :func:`number_text` shows it and ``noun``, plural unless ``count`` is 1: ``1 frame``,
    ``2 frames``, ``8,192 tokens`` (``plural`` where adding an s is wrong)."""
    return f"{number_text(count)} {noun if count == 1 else plural or noun + 's'}"


def check_int_at_least(name: str, value: Any, minimum: int, *, flag: str | None = None) -> int:
    """``value`` when it is a Python ``int`` (not a bool) of at least ``minimum``: 1 for a count or a size the
    planner takes, 0 for a count that may be empty (tokens, bytes).

    Raises:
        ValueError: ``"`name` must be a positive integer, got value"`` for ``minimum`` 1 (``a non-negative
            integer`` for 0, ``an integer >= minimum`` otherwise; ``"`name` (flag) ..."`` with ``flag``).
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        where = f"`{name}`" + (f" ({flag})" if flag else "")
        kind = _AT_LEAST.get(minimum, f"an integer >= {minimum}")
        raise ValueError(f"{where} must be {kind}, got {value!r}")
    return value


def check_int(name: str, value: Any) -> int:
    """``value`` when it is a Python ``int`` (not a bool), of any sign (a budget left after a reserve may be < 0).

    Raises:
        ValueError: ``"`name` must be an integer, got value"`` (a float, NaN, infinity or bool is refused).
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"`{name}` must be an integer, got {value!r}")
    return value


def as_int(name: str, value: Any, minimum: int) -> int:
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


def read_int(cfg: Mapping, names: tuple[str, ...], *, minimum: int = 1) -> tuple[int, str] | None:
    """``(value, name)`` of the non-null fields among ``names``, or None when there is none.

    Raises:
        ValueError: a field that is not an integer >= ``minimum``, or two of ``names`` with different values
            (the config says two things; which one the model uses cannot be known).
    """
    found = [(n, as_int(n, cfg[n], minimum)) for n in names if cfg.get(n) is not None]
    if not found:
        return None
    for name, value in found[1:]:
        if value != found[0][1]:
            raise ValueError(
                f"config fields `{found[0][0]}` ({found[0][1]}) and `{name}` ({value}) disagree: the planner "
                "cannot tell which one the model uses"
            )
    return found[0][1], found[0][0]


def field_int(cfg: Mapping, names: tuple[str, ...], *, required: bool = True, minimum: int = 1) -> int | None:
    """The value of ``names`` in ``cfg`` (see :func:`read_int`) as an int >= ``minimum``; errors name the field."""
    got = read_int(cfg, names, minimum=minimum)
    if got is not None:
        return got[0]
    if required:
        alts = f" (nor {', '.join(f'`{n}`' for n in names[1:])})" if len(names) > 1 else ""
        raise ValueError(f"config has no `{names[0]}`{alts}")
    return None


def position_limit(cfg: Mapping) -> tuple[int, str] | None:
    """``(limit, field)``: the context limit vLLM derives from the decoder config ``cfg`` before any RoPE scaling,
    and the field it comes from; None where ``cfg`` states none of :data:`POSITION_NAMES` (vLLM then assumes
    :data:`VLLM_DEFAULT_MAX_LEN`). The smallest of the fields stated, named by the first that states it (vLLM's
    ``max_len_key``: gpt2-style ``n_positions`` 1,024 beside ``max_position_embeddings`` 2,048 is 1,024), unless
    ``model_max_length`` is stated: vLLM takes it over the others (Command-R, whose ``max_position_embeddings``
    8,192 is not its limit). Source: ``_get_and_verify_max_len`` (``vllm/config/model.py``).

    Raises:
        ValueError: a stated field that is not an integer >= 1 (:func:`as_int`, naming the field).
    """
    found = [(as_int(name, cfg[name], 1), name) for name in POSITION_NAMES if cfg.get(name) is not None]
    if not found:
        return None
    overriding = [f for f in found if f[1] == "model_max_length"]
    return overriding[0] if overriding else min(found, key=lambda f: f[0])  # min: the first of equal ones


# the fields a decoder config states its RoPE parameters in: transformers 4's `rope_scaling`, transformers 5's
# `rope_parameters` (flat, or one set per layer type: {"full_attention": {...}, "sliding_attention": {...}}); where
# both are stated transformers 5 (PretrainedConfig.convert_rope_params_to_dict: `rope_scaling or rope_parameters`)
# and vLLM on transformers 4 (patch_rope_parameters) take `rope_scaling`
ROPE_FIELDS = ("rope_scaling", "rope_parameters")


def rope_parameter_sets(cfg: Mapping) -> list[tuple[str, Mapping]]:
    """``(field, parameters)`` of each RoPE parameter set of the decoder config ``cfg``, in the config's order: the
    first non-empty object of :data:`ROPE_FIELDS`; one set per layer type where its values are all objects
    (``rope_parameters.full_attention``, ``rope_parameters.sliding_attention``; vLLM's ``is_rope_parameters_nested``
    tests the keys against transformers' layer types), else the one set. [] where none is stated (or the field is
    not an object)."""
    for name in ROPE_FIELDS:
        rope = cfg.get(name)
        if isinstance(rope, Mapping) and rope:
            if all(isinstance(v, Mapping) for v in rope.values()):
                return [(f"{name}.{key}", value) for key, value in rope.items()]
            return [(name, rope)]
    return []


def rope_type(parameters: Mapping) -> str | None:
    """The RoPE type of one parameter set (``rope_type``, or transformers 4's ``type``) as vLLM reads it
    (``patch_rope_parameters_dict``: ``su`` is ``longrope``, ``mrope`` is ``default``); None for ``default`` (no
    scaling) or none stated."""
    kind = parameters.get("rope_type", parameters.get("type"))
    kind = {"su": "longrope", "mrope": "default"}.get(kind, kind)
    return None if kind in (None, "default") else str(kind)


def check_rope_scaling(cfg: Mapping, where: str) -> None:
    """Refuse a RoPE ``factor`` of the decoder config ``cfg`` (read from ``where``: the config file, or the model's
    name) that is not a finite number > 0, in ``rope_scaling`` or ``rope_parameters`` (each per-layer-type set:
    :func:`rope_parameter_sets`). vLLM multiplies the config's ``max_position_embeddings`` by it for the longest
    ``--max-model-len`` (``_get_and_verify_max_len``, ``vllm/config/model.py``;
    :func:`kvlab.plan.vllm.vllm_max_model_len`): ``Infinity`` was an OverflowError, ``NaN`` "cannot convert float
    NaN to integer", 0 and -2 a limit of 0 and -8,192 tokens. A missing field or ``factor`` is fine.

    Raises:
        ValueError: naming the field (``rope_scaling.factor``, ``rope_parameters.full_attention.factor``), ``where``
            and the value.
    """
    for field, rope in rope_parameter_sets(cfg):
        factor = rope.get("factor")
        if factor is None:
            continue
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not (0 < factor < math.inf):
            raise ValueError(
                f"config field `{field}.factor` of {where} must be a finite number > 0, got {number_text(factor)}"
            )


# RoPE types whose factor vLLM does not apply to the config's positions (they state the scaled length)
UNSCALED_ROPE = ("su", "longrope", "llama3")


def rope_scaling_of(cfg: Mapping, limit: int | None) -> tuple[int | None, str | None, str | None]:
    """``(scaled limit, RoPE type, field)``: the longest context vLLM derives for the decoder config ``cfg`` whose
    position limit is ``limit`` (None where the config states none), and the RoPE parameter set it goes by.

    As vLLM's ``_get_and_verify_max_len`` (``vllm/config/model.py``) over each set of :func:`rope_parameter_sets`:
    a set whose type is not ``su``, ``longrope`` or ``llama3`` gives its ``factor`` (the last set stating one wins:
    vLLM assumes every layer type scales alike) and a ``yarn`` set its ``original_max_position_embeddings`` as the
    length the factor multiplies; ``limit`` times the factor. A Gemma 3 (its ``max_position_embeddings`` is the
    scaled length) is not scaled. The set named is the one whose factor was taken, else the last with a scaling
    type (``"rope_parameters.full_attention"``); its type is None for ``default``. ``(limit, None, None)`` where no
    set is stated. A factor that is not a finite number > 0 is refused where the config is read
    (:func:`check_rope_scaling`)."""
    sets = rope_parameter_sets(cfg)
    named = next(((rope_type(r), f) for f, r in reversed(sets) if rope_type(r)), (None, None))
    if limit is None or "gemma3" in str(cfg.get("model_type", "")):
        return limit, *named
    factor, length = 1.0, limit
    for field, rope in sets:
        kind = rope_type(rope)
        if kind in UNSCALED_ROPE:
            continue
        stated = rope.get("factor")
        if isinstance(stated, int | float) and not isinstance(stated, bool) and 0 < stated < math.inf:
            factor, named = stated, (kind, field)
        if kind == "yarn" and isinstance(rope.get("original_max_position_embeddings"), int):
            length = rope["original_max_position_embeddings"]
    return (limit if (factor, length) == (1.0, limit) else int(length * factor)), *named


# transformers' tokenizers write model_max_length int(1e30) (VERY_LARGE_INTEGER) for "no limit" (a tokenizer saved
# without one: Llama 2, Mistral, Qwen's); at or above LARGE_INTEGER (int(1e20), tokenization_utils_base) it is read
# as that sentinel, not a length
TOKENIZER_NO_LIMIT = 10**20


def tokenizer_max_length(value: Any, where: str) -> int | None:
    """The ``model_max_length`` of a ``tokenizer_config.json`` (read from ``where``) in tokens, or None where it
    states none: absent, null, or transformers' "no limit" sentinel (:data:`TOKENIZER_NO_LIMIT` or more, e.g.
    ``1000000000000000019884624838656``, JSON's ``1e30`` or ``Infinity``).

    Raises:
        ValueError: a value that is not a whole number >= 1 (a string, a bool, NaN, 0, 512.5), naming the field,
            ``where`` and the value.
    """
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= TOKENIZER_NO_LIMIT:
        return None  # 1e30 and inf included (NaN compares False and is refused below)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"`model_max_length` of {where} must be a whole number >= 1, got {number_text(value)}")
    if value != int(value) or value < 1:
        raise ValueError(f"`model_max_length` of {where} must be a whole number >= 1, got {number_text(value)}")
    return int(value)


# architecture suffixes vLLM runs as a pooling model by default (vllm/config/model.py, _SUFFIX_TO_DEFAULTS, in its
# order: the generative ones first, so that GPT2LMHeadModel is not a "...Model")
_GENERATIVE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "ChatModel", "LMHeadModel")
_POOLING_SUFFIXES = (
    "ForTextEncoding", "EmbeddingModel", "ForSequenceClassification", "ForAudioClassification",
    "ForImageClassification", "ForVideoClassification", "ClassificationModel", "ForRewardModeling", "RewardModel",
    "Model",
)  # fmt: skip


def vllm_caps_by_tokenizer(config: Mapping) -> bool:
    """Whether vLLM caps ``config``'s max_model_len by its tokenizer's ``model_max_length``: only a pooling model
    (an embedding, classification or reward model) with absolute position embeddings
    (``ModelConfig.get_and_verify_max_len``, ``vllm/config/model.py``: "Consider max_model_len in tokenizer_config
    only when pooling models use absolute position_embedding"; BAAI/bge-reranker-base, 514 positions and a
    tokenizer of 512). A generative decoder's limit is its config's, whatever the tokenizer says. Pooling is read
    from the first of ``architectures`` that vLLM's architecture suffixes place (``XLMRobertaModel``, ``...For
    SequenceClassification``), as vLLM does for an architecture outside its registry."""
    if config.get("position_embedding_type") != "absolute":
        return False
    for arch in config.get("architectures") or ():
        name = str(arch)
        if name.endswith(_GENERATIVE_SUFFIXES):
            return False
        if name.endswith(_POOLING_SUFFIXES):
            return True
    return False
