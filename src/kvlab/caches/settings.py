"""Each cache family's settings: one small frozen dataclass per family, validated in ``__post_init__``.

A registry entry (:class:`kvlab.caches.entry.CacheEntry`) names its family's class in ``options``; a run's
settings (:class:`kvlab.caches.registry.CacheSettings`, what the CLI flags give) and a name's
``:setting=value`` overrides are read into it when the name is resolved, at the class's defaults for the rest. A
field whose metadata says ``in_name=False`` is set by the run only (KIVI's attention path: ``kivi-4-fused`` names
it through its variant instead). Torch-free: the CLI builds its help from the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.runtime.checks import check_int

RUN_ONLY = {"in_name": False}  # field metadata: the run sets it, a name may not (``:kivi_attention=...``)


def option_names(options: type | None, *, in_name: bool = False) -> tuple[str, ...]:
    """The fields of a settings class (``()`` for ``None``); ``in_name``: only those a name may override."""
    if options is None:
        return ()
    return tuple(f.name for f in fields(options) if not in_name or f.metadata.get("in_name", True))


def _check_ratio(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"`compression_ratio` must be in (0, 1), got {value!r}")


@dataclass(frozen=True)
class PagedSettings:
    """:class:`kvlab.caches.paged.PagedCache`. Raises ``ValueError``: ``block_size`` below 1."""

    block_size: int = 16  # tokens per physical block (vLLM's default)

    def __post_init__(self) -> None:
        check_int("block_size", self.block_size, 1)


@dataclass(frozen=True)
class EvictionSettings:
    """A prompt-compressing or scoring cache (SnapKV arXiv:2404.14469, TOVA arXiv:2401.06104): what it keeps.

    Raises:
        ValueError: ``compression_ratio`` outside (0, 1), ``token_budget`` below 0.
    """

    compression_ratio: float = 0.5  # fraction of the prompt's tokens dropped, in (0, 1)
    token_budget: int = 0  # tokens kept per KV head instead of a ratio; 0 = use compression_ratio

    def __post_init__(self) -> None:
        _check_ratio(self.compression_ratio)
        check_int("token_budget", self.token_budget, 0)


@dataclass(frozen=True)
class KIVISettings(EvictionSettings):
    """:class:`kvlab.caches.kivi.KIVICache` (KIVI, arXiv:2402.02750 sec. 3): G, R and the attention path; a name
    with ``:compression_ratio`` or ``:token_budget`` runs SnapKV on the prompt first (those fields unused otherwise).

    Raises:
        ValueError: ``group_size`` below 1, ``residual_length`` below 0, an unknown ``kivi_attention`` (and
            :class:`EvictionSettings`' errors). ``residual_length`` a multiple of ``group_size`` is the entry's
            check (a run-wide R may be meant for another family).
    """

    group_size: int = KIVI_DEFAULTS.group_size  # G: tokens per key group, channels per value group
    residual_length: int = KIVI_DEFAULTS.residual_length  # R: newest tokens kept in the model dtype
    kivi_attention: str = field(
        default="dequantize", metadata=RUN_ONLY
    )  # fused | dequantize (no variant given)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("group_size", self.group_size, 1)
        check_int("residual_length", self.residual_length, 0)
        if self.kivi_attention not in ("fused", "dequantize"):
            raise ValueError(f"`kivi_attention` must be 'fused' or 'dequantize', got {self.kivi_attention!r}")


@dataclass(frozen=True)
class HFQuantizedSettings:
    """transformers' ``QuantizedCache`` (HQQ / quanto backends).

    Raises:
        ValueError: ``hqq_group_size`` below 1, ``residual_length`` below 0.
    """

    hqq_group_size: int = 64  # q_group_size of transformers' quantized layers (the HQQ default)
    residual_length: int = KIVI_DEFAULTS.residual_length  # newest tokens kept in the model dtype

    def __post_init__(self) -> None:
        check_int("hqq_group_size", self.hqq_group_size, 1)
        check_int("residual_length", self.residual_length, 0)


@dataclass(frozen=True)
class SinkSettings:
    """:class:`kvlab.caches.sink.SinkCache` (StreamingLLM, arXiv:2309.17453 sec. 3.2: four attention sinks).

    Raises:
        ValueError: ``sink_tokens`` below 0, ``window_length`` below 1.
    """

    sink_tokens: int = 4  # first tokens kept for the whole stream
    window_length: int = 256  # newest tokens kept after the sinks

    def __post_init__(self) -> None:
        check_int("sink_tokens", self.sink_tokens, 0)
        check_int("window_length", self.window_length, 1)


@dataclass(frozen=True)
class MixedSettings:
    """:class:`kvlab.caches.mixed.MixedCache`: the G and R of its KIVI layers (the plan file names their bits).

    Raises:
        ValueError: ``group_size`` below 1, ``residual_length`` below 0.
    """

    group_size: int = KIVI_DEFAULTS.group_size  # G of the plan's KIVI layers
    residual_length: int = KIVI_DEFAULTS.residual_length  # R of the plan's KIVI layers

    def __post_init__(self) -> None:
        check_int("group_size", self.group_size, 1)
        check_int("residual_length", self.residual_length, 0)
