"""Real-model check: incremental decoding with each cache that should be exact gives the full forward's logits.

``kvlab lab`` shows on a toy (docs/lab.md) that cached K/V equal recomputed ones; this check asks the same of a real
transformers model and of every cache the registry (:mod:`kvlab.caches.registry`) marks exact: ``DynamicCache`` (the
reference), ``kvlab.caches.PagedCache`` (K/V in physical blocks) and ``kvlab.caches.KIVICache`` at 8 bits with a
residual window longer than the sequence (nothing is ever quantized, so it must be exact too).

For a token sequence ``[batch, tokens]``, the reference is one forward without cache; the candidate prefills
``prefill_tokens`` tokens into the cache, then feeds one token per step. The logits of every position are
compared: max absolute error and relative error (max abs error / max |reference logit|).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

import torch

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.caches.registry import cache_names, make_cache, resolve
from kvlab.lab import longrun
from kvlab.lab.estimate import PROBE_STEPS, estimate_line, fit_estimate, probe_sizes, time_probe
from kvlab.lab.longrun import Progress, spans, text_config
from kvlab.runtime import provenance
from kvlab.runtime.hf_api import cache_kwarg

# Relative-error tolerance by model dtype: the two paths differ only in matmul shapes (accumulation order).
TOLERANCE_BY_DTYPE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}

CacheFactory = Callable[[Any, int], Any]  # (model, total tokens) -> a transformers Cache


def _registered(name: str) -> CacheFactory:
    """A factory for the cache registry's ``name`` (:mod:`kvlab.caches.registry`)."""

    def factory(model: Any, total_tokens: int) -> Any:
        return make_cache(name, model.config)

    return factory


def _kivi8(model: Any, total_tokens: int) -> Any:
    group = KIVI_DEFAULTS.group_size
    residual = group * (total_tokens // group + 1)  # a multiple of G, longer than the sequence: never flushes
    return make_cache(f"kivi-8:group_size={group}:residual_length={residual}", model.config)


# Every exact cache of the registry (DynamicCache first: the others are also compared with it; PagedCache's
# 16-token blocks make the sequence span several), and KIVI with nothing ever quantized.
EXACT_CACHES: dict[str, CacheFactory] = {
    name: _registered(name) for name in cache_names() if resolve(name).exact
} | {"kivi-8-full-residual": _kivi8}


@torch.no_grad()
def incremental_chunks(
    model: Any,
    input_ids: torch.Tensor,
    cache: Any,
    prefill_tokens: int,
    progress: Progress | None = None,
    label: str = "decode",
) -> Iterator[tuple[int, torch.Tensor]]:
    """Decode ``input_ids: [batch, tokens]`` through ``cache``: one prefill of ``prefill_tokens`` tokens, then one
    token per forward, yielding ``(first position, logits [batch, n, vocab])`` of each forward as it is computed
    (the caller keeps what it needs: nothing here holds every position's logits).

    ``progress`` is called as each span of :data:`~kvlab.lab.longrun.STEP_TOKENS` decoded tokens starts (the first
    span with the prefill): ``len(spans(prefill_tokens, tokens))`` steps, named after ``label``.

    Raises:
        ValueError: ``prefill_tokens`` outside ``[1, tokens]`` (before any forward).
    """
    tokens = input_ids.shape[1]
    if not 1 <= prefill_tokens <= tokens:
        raise ValueError(f"`prefill_tokens` must be in [1, {tokens}], got {prefill_tokens!r}")
    report = progress or (lambda step: None)
    kw = {cache_kwarg(model): cache, "use_cache": True}
    for i, (a, b) in enumerate(spans(prefill_tokens, tokens)):
        report(
            f"{label}: tokens {1 if i == 0 else a + 1:,}-{b:,} of {tokens:,}"
        )  # the first span: prefill + decode
        if i == 0:
            yield 0, model(input_ids[:, :prefill_tokens], **kw).logits
        for t in range(a, b):
            yield t, model(input_ids[:, t : t + 1], **kw).logits


class _Errors:
    """One cache's logits against the reference, forward by forward: the largest absolute error, the positions
    whose top token matches, and (``dynamic`` given) the largest distance to DynamicCache's logits. Maxima are
    tensors so that a NaN anywhere stays NaN (and fails the check)."""

    def __init__(self, reference: torch.Tensor, top: torch.Tensor, dynamic: torch.Tensor | None):
        self.reference, self.top, self.dynamic = reference, top, dynamic
        self.max_abs = torch.zeros((), device=reference.device)
        self.max_vs_dynamic = None if dynamic is None else torch.zeros((), device=reference.device)
        self.agree = torch.zeros((), dtype=torch.long, device=reference.device)

    def add(self, t: int, logits: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Compare ``logits [batch, n, vocab]`` of positions ``t .. t + n - 1``; copy them into ``keep``."""
        logits = logits.float()
        n = logits.shape[1]
        self.max_abs = torch.maximum(self.max_abs, (logits - self.reference[:, t : t + n]).abs_().amax())
        self.agree += (logits.argmax(-1) == self.top[:, t : t + n]).sum()
        if self.dynamic is not None:
            diff = (logits - self.dynamic[:, t : t + n]).abs_().amax()
            self.max_vs_dynamic = torch.maximum(self.max_vs_dynamic, diff)
        if keep is not None:
            keep[:, t : t + n] = logits

    def row(self, name: str, ref_scale: float, tol: float) -> dict:
        max_abs = float(self.max_abs)
        rel = max_abs / ref_scale if ref_scale > 0 else math.inf
        row = {
            "cache": name,
            "status": "ok",
            "max_abs_err": max_abs,
            "rel_err": rel,
            "argmax_agreement": float(self.agree) / self.top.numel(),
            "passed": bool(rel <= tol),
        }
        if (
            self.max_vs_dynamic is not None
        ):  # the same incremental path as DynamicCache: expect identical logits
            row["max_abs_diff_vs_dynamic"] = float(self.max_vs_dynamic)
        return row


def default_prefill(tokens: int) -> int:
    """Tokens of the first cached forward when none is given: a quarter of the sequence, at least 1."""
    return max(1, tokens // 4)


def check_steps(tokens: int, caches: int | None = None, prefill_tokens: int | None = None) -> int:
    """Steps :func:`check_exact_caches` reports to ``progress``: the reference forward, then each cache's decode
    spans (:func:`~kvlab.lab.longrun.spans`; ``caches`` default: :data:`EXACT_CACHES`)."""
    caches = len(EXACT_CACHES) if caches is None else caches
    prefill = default_prefill(tokens) if prefill_tokens is None else prefill_tokens
    return 1 + caches * len(spans(prefill, tokens))


@torch.no_grad()
def check_exact_caches(
    model: Any,
    input_ids: torch.Tensor,
    *,
    prefill_tokens: int | None = None,
    caches: dict[str, CacheFactory] | None = None,
    rel_tolerance: float | None = None,
    progress: Progress | None = None,
) -> dict:
    """Compare incremental decoding through each cache with one full forward of ``model`` on ``input_ids``.

    Memory: the reference logits, DynamicCache's (kept to compare the others with) and one forward's, all
    float32, besides the model and one cache (:func:`peak_bytes`); each forward is compared as it comes.

    Args:
        model: a transformers causal LM in eval mode.
        input_ids: ``[batch, tokens]`` token ids, no padding.
        prefill_tokens: tokens of the first cached forward; default ``tokens // 4`` (at least 1).
        caches: name -> factory ``(model, tokens) -> Cache``; default :data:`EXACT_CACHES`.
        rel_tolerance: pass threshold on the relative error; default from :data:`TOLERANCE_BY_DTYPE`.
        progress: called with a step's name as it starts (:func:`check_steps` steps).

    Returns:
        ``{"tokens", "prefill_tokens", "batch", "dtype", "rel_tolerance", "ref_scale", "rows": [...],
        "all_passed"}``; each row has ``cache``, ``status`` (``ok``/``failed``/``skipped``), ``max_abs_err``,
        ``rel_err``, ``argmax_agreement`` (fraction of positions whose top token matches), ``passed``,
        ``max_abs_diff_vs_dynamic`` (for caches after ``"dynamic"``: distance to DynamicCache's incremental
        logits) and, when not ok, ``error`` (an unavailable cache class is ``skipped`` with the import error).
    """
    batch, tokens = input_ids.shape
    prefill_tokens = default_prefill(tokens) if prefill_tokens is None else prefill_tokens
    caches = EXACT_CACHES if caches is None else caches
    dtype = next(model.parameters()).dtype
    tol = TOLERANCE_BY_DTYPE.get(dtype, 5e-2) if rel_tolerance is None else rel_tolerance
    report = progress or (lambda step: None)
    report(f"reference: one forward of {batch} x {tokens:,} tokens, no cache")
    reference = model(input_ids, use_cache=False).logits.float()  # [batch, tokens, vocab]
    ref_scale, top = float(reference.abs().max()), reference.argmax(-1)
    rows, dynamic_logits = [], None
    for name, factory in caches.items():
        try:
            cache = factory(model, tokens)
        except ImportError as exc:
            rows.append(
                {"cache": name, "status": "skipped", "passed": None, "error": f"not importable: {exc}"}
            )
            continue
        errors = _Errors(reference, top, None if name == "dynamic" else dynamic_logits)
        keep = torch.empty_like(reference) if name == "dynamic" else None
        try:
            for t, logits in incremental_chunks(model, input_ids, cache, prefill_tokens, report, name):
                errors.add(t, logits, keep)
        except Exception as exc:  # recorded, the other caches still run
            rows.append(
                {"cache": name, "status": "failed", "passed": False, "error": f"{type(exc).__name__}: {exc}"}
            )
            continue
        if keep is not None:
            dynamic_logits = keep
        rows.append(errors.row(name, ref_scale, tol))
    return {
        "tokens": tokens,
        "prefill_tokens": prefill_tokens,
        "batch": batch,
        "dtype": str(dtype).removeprefix("torch."),
        "rel_tolerance": tol,
        "ref_scale": ref_scale,
        "rows": rows,
        "all_passed": all(r["passed"] for r in rows if r["status"] != "skipped"),
    }


def peak_bytes(
    config: Any, *, tokens: int, batch: int, dtype: torch.dtype, prefill_tokens: int | None = None
) -> int:
    """Bytes :func:`check_exact_caches` allocates above the loaded model at its peak, estimated from ``config``'s
    shapes (a transformers config; its text part for a multimodal one). The larger of

    * the reference forward: its activations (``[batch, tokens, 32 hidden + 8 intermediate]`` float32, measured
      ~110 KB per token on SmolLM2-135M) and its logits ``[batch, tokens, vocab]`` in ``dtype``, plus their float32
      copy when ``dtype`` is not float32;
    * the decoding: the reference and DynamicCache's logits ``[batch, tokens, vocab]`` float32 (the term that
      grows: 196 KB per token for SmolLM2's 49,152-token vocabulary), the prefill's logits in ``dtype``, float32
      and their difference, the prefill's activations, and one cache's K/V in ``dtype`` counted twice (a
      ``torch.cat`` cache copies a layer per token).
    """
    vocab = longrun.forward_shape(config)["vocab"]
    item = torch.empty((), dtype=dtype).element_size()
    prefill = default_prefill(tokens) if prefill_tokens is None else prefill_tokens
    logits32 = batch * tokens * vocab * 4
    reference = (
        longrun.activation_bytes(config, batch * tokens)
        + batch * tokens * vocab * item
        + (logits32 if item != 4 else 0)
    )
    kv = 2 * longrun.kv_bytes(config, batch * tokens, item)  # K and V, counted twice
    decode = (
        2 * logits32
        + batch * prefill * vocab * (item + 8)
        + longrun.activation_bytes(config, batch * prefill)
        + kv
    )
    return max(reference, decode)


def fitting_tokens(config: Any, *, batch: int, dtype: torch.dtype, budget: int, upto: int) -> int:
    """The largest ``tokens`` <= ``upto`` whose :func:`peak_bytes` fit in ``budget`` bytes (0: none)."""
    low, high = 0, upto
    while low < high:  # peak_bytes grows with tokens
        mid = (low + high + 1) // 2
        if peak_bytes(config, tokens=mid, batch=batch, dtype=dtype) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def _memory_problem(lm: Any, tokens: int, batch: int) -> str | None:
    """Why a ``[batch, tokens]`` check of ``lm`` would not fit in the available memory, or None."""
    dtype = next(lm.parameters()).dtype
    need = peak_bytes(lm.config, tokens=tokens, batch=batch, dtype=dtype)
    available = provenance.available_memory_bytes()
    if available is None or need <= available:
        return None
    fit = fitting_tokens(lm.config, batch=batch, dtype=dtype, budget=available, upto=tokens)
    vocab = int(text_config(lm.config).vocab_size)
    return longrun.memory_refusal(
        f"`tokens` {tokens:,} x `batch` {batch} (the reference's and DynamicCache's logits [batch, tokens, "
        f"{vocab:,}] in float32, one forward's activations, one cache's K/V)",
        need,
        available,
        f"at most about {fit} tokens fit at `batch` {batch}" if fit else "not even 1 token fits",
    )


def run_real_check(
    model: str | None = None,
    *,
    dtype: str = "float32",
    tokens: int = 96,
    batch: int = 1,
    device: str = "cpu",
    progress: Progress | None = None,
    notify: Progress | None = None,
    note: Progress | None = None,
    allow_past_limit: bool = False,
) -> dict:
    """:func:`check_exact_caches` on a real model (``None``: the bundled reference model) loaded with
    ``kvlab.models.load_model``, over ``batch`` consecutive cuts of ``tokens`` tokens of the bundled held-out text
    (``kvlab.models.heldout_token_ids``). fp32 by default: the check is about the cache, not bf16 rounding.

    Before any forward, once the model is loaded: ``tokens`` past its ``max_position_embeddings`` is refused unless
    ``allow_past_limit`` (:func:`kvlab.lab.longrun.position_refusal`: hours of decoding at sizes like 100,000),
    then warned about (``notify`` gets the line; it is also the result's ``warnings``; the caches must still be
    exact there), a size whose :func:`peak_bytes` exceed the available memory is refused, and a
    reference forward too long to be one short step is warned about (:func:`long_forward_warning`). A check of
    more than :data:`ESTIMATE_TOKENS` tokens then times a few short forwards of its own sequence and says (``note``
    gets the line) how long it will run (:func:`estimate_wall_time`; the result's ``estimate``). ``progress`` is
    called as each step starts: the load, then the :func:`real_check_steps`.

    Raises:
        ValueError: ``tokens`` or ``batch`` < 1, ``tokens`` past the model's positions without
            ``allow_past_limit``, a size the machine's available memory cannot hold (the message
            says how many tokens would fit), or the held-out text is shorter than ``batch * tokens`` tokens.
    """
    from kvlab.models import heldout_token_ids, load_model

    if tokens < 1 or batch < 1:
        raise ValueError(f"`tokens` and `batch` must be >= 1, got {tokens!r} and {batch!r}")
    report = progress or (lambda step: None)
    report(f"loading {longrun.model_label(model)} in {dtype}")
    lm, tokenizer = load_model(model, dtype=dtype, device=device)
    lm.eval()
    limit = longrun.max_positions(lm.config)
    refusal = longrun.position_refusal("`tokens`", tokens, limit, PAST_LIMIT, "`allow_past_limit`")
    if refusal and not allow_past_limit:
        raise ValueError(refusal)
    warning = longrun.position_warning("`tokens`", tokens, limit, PAST_LIMIT)
    if warning and notify is not None:
        notify(warning)
    problem = _memory_problem(lm, tokens, batch)
    if problem:
        raise ValueError(problem)
    long_forward = long_forward_warning(tokens)
    if long_forward and notify is not None:
        notify(long_forward)
    warnings = [w for w in (warning, long_forward) if w]
    rows = [heldout_token_ids(tokenizer, tokens, offset=b * tokens) for b in range(batch)]
    input_ids = torch.tensor(rows, dtype=torch.long, device=device)  # [batch, tokens]
    estimate = estimate_wall_time(lm, input_ids, report, note) if estimating(tokens) else None
    start = time.perf_counter()
    result = check_exact_caches(lm, input_ids, progress=report)
    if estimate is not None:  # what the check then took, beside what was estimated
        result["estimate"] = {**estimate, "measured_s": time.perf_counter() - start}
    result["model"] = "bundled reference model" if model is None else str(model)
    result["warnings"] = warnings
    return result


# what a check past the model's max_position_embeddings does (its warning, its refusal)
PAST_LIMIT = "the check decodes positions the model was not trained on (the caches must still be exact there)"
# a check of more tokens than this gets a wall-time estimate before it starts (as long a reference forward is warned
# about: past it, the check runs for minutes)
ESTIMATE_TOKENS = 4096


def estimating(tokens: int) -> bool:
    """Whether a check of ``tokens`` tokens is timed for an estimate first: more than :data:`ESTIMATE_TOKENS`
    and long enough for two probe contexts (:func:`kvlab.lab.estimate.probe_sizes`)."""
    return tokens > ESTIMATE_TOKENS and probe_sizes(tokens) is not None


def real_check_steps(tokens: int) -> int:
    """Steps :func:`run_real_check` reports after loading: the estimate's probe where :func:`estimating`, then
    :func:`check_steps`."""
    return int(estimating(tokens)) + check_steps(tokens)


def estimate_wall_time(
    lm: Any, input_ids: torch.Tensor, progress: Progress, note: Progress | None = None
) -> dict:
    """Time the probe of :func:`kvlab.lab.estimate.time_probe` on the check's own ``lm`` and ``input_ids
    [batch, tokens]`` (one ``progress`` step), extrapolate to the whole check of :data:`EXACT_CACHES`
    (:func:`kvlab.lab.estimate.fit_estimate`) and give ``note`` its one line.

    Returns:
        :func:`~kvlab.lab.estimate.fit_estimate`'s dict, with the probe's timings (``probe``).
    """
    tokens = input_ids.shape[1]
    sizes = probe_sizes(tokens)
    progress(
        f"timing forwards of {sizes[0]:,} and {sizes[1]:,} tokens and {PROBE_STEPS} decode steps after each, for "
        f"a wall-time estimate"
    )
    probe = time_probe(lm, input_ids, sizes)
    estimate = fit_estimate(
        probe, tokens=tokens, prefill_tokens=default_prefill(tokens), caches=len(EXACT_CACHES)
    )
    if note is not None:
        note(estimate_line(estimate, probe, tokens=tokens, caches=len(EXACT_CACHES)))
    return {**estimate, "probe": asdict(probe)}


# a reference forward longer than this is one silent step of the run: it is said before it starts
LONG_FORWARD_TOKENS = 4096


def long_forward_warning(tokens: int) -> str | None:
    """The warning for a reference forward of more than :data:`LONG_FORWARD_TOKENS` tokens, or None: the exact
    reference is one forward without a cache (cutting it would make it a cache too), so it reports no progress
    until it ends, and its attention work grows with the square of ``tokens``."""
    if tokens <= LONG_FORWARD_TOKENS:
        return None
    return (
        f"`tokens` {tokens:,}: the reference is one forward of {tokens:,} tokens without a cache, a single step "
        f"that reports nothing until it ends (its attention work grows with the square of the tokens); "
        f"`tokens` {LONG_FORWARD_TOKENS} or fewer keeps every step short"
    )
