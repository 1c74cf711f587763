"""A Hugging Face-style config from a llama.cpp GGUF file's header, so a ``.gguf`` plans like a ``config.json``.

Only the header is read (the key/value metadata and the tensor infos; no tensor data), through a plain buffered
file: no torch, no memory map of the weights. The layout is the GGUF spec's
(https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), little-endian unless the version says otherwise::

    magic "GGUF" (4 B) | version u32 (2 or 3) | tensor_count u64 | metadata_kv_count u64
    | metadata_kv_count x (key: string, value_type u32, value)
    | tensor_count x (name: string, n_dims u32, dims u64 x n_dims, ggml_type u32, offset u64)
    | padding to `general.alignment` (default 32) | tensor data

    string = length u64 + UTF-8 bytes; array = item type u32 + count u64 + items

The ``gguf`` package (llama.cpp's gguf-py) supplies the tables that change as llama.cpp grows: the metadata value
types, the ggml tensor types with their block sizes (``GGML_QUANT_SIZES``, for the bytes of tensor data) and the
``general.file_type`` names. Its ``GGUFReader`` is not used: it builds a numpy view of every string of the
tokenizer arrays and took about 3 s on a 98 MB SmolLM2-135M file (49,152 tokens, 48,900 merges), where this walk
takes a few hundredths of a second; the unit tests check the two agree on that file.

The metadata keys read (``{arch}`` is ``general.architecture``) and the config keys they become are those of
transformers' ``GGUF_CONFIG_MAPPING`` (transformers/integrations/ggml.py), with llama.cpp's rules where the two
differ: ``head_dim`` is ``{arch}.attention.key_length`` when stated, else ``embedding_length / head_count`` (as
llama.cpp's ``n_embd_head_k``), and the LM head is tied when the file has no ``output.weight`` tensor.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GGUF_MAGIC = b"GGUF"
# version 1 (u32 counts) predates every published GGUF model; gguf-py reads 2 and 3 too
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32  # GGUF spec: `general.alignment` when absent
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
_STRINGS_KEPT = 1024  # string arrays longer than this (tokenizer vocabularies, merges) keep only their length
_MAX_NESTING = (
    8  # arrays of arrays deeper than this are refused (the spec allows nesting; no model file uses it)
)


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array of strings not decoded (a tokenizer's tokens or merges): only its length is kept."""

    length: int

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor info of the header: name, ggml type number, dims (GGUF order, fastest first), data offset."""

    name: str
    ggml_type: int
    dims: tuple[int, ...]
    offset: int  # bytes from the start of the tensor data section


@dataclass(frozen=True)
class GGUFHeader:
    """What :func:`read_gguf_header` read: the metadata key/values and the tensor infos of one GGUF file."""

    path: str
    version: int
    metadata: dict[str, Any]  # scalars: int/float/bool/str; arrays: lists (long string ones: SkippedArray)
    tensors: tuple[GGUFTensorInfo, ...]
    data_offset: int  # where the tensor data starts (after the alignment padding)
    file_bytes: int  # size of the file
    tensor_bytes: int | None  # bytes of all tensor data (ggml block sizes); None when a ggml type is unknown
    tensor_types: dict[str, int]  # ggml type name -> tensors of that type


class _Corrupt(Exception):
    """The header cannot be read: cut short or malformed (the message says where)."""


def _gguf_tables():
    """The ``gguf`` package's ``constants`` module (value types, ggml types and block sizes, file-type names).

    Raises:
        ValueError: ``gguf`` is not installed (the message says ``pip install gguf``).
    """
    try:
        from gguf import constants
    except ImportError as e:
        raise ValueError(
            f"reading a GGUF file needs the `gguf` package (llama.cpp's gguf-py): pip install gguf ({e})"
        ) from None
    return constants


def is_gguf_file(path: str | os.PathLike) -> bool:
    """True when ``path`` is a readable file whose first 4 bytes are the GGUF magic ``b"GGUF"``."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


class _Reader:
    """Sequential reads of a GGUF header from a buffered file, bounded by the file size (a length past the end of
    the file is reported as truncation before anything is allocated for it)."""

    CHUNK = 1 << 20

    def __init__(self, f, size: int, endian: str = "<") -> None:
        self._f = f
        self.size = size
        self.endian = endian
        self._buf = b""
        self._base = 0  # file offset of _buf[0]
        self._pos = 0  # read position within _buf

    @property
    def offset(self) -> int:
        return self._base + self._pos

    def _fill(self, n: int) -> None:
        if self.offset + n > self.size:
            raise _Corrupt(
                f"the header needs {n:,} B at byte {self.offset:,} but the file ends at byte {self.size:,}"
            )
        keep = self._buf[self._pos :]
        self._base += self._pos
        self._pos = 0
        self._buf = keep + self._f.read(max(n - len(keep), self.CHUNK))
        if len(self._buf) < n:
            raise _Corrupt(f"the file ended at byte {self._base + len(self._buf):,} while it was read")

    def unpack(self, fmt: str) -> tuple:
        s = struct.Struct(self.endian + fmt)
        if self._pos + s.size > len(self._buf):
            self._fill(s.size)
        values = s.unpack_from(self._buf, self._pos)
        self._pos += s.size
        return values

    def u32(self) -> int:
        return self.unpack("I")[0]

    def u64(self) -> int:
        return self.unpack("Q")[0]

    def raw(self, n: int) -> bytes:
        if self._pos + n > len(self._buf):
            self._fill(n)
        data = self._buf[self._pos : self._pos + n]
        self._pos += n
        return data

    def string(self) -> str:
        at = self.offset
        try:
            return self.raw(self.u64()).decode("utf-8")
        except UnicodeDecodeError as e:
            raise _Corrupt(f"the string at byte {at:,} is not UTF-8 ({e.reason})") from None

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            self.raw(self.u64())


def _struct_codes(types) -> dict[int, str]:
    """GGUF value type number -> struct code of its scalar types (``types``: gguf-py's ``GGUFValueType``; the
    GGUF spec numbers them UINT8 0, INT8 1, UINT16 2, INT16 3, UINT32 4, INT32 5, FLOAT32 6, BOOL 7, STRING 8,
    ARRAY 9, UINT64 10, INT64 11, FLOAT64 12)."""
    pairs = (
        ("UINT8", "B"), ("INT8", "b"), ("UINT16", "H"), ("INT16", "h"), ("UINT32", "I"), ("INT32", "i"),
        ("FLOAT32", "f"), ("BOOL", "?"), ("UINT64", "Q"), ("INT64", "q"), ("FLOAT64", "d"),
    )  # fmt: skip
    return {int(getattr(types, name)): code for name, code in pairs}


def _value(r: _Reader, vtype: int, types, codes: Mapping[int, str], depth: int = 0) -> Any:
    """One metadata value of GGUF value type ``vtype`` (``types``: gguf-py's ``GGUFValueType``, ``codes``:
    :func:`_struct_codes`; ``depth``: arrays this one sits in)."""
    if depth > _MAX_NESTING:
        raise _Corrupt(f"arrays nested over {_MAX_NESTING} deep at byte {r.offset:,}")
    if vtype in codes:
        return r.unpack(codes[vtype])[0]
    if vtype == types.STRING:
        return r.string()
    if vtype == types.ARRAY:
        item, count = r.u32(), r.u64()
        if item in codes:
            if r.offset + count * struct.calcsize(codes[item]) > r.size:
                raise _Corrupt(
                    f"an array of {count:,} values at byte {r.offset:,} runs past the end of the file"
                )
            return list(r.unpack(f"{count}{codes[item]}"))
        if item in (types.STRING, types.ARRAY):
            if r.offset + count * 8 > r.size:  # a string's or an array's length alone takes 8 B
                raise _Corrupt(
                    f"an array of {count:,} items at byte {r.offset:,} runs past the end of the file"
                )
            if item == types.STRING and count > _STRINGS_KEPT:
                r.skip_strings(count)
                return SkippedArray(count)
            return [_value(r, item, types, codes, depth + 1) for _ in range(count)]
        raise _Corrupt(f"unknown array item type {item} at byte {r.offset:,}")
    raise _Corrupt(f"unknown metadata value type {vtype} at byte {r.offset:,}")


def read_gguf_header(path: str | os.PathLike) -> GGUFHeader:
    """Read the metadata and tensor infos of the GGUF file at ``path`` (the header only; tensor data is not read).

    Tensor data bytes are summed from each tensor's dims and its ggml type's block size; a tensor reaching past
    the end of the file means the file was cut short.

    Raises:
        ValueError: ``path`` is not a GGUF file (its first bytes named), a GGUF version other than 2 or 3, a
            header that is cut short or malformed ("looks truncated or corrupt", with where), or the ``gguf``
            package missing (``pip install gguf``). Each names the file, on one line.
        OSError: the file cannot be opened.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(4)
        if head != GGUF_MAGIC:
            shown = repr(head) if head else "nothing: the file is empty"
            raise ValueError(f"{path} is not a GGUF file (its first bytes are {shown}, not b'GGUF')")
        constants = _gguf_tables()
        types = constants.GGUFValueType
        codes = _struct_codes(types)
        f.seek(0)
        r = _Reader(f, size)
        try:
            r.raw(4)
            version = r.u32()
            if version & 0xFFFF == 0 and version:  # written big-endian (GGUF spec: the version tells)
                r.endian = ">"
                version = struct.unpack(">I", struct.pack("<I", version))[0]
            if version not in SUPPORTED_VERSIONS:
                raise ValueError(
                    f"{path} is GGUF version {version}; the planner reads versions "
                    f"{' and '.join(map(str, SUPPORTED_VERSIONS))}"
                )
            tensor_count, kv_count = r.u64(), r.u64()
            metadata: dict[str, Any] = {}
            for _ in range(kv_count):
                at, key = r.offset, r.string()
                if key in metadata:  # llama.cpp's gguf_init refuses these too
                    raise _Corrupt(f"metadata key {key!r} appears twice (again at byte {at:,})")
                metadata[key] = _value(r, r.u32(), types, codes)
            if tensor_count > size:
                raise _Corrupt(f"it claims {tensor_count:,} tensors, more than the file has bytes")
            tensors = []
            for _ in range(tensor_count):
                name = r.string()
                n_dims = r.u32()
                if n_dims > 8:
                    raise _Corrupt(f"tensor {name!r} has {n_dims} dims (ggml has at most 4)")
                dims = r.unpack(f"{n_dims}Q") if n_dims else ()
                ggml_type, offset = r.u32(), r.u64()
                tensors.append(GGUFTensorInfo(name, ggml_type, tuple(dims), offset))
        except _Corrupt as e:
            raise ValueError(f"{path} looks truncated or corrupt: {e}") from None
        header_end = r.offset
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or alignment < 1
        or alignment & (alignment - 1)
    ):
        raise ValueError(
            f"{path} looks corrupt: `general.alignment` must be a power of two, got {alignment!r}"
        )
    data_offset = -(-header_end // alignment) * alignment
    tensor_bytes, tensor_types = _tensor_bytes(path, tensors, data_offset, size, constants)
    return GGUFHeader(
        path=str(path),
        version=version,
        metadata=metadata,
        tensors=tuple(tensors),
        data_offset=data_offset,
        file_bytes=size,
        tensor_bytes=tensor_bytes,
        tensor_types=tensor_types,
    )


def _tensor_bytes(
    path: Path, tensors: Sequence[GGUFTensorInfo], data_offset: int, size: int, constants
) -> tuple[int | None, dict[str, int]]:
    """``(bytes of all tensor data, {ggml type name: tensors})``; bytes None when a type is unknown to gguf-py.

    Raises:
        ValueError: a tensor whose data would end past the end of the file (truncated), or whose element count
            is not a whole number of its type's blocks (corrupt).
    """
    total: int | None = 0
    counts: dict[str, int] = {}
    for t in tensors:
        try:
            qtype = constants.GGMLQuantizationType(t.ggml_type)
        except ValueError:
            counts[f"type {t.ggml_type}"] = counts.get(f"type {t.ggml_type}", 0) + 1
            total = None
            continue
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
        block, type_size = constants.GGML_QUANT_SIZES[qtype]
        elements = math.prod(t.dims)
        if elements % block:
            raise ValueError(
                f"{path} looks corrupt: tensor {t.name!r} has {elements:,} elements, not a whole number of "
                f"{qtype.name} blocks of {block}"
            )
        n = elements // block * type_size
        end = data_offset + t.offset + n
        if end > size:
            raise ValueError(
                f"{path} looks truncated or corrupt: tensor {t.name!r} ends at byte {end:,} but the file has "
                f"{size:,} B"
            )
        if total is not None:
            total += n
    return total, counts


def file_type_name(header: GGUFHeader) -> str:
    """The GGUF's weight format: ``general.file_type`` by llama.cpp's name without ``MOSTLY_``/``ALL_`` (``Q4_1``,
    ``Q4_K_M``, ``F16``, ``BF16``, ``F32``), or the most common 2-D tensor type when the key is absent."""
    constants = _gguf_tables()
    ft = header.metadata.get("general.file_type")
    if isinstance(ft, int) and not isinstance(ft, bool):
        try:
            name = constants.LlamaFileType(ft).name
        except ValueError:
            return f"file_type {ft}"
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    weights: dict[str, int] = {}
    for t in header.tensors:
        if len(t.dims) >= 2:
            try:
                name = constants.GGMLQuantizationType(t.ggml_type).name
            except ValueError:
                name = f"type {t.ggml_type}"
            weights[name] = weights.get(name, 0) + 1
    return max(weights, key=weights.get) if weights else "unknown"


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
