"""KV storage formats the planner sizes: the :class:`KVDtype` of a ``--kv-dtype`` name (plain dtypes, kvlab's FP8
caches and vLLM's spellings of them, KIVI codes with their G and R), and the planner bytes a cache family declares
(:class:`PlannerBytes`): the KIVI and FP8 families' (:data:`KIVI_BYTES`, :data:`FP8_BYTES`) are the objects their
cache registry entries reference (``CacheEntry.planner``), with the tables those entries read (:data:`KIVI_NBITS`,
:data:`FP8_FORMATS`, :data:`FP8_WORDS`, :data:`FP8_CACHES`). ``kvlab plan --kv-dtype`` asks the registry for a
name's planner bytes (:class:`PlannedName`); library callers may pass these families' names as text. Bytes are
:mod:`kvlab.plan.ledger`'s.

KIVI: arXiv:2402.02750 (keys per-channel, values per-token, groups of G, a full-precision residual window of R);
FP8: docs/plan.md, "Ledger and fit" (1 B per element plus fp32 scales).

Pure functions; no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from typing import Any

from kvlab.cache_names import KIVI_DEFAULTS, KIVI_DOT_PATHS, parse_cache_name
from kvlab.plan.config_fields import DTYPE_BYTES, check_int_at_least

KIVI_NBITS = (2, 4, 8)  # KIVI code widths (kvlab.quant.kivi); the cache registry's kivi entry reads them here
FP8_SCALE_BYTES = 4  # kvlab.caches.fp8 keeps its scales in fp32
# The FP8 cache formats and the variant words after one (no word = per-head scales), each word -> (scale
# granularity, rotation): the one table the planner and the cache registry's fp8 entry read. -hadamard: per-head
# scales of rotated K/V; the rotation is a constant of the head_dim and adds no bytes.
FP8_FORMATS = ("e4m3", "e5m2")
FP8_WORDS = {
    None: ("per-head", "none"),
    "tensor": ("per-tensor", "none"),
    "unscaled": ("none", "none"),
    "hadamard": ("per-head", "hadamard"),
}
# FP8Cache names (the registry's fp8 family; vLLM's fp8_e4m3 / fp8_e5m2 spell its default) -> scale granularity
FP8_CACHES = {
    f"fp8-{fmt}" + (f"-{word}" if word else ""): scale
    for fmt in FP8_FORMATS
    for word, (scale, _) in FP8_WORDS.items()
}
# vLLM's --kv-cache-dtype spellings of kvlab's FP8 caches (per-head scales), read as those caches' names
VLLM_ALIASES = {"fp8_e4m3": "fp8-e4m3", "fp8_e5m2": "fp8-e5m2"}
_PLAIN = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4, "fp8": 1}
_CANONICAL = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
}
# The --kv-dtype names that are no cache family's: the model's dtype (auto) and the plain dtypes (fp8: 1 B/element,
# no scales), then vLLM's spellings of the FP8 caches
PLAIN_NAMES: tuple[str, ...] = ("auto", "bf16", "fp16", "fp32", "fp8", *VLLM_ALIASES)
_KIVI_NAMES = (
    tuple(f"kivi-{n}" for n in KIVI_NBITS)
    + tuple(f"kivi{n}" for n in KIVI_NBITS)
    + tuple(f"kivi-k{k}v{v}" for k in KIVI_NBITS for v in KIVI_NBITS if k != v)
)


@dataclass(frozen=True)
class KVDtype:
    """How K/V are stored: a plain dtype, or KIVI codes + scale/zero + a full-precision residual window."""

    name: str  # "bf16", "fp16", "fp32", "fp8", "fp8-e4m3", "kivi4", "kivi2", "kivi8", "kivi-k8v4"
    element_bytes: int  # bytes per element (plain) or per residual-window element (KIVI)
    nbits: int | None = None  # KIVI code width (of keys when value_bits is set); None for a plain dtype
    group_size: int | None = None  # KIVI G: tokens per key group, channels per value group
    residual_length: int | None = None  # KIVI R: newest tokens kept in element_bytes
    metadata_bytes: int | None = None  # KIVI bytes of one scale (= one zero): 2 for 16-bit caches, 4 for fp32
    value_bits: int | None = None  # KIVI value code width if not the keys' (kivi-k8v4); None = nbits
    fp8_scale: str | None = None  # FP8Cache scales: per-head | per-tensor | none; None = not an FP8Cache
    keep_tokens: int | None = None  # an evicting cache's cap: tokens kept per layer and sequence; None = all

    def __post_init__(self) -> None:
        check_keep_tokens(self.keep_tokens)
        if self.element_bytes not in (1, 2, 4):
            raise ValueError(f"`element_bytes` must be 1, 2 or 4, got {self.element_bytes!r}")
        if self.fp8_scale not in (None, "per-head", "per-tensor", "none"):
            raise ValueError(f"`fp8_scale` must be per-head, per-tensor or none, got {self.fp8_scale!r}")
        if self.nbits is None:
            return
        for name in ("nbits", "value_bits"):
            bits = getattr(self, name)
            if bits not in KIVI_NBITS and (name == "nbits" or bits is not None):
                raise ValueError(f"`{name}` must be one of {list(KIVI_NBITS)}, got {bits!r}")
        g, r = self.group_size, self.residual_length
        check_int_at_least("group_size", g, 1)
        if not isinstance(r, int) or isinstance(r, bool) or r < 0 or r % g:
            raise ValueError(
                f"`residual_length` must be a non-negative multiple of `group_size` ({g}), got {r!r}"
            )
        if self.metadata_bytes not in (2, 4):
            raise ValueError(f"`metadata_bytes` must be 2 or 4, got {self.metadata_bytes!r}")

    @property
    def is_kivi(self) -> bool:
        return self.nbits is not None

    @property
    def bytes_per_element(self) -> Fraction:
        """Long-context bytes per cached element: ``p``, or for KIVI ``b/8 + 2m/G`` (codes + one scale/zero pair
        per ``G`` elements for K per-channel and V per-token alike; the residual window amortized away)."""
        if not self.is_kivi:
            return Fraction(self.element_bytes)
        return Fraction(self.nbits + self.value_code_bits, 16) + Fraction(
            2 * self.metadata_bytes, self.group_size
        )

    @property
    def cache_name(self) -> str:
        """:attr:`name` in the cache registry's spelling (:mod:`kvlab.cache_names`), what a message echoes:
        ``kivi-4`` for the planner's ``kivi4``; every other name is spelled so already (``kivi-k8v4``,
        ``fp8-e4m3``, ``bf16``)."""
        return f"kivi-{self.nbits}" if self.is_kivi and self.value_bits is None else self.name

    @property
    def value_code_bits(self) -> int | None:
        """KIVI value code width: ``value_bits``, else ``nbits``."""
        return self.nbits if self.value_bits is None else self.value_bits

    def describe(self) -> str:
        cap = "" if self.keep_tokens is None else f", at most {self.keep_tokens:,} tokens kept per layer"
        if self.fp8_scale is not None:
            return f"{self.name} ({self.element_bytes} B/element + {self.fp8_scale} fp32 scales{cap})"
        if not self.is_kivi:
            return f"{self.name} ({self.element_bytes} B/element{cap})"
        bits = f"{self.nbits}" if self.value_bits is None else f"{self.nbits}/{self.value_bits} (K/V)"
        return (
            f"{self.name}: {bits}-bit codes, G={self.group_size}, R={self.residual_length}, "
            f"{self.metadata_bytes} B scale/zero, residual {self.element_bytes} B/element{cap}"
        )

    def kept(self, tokens: int) -> int:
        """Tokens a layer holding ``tokens`` keeps under this cap: ``min(tokens, keep_tokens)``."""
        return tokens if self.keep_tokens is None else min(tokens, self.keep_tokens)

    def to_dict(self) -> dict[str, Any]:
        """The fields in order, then ``bytes_per_element`` as a float and ``cache_name`` (:attr:`cache_name`, what
        the tables print) (the ``kv_dtype`` of ``kvlab plan --json``)."""
        return asdict(self) | {"bytes_per_element": float(self.bytes_per_element), "cache_name": self.cache_name}


def check_keep_tokens(keep_tokens: Any) -> None:
    """Raise ``ValueError`` naming ``--keep-tokens`` unless ``keep_tokens`` is None or an integer >= 1."""
    if keep_tokens is None:
        return
    if isinstance(keep_tokens, bool) or not isinstance(keep_tokens, int) or keep_tokens < 1:
        raise ValueError(
            f"`keep_tokens` (--keep-tokens) must be a whole number of tokens >= 1, got {keep_tokens!r}"
        )


def kv_dtype(
    name: str | KVDtype | PlannedName = "auto",
    model_dtype: str = "bfloat16",
    *,
    group_size: int = KIVI_DEFAULTS.group_size,
    residual_length: int = KIVI_DEFAULTS.residual_length,
    keep_tokens: int | None = None,
) -> KVDtype:
    """Build a :class:`KVDtype` from a CLI name, capped at ``keep_tokens`` tokens per layer when given.

    ``keep_tokens``: the cache of an evicting method (docs/EVICTION.md) holds at most this many tokens per layer
    and sequence (SinkCache: sinks + window; TOVA: its budget); the bytes are those of ``min(context, N)`` tokens
    stored in ``name``'s format (KIVI: a KIVI cache of ``N`` tokens, residual window and all). ``None``: every
    token is kept. ``name``, ``model_dtype``, ``group_size``, ``residual_length``: see :func:`_kv_dtype_uncapped`.

    Raises:
        ValueError: an unknown name, invalid KIVI settings, or ``keep_tokens`` not an integer >= 1.
    """
    check_keep_tokens(keep_tokens)
    kvd = _kv_dtype_uncapped(name, model_dtype, group_size=group_size, residual_length=residual_length)
    return kvd if keep_tokens is None else replace(kvd, keep_tokens=keep_tokens)


def _kv_dtype_uncapped(
    name: str | KVDtype | PlannedName,
    model_dtype: str,
    *,
    group_size: int,
    residual_length: int,
) -> KVDtype:
    """Build a :class:`KVDtype` from a CLI name (no cap).

    Args:
        name: a :class:`PlannedName` (its family's planner bytes, as ``kvlab plan`` asks the cache registry), or
            text: ``auto`` (the model's dtype), ``bf16``, ``fp16``, ``fp32``, ``fp8`` (1 B/element, no scales), an
            FP8 cache name (``fp8-e4m3``, ``fp8-e5m2-tensor``, ``fp8-e4m3-unscaled``, ``fp8-e4m3-hadamard``;
            vLLM's ``fp8_e4m3`` / ``fp8_e5m2`` = ``fp8-e4m3`` / ``fp8-e5m2``: kvlab's FP8Cache with per-head
            scales), or a KIVI cache name of the cache registry's grammar (:mod:`kvlab.cache_names`): ``kivi-4``
            (= ``kivi4``), ``kivi-k8v4``, ``kivi-2:group_size=64`` (a ``:group_size`` / ``:residual_length`` in
            the name overrides the arguments).
        model_dtype: the model's dtype name (``ModelSpec.dtype``): ``auto``'s dtype and KIVI's residual dtype.
        group_size, residual_length: KIVI ``G`` and ``R``.

    Raises:
        ValueError: an unknown name or invalid KIVI settings.
    """
    if isinstance(name, KVDtype):
        return name
    if model_dtype not in DTYPE_BYTES:
        raise ValueError(f"`model_dtype` must be one of {sorted(DTYPE_BYTES)}, got {model_dtype!r}")
    if isinstance(name, PlannedName):
        return name.planner.dtype(name.name, model_dtype, group_size, residual_length)
    key = str(name).lower()
    if key == "auto":
        key = _CANONICAL.get(model_dtype, model_dtype)
    if key in _PLAIN:
        return KVDtype(_CANONICAL.get(key, key), _PLAIN[key])
    key = VLLM_ALIASES.get(key, key)
    for planner in (FP8_BYTES, KIVI_BYTES):  # the families whose names the planner reads as text
        if planner.reads(key):
            return planner.dtype(key, model_dtype, group_size, residual_length)
    raise ValueError(
        f"`kv_dtype` must be auto, bf16, fp16, fp32, fp8, fp8_e4m3, fp8_e5m2, {', '.join(FP8_CACHES)}, kivi-2, "
        f"kivi-4, kivi-8 (also spelt kivi2, kivi4, kivi8) or kivi-kKvV (kivi-k4v2), got {name!r}"
    )


@dataclass(frozen=True)
class PlannerBytes:
    """The planner bytes a cache family declares (``CacheEntry.planner`` in :mod:`kvlab.caches.registry`): what
    ``kvlab plan --kv-dtype <name>`` sizes for one of its names.

    ``dtype(name, model_dtype, group_size, residual_length)`` returns the name's :class:`KVDtype`, from which the
    ledger (:mod:`kvlab.plan.ledger`) computes the bytes per token per layer of K and V for a model shape:
    ``2 * kv_heads * head_dim * element_bytes`` for a plain format, plus fp32 scales for an FP8 cache
    (:func:`~kvlab.plan.ledger.fp8_scale_bytes`), or KIVI's exact codes, scale/zero pairs and residual window
    (:func:`~kvlab.plan.ledger.kivi_bytes_per_head`). ``name`` is the text as written (the cache-name grammar,
    :mod:`kvlab.cache_names`), ``model_dtype`` the model's dtype name (a key of ``DTYPE_BYTES``; a format kept in
    the model dtype reads it), ``group_size`` / ``residual_length`` the run's KIVI ``G`` and ``R``
    (``--group-size`` / ``--residual``; a family whose settings do not take them ignores them). It raises
    ``ValueError`` for a name or setting it cannot size.

    ``names``: the spellings ``--kv-dtype`` lists (``()``: the family's registry names, ``cache_names(family)``).
    ``reads(text)``: whether :func:`kv_dtype` reads ``text`` as this family's without the registry (the
    torch-free planner's own names; by default none: the family's names are sized through the registry, as a
    :class:`PlannedName`).
    """

    dtype: Callable[[str, str, int, int], KVDtype]
    names: tuple[str, ...] = ()
    reads: Callable[[str], bool] = lambda text: False


@dataclass(frozen=True)
class PlannedName:
    """A ``--kv-dtype`` name and the planner bytes of its cache family, as ``kvlab plan`` asks the registry for
    them: :func:`kv_dtype` sizes it once the model's dtype is known (``planner.dtype(name, model_dtype, G, R)``)."""

    name: str
    planner: PlannerBytes


def _fp8_dtype(name: str, model_dtype: str, group_size: int, residual_length: int) -> KVDtype:
    """An FP8 cache name's :class:`KVDtype`: 1 B per element and its scale granularity (:data:`FP8_CACHES`); the
    model dtype, ``G`` and ``R`` do not change its bytes.

    Raises:
        ValueError: a name that is not one of :data:`FP8_CACHES` (or vLLM's spelling of one).
    """
    key = VLLM_ALIASES.get(name.lower(), name.lower())
    if ":" in key and key.split(":")[0] in FP8_CACHES:
        raise ValueError(f"`kv_dtype` {name!r}: an FP8 cache takes no :settings")
    if key not in FP8_CACHES:
        raise ValueError(f"`kv_dtype` must be one of {', '.join(FP8_CACHES)}, got {name!r}")
    return KVDtype(key, 1, fp8_scale=FP8_CACHES[key])


def _kivi_dtype(name: str, model_dtype: str, group_size: int, residual_length: int) -> KVDtype:
    """A KIVI name's :class:`KVDtype` (:func:`_kivi_name`): codes of its bits, ``G`` and ``R`` (a ``:group_size``
    / ``:residual_length`` in the name overrides the run's), the residual window in the model dtype and scale/zero
    pairs of 2 B (4 B for an fp32 model), as ``kvlab.caches.kivi`` stores them.

    Raises:
        ValueError: a name without KIVI bits, an unknown setting, invalid ``G``/``R``, or a model dtype that is
            not 16- or 32-bit.
    """
    nbits, value_bits, settings = _kivi_name(name.lower())
    group_size = settings.get("group_size", group_size)
    residual_length = settings.get("residual_length", residual_length)
    p = DTYPE_BYTES[model_dtype]
    if p not in (2, 4):
        raise ValueError(
            f"KIVI keeps its residual window in the model dtype; {model_dtype!r} is not 16/32-bit"
        )
    label = f"kivi{nbits}" if value_bits is None else f"kivi-k{nbits}v{value_bits}"
    return KVDtype(label, p, nbits, group_size, residual_length, 4 if p == 4 else 2, value_bits)


# The planner bytes of kvlab's FP8 and KIVI caches: the registry's fp8 and kivi entries reference these objects
FP8_BYTES = PlannerBytes(_fp8_dtype, names=tuple(FP8_CACHES), reads=FP8_CACHES.__contains__)
KIVI_BYTES = PlannerBytes(_kivi_dtype, names=_KIVI_NAMES, reads=lambda text: text.startswith("kivi"))

# The names kv_dtype() reads, as the CLI lists them (kvlab plan / kvlab paging --kv-dtype choices): auto, the plain
# dtypes, vLLM's spellings of the FP8 caches, the FP8 cache names, KIVI bits in both spellings and every asymmetric
# pair. A KIVI name may also carry :group_size=G / :residual_length=R, which a list of choices cannot enumerate.
KV_DTYPE_NAMES: tuple[str, ...] = (*PLAIN_NAMES, *FP8_BYTES.names, *KIVI_BYTES.names)


def _kivi_name(key: str) -> tuple[int, int | None, dict[str, int]]:
    """``(key bits, value bits or None, settings)`` of a KIVI name in the cache-name grammar
    (:mod:`kvlab.cache_names`): ``kivi4``, ``kivi-4``, ``kivi-4-fused`` (the attention path does not change bytes),
    ``kivi-k8v4`` (``(8, 4, {})``), ``kivi-4:group_size=64``; ``kivi-4:dot=int8`` is ``kivi-4`` (the key-score path
    changes no stored byte), so ``settings`` holds ``group_size`` / ``residual_length`` only.

    Raises:
        ValueError: no bits, a ``dot`` not in :data:`~kvlab.cache_names.KIVI_DOT_PATHS`, or another setting (the
            evicting ``token_budget`` / ``compression_ratio`` keep a number of tokens the planner does not size).
    """
    try:
        parsed = parse_cache_name(key, ("kivi",))
    except ValueError as exc:
        raise ValueError(
            f"`kv_dtype` must be auto, bf16, fp16, fp32, fp8 or kivi-N[:group_size=G][:residual_length=R], "
            f"got {key!r} ({exc})"
        ) from None
    if parsed.bits is None:
        raise ValueError(f"`kv_dtype` {key!r} gives no KIVI bits; expected e.g. kivi-4 or kivi-k8v4")
    for bits in parsed.bits:
        if bits not in KIVI_NBITS:
            raise ValueError(f"`kv_dtype` {key!r}: KIVI bits must be in {list(KIVI_NBITS)}, got {bits}")
    settings = dict(parsed.settings)
    dot = settings.pop("dot", "exact")
    if dot not in KIVI_DOT_PATHS:
        raise ValueError(f"`kv_dtype` {key!r}: `dot` must be one of {list(KIVI_DOT_PATHS)}, got {dot!r}")
    bad = sorted(set(settings) - {"group_size", "residual_length"})
    if bad:
        raise ValueError(
            f"`kv_dtype` {key!r}: the KIVI settings the planner sizes are group_size and residual_length (dot "
            f"changes no bytes), got {bad}"
        )
    key_bits, value_bits = parsed.bits
    return key_bits, (value_bits if value_bits != key_bits else None), settings
