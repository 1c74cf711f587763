"""The part of ``docs/PERFORMANCE.md`` that ``kvlab eval`` measures: the integer KIVI path's accuracy.

``kvlab eval --candidates dynamic,kivi-4,kivi-4:dot=int8`` reports, per capacity cell, the integer path's KL to its
exact twin beside the twin's own KL to the float cache (the result's ``summary.integer_path``,
:mod:`kvlab.eval.twins`). The results kept in the repository's ``docs/examples/`` (``eval-*.json``) that hold it
give one target verdict each (:func:`integer_path_targets`) and one table each (:func:`render_integer_path`); like
the rest of the page, every number is read from a record. Reads JSON only (no torch, no import of the eval).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from kvlab.eval.io import current_command
from kvlab.eval.twins import FLOAT_KERNEL


def examples_dir(results_dir: str | Path) -> Path:
    """The repository's ``docs/examples`` beside its ``benchmarks/results`` (``results_dir``'s grandparent)."""
    return Path(results_dir).parent.parent / "docs" / "examples"


def eval_records(folder: str | Path) -> list[tuple[Path, dict]]:
    """``(path, result)`` of every ``eval-*.json`` in ``folder`` whose summary has ``integer_path``, by name; none
    when the folder does not exist. A file that is not JSON is skipped (it is not such a result)."""
    folder = Path(folder)
    out = []
    for path in sorted(folder.glob("eval-*.json")) if folder.is_dir() else ():
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(result, dict) and (result.get("summary") or {}).get("integer_path"):
            out.append((path, result))
    return out


def _device(result: dict) -> str:
    hw = (result.get("provenance") or {}).get("hardware") or {}
    model = ((result.get("provenance") or {}).get("model") or {}).get("id_or_path")
    return f"{hw.get('device', 'cpu')}, torch threads: {hw.get('torch_threads')}, model {model}"


def _share(p: dict) -> str:
    share = p.get("share_of_own_kl")
    return "-" if share is None else f"{share:.1%}"


def _kl(result: dict, context: int, candidate: str) -> float | None:
    """The ``kl_mean`` of ``candidate``'s capacity row at ``context`` in ``result`` (None where absent)."""
    for r in result.get("rows", []):
        if r.get("matrix") == "capacity" and r["context_length"] == context and r["candidate"] == candidate:
            return r.get("kl_mean")
    return None


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _floor_line(result: dict, rows: list[dict]) -> list[str]:
    """The line naming the run's rounding floor: ``dynamic-ckernel``'s KL to the float cache (the same attention
    in another summation order), where the run has it; ``[]`` otherwise."""
    floor = [(p["context_length"], _kl(result, p["context_length"], FLOAT_KERNEL)) for p in rows]
    if all(v is None for _, v in floor):
        return []
    at = ", ".join(f"{_g(v)} at {c}" for c, v in floor)
    return [
        f"Rounding floor of this run: `{FLOAT_KERNEL}` (the float cache, its attention in the float C kernel: the "
        f"same sums in another order) is at KL {at} from `dynamic`.",
        "",
    ]


def integer_path_targets(records: list[tuple[Path, dict]]) -> list[dict]:
    """One verdict per record (:func:`eval_records`): ``{"description", "status", "detail", "device", "file"}``,
    the status the eval computed (``met`` / ``not met`` / ``not measured``), the share per context as detail."""
    out = []
    for path, result in records:
        ip = result["summary"]["integer_path"]
        detail = ", ".join(
            f"{_share(p)} at {p['context_length']} ({p.get('key_score_path') or 'nothing ran'})"
            for p in ip["rows"]
        )
        out.append(
            {
                "description": f"integer KIVI path (kvlab eval): {ip['target']}",
                "status": ip["status"],
                "detail": detail,
                "device": _device(result),
                "file": path.name,
            }
        )
    return out


def render_integer_path(records: list[tuple[Path, dict]], table) -> list[str]:
    """The page's lines for the records (none without any): per record its command, model and a table of each
    int8 capacity row: KL(twin || int8), the twin's and the int8 cache's KL to the float cache, the share (of the
    twin's), what ran, the verdict.
    ``table``: the page's Markdown table function (:func:`kvlab.bench.docs._table`)."""
    if not records:
        return []
    lines = ["## Integer KIVI path: accuracy by `kvlab eval`", ""]
    for path, result in records:
        ip = result["summary"]["integer_path"]
        model = (result.get("provenance") or {}).get("model") or {}
        command, notes = current_command(result.get("command") or [])
        lines += [
            f"Command: `{shlex.join(command)}`" + "".join(f" ({n})" for n in notes) + "  ",
            f"Result: `docs/examples/{path.name}`; model {model.get('id_or_path')} ({model.get('dtype')}), "
            f"{_device(result).split(', model')[0]}; run {result.get('created_utc')}.",
            "",
            f"Target: {ip['target']}: **{ip['status']}**. KL in nats, mean over the scored continuation "
            "(the float cache's greedy tokens, teacher-forced).",
            "",
            *_floor_line(result, ip["rows"]),
        ]
        rows = [
            [
                str(p["context_length"]),
                f"`{p['candidate']}`",
                f"`{p['twin']}`",
                f"{p['kl_mean']:.3g}",
                _g(p.get("own_kl_mean")),
                _g(p.get("int8_kl_mean", _kl(result, p["context_length"], p["candidate"]))),
                _share(p),
                p.get("key_score_path") or "-",
                {True: "met", False: "not met", None: "not measured"}[p.get("met")],
            ]
            for p in ip["rows"]
        ]
        headers = [
            "context",
            "int8 cache",
            "exact twin",
            "KL(twin || int8)",
            "twin's KL",
            "int8's KL",
            "share",
            "ran",
            "verdict",
        ]
        lines += [table(headers, rows), ""]
    return lines
