"""Bit allocation under a byte budget: per layer, the formats of K and V that minimize the predicted damage.

Input: a sensitivity sweep (``kvlab sensitivity``: ``kl[format][half][layer]``, the KL of the continuation when
only that layer's keys or values are compressed) and a budget in bytes at a context. The predicted damage of a
plan is the sum of its choices' single-layer KLs (the first-order, additive model of KVTuner / ZipCache-style
allocation; the eval measures the real one). Each layer takes one pair of :mod:`kvlab.plan.mixed` formats of one
family: KIVI with key and value bits apart (every pair of the swept KIVI widths), FP8 for both (when swept), or
float for both (damage 0). Bytes are exact (:func:`kvlab.plan.mixed.plan_layer_bytes`), so the plan holds at most
the budget at that context.

The choice is a multiple-choice knapsack solved by dynamic programming over the budget cut into ``resolution``
units (each option's bytes rounded down, then the exact bytes of the result checked against the budget and the
programme rerun one unit tighter while they exceed it), so a uniform plan whose bytes equal the budget stays a
candidate.

Pure Python; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.plan.kv_formats import kv_dtype
from kvlab.plan.ledger import kv_bytes
from kvlab.plan.mixed import family, ledger_name, plan_layer_bytes
from kvlab.plan.spec import ModelSpec


def layer_options(formats: Sequence[str]) -> list[tuple[str, str]]:
    """The ``(k, v)`` pairs a layer may take given the swept ``formats``: every pair of KIVI formats, FP8 for both,
    float for both (always)."""
    kivi = [f for f in formats if family(f) == "kivi"]
    out = [(k, v) for k in kivi for v in kivi]
    out += [(f, f) for f in formats if family(f) == "fp8"]
    return out + [("float", "float")]


def budget_bytes(
    spec: ModelSpec,
    budget: str,
    tokens: int,
    *,
    group_size: int = KIVI_DEFAULTS.group_size,
    residual_length: int = KIVI_DEFAULTS.residual_length,
) -> int:
    """Bytes of a budget written as a fraction of the float cache (``"0.3"``) or as a uniform cache whose bytes to
    match (``"kivi-4"``, ``"kivi-k4v2"``: 3 code bits on average, ``"fp8-e4m3"``), for one sequence of ``tokens``.

    Raises:
        ValueError: a fraction outside (0, 1], or a name ``kvlab plan --kv-dtype`` does not size (named).
    """
    text = str(budget).strip()
    try:
        fraction = float(text)
    except ValueError:
        fraction = None
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise ValueError(f"`budget` {budget!r}: a fraction of the float cache must be in (0, 1]")
        return math.floor(fraction * kv_bytes(spec, tokens, 1, kv_dtype("auto", spec.dtype)))
    try:
        kvd = kv_dtype(text, spec.dtype, group_size=group_size, residual_length=residual_length)
    except ValueError as exc:
        raise ValueError(
            f"`budget` {budget!r} is neither a fraction in (0, 1] nor a cache name: {exc}"
        ) from None
    return kv_bytes(spec, tokens, 1, kvd)


def _damage(kl: Mapping, pair: tuple[str, str], layer: int) -> float:
    return sum(0.0 if fmt == "float" else float(kl[fmt][half][layer]) for half, fmt in zip("kv", pair))


def allocate(
    spec: ModelSpec,
    kl: Mapping,
    budget: int,
    tokens: int,
    *,
    group_size: int = KIVI_DEFAULTS.group_size,
    residual_length: int = KIVI_DEFAULTS.residual_length,
    resolution: int = 4000,
) -> dict[str, Any]:
    """The plan of least predicted damage within ``budget`` bytes for one sequence of ``tokens`` tokens.

    Args:
        spec: the model (every layer full attention).
        kl: ``{format: {"k": [per layer], "v": [per layer]}}`` nats (a sweep's ``"kl"``).
        budget: bytes the plan may hold (:func:`budget_bytes`).
        group_size, residual_length: KIVI ``G`` and ``R`` of the run the plan is for.
        resolution: budget units of the dynamic programme (more: closer to the exact optimum, slower).

    Returns:
        ``{"layers": {"0": {"k": .., "v": ..}, ...}`` (a plan file's ``layers``), ``"predicted_kl"`` (sum of the
        chosen single-layer KLs), ``"plan_bytes"``, ``"budget_bytes"``, ``"uniform"`` (each uniform option's bytes
        and predicted KL, for comparison)}.

    Raises:
        ValueError: ``kl`` without a layer count matching the model; a budget below the smallest plan (every layer
            at its cheapest option: the message names both byte counts).
    """
    formats = list(kl)
    n = len(spec.layer_kinds)
    for fmt in formats:
        if any(len(kl[fmt][h]) != n for h in "kv"):
            raise ValueError(f"the sweep's {fmt} results do not hold {n} layers (the model's)")
    options = layer_options(formats)
    cost = {
        pair: plan_layer_bytes(
            spec, [pair] * n, tokens, group_size=group_size, residual_length=residual_length
        )[0]
        for pair in options
    }
    cheapest = min(options, key=lambda pair: cost[pair])
    if budget < cost[cheapest] * n:
        raise ValueError(
            f"`budget` {budget:,} B is below the smallest plan: every layer {cheapest[0]}/{cheapest[1]}, "
            f"{cost[cheapest] * n:,} B at {tokens:,} tokens"
        )
    unit = max(1, budget // resolution)
    units = {
        pair: cost[pair] // unit for pair in options
    }  # rounded down: a plan at the budget stays in reach
    top = budget // unit
    while (
        True
    ):  # the exact bytes decide; rounding down can overshoot by under n units: take a unit off and retry
        chosen = _knapsack(n, options, units, top, lambda layer, pair: _damage(kl, pair, layer))
        if sum(cost[pair] for pair in chosen) <= budget:
            break
        top -= 1
    plan_bytes = sum(cost[pair] for pair in chosen)
    assert plan_bytes <= budget
    uniform = {
        ledger_name(*pair): {
            "bytes": cost[pair] * n,
            "predicted_kl": sum(_damage(kl, pair, i) for i in range(n)),
        }
        for pair in options
    }
    return {
        "layers": {str(i): {"k": k, "v": v} for i, (k, v) in enumerate(chosen)},
        "predicted_kl": sum(_damage(kl, pair, i) for i, pair in enumerate(chosen)),
        "plan_bytes": plan_bytes,
        "budget_bytes": budget,
        "tokens": tokens,
        "group_size": group_size,
        "residual_length": residual_length,
        "uniform": uniform,
    }


def _knapsack(n: int, options: list, units: Mapping, top: int, damage) -> list:
    """Multiple-choice knapsack: one option per layer, total ``units`` at most ``top``, least summed
    ``damage(layer, option)``; dynamic programming over the units used so far."""
    best = [0.0] + [math.inf] * top  # best[u]: least damage of the layers so far in exactly u units
    picks: list[list[Any]] = []
    for layer in range(n):
        new = [math.inf] * (top + 1)
        pick: list[Any] = [None] * (top + 1)
        costs = [(pair, units[pair], damage(layer, pair)) for pair in options]
        for u, so_far in enumerate(best):
            if so_far == math.inf:
                continue
            for pair, extra, d in costs:
                v = u + extra
                if v <= top and so_far + d < new[v]:
                    new[v], pick[v] = so_far + d, (pair, u)
        best = new
        picks.append(pick)
    u = min(range(top + 1), key=lambda i: best[i])
    chosen = []
    for layer in reversed(range(n)):
        pair, u = picks[layer][u]
        chosen.append(pair)
    return chosen[::-1]


def mixed_verdict(rows: Sequence[Mapping]) -> list[dict[str, Any]]:
    """Whether each mixed cache of an eval run beat every uniform cache of equal or fewer bytes, on the same prompts.

    Args:
        rows: a ``kvlab eval`` result's ``rows`` (capacity cells: ``candidate``, ``context_length``,
            ``cache_bytes``, ``kl_mean``, ``recall_drop``, ``passkey_drop``).

    Returns:
        One dict per mixed candidate (``mixed-*``) and context: ``candidate``, ``context_length``, ``cache_bytes``,
        ``kl_mean``, ``recall_drop``, ``passkey_drop``, ``against`` (each quantizing non-mixed candidate of the same
        context holding at most its bytes: its name, bytes, the three measures and ``beaten``: lower KL and no
        larger recall or passkey drop) and ``wins`` (every one beaten, and at least one compared).
    """
    measures = ("kl_mean", "recall_drop", "passkey_drop")
    cells = [r for r in rows if r.get("matrix") == "capacity" and r.get("kl_mean") is not None]
    out = []
    for m in (r for r in cells if str(r["candidate"]).startswith("mixed-")):
        against = []
        for u in cells:
            name = str(u["candidate"])
            if name == "dynamic" or name.startswith("mixed-") or u["context_length"] != m["context_length"]:
                continue
            if u["cache_bytes"] > m["cache_bytes"]:
                continue
            beaten = m["kl_mean"] < u["kl_mean"] and all(
                (m.get(k) or 0.0) <= (u.get(k) or 0.0) for k in ("recall_drop", "passkey_drop")
            )
            against.append(
                {
                    "candidate": name,
                    "cache_bytes": u["cache_bytes"],
                    **{k: u.get(k) for k in measures},
                    "beaten": beaten,
                }
            )
        out.append(
            {
                "candidate": m["candidate"],
                "context_length": m["context_length"],
                "cache_bytes": m["cache_bytes"],
                **{k: m.get(k) for k in measures},
                "against": against,
                "wins": bool(against) and all(a["beaten"] for a in against),
            }
        )
    return out
