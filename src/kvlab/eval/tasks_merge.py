"""One ``kvlab tasks`` result from several runs of one model (``kvlab tasks --merge``): a long measurement split over
processes or machines by task, context or candidates (docs/TASKS.md), read as one table, one decision and one
figure.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from kvlab.eval.tasks_judge import judge
from kvlab.eval.tasks_schema import RESULT_KIND, RESULT_VERSION, upgrade_tasks_result

# settings every merged run must share (tasks, contexts and candidates may differ: they are what a run is split by;
# each cell keeps the caches it measured)
SHARED_SETTINGS = ("n", "seed", "protected_tail", "max_drop", "min_float_score")


def _refuse_mismatch(results: Sequence[dict], names: Sequence[str]) -> None:
    """ValueError naming the first file whose model or shared settings differ from the first file's."""
    first = results[0]
    for r, name in zip(results[1:], names[1:]):
        for key in ("name", "dtype", "device"):
            if r["model"].get(key) != first["model"].get(key):
                raise ValueError(
                    f"{name} measured model {key} {r['model'].get(key)!r}, {names[0]} {first['model'].get(key)!r}:"
                    " merge runs of one model"
                )
        for key in SHARED_SETTINGS:
            if r["settings"].get(key) != first["settings"].get(key):
                raise ValueError(
                    f"{name} has {key} {r['settings'].get(key)!r}, {names[0]} {first['settings'].get(key)!r}: "
                    f"merged runs share {', '.join(SHARED_SETTINGS)}"
                )


def _union(lists: Sequence[Sequence]) -> list:
    out: list = []
    for items in lists:
        out += [x for x in items if x not in out]
    return out


def merge_tasks_results(
    results: Sequence[dict], names: Sequence[str], command: list[str] | None = None
) -> dict:
    """The result of all ``results`` (each a valid ``kvlab tasks`` result, :mod:`kvlab.eval.tasks_schema`) as one.

    Cells are kept as measured, in the order of the files (a version-1 or -2 file's rows in the current form:
    :func:`~kvlab.eval.tasks_schema.upgrade_tasks_result`, on copies); the gates and the decision are judged again over all of
    them (:func:`kvlab.eval.tasks_judge.judge`: a cache is judged on the cells that measured it). ``settings.tasks``,
    ``contexts`` and ``candidates`` are the union of the files';
    ``provenance`` is the first file's machine with ``merged_from`` (per file: its name, status, created_utc,
    wall_s, git commit and cells) and ``wall_s`` the sum of the files'. The status is ``complete`` when every file
    is; otherwise ``failed`` with each file's failures (its name in ``source``).

    Args:
        names: one name per result (the file it was read from), used in messages and ``merged_from``.
        command: the command line that merged them (None in-process).

    Raises:
        ValueError: fewer than two results or a count of names that differs, results of another model or with
            other shared settings (:data:`SHARED_SETTINGS`; the value of each file named), or a (task, context)
            cell measured in two files (named).
    """
    if len(results) < 2:  # "got 1 and 1" (results and names) said nothing of what was missing
        raise ValueError(f"merge needs two result files or more, got {len(results)}: {', '.join(map(str, names))}")
    if len(names) != len(results):
        raise ValueError(f"merge needs one name per result, got {len(names)} names for {len(results)} results")
    results = [upgrade_tasks_result(copy.deepcopy(r)) for r in results]
    _refuse_mismatch(results, names)
    seen: dict[tuple[str, int], str] = {}
    for r, name in zip(results, names):
        for c in r["cells"]:
            where = (c["task"], c["context"])
            if where in seen:
                raise ValueError(f"{c['task']} @ {c['context']} is measured in both {seen[where]} and {name}")
            seen[where] = name
    first, settings = results[0], dict(results[0]["settings"])
    settings["tasks"] = _union([r["settings"]["tasks"] for r in results])
    settings["contexts"] = sorted(_union([r["settings"]["contexts"] for r in results]))
    settings["candidates"] = _union([r["settings"]["candidates"] for r in results])
    cells = [c for r in results for c in r["cells"]]
    not_measured = [m for r in results for m in r["not_measured"] if (m["task"], m["context"]) not in seen]
    failures = [{**f, "source": name} for r, name in zip(results, names) for f in r.get("failures") or []]
    status = "complete" if all(r.get("status", "complete") == "complete" for r in results) else "failed"
    if status == "failed" and not failures:  # a part left "running" by a killed run records nothing itself
        stopped = [n for r, n in zip(results, names) if r.get("status", "complete") != "complete"]
        failures = [{"stage": "run", "type": "Incomplete", "message": f"{', '.join(stopped)} did not finish"}]
    merged_from = [
        {"source": name, "status": r.get("status", "complete"), "created_utc": r.get("created_utc")}
        | {"wall_s": r["provenance"].get("wall_s"), "git_commit": r["provenance"].get("git_commit")}
        | {"cells": [f"{c['task']}@{c['context']}" for c in r["cells"]]}
        for r, name in zip(results, names)
    ]
    provenance = {k: v for k, v in first["provenance"].items() if k not in ("running_in", "resumed")}
    provenance.update(merged_unix=time.time(), merged_from=merged_from)
    provenance["wall_s"] = sum(r["provenance"].get("wall_s") or 0.0 for r in results)
    out = {"kind": RESULT_KIND, "version": RESULT_VERSION, "status": status}
    out.update(created_utc=datetime.now(UTC).isoformat(timespec="seconds"), command=command)
    out.update(model=dict(first["model"]), settings=settings, cells=cells, not_measured=not_measured)
    out.update(skipped={k: v for r in results for k, v in r["skipped"].items()})
    out.update(candidates={k: v for r in results for k, v in r["candidates"].items()}, failures=failures)
    out.update(judge(cells, settings["max_drop"], settings["min_float_score"]))
    out["provenance"] = provenance
    return out
