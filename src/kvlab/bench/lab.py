"""Benchmark ``lab``: cached-vs-full wall-clock ratio of the mechanics chapter's toy decoder (target: >= 16x;
docs/PERFORMANCE.md, "lab"), plus the append-cost curves."""

from __future__ import annotations

TARGET_SPEEDUP = 16.0  # the cached path at least 16x faster than full recompute
QUICK = {"new_tokens": 48, "repeat": 1, "append": False}  # --quick: a smoke run of seconds


def run(
    kv_heads: int = 2,
    new_tokens: int = 192,
    repeat: int = 3,
    append: bool = True,
    quick: bool = False,
    threads: int | None = None,
    **_: object,
) -> dict:
    """Time both generators ``repeat`` times each (best run counts, after one untimed warm-up of the cached path)
    and report the mechanics chapter's keys plus ``target_speedup`` and ``meets_target``; with ``append``, also the per-step
    append cost of a growing ``torch.cat`` cache vs a preallocated one (:func:`kvlab.lab.append.measure_append_cost`).
    ``quick`` replaces ``new_tokens``, ``repeat`` and ``append`` with :data:`QUICK`. ``threads``: BLAS/torch
    threads of both measurements (``None``: :func:`kvlab.runtime.timing.default_threads`); the two generators
    are interleaved per round and the speed-up is their paired median (:func:`kvlab.lab.run_toy_lab`).
    """
    if quick:
        new_tokens, repeat, append = (QUICK[k] for k in ("new_tokens", "repeat", "append"))
    from kvlab.lab import ToyConfig, run_toy_lab

    result = run_toy_lab(ToyConfig(kv_heads=kv_heads, new_tokens=new_tokens), repeat=repeat, threads=threads)
    result.pop("tokens")
    result["target_speedup"] = TARGET_SPEEDUP
    result["meets_target"] = bool(result["speedup"] >= TARGET_SPEEDUP)
    if append:
        from kvlab.lab.append import measure_append_cost

        result["append"] = measure_append_cost(threads=threads)
    return result
