"""The one grammar of cache names, shared by the cache registry and the torch-free planner (no torch here).

A cache name is ``family[-bits][-variant][:setting=value]...``::

    dynamic                      transformers DynamicCache
    paged:block_size=32          kvlab PagedCache, 32 tokens per block
    kivi-4                       KIVI at 4 bits; group size, residual window and attention path from the run
    kivi-2-fused:group_size=64:residual_length=256
    kivi-k8v4                    KIVI with 8-bit keys and 4-bit values
    fp8-e4m3                     FP8 cache, float8 e4m3, per-head scales calibrated on the prefill
    fp8-e5m2-unscaled            FP8 cache, float8 e5m2, scale 1.0 (an engine without calibration)
    fp8-e4m3-hadamard            FP8 cache, float8 e4m3 of Hadamard-rotated K/V, per-head scales

* ``family``: lower-case letters and digits (``kivi``, ``hqq``, ``fp8``); which families exist is the registry's
  business (:mod:`kvlab.caches.registry`), or the planner's for ``--kv-dtype``.
* ``bits``: the code width of a quantized cache, after a hyphen; ``k<K>v<V>`` (``kivi-k8v4``) gives
  keys and values their own widths (``kivi-k4v4`` is ``kivi-4``).
* ``variant``: one or two words after the bits (KIVI's attention path: ``fused`` or ``dequant``; an FP8 cache's
  format and scale: ``e4m3``, ``e5m2-tensor``).
* ``:setting=value``: a non-negative integer (or decimal: ``snapkv:compression_ratio=0.25``), or a word
  (lower-case letters and digits, hyphens between them: ``kivi-4:dot=int8``), overriding one run-wide setting for
  this cache only; the family's settings class checks that the value fits the setting.

Names without the hyphen before the bits (``kivi4``, ``hqq4``, ``kivi4-fused``: the spellings ``kvlab bench`` and
``kvlab plan`` used first) are read as the same cache when ``kivi4`` is not itself a family.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from decimal import Decimal

_NAME = re.compile(
    r"^(?P<family>[a-z][a-z0-9]*)"
    r"(?:-(?:(?P<nbits>[0-9]+)|k(?P<key_bits>[0-9]+)v(?P<value_bits>[0-9]+)))?"
    r"(?:-(?P<variant>[a-z][a-z0-9]*(?:-[a-z][a-z0-9]*)?))?"
    r"(?P<settings>(?::[a-z_]+=(?:[0-9]+(?:\.[0-9]+)?|[a-z][a-z0-9]*(?:-[a-z0-9]+)*))*)$"
)
_LEGACY_FAMILY = re.compile(r"^(?P<family>[a-z]+?)(?P<nbits>[0-9]+)$")  # "kivi4" -> ("kivi", "4")


@dataclass(frozen=True)
class KIVIDefaults:
    """KIVI's group size ``G`` and residual window ``R`` where neither the run nor the name gives one: the values
    of KIVI (arXiv:2402.02750) sec. 4, read by the cache, its quantizer, the registry, the planner and the CLIs
    (torch-free here, so the planner reads them too). A name overrides them: ``kivi-4:group_size=64``."""

    group_size: int = 32  # G: tokens per key group (per-channel), channels per value group (per-token)
    residual_length: int = 128  # R: newest tokens kept in the model dtype, a multiple of G


KIVI_DEFAULTS = KIVIDefaults()

# KIVI's key-score paths (``kivi-4:dot=int8``): which dot products the fused CPU kernel runs; the bytes the cache
# stores are the same for each (the planner reads a ``:dot=`` name as the plain KIVI name)
KIVI_DOT_PATHS = ("exact", "int8", "int8-keys")


@dataclass(frozen=True)
class CacheName:
    """A parsed cache name (:func:`parse_cache_name`); ``text`` is kept as written for output and records."""

    text: str  # as the user wrote it: "kivi4-fused"
    family: str  # "kivi"
    nbits: int | None = None  # code width, or None when the name has none
    variant: str | None = None  # "fused", or None
    settings: tuple[
        tuple[str, int | float | str], ...
    ] = ()  # overrides in written order: (("group_size", 64),)
    key_bits: int | None = None  # "kivi-k8v4": key code width when K and V differ (nbits is None then)
    value_bits: int | None = None  # "kivi-k8v4": value code width when keys and values differ

    @property
    def bits(self) -> tuple[int, int] | None:
        """``(key_bits, value_bits)``: ``(4, 4)`` for ``kivi-4``, ``(8, 4)`` for ``kivi-k8v4``, ``None`` without bits."""
        if self.key_bits is not None:
            return self.key_bits, self.value_bits
        return None if self.nbits is None else (self.nbits, self.nbits)

    @property
    def canonical(self) -> str:
        """The name in the one grammar: ``"kivi4-fused"`` -> ``"kivi-4-fused"``."""
        out = self.family
        if self.nbits is not None:
            out += f"-{self.nbits}"
        elif self.key_bits is not None:
            out += f"-k{self.key_bits}v{self.value_bits}"
        if self.variant is not None:
            out += f"-{self.variant}"
        return out + "".join(f":{k}={_setting_text(v)}" for k, v in self.settings)


def _setting_text(value: int | float | str) -> str:
    """A setting's value as the grammar reads it: ``1e-07`` -> ``"0.0000001"`` (no exponent), ``0.5`` -> ``"0.5"``,
    a word as it is."""
    if isinstance(value, (int, str)):
        return str(value)
    text = format(Decimal(repr(value)), "f")
    return text if "." in text else text + ".0"


_VALUE_WORD = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")  # a setting's value that is a word: "int8"
_PAIR = re.compile(r"^[a-z_]+=(?:[0-9]+(?:\.[0-9]+)?|[a-z][a-z0-9]*(?:-[a-z0-9]+)*)$")


def _check_setting_pairs(text: str) -> None:
    """Raise ``ValueError`` naming the first ``:setting=value`` of ``text`` outside the grammar (a value that is
    neither plain digits nor a word, such as ``-1``, ``.5`` or ``5e-1``; an empty setting); a setting named with
    no value (``group_size=``, ``group_size``) is said so, by its name. Return if they all fit."""
    _, colon, tail = text.strip().lower().partition(":")
    if not colon:
        return
    for pair in tail.split(":"):
        name, eq, value = pair.partition("=")
        if re.fullmatch(r"[a-z_]+", name) and not value:
            given = "nothing follows its '='" if eq else "it has no '='"
            raise ValueError(
                f"cache name {text!r}: setting {name!r} has an empty value ({given}); write {name}=<value>"
            )
        if not _PAIR.match(pair):
            raise ValueError(
                f"cache name {text!r}: setting {pair!r} must be name=value with a non-negative value in plain "
                f"digits or a word, e.g. window_length=64, compression_ratio=0.5 or dot=int8"
            )


def parse_cache_name(text: str, families: Collection[str]) -> CacheName:
    """Parse ``text`` against the grammar of this module, ``families`` being the known first words.

    Args:
        text: a cache name, e.g. ``"kivi-4"``, ``"kivi4-fused"``, ``"paged:block_size=32"``.
        families: the family names the caller knows (the registry's, or the planner's).

    Returns:
        A :class:`CacheName`; ``nbits``, ``variant`` and ``settings`` are not checked against the family
        (the registry entry does that).

    Raises:
        ValueError: ``text`` not a string, not in the grammar, an unknown family, or a setting given twice.
    """
    if not isinstance(text, str):
        raise ValueError(f"a cache name must be a string, got {text!r}")
    m = _NAME.match(text.strip().lower())
    if m is None:
        _check_setting_pairs(text)  # name the bad `:setting=value`, when that is what fails
        raise ValueError(
            f"cache name {text!r} is not family[-bits][-variant][:setting=value]..., e.g. kivi-4 or "
            f"kivi-4-fused:group_size=64"
        )
    family, nbits = m["family"], m["nbits"]
    legacy = _LEGACY_FAMILY.match(family)
    if family not in families and nbits is None and legacy and legacy["family"] in families:
        family, nbits = legacy["family"], legacy["nbits"]
    if family not in families:
        raise ValueError(f"unknown cache family {family!r} in {text!r}; known: {', '.join(sorted(families))}")
    settings = tuple(
        (key, value if _VALUE_WORD.match(value) else float(value) if "." in value else int(value))
        for key, value in (pair.split("=") for pair in m["settings"].split(":")[1:])
    )
    keys = [k for k, _ in settings]
    if len(set(keys)) != len(keys):
        raise ValueError(f"a setting is given twice in cache name {text!r}")
    key_bits = value_bits = None
    if m["key_bits"] is not None:  # "k8v4"; equal widths are the one-width name ("k4v4" -> 4)
        key_bits, value_bits = int(m["key_bits"]), int(m["value_bits"])
        if key_bits == value_bits:
            nbits, key_bits, value_bits = key_bits, None, None
    return CacheName(
        text, family, None if nbits is None else int(nbits), m["variant"], settings, key_bits, value_bits
    )


def shown_name(text: str, families: Collection[str]) -> str:
    """``text`` in this module's one grammar, the spelling to show a user, ``families`` being the known first
    words: a name written without the hyphen before its bits (``kivi4-fused``, ``hqq4``, ``kivi4:dot=int8``)
    becomes ``kivi-4-fused``, ``hqq-4``, ``kivi-4:dot=int8``; any other text (a name already in the grammar, or not
    a cache name) is returned unchanged. Never raises."""
    try:
        return parse_cache_name(text, families).canonical
    except (ValueError, TypeError):
        return text
