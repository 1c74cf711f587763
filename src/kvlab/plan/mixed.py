"""Per-layer KV precision plans: which format each layer's keys and values are stored in, and their exact bytes.

A plan file is JSON::

    {"kvlab_plan": 1,
     "layers": {"0": {"k": "kivi-8", "v": "kivi-4"}, "5": {"k": "float", "v": "float"},
                "*": {"k": "kivi-4", "v": "kivi-2"}},
     ...anything else (the allocator writes its budget and prediction here)}

``layers`` maps a layer index (``"0"`` .. ``"L-1"``) to ``{"k": format, "v": format}``; ``"*"`` gives every layer
the plan does not name (so "all FP8 except layers 0 and 1 in float", vLLM's ``--kv-cache-dtype-skip-layers``, is
three lines). Formats (:data:`FORMATS`):

* ``kivi-2`` / ``kivi-4`` / ``kivi-8``: KIVI codes (arXiv:2402.02750, section 3: keys per-channel, values per-token, the
  newest tokens in a full-precision residual window); a layer's keys and values may take different widths;
* ``fp8-e4m3``: float8 e4m3 with per-head scales calibrated on the prefill (kvlab's ``FP8Cache``);
* ``float``: unquantized, in the model's dtype (bf16 for a bf16 model).

One layer holds its keys and values in one family (both KIVI, both FP8 or both float): a KIVI layer's residual
window and flush rule cover K and V together, so ``{"k": "fp8-e4m3", "v": "kivi-4"}`` is refused by name.

Named plans: ``kvlab eval --candidates mixed-<name>`` runs the plan ``<name>``: the built-in :data:`BUILTIN_PLANS`,
or ``<name>.json`` in the folder ``$KVLAB_PLAN_DIR`` (read when the cache registry is imported; no folder is read
when it is unset, so tests see only the built-in plans). A name is one or two words of lower-case letters and
digits joined by a hyphen (``smollm2-b4``), the cache-name grammar's variant (:mod:`kvlab.cache_names`).

Pure Python; no torch.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.plan.config_fields import KV_KINDS
from kvlab.plan.kv_formats import kv_dtype
from kvlab.plan.ledger import _layer_bytes
from kvlab.plan.spec import ModelSpec

FORMATS = ("kivi-2", "kivi-4", "kivi-8", "fp8-e4m3", "float")
PLAN_DIR_ENV = "KVLAB_PLAN_DIR"
MIXED_PREFIX = "mixed-"  # the cache family (and ``kvlab plan --kv-dtype``) name of a plan: mixed-<plan name>
PLAN_VERSION = 1  # the plan file format's "kvlab_plan" field
_NAME = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z][a-z0-9]*)?$")  # the cache-name grammar's variant

# plans every install has (the registry's test matrix runs them on a 2-layer model): layer 0 with 8-bit keys and
# 2-bit values, every other layer FP8
BUILTIN_PLANS: dict[str, dict] = {
    "demo": {
        "kvlab_plan": PLAN_VERSION,
        "layers": {"0": {"k": "kivi-8", "v": "kivi-2"}, "*": {"k": "fp8-e4m3", "v": "fp8-e4m3"}},
    },
}


def family(fmt: str) -> str:
    """``"kivi"``, ``"fp8"`` or ``"float"`` of a format of :data:`FORMATS`.

    Raises:
        ValueError: ``fmt`` not one of :data:`FORMATS` (named, with the list).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown KV format {fmt!r}; a plan's formats are {', '.join(FORMATS)}")
    return fmt.split("-")[0]


def kivi_bits(fmt: str) -> int:
    """Code width of a KIVI format: ``kivi-4`` -> 4."""
    assert family(fmt) == "kivi", fmt
    return int(fmt.split("-")[1])


def check_pair(layer: int, k: str, v: str) -> None:
    """Raise ``ValueError`` naming the layer and formats unless ``k`` and ``v`` are formats of one family."""
    fk, fv = family(k), family(v)
    if fk != fv:
        raise ValueError(
            f"layer {layer}: keys {k!r} with values {v!r}: a layer holds K and V in one family (KIVI bits apart, "
            f"FP8 or float), not {fk} with {fv}"
        )


def _entries(plan: Mapping) -> dict[Any, tuple[str, str]]:
    """``{key: (k format, v format)}`` of a plan's ``layers`` object, each entry's shape and formats checked (not
    its key, nor K and V of one family: :func:`layer_formats` does, against a model)."""
    layers = plan.get("layers") if isinstance(plan, Mapping) else None
    if not isinstance(layers, Mapping) or not layers:
        raise ValueError(
            'a plan needs a non-empty "layers" object: {"0": {"k": "kivi-4", "v": "kivi-2"}, ...}'
        )
    out = {}
    for key, entry in layers.items():
        if not isinstance(entry, Mapping) or set(entry) != {"k", "v"}:
            raise ValueError(f'plan layer {key!r}: expected {{"k": format, "v": format}}, got {entry!r}')
        for fmt in (entry["k"], entry["v"]):
            if not isinstance(fmt, str) or fmt not in FORMATS:
                raise ValueError(
                    f"plan layer {key!r}: unknown KV format {fmt!r}; formats are {', '.join(FORMATS)}"
                )
        out[key] = (entry["k"], entry["v"])
    return out


def layer_formats(plan: Mapping, num_layers: int) -> list[tuple[str, str]]:
    """``[(k format, v format)]`` for layers ``0 .. num_layers - 1`` of a plan (the JSON object of a plan file).

    Raises:
        ValueError: ``plan`` without a ``layers`` object; a key that is neither a layer index nor ``"*"``; a layer
            the model lacks (``"30"`` for a 30-layer model: the message names it and the model's range); an entry
            that is not ``{"k": ..., "v": ...}``; an unknown format; K and V of different families; a layer neither
            named nor covered by ``"*"``.
    """
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
        raise ValueError(f"`num_layers` must be a positive integer, got {num_layers!r}")
    named: dict[int, tuple[str, str]] = {}
    default = None
    for key, (k, v) in _entries(plan).items():
        if key == "*":
            check_pair("*", k, v)
            default = (k, v)
            continue
        if not isinstance(key, str) or not key.isdigit() or (key != "0" and key.startswith("0")):
            raise ValueError(f'plan layer {key!r} is not a layer index ("0", "1", ...) or "*"')
        idx = int(key)
        if idx >= num_layers:
            raise ValueError(
                f"plan names layer {idx}, which the model lacks: it has {num_layers} layers (0-{num_layers - 1})"
            )
        check_pair(idx, k, v)
        named[idx] = (k, v)
    out = []
    for idx in range(num_layers):
        if idx not in named and default is None:
            raise ValueError(f'plan gives no formats for layer {idx} (name it, or give "*" for the rest)')
        out.append(named.get(idx, default))
    return out


def layer_attention(k: str, v: str, attention: str, group_size: int) -> str:
    """How one layer of a :class:`kvlab.caches.mixed.MixedCache` built with ``attention`` is read by the model's
    attention: ``"fused"`` (it hands its quantized history to kvlab attention: FP8 codes, or KIVI codes at one width
    for K and V whose value groups of ``group_size`` channels fill whole bytes), ``"dequantize"`` (it returns its
    history dequantized: every quantized layer with ``attention="dequantize"``, and in a fused cache a KIVI layer
    the fused reader cannot take: keys and values at different widths, or ``group_size * bits`` not a multiple of
    8) or ``"float"`` (its K/V as stored, in the model dtype).

    The two KIVI conditions are those of :func:`kvlab.attention.kivi_checks.check_fused_settings` (a test ties
    them); source: docs/MIXED.md.

    Raises:
        ValueError: an unknown format (:func:`family`) or an ``attention`` other than ``"fused"``/``"dequantize"``.
    """
    if attention not in ("fused", "dequantize"):
        raise ValueError(f"`attention` must be 'fused' or 'dequantize', got {attention!r}")
    if family(k) == "float":
        return "float"
    if attention == "dequantize":
        return "dequantize"
    if family(k) == "fp8":
        return "fused"
    bits = kivi_bits(k)
    return "fused" if kivi_bits(v) == bits and group_size * bits % 8 == 0 else "dequantize"


def ledger_name(k: str, v: str) -> str:
    """The ``kvlab plan --kv-dtype`` name of one layer's pair: ``("kivi-8", "kivi-4")`` -> ``"kivi-k8v4"``,
    ``("fp8-e4m3", "fp8-e4m3")`` -> ``"fp8-e4m3"``, ``("float", "float")`` -> ``"auto"`` (the model dtype).

    Raises:
        ValueError: an unknown format, or K and V of different families.
    """
    check_pair(0, k, v)
    if family(k) == "kivi":
        kb, vb = kivi_bits(k), kivi_bits(v)
        return f"kivi-{kb}" if kb == vb else f"kivi-k{kb}v{vb}"
    return "fp8-e4m3" if family(k) == "fp8" else "auto"


def _kv_layers(spec: ModelSpec) -> int:
    bad = sorted({kind for kind in spec.layer_kinds if kind not in KV_KINDS or kind != "full"})
    if bad:
        words = {
            "none": "layers without a KV cache (e.g. Mamba or convolution)",
            "sliding": "sliding-window layers",
        }
        kinds = ", ".join(f"{spec.layer_kinds.count(k)} {words.get(k, repr(k) + ' layers')}" for k in bad)
        raise ValueError(
            f"a mixed-precision plan needs full-attention layers only; {spec.name} has {kinds} "
            f"(of {len(spec.layer_kinds)})"
        )
    return len(spec.layer_kinds)


def plan_layer_bytes(
    spec: ModelSpec,
    formats: list[tuple[str, str]],
    tokens: int,
    batch: int = 1,
    *,
    group_size: int = KIVI_DEFAULTS.group_size,
    residual_length: int = KIVI_DEFAULTS.residual_length,
    tp: int = 1,
) -> list[int]:
    """Exact bytes each layer of a plan holds for ``batch`` sequences of ``tokens`` tokens on one of ``tp``
    tensor-parallel ranks (kvlab's caches: KIVI
    codes + scale/zero + residual window, :func:`kvlab.plan.ledger.kivi_bytes_per_head`; FP8 1 B/element + per-head
    fp32 scales; float ``tokens * 2 * kv_heads * head_dim * dtype bytes``): what ``MixedCache.nbytes()`` measures.

    Args:
        formats: ``[(k, v)]`` per layer, as :func:`layer_formats` returns.
        group_size, residual_length: KIVI ``G`` and ``R`` (the run's, as the cache takes them).
        tp: tensor-parallel ranks the KV heads are split over (:func:`kvlab.plan.ledger.kv_heads_per_rank`).

    Raises:
        ValueError: ``formats`` not one pair per layer of ``spec``; a model with layers other than full attention;
            invalid KIVI settings; a bad ``tokens``, ``batch`` or ``tp``.
    """
    n = _kv_layers(spec)
    if len(formats) != n:
        raise ValueError(f"the plan has {len(formats)} layers, the model {n}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
        raise ValueError(f"`batch` must be a non-negative integer, got {batch!r}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"`tokens` must be a non-negative integer, got {tokens!r}")
    out = []
    for k, v in formats:
        kvd = kv_dtype(ledger_name(k, v), spec.dtype, group_size=group_size, residual_length=residual_length)
        out.append(_layer_bytes(spec, kvd, tokens, tp) * batch)
    return out


def plan_kv_bytes(
    spec: ModelSpec, formats: list[tuple[str, str]], tokens: int, batch: int = 1, **kivi: int
) -> int:
    """Sum of :func:`plan_layer_bytes` (same arguments and errors)."""
    return sum(plan_layer_bytes(spec, formats, tokens, batch, **kivi))


def read_plan(path: str | os.PathLike) -> dict:
    """The JSON object of the plan file ``path`` (not yet checked against a model: :func:`layer_formats` does).

    Raises:
        ValueError: a file that cannot be read, is not JSON, is not a JSON object, or states a ``kvlab_plan``
            version other than :data:`PLAN_VERSION` (the message names the path).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"plan file {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:  # a binary file: JSON is UTF-8 text
        raise ValueError(f"plan file {str(path)!r} is not JSON: not UTF-8 text at byte {exc.start}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"plan file {str(path)!r} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"plan file {str(path)!r} must hold a JSON object, got {type(data).__name__}")
    version = data.get("kvlab_plan", PLAN_VERSION)  # absent: a hand-written plan, read as this version
    if version != PLAN_VERSION or isinstance(version, bool):
        raise ValueError(
            f"plan file {str(path)!r} has kvlab_plan {version!r}; this kvlab reads plan version {PLAN_VERSION}"
        )
    return data


def check_plan_name(name: str, *, new: bool = False) -> str:
    """Return ``name`` if it can follow ``mixed-`` in a cache name, else raise ``ValueError`` naming it; with
    ``new`` (a plan file about to be written) a name of :data:`BUILTIN_PLANS` is refused too, since ``mixed-<name>``
    resolves the built-in plan before any file."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"plan name {name!r} must be one or two words of lower-case letters and digits joined by '-' "
            f"(e.g. smollm2-b4): it follows 'mixed-' in a cache name"
        )
    if new and name in BUILTIN_PLANS:
        raise ValueError(
            f"plan name {name!r} is a built-in plan (mixed-{name} would run it, not this file); choose another name"
        )
    return name


def plan_files() -> dict[str, Path]:
    """``{name: path}`` of the plan files in ``$KVLAB_PLAN_DIR`` (``{}`` when unset); files whose stem is not a
    plan name (:func:`check_plan_name`) are not plans and are left out."""
    folder = os.environ.get(PLAN_DIR_ENV)
    if not folder:
        return {}
    root = Path(folder).expanduser()
    if not root.is_dir():
        return {}
    return {
        p.stem: p for p in sorted(root.glob("*.json")) if _NAME.match(p.stem) and p.stem not in BUILTIN_PLANS
    }


def plan_names() -> tuple[str, ...]:
    """Every named plan: the built-in ones, then those of ``$KVLAB_PLAN_DIR``."""
    return (*BUILTIN_PLANS, *plan_files())


def plan_dir_note() -> str:
    """Where plan files are read from, and why none were when ``$KVLAB_PLAN_DIR`` names no folder: the hint of every
    refusal of an unknown plan name (``kvlab plan``'s, and the cache registry's ``mixed-<plan>``)."""
    folder = os.environ.get(PLAN_DIR_ENV)
    if folder is None:
        return f"plan files are read from ${PLAN_DIR_ENV}, which is not set"
    if not folder:
        return f"plan files are read from ${PLAN_DIR_ENV}, which is set but empty"
    root = Path(folder).expanduser().resolve()
    if not root.exists():
        return f"plan files are read from ${PLAN_DIR_ENV}={folder}, but the folder {root} does not exist"
    if not root.is_dir():
        return f"plan files are read from ${PLAN_DIR_ENV}={folder}, but {root} is a file, not a folder"
    return f"plan files are read from ${PLAN_DIR_ENV}={folder} ({root})"


def find_plan(name: str) -> tuple[dict, str]:
    """``(plan object, source)`` of a named plan; ``source`` is ``"built-in"`` or the file's path.

    Raises:
        ValueError: an unknown name (the known ones are listed), or a plan file that cannot be read.
    """
    if name in BUILTIN_PLANS:
        return BUILTIN_PLANS[name], "built-in"
    files = plan_files()
    if name not in files:
        raise ValueError(f"unknown plan {name!r}; known: {', '.join(plan_names())} ({plan_dir_note()})")
    return read_plan(files[name]), str(files[name])


def plan_summary(formats: list[tuple[str, str]]) -> dict[str, Any]:
    """``{"k": {format: layers}, "v": {format: layers}}``: how many layers hold each format (for records)."""
    out: dict[str, dict[str, int]] = {"k": {}, "v": {}}
    for k, v in formats:
        out["k"][k] = out["k"].get(k, 0) + 1
        out["v"][v] = out["v"].get(v, 0) + 1
    return out


def describe(
    name: str, group_size: int, residual_length: int, attention: str = "dequantize"
) -> dict[str, Any]:
    """What a result records of the cache ``mixed-<name>``: the plan's name, where it was read, its ``layers``
    object as written, the KIVI settings of its KIVI layers, the cache's ``attention`` path and, per entry of
    ``layers`` (same keys), how that entry's layers are read (``layer_attention``: :func:`layer_attention`).

    Raises:
        ValueError: an unknown plan name, a plan file that cannot be read or whose ``layers`` entries are not
            ``{"k": format, "v": format}`` of known formats of one family, or an unknown ``attention``.
    """
    plan, source = find_plan(name)
    paths = {}
    for key, (k, v) in _entries(plan).items():
        check_pair(key, k, v)
        paths[key] = layer_attention(k, v, attention, group_size)
    return {
        "plan": name,
        "plan_source": source,
        "layers": plan.get("layers"),
        "group_size": group_size,
        "residual_length": residual_length,
        "attention": attention,
        "layer_attention": paths,
    }
