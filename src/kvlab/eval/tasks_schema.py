"""The ``kvlab tasks`` result file: its kind and version, its fields, and a validator in the style of the eval
result's (:mod:`kvlab.eval.schema`, whose checks it shares). docs/TASKS.md describes the run that writes it.

A tasks result is one JSON object::

    kind, version   "kvlab-tasks", 3 (version 2: each row's bytes were compared as ``bytes_ratio``, float bytes /
                    cache bytes, the inverse of kvlab eval's; version 1: also written before the run saved after
                    every cell, without status, command, created_utc or failures, read as complete).
                    :func:`upgrade_tasks_result` reads versions 1 and 2 into this form
    status          "running" (saved after each finished cell), "complete", "failed" (version 2) or "stopped" (Ctrl-C
                    or SIGTERM at any stage, kvlab.eval.records.stop_run: its failure says "interrupted during
                    <what>"; resumable, as failed and a killed run's running are)
    created_utc, command (version 2), model {name, dtype, device}
    settings        kvlab.eval.tasks_suite.TaskSuiteConfig: {tasks, contexts, candidates, n, seed, protected_tail,
                    max_drop, min_float_score}
    cells           [{task, context, context_tokens, samples, prefill_ms, seconds, caches {name: {score, correct,
                     trials, ci95 [low, high], bytes, float_bytes, cache_bytes_ratio (bytes / float_bytes, as
                     kvlab eval's), ms, answers? [{sample, question,
                     score, correct, output}]}}}] (kvlab.eval.tasks_run.run_task_cell), in the order they finished
    not_measured    [{task, context, reason}]; skipped {cache: reason}; candidates {cache: {name, family, line, ...}}
    gates, decision kvlab.eval.tasks_judge.judge over the finished cells: [{task, context, cache, float_score, score,
                    drop, status in {"pass", "fail", "not informative"}}], {cache: {verdict, failed, passed,
                    not_informative}}; max_drop, min_float_score
    failures        [{stage, type, message, cell?}] (kvlab.eval.records.Failure of the run, or its stop: type
                    KeyboardInterrupt / Terminated; cell {task, context}: the cell running when it stopped); version 2
    provenance      {..., started_unix, wall_s, resumed? [{resumed_unix, cells_kept, status_before}]}
    allow_past_limit? true: run with --allow-past-limit (contexts past the model's max_position_embeddings); a
                    --resume of the file keeps it
"""

from __future__ import annotations

from kvlab.eval.schema import _check, _ci_problems, _counts_problems, _show

RESULT_KIND = "kvlab-tasks"
RESULT_VERSION = 3
VERSIONS = (1, 2, 3)
STATUSES = ("running", "complete", "failed", "stopped")
GATE_STATUSES = ("pass", "fail", "not informative")
VERDICTS = ("accepted", "rejected", "not judged")
_TOP = (
    "model",
    "settings",
    "cells",
    "not_measured",
    "skipped",
    "candidates",
    "gates",
    "decision",
    "provenance",
)
_V2 = ("status", "created_utc", "command", "failures")
_CELL = {
    "task": "string",
    "context": "int >= 1",
    "context_tokens": "int >= 1",
    "samples": "int >= 1",
    "prefill_ms": "number >= 0",
    "seconds": "number >= 0",
    "caches": "object",
}
_ROW = {
    "score": "fraction",
    "bytes": "int >= 0",
    "float_bytes": "int >= 0",
    "cache_bytes_ratio": "number >= 0",
    "ms": "number >= 0",
}
# versions 1 and 2 wrote the inverse ratio, under another name (float bytes / cache bytes)
_OLD_RATIO, _RATIO = "bytes_ratio", "cache_bytes_ratio"
_GATE = {
    "task": "string",
    "context": "int >= 1",
    "cache": "string",
    "float_score": "fraction",
    "score": "fraction",
    "drop": "number",
}


def is_tasks_result(obj: object) -> bool:
    """True for an object that says it is a ``kvlab tasks`` result (its ``kind``), valid or not."""
    return isinstance(obj, dict) and obj.get("kind") == RESULT_KIND


def _fields(problems: list[str], where: str, block: object, kinds: dict[str, str]) -> bool:
    """Every key of ``kinds`` present in ``block`` (an object) and of its kind; False when ``block`` is none."""
    if not _check(problems, where, block, "object"):
        return False
    for key, kind in kinds.items():
        if key not in block:
            problems.append(f"{where}: lacks {key!r}")
        else:
            _check(problems, f"{where}.{key}", block[key], kind)
    return True


def upgrade_tasks_result(result: dict) -> dict:
    """``result`` (a valid ``kvlab tasks`` result of any version in :data:`VERSIONS`) with its rows in the current
    form, in place: a version-1 or -2 row's ``bytes_ratio`` (float bytes / cache bytes) becomes ``cache_bytes_ratio``
    (cache bytes / float bytes, ``kvlab eval``'s direction), recomputed from the row's ``bytes`` and
    ``float_bytes`` as the run computes it; a version-2 result becomes version 3 (nothing else differs). A
    version-1 result keeps its number: it lacks the run fields of version 2, and it is complete (never resumed)."""
    if result.get("version") not in (1, 2):
        return result
    for cell in result["cells"]:
        for row in cell["caches"].values():
            row.pop(_OLD_RATIO, None)
            row[_RATIO] = row["bytes"] / max(row["float_bytes"], 1)
    if result["version"] == 2:
        result["version"] = RESULT_VERSION
    return result


def _row_kinds(version: object) -> dict[str, str]:
    """The fields of a cache's row in a result of ``version``: versions 1 and 2 name the ratio ``bytes_ratio``."""
    if version in (1, 2):
        return {(_OLD_RATIO if k == _RATIO else k): kind for k, kind in _ROW.items()}
    return _ROW


def _cell_problems(i: int, cell: object, version: object = RESULT_VERSION) -> list[str]:
    """One cell of a result of ``version``: its fields, the float row every cell pairs with, and each cache's
    score, counts and bytes."""
    problems: list[str] = []
    where = f"cells[{i}]"
    if not _fields(problems, where, cell, _CELL) or not isinstance(cell.get("caches"), dict):
        return problems
    if "dynamic" not in cell["caches"]:
        problems.append(f"{where}.caches: lacks the float row 'dynamic' every cache is paired with")
    for name, row in cell["caches"].items():
        at = f"{where}.caches[{_show(name)}]"
        if not _fields(problems, at, row, _row_kinds(version)):
            continue
        if "trials" not in row or "correct" not in row:
            problems.append(f"{at}: lacks 'trials' or 'correct'")
        _counts_problems(problems, at, row)
        if row.get("ci95") is None:  # the run writes every row's interval (trials >= 1): the table prints it
            missing = "ci95" not in row
            problems.append(f"{at}: lacks 'ci95'" if missing else f"{at}.ci95: must be a [low, high] pair, got null")
        _ci_problems(problems, f"{at}.ci95", row.get("ci95"))
        if "answers" in row and _check(problems, f"{at}.answers", row["answers"], "list"):
            for j, a in enumerate(row["answers"]):
                kinds = {"score": "fraction", "correct": "bool", "output": "string"}
                _fields(problems, f"{at}.answers[{j}]", a, kinds)
    return problems


def _judged_problems(result: dict) -> list[str]:
    """The gates and the decision (:func:`kvlab.eval.tasks_judge.judge`) and the thresholds they were judged on."""
    problems: list[str] = []
    for key in ("max_drop", "min_float_score"):
        _check(problems, key, result.get(key), "fraction or null")
    if _check(problems, "gates", result.get("gates"), "list"):
        for i, gate in enumerate(result["gates"]):
            if _fields(problems, f"gates[{i}]", gate, _GATE) and gate.get("status") not in GATE_STATUSES:
                problems.append(
                    f"gates[{i}].status: {_show(gate.get('status'))} not in {list(GATE_STATUSES)}"
                )
    if _check(problems, "decision", result.get("decision"), "object"):
        for name, d in result["decision"].items():
            at = f"decision[{_show(name)}]"
            kinds = {"failed": "list", "passed": "int >= 0", "not_informative": "int >= 0"}
            if _fields(problems, at, d, kinds) and d.get("verdict") not in VERDICTS:
                problems.append(f"{at}.verdict: {_show(d.get('verdict'))} not in {list(VERDICTS)}")
    return problems


def _run_problems(result: dict) -> list[str]:
    """The version-2 fields: status, the command, and the run's failures."""
    problems = [f"missing field {k!r}" for k in _V2 if k not in result]
    if problems:
        return problems
    if result["status"] not in STATUSES:
        problems.append(f"status: {_show(result['status'])} not in {list(STATUSES)}")
    _check(problems, "created_utc", result["created_utc"], "string")
    _check(problems, "command", result["command"], "list or null")
    if _check(problems, "failures", result["failures"], "list"):
        for i, f in enumerate(result["failures"]):
            _fields(problems, f"failures[{i}]", f, {"stage": "string", "type": "string", "message": "string"})
    what = {"failed": "failure", "stopped": "stop"}.get(result["status"])
    if what and not result["failures"]:
        problems.append(f"failures: a {result['status']} result names its {what}, got []")
    return problems


def validate_tasks_result(result: object) -> list[str]:
    """Problems found in a ``kvlab tasks`` result (empty list = valid), each ``"<where>: <what>"`` naming the
    field's path and its value, as :func:`kvlab.eval.schema.validate_result` does for an eval result: every field
    the table, the figure (:mod:`kvlab.task_figures`) and the HTML report read is type-checked, every number finite,
    scores and intervals in [0, 1], ``correct <= trials``. Never raises on bad content."""
    if not isinstance(result, dict):
        return [f"result must be a JSON object, got {type(result).__name__}"]
    if result.get("kind") != RESULT_KIND:
        return [f"kind: {_show(result.get('kind'))} is not {RESULT_KIND!r} (not a kvlab tasks result)"]
    version = result.get("version")
    if version not in VERSIONS or isinstance(version, bool):
        return [
            f"version: {_show(version)} not in {list(VERSIONS)} (a kvlab tasks result of another version)"
        ]
    problems = [f"missing field {k!r}" for k in _TOP if k not in result]
    if version >= 2:
        problems += _run_problems(result)
    if problems:
        return problems
    for key, kind in (("not_measured", "list"), ("skipped", "object"), ("candidates", "object")):
        _check(problems, key, result[key], kind)
    for name, c in result["candidates"].items() if isinstance(result["candidates"], dict) else ():
        if _check(problems, f"candidates[{_show(name)}]", c, "object") and "line" in c:  # the figure's line
            _check(problems, f"candidates[{_show(name)}].line", c["line"], "string")
    _fields(problems, "model", result["model"], {"name": "string"})
    _fields(problems, "settings", result["settings"], {"n": "int >= 1", "seed": "int", "contexts": "list"})
    if _check(problems, "provenance", result["provenance"], "object"):
        _check(problems, "provenance.wall_s", result["provenance"].get("wall_s"), "number >= 0 or null")
    if isinstance(result["not_measured"], list):
        for i, m in enumerate(result["not_measured"]):
            kinds = {"task": "string", "context": "int >= 1", "reason": "string"}
            _fields(problems, f"not_measured[{i}]", m, kinds)
    if _check(problems, "cells", result["cells"], "list"):
        for i, cell in enumerate(result["cells"]):
            problems += _cell_problems(i, cell, version)
    problems += _judged_problems(result)
    return problems or _decision_disagrees(result)


def _decision_disagrees(result: dict) -> list[str]:
    """The stored gates and decision against the cells' own (:func:`kvlab.eval.tasks_judge.judge` over them, at the
    stored thresholds): a gate's mark its scores do not give (:func:`_gates_disagree`), a verdict no cell supports
    (a cache ``accepted`` with no cell behind it) is refused, not printed. Nothing to compare where the thresholds
    are not stored."""
    from kvlab.eval.tasks_judge import judge

    max_drop, min_float = result.get("max_drop"), result.get("min_float_score")
    if max_drop is None or min_float is None:
        return []
    again = judge(result["cells"], max_drop, min_float)  # reads each row's score only
    marks = _gates_disagree(result, again["gates"])
    own = again["decision"]
    for name in sorted({*own, *result["decision"]}, key=str):
        stored = (result["decision"].get(name) or {}).get("verdict", "absent")
        judged = (own.get(name) or {}).get("verdict", "absent")
        if own.get(name) != result["decision"].get(name):
            behind = sum(1 for c in result["cells"] if name in c["caches"])
            key = "verdict"
            if stored == judged:  # the verdict stands; another field of it does not ("rejected" ... "rejected")
                mine, theirs = own.get(name) or {}, result["decision"].get(name) or {}
                key = next(k for k in sorted({*mine, *theirs}, key=str) if mine.get(k) != theirs.get(k))
                stored, judged = theirs.get(key, "absent"), mine.get(key, "absent")
            return [
                f"decision[{_show(name)}].{key}: {_show(stored)} does not follow from the cells ({behind} cell(s) "
                f"measured {_show(name)}; judged again over them: {_show(judged)})"
            ] + marks
    return marks


def _gates_disagree(result: dict, judged: list[dict]) -> list[str]:
    """Each stored gate's mark (``gates[i].status``: pass, fail, not informative, shown on its row of the table)
    against the one its cell's scores give at the stored ``max_drop`` / ``min_float_score`` (``judged``, of
    :func:`kvlab.eval.tasks_judge.judge`): a hand-edited or stale mark, a gate of no measured row, or a measured
    row without its gate (shown as the baseline) is refused, naming the gate, the scores and the thresholds."""
    own = {(g["task"], g["context"], g["cache"]): g for g in judged}
    seen = set()
    for i, gate in enumerate(result["gates"]):
        key = (gate["task"], gate["context"], gate["cache"])
        at = f"gates[{i}] ({_show(gate['cache'])} on {gate['task']}@{gate['context']})"
        if key not in own or key in seen:
            why = "a second gate of that row" if key in seen else "no cell measured that cache there"
            return [f"{at}: {why}"]
        seen.add(key)
        g = own[key]
        if gate["status"] != g["status"]:
            return [
                f"{at}.status: {_show(gate['status'])} does not follow from the cell's scores (float "
                f"{g['float_score']:g}, {gate['cache']} {g['score']:g}: a drop of {g['drop']:g} at max_drop "
                f"{result['max_drop']:g}, min_float_score {result['min_float_score']:g}; judged again: "
                f"{_show(g['status'])})"
            ]
    missing = [k for k in own if k not in seen]
    if missing:
        task, context, cache = missing[0]
        return [f"gates: lacks the gate of {_show(cache)} on {task}@{context} ({len(missing)} measured row(s) without one)"]
    return []
