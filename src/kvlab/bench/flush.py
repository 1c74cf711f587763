"""Benchmark ``flush``: time of a flushing append against history length.

A *flushing append* is the single-token append after which a quantized cache moves tokens out of its
full-precision residual window. :class:`kvlab.quant.kivi.KIVIState` quantizes only the ``G``-token chunk that
overflows and writes it into a block that is never moved (KIVI arXiv:2402.02750 section 3.3, Algorithm 1), so its cost is
O(new tokens) and must stay flat as the history grows. transformers' ``QuantizedLayer`` (HQQ/quanto) instead
dequantizes the whole history, concatenates it with the residual and re-quantizes all of it, O(history); it is
timed alongside for contrast when its backend is installed.

Per (cache, history length) and repetition: a fresh layer is filled with ``T`` tokens (untimed); then, for
``KIVI_CYCLES`` flushes in a row (one for HQQ/quanto, whose flushes take seconds), tokens are brought up to the step
before a flush in one untimed append and the flushing append and the next plain append are timed; the layer's value
is the median over its cycles (the first flush after a fill also pays one-time costs of the fill, such as the first
touch of freshly reserved memory; the later ones are what each flush costs while decoding). A round measures every
history length once, in an order rotated per round, so load from other processes falls on all lengths alike;
medians over rounds. Target: KIVI flush at 16k <= 1.2x flush at 1k.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from kvlab.bench.cells import bench_contexts, failed_cell
from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.caches.settings import HQQ_GROUP_SIZE
from kvlab.runtime.checks import check_int
from kvlab.runtime.device import resolve_device, synchronize
from kvlab.runtime.dtypes import parse_dtype

CONTEXTS = (1024, 2048, 4096, 8192, 16384)
QUICK_CONTEXTS = (256, 1024)
TARGET_RATIO = 1.2  # KIVI flush(16k) / flush(1k)
TARGET_CONTEXTS = (1024, 16384)
TARGET_CACHE = "kivi4"
KIVI_CYCLES = (
    4  # flushes timed per fresh KIVI layer (HF layers: 1, each of their flushes re-quantizes everything)
)


class _KIVISubject:
    """A :class:`KIVIState` behind the harness interface (append, steps before a flush, flush counter): kvlab's
    own flush, timed over ``KIVI_CYCLES`` flushes per fresh layer and ``reps`` rounds."""

    cycles = KIVI_CYCLES

    def __init__(self, state: Any):
        self.state = state

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.state.append(k, v)

    def steps_to_flush(self) -> int:
        cfg = self.state.config
        return cfg.residual_length + cfg.group_size - 1 - self.state.residual_tokens

    def flushes(self) -> int:
        return self.state.flushes

    def tokens(self) -> int:
        return self.state.total_tokens


class _HFSubject:
    """transformers' ``HQQQuantizedLayer`` / ``QuantoQuantizedLayer`` (settings as ``kvlab eval``'s candidates): one
    flush per fresh layer (each re-quantizes the whole history: seconds on CPU) and ``hf_reps`` rounds."""

    cycles = 1

    def __init__(self, layer: Any):
        self.layer = layer
        self._flushes = 0

    def _held(self) -> int:
        keys = self.layer.keys
        return keys.shape[-2] if keys is not None and keys.dim() == 4 else 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        before = self._held()
        initialized = self.layer.is_initialized
        self.layer.update(k, v)
        if initialized and self._held() < before + k.shape[-2]:
            self._flushes += 1

    def steps_to_flush(self) -> int:
        return max(0, self.layer.residual_length - 1 - self._held())

    def flushes(self) -> int:
        return self._flushes

    def tokens(self) -> int:
        return self.layer.cumulative_length


def _layer(name: str, settings: dict) -> Any:
    """One fresh layer of cache ``name`` as its registry entry makes it alone (``CacheEntry.layer``), with the run's
    ``settings`` (``group_size``, ``residual_length``, ``hqq_group_size``)."""
    from kvlab.caches.registry import CacheSettings, resolve

    cache = resolve(name, CacheSettings(**settings))
    return cache.entry.layer(cache.name, cache.settings)


def _subject(name: str, settings: dict) -> Any:
    """A fresh layer of ``name`` (:func:`_layer`) behind the harness: :class:`_KIVISubject` for kvlab's
    :class:`KIVIState`, :class:`_HFSubject` for a transformers layer."""
    from kvlab.quant.kivi import KIVIState

    layer = _layer(name, settings)
    return _KIVISubject(layer) if isinstance(layer, KIVIState) else _HFSubject(layer)


def _subject_class(name: str, settings: dict) -> type:
    """The harness class of ``name`` (:func:`_subject`); :class:`_HFSubject` for a cache whose package is missing
    (its cells are skipped, with the reps and cycles of transformers' layers)."""
    return _HFSubject if _unavailable(name) is not None else type(_subject(name, settings))


def _unavailable(name: str) -> str | None:
    from kvlab.caches.registry import resolve

    return resolve(name).unavailable_reason()


def _one_flush(name, context, kv, settings, device, cycles: int = 1) -> tuple[float, float, int]:
    """``(flush µs, plain append µs, history tokens)`` of one fresh layer of cache ``name`` with ``context``
    tokens: untimed fill, then ``cycles`` times: an untimed bulk append up to the step before a flush, the timed
    flushing append and the timed plain append after it. Times are medians over the cycles; the first flush after a
    fill also pays one-time costs of the fill (first touch of freshly reserved memory), later ones are what every
    flush during decoding costs."""
    subject = _subject(name, settings)
    k, v = kv
    subject.append(k[:, :, :context], v[:, :, :context])
    pos = context
    history = None
    flush_us, plain_us = [], []
    for _ in range(cycles):
        n = subject.steps_to_flush()
        if n:
            subject.append(k[:, :, pos : pos + n], v[:, :, pos : pos + n])
            pos += n
        before_flushes = subject.flushes()
        history = subject.tokens() if history is None else history
        timings = []
        for _ in range(2):  # the flushing append, then a plain one
            synchronize(device)
            t0 = time.perf_counter()
            subject.append(k[:, :, pos : pos + 1], v[:, :, pos : pos + 1])
            synchronize(device)
            timings.append((time.perf_counter() - t0) * 1e6)
            pos += 1
        assert subject.flushes() == before_flushes + 1, "exactly the first timed append must flush"
        flush_us.append(timings[0])
        plain_us.append(timings[1])
    return statistics.median(flush_us), statistics.median(plain_us), history


def _measure(name, contexts, reps, kv, settings, device, progress, cycles=1) -> dict[int, dict]:
    """Rows (per context) of cache ``name``: one warm-up, then ``reps`` rounds, each timing ``cycles`` flushes of
    a fresh layer at every context in an order rotated per round, so load from other processes falls on all
    contexts alike."""
    samples: dict[int, list] = {c: [] for c in contexts}
    out: dict[int, dict] = {}
    _one_flush(name, contexts[0], kv, settings, device)  # warm-up
    for rnd in range(reps):
        if progress:
            progress(f"flush: {name}, round {rnd + 1}/{reps}")
        live = [c for c in contexts if c not in out]
        shift = rnd % max(1, len(live))
        for context in live[shift:] + live[:shift]:
            try:
                samples[context].append(_one_flush(name, context, kv, settings, device, cycles))
            except Exception as e:  # noqa: BLE001 - recorded per cell
                out[context] = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:500]}
    for context, got in samples.items():
        if context in out:
            continue
        flush_us = [f for f, _, _ in got]
        out[context] = {
            "status": "ok",
            "flush_us": statistics.median(flush_us),
            "plain_append_us": statistics.median(p for _, p, _ in got),
            "flush_us_all": flush_us,
            "history_tokens": int(statistics.median(h for _, _, h in got)),
        }
    return out


def run(
    contexts: tuple[int, ...] | None = None,
    caches: tuple[str, ...] = ("kivi4", "kivi2", "hqq4", "quanto4"),
    kv_heads: int = 8,
    head_dim: int = 128,
    batch: int = 1,
    dtype: str = "bfloat16",
    reps: int = 25,
    hf_reps: int = 3,
    group_size: int = KIVI_DEFAULTS.group_size,
    residual_length: int = KIVI_DEFAULTS.residual_length,
    hqq_group_size: int = HQQ_GROUP_SIZE,
    device: str | None = "cpu",
    quick: bool = False,
    progress: Any = None,
    seed: int = 0,
    **_: object,
) -> dict:
    """Flushing-append time against history length for KIVI and transformers' quantized layers, one layer.

    Args:
        contexts: history lengths in tokens (default 1k..16k; ``quick``: 256 and 1024).
        caches: ``kivi{2,4,8}``, ``hqq{2,4,8}``, ``quanto{2,4}`` (or the registry spelling, ``kivi-4``); HF
            backends not installed are skipped.
        kv_heads / head_dim / batch / dtype: the layer's ``[batch, kv_heads, tokens, head_dim]`` states (default:
            one Llama-3-8B layer, bf16).
        reps: rounds for KIVI (``quick``: 2), after one untimed warm-up flush per cache.
        hf_reps: rounds for HQQ/quanto (their flush re-quantizes everything: seconds on CPU).
        progress: optional ``callable(str)`` told about each round before it runs.

    Returns:
        ``{"device", "shape", "settings", "contexts", "rows", "ratios", "target"}``. ``rows``: per (cache,
        context) ``flush_us`` and ``plain_append_us`` (medians), ``history_tokens``, or ``status``
        ``skipped``/``failed`` with ``error``. ``ratios``: per cache, flush at the largest context / flush at the
        smallest.

    Raises:
        ValueError: bad contexts, reps, cache names or layer shape, or ``residual_length`` 0 with an HQQ/quanto
            cache (:func:`_check_layer`).
    """
    dev = resolve_device(device)
    contexts = bench_contexts(contexts, quick, dev.type, (QUICK_CONTEXTS, CONTEXTS, None), sort=True)
    if quick:
        reps, hf_reps = min(reps, 2), min(hf_reps, 1)
    if reps < 1 or hf_reps < 1:
        raise ValueError(f"`reps` and `hf_reps` must be >= 1, got {reps!r} and {hf_reps!r}")
    caches = _check_cache_names(caches)
    settings = dict(group_size=group_size, residual_length=residual_length, hqq_group_size=hqq_group_size)
    _check_layer(caches, batch, kv_heads, head_dim, settings)
    torch_dtype = parse_dtype(dtype)
    gen = torch.Generator().manual_seed(seed)
    extra = residual_length + (KIVI_CYCLES + 1) * (group_size + 2)
    shape = (batch, kv_heads, max(contexts) + extra, head_dim)
    k = torch.randn(shape, generator=gen).to(dev, torch_dtype)
    v = torch.randn(shape, generator=gen).to(dev, torch_dtype)

    rows = []
    for name in caches:
        cycles = _subject_class(name, settings).cycles
        n_reps = reps if cycles == KIVI_CYCLES else hf_reps
        cells = _cache_cells(name, contexts, n_reps, (k, v), settings, dev, progress, cycles)
        rows += [{"cache": name, "context": c, "reps": n_reps, "cycles": cycles} | cells[c] for c in contexts]
    ratios = _flush_ratios(rows, caches)
    result = {
        "device": str(dev),
        "device_type": dev.type,
        "shape": {"batch": batch, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": dtype},
        "settings": settings
        | {
            "reps": reps,
            "hf_reps": hf_reps,
            "kivi_cycles": KIVI_CYCLES,
            "kivi_block_tokens": _kivi_block_tokens(group_size),
        },
        "contexts": list(contexts),
        "rows": rows,
        "ratios": ratios,
    }
    result["target"] = evaluate_target(result)
    return result


def _check_layer(caches: tuple[str, ...], batch: int, kv_heads: int, head_dim: int, settings: dict) -> None:
    """Raise ``ValueError`` for a layer no cell could time: a zero or negative ``batch`` / ``kv_heads`` /
    ``head_dim`` (an empty layer timed as if it held tokens, exit 0), ``residual_length`` 0 with an HQQ/quanto
    cache (transformers' quantized layer then flushes on every append: no plain append follows a flush), or a
    ``head_dim`` a KIVI cache cannot hold (:func:`_check_takes_head_dim`), or an HQQ/quanto group size that does
    not divide one token's K/V values (:func:`kvlab.eval.candidates.check_hqq_group_size`, as ``kvlab eval``)."""
    from kvlab.eval.candidates import check_hqq_group_size

    for name, value in (("batch", batch), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        check_int(name, value, 1)
    hf = [c for c in caches if not c.startswith("kivi")]
    if settings["residual_length"] == 0 and hf:
        raise ValueError(
            f"`residual_length` 0 makes {', '.join(hf)} flush on every append (no residual window), so no plain "
            "append follows a flush to time: give it >= 1 or time KIVI caches only"
        )
    _check_takes_head_dim(caches, head_dim, settings)
    check_hqq_group_size(hf, kv_heads, head_dim, settings["hqq_group_size"], None)


def _check_takes_head_dim(caches: tuple[str, ...], head_dim: int, settings: dict) -> None:
    """Raise ``ValueError`` naming the cache when a KIVI cache of ``caches`` cannot hold states of ``head_dim``
    channels with ``settings`` (a group that does not divide it: every cell failed, after the history was built):
    its layer checks the shape on its first append, here of one token. (transformers' layers quantize their first
    append at once, so one token would not stand for the run's fill; they are not probed.)"""
    for name in caches:
        if _unavailable(name) is not None or _subject_class(name, settings) is not _KIVISubject:
            continue
        try:
            _subject(name, settings).append(torch.zeros(1, 1, 1, head_dim), torch.zeros(1, 1, 1, head_dim))
        except (ValueError, RuntimeError) as exc:
            raise ValueError(f"cache {name} cannot hold `head_dim` {head_dim}: {exc}") from None


def _flush_names() -> tuple[set[str], str]:
    """The caches this benchmark times, from the registry entries that make one layer alone (``CacheEntry.layer``):
    their names (family + bits: ``kivi4``, ``hqq2``) and how a message lists them (``kivi{2,4,8}, hqq{2,4,8} or
    quanto{2,4}``)."""
    from kvlab.caches.registry import REGISTRY

    entries = [e for e in REGISTRY.values() if e.layer is not None]
    listed = [f"{e.family}{{{','.join(map(str, e.nbits))}}}" for e in entries]
    text = listed[-1] if len(listed) == 1 else f"{', '.join(listed[:-1])} or {listed[-1]}"
    return {f"{e.family}{b}" for e in entries for b in e.nbits}, text


def _check_cache_names(caches) -> tuple[str, ...]:
    """``caches`` as this benchmark names them (``kivi4``): the registry's own spelling ``kivi-4`` is read as
    ``kivi4`` (:func:`kvlab.cache_names.parse_cache_name`, as the registry reads names at the edge).

    Raises:
        ValueError: a cache that is not one of :func:`_flush_names` (kivi{2,4,8}, hqq{2,4,8}, quanto{2,4}), named
            as written, or one cache given twice under two spellings (``kivi4,kivi-4``).
    """
    from kvlab.cache_names import parse_cache_name

    names, listed = _flush_names()
    families = {name.rstrip("0123456789") for name in names}
    out = []
    for name in caches:
        try:
            parsed = parse_cache_name(name, families) if isinstance(name, str) else None
        except ValueError:
            parsed = None
        plain = (
            parsed is not None and parsed.variant is None and not parsed.settings and parsed.nbits is not None
        )
        flush_name = f"{parsed.family}{parsed.nbits}" if plain else name
        if flush_name not in names:
            raise ValueError(f"unknown cache {name!r}; expected {listed}")
        if flush_name in out:
            raise ValueError(f"`caches`: {name!r} is {flush_name!r}, given twice")
        out.append(flush_name)
    return tuple(out)


def _cache_cells(name, contexts, reps, kv, settings, dev, progress, cycles) -> dict[int, dict]:
    """``{context: cell}`` of one cache (:func:`_measure`): every cell ``skipped`` when its back-end is missing,
    every cell ``failed`` when the warm-up failed."""
    reason = _unavailable(name)
    if reason:
        return {c: {"status": "skipped", "error": reason} for c in contexts}
    try:
        with torch.inference_mode():
            return _measure(name, contexts, reps, kv, settings, dev, progress, cycles)
    except Exception as e:  # noqa: BLE001 - the warm-up failed: every cell fails
        return {c: failed_cell(e) for c in contexts}


def _flush_ratios(rows: list[dict], caches) -> dict[str, dict]:
    """Per cache with two or more ``ok`` contexts: flush time at the largest context / at the smallest."""
    ratios = {}
    for name in caches:
        ok = {r["context"]: r["flush_us"] for r in rows if r["cache"] == name and r["status"] == "ok"}
        if len(ok) >= 2:
            lo, hi = min(ok), max(ok)
            ratios[name] = {"from_context": lo, "to_context": hi, "ratio": ok[hi] / ok[lo]}
    return ratios


def _kivi_block_tokens(group_size: int) -> int:
    from kvlab.quant.kivi import KIVIConfig

    return KIVIConfig(4, group_size, 0).block_tokens


def evaluate_target(result: dict) -> dict:
    """Flush target: ``kivi4`` flush at 16384 tokens <= 1.2x flush at 1024 tokens."""
    lo, hi = TARGET_CONTEXTS
    desc = f"{TARGET_CACHE} flush at {hi} tokens <= {TARGET_RATIO}x flush at {lo} tokens"
    ok = {
        r["context"]: r["flush_us"]
        for r in result["rows"]
        if r["cache"] == TARGET_CACHE and r["status"] == "ok"
    }
    if lo not in ok or hi not in ok:
        return {
            "description": desc,
            "status": "not measured",
            "detail": f"needs {TARGET_CACHE} cells at {lo} and {hi}",
        }
    ratio = ok[hi] / ok[lo]
    return {
        "description": desc,
        "status": "met" if ratio <= TARGET_RATIO else "not met",
        "detail": f"{ratio:.3f}x ({ok[lo]:.0f} µs -> {ok[hi]:.0f} µs)",
        "ratio": ratio,
    }
