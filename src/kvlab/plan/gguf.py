"""A llama.cpp GGUF file's header read torch-free: the key/value metadata and the tensor infos, no tensor data.

The header is read through a plain buffered file: no torch, no memory map of the weights. The layout is the GGUF
spec's (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), little-endian unless the version says
otherwise::

    magic "GGUF" (4 B) | version u32 (2 or 3) | tensor_count u64 | metadata_kv_count u64
    | metadata_kv_count x (key: string, value_type u32, value)
    | tensor_count x (name: string, n_dims u32, dims u64 x n_dims, ggml_type u32, offset u64)
    | padding to `general.alignment` (default 32) | tensor data

    string = length u64 + UTF-8 bytes; array = item type u32 + count u64 + items

The ``gguf`` package (llama.cpp's gguf-py) supplies the tables that change as llama.cpp grows: the metadata value
types, the ggml tensor types with their block sizes (``GGML_QUANT_SIZES``, for the bytes of tensor data) and the
``general.file_type`` names. Its ``GGUFReader`` is not used: it builds a numpy view of every string of the
tokenizer arrays and took about 3 s on a 98 MB SmolLM2-135M file (49,152 tokens, 48,900 merges), where this walk
takes a few hundredths of a second; the unit tests check the two agree on that file. The config a header gives
is :mod:`kvlab.plan.gguf_config`'s.
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
                    f"{path} is GGUF version {version}; kvlab reads GGUF versions "
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
