"""What the registry holds of one cache family (:class:`CacheEntry`), what a registered name resolves to
(:class:`ResolvedCache`: the name, its entry and its settings, asked once), and what a capped evicting cache keeps
(:class:`Keeps`). Torch-free; the table itself is :data:`kvlab.caches.registry.REGISTRY`."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvlab.cache_names import CacheName
from kvlab.caches.settings import option_names
from kvlab.plan.kv_formats import PlannerBytes


@dataclass(frozen=True)
class Keeps:
    """What an evicting cache keeps at most, per layer and KV head (the eval refuses a cap no cell exceeds)."""

    tokens: int  # the cap in tokens
    while_decoding: bool  # True: over the prompt and every decoded token; False: over the prompt only


# (model_config, name, options) -> a fresh Cache; options: the entry's settings class, or None for a family without
Factory = Callable[[Any, CacheName, Any], Any]


def _no_keeps(name: CacheName, options: Any) -> Keeps | None:
    return None


@dataclass(frozen=True)
class CacheEntry:
    """One cache family of the registry: everything kvlab knows about the family is here.

    ``logit_bound``: for a lossy cache, bits -> the largest relative logit error allowed against
    ``DynamicCache`` (max |logit - logit_dynamic| / max |logit_dynamic| over the steps of a greedy ``generate()``
    up to the first differing token) in the registry test: a tiny random Qwen2, fp32, 96 prompt tokens, G = R = 32.
    It is an empirical tolerance for that setup, not a guarantee on other models.

    Raises:
        ValueError: a lossy, non-evicting entry without a bound for each of its bit widths.
    """

    family: str  # the name's first word: "kivi"
    summary: str  # one line for listings and CONTRIBUTING.md
    factory: Factory  # builds a fresh cache; imports its cache class itself (this module stays torch-free)
    nbits: tuple[int, ...] = ()  # bit widths the name must give ("kivi-4"); () = the name takes none
    variants: tuple[str, ...] = ()  # words allowed after the bits ("fused"); () = none
    variant_required: bool = False  # the variant names the cache itself (fp8's format): every name has one
    # (key, value) bits listed by cache_names() ("kivi-k8v4"); non-empty = any pair of `nbits` is accepted
    bit_pairs: tuple[tuple[int, int], ...] = ()
    options: type | None = None  # the family's settings dataclass (kvlab.caches.settings); None = no settings
    exact: bool = True  # True: logits equal DynamicCache's; False: within logit_bound
    evicts: bool = False  # drops tokens (exact=False, no logit bound): what it loses is the eval's to measure
    logit_bound: Mapping[int, float] = field(default_factory=dict)  # lossy only: bits -> relative logit error
    requires: str | None = None  # importable module the cache needs ("hqq"); None = always available
    install_hint: str = "pip install 'kvlab[hf]'"  # how to get `requires`
    # its planner bytes (torch-free, kvlab.plan.kv_formats): `kvlab plan --kv-dtype <name>` sizes it from them;
    # None = the planner does not size this family
    planner: PlannerBytes | None = None
    # one layer of the cache alone, no model config: (name, settings) -> the object `kvlab bench flush` times
    # (kvlab.bench.flush: a KIVIState, or a transformers QuantizedLayer); None = no flushing residual window
    layer: Callable[[CacheName, Any], Any] | None = None
    describe: Callable[[CacheName, Any], dict] | None = None  # JSON settings beyond name/family
    # whether the model must run kvlab attention (kvlab.attention.enable) for this name and options
    kvlab_attention: Callable[[CacheName, Any], bool] = lambda name, options: False
    # raises ValueError for settings the cache itself would refuse when made (checked at resolve, before any work)
    check: Callable[[CacheName, Any], None] | None = None
    # what an evicting cache keeps at most for this name and options (None: a ratio, or no cap)
    keeps: Callable[[CacheName, Any], Keeps | None] = _no_keeps
    # a family whose attention path the run's --kivi-attention chooses: (name, the run's path) -> the path this
    # name runs with (kivi-k8v4: "dequantize", whatever the run's); None: the family has no such choice
    attention_path: Callable[[CacheName, str], str] | None = None
    # variants that choose the attention path, not the cache (kivi-4-fused); kvlab eval takes them as the run's
    # --kivi-attention would be taken
    attention_variants: tuple[str, ...] = ()
    # variants of an exact family whose logits equal DynamicCache's only up to rounding (dynamic-ckernel: its own
    # attention kernel sums in another order and rounds once): variant -> relative logit bound, as logit_bound
    rounding_variants: Mapping[str, float] = field(default_factory=dict)
    # words added to the refusal of an unknown variant (mixed-<plan>: where plan files are read from); None: none
    variant_hint: Callable[[], str] | None = None

    def __post_init__(self) -> None:
        if not self.exact and not self.evicts and set(self.logit_bound) != set(self.nbits or (None,)):
            raise ValueError(f"lossy cache {self.family!r} must state a logit bound for each of {self.nbits}")

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings a name may override (``:group_size=64``): the fields of :attr:`options` a run does not
        set alone."""
        return option_names(self.options, in_name=True)

    @property
    def reads(self) -> tuple[str, ...]:
        """Every setting the family reads (the run's flags included: KIVI's ``kivi_attention``)."""
        return option_names(self.options)

    @property
    def display(self) -> str:
        """The family as a user writes a name of it: ``kivi-N`` for a family with bits, else ``sink``."""
        return f"{self.family}-N" if self.nbits else self.family


@dataclass(frozen=True)
class ResolvedCache:
    """A registered name with its entry and the settings it runs with (its family's ``options``: run-wide settings
    + the name's own, at the family's defaults for the rest; ``None`` for a family without settings)."""

    name: CacheName
    entry: CacheEntry
    settings: Any

    @property
    def family(self) -> str:
        return self.entry.family

    @property
    def nbits(self) -> int | None:
        return self.name.nbits

    @property
    def exact(self) -> bool:
        """Logits equal ``DynamicCache``'s: the entry is exact and this name is not one of its
        :attr:`CacheEntry.rounding_variants`."""
        return self.entry.exact and self.name.variant not in self.entry.rounding_variants

    @property
    def logit_bound(self) -> float:
        """0.0 for an exact cache, else the entry's stated relative logit error at these bits (for different key
        and value bits, the bound of the narrower one), or a rounding variant's."""
        if self.name.variant in self.entry.rounding_variants:
            return self.entry.rounding_variants[self.name.variant]
        if self.entry.exact:
            return 0.0
        if self.entry.evicts:  # no bound: what an evicting cache loses depends on what it drops
            return float("inf")
        bits = self.name.bits
        return self.entry.logit_bound[None if bits is None else min(bits)]

    @property
    def uses_kvlab_attention(self) -> bool:
        """Whether the model must run kvlab attention (:func:`kvlab.attention.enable`) for this cache."""
        return self.entry.kvlab_attention(self.name, self.settings)

    def keeps(self) -> Keeps | None:
        """What this cache keeps at most (an evicting cache with a cap), or ``None``."""
        return self.entry.keeps(self.name, self.settings)

    def unavailable_reason(self) -> str | None:
        """Why this cache cannot run here (its optional package is missing), or ``None``."""
        if self.entry.requires is None:
            return None
        try:
            found = importlib.util.find_spec(self.entry.requires) is not None
        except ModuleNotFoundError:  # a missing parent package of a dotted name
            found = False
        if found:
            return None
        return f"package for backend '{self.family}' is not installed ({self.entry.install_hint})"

    def make(self, model_config: Any) -> Any:
        """A fresh transformers ``Cache`` for one run of a model with ``model_config``."""
        return self.entry.factory(model_config, self.name, self.settings)

    def describe(self) -> dict:
        """JSON description: ``name``, ``family`` and the settings this cache uses."""
        out = {"name": self.name.text, "family": self.family}
        if self.entry.describe is not None:
            out.update(self.entry.describe(self.name, self.settings))
        return out
