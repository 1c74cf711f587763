"""A KIVI candidate and its integer-path twin in one ``kvlab eval`` run: ``kivi-4`` and ``kivi-4:dot=int8``.

The twin differs only in the fused CPU kernel's key-score path (:mod:`kvlab.attention.cpu_kernel`: integer dot
products over the packed codes instead of fp32 ones), so what it costs in accuracy is the divergence of its
next-token distributions from its exact twin's, on the same scored continuation (the float cache's greedy tokens,
teacher-forced), beside each one's divergence from the float cache. Each int8 row gets ``exact_twin``
(:func:`twin_entry`); the result's summary gets ``integer_path`` (:func:`integer_path_summary`) and the report one
line per row (:func:`integer_path_lines`). Target: the integer path's KL to its exact twin at most
:data:`TWIN_KL_SHARE` of the exact twin's own KL to the float cache.

Source: llama.cpp's ``llama-perplexity --kl-divergence`` (KL of next-token distributions against a reference run,
mean / 99th percentile / max over positions), :mod:`kvlab.eval.divergence`; docs/EVAL.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvlab.cache_names import CacheName

TWIN_KL_SHARE = 0.10  # KL(exact twin || int8) <= this share of KL(float || exact twin)
TWIN_SETTING = "dot"  # the setting that makes a twin: kivi-4:dot=int8
FLOAT_KERNEL = "dynamic-ckernel"  # the float cache through the float C kernel: its KL to dynamic is the rounding floor


def exact_twin_name(name: CacheName) -> str | None:
    """The exact twin of a candidate naming an integer ``dot`` (``kivi-4:dot=int8`` -> ``"kivi-4"``, its other
    settings kept), or ``None`` for a candidate without one (``dot`` absent or ``exact``)."""
    settings = dict(name.settings)
    if settings.get(TWIN_SETTING, "exact") == "exact":
        return None
    kept = tuple((k, v) for k, v in name.settings if k != TWIN_SETTING)
    return CacheName(
        name.text, name.family, name.nbits, name.variant, kept, name.key_bits, name.value_bits
    ).canonical


def twin_keys(caches: Iterable[tuple[Any, int]]) -> dict[tuple[str, int], tuple[str, int]]:
    """``{(int8 candidate, R): (its exact twin, R)}`` for each candidate of ``caches`` (``(Candidate, R)``, a cell's
    caches) whose exact twin runs in the same cell at the same R."""
    keys = {(c.name, r) for c, r in caches}
    out = {}
    for c, r in caches:
        twin = exact_twin_name(c.cache.name)
        if twin is not None and (twin, r) in keys:
            out[(c.name, r)] = (twin, r)
    return out


def _ran_int8(paths: list | None) -> bool:
    return any(p.startswith("int8") for p in paths or ())


def twin_entry(int8, exact, int8_logits, exact_logits) -> dict:
    """The ``exact_twin`` field of the int8 row: ``KL(exact twin || int8)`` per scored position
    (:func:`kvlab.eval.divergence.kl_summary`: ``kl_mean``, ``kl_p99``, ``kl_max``, ``kl_positions``, nats), the
    ``twin``'s name and what each ran (``key_score_path``), the twin's own ``kl_mean`` to the float cache
    (``own_kl_mean``; the int8 row's is ``int8_kl_mean``), the share,
    and ``met`` (``None`` where the integer path did not run: nothing of it was measured).

    Args:
        int8 / exact: the two :class:`kvlab.eval.measure.Measurement` (``compared`` filled).
        int8_logits / exact_logits: ``[batch, steps, vocab]`` of their fixed continuations (the same positions).
    """
    from kvlab.eval.divergence import (  # torch: this module's summary side is torch-free
        kl_divergence,
        kl_summary,
    )

    own = ((exact.compared or {}).get("kl") or {}).get("kl_mean")
    entry = {
        "twin": exact.candidate.name,
        **kl_summary(kl_divergence(exact_logits, int8_logits)),
        "key_score_path": "; ".join(int8.attention_paths or []) or None,
        "exact_key_score_path": "; ".join(exact.attention_paths or []) or None,
        "own_kl_mean": own,
        "int8_kl_mean": ((int8.compared or {}).get("kl") or {}).get(
            "kl_mean"
        ),  # the int8 row's own KL to float
        "share_of_own_kl": None,
        "target_share": TWIN_KL_SHARE,
        "met": None,
    }
    if not _ran_int8(int8.attention_paths):
        entry["note"] = "the integer path did not run (see key_score_path): this is not its accuracy"
    elif own:
        entry["share_of_own_kl"] = entry["kl_mean"] / own
        entry["met"] = entry["share_of_own_kl"] <= TWIN_KL_SHARE
    return entry


def pair_twins(held: dict, twins: dict) -> None:
    """Give each int8 measurement of ``held`` (``{(name, R): Measurement}``, logits kept in ``quality``) whose
    exact twin (``twins``, :func:`twin_keys`) was measured too its ``compared["exact_twin"]``; then drop the kept
    logits of all of them."""
    for key, twin in twins.items():
        a, b = held.get(key), held.get(twin)
        if a is None or b is None or a.compared is None:
            continue
        la, lb = ((m.quality or {}).get("logits") for m in (a, b))
        if la is not None and lb is not None:
            a.compared["exact_twin"] = twin_entry(a, b, la, lb)
    for meas in held.values():
        (meas.quality or {}).pop("logits", None)


def integer_path_summary(rows: list[dict]) -> dict | None:
    """The result summary's ``integer_path``: the target and, per int8 row of the capacity matrix, its context,
    candidate, twin, KLs and ``met``; ``status`` ``met`` / ``not met`` over the rows with a verdict (``not
    measured`` where none has one: the integer path ran in none, or the twin's own KL is 0). ``None`` for
    a run without an int8 twin (the summary then has no such key)."""
    mine = [r for r in rows if r.get("exact_twin") and r.get("matrix") == "capacity"]
    if not mine:
        return None
    per_row = [
        {"context_length": r["context_length"], "candidate": r["candidate"], **r["exact_twin"]} for r in mine
    ]
    verdicts = [p["met"] for p in per_row if p["met"] is not None]  # a row where int8 did not run: no verdict
    status = "not measured" if not verdicts else "met" if all(verdicts) else "not met"
    return {
        "target": f"KL(exact twin || int8) <= {TWIN_KL_SHARE:.0%} of the exact twin's KL(float || twin)",
        "status": status,
        "rows": per_row,
    }


def _floor_clause(result: dict, context: int) -> str:
    """The rounding floor beside an integer-path line: ``dynamic-ckernel``'s KL to the float cache at ``context``
    (the same attention summed in another order) where the run has that row; else, in a run of a 16-bit dtype
    (where the floor is near the integer path's own KL), a pointer to it; ``""`` in a float32 run without it."""
    for r in result.get("rows", []):
        if r.get("matrix") == "capacity" and r.get("context_length") == context and r.get("candidate") == FLOAT_KERNEL:
            if r.get("kl_mean") is not None:
                return f"; rounding floor: KL(dynamic || {FLOAT_KERNEL}) {r['kl_mean']:.3g}"
    dtype = (result.get("settings") or {}).get("dtype")
    if dtype in (None, "float32"):
        return ""
    return (
        f"; a {dtype} run sits near a rounding floor: add {FLOAT_KERNEL} to measure it (docs/EVAL.md, "
        f"The CPU kernel's integer path)"
    )


def integer_path_lines(result: dict) -> list[str]:
    """One report line per int8 row of the capacity matrix (:func:`integer_path_summary`), none without twins,
    each with the run's rounding floor beside it (:func:`_floor_clause`)."""
    summary = (result.get("summary") or {}).get("integer_path") or integer_path_summary(
        result.get("rows", [])
    )
    if not summary:
        return []
    lines = []
    for p in summary["rows"]:
        share = "-" if p["share_of_own_kl"] is None else f"{p['share_of_own_kl']:.1%}"
        verdict = {True: "met", False: "not met", None: "not measured"}[p["met"]]
        own, mine = ("-" if p.get(k) is None else f"{p[k]:.3g}" for k in ("own_kl_mean", "int8_kl_mean"))
        lines.append(
            f"integer path at {p['context_length']}: KL({p['twin']} || {p['candidate']}) {p['kl_mean']:.3g} nats = "
            f"{share} of {p['twin']}'s own KL {own} to the float cache ({p['candidate']}'s: {mine}; target <= "
            f"{p['target_share']:.0%}: {verdict}; ran {p['key_score_path'] or 'nothing'})"
            + _floor_clause(result, p["context_length"])
        )
    return lines
