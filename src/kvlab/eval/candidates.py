"""Cache candidates of ``kvlab eval``: names of the cache registry (:mod:`kvlab.caches.registry`).

* ``dynamic`` — transformers ``DynamicCache`` (the float baseline).
* ``kivi-N`` (N in 2, 4, 8) — :class:`kvlab.caches.KIVICache`: keys per-channel, values per-token;
  ``kivi-N-fused`` / ``kivi-N-dequant`` name the attention path themselves (otherwise ``--kivi-attention``);
  ``kivi-kKvV`` (``kivi-k8v4``) gives keys and values their own widths and always runs the dequantize path (the
  fused path reads both at one width).
* ``fp8-e4m3`` / ``fp8-e5m2`` [``-tensor`` | ``-unscaled`` | ``-hadamard``] — :class:`kvlab.caches.fp8.FP8Cache`:
  float8 K/V, per-head scales calibrated on the prefill (default), one per tensor, or 1.0; ``-hadamard``: per-head
  scales on K/V rotated by a randomized Hadamard matrix (:mod:`kvlab.quant.rotation`).
* ``hqq-N`` / ``quanto-N`` — transformers ``QuantizedCache`` with the HQQ backend (axis 1, docs/EVAL.md) or
  quanto (axis 0), when the ``hf`` extra is installed; otherwise the candidate is recorded as skipped with the reason.
* ``sink`` [``:sink_tokens=S:window_length=W``] — :class:`kvlab.caches.sink.SinkCache` (StreamingLLM: the first
  S tokens + the newest W; default 4 + 256); ``snapkv`` [``:compression_ratio=r`` | ``:token_budget=n``] —
  :class:`kvlab.caches.snapkv.SnapKVCache` (the prompt compressed once; default ratio 0.5). An evicting cache's
  settings are part of its name, as is SnapKV under KIVI: ``kivi-4:compression_ratio=0.5``.
* ``kivi-N:dot=int8`` (or ``int8-keys``) — KIVI whose fused attention asks the compiled CPU kernel for integer dot
  products (:mod:`kvlab.attention.cpu_kernel`); beside ``kivi-N`` (its exact twin) the result also reports the
  KL of the integer path to the exact one (:mod:`kvlab.eval.twins`).
* any other registered family (``paged``, and caches added later) by its registry name.

The experiment sets KIVI's group size and residual window per matrix cell, so an eval candidate names no
``:setting=value`` (``kvlab bench`` takes them) except an evicting cache's; its variant may name the cache itself
(FP8's format and scale) or KIVI's attention path (``kivi-4-fused`` is ``kivi-4`` with ``--kivi-attention fused``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvlab.caches.entry import ResolvedCache
from kvlab.caches.registry import CacheSettings, resolve
from kvlab.caches.settings import HQQ_GROUP_SIZE

EVICTION_SETTINGS = {"compression_ratio", "token_budget"}  # kivi-4:compression_ratio=0.5: SnapKV under KIVI
# settings a candidate names itself: SnapKV's under KIVI, and KIVI's key-score path (kivi-4:dot=int8: the CPU
# kernel's integer path, beside kivi-4 as its exact twin)
OWN_SETTINGS = EVICTION_SETTINGS | {"dot"}


def _refused(names: list, reason: str) -> str:
    """The error of refused candidate names, each reason saying what is wrong (an unknown family, bits the family
    does not take, ...): the names may be of known caches with a bad bit width, variant or setting."""
    return f"cache candidate(s) {names} refused: {reason}"


def _resolve_one(name: Any) -> ResolvedCache:
    try:
        cache = resolve(name)
    except ValueError as exc:
        head, colon, tail = str(name).partition(":")
        if "_" in head:  # vLLM's fp8_e4m3 (kvlab plan takes it): name the registry's spelling
            dashed = head.replace("_", "-") + colon + tail
            try:
                canonical = resolve(dashed).name.canonical
            except ValueError:
                pass
            else:
                raise ValueError(f"write cache candidate {name!r} as {canonical!r}") from None
        raise ValueError(_refused([name], str(exc))) from None
    # a variant that names the cache itself (fp8-e4m3: the format) or KIVI's attention path (kivi-4-fused) is part
    # of the candidate, as are an evicting cache's settings (sink:window_length=128: what it keeps) and SnapKV's
    # under KIVI; KIVI's and HQQ's other settings (group size, residual window) are the run's
    own_settings = cache.entry.evicts or {k for k, _ in cache.name.settings} <= OWN_SETTINGS
    own_variant = cache.entry.variant_required or cache.name.variant in cache.entry.attention_variants
    if cache.name.variant == "fused" and cache.name.key_bits is not None:  # kivi-k8v4-fused
        raise ValueError(
            _refused(
                [name],
                "fused KIVI attention reads keys and values at one width; use "
                f"{cache.family}-k{cache.name.key_bits}v{cache.name.value_bits} (it runs the dequantize path)",
            )
        )
    if (cache.name.variant is not None and not own_variant) or (cache.name.settings and not own_settings):
        head = resolve(str(name).partition(":")[0]).name.canonical
        kept = "".join(f":{k}={v}" for k, v in cache.name.settings if k in OWN_SETTINGS)
        raise ValueError(
            _refused(
                [name],
                "eval candidates name no setting the run sets (--group-size, --residual, --hqq-group-size); "
                f"use {head}{kept}",
            )
        )
    return cache


BASELINE = "dynamic"  # the float cache every candidate is compared with


def _is_baseline(name: str) -> bool:
    try:
        return resolve(name).name.canonical == BASELINE
    except ValueError:  # a bad name: refused by the command's own check, naming it
        return False


def with_baseline(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` with the float baseline ``dynamic`` first when none of them is it (``kvlab eval`` and ``kvlab tasks``
    add it: every ratio and gate compares a cache with it); ``names`` unchanged otherwise (a misspelt ``Dynamic``
    too: :func:`check_candidate_names` names the spelling)."""
    return names if any(_is_baseline(n) for n in names) else (BASELINE, *names)


def baseline_note(names: tuple[str, ...], flag: str = "--candidates") -> str | None:
    """The one-line note of a command that added the float baseline to ``names`` (:func:`with_baseline`), or None
    when they hold it."""
    if any(_is_baseline(n) for n in names):
        return None
    return f"added the float baseline {BASELINE} to {flag}: every ratio and gate compares a cache with it"


def check_candidate_names(names: tuple[str, ...], kivi_attention: str = "dequantize") -> None:
    """Raise ``ValueError`` naming any unknown candidate, one not written in the registry's canonical spelling
    (``kivi4`` for ``kivi-4``: the same cache could otherwise run twice, or ``Dynamic`` miss the baseline), a
    duplicate (also one cache under two names: ``sink`` and ``sink:window_length=256``, its default; ``kivi-4`` and
    ``kivi-4-fused`` in a run whose ``kivi_attention`` is ``"fused"``), a list without ``dynamic``, or ``dynamic``
    alone (nothing to compare with the baseline)."""
    if not names:
        raise ValueError("`candidates` must not be empty")
    bad: dict[str, str] = {}  # every bad name in one error, not only the first
    for name in names:
        try:
            canonical = _resolve_one(name).name.canonical
        except ValueError as exc:
            bad[name] = str(exc).removeprefix(_refused([name], ""))
            continue
        if name != canonical:  # one spelling per cache: duplicates and the baseline are matched by name
            bad[name] = f"write cache candidate {name!r} as {canonical!r}"
    if len(bad) == 1 and next(iter(bad.values())).startswith("write cache candidate"):
        raise ValueError(next(iter(bad.values())))
    if bad:
        reasons = "; ".join(why if repr(name) in why else f"{name!r}: {why}" for name, why in bad.items())
        raise ValueError(_refused(list(bad), reasons))
    if len(set(names)) != len(names):
        twice = next(n for i, n in enumerate(names) if n in names[:i])
        raise ValueError(f"`candidates` names {twice!r} twice: {list(names)}")
    seen: dict[tuple, str] = {}
    # a setting written out at its default (sink:window_length=256 = sink) names the same cache
    for name in names:
        # what the registry says the cache is, minus its name: kivi-4 and kivi-4:compression_ratio=0.5 differ
        # (SnapKV under KIVI), sink and sink:window_length=256 do not
        settings = CacheSettings(kivi_attention=run_attention(name, kivi_attention))
        described = resolve(name, settings).describe()
        key = tuple(sorted((k, repr(v)) for k, v in described.items() if k != "name"))
        if key in seen:
            raise ValueError(
                f"cache candidates {seen[key]!r} and {name!r} are the same cache (same settings); keep one"
            )
        seen[key] = name
    if "dynamic" not in names:
        raise ValueError(f"`candidates` must include the baseline 'dynamic', got {list(names)}")
    if len(names) == 1:  # the baseline alone: no row to gate, a decision about nothing
        raise ValueError(
            "`candidates` ['dynamic'] has nothing to compare: give at least one candidate besides dynamic (the "
            "float baseline)"
        )


def run_attention(name: str, kivi_attention: str) -> str:
    """The KIVI attention path ``name`` runs with in a run whose ``--kivi-attention`` is ``kivi_attention``: the run's,
    except ``"dequantize"`` for a name with its own key and value bits (``kivi-k8v4``: the fused path reads both
    at one width). A ``-fused``/``-dequant`` variant wins over either (the registry reads it first). The rule is
    the registry entry's (:attr:`kvlab.caches.entry.CacheEntry.attention_path`); a family without one takes the
    run's."""
    return _run_attention(resolve(name), kivi_attention)


def _run_attention(cache: ResolvedCache, kivi_attention: str) -> str:
    path = cache.entry.attention_path
    return kivi_attention if path is None else path(cache.name, kivi_attention)


def _settings(
    residual_length: int, group_size: int, hqq_group_size: int, kivi_attention: str
) -> CacheSettings:
    return CacheSettings(
        group_size=group_size,
        residual_length=residual_length,
        hqq_group_size=hqq_group_size,
        kivi_attention=kivi_attention,
    )


@dataclass(frozen=True)
class Candidate:
    """One cache candidate: ``family`` a registry family (dynamic, kivi, hqq, quanto, ...), ``nbits`` (None for
    a cache without bits); ``cache``: its registry entry, resolved once by :meth:`parse` (at the family's default
    settings; :meth:`make` and :meth:`describe` resolve again with a cell's settings)."""

    name: str
    family: str
    nbits: int | None
    cache: ResolvedCache = field(repr=False, compare=False)

    def __reduce__(
        self,
    ):  # the entry holds functions: a pickled candidate (a forked helper's result) is its name
        return (Candidate.parse, (self.name,))

    @classmethod
    def parse(cls, name: str) -> Candidate:
        """``"kivi-4"`` -> ``Candidate("kivi-4", "kivi", 4)``.

        Raises:
            ValueError: a name the registry does not know, or one with a setting the run sets (or ``-fused`` with
                key and value bits of their own).
        """
        cache = _resolve_one(name)
        return cls(name, cache.family, cache.nbits, cache)

    @property
    def uses_residual(self) -> bool:
        """Whether the cache keeps a full-precision residual window (its registry entry takes ``residual_length``:
        KIVI, HQQ, quanto); the residual-window matrix varies R, so only these caches run there."""
        return "residual_length" in self.cache.entry.settings

    def uses_kvlab_attention(self, kivi_attention: str = "dequantize") -> bool:
        """Whether the model must run kvlab attention for this candidate in a run whose ``--kivi-attention`` is
        ``kivi_attention`` (fused KIVI reads packed codes, FP8 its float8 history, SnapKV and TOVA the queries)."""
        settings = CacheSettings(kivi_attention=_run_attention(self.cache, kivi_attention))
        return resolve(self.cache.name, settings).uses_kvlab_attention

    def unavailable_reason(self) -> str | None:
        """Why this candidate cannot run here (a missing optional package), or ``None``."""
        return self.cache.unavailable_reason()

    def make(
        self,
        model_config: Any,
        residual_length: int,
        group_size: int,
        hqq_group_size: int = HQQ_GROUP_SIZE,
        kivi_attention: str = "dequantize",
    ):
        """A fresh cache for one run. ``group_size`` applies to KIVI, ``hqq_group_size`` to HQQ/quanto."""
        attention = _run_attention(self.cache, kivi_attention)
        settings = _settings(residual_length, group_size, hqq_group_size, attention)
        return resolve(self.cache.name, settings).make(model_config)

    def describe(
        self, residual_length: int, group_size: int, hqq_group_size: int, kivi_attention: str = "dequantize"
    ) -> dict:
        """JSON description of the candidate's settings (the registry's ``describe``)."""
        attention = _run_attention(self.cache, kivi_attention)
        settings = _settings(residual_length, group_size, hqq_group_size, attention)
        return resolve(self.cache.name, settings).describe()


def _divisors_dividing(n: int, others: tuple[int, ...], count: int = 3) -> list[int]:
    """The ``count`` largest divisors of ``n`` (>= 2) that also divide every one of ``others``."""
    return [d for d in range(n, 1, -1) if n % d == 0 and all(o % d == 0 for o in others)][:count]


def check_model_shape(
    names: tuple[str, ...],
    head_dim: int,
    kv_heads: int,
    kivi_groups: list[tuple[str, int, tuple[int, ...]]],
    hqq_group_size: int,
    prompt_tokens: tuple[int, ...],
) -> None:
    """Refuse run settings that a model of this shape makes fail in every cell of the candidates they apply to.

    Args:
        names: the run's candidates (those not installed here are skipped by the run and not checked).
        head_dim, kv_heads: the model's (per layer; one value for every layer).
        kivi_groups: ``(setting, G, residuals)`` of each matrix: ``("group_size", 32, (128,))`` for the capacity
            matrix, ``("window_group_size", 16, (16, 32))`` for the residual-window one.
        hqq_group_size: the HQQ/quanto group size.
        prompt_tokens: the prompt lengths the caches first quantize (capacity contexts, window context).

    Raises:
        ValueError: naming the setting with its flag, the value and the model's shape: a KIVI ``G`` that does not
            divide head_dim (values are grouped per token over ``G`` channels) or a head_dim whose codes do not
            fill whole bytes at a KIVI candidate's bits; an HQQ/quanto group size that does not divide one
            sequence's K/V values of a prompt (``kv_heads x tokens x head_dim``, grouped across them).
    """
    runnable = [c for c in map(Candidate.parse, names) if c.unavailable_reason() is None]
    # the caches that quantize at the name's bits in groups of `group_size` channels (KIVI)
    kivi = [c for c in runnable if c.cache.entry.nbits and "group_size" in c.cache.entry.reads]
    for setting, group, residuals in kivi_groups if kivi else ():
        if head_dim % group:
            flag = "--" + setting.replace("_", "-")
            fits, hint = [str(d) for d in _divisors_dividing(head_dim, residuals)], ""
            if fits:
                listed = f"{', '.join(fits[:-1])} or {fits[-1]}" if len(fits) > 1 else fits[0]
                window = "residual window" + ("s" if len(residuals) > 1 else "")
                hint = f" that also divides the {window} ({', '.join(map(str, residuals))}): {listed}"
            raise ValueError(
                f"`{setting}` ({flag}) {group} does not divide the model's head_dim ({head_dim}): KIVI quantizes "
                f"values per token in groups of G channels, so {[c.name for c in kivi]} would fail in every cell; "
                f"use a divisor of {head_dim}{hint}"
            )
    for c in kivi:
        for bits in sorted(set(c.cache.name.bits)):
            if head_dim * bits % 8:
                raise ValueError(
                    f"cache candidate {c.name!r}: the model's head_dim ({head_dim}) times {bits} bits is not whole "
                    f"bytes, so KIVI cannot pack a token's codes; it would fail in every cell"
                )
    hf = [c.name for c in runnable if "hqq_group_size" in c.cache.entry.reads]  # HQQ's and quanto's groups
    check_hqq_group_size(hf, kv_heads, head_dim, hqq_group_size, prompt_tokens)


def check_hqq_group_size(
    caches: list[str], kv_heads: int, head_dim: int, hqq_group_size: int, prompt_tokens: tuple[int, ...] | None
) -> None:
    """Refuse an HQQ/quanto group size that does not divide the K/V values those ``caches`` quantize in groups
    across heads, tokens and channels: one sequence's ``kv_heads x tokens x head_dim`` of each of ``prompt_tokens``,
    or, with ``prompt_tokens`` None (a benchmark quantizing chunks of a power-of-two number of tokens), of any
    power-of-two number of tokens. Nothing to
    check without such a cache, or for a size below 1 (the caches' settings refuse it).

    Raises:
        ValueError: naming ``hqq_group_size`` with its flag, the value, the shape and a divisor that fits.
    """
    per_token = kv_heads * head_dim
    if not caches or hqq_group_size < 1:
        return
    if prompt_tokens is None:
        import math

        rest = hqq_group_size // math.gcd(hqq_group_size, per_token)  # what the token count would have to supply
        if rest & (rest - 1):  # not a power of two: no power-of-two number of tokens (the chunks quantized) fits
            raise ValueError(
                f"`hqq_group_size` (--hqq-group-size) {hqq_group_size} does not divide the K/V values of any "
                f"power-of-two number of tokens ({kv_heads} KV heads x head_dim {head_dim} = {per_token:,} per "
                f"token), which HQQ/quanto quantize in groups of that size: {caches} would fail in every cell; use a "
                f"divisor of {per_token}"
            )
        return
    for tokens in sorted(set(prompt_tokens)):
        if per_token * tokens % hqq_group_size:
            raise ValueError(
                f"`hqq_group_size` (--hqq-group-size) {hqq_group_size} does not divide the K/V values of one "
                f"{tokens:,}-token prompt on this model ({kv_heads} KV heads x {tokens:,} tokens x head_dim "
                f"{head_dim} = {per_token * tokens:,}), which HQQ/quanto quantize in groups of that size: {caches} "
                f"would fail at context {tokens:,}; use a divisor of {per_token} (KV heads x head_dim)"
            )
