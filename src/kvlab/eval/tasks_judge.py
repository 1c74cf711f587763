"""The gates and the decision of ``kvlab tasks`` over finished cells: pure Python (no torch), so that a reader of a
result file (:mod:`kvlab.eval.tasks_schema`) can judge its cells again and hold the stored decision against them."""

from __future__ import annotations

from collections.abc import Sequence

FLOAT = "dynamic"  # the float baseline every candidate is paired with
MIN_FLOAT_SCORE = 0.5  # below it, a task at a context is "not informative": the float cache itself fails it


def judge(cells: Sequence[dict], max_drop: float = 0.1, min_float: float = MIN_FLOAT_SCORE) -> dict:
    """Per-task gates and a decision over cells of :func:`run_task_cell` (each with ``task`` and ``context``).

    A task at a context is *informative* when the float cache (:data:`FLOAT`) scores at least ``min_float`` there;
    elsewhere its gates say ``"not informative"`` and judge no cache. An informative gate passes when the cache
    loses at most ``max_drop`` of the float cache's score. A cache is ``accepted`` when it passed every informative
    gate (and had one), ``rejected`` when it failed one, ``not judged`` when no gate was informative.

    Returns:
        ``{"gates": [{"task", "context", "cache", "float_score", "score", "drop", "status"}], "decision":
        {cache: {"verdict", "failed": ["task@context", ...], "passed", "not_informative"}}}``; ``status`` is
        ``"pass"``, ``"fail"`` or ``"not informative"``.

    Raises:
        ValueError: a cell without the float cache, or ``max_drop`` / ``min_float`` outside [0, 1].
    """
    for name, value in (("max_drop", max_drop), ("min_float", min_float)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"`{name}` must be in [0, 1], got {value!r}")
    gates, decision = [], {}
    for cell in cells:
        if FLOAT not in cell["caches"]:
            raise ValueError(f"cell {cell['task']}@{cell['context']} has no {FLOAT!r} row to pair with")
        base = cell["caches"][FLOAT]["score"]
        for name, row in cell["caches"].items():
            if name == FLOAT:
                continue
            drop = base - row["score"]
            status = "not informative" if base < min_float else ("pass" if drop <= max_drop else "fail")
            gates.append(
                {"task": cell["task"], "context": cell["context"], "cache": name, "float_score": base}
                | {"score": row["score"], "drop": drop, "status": status}
            )
            d = decision.setdefault(name, {"failed": [], "passed": 0, "not_informative": 0})
            if status == "fail":
                d["failed"].append(f"{cell['task']}@{cell['context']}")
            d["passed" if status == "pass" else "not_informative"] += status != "fail"
    for d in decision.values():
        d["verdict"] = "rejected" if d["failed"] else ("accepted" if d["passed"] else "not judged")
    return {"gates": gates, "decision": decision, "max_drop": max_drop, "min_float_score": min_float}
