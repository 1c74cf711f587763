"""The cache registry: every cache kvlab can run, under one name grammar (:mod:`kvlab.cache_names`).

One :class:`~kvlab.caches.entry.CacheEntry` per cache family: which bit widths, variants and settings its names take, a factory
``(model_config, name, settings) -> Cache``, whether it is exact (the same logits as ``DynamicCache``) or lossy
with a stated bound, the optional package it needs, and its planner bytes (what ``kvlab plan --kv-dtype`` sizes,
:class:`~kvlab.plan.kv_formats.PlannerBytes`). ``kvlab eval``,
``kvlab bench`` and ``kvlab lab`` build their caches here; ``tests/unit/caches/test_registry.py`` runs every
registered name through ``generate()`` against ``DynamicCache``. Adding a cache is one module under
``kvlab/caches/`` and one entry in :data:`REGISTRY` (see CONTRIBUTING.md).

Importing this module imports no torch: factories import their cache classes when called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvlab.cache_names import CacheName, parse_cache_name
from kvlab.caches.entry import CacheEntry, Keeps, ResolvedCache
from kvlab.caches.settings import (
    EvictionSettings,
    HFQuantizedSettings,
    KIVISettings,
    MixedSettings,
    PagedSettings,
    SinkSettings,
    option_names,
    word_settings,
)
from kvlab.plan import mixed as _mixed
from kvlab.plan.kv_formats import FP8_BYTES, FP8_FORMATS, FP8_WORDS, KIVI_BYTES, KIVI_NBITS


class CacheSettings:
    """The run's cache settings, as its flags give them (``--group-size 64`` -> ``group_size=64``).

    Each family reads the ones its settings class (:attr:`CacheEntry.options`, :mod:`kvlab.caches.settings`) has,
    at that class's defaults for the rest; a name's ``:setting=value`` overrides the run's for that cache only.
    ``CacheSettings()`` is every family at its defaults.

    Raises:
        TypeError: a setting no registered family reads (the message lists those that exist).
        ValueError: a value a family reading it refuses (``group_size=0``), with that family's message.
    """

    __slots__ = ("_values",)

    def __init__(self, **values: Any) -> None:
        for key, value in values.items():
            readers = [e.options for e in REGISTRY.values() if key in option_names(e.options)]
            if not readers:
                known = sorted({k for e in REGISTRY.values() for k in option_names(e.options)})
                raise TypeError(f"unknown cache setting `{key}`; the registered families read {known}")
            for options in dict.fromkeys(readers):  # each settings class validates the value alone
                options(**{key: value})
        self._values = dict(values)

    def values(self) -> dict[str, Any]:
        """The settings the run gives: name -> value (families' defaults not included)."""
        return dict(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CacheSettings) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._values.items())))

    def __repr__(self) -> str:
        return f"CacheSettings({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    def __getstate__(self) -> dict[str, Any]:
        return self._values

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._values = dict(state)


def takers(setting: str) -> list[str]:
    """The families that read ``setting``, as a user writes them: ``takers("residual_length")`` ->
    ``["kivi-N", "hqq-N", "quanto-N"]`` (for messages that refuse a flag no candidate takes)."""
    return [e.display for e in REGISTRY.values() if setting in e.reads]


# --- factories: one per family, importing the cache class on call ---------------------------------------------


def _dynamic(model_config: Any, name: CacheName, s: Any) -> Any:
    if name.variant == "ckernel":  # the same cache, decode attention in kvlab's float C kernel
        from kvlab.caches.float_kernel import FloatKernelCache

        return FloatKernelCache()
    from transformers import DynamicCache

    return DynamicCache()


def _paged(model_config: Any, name: CacheName, s: Any) -> Any:
    from kvlab.caches.paged import PagedCache

    return PagedCache(block_size=s.block_size, config=model_config)


# the name's variant -> KIVICache's attention path (None: the run's KIVISettings.kivi_attention)
_KIVI_VARIANTS = {None: None, "fused": "fused", "dequant": "dequantize"}


def _kivi_attention(name: CacheName, s: Any) -> str:
    """A KIVI name's attention path: its variant's, else fused for an integer key-score path (``kivi-4:dot=int8``:
    only the fused kernel reads the codes), else the run's."""
    return _KIVI_VARIANTS[name.variant] or ("fused" if s.dot != "exact" else s.kivi_attention)


def _kivi_run_path(name: CacheName, run_attention: str) -> str:
    """The ``kivi_attention`` a KIVI name takes from a run whose path is ``run_attention``: ``"dequantize"`` for a
    name with its own key and value bits (``kivi-k8v4``: fused attention reads both at one width), else the run's
    (a ``-fused``/``-dequant`` variant then wins over it, :func:`_kivi_attention`)."""
    return "dequantize" if name.key_bits is not None and name.variant is None else run_attention


def _snapkv_budget(name: CacheName, s: Any) -> dict:
    """The SnapKV keyword a KIVI name asks for (``kivi-4:compression_ratio=0.5``), or ``{}`` for plain KIVI."""
    given = dict(name.settings)
    if "token_budget" in given:
        return {"token_budget": s.token_budget}
    return {"compression_ratio": s.compression_ratio} if "compression_ratio" in given else {}


def _snapkv_check(name: CacheName, s: Any) -> None:
    """A SnapKV ``token_budget`` (``snapkv:...``, or SnapKV under KIVI: ``kivi-4:token_budget=N``) must cover the
    observation window SnapKV always keeps (:meth:`SnapKVConfig.check_budget_covers_window`)."""
    if name.family == "kivi" and "token_budget" not in dict(name.settings):
        return
    if s.token_budget:
        from kvlab.caches.snapkv import SnapKVConfig

        SnapKVConfig(token_budget=s.token_budget).check_budget_covers_window()


def _kivi_check(name: CacheName, s: Any) -> None:
    """KIVI's residual window holds whole groups: ``residual_length`` a multiple of ``group_size`` (as
    :class:`kvlab.caches.kivi.KIVIConfig` requires when the cache is made); an integer ``dot`` only where the name
    can run fused attention (one width for keys and values, no ``-dequant``); then :func:`_snapkv_check`."""
    if s.residual_length % s.group_size:
        raise ValueError(
            f"`residual_length` ({s.residual_length}) must be a multiple of `group_size` ({s.group_size})"
        )
    if s.dot != "exact" and (name.key_bits is not None or name.variant == "dequant"):
        raise ValueError(
            f"`dot={s.dot}` is a path of fused attention, which reads keys and values at one width and is not "
            f"the `-dequant` variant"
        )
    _snapkv_check(name, s)


def _kivi(model_config: Any, name: CacheName, s: Any) -> Any:
    from kvlab.caches.kivi import KIVICache

    key_bits, value_bits = name.bits
    budget = _snapkv_budget(name, s)
    if budget:  # KIVI over a SnapKV-compressed prompt: each kept token quantized once
        from kvlab.caches.kivi_snapkv import KIVISnapKVCache as KIVICache  # noqa: N814
    return KIVICache(
        **budget,
        key_bits=key_bits,
        value_bits=value_bits,
        group_size=s.group_size,
        residual_length=s.residual_length,
        attention=_kivi_attention(name, s),
        dot=s.dot,
        config=model_config,  # refuses a model that is not all full attention (None: layers made on first use)
    )


def _kivi_layer(name: CacheName, s: Any) -> Any:
    """The quantizer state of one KIVI layer (:class:`kvlab.quant.kivi.KIVIState`, one bit width for K and V), for
    ``kvlab bench flush``: what a KIVICache layer appends to and flushes."""
    from kvlab.quant.kivi import KIVIConfig, KIVIState

    if name.nbits is None:
        raise ValueError(f"{name.text}: one KIVI layer is timed at one bit width for K and V, e.g. kivi-4")
    return KIVIState(KIVIConfig(name.nbits, s.group_size, s.residual_length))


def _kivi_describe(name: CacheName, s: Any) -> dict:
    key_bits, value_bits = name.bits
    return {
        "nbits": name.nbits,
        "key_bits": key_bits,
        "value_bits": value_bits,
        "group_size": s.group_size,
        "residual_length": s.residual_length,
        "key_axis": "per-channel",
        "value_axis": "per-token",
        "attention": _kivi_attention(name, s),
        **({"dot": s.dot} if s.dot != "exact" else {}),  # the default path is not written (records unchanged)
        **_snapkv_budget(name, s),
    }


def _hf_axis(family: str) -> int:
    """transformers QuantizedCache axis: HQQ needs axis 1 for K and V (HQQ's per-token grouping), quanto 0."""
    return 1 if family == "hqq" else 0


def _hf_quantized(model_config: Any, name: CacheName, s: Any) -> Any:
    from transformers import QuantizedCache

    from kvlab.caches.rope import model_text_config

    if model_config is None:  # transformers reads it without a check (AttributeError on None)
        raise ValueError(
            f"{name.canonical} needs the model config (model.config): transformers' QuantizedCache sizes its "
            f"layers from it"
        )
    model_text_config(model_config)  # a config that is not one is named
    return QuantizedCache(backend=name.family, config=model_config, **_hf_layer_settings(name, s))


def _hf_layer_settings(name: CacheName, s: Any) -> dict:
    """The keywords of one transformers quantized layer (``QuantizedCache`` passes them to each of its layers)."""
    axis = _hf_axis(name.family)
    return {
        "nbits": name.nbits,
        "axis_key": axis,
        "axis_value": axis,
        "q_group_size": s.hqq_group_size,
        "residual_length": s.residual_length,
    }


def _hf_layer(name: CacheName, s: Any) -> Any:
    """One transformers ``HQQQuantizedLayer`` / ``QuantoQuantizedLayer`` with the settings of :func:`_hf_quantized`
    (for ``kvlab bench flush``, which times one layer without a model)."""
    from transformers.cache_utils import HQQQuantizedLayer, QuantoQuantizedLayer

    cls = HQQQuantizedLayer if name.family == "hqq" else QuantoQuantizedLayer
    return cls(**_hf_layer_settings(name, s))


def _hf_describe(name: CacheName, s: Any) -> dict:
    axis = _hf_axis(name.family)
    return {
        "nbits": name.nbits,
        "group_size": s.hqq_group_size,
        "residual_length": s.residual_length,
        "axis_key": axis,
        "axis_value": axis,
    }


# fp8 variants: format[-word]; the formats and words (-> scale, rotation) are the planner's table (one source)


def _fp8_settings(name: CacheName) -> tuple[str, str, str]:
    """``(format, scale, rotation)`` of an fp8 name: ``fp8-e4m3`` -> ``("e4m3", "per-head", "none")``,
    ``fp8-e5m2-unscaled`` -> ``("e5m2", "none", "none")``, ``fp8-e4m3-hadamard`` -> ``("e4m3", "per-head",
    "hadamard")``."""
    fmt, _, word = name.variant.partition("-")
    return (fmt, *FP8_WORDS[word or None])


def _fp8(model_config: Any, name: CacheName, s: Any) -> Any:
    from kvlab.caches.fp8 import FP8Cache

    fmt, scale, rotation = _fp8_settings(name)
    # kvlab attention reads the codes in place (a rotated cache in its rotated basis: the query rotated instead)
    return FP8Cache(format=fmt, scale=scale, rotation=rotation, attention="fused")


def _fp8_describe(name: CacheName, s: Any) -> dict:
    fmt, scale, rotation = _fp8_settings(name)
    return {
        "format": fmt,
        "scale": scale,
        "scale_source": "prefill" if scale != "none" else "1.0",
        "rotation": rotation,
        "attention": "fused",
    }


def _sink(model_config: Any, name: CacheName, s: Any) -> Any:
    from kvlab.caches.sink import SinkCache

    return SinkCache(num_sink_tokens=s.sink_tokens, window_length=s.window_length, config=model_config)


def _budget(s: Any) -> dict:
    """An evicting cache's keyword: ``token_budget`` when the settings give one, else ``compression_ratio``."""
    return {"token_budget": s.token_budget} if s.token_budget else {"compression_ratio": s.compression_ratio}


def _snapkv(model_config: Any, name: CacheName, s: Any) -> Any:
    from kvlab.caches.snapkv import SnapKVCache

    return SnapKVCache(**_budget(s), config=model_config)


def _tova(model_config: Any, name: CacheName, s: Any) -> Any:
    from kvlab.caches.tova import TOVACache

    return TOVACache(**_budget(s), config=model_config)


def _mixed_cache(model_config: Any, name: CacheName, s: Any) -> Any:
    from kvlab.caches.mixed import MixedCache

    plan, _ = _mixed.find_plan(name.variant)
    return MixedCache(
        plan,
        model_config,
        group_size=s.group_size,
        residual_length=s.residual_length,
        attention=s.kivi_attention,
    )


def _mixed_describe(name: CacheName, s: Any) -> dict:
    return _mixed.describe(name.variant, s.group_size, s.residual_length, s.kivi_attention)


def _mixed_run_path(name: CacheName, run_attention: str) -> str:
    """The path ``mixed-<plan>`` takes from a run whose path is ``run_attention``: the run's (fused: each layer
    that can runs fused, a KIVI layer with its own key and value bits dequantized, :func:`_mixed_describe`'s
    ``layer_attention``)."""
    return run_attention


def _budget_keeps(while_decoding: bool) -> Callable[[CacheName, Any], Keeps | None]:
    """``keeps`` of a cache whose name gives a ``token_budget``: SnapKV (alone or under KIVI) compresses the prompt
    only, TOVA evicts while decoding too; a ratio keeps a share, not a number of tokens (``None``)."""

    def keeps(name: CacheName, s: Any) -> Keeps | None:
        if "token_budget" not in dict(name.settings):
            return None
        return Keeps(s.token_budget, while_decoding)

    return keeps


def _scorer_entry(
    family: str, summary: str, factory: Any, *, while_decoding: bool, check: Any = None
) -> CacheEntry:
    """The entry of a cache that evicts by scoring tokens with kvlab attention's queries (SnapKV, TOVA): a
    ``compression_ratio`` or a ``token_budget`` of kept tokens (:class:`EvictionSettings`), over the prompt only or
    (``while_decoding``) over every decoded token too."""
    return CacheEntry(
        family,
        summary,
        factory,
        options=EvictionSettings,
        exact=False,
        evicts=True,
        describe=lambda name, s: _budget(s),
        kvlab_attention=lambda name, s: True,  # the queries that score come from kvlab attention
        check=check,
        keeps=_budget_keeps(while_decoding),
    )


def _sink_keeps(name: CacheName, s: Any) -> Keeps:
    """Sinks + window, over the prompt and every decoded token."""
    return Keeps(s.sink_tokens + s.window_length, while_decoding=True)


# --- the registry: one entry per family ---------------------------------------------------------------------

REGISTRY: dict[str, CacheEntry] = {
    e.family: e
    for e in (
        CacheEntry(
            "dynamic",
            "transformers DynamicCache: K/V in the model dtype (the float baseline); dynamic-ckernel: its decode "
            "attention in kvlab's float C kernel (kvlab.caches.float_kernel), the quantized kernels' fair baseline",
            _dynamic,
            variants=("ckernel",),
            describe=lambda name, s: {"attention": "float C kernel"} if name.variant == "ckernel" else {},
            kvlab_attention=lambda name, s: name.variant == "ckernel",
            attention_variants=("ckernel",),  # it chooses the attention, not the cache
            # fp32 sums in another order, rounded once (SDPA in bf16 rounds otherwise): a greedy token may flip
            rounding_variants={"ckernel": 1e-4},
        ),
        CacheEntry(
            "paged",
            "kvlab PagedCache: K/V in physical blocks addressed by a block table (vLLM-style)",
            _paged,
            options=PagedSettings,
            describe=lambda name, s: {"block_size": s.block_size},
        ),
        CacheEntry(
            "kivi",
            "kvlab KIVICache: keys per-channel, values per-token, full-precision residual window (arXiv:2402.02750)",
            _kivi,
            nbits=KIVI_NBITS,
            variants=("fused", "dequant"),
            # keys are the sensitive half (KIVI section 3: outlier channels; llama.cpp -ctk q8_0 -ctv q4_0)
            bit_pairs=((8, 4), (4, 2)),
            # compression_ratio / token_budget: SnapKV on the prompt before quantizing (kivi-4:compression_ratio=0.5)
            options=KIVISettings,
            exact=False,
            logit_bound={8: 0.01, 4: 0.1, 2: 0.4},
            planner=KIVI_BYTES,
            layer=_kivi_layer,
            describe=_kivi_describe,
            kvlab_attention=lambda name, s: (
                _kivi_attention(name, s) == "fused" or bool(_snapkv_budget(name, s))
            ),
            check=_kivi_check,
            keeps=_budget_keeps(while_decoding=False),
            attention_path=_kivi_run_path,
            attention_variants=("fused", "dequant"),
        ),
        CacheEntry(
            "fp8",
            "kvlab FP8Cache: K/V in float8 e4m3 or e5m2, scales per head (default), per tensor or 1.0 (unscaled); "
            "-hadamard: K/V rotated before rounding (QuaRot, arXiv:2404.00456)",
            _fp8,
            variants=tuple(f"{fmt}-{word}" if word else fmt for fmt in FP8_FORMATS for word in FP8_WORDS),
            variant_required=True,
            exact=False,
            # measured in the registry test: 0.0085-0.0097 (e4m3, any scale), 0.016-0.019 (e5m2: a mantissa bit less)
            logit_bound={None: 0.05},
            planner=FP8_BYTES,
            describe=_fp8_describe,
            kvlab_attention=lambda name, s: True,  # it reads the codes the cache hands off
        ),
        CacheEntry(
            "sink",
            "kvlab SinkCache: first tokens + newest window, positions inside the cache (StreamingLLM, arXiv:2309.17453)",
            _sink,
            options=SinkSettings,
            exact=False,
            evicts=True,
            describe=lambda name, s: {"sink_tokens": s.sink_tokens, "window_length": s.window_length},
            keeps=_sink_keeps,
        ),
        _scorer_entry(
            "snapkv",
            "kvlab SnapKVCache: the prompt's K/V cut to what its last queries attend to, per KV head "
            "(arXiv:2404.14469)",
            _snapkv,
            while_decoding=False,  # scores the prompt once, with the prefill's last queries
            check=_snapkv_check,
        ),
        _scorer_entry(
            "tova",
            "kvlab TOVACache: after every step, drop the tokens the current query attends to least (arXiv:2401.06104)",
            _tova,
            while_decoding=True,  # scores after every step, with that step's query
        ),
        CacheEntry(
            "hqq",
            "transformers QuantizedCache, HQQ backend, axis 1 for K and V",
            _hf_quantized,
            nbits=(2, 4, 8),
            options=HFQuantizedSettings,
            exact=False,
            logit_bound={8: 0.01, 4: 0.1, 2: 0.4},
            requires="hqq",
            layer=_hf_layer,
            describe=_hf_describe,
        ),
        CacheEntry(
            "quanto",
            "transformers QuantizedCache, optimum-quanto backend, axis 0 for K and V",
            _hf_quantized,
            nbits=(2, 4),
            options=HFQuantizedSettings,
            exact=False,
            logit_bound={4: 0.1, 2: 0.4},
            requires="optimum.quanto",
            layer=_hf_layer,
            describe=_hf_describe,
        ),
        CacheEntry(
            "mixed",
            "kvlab MixedCache: each layer's K and V in the formats of a named plan (KIVI bits, FP8, float), "
            "mixed-<plan> (kvlab.plan.mixed); --kivi-attention fused: each layer hands its codes to kvlab attention",
            _mixed_cache,
            variants=_mixed.plan_names(),
            variant_hint=_mixed.plan_dir_note,
            variant_required=True,
            options=MixedSettings,
            exact=False,
            logit_bound={None: 0.4},  # its narrowest layers may be KIVI-2 (kivi-2's bound)
            describe=_mixed_describe,
            # fused: kvlab attention reads the codes of every layer that hands them off
            kvlab_attention=lambda name, s: "fused" in _mixed_describe(name, s)["layer_attention"].values(),
            check=_mixed_describe,  # an unknown plan, or entries of unknown formats
            attention_path=_mixed_run_path,
        ),
    )
}


def resolve(name: str | CacheName, settings: CacheSettings | None = None) -> ResolvedCache:
    """Look ``name`` up in :data:`REGISTRY` and merge its ``:setting=value`` overrides into ``settings``.

    Args:
        name: a cache name (:mod:`kvlab.cache_names`), e.g. ``"kivi-4"``, ``"kivi4-fused"``, ``"paged"``.
        settings: the run's settings; default :class:`CacheSettings()`.

    Raises:
        ValueError: a name outside the grammar, an unknown family, bits/variant/setting the family does not
            take (the message lists what it takes), both ``compression_ratio`` and ``token_budget``, a
            ``token_budget`` of 0, or an invalid resulting setting.
        TypeError: ``settings`` is not a :class:`CacheSettings` (or None).
    """
    parsed = name if isinstance(name, CacheName) else parse_cache_name(name, REGISTRY)
    entry = REGISTRY[parsed.family]
    text = parsed.text
    bad = [k for k, _ in parsed.settings if k not in entry.settings]
    if bad:
        raise ValueError(
            f"cache {text!r}: `{entry.family}` settings are {list(entry.settings) or 'none'}, got {bad}"
        )
    if parsed.key_bits is not None:  # "kivi-k8v4"
        if not entry.nbits:
            raise ValueError(
                f"cache {text!r}: `{entry.family}` takes no bits, got k{parsed.key_bits}v{parsed.value_bits}"
            )
        if not entry.bit_pairs:
            raise ValueError(
                f"cache {text!r}: `{entry.family}` takes one bit width for keys and values, got "
                f"k{parsed.key_bits}v{parsed.value_bits}"
            )
        bad = [b for b in parsed.bits if b not in entry.nbits]
        if bad:
            raise ValueError(
                f"cache {text!r}: `{entry.family}` needs key and value bits in {list(entry.nbits)}, got "
                f"k{parsed.key_bits}v{parsed.value_bits}"
            )
    elif entry.nbits and parsed.nbits not in entry.nbits:
        raise ValueError(
            f"cache {text!r}: `{entry.family}` needs bits in {list(entry.nbits)}, got "
            + ("none" if parsed.nbits is None else str(parsed.nbits))
            + f" (e.g. {entry.family}-{entry.nbits[len(entry.nbits) // 2]})"
        )
    if not entry.nbits and parsed.nbits is not None:
        raise ValueError(f"cache {text!r}: `{entry.family}` takes no bits, got {parsed.nbits}")
    if parsed.variant is not None and parsed.variant not in entry.variants:
        hint = f" ({entry.variant_hint()})" if entry.variant_hint else ""
        raise ValueError(
            f"cache {text!r}: `{entry.family}` variants are {list(entry.variants) or 'none'}, got {parsed.variant!r}"
            + hint
        )
    if entry.variant_required and parsed.variant is None:
        raise ValueError(f"cache {text!r}: `{entry.family}` needs a variant, one of {list(entry.variants)}")
    given = dict(parsed.settings)
    words = word_settings(entry.options)
    for key, value in given.items():  # a word for a number (snapkv:compression_ratio=nan): named as written
        if isinstance(value, str) and key not in words:
            raise ValueError(
                f"cache {text!r}: setting '{key}={value}' must be name=value with a non-negative value in plain "
                f"digits, e.g. window_length=64 or compression_ratio=0.5"
            )
    if {"compression_ratio", "token_budget"} <= given.keys():  # the factories would silently drop the ratio
        raise ValueError(f"cache {text!r}: give `compression_ratio` or `token_budget`, not both")
    if given.get("token_budget") == 0:  # 0 is EvictionSettings' "not given": written out, it is a bad budget
        raise ValueError(
            f"cache {text!r}: `token_budget` must be an int >= 1, got 0 (leave it out to use `compression_ratio`)"
        )
    if settings is not None and not isinstance(settings, CacheSettings):
        raise TypeError(f"`settings` must be a CacheSettings or None, got {settings!r}")
    run = {} if settings is None else {k: v for k, v in settings.values().items() if k in entry.reads}
    merged = None if entry.options is None else entry.options(**(run | given))
    if entry.check is not None:
        try:
            entry.check(parsed, merged)
        except ValueError as e:
            raise ValueError(f"cache {text!r}: {e}") from None
    return ResolvedCache(parsed, entry, merged)


def make_cache(name: str, model_config: Any = None, settings: CacheSettings | None = None) -> Any:
    """``resolve(name, settings).make(model_config)``: a fresh cache for one run."""
    return resolve(name, settings).make(model_config)


def cache_names(family: str | None = None) -> list[str]:
    """Every registered name without settings (each bit width and variant), e.g. for a test matrix or ``--help``.

    Raises:
        ValueError: an unknown ``family``.
    """
    if family is not None and family not in REGISTRY:
        raise ValueError(f"unknown cache family {family!r}; known: {', '.join(REGISTRY)}")
    out = []
    for entry in REGISTRY.values() if family is None else (REGISTRY[family],):
        variants = entry.variants if entry.variant_required else (None, *entry.variants)
        for bits in entry.nbits or (None,):
            for variant in variants:
                out.append(CacheName("", entry.family, bits, variant).canonical)
        for key_bits, value_bits in entry.bit_pairs:  # the listed pairs, with the run's attention path
            out.append(CacheName("", entry.family, None, None, (), key_bits, value_bits).canonical)
    return out
