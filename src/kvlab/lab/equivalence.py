"""Cached decoding vs full recompute on the toy decoder (docs/lab.md).

Four answers, all computed in the run: do both generators emit the same tokens ([A1]); do the cached path's
last logits match one full forward over the right tokens ([A2]); how many matmul FLOPs does each spend ([A3]);
how long does each take on this machine ([A4]).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from kvlab.lab.flops import cached_generation_flops, naive_generation_flops
from kvlab.lab.toy import (
    ToyConfig,
    full_forward_logits,
    generate_cached,
    generate_naive,
    make_prompt,
    make_weights,
    peak_bytes,
)
from kvlab.runtime import provenance
from kvlab.runtime.blas import blas_threads
from kvlab.runtime.checks import check_int
from kvlab.runtime.timing import busy_warnings, default_threads, interleaved, paired_ratio

REL_ERR_TOLERANCE = 1e-5  # max relative error of cached vs full-forward logits: fp32 rounding, not a bug


def toy_steps(repeat: int, warmup: bool = True) -> int:
    """Steps :func:`run_toy_lab` reports to its ``progress`` callback: warm-up, two per round, the reference."""
    return int(warmup) + 2 * repeat + 1


def run_toy_lab(
    cfg: ToyConfig | None = None,
    *,
    repeat: int = 1,
    warmup: bool = True,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run the toy experiment and return a JSON-serializable dict with the mechanics chapter's keys.

    Args:
        cfg: toy decoder and run shape; ``None`` is the mechanics chapter's (GQA 8/2, 16 prompt + 192 new tokens).
        repeat: timed rounds; each round runs both generators, in an order rotated per round
            (:func:`kvlab.runtime.timing.interleaved`). The fastest run of each is reported (``t_naive``,
            ``t_cached`` in seconds), and ``speedup`` is the median over rounds of the same round's
            ``naive / cached`` (:func:`kvlab.runtime.timing.paired_ratio`), so a busy period hits both sides.
        warmup: run the cached generator once untimed first (BLAS threads, allocator), so the first timed
            run does not pay one-off start-up costs.
        threads: BLAS threads numpy uses during the run (:func:`kvlab.runtime.blas.blas_threads`); ``None`` =
            :func:`kvlab.runtime.timing.default_threads`. Recorded as ``threads`` (``blas_threads_set`` False
            when no OpenBLAS was found to set).
        progress: called with a step's name as it starts (``1 + 2 * repeat + 1`` steps, see :func:`toy_steps`).

    Returns:
        ``same_tokens`` (of ``gen``), ``max_diff`` (max |cached - reference| of the last logits), ``ref_scale``
        (max |reference|), ``rel_err`` (their ratio), ``flops_naive``, ``flops_cached``, ``flops_ratio``,
        ``t_naive``, ``t_cached`` (fastest runs), ``speedup`` (paired median of ``naive / cached``), ``seq_end``, ``config``, and the
        ``kv_bytes_per_token`` / ``kv_cache_bytes`` of the preallocated cache; ``rel_err_tolerance`` and
        ``all_passed``: every token the same and ``rel_err`` within :data:`REL_ERR_TOLERANCE`. Timing
        provenance: ``timings_ms`` (per round), ``speedup_paired`` (median/min/max/per-round ratios and the
        unpaired ``t_naive / t_cached``), ``threads`` and ``contention`` (:func:`kvlab.runtime.timing.contention`
        over the timed rounds; ``busy`` True means the wall clock is suspect, and ``warnings`` says so).

    The reference is one full forward over ``prompt + generated[:-1]``: the last logits were computed at the
    second-to-last token (they chose the last one), so feeding the last token too compares the next step's
    logits instead (an off-by-one that makes a correct cache look wrong).

    Raises:
        ValueError: ``repeat`` < 1, ``threads`` < 1, or a run the memory cannot hold (:func:`check_toy_memory`).
    """
    cfg = ToyConfig() if cfg is None else cfg
    check_int("repeat", repeat, 1)
    check_toy_memory(cfg)
    threads = default_threads() if threads is None else threads
    report = progress or (lambda step: None)
    weights, prompt = make_weights(cfg), make_prompt(cfg)
    timings, cont, outputs, set_to = _time_generators(weights, cfg, prompt, repeat, warmup, threads, report)
    tokens_cached, logits_cached = outputs["cached"]
    tokens_naive, _ = outputs["naive"]
    report("reference: one full forward")
    reference = full_forward_logits(weights, cfg, prompt + tokens_cached[:-1])
    same = sum(a == b for a, b in zip(tokens_cached, tokens_naive, strict=True))
    max_diff = float(np.max(np.abs(logits_cached - reference)))
    ref_scale = float(np.max(np.abs(reference)))
    flops_naive, flops_cached = naive_generation_flops(cfg), cached_generation_flops(cfg)
    rel_err = max_diff / ref_scale if ref_scale > 0 else float("inf")
    return {
        "gen": cfg.new_tokens,
        "same_tokens": int(same),
        "first_divergence": next(
            (i for i, (a, b) in enumerate(zip(tokens_cached, tokens_naive)) if a != b), None
        ),
        "max_diff": max_diff,
        "ref_scale": ref_scale,
        "rel_err": rel_err,
        "rel_err_tolerance": REL_ERR_TOLERANCE,
        "all_passed": bool(same == cfg.new_tokens and rel_err <= REL_ERR_TOLERANCE),
        "flops_naive": flops_naive,
        "flops_cached": flops_cached,
        "flops_ratio": flops_naive / flops_cached,
        **_timing_fields(timings, cont, repeat, threads, set_to is not None),
        "seq_end": cfg.max_tokens,
        "kv_bytes_per_token": cfg.kv_bytes_per_token,
        "kv_cache_bytes": cfg.kv_bytes_per_token * cfg.max_tokens,
        "tokens": tokens_cached,
        "config": dataclasses.asdict(cfg),
    }


def check_toy_memory(cfg: ToyConfig, available: int | None = -1) -> None:
    """Refuse a toy run whose :func:`~kvlab.lab.toy.peak_bytes` exceed the ``available`` memory (default:
    :func:`kvlab.runtime.provenance.available_memory_bytes`; ``None``: unknown, no check), before any work.

    Raises:
        ValueError: naming ``new_tokens``, both sizes and the most new tokens that would fit.
    """
    from kvlab.lab import longrun

    available = provenance.available_memory_bytes() if available == -1 else available
    if available is None or peak_bytes(cfg) <= available:
        return
    low, high = 0, cfg.new_tokens  # the most new tokens whose peak fits (0: not even the prompt)
    while low < high:
        mid = (low + high + 1) // 2
        fits = peak_bytes(dataclasses.replace(cfg, new_tokens=mid)) <= available
        low, high = (mid, high) if fits else (low, mid - 1)
    hint = f"at most about {low} new tokens fit" if low else "the prompt alone does not fit"
    problem = longrun.memory_refusal(f"`new_tokens` {cfg.new_tokens:,}", peak_bytes(cfg), available, hint)
    raise ValueError(problem)


def _time_generators(weights, cfg: ToyConfig, prompt: list[int], repeat, warmup, threads, report):
    """Both generators interleaved for ``repeat`` rounds at ``threads`` BLAS threads (after an optional untimed
    warm-up): ``(timings_ms, contention, {"cached"|"naive": last output}, threads set or None)``."""
    outputs: dict[str, tuple] = {}
    generators = {"cached": generate_cached, "naive": generate_naive}
    step_name = {"cached": "KV cache", "naive": "full recompute"}

    def timed(name: str) -> Callable[[], None]:
        def call() -> None:
            outputs[name] = generators[name](weights, cfg, prompt)

        return call

    with blas_threads(threads) as set_to:
        if warmup:
            report("warm-up: KV cache")
            generate_cached(weights, cfg, prompt)
        # cached first in round 1, naive first in round 2, ...: neither always runs first or after the other
        timings, cont = interleaved(
            {name: timed(name) for name in generators},
            repeat,
            threads=threads,
            before=lambda name, r: report(f"round {r + 1}/{repeat}: {step_name[name]}"),
        )
    return timings, cont, outputs, set_to


def _timing_fields(timings: dict, cont: dict, repeat: int, threads: int, blas_set: bool) -> dict:
    """The result's timing keys: fastest runs (s), the paired speed-up and its spread, threads, contention."""
    t_cached, t_naive = min(timings["cached"]) / 1e3, min(timings["naive"]) / 1e3
    paired = paired_ratio(timings["naive"], timings["cached"])
    return {
        "t_naive": t_naive,
        "t_cached": t_cached,
        "speedup": paired["ratio"],
        "speedup_paired": {
            "median": paired["ratio"],
            "min": paired["min"],
            "max": paired["max"],
            "ratios": paired["ratios"],
            "fastest_over_fastest": t_naive / t_cached,
        },
        "timings_ms": timings,
        "repeat": repeat,
        "threads": threads,
        "blas_threads_set": blas_set,
        "contention": cont,
        "warnings": busy_warnings(cont, "the speed-up"),
    }
