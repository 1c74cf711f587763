"""Resuming an interrupted ``kvlab eval`` run (``kvlab eval --resume FILE``): which result files can be resumed,
and what of them is kept.

A run saves its result file after every step; a cell (one matrix at one context: the float baseline and every
candidate) is *finished* once it is timed and its rows are written, and is then listed in ``cells_done``
(:func:`kvlab.eval.runner.run_eval`). Before that, once every cache of a cell is measured (untimed: outputs,
bytes, quality against the baseline), the cell's measurements are kept in ``cells_measured``, and each finished
long-context probe job in ``probes_done``, until the run's summary. A resumed run keeps the finished cells' rows
and failures, the measured cells (it only times them) and the finished probe jobs, and measures every other cell
from the start. Every untimed measurement still runs before any timing (docs/EVAL.md, "Time budget"), so an
interrupt during the untimed phase keeps the cells and probes measured so far, one during the timing phase the
cells timed so far as well.

A resumed run takes every setting from the file, and the torch thread count its first session used (a CPU GEMM's
rounding may depend on it). It refuses a file that is not a kvlab eval result, one that is finished (status
``complete`` or ``partial``) or a dry run's plan, one written before ``cells_done`` existed, one whose settings or
plan this kvlab cannot read back, one written by other software versions (:func:`check_software`) and, once the
model is loaded, one whose model or device differ (:func:`check_same_model`).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvlab.eval.cells import cell_keys, plan_cells
from kvlab.eval.config import EvalConfig
from kvlab.eval.io import read_result
from kvlab.runtime.provenance import software_info

FINISHED = ("complete", "partial")  # a run that reached its summary: nothing to resume


def running_in() -> dict:
    """``{"pid", "host"}`` of this process: recorded in ``provenance.running_in`` while a run writes its file."""
    import os
    import socket

    return {"pid": os.getpid(), "host": socket.gethostname()}


def refuse_live_run(path: str | Path, result: dict, command: str = "kvlab eval") -> None:
    """Raise ``ValueError`` when ``result`` (read from ``path``) is being measured now: its status is ``running``
    and its writer (``provenance.running_in``, :func:`running_in`) is a live process on this machine. Two runs
    would write it in turn, the last one winning. ``command`` names the writer in the message."""
    import os

    if result.get("status") != "running":
        return
    owner = (result.get("provenance") or {}).get("running_in") or {}
    pid, host = owner.get("pid"), owner.get("host")
    if (
        not isinstance(pid, int)
        or isinstance(pid, bool)
        or host != running_in()["host"]
        or pid == os.getpid()
    ):
        return
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return  # its writer is gone: an interrupted or killed run, resumable
    except PermissionError:
        pass  # alive, another user's
    raise ValueError(
        f"{path} is being written by a running {command} (pid {pid}): stop it first, or wait for it"
    )


def load_resumable(path: str | Path) -> tuple[dict, EvalConfig]:
    """``(result, cfg)``: the result file at ``path`` and the config to resume it with (its settings; ``threads``
    the count its earlier session ran with when the settings left it to the machine).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: naming ``path`` and why it cannot be resumed (see the module docstring).
    """
    result = read_result(path)  # names the file: missing, not JSON, not a kvlab eval result
    status = result["status"]
    if status in FINISHED:
        raise ValueError(f"{path} is a finished run (status {status}): nothing to resume")
    if status == "dry_run":
        raise ValueError(
            f"{path} is a dry run's plan (status dry_run), not an interrupted run: nothing to resume"
        )
    refuse_live_run(path, result)
    if not isinstance(result.get("cells_done"), list):
        raise ValueError(
            f"{path} records no finished cells (no `cells_done`: written by a kvlab without --resume); run it again "
            f"with --force"
        )
    try:
        cfg = EvalConfig.from_dict(result["settings"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: its settings cannot be resumed: {exc}") from None
    if result["plan"] != plan_cells(cfg):
        raise ValueError(f"{path}: its plan is not the one its settings give (was the file edited?)")
    keys = set(cell_keys(cfg))
    for cell in result["cells_done"]:
        if not isinstance(cell, dict) or (cell.get("matrix"), cell.get("context_length")) not in keys:
            raise ValueError(f"{path}: `cells_done` lists {cell!r}, not a cell of its settings")
    _check_untimed(path, result, keys)
    check_software(path, (result["provenance"] or {}).get("software"))
    threads = result["provenance"].get("torch_threads")
    if cfg.threads is None and isinstance(threads, int):
        try:
            cfg = replace(cfg, threads=threads)
        except ValueError as exc:  # more threads than this machine has CPUs
            raise ValueError(f"{path}: its run used {threads} torch threads: {exc}") from None
    return result, cfg


def _check_untimed(path: str | Path, result: dict, keys: set) -> None:
    """``cells_measured`` and ``probes_done``, where the file has them: lists of what a run writes there."""
    measured = result.get("cells_measured", [])
    probes = result.get("probes_done", [])
    if not isinstance(measured, list) or not isinstance(probes, list):
        raise ValueError(f"{path}: `cells_measured` and `probes_done` must be lists (was the file edited?)")
    for cell in measured:
        where = (cell.get("matrix"), cell.get("context_length")) if isinstance(cell, dict) else None
        if (
            where not in keys
            or not isinstance(cell.get("base"), dict)
            or not isinstance(cell.get("measured"), list)
        ):
            raise ValueError(
                f"{path}: `cells_measured` holds {str(cell)[:80]!r}, not a measured cell of its settings"
            )
    for job in probes:
        if not (
            isinstance(job, dict)
            and isinstance(job.get("key"), list)
            and isinstance(job.get("outcome"), list)
        ):
            raise ValueError(f"{path}: `probes_done` holds {str(job)[:80]!r}, not a finished probe job")


def check_software(path: str | Path, recorded: Any) -> None:
    """Refuse to resume a run whose kept rows were measured with other versions of kvlab, torch, transformers,
    tokenizers or a quantization back-end (:func:`kvlab.runtime.provenance.software_info`; the Python version may
    differ): the rows of one result come from one code.

    Raises:
        ValueError: naming ``path`` and each version that differs.
    """
    now = software_info()
    recorded = recorded if isinstance(recorded, dict) else {}
    changed = [
        f"{name} {recorded.get(name)} then, {version} now"
        for name, version in now.items()
        if name != "python" and recorded.get(name) != version
    ]
    if changed:
        raise ValueError(
            f"{path} was measured with other software ({'; '.join(changed)}): its rows and new ones would come "
            f"from different code; run it again with --force"
        )


def check_same_model(path: str | Path, result: dict, model_info: dict) -> None:
    """Refuse to resume onto another model or device: ``model_info`` (:func:`kvlab.eval.model_info.describe_model` of
    the model now loaded) must have the ``fingerprint`` and ``device`` the earlier session recorded (a run
    interrupted before its model loaded recorded none: nothing to compare).

    Raises:
        ValueError: naming ``path``, what the run measured and what is loaded now.
    """
    before = (result.get("provenance") or {}).get("model")
    if not isinstance(before, dict):
        return
    for key in ("fingerprint", "device"):
        if before.get(key) != model_info.get(key):
            raise ValueError(
                f"{path} measured a model with {key} {before.get(key)}, the one loaded now has {model_info.get(key)}: "
                f"its rows and new ones would not describe one model"
            )


def prepare_resume(result: dict, cfg: EvalConfig, command: list[str] | None) -> dict:
    """Make ``result`` (from :func:`load_resumable`) ready for :func:`kvlab.eval.runner.run_eval` to continue, in
    place, and return the record appended to ``provenance.resumed``.

    Kept: the rows and failures of the cells in ``cells_done``; the measurements of the cells in ``cells_measured``
    (not finished) and their failures but the long-context ones (the probes are attached again); ``probes_done``.
    Dropped: the rows and failures of every other cell (measured again) and the run's own failures (``candidate``
    None: the interrupt, a load failure), which the record keeps as ``stopped_by``. The summary and ``elapsed_s``
    are cleared (``elapsed_s`` will be this session's).

    The record: ``resumed_utc``, ``command``, ``status_before``, ``cells_kept``, ``rows_kept``,
    ``cells_measured_kept`` (measured, to be timed), ``cells_to_measure``, ``failures_dropped`` (the unfinished
    cells'), ``stopped_by`` ``[{stage, type, message}]``, ``earlier_elapsed_s`` (the ``elapsed_s`` the file held: the
    earlier session's seconds, None where it recorded none, as a killed run does; :func:`elapsed_words` adds them),
    ``earlier_hardware`` and ``earlier_torch_threads`` (the machine of the earlier session, which the kept rows were
    measured on; ``provenance.hardware`` becomes this session's).
    """
    keys = cell_keys(cfg)
    done = []
    for cell in result["cells_done"]:
        key = (cell["matrix"], cell["context_length"])
        if key not in done:
            done.append(key)
    measured = [c for c in result.get("cells_measured", []) if (c["matrix"], c["context_length"]) not in done]
    untimed = {(c["matrix"], c["context_length"]) for c in measured}
    failures = result["failures"]
    kept_failures = [
        f
        for f in failures
        if (f.get("matrix"), f.get("context_length")) in done
        or ((f.get("matrix"), f.get("context_length")) in untimed and f.get("stage") != "long_context")
    ]
    stopped_by = [
        {k: f.get(k) for k in ("stage", "type", "message")} for f in failures if f.get("candidate") is None
    ]
    rows = [r for r in result["rows"] if (r.get("matrix"), r.get("context_length")) in done]
    provenance = result["provenance"]
    record = {
        "resumed_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "status_before": result["status"],
        "cells_kept": len(done),
        "rows_kept": len(rows),
        "cells_measured_kept": len(measured),
        "cells_to_measure": len(keys) - len(done) - len(measured),
        "failures_dropped": len(failures) - len(kept_failures) - len(stopped_by),
        "stopped_by": stopped_by,
        "earlier_elapsed_s": result.get("elapsed_s"),
        "earlier_hardware": provenance.get("hardware"),
        "earlier_torch_threads": provenance.get("torch_threads"),
    }
    provenance.setdefault("resumed", []).append(record)
    result.update(
        cells_done=[{"matrix": m, "context_length": c} for m, c in done],
        rows=rows,
        failures=kept_failures,
        cells_measured=measured,
        summary=None,
        elapsed_s=None,
    )
    return record


def elapsed_words(result: dict) -> str | None:
    """``elapsed 28.7 s`` (``result["elapsed_s"]``); for a resumed run also the whole run's time, the sum of every
    session's (``provenance.resumed[].earlier_elapsed_s``): ``elapsed 28.7 s in the last session, 95.2 s over the
    run's 2 sessions``, or that the last session's is all that is known where an earlier one recorded no time
    (killed, or a file written before kvlab recorded it). None when ``elapsed_s`` is not a number."""
    this = result.get("elapsed_s")
    if isinstance(this, bool) or not isinstance(this, (int, float)):
        return None
    resumed = (result.get("provenance") or {}).get("resumed")
    records = [r for r in resumed if isinstance(r, dict)] if isinstance(resumed, list) else []
    if not records:
        return f"elapsed {this:.1f} s"
    earlier = [r.get("earlier_elapsed_s") for r in records]
    if all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in earlier):
        total = this + sum(earlier)
        return f"elapsed {this:.1f} s in the last session, {total:.1f} s over the run's {len(records) + 1} sessions"
    return f"elapsed {this:.1f} s in the last session only (an earlier session of this resumed run recorded no time)"
