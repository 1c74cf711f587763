"""Whether a long-context verdict is inside the probe's noise: a recall or passkey drop that passes (or fails) its
gate by less than the sampling error of that drop.

The recall and passkey gates compare two accuracies measured on a finite sample (62 scored tokens a recall distance,
100 passkey trials by default), so a drop has a standard error of ``sqrt(p1 (1 - p1) / n + p2 (1 - p2) / n)`` (the
normal approximation for a difference of two proportions; each token or trial counted as an independent Bernoulli
draw, which understates the error of tokens from one copied span). A verdict whose distance to the gate is under
1.96 of those errors could flip on another sample of prompts: the report says so, and what to raise.
Pure functions on a result dict; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kvlab.runtime.checks import check_int

Z95 = 1.96  # two-sided 95 % normal quantile


def drop_standard_error(base: float, cand: float, n: int) -> float:
    """Standard error of ``base - cand`` for two accuracies each measured on ``n`` independent draws.

    Raises:
        ValueError: ``n`` < 1 or an accuracy outside [0, 1].
    """
    check_int("n", n, 1)
    for name, p in (("base", base), ("cand", cand)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"`{name}` must be an accuracy in [0, 1], got {p!r}")
    return math.sqrt(base * (1 - base) / n + cand * (1 - cand) / n)


def _recall_drop(row: Mapping) -> tuple[float, float, float, int] | None:
    """``(drop, base accuracy, candidate accuracy, scored tokens)`` at the row's worst recall distance."""
    distances = (row.get("recall") or {}).get("distances") or []
    if not distances:
        return None
    worst = max(distances, key=lambda d: d.get("accuracy_drop") or 0.0)
    drop, acc, n = worst.get("accuracy_drop"), worst.get("accuracy"), worst.get("scored_tokens")
    if drop is None or acc is None or not n:
        return None
    return drop, min(1.0, max(0.0, acc + drop)), acc, int(n)


def _passkey_drop(row: Mapping) -> tuple[float, float, float, int] | None:
    """``(drop, base accuracy, candidate accuracy, trials)`` of the row's passkey grid."""
    passkey = row.get("passkey") or {}
    drop, acc, n = row.get("passkey_drop"), passkey.get("accuracy"), passkey.get("trials")
    if drop is None or acc is None or not n:
        return None
    return drop, min(1.0, max(0.0, acc + drop)), acc, int(n)


_PROBES = (
    (
        "recall",
        "recall_drop",
        "max_recall_drop",
        _recall_drop,
        "scored tokens at its worst distance",
        "--recall-rows",
    ),
    ("passkey", "passkey_drop", "max_passkey_drop", _passkey_drop, "trials", "--passkey-trials"),
)


def close_calls(row: Mapping, gates: Mapping) -> list[dict[str, Any]]:
    """The long-context gates of ``row`` whose verdict lies within 1.96 standard errors of the gate.

    Returns:
        one dict per such gate: ``probe`` ("recall" / "passkey"), ``drop``, ``gate``, ``standard_error``, ``n``,
        ``passed`` and ``flag`` (the option that adds samples).
    """
    found = []
    for probe, gate_key, limit_key, read, unit, flag in _PROBES:
        verdict, limit = (row.get("gates") or {}).get(gate_key), gates.get(limit_key)
        measured = read(row)
        if verdict is None or limit is None or measured is None:
            continue
        drop, base, cand, n = measured
        se = drop_standard_error(base, cand, n)
        if abs(limit - drop) < Z95 * se:
            found.append(
                {
                    "probe": probe,
                    "drop": drop,
                    "gate": limit,
                    "standard_error": se,
                    "n": n,
                    "unit": unit,
                    "passed": bool(verdict),
                    "flag": flag,
                }
            )
    return found


def _row_of(result: Mapping, selected: Mapping) -> Mapping | None:
    for row in result.get("rows", []):
        if (
            row.get("matrix") == "capacity"
            and row.get("candidate") == selected.get("candidate")
            and row.get("context_length") == selected.get("context_length")
            and row.get("residual_length") == selected.get("residual_length")
        ):
            return row
    return None


def margin_warning(result: Mapping) -> str | None:
    """One line when the decision rests on a long-context verdict inside the probe's noise: the selected row passes
    a recall/passkey gate by less than 1.96 standard errors of its drop, or a capacity row that fails only such gates
    fails them by less than that; None otherwise (or when nothing was selected and nothing is close)."""
    gates = result.get("gates") or {}
    parts = []
    selected = (result.get("summary") or {}).get("selected_candidate")
    row = _row_of(result, selected) if isinstance(selected, Mapping) else None
    if row is not None:
        parts += [_describe(row, c, "passes") for c in close_calls(row, gates) if c["passed"]]
    for other in result.get("rows", []):
        if other.get("matrix") != "capacity" or other is row or other.get("eligible", True):
            continue
        failed = [k for k, v in (other.get("gates") or {}).items() if v is False]
        calls = {c["probe"] + "_drop": c for c in close_calls(other, gates) if not c["passed"]}
        if failed and all(k in calls for k in failed):  # rejected by close calls only
            parts += [_describe(other, calls[k], "fails") for k in failed]
    if not parts:
        return None
    flags = sorted({p[1] for p in parts})
    return (
        "; ".join(p[0] for p in parts)
        + f": inside the probes' sampling error (1.96 standard errors), so another sample of prompts could flip it; "
        f"raise {' and '.join(flags)} before relying on it"
    )


def _describe(row: Mapping, call: Mapping, verb: str) -> tuple[str, str]:
    where = f"{row.get('candidate')} at {row.get('context_length'):,}"
    text = (
        f"{where} {verb} the {call['probe']} gate ({call['probe']} drop {call['drop']:.3f} against "
        f"{call['gate']:.2f}, standard error {call['standard_error']:.3f} over {call['n']} {call['unit']})"
    )
    return text, call["flag"]
