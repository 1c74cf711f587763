"""How long ``kvlab lab --real`` will run, from timings taken in that run before its long work starts.

The check (:func:`kvlab.lab.exactness.check_exact_caches`) is one forward of ``tokens`` tokens without a cache (the
reference), then, for each exact cache, a prefill of ``prefill_tokens`` tokens and one single-token forward per
remaining position. A forward of ``n`` tokens costs about ``a·n + b·n²`` (the weights' work per token, attention
over every earlier token); a decode step at context ``t`` costs about ``c + d·t`` (the weights and the per-layer
calls, then reading, and for a ``torch.cat`` cache copying, every cached token). :func:`time_probe` measures both at
two short contexts on the run's own model and tokens; :func:`fit_estimate` fits ``a, b, c, d`` through them and adds
the check's forwards up: so the decode phase grows as ``tokens²`` and the reference forward up to ``tokens²``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kvlab.caches.registry import make_cache
from kvlab.runtime.hf_api import cache_kwarg

PROBE_LONGEST = 2048  # the longer probe context, at most (the shorter is an eighth of it)
PROBE_STEPS = 5  # decode steps timed after each probe prefill (their median is the step time)
PROBE_FORWARDS = 3  # prefills timed at each probe context (their median is the forward time)


@dataclass(frozen=True)
class ProbeTimes:
    """Timings of :func:`time_probe`, seconds.

    Attributes:
        tokens: the two probe contexts ``(n1, n2)``, ``n1 < n2`` (tokens).
        forward_s: one forward of ``n`` tokens into an empty DynamicCache (a median), for ``n1`` and ``n2``.
        step_s: the median single-token forward right after it (context ``n``), for ``n1`` and ``n2``.
    """

    tokens: tuple[int, int]
    forward_s: tuple[float, float]
    step_s: tuple[float, float]


def probe_sizes(tokens: int) -> tuple[int, int] | None:
    """The probe contexts ``(n1, n2)`` for a check of ``tokens`` tokens: ``n2 = min(PROBE_LONGEST, tokens // 2)``
    and ``n1 = n2 // 8`` (at least 1), so that ``n2 + PROBE_STEPS`` tokens of the run's sequence exist; None for a
    sequence too short for two distinct contexts."""
    n2 = min(PROBE_LONGEST, tokens // 2)
    n1 = max(1, n2 // 8)
    if n1 >= n2 or n2 + PROBE_STEPS > tokens:
        return None
    return n1, n2


@torch.no_grad()
def time_probe(
    model: Any, input_ids: torch.Tensor, sizes: tuple[int, int], clock: Callable[[], float] = time.perf_counter
) -> ProbeTimes:
    """Time, for each context ``n`` of ``sizes``, a forward of ``input_ids[:, :n]`` into a new DynamicCache (the
    median of :data:`PROBE_FORWARDS`) and the :data:`PROBE_STEPS` single-token forwards after the last one (their
    median), after one untimed prefill and step of a few tokens (a first call's one-off setup is not
    extrapolated).

    Args:
        model: the check's causal LM, in eval mode.
        input_ids: the check's ``[batch, tokens]`` ids; at least ``max(sizes) + PROBE_STEPS`` tokens.
        sizes: ``(n1, n2)`` of :func:`probe_sizes`.
        clock: seconds (``time.perf_counter``).

    Raises:
        ValueError: ``input_ids`` is shorter than ``max(sizes) + PROBE_STEPS`` tokens.
    """
    need = max(sizes) + PROBE_STEPS
    if input_ids.shape[1] < need:
        raise ValueError(f"the probe needs {need} tokens, the sequence has {input_ids.shape[1]}")
    forward, step = [], []
    for n in (min(sizes[0], 16), *sizes):  # the first, untimed: the first calls' setup
        for _ in range(PROBE_FORWARDS):
            kw = {cache_kwarg(model): make_cache("dynamic", model.config), "use_cache": True}
            start = clock()
            model(input_ids[:, :n], **kw)
            forward.append(clock() - start)
        steps = []
        for t in range(n, n + PROBE_STEPS):
            start = clock()
            model(input_ids[:, t : t + 1], **kw)
            steps.append(clock() - start)
        step.append(statistics.median(steps))
    medians = [statistics.median(forward[i : i + PROBE_FORWARDS]) for i in range(0, len(forward), PROBE_FORWARDS)]
    return ProbeTimes(tuple(sizes), (medians[1], medians[2]), (step[1], step[2]))


def _line_through(x: tuple[int, int], y: tuple[float, float]) -> tuple[float, float]:
    """``(intercept, slope)`` of the line through ``(x[0], y[0])`` and ``(x[1], y[1])``, the slope no less than 0
    (a timing that did not grow, noise at such short contexts, is read as flat at the longer context's value) and
    the intercept no less than 0."""
    slope = max(0.0, (y[1] - y[0]) / (x[1] - x[0]))
    intercept = max(0.0, y[1] - slope * x[1])
    return intercept, slope


def fit_estimate(probe: ProbeTimes, *, tokens: int, prefill_tokens: int, caches: int) -> dict:
    """The check's wall time extrapolated from ``probe``: a forward of ``n`` tokens as ``a·n + b·n²`` through the
    two probe forwards (``a, b`` from the line through their seconds per token), a decode step at context ``t`` as
    ``c + d·t`` through the two probe steps, both no less than 0.

    Args:
        probe: :func:`time_probe`'s timings.
        tokens / prefill_tokens: the check's sequence and prefill lengths (tokens).
        caches: the caches the check decodes through.

    Returns:
        ``{"reference_s"`` (the reference forward, ``a·T + b·T²``), ``"per_cache_s"`` (a prefill of
        ``prefill_tokens`` and the steps at contexts ``prefill_tokens .. tokens - 1``), ``"total_s"`` (the reference
        and every cache), ``"forward_s_per_token"`` ``(a, b)``, ``"step_s"`` ``(c, d)}``, seconds.

    Raises:
        ValueError: ``prefill_tokens`` outside ``[1, tokens]`` or ``caches`` < 0.
    """
    if not 1 <= prefill_tokens <= tokens:
        raise ValueError(f"`prefill_tokens` must be in [1, {tokens}], got {prefill_tokens!r}")
    if caches < 0:
        raise ValueError(f"`caches` must be >= 0, got {caches!r}")
    n = probe.tokens
    a, b = _line_through(n, (probe.forward_s[0] / n[0], probe.forward_s[1] / n[1]))
    c, d = _line_through(n, probe.step_s)
    decoded = tokens - prefill_tokens
    contexts = (prefill_tokens + tokens - 1) * decoded / 2  # the sum of prefill_tokens .. tokens - 1
    per_cache = a * prefill_tokens + b * prefill_tokens**2 + c * decoded + d * contexts
    reference = a * tokens + b * tokens**2
    return {
        "reference_s": reference,
        "per_cache_s": per_cache,
        "total_s": reference + caches * per_cache,
        "forward_s_per_token": (a, b),
        "step_s": (c, d),
    }


def duration(seconds: float) -> str:
    """``seconds`` in the unit a reader plans with: ``42 s``, ``17 min``, ``2.6 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate_line(estimate: dict, probe: ProbeTimes, *, tokens: int, caches: int) -> str:
    """The one line said before the check starts: the estimate of :func:`fit_estimate` and the timings of this run
    it is extrapolated from."""
    (n1, n2), (f1, f2), (s1, s2) = probe.tokens, probe.forward_s, probe.step_s
    return (
        f"estimated wall time about {duration(estimate['total_s'])}: the reference forward of {tokens:,} tokens "
        f"about {duration(estimate['reference_s'])}, then each of {caches} caches' decoding about "
        f"{duration(estimate['per_cache_s'])} (it grows as tokens²), extrapolated from this run: forwards of "
        f"{n1:,} and {n2:,} tokens took {f1:.3f} s and {f2:.3f} s, a decode step {s1 * 1000:.1f} ms at {n1:,} "
        f"tokens and {s2 * 1000:.1f} ms at {n2:,} (DynamicCache's, standing in for every cache's)"
    )
