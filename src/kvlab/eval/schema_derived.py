"""The derived fields of a ``kvlab eval`` result checked against the fields they derive from.

``kvlab report`` prints a row's ``cache_bytes_ratio``, ``recall_accuracy`` and the summary's
``eligible_candidate_count`` beside the gates judged on other fields (``cache_bytes_saved``, ``recall_drop``, each
row's ``eligible``); a hand-edited or stale derived field would print a number the verdict was not made on. Each
derivation is the one that wrote it: :func:`kvlab.eval.rows._paired` (``dynamic_cache_bytes``,
``cache_bytes_ratio``, ``cache_bytes_saved``), :func:`kvlab.eval.measure` ``compared`` fields (``nll_delta``,
``nll_ratio``), :func:`kvlab.eval.longctx.scoring.long_context_fields` (``recall_accuracy``, ``recall_drop``,
each distance's ``accuracy_drop``, ``recall_nll_delta``, ``passkey_accuracy``, ``passkey_drop``) and
:func:`kvlab.eval.decision.summarize` (``eligible_candidate_count``, ``memory_reduction_onset_context``,
``eligible_crossover_context``). Called by :func:`kvlab.eval.schema.validate_result` once every field is of its
type.
"""

from __future__ import annotations

import json
import math

# the same float computation gives the same float; JSON round-trips them exactly. The tolerance only forgives a
# file written by another float library, never a changed number.
_REL, _ABS = 1e-9, 1e-12


def _differs(stored: object, derived: float | None) -> bool:
    if stored is None or derived is None:
        return False
    return not math.isclose(stored, derived, rel_tol=_REL, abs_tol=_ABS)


# the significant digits a message shows a float at (0.0322581, not 0.032258064516129004)
_DIGITS = 6


def _at(value: object, digits: int = _DIGITS) -> str:
    """A finite float at ``digits`` significant digits, still a float (``0.0``, as the file writes it, not ``0``);
    an int, None or NaN as its repr."""
    if isinstance(value, float) and math.isfinite(value):
        text = f"{value:.{digits}g}"
        return text if any(c in text for c in ".e") else text + ".0"
    return repr(value)


def shown_apart(a: object, b: object) -> tuple[str, str]:
    """Two numbers as a message shows a stored one beside the one it is judged or derived against: floats at 6
    significant digits, more where 6 would print two different numbers alike (``0.03225806`` against
    ``0.032258065``, not ``0.0322581`` twice), up to repr's 17; ints and anything else as their repr."""
    for digits in range(_DIGITS, 18):
        shown = _at(a, digits), _at(b, digits)
        if shown[0] != shown[1] or a == b:
            return shown
    return repr(a), repr(b)


def _problem(at: str, field: str, stored: object, derived: float, how: str) -> str:
    shown, again = shown_apart(stored, derived)
    return f"{at}.{field}: {shown} does not follow from {how} (derived: {again})"


def _baselines(rows: list[dict]) -> dict[tuple, dict]:
    """The float cache's row of each (matrix, context_length) that has exactly one."""
    seen: dict[tuple, list[dict]] = {}
    for row in rows:
        if row["candidate"] == "dynamic":
            seen.setdefault((row["matrix"], row["context_length"]), []).append(row)
    return {key: found[0] for key, found in seen.items() if len(found) == 1}


def _cache_problems(at: str, row: dict, base: dict | None) -> list[str]:
    """``dynamic_cache_bytes`` (the baseline's ``cache_bytes``), ``cache_bytes_ratio`` and ``cache_bytes_saved``."""
    problems = []
    dyn = row.get("dynamic_cache_bytes")
    if base is not None and _differs(dyn, base["cache_bytes"]):
        problems.append(_problem(at, "dynamic_cache_bytes", dyn, base["cache_bytes"], "the float cache's row's "
                                 "cache_bytes in the same cell"))
    if dyn is None and base is not None:
        dyn = base["cache_bytes"]
    if dyn is None:
        return problems
    if dyn > 0 and _differs(row.get("cache_bytes_ratio"), row["cache_bytes"] / dyn):
        problems.append(_problem(at, "cache_bytes_ratio", row["cache_bytes_ratio"], row["cache_bytes"] / dyn,
                                 f"cache_bytes {_at(row['cache_bytes'])} / the float cache's {_at(dyn)}"))
    if _differs(row.get("cache_bytes_saved"), dyn - row["cache_bytes"]):
        problems.append(_problem(at, "cache_bytes_saved", row["cache_bytes_saved"], dyn - row["cache_bytes"],
                                 f"the float cache's cache_bytes {_at(dyn)} - cache_bytes {_at(row['cache_bytes'])}"))
    return problems


def _nll_problems(at: str, row: dict, base: dict) -> list[str]:
    """``nll_delta`` = mean_nll - the baseline's; ``nll_ratio`` = mean_nll / max(1e-9, the baseline's)."""
    nll, bnll = row.get("mean_nll"), base.get("mean_nll")
    if nll is None or bnll is None:
        return []
    problems = []
    if _differs(row.get("nll_delta"), nll - bnll):
        problems.append(_problem(at, "nll_delta", row["nll_delta"], nll - bnll,
                                 f"mean_nll {_at(nll)} - the float cache's {_at(bnll)}"))
    if _differs(row.get("nll_ratio"), nll / max(1e-9, bnll)):
        problems.append(_problem(at, "nll_ratio", row["nll_ratio"], nll / max(1e-9, bnll),
                                 f"mean_nll {_at(nll)} / the float cache's {_at(bnll)}"))
    return problems


def _recall_problems(at: str, row: dict, base: dict | None) -> list[str]:
    """``recall_accuracy`` = recall.accuracy; each distance's ``accuracy_drop`` = the baseline's accuracy there
    minus the row's; ``recall_drop`` = the largest of those; ``recall_nll_delta`` = recall.mean_nll - the
    baseline's."""
    rec = row.get("recall")
    if not isinstance(rec, dict):
        return []
    problems = []
    if _differs(row.get("recall_accuracy"), rec.get("accuracy")):
        problems.append(_problem(at, "recall_accuracy", row["recall_accuracy"], rec["accuracy"], "recall.accuracy"))
    brec = (base or {}).get("recall")
    if not isinstance(brec, dict):
        return problems
    if _differs(row.get("recall_nll_delta"), _minus(rec.get("mean_nll"), brec.get("mean_nll"))):
        derived = rec["mean_nll"] - brec["mean_nll"]
        problems.append(_problem(at, "recall_nll_delta", row["recall_nll_delta"], derived,
                                 f"recall.mean_nll {_at(rec['mean_nll'])} - the float cache's {_at(brec['mean_nll'])}"))
    there = {d.get("distance_tokens"): d.get("accuracy") for d in brec["distances"]}
    drops = []
    for j, d in enumerate(rec["distances"]):
        drop = _minus(there.get(d.get("distance_tokens"), None), d.get("accuracy"))
        if drop is None:
            return problems  # distances not paired with the baseline's: nothing derived to compare
        drops.append(drop)
        if _differs(d.get("accuracy_drop"), drop):
            problems.append(_problem(at, f"recall.distances[{j}].accuracy_drop", d["accuracy_drop"], drop,
                                     "the float cache's accuracy at that distance - the row's"))
    if drops and _differs(row.get("recall_drop"), max(drops)):
        problems.append(_problem(at, "recall_drop", row["recall_drop"], max(drops),
                                 "the largest drop of copy accuracy from the float cache's over the distances"))
    return problems


def _minus(a: object, b: object) -> float | None:
    return None if a is None or b is None else a - b


def _passkey_problems(at: str, row: dict, base: dict | None) -> list[str]:
    """``passkey_accuracy`` = passkey.accuracy; ``passkey_drop`` = the baseline's passkey.accuracy - the row's."""
    pk = row.get("passkey")
    if not isinstance(pk, dict):
        return []
    problems = []
    if _differs(row.get("passkey_accuracy"), pk.get("accuracy")):
        problems.append(_problem(at, "passkey_accuracy", row["passkey_accuracy"], pk["accuracy"], "passkey.accuracy"))
    bpk = (base or {}).get("passkey")
    drop = _minus(bpk.get("accuracy"), pk.get("accuracy")) if isinstance(bpk, dict) else None
    if _differs(row.get("passkey_drop"), drop):
        problems.append(_problem(at, "passkey_drop", row["passkey_drop"], drop,
                                 "the float cache's passkey.accuracy - the row's"))
    return problems


def _summary_problems(result: dict) -> list[str]:
    """The summary's counts and contexts from the capacity candidate rows (:func:`kvlab.eval.decision.summarize`)."""
    summary = result.get("summary")
    if not isinstance(summary, dict):
        return []
    rows = sorted(
        (r for r in result["rows"] if r["matrix"] == "capacity" and r["candidate"] != "dynamic"),
        key=lambda r: r["context_length"],
    )
    derived = {
        "eligible_candidate_count": sum(1 for r in rows if r.get("eligible") is True),
        "memory_reduction_onset_context": next(
            (r["context_length"] for r in rows if (r.get("cache_bytes_saved") or 0) > 0), None
        ),
        "eligible_crossover_context": next((r["context_length"] for r in rows if r.get("eligible") is True), None),
    }
    return [
        f"summary.{key}: {summary[key]!r} does not follow from the capacity rows (derived: {value!r})"
        for key, value in derived.items()
        if key in summary and summary[key] != value
    ]


def derived_problems(result: dict) -> list[str]:
    """Each derived field of ``result`` (a result whose fields are all of their types) that does not follow from
    the fields it derives from, as ``"<where>.<field>: <stored> does not follow from <what> (derived: <n>)"``;
    empty when every one follows. A field or the numbers it derives from that the row lacks are not checked; the
    baseline is the float cache's row of the same matrix and context (skipped where there is not exactly one).
    Never raises on a result :func:`kvlab.eval.schema.validate_result` found sound."""
    baselines = _baselines(result["rows"])
    problems: list[str] = []
    for i, row in enumerate(result["rows"]):
        if row["candidate"] == "dynamic":
            continue
        at = f"rows[{i}] ({json.dumps(row['candidate'])} at context {row['context_length']})"
        base = baselines.get((row["matrix"], row["context_length"]))
        problems += _cache_problems(at, row, base)
        problems += _nll_problems(at, row, base) if base is not None else []
        problems += _recall_problems(at, row, base)
        problems += _passkey_problems(at, row, base)
    return problems


def summary_derived_problems(result: dict) -> list[str]:
    """The summary's ``eligible_candidate_count``, ``memory_reduction_onset_context`` and
    ``eligible_crossover_context`` that do not follow from the capacity candidate rows (judged after the rows'
    marks: a stale ``eligible`` mark is named as such, not as the count it throws off)."""
    return _summary_problems(result)


__all__ = ["derived_problems", "shown_apart", "summary_derived_problems"]
