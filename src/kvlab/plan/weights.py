"""Weight bytes: a parameter count estimated from ``config.json``, or the exact bytes of safetensors files.

The estimate counts embeddings, the LM head (unless tied), attention (GQA or MLA projections), the MLP (gated,
GPT-2 or Falcon style; MoE experts, router and shared experts) and Jamba's Mamba mixers; norms and biases are
counted where the architecture is known to have them. Anything it cannot see (multi-token-prediction layers,
Gemma-3n per-layer embeddings, other mixers) is named in ``notes``. The safetensors path reads only the JSON
headers (no torch, no tensor data). Pure Python.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvlab.plan.config_fields import DTYPE_BYTES, HEAD_NAMES, HIDDEN_NAMES, LAYER_NAMES, NO_KV, decoder_config

WEIGHT_DTYPE_BYTES = {**DTYPE_BYTES, "int8": 1, "int4": 0.5, "mxfp4": 0.5}


@dataclass(frozen=True)
class ParamEstimate:
    """Parameter count of a decoder estimated from its config."""

    total: int | None  # all parameters (None when the config lacks vocab/intermediate sizes)
    active: int | None  # parameters used per token (MoE: the routed experts of one token only)
    notes: tuple[str, ...] = field(default=())  # what the estimate leaves out
    decode_flop: int | None = None  # parameters a decode token multiplies by: active less the lookup tables
    #   (token and learned-position embeddings), the LM head counted once whether tied or not


@dataclass(frozen=True)
class WeightBytes:
    """Bytes of a model's weights and where the number comes from."""

    total_bytes: int  # all weights
    active_bytes: int  # weights one decode step must read at least (MoE: shared + k routed experts per layer)
    source: str  # "safetensors model.safetensors", "GGUF m.gguf (Q4_1)", "... params (config estimate) x 2 B"

    def __post_init__(self) -> None:
        if self.total_bytes < 0 or not 0 <= self.active_bytes <= self.total_bytes:
            raise ValueError(
                f"weight bytes must satisfy 0 <= active <= total, got {self.active_bytes!r} and {self.total_bytes!r}"
            )


def _int(cfg: Mapping, *names: str, default: int | None = None) -> int | None:
    """First non-null of ``names`` in ``cfg`` as a non-negative int (``default`` if none); errors name the field."""
    for name in names:
        value = cfg.get(name)
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value != int(value)
            or value < 0
        ):
            raise ValueError(f"config field `{name}` must be a non-negative integer, got {value!r}")
        return int(value)
    return default


def _mamba_params(cfg: Mapping, hidden: int) -> int:
    """Jamba Mamba mixer (arXiv:2403.19887): in/out projections, conv1d, x/dt projections, A and D."""
    d_inner = _int(cfg, "mamba_expand", default=2) * hidden
    d_state = _int(cfg, "mamba_d_state", default=16)
    d_conv = _int(cfg, "mamba_d_conv", default=4)
    dt_rank = cfg.get("mamba_dt_rank", "auto")
    dt_rank = math.ceil(hidden / 16) if dt_rank == "auto" else int(dt_rank)
    n = hidden * 2 * d_inner + d_inner * d_conv + d_inner * (dt_rank + 2 * d_state)
    n += dt_rank * d_inner + d_inner + d_inner * d_state + d_inner + d_inner * hidden
    n += d_inner if cfg.get("mamba_conv_bias", True) else 0
    n += dt_rank + 2 * d_state  # dt, B, C layernorms
    return n


def _embedding_params(
    cfg: Mapping, vocab: int, hidden: int, gpt2: bool, falcon: bool
) -> tuple[int, int, bool]:
    """``(total, lookup, tied)``: embeddings, the LM head (tied unless the config says otherwise, as in
    transformers' ``PretrainedConfig``), GPT-2's learned positions and the final norm; ``lookup``: the tables
    read by index, not multiplied (token embeddings and GPT-2's learned positions)."""
    embed = vocab * hidden
    tied = bool(cfg.get("tie_word_embeddings", True))
    total = embed + (0 if tied else embed)
    lookup = embed
    if gpt2:
        positions = _int(cfg, "n_positions", "max_position_embeddings", default=1024) * hidden
        total += positions
        lookup += positions
    total += hidden * (2 if gpt2 or falcon else 1)  # final norm
    return total, lookup, tied


def _attention_params(
    cfg: Mapping, model_type: str, hidden: int, heads: int, kv_heads: int, head_dim: int, gpt2: bool
) -> int:
    """Parameters of one attention layer: MLA (DeepSeek-V2 section 2.1) low-rank projections, or GQA's Q/K/V/O with
    biases where the architecture has them (and gpt-oss's attention sinks)."""
    if cfg.get("kv_lora_rank") is not None:  # MLA, DeepSeek-V2 section 2.1
        r, rope = _int(cfg, "kv_lora_rank"), _int(cfg, "qk_rope_head_dim")
        nope, v_dim = _int(cfg, "qk_nope_head_dim", default=0), _int(cfg, "v_head_dim", default=head_dim)
        q_rank = _int(cfg, "q_lora_rank")
        q = (
            hidden * q_rank + q_rank + q_rank * heads * (nope + rope)
            if q_rank
            else hidden * heads * (nope + rope)
        )
        return q + hidden * (r + rope) + r + r * heads * (nope + v_dim) + heads * v_dim * hidden
    attn = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    if cfg.get("attention_bias") or model_type.startswith("qwen2") or gpt2:
        attn += (
            heads * head_dim + 2 * kv_heads * head_dim + (hidden if not model_type.startswith("qwen") else 0)
        )
    if model_type == "gpt_oss":
        attn += heads  # attention sinks
    return attn


def _dense_mlp_params(cfg: Mapping, hidden: int, layers: int, gpt2: bool, falcon: bool) -> int | None:
    """Parameters of one dense MLP layer (GPT-2, Falcon, or gated ``3 x hidden x intermediate``); None when
    ``intermediate_size`` is a per-layer list (the caller reads it per layer).

    Raises:
        ValueError: a per-layer ``intermediate_size`` of the wrong length or with a non-integer entry.
    """
    inter = cfg.get("intermediate_size")
    if gpt2:
        inner = _int(cfg, "n_inner", default=4 * hidden)
        return 2 * hidden * inner + inner + hidden
    if falcon:
        return 2 * hidden * _int(cfg, "ffn_hidden_size", default=4 * hidden)
    if isinstance(inter, list):
        if len(inter) != layers or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in inter):
            raise ValueError(
                f"config field `intermediate_size` must be an integer or one per layer ({layers}), got {inter!r}"
            )
        return None
    return 3 * hidden * _int(cfg, "intermediate_size")


@dataclass(frozen=True)
class _MoE:
    """Mixture-of-experts layout of a config: which layers route, and the parameters of one MoE MLP."""

    experts: int  # routed experts per MoE layer (0: a dense model)
    top_k: int  # experts each token is routed to
    expert: int  # parameters of one routed expert
    shared: int  # parameters of the shared expert(s)
    router: int  # parameters of the router
    first_dense: int  # layers before this are dense (DeepSeek first_k_dense_replace)
    moe_freq: int  # every moe_freq-th layer routes
    mlp_only: frozenset[int]  # layers forced dense (Qwen-MoE mlp_only_layers)
    expert_period: int | None  # Jamba: layer i routes when i % period == offset
    expert_offset: int

    @classmethod
    def from_config(cls, cfg: Mapping, model_type: str, hidden: int) -> _MoE:
        """Read the MoE fields of ``cfg`` (every name transformers' MoE configs use).

        Raises:
            ValueError: ``num_experts_per_tok`` exceeds the experts, or a field is not a non-negative integer.
        """
        inter = cfg.get("intermediate_size")
        experts = _int(cfg, "num_local_experts", "n_routed_experts", "num_experts", default=0)
        top_k = _int(cfg, "num_experts_per_tok", "experts_per_token", "moe_k", default=0)
        if top_k > experts > 0:
            raise ValueError(
                f"config field `num_experts_per_tok` ({top_k}) must not exceed the experts ({experts})"
            )
        moe_inter = _int(cfg, "moe_intermediate_size", default=inter if isinstance(inter, int) else None)
        expert = 3 * hidden * moe_inter if experts else 0
        if model_type == "gpt_oss":
            expert += 2 * moe_inter + hidden  # gate_up and down biases
        shared_inter = _int(cfg, "shared_expert_intermediate_size")
        if shared_inter is None and _int(cfg, "n_shared_experts", default=0):
            shared_inter = _int(cfg, "n_shared_experts") * moe_inter
        return cls(
            experts=experts,
            top_k=top_k,
            expert=expert,
            shared=3 * hidden * shared_inter if shared_inter else 0,
            router=hidden * experts,
            first_dense=_int(cfg, "first_k_dense_replace", default=0),
            moe_freq=_int(cfg, "moe_layer_freq", default=1),
            mlp_only=frozenset(cfg.get("mlp_only_layers") or []),
            expert_period=_int(cfg, "expert_layer_period"),
            expert_offset=_int(cfg, "expert_layer_offset", default=0),
        )

    def is_moe(self, i: int) -> bool:
        """Whether layer ``i`` routes its tokens to experts."""
        if not self.experts:
            return False
        if self.expert_period is not None:  # Jamba
            return i % self.expert_period == self.expert_offset
        return i >= self.first_dense and i % self.moe_freq == 0 and i not in self.mlp_only

    def mlp_params(self) -> tuple[int, int]:
        """``(total, active)`` parameters of one MoE MLP: every expert, and the ``top_k`` a token uses."""
        return (
            self.router + self.experts * self.expert + self.shared,
            self.router + self.top_k * self.expert + self.shared,
        )


def _unseen_notes(cfg: Mapping, unknown_mixers: int) -> list[str]:
    """What the estimate could not count, one note each."""
    notes = []
    if unknown_mixers:
        notes.append(f"parameters of {unknown_mixers} non-attention mixers not estimated")
    if _int(cfg, "num_nextn_predict_layers", default=0):
        notes.append("multi-token-prediction layers (`num_nextn_predict_layers`) not counted")
    if cfg.get("hidden_size_per_layer_input") or cfg.get("altup_num_inputs"):
        notes.append("Gemma-3n per-layer embeddings, AltUp and LAuReL weights not counted")
    return notes


def estimate_parameters(
    config: Mapping,
    layer_kinds: Sequence[str] | None = None,
    *,
    kv_heads: int | None = None,
    head_dim: int | None = None,
) -> ParamEstimate:
    """Estimate total and active parameters from a decoder config, and those a decode token multiplies by.

    Args:
        config: a config dict (a nested ``text_config`` is used when present).
        layer_kinds: per-layer kinds from :func:`kvlab.plan.spec.spec_from_config`; layers of kind ``none`` get
            no attention projections (Jamba: a Mamba mixer instead). ``None``: every layer has attention.
        kv_heads, head_dim: as :func:`kvlab.plan.spec.spec_from_config` read them (every name transformers and
            vLLM know); ``None`` reads ``num_key_value_heads``/``num_kv_heads`` and ``head_dim`` here.

    ``decode_flop`` leaves out the input embedding and learned position tables (a lookup is a gather, no
    multiply-adds) and counts the LM head (``vocab x hidden``) once, tied to the input embedding or not: a tied
    and an untied model of the same shape do the same FLOPs per token.
    """
    cfg, _ = decoder_config(config)
    model_type = str(cfg.get("model_type", ""))
    hidden = _int(cfg, *HIDDEN_NAMES)
    layers = _int(cfg, *LAYER_NAMES)
    heads = _int(cfg, *HEAD_NAMES)
    vocab = _int(cfg, "vocab_size")
    if None in (hidden, layers, heads, vocab):
        return ParamEstimate(None, None, ("parameter count unknown: config lacks vocab_size or sizes",))
    kinds = list(layer_kinds) if layer_kinds is not None else ["full"] * layers
    if kv_heads is None:
        if cfg.get("multi_query") and not cfg.get("new_decoder_architecture"):
            kv_heads = 1
        else:
            kv_heads = _int(cfg, "num_key_value_heads", "num_kv_heads", default=heads)
    if head_dim is None:
        head_dim = _int(cfg, "head_dim", default=hidden // heads)
    gpt2 = model_type == "gpt2" or ("n_embd" in cfg and "hidden_size" not in cfg)
    falcon = model_type == "falcon"

    total, lookup, tied = _embedding_params(cfg, vocab, hidden, gpt2, falcon)
    attn = _attention_params(cfg, model_type, hidden, heads, kv_heads, head_dim, gpt2)
    # LayerNorm w+b x2; Gemma: 4 RMSNorms
    norms = hidden * (4 if gpt2 or model_type.startswith("gemma") else 2)
    inter = cfg.get("intermediate_size")
    if inter is None and not (gpt2 or falcon):
        return ParamEstimate(None, None, ("parameter count unknown: config lacks intermediate_size",))
    dense_mlp = _dense_mlp_params(cfg, hidden, layers, gpt2, falcon)
    moe = _MoE.from_config(cfg, model_type, hidden)

    active = total
    unknown_mixers = 0
    for i, kind in enumerate(kinds):
        if kind == NO_KV:
            if model_type == "jamba":
                mixer = _mamba_params(cfg, hidden)
            else:
                mixer, unknown_mixers = 0, unknown_mixers + 1
        else:
            mixer = attn
        if moe.is_moe(i):
            mlp_total, mlp_active = moe.mlp_params()
        else:
            mlp_total = dense_mlp if dense_mlp is not None else 3 * hidden * int(inter[i])
            mlp_active = mlp_total
        total += mixer + norms + mlp_total
        active += mixer + norms + mlp_active
    notes = _unseen_notes(cfg, unknown_mixers)
    # the LM head is a vocab x hidden matmul either way, tied or not
    decode_flop = active - lookup + (vocab * hidden if tied else 0)
    return ParamEstimate(total, active, tuple(notes), decode_flop)


# bytes per element of a safetensors dtype string
_ST_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip


def safetensors_header_bytes(path: str | Path) -> int:
    """Bytes of tensor data in one ``.safetensors`` file, from its JSON header (safetensors' format,
    huggingface/safetensors README "Format": an 8-byte little-endian header length, the header ``{tensor: {"dtype",
    "shape", "data_offsets": [begin, end]}}``, then the data; offsets count from the data's first byte).

    Raises:
        ValueError: not a safetensors file: shorter than 8 bytes, a header length past the end of the file, a
            header that is not a JSON object, or a tensor (named, with the field) whose ``data_offsets`` are not
            ``0 <= begin <= end``, whose ``dtype`` is not one of :data:`_ST_DTYPE_BYTES`, whose ``shape`` is not
            whole numbers >= 0, whose offsets do not hold ``shape x dtype`` bytes or end past the file; or two
            tensors whose ``data_offsets`` share bytes (:func:`_check_no_overlap`), naming both.
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path} is not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        size = path.stat().st_size
        if n > size - 8:
            raise ValueError(
                f"{path} is not a safetensors file: header length {n:,} B exceeds the file ({size:,} B)"
            )
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} has no valid safetensors header: {e}") from e
    if not isinstance(header, dict):
        raise ValueError(
            f"{path} has no valid safetensors header: a JSON {type(header).__name__}, not an object"
        )
    data = size - 8 - n
    tensors = {name: info for name, info in header.items() if name != "__metadata__"}
    total = sum(_tensor_bytes(path, name, info, data) for name, info in tensors.items())
    _check_no_overlap(path, {name: info["data_offsets"] for name, info in tensors.items()})
    return total


def _check_no_overlap(path: Path, offsets: dict[str, list[int]]) -> None:
    """Raise ValueError naming ``path`` and two tensors whose ``data_offsets`` ``[begin, end)`` (checked by
    :func:`_tensor_bytes`) share a byte: each byte of the data belongs to one tensor (the safetensors library
    refuses such a header, ``SafeTensorError::InvalidOffset``), and two tensors counted over the same bytes summed
    to more weight bytes than the file holds. Empty tensors (``begin == end``) hold no byte."""
    spans = sorted((begin, end, name) for name, (begin, end) in offsets.items() if begin < end)
    widest = None  # the span reaching furthest among those before: any later one beginning before its end overlaps
    for begin, end, name in spans:
        if widest is not None and begin < widest[1]:
            raise ValueError(
                f"{path}: tensors {widest[2]!r} (`data_offsets` [{widest[0]}, {widest[1]}]) and {name!r} "
                f"(`data_offsets` [{begin}, {end}]) overlap: each byte of the data belongs to one tensor"
            )
        if widest is None or end > widest[1]:
            widest = (begin, end, name)


def _whole(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _tensor_bytes(path: Path, name: str, info: Any, data_bytes: int) -> int:
    """``end - begin`` of one header entry's ``data_offsets``, checked against its ``dtype`` and ``shape`` and the
    file's ``data_bytes`` after the header; ValueError naming the tensor and the field when malformed."""
    offsets = info.get("data_offsets") if isinstance(info, dict) else None
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_whole, offsets)) or offsets[0] > offsets[1]:
        raise ValueError(
            f"{path}: tensor {name!r} has no valid `data_offsets` [begin, end] (0 <= begin <= end), got "
            f"{offsets if offsets is not None else info!r}"
        )
    dtype, shape = info.get("dtype"), info.get("shape")
    if dtype not in _ST_DTYPE_BYTES:
        raise ValueError(
            f"{path}: tensor {name!r} has `dtype` {dtype!r}, not a safetensors dtype kvlab sizes "
            f"({', '.join(_ST_DTYPE_BYTES)})"
        )
    if not isinstance(shape, list) or not all(map(_whole, shape)):
        raise ValueError(f"{path}: tensor {name!r} has no valid `shape` (whole numbers >= 0), got {shape!r}")
    held, needed = offsets[1] - offsets[0], math.prod(shape) * _ST_DTYPE_BYTES[dtype]
    if held != needed:
        raise ValueError(
            f"{path}: tensor {name!r}: `data_offsets` {offsets} hold {held:,} B, but `shape` {shape} of {dtype} "
            f"is {needed:,} B"
        )
    if offsets[1] > data_bytes:
        raise ValueError(
            f"{path}: tensor {name!r}: `data_offsets` {offsets} end past the file's {data_bytes:,} B of tensor data"
        )
    return held


def read_safetensors_bytes(path: str | Path) -> tuple[int, str] | None:
    """Exact weight bytes of a checkpoint: ``(bytes, source)`` or ``None`` when there is nothing to read.

    ``path`` may be a ``model.safetensors.index.json`` (its ``metadata.total_size``), a ``.safetensors`` file or a
    directory holding either.

    Raises:
        ValueError: an index that is not JSON or whose ``metadata.total_size`` is not a whole number of bytes >= 1,
            an unreadable safetensors header (:func:`safetensors_header_bytes`), or files holding 0 B of tensors;
            each naming the file.
    """
    path = Path(path)
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        if index.is_file():
            return read_safetensors_bytes(index)
        files = sorted(path.glob("*.safetensors"))
        if not files:
            return None
        found = sum(safetensors_header_bytes(f) for f in files), ", ".join(f.name for f in files)
    elif path.name.endswith(".json"):
        try:
            with open(path, encoding="utf-8") as f:
                data: Any = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
        meta = data.get("metadata") if isinstance(data, dict) else None
        size = meta.get("total_size") if isinstance(meta, dict) else None
        if not _whole(size) or size < 1:
            raise ValueError(f"{path} has no `metadata.total_size` (a whole number of bytes >= 1), got {size!r}")
        return size, path.name
    elif path.suffix == ".safetensors":
        found = safetensors_header_bytes(path), path.name
    else:
        raise ValueError(f"{path} is neither a safetensors file, an index json nor a directory")
    if found[0] < 1:
        raise ValueError(f"{path}: its safetensors headers hold 0 B of tensors (no weights to size)")
    return found


class UnknownWeightsError(ValueError):
    """The config gives no parameter count and no weight bytes were given."""


def weight_bytes(
    spec,
    weight_dtype: str = "auto",
    *,
    index_path: str | Path | None = None,
    override_bytes: int | None = None,
) -> WeightBytes:
    """Weight bytes of ``spec`` (a :class:`~kvlab.plan.spec.ModelSpec`), in this order of preference:
    ``override_bytes``; the safetensors at ``index_path``; a ``weight_dtype`` other than ``auto`` times the
    estimated parameter count; the checkpoint next to the config (or a GGUF file's tensor data); the parameter
    count times the config dtype.

    ``active_bytes`` scales ``total_bytes`` by active/total parameters (MoE), else equals it.

    Raises:
        ValueError: an unknown ``weight_dtype``.
        UnknownWeightsError: (a ValueError) no way to size the weights: no parameter estimate, nothing given.
    """
    ratio = 1.0
    if spec.num_parameters and spec.num_active_parameters:
        ratio = spec.num_active_parameters / spec.num_parameters

    def made(total: int | float, source: str) -> WeightBytes:
        total = int(round(total))
        return WeightBytes(total, int(round(total * ratio)), source)

    if override_bytes is not None:
        if override_bytes < 0:
            raise ValueError(f"`weight_bytes` must be >= 0, got {override_bytes!r}")
        return WeightBytes(int(override_bytes), int(override_bytes), "given (--weight-bytes)")
    if index_path is not None:
        found = read_safetensors_bytes(index_path)
        if found is None:
            raise ValueError(f"no safetensors weights under {index_path}")
        return made(found[0], f"safetensors {found[1]}")
    if weight_dtype != "auto":
        if weight_dtype not in WEIGHT_DTYPE_BYTES:
            raise ValueError(
                f"`weight_dtype` must be one of {sorted(WEIGHT_DTYPE_BYTES)}, got {weight_dtype!r}"
            )
        if spec.num_parameters is None:
            raise UnknownWeightsError(
                "the config gives no parameter count; pass --weight-bytes or --weights-index"
            )
        per = WEIGHT_DTYPE_BYTES[weight_dtype]
        return made(spec.num_parameters * per, f"{spec.num_parameters:,} params (config estimate) x {per} B")
    if spec.checkpoint_bytes is not None:
        return made(spec.checkpoint_bytes, f"{spec.checkpoint_format} {spec.checkpoint_source}")
    if spec.num_parameters is None:
        raise UnknownWeightsError(
            "the config gives no parameter count; pass --weight-bytes or --weights-index"
        )
    per = spec.dtype_bytes
    return made(
        spec.num_parameters * per, f"{spec.num_parameters:,} params (config estimate) x {per} B {spec.dtype}"
    )
