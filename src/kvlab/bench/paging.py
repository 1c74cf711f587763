"""Benchmark ``paging``: static admission of a million requests (target < 1 s) and the dynamic simulator's event
rate (target >= 200,000 events/s). The mechanics chapter's own static script takes 0.16 s for 4,000 requests."""

from __future__ import annotations

import math
import time

from kvlab.runtime.checks import check_int

TARGET_STATIC_S = 1.0  # static admission of 1,000,000 requests, both policies
TARGET_EVENTS_PER_S = 200_000.0  # dynamic simulation, every policy
QUICK = {"static_requests": 100_000, "sim_requests": 300, "repeat": 1}  # --quick: a smoke run of seconds


def run(
    static_requests: int = 1_000_000,
    sim_requests: int = 2000,
    rate_per_step: float = 2.0,
    seed: int = 0,
    repeat: int = 3,
    quick: bool = False,
    **_: object,
) -> dict:
    """Time :func:`kvlab.paging.static.static_capacity` on ``static_requests`` heavy-tail requests (best of
    ``repeat``; workload generation timed apart) and :func:`kvlab.paging.simulate.simulate` with the four default
    policies on a Poisson trace of ``sim_requests`` requests (events: arrivals, admissions, decode tokens,
    completions, preemptions). ``quick`` replaces the sizes with :data:`QUICK`. Returns timings, rates, targets
    and ``meets_target``.

    Raises:
        ValueError: ``static_requests`` or ``sim_requests`` below 1, or ``rate_per_step`` not finite and > 0, named
            before anything runs (they were refused by the workload and trace builders under their own names,
            ``n`` and ``n_requests``, the first after the million-request static run), or past the memory.
    """
    if quick:
        static_requests, sim_requests, repeat = (
            QUICK[k] for k in ("static_requests", "sim_requests", "repeat")
        )
    check_int("static_requests", static_requests, 1)
    check_int("sim_requests", sim_requests, 1)
    if not (isinstance(rate_per_step, (int, float)) and math.isfinite(rate_per_step) and rate_per_step > 0):
        raise ValueError(f"`rate_per_step` (--rate) must be finite and > 0, got {rate_per_step!r}")
    _check_memory(static_requests, sim_requests)  # a billion requests filled the memory with no output
    from kvlab.paging.budget import default_budget
    from kvlab.paging.simulate import simulate
    from kvlab.paging.static import static_capacity, workload
    from kvlab.paging.trace import poisson_trace

    budget = default_budget()
    t0 = time.perf_counter()
    lens = workload("heavy", n=static_requests)
    generate_s = time.perf_counter() - t0
    admit_s = float("inf")
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        a = static_capacity(lens, budget, 16)
        admit_s = min(admit_s, time.perf_counter() - t0)

    trace = poisson_trace(sim_requests, rate_per_step, prefix_groups=4, prefix_tokens=512, seed=seed)
    sim = simulate(trace, budget=budget)
    per_policy = {
        name: {
            "events": r["events"],
            "wall_s": r["wall_s"],
            "events_per_s": r["events_per_s"],
            "steps": r["steps"],
            "preemptions": r["preemptions"],
        }
        for name, r in sim["policies"].items()
    }
    events = sum(r["events"] for r in per_policy.values())
    wall = sum(r["wall_s"] for r in per_policy.values())
    min_rate = min(r["events_per_s"] for r in per_policy.values())
    return {
        "static": {
            "requests": static_requests,
            "generate_s": generate_s,
            "admit_s": admit_s,
            "k_cont": a["k_cont"],
            "k_paged": a["k_paged"],
            "target_s": TARGET_STATIC_S,
        },
        "dynamic": {
            "requests": sim_requests,
            "rate_per_step": rate_per_step,
            "events": events,
            "wall_s": wall,
            "events_per_s": events / wall,
            "min_policy_events_per_s": min_rate,
            "policies": per_policy,
            "target_events_per_s": TARGET_EVENTS_PER_S,
        },
        "meets_target": bool(admit_s + generate_s < TARGET_STATIC_S and min_rate >= TARGET_EVENTS_PER_S),
    }


def _check_memory(static_requests: int, sim_requests: int) -> None:
    """Raise ``ValueError`` naming the setting whose request count's memory estimate
    (:func:`kvlab.paging.static.static_memory_bytes`, :func:`kvlab.paging.simulate.simulate_memory_bytes`) passes
    the machine's available memory (a billion requests filled the memory with no output)."""
    from kvlab.lab.longrun import memory_refusal
    from kvlab.paging.simulate import simulate_memory_bytes
    from kvlab.paging.static import static_memory_bytes
    from kvlab.runtime.provenance import available_memory_bytes

    free = available_memory_bytes()
    for name, n, need in (
        ("static_requests", static_requests, static_memory_bytes(static_requests, 1)),
        ("sim_requests", sim_requests, simulate_memory_bytes(sim_requests)),
    ):
        problem = memory_refusal(f"`{name}` {n:,}", need, free, "give fewer requests")
        if problem:
            raise ValueError(problem)
