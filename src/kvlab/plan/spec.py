"""Model spec: the few numbers of a transformers ``config.json`` that size the KV cache.

A :class:`ModelSpec` is read from the model's own config by :func:`spec_from_config` (:func:`kvlab.plan.load.load_spec`
finds that config: a file, a directory, a dict, a hub id, a built-in preset, or a llama.cpp GGUF file's header), so
that the traps of hand-typed calculators do not apply:

* Every quantity is read under every name the transformers config classes and vLLM's ``ModelConfig`` read it
  by (``LAYER_NAMES``, ``HIDDEN_NAMES``, ``HEAD_NAMES``, ``KV_HEAD_NAMES``, ``HEAD_DIM_NAMES`` of
  :mod:`kvlab.plan.config_fields`: GPT-2, MPT/DBRX, ChatGLM, Falcon, OLMo, PLaMo, Mistral ``params.json``); two
  names for one quantity must agree.
* ``head_dim`` (or ``kv_channels``, ``hidden_size_per_head``, ``attention_head_dim``) is read when present;
  ``hidden_size / num_attention_heads`` is only the fallback (Mistral-Small-24B: 128 in the config, 160 derived;
  gpt-oss-20b: 64 vs 45).
* MLA (DeepSeek-V2 arXiv:2405.04434 section 2.1): a layer caches one latent of ``kv_lora_rank + qk_rope_head_dim``
  values per token, not K and V per head.
* KV heads and layer kinds (sliding, chunked, KV-free, KV-shared) follow each architecture's rules in
  :mod:`kvlab.plan.architectures`.

Pure Python; no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kvlab.plan.architectures import attention_layout, kv_heads_of
from kvlab.plan.config_fields import (
    CHUNKED,
    DTYPE_BYTES,
    HEAD_DIM_NAMES,
    HEAD_NAMES,
    HIDDEN_NAMES,
    KV_KINDS,
    LAYER_KINDS,
    LAYER_NAMES,
    SLIDING,
    VLLM_DEFAULT_MAX_LEN,
    check_int_at_least,
    check_rope_scaling,
    decoder_config,
    field_int,
    position_limit,
    read_int,
    rope_scaling_of,
    tokenizer_max_length,
    vllm_caps_by_tokenizer,
)
from kvlab.plan.weights import estimate_parameters


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
    max_position_embeddings: int | None = None  # the config's context limit, when stated: the smallest of the
    #   position fields vLLM reads (kvlab.plan.config_fields.position_limit), before any RoPE scaling
    num_parameters: int | None = None  # estimated from the config (kvlab.plan.weights), None if unknown
    num_active_parameters: int | None = None  # parameters used per token (MoE: routed experts only)
    num_decode_flop_parameters: int | None = None  # parameters a decode token multiplies by (2 FLOP each):
    #   active less the embedding lookups, the LM head once whether tied or not; None if unknown
    checkpoint_bytes: int | None = None  # bytes of the safetensors weights next to the config (or of a GGUF's
    #   tensor data), when read
    checkpoint_source: str | None = None  # the file(s) checkpoint_bytes was read from
    checkpoint_format: str = "safetensors"  # "safetensors" or "GGUF": what checkpoint_source is
    full_head_dim: int | None = None  # K/V head width of full-attention layers where it differs from head_dim
    #   (Gemma 4 `global_head_dim`); None: head_dim on every layer
    scaled_context_limit: int | None = None  # max_position_embeddings with the config's RoPE scaling as vLLM derives
    #   the longest max_model_len (kvlab.plan.config_fields.rope_scaling_of), or vLLM's default 2,048 (scaled) where
    #   the config states no position field; None: no scaling stated
    position_field: str | None = None  # the config field max_position_embeddings was read from (n_positions ...;
    #   "model_max_length of tokenizer_config.json" where vLLM caps the limit by it)
    rope_scaling: str | None = None  # the config's RoPE scaling type (yarn, linear, llama3 ...), None: none stated
    rope_field: str | None = None  # the field it was read from: rope_scaling, rope_parameters or, per layer type,
    #   rope_parameters.full_attention ...; None: none stated
    notes: tuple[str, ...] = field(default=())  # what the reader assumed or ignored, for the user

    @property
    def context_limit(self) -> int | None:
        """The longest context the model serves, in tokens: its ``max_position_embeddings`` with the config's
        ``rope_scaling`` as vLLM derives its longest ``--max-model-len`` (:attr:`scaled_context_limit`; linear
        factor 4 on 4,096 positions: 16,384), else ``max_position_embeddings``; for a config stating no position
        field, the 2,048 vLLM assumes (scaled alike); None for a spec not read from a config that states none.
        The one limit the default context, its warnings and ``--emit vllm`` go by."""
        return self.max_position_embeddings if self.scaled_context_limit is None else self.scaled_context_limit

    def limit_words(self, limit: int | None = None) -> str:
        """How a note, warning or refusal names the model's context limit ``limit`` (default :attr:`context_limit`;
        :func:`kvlab.plan.vllm.vllm_max_model_len` for vLLM's) by the config field it comes from
        (:attr:`position_field`): ``"max_position_embeddings"``, ``"n_positions"``; ``"max_position_embeddings 4,096
        with its rope_scaling"`` where the scaling sets a longer limit (as vLLM derives its longest
        ``--max-model-len``; the field it was read from, :attr:`rope_field`: ``rope_parameters``,
        ``rope_parameters.full_attention``); ``"max_position_embeddings, its yarn rope_scaling included"`` where a
        scaling leaves it as the config states it (Kimi's yarn: 4,096 original positions x 64); ``"limit as vLLM
        sets it for a config stating no position field (2,048)"`` where the config states none."""
        limit = self.context_limit if limit is None else limit
        base = self.max_position_embeddings
        rope = self.rope_field or "rope_scaling"
        if base is None:  # vLLM's limit only (vllm_max_model_len): the spec's own is None
            words = f"limit as vLLM sets it for a config stating no position field ({VLLM_DEFAULT_MAX_LEN:,}"
            return f"{words})" if limit == VLLM_DEFAULT_MAX_LEN else f"{words}, with its {rope})"
        field = self.position_field or "max_position_embeddings"
        if limit != base:
            return f"{field} {base:,} with its {rope}"
        return f"{field}, its {self.rope_scaling} {rope} included" if self.rope_scaling else field

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim"):
            check_int_at_least(name, getattr(self, name), 1)
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
        ``kv_lora_rank + qk_rope_head_dim`` (docs/plan.md, Ledger and fit; DeepSeek-V2 section 2.1.3)."""
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
            "context_limit": self.context_limit,
            "num_parameters": self.num_parameters,
            "num_active_parameters": self.num_active_parameters,
            "num_decode_flop_parameters": self.num_decode_flop_parameters,
            "notes": list(self.notes),
        }


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


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


def spec_from_config(
    config: Mapping, name: str = "config", *, tokenizer_config: Mapping | None = None, tokenizer_source: str = ""
) -> ModelSpec:
    """Read a :class:`ModelSpec` from a transformers config dict.

    Args:
        config: the parsed ``config.json`` (nested ``text_config`` is used for multimodal models; GPT-2 names
            ``n_layer``/``n_embd``/``n_head`` are understood).
        name: what to call the model in reports.
        tokenizer_config: the parsed ``tokenizer_config.json`` beside it, if any: its ``model_max_length`` caps the
            context limit where vLLM caps it (:func:`_context_fields`), else is noted where lower.
        tokenizer_source: the file ``tokenizer_config`` was read from, for errors.

    Raises:
        ValueError: a missing or malformed field; the message names it (a RoPE ``factor`` that is not a finite
            number > 0 with ``name``: :func:`kvlab.plan.config_fields.check_rope_scaling`; a ``model_max_length``
            that is not a whole number >= 1 with ``tokenizer_source``).
    """
    cfg, notes = decoder_config(config)
    check_rope_scaling(cfg, name)
    tokenizer = None if tokenizer_config is None else (config, tokenizer_config, tokenizer_source or name)
    if cfg.get("is_encoder_decoder"):
        raise ValueError(
            "config field `is_encoder_decoder` is true: the planner sizes decoder-only self-attention caches, "
            "not an encoder-decoder's cross-attention"
        )
    num_layers = _num_layers(cfg)
    hidden = field_int(cfg, HIDDEN_NAMES)
    heads = field_int(cfg, HEAD_NAMES)
    kv_heads, kv_heads_field = kv_heads_of(cfg, heads, notes)
    head_dim, kv_lora_rank, rope_dim = _head_geometry(cfg, hidden, heads, kv_heads, kv_heads_field, notes)
    kinds, window, chunk = attention_layout(cfg, num_layers, notes)
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
        **_context_fields(cfg, notes, tokenizer),
        full_head_dim=_full_head_dim(cfg, head_dim, kinds, notes),
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
    got = read_int(cfg, LAYER_NAMES)
    if got is not None:
        num_layers, field = got[0], f"config field `{got[1]}`"
    else:  # Nemotron-H: the layer count is the length of its per-layer list
        key = next((k for k in ("layers_block_type", "layer_types") if isinstance(cfg.get(k), list)), None)
        if key is None or not cfg[key]:
            return field_int(cfg, LAYER_NAMES)  # raises: no layer count
        num_layers, field = len(cfg[key]), f"the length of config field `{key}`"
    if num_layers > MAX_LAYERS:
        raise ValueError(
            f"{field} must be at most {MAX_LAYERS:,} layers, got {num_layers:,} (published models have under 200)"
        )
    return num_layers


def _head_geometry(
    cfg: Mapping, hidden: int, heads: int, kv_heads: int, kv_heads_field: str, notes: list[str]
) -> tuple[int, int | None, int | None]:
    """``(head_dim, kv_lora_rank, qk_rope_head_dim)``: MLA's (DeepSeek-V2 section 2.1) latent rank and RoPE part, or a
    stated ``head_dim`` (noted when it differs from hidden / heads), else hidden / heads.

    Raises:
        ValueError: no ``head_dim`` and hidden not divisible by heads, or KV heads not dividing query heads.
    """
    kv_lora_rank = field_int(cfg, ("kv_lora_rank",), required=False)
    if kv_lora_rank is not None:
        rope_dim = field_int(cfg, ("qk_rope_head_dim",))
        nope = field_int(cfg, ("qk_nope_head_dim",), required=False, minimum=0) or 0
        notes.append(
            f"MLA: one latent of {kv_lora_rank} + {rope_dim} values per token per layer, not K and V"
        )
        return nope + rope_dim, kv_lora_rank, rope_dim
    stated = read_int(cfg, HEAD_DIM_NAMES)
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


def _context_fields(cfg: Mapping, notes: list[str], tokenizer: tuple[Mapping, Mapping, str] | None) -> dict[str, Any]:
    """The spec's context limit fields, as vLLM's ``_get_and_verify_max_len`` (``vllm/config/model.py``) derives the
    limit: ``max_position_embeddings`` as vLLM reads it and the field it comes from
    (:func:`kvlab.plan.config_fields.position_limit`: the smallest of its position fields), capped by the
    tokenizer's ``model_max_length`` where vLLM caps it (``tokenizer``: ``(config, tokenizer_config, its file)``;
    :func:`_tokenizer_cap`), then the limit with the config's RoPE scaling
    (:func:`kvlab.plan.config_fields.rope_scaling_of`; None where the scaling leaves it as it is; vLLM's default
    2,048, scaled, where no field states a limit, as vLLM assumes it), the scaling's type and field. A per-layer-type
    ``rope_parameters`` set that scales the limit is named in a note (``notes`` is appended to)."""
    limit, name = position_limit(cfg) or (None, None)
    if tokenizer is not None:
        limit, name = _tokenizer_cap(limit, name, *tokenizer, notes)
    base = VLLM_DEFAULT_MAX_LEN if limit is None else limit  # vLLM's where none stated
    scaled, kind, rope_field = rope_scaling_of(cfg, base)
    if rope_field is not None and "." in rope_field and scaled != base:
        notes.append(
            f"context limit {scaled:,} tokens from {rope_field} ({kind or 'default'} RoPE): rope_parameters is set "
            f"per layer type ({', '.join(cfg['rope_parameters'])}) and vLLM scales the limit by the last that states "
            "a factor"
        )
    return {
        "max_position_embeddings": limit,
        "position_field": name,
        "scaled_context_limit": None if scaled == limit else scaled,
        "rope_scaling": kind,
        "rope_field": rope_field,
    }


def _tokenizer_cap(
    limit: int | None, name: str | None, config: Mapping, tokenizer: Mapping, source: str, notes: list[str]
) -> tuple[int | None, str | None]:
    """``(limit, field)`` with the tokenizer's ``model_max_length`` (``tokenizer_config.json``, read from
    ``source``) as vLLM takes it: the smaller of the two for a pooling model with absolute position embeddings
    (:func:`kvlab.plan.config_fields.vllm_caps_by_tokenizer`), noted; for any other model the config's limit
    stands, and a lower ``model_max_length`` is noted, not taken (vLLM does not take it either). transformers' "no
    limit" sentinel (``1e30``) is no limit (:func:`kvlab.plan.config_fields.tokenizer_max_length`).

    Raises:
        ValueError: a ``model_max_length`` that is not a whole number >= 1, naming ``source``.
    """
    length = tokenizer_max_length(tokenizer.get("model_max_length"), source)
    if length is None or (limit is not None and length >= limit):
        return limit, name
    field = "tokenizer_config.json's model_max_length"
    stated = "no position field" if limit is None else f"{name} {limit:,}"
    if vllm_caps_by_tokenizer(config):
        notes.append(
            f"context limit {length:,} tokens from {field} (the config states {stated}): vLLM caps a pooling model "
            "with absolute position embeddings by it"
        )
        return length, "model_max_length of tokenizer_config.json"
    if length < (VLLM_DEFAULT_MAX_LEN if limit is None else limit):
        stated = f"vLLM's default {VLLM_DEFAULT_MAX_LEN:,} for a config stating none" if limit is None else stated
        notes.append(
            f"{field} is {length:,} tokens, below the config's {stated}: vLLM does not cap a generative model's "
            f"max_model_len by it (only a pooling model's with absolute position embeddings), nor does the plan; "
            f"pass --context {length} to plan for the tokenizer's length"
        )
    return limit, name


def _full_head_dim(cfg: Mapping, head_dim: int, kinds: list[str], notes: list[str]) -> int | None:
    """Gemma 4's ``global_head_dim``: the K/V head width of its full-attention layers (transformers'
    ``Gemma4TextConfig`` sets ``head_dim`` to it on every full-attention layer), or None where absent or equal."""
    if not str(cfg.get("model_type", "")).startswith("gemma4") or "full" not in kinds:
        return None
    width = field_int(cfg, ("global_head_dim",), required=False)
    if width is None or width == head_dim:
        return None
    notes.append(
        f"full-attention layers have K/V heads of {width} (`global_head_dim`), sliding layers {head_dim}: the "
        "vLLM model (kvlab.plan.vllm_kv) counts both; the ledger counts head_dim on every layer"
    )
    return width
