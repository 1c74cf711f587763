"""The text report of a ``kvlab tasks`` result (:mod:`kvlab.eval.tasks_schema`): one row per cache and cell with
its bytes against the float cache's (× dyn), score, interval and gate, then the decision; what ``kvlab tasks`` prints at the end of a run and
``kvlab report`` prints for a tasks result file (docs/TASKS.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvlab.eval.records import STOP_TYPES

COLUMNS = ("task", "context", "cache", "× dyn", "score", "all found (95% CI)", "gate")
# what each column holds (printed once under the table, and in the HTML section)
COLUMN_LEGEND = (
    "columns: × dyn = cache bytes / dynamic's (the float cache's) after the context is filled, so 0.49 = about half "
    "the bytes (as kvlab eval's × dyn column); score = mean share "
    "of reference strings found in the answer (RULER's string_match_all); all found (95% CI) = samples with every "
    "reference found / samples, with its Wilson 95 % interval; gate = pass / fail (a drop of more than max_drop from "
    "the float score), not informative (the float cache scores below min_float_score there), baseline (the float "
    "cache itself)"
)


def table_rows(result: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The table's rows, as text, in the order of the result's cells: ``(task, context, cache, × dyn,
    score, "correct/trials (low-high)", gate)``; the float cache's gate reads ``baseline``."""
    status = {(g["task"], g["context"], g["cache"]): g["status"] for g in result.get("gates", [])}
    out = []
    for cell in result["cells"]:
        for name, row in cell["caches"].items():
            lo, hi = row["ci95"]
            gate = status.get((cell["task"], cell["context"], name), "baseline")
            found = f"{row['correct']}/{row['trials']} ({lo:.2f}-{hi:.2f})"
            out.append((cell["task"], str(cell["context"]), name, f"{row['cache_bytes_ratio']:.2f}",
                        f"{row['score']:.2f}", found, gate))  # fmt: skip
    return out


def print_tasks_table(result: Mapping[str, Any], console: Any = None) -> None:
    """Print the table, the decision, the run's status and failures, and the cells not measured (rich)."""
    from rich.table import Table

    from kvlab.runtime.console import stdout_console

    console = console or stdout_console()
    wall = (result.get("provenance") or {}).get("wall_s")
    title = f"kvlab tasks: {result['model']['name']}" + (f" ({wall:.0f} s)" if wall is not None else "")
    table = Table(title=title)
    for col in COLUMNS:
        table.add_column(col)
    for row in table_rows(result):
        table.add_row(*row)
    console.print(table)
    console.print(COLUMN_LEGEND, highlight=False)
    for name, d in result["decision"].items():
        failed = f" (failed: {', '.join(d['failed'])})" if d["failed"] else ""
        console.print(f"{name}: {d['verdict']}{failed}")
    for m in result["not_measured"]:
        console.print(f"not measured: {m['task']} @ {m['context']}: {m['reason']}")
    status = result.get("status", "complete")
    if status != "complete":
        console.print(f"status: {status} ({len(result['cells'])} cells measured)")
    for f in result.get("failures", []):
        cell = f.get("cell") or {}
        where = f" in {cell['task']} @ {cell['context']}" if cell else ""
        # the run's own entry of an interrupt (kvlab.eval.records.stop_run): stopped, not failed
        word = "stopped" if f.get("type") in STOP_TYPES else "failed"
        console.print(f"{word}{where}: {f['type']}: {f['message']}")


GATE_MARKS = {"pass": "pass", "fail": "**fail**", "not informative": "n.i.", "baseline": ""}


def _ratio_text(ratios: list[float]) -> str:
    lo, hi = min(ratios), max(ratios)
    return f"{lo:.2f}" if hi - lo < 0.005 else f"{lo:.2f}-{hi:.2f}"


def markdown_tables(result: Mapping[str, Any]) -> str:
    """The result as Markdown, one table per context (what docs/TASKS.md shows): a row per task, a column per
    cache, each entry ``score · correct/trials (low-high) gate`` (the gate ``pass``, ``**fail**`` or ``n.i.``, not
    informative; none for the float cache), and a first row of each cache's × dyn (cache bytes / the float
    cache's) over the context's
    cells (a range where the tasks differ). Cells are read as they are in the result, nothing recomputed."""
    status = {(g["task"], g["context"], g["cache"]): g["status"] for g in result.get("gates", [])}
    parts = []
    for context in sorted({c["context"] for c in result["cells"]}):
        cells = [c for c in result["cells"] if c["context"] == context]
        names = list(dict.fromkeys(n for c in cells for n in c["caches"]))
        head = [f"{context:,} tokens", *names]
        ratios = [
            _ratio_text([c["caches"][n]["cache_bytes_ratio"] for c in cells if n in c["caches"]]) for n in names
        ]
        lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * len(names) + "|"]
        lines.append("| × dyn | " + " | ".join(ratios) + " |")
        for cell in cells:
            entries = []
            for n in names:
                row = cell["caches"].get(n)
                if row is None:
                    entries.append("-")
                    continue
                lo, hi = row["ci95"]
                gate = GATE_MARKS[status.get((cell["task"], context, n), "baseline")]
                entry = f"{row['score']:.2f} · {row['correct']}/{row['trials']} ({lo:.2f}-{hi:.2f})"
                entries.append(f"{entry} {gate}".strip())
            lines.append(f"| {cell['task']} | " + " | ".join(entries) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"
