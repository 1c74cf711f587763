"""Each cache family's settings: one small frozen dataclass per family, validated in ``__post_init__``.

A registry entry (:class:`kvlab.caches.entry.CacheEntry`) names its family's class in ``options``; a run's
settings (:class:`kvlab.caches.registry.CacheSettings`, what the CLI flags give) and a name's
``:setting=value`` overrides are read into it when the name is resolved, at the class's defaults for the rest. A
field whose metadata says ``in_name=False`` is set by the run only (KIVI's attention path: ``kivi-4-fused`` names
it through its variant instead). A count is declared with its least value (:func:`count`) and checked by
:class:`CheckedCounts`. Torch-free: the CLI builds its help from the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from kvlab.cache_names import KIVI_DEFAULTS, KIVI_DOT_PATHS
from kvlab.runtime.checks import check_int

RUN_ONLY = {"in_name": False}  # field metadata: the run sets it, a name may not (``:kivi_attention=...``)


def option_names(options: type | None, *, in_name: bool = False) -> tuple[str, ...]:
    """The fields of a settings class (``()`` for ``None``); ``in_name``: only those a name may override."""
    if options is None:
        return ()
    return tuple(f.name for f in fields(options) if not in_name or f.metadata.get("in_name", True))


def word_settings(options: type | None) -> tuple[str, ...]:
    """The fields of a settings class whose value is a word (``str``: KIVI's ``dot``), not a number."""
    return () if options is None else tuple(f.name for f in fields(options) if f.type in (str, "str"))


# q_group_size of transformers' QuantizedCache layers (HQQ / quanto) where neither the run nor the name gives one:
# HQQ's default, read by the settings, kvlab eval's config, the benchmarks and their flags
HQQ_GROUP_SIZE = 64


def count(default: int, minimum: int, **metadata: Any) -> Any:
    """A settings field holding an ``int >= minimum`` (0: a count, 1: a size), checked by :class:`CheckedCounts`;
    ``metadata`` adds to the field's (``in_name``)."""
    return field(default=default, metadata={"minimum": minimum, **metadata})


@dataclass(frozen=True)
class CheckedCounts:
    """Base of a settings class: ``__post_init__`` checks each :func:`count` field in declaration order.

    Raises:
        ValueError: a count field that is a bool, not an integer or below its minimum
            (:func:`kvlab.runtime.checks.check_int`'s message, naming the field).
    """

    def __post_init__(self) -> None:
        for f in fields(self):
            if "minimum" in f.metadata:
                check_int(f.name, getattr(self, f.name), f.metadata["minimum"])


def _check_ratio(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"`compression_ratio` must be in (0, 1), got {value!r}")


# KIVI's key-score paths in the fused CPU kernel (KIVI_DOT_PATHS, = kvlab.attention.cpu_kernel.DOT_PATHS): "exact"
# fp32 dot products (the reference), "int8" integer dot products for keys and values, "int8-keys" for keys only


def _check_dot(value: object) -> None:
    if value not in KIVI_DOT_PATHS:
        raise ValueError(f"`dot` must be one of {list(KIVI_DOT_PATHS)}, got {value!r}")


def _check_attention(value: object) -> None:
    if value not in ("fused", "dequantize"):
        raise ValueError(f"`kivi_attention` must be 'fused' or 'dequantize', got {value!r}")


@dataclass(frozen=True)
class PagedSettings(CheckedCounts):
    """:class:`kvlab.caches.paged.PagedCache`. Raises ``ValueError``: ``block_size`` below 1."""

    block_size: int = count(16, 1)  # tokens per physical block (vLLM's default)


@dataclass(frozen=True)
class EvictionSettings(CheckedCounts):
    """A prompt-compressing or scoring cache (SnapKV arXiv:2404.14469, TOVA arXiv:2401.06104): what it keeps.

    Raises:
        ValueError: ``compression_ratio`` outside (0, 1), ``token_budget`` below 0.
    """

    compression_ratio: float = 0.5  # fraction of the prompt's tokens dropped, in (0, 1)
    token_budget: int = count(0, 0)  # tokens kept per KV head instead of a ratio; 0 = use compression_ratio

    def __post_init__(self) -> None:
        _check_ratio(self.compression_ratio)
        super().__post_init__()  # token_budget, and a subclass's counts


@dataclass(frozen=True)
class KIVISettings(EvictionSettings):
    """:class:`kvlab.caches.kivi.KIVICache` (KIVI, arXiv:2402.02750 sec. 3): G, R, the attention path and the
    fused kernel's key-score path ``dot`` (:data:`KIVI_DOT_PATHS`; ``kivi-4:dot=int8``: the integer path of
    :mod:`kvlab.attention.cpu_kernel`, which runs fused attention); a name with ``:compression_ratio`` or
    ``:token_budget`` runs SnapKV on the prompt first (those fields unused otherwise).

    Raises:
        ValueError: ``group_size`` below 1, ``residual_length`` below 0, an unknown ``kivi_attention`` or ``dot``
            (and :class:`EvictionSettings`' errors). ``residual_length`` a multiple of ``group_size`` is the
            entry's check (a run-wide R may be meant for another family).
    """

    group_size: int = count(KIVI_DEFAULTS.group_size, 1)  # G: tokens per key group, channels per value group
    residual_length: int = count(KIVI_DEFAULTS.residual_length, 0)  # R: newest tokens kept in the model dtype
    kivi_attention: str = field(
        default="dequantize", metadata=RUN_ONLY
    )  # fused | dequantize (no variant given)
    dot: str = "exact"  # the fused CPU kernel's key-score path, one of KIVI_DOT_PATHS

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_attention(self.kivi_attention)
        _check_dot(self.dot)


@dataclass(frozen=True)
class HFQuantizedSettings(CheckedCounts):
    """transformers' ``QuantizedCache`` (HQQ / quanto backends).

    Raises:
        ValueError: ``hqq_group_size`` below 1, ``residual_length`` below 0.
    """

    hqq_group_size: int = count(HQQ_GROUP_SIZE, 1)  # q_group_size of transformers' quantized layers
    residual_length: int = count(KIVI_DEFAULTS.residual_length, 0)  # newest tokens kept in the model dtype


@dataclass(frozen=True)
class SinkSettings(CheckedCounts):
    """:class:`kvlab.caches.sink.SinkCache` (StreamingLLM, arXiv:2309.17453 sec. 3.2: four attention sinks).

    Raises:
        ValueError: ``sink_tokens`` below 0, ``window_length`` below 1.
    """

    sink_tokens: int = count(4, 0)  # first tokens kept for the whole stream
    window_length: int = count(256, 1)  # newest tokens kept after the sinks


@dataclass(frozen=True)
class MixedSettings(CheckedCounts):
    """:class:`kvlab.caches.mixed.MixedCache`: the G and R of its KIVI layers (the plan file names their bits) and
    the attention path, the run's as KIVI's (``--kivi-attention``; a plan name fills the name's variant, so no
    ``-fused`` word follows it).

    Raises:
        ValueError: ``group_size`` below 1, ``residual_length`` below 0, an unknown ``kivi_attention``.
    """

    group_size: int = count(KIVI_DEFAULTS.group_size, 1)  # G of the plan's KIVI layers
    residual_length: int = count(KIVI_DEFAULTS.residual_length, 0)  # R of the plan's KIVI layers
    kivi_attention: str = field(default="dequantize", metadata=RUN_ONLY)  # fused | dequantize

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_attention(self.kivi_attention)
