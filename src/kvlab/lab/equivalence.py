"""Cached decoding vs full recompute on the toy decoder: the mechanics chapter's experiment [A] (§04, §09).

Four answers, all computed in the run: do both generators emit the same tokens ([A1]); do the cached path's
last logits match one full forward over the right tokens ([A2]); how many matmul FLOPs does each spend ([A3]);
how long does each take on this machine ([A4]).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from kvlab.lab.flops import cached_generation_flops, naive_generation_flops
from kvlab.lab.toy import (
    ToyConfig,
    full_forward_logits,
    generate_cached,
    generate_naive,
    make_prompt,
    make_weights,
)

REL_ERR_TOLERANCE = 1e-5  # max relative error of cached vs full-forward logits: fp32 rounding, not a bug


def _best_seconds(fn, repeat: int):
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def run_toy_lab(cfg: ToyConfig | None = None, *, repeat: int = 1, warmup: bool = True) -> dict:
    """Run the toy experiment and return a JSON-serializable dict with the mechanics chapter's keys.

    Args:
        cfg: toy decoder and run shape; ``None`` is the mechanics chapter's (GQA 8/2, 16 prompt + 192 new tokens).
        repeat: timed runs of each generator; the fastest is reported (``t_naive``, ``t_cached`` in seconds).
        warmup: run the cached generator once untimed first (BLAS threads, allocator), so the first timed
            run does not pay one-off start-up costs.

    Returns:
        ``same_tokens`` (of ``gen``), ``max_diff`` (max |cached - reference| of the last logits), ``ref_scale``
        (max |reference|), ``rel_err`` (their ratio), ``flops_naive``, ``flops_cached``, ``flops_ratio``,
        ``t_naive``, ``t_cached``, ``speedup`` (``t_naive / t_cached``), ``seq_end``, ``config``, and the
        ``kv_bytes_per_token`` / ``kv_cache_bytes`` of the preallocated cache; ``rel_err_tolerance`` and
        ``all_passed``: every token the same and ``rel_err`` within :data:`REL_ERR_TOLERANCE`.

    The reference is one full forward over ``prompt + generated[:-1]``: the last logits were computed at the
    second-to-last token (they chose the last one), so feeding the last token too compares the next step's
    logits instead — the mechanics chapter's off-by-one (§09 item 1).

    Raises:
        ValueError: ``repeat`` < 1.
    """
    cfg = ToyConfig() if cfg is None else cfg
    if repeat < 1:
        raise ValueError(f"`repeat` must be >= 1, got {repeat!r}")
    weights, prompt = make_weights(cfg), make_prompt(cfg)
    if warmup:
        generate_cached(weights, cfg, prompt)
    t_cached, (tokens_cached, logits_cached) = _best_seconds(
        lambda: generate_cached(weights, cfg, prompt), repeat
    )
    t_naive, (tokens_naive, _) = _best_seconds(lambda: generate_naive(weights, cfg, prompt), repeat)

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
        "t_naive": t_naive,
        "t_cached": t_cached,
        "speedup": t_naive / t_cached,
        "repeat": repeat,
        "seq_end": cfg.max_tokens,
        "kv_bytes_per_token": cfg.kv_bytes_per_token,
        "kv_cache_bytes": cfg.kv_bytes_per_token * cfg.max_tokens,
        "tokens": tokens_cached,
        "config": dataclasses.asdict(cfg),
    }
