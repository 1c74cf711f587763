"""A ``kvlab tasks`` result in the HTML report: its table (score, interval and gate per cache and cell), its
decision, and the score-vs-× dyn figure (:func:`kvlab.task_figures.plot_task_scores`) embedded as a PNG, as a
section of an eval result's page (:func:`kvlab.report_html.render_html`) or as a page of its own. Every number is
read from the result given (docs/TASKS.md describes the run that writes it).
"""

from __future__ import annotations

import html
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvlab.eval.tasks_render import COLUMN_LEGEND, COLUMNS, table_rows
from kvlab.report_html import _CSS, _kv_table, _png_tag, _table, render_html
from kvlab.runtime.atomic import atomic_write_text
from kvlab.task_figures import plot_task_scores, skip_reason

_GATE_CLASS = {"pass": "pass", "fail": "fail", "not informative": "untrusted"}
_VERDICT_CLASS = {"accepted": "pass", "rejected": "fail"}


def tasks_section(result: Mapping[str, Any], figure_dir: str | os.PathLike | None = None) -> str:
    """The tasks result's section: header facts, the table, the decision, the cells not measured, the run's
    failures and the figure (drawn into ``figure_dir``, a temporary folder when None, and embedded; a result
    without measured cells gets a line saying so instead, :func:`kvlab.task_figures.skip_reason`).
    """
    facts = {k: result[k] for k in ("status", "created_utc") if k in result}
    facts.update(model=result.get("model"), max_drop=result.get("max_drop"))
    facts["min_float_score"] = result.get("min_float_score")
    parts = ["<h2>Long-context tasks (kvlab tasks)</h2>", _kv_table(facts)]
    parts.append(
        '<p class="muted">Score: the mean share of reference strings found in the answer (RULER); "all found" '
        "counts the samples with every reference found, with a Wilson 95 % interval. × dyn: the cache's bytes "
        "over the float cache's, measured after the context is filled (as in kvlab eval). A gate fails when a cache loses "
        "more than max_drop of the float score; where the float cache scores below min_float_score the task is "
        "not informative there.</p>"
    )
    body = [[(text, _GATE_CLASS.get(text, "") if i == 6 else "") for i, text in enumerate(row)]
            for row in table_rows(result)]  # fmt: skip
    parts.append(_table(list(COLUMNS), body, {0, 2, 6}))
    parts.append(f'<p class="muted">{html.escape(COLUMN_LEGEND)}</p>')
    decision = [
        [
            (name, ""),
            (d["verdict"], _VERDICT_CLASS.get(d["verdict"], "")),
            (", ".join(d["failed"]) or "-", ""),
        ]
        for name, d in result.get("decision", {}).items()
    ]
    if decision:
        parts.append("<h3>Decision</h3>" + _table(["cache", "verdict", "failed at"], decision, {0, 1, 2}))
    for title, key, columns in (
        ("Not measured", "not_measured", ("task", "context", "reason")),
        ("Failures", "failures", ("stage", "type", "message")),
    ):
        if result.get(key):
            rows = [[(str(r.get(c)), "") for c in columns] for r in result[key]]
            parts.append(f"<h3>{title}</h3>" + _table(list(columns), rows, set(range(len(columns)))))
    skipped = skip_reason(result)
    if skipped:  # the rest of the section still says what the run did
        parts.append(f'<p class="muted">No score-vs-bytes figure: {html.escape(skipped)}.</p>')
        return "\n".join(parts)
    with tempfile.TemporaryDirectory(prefix="kvlab-report-") as tmp:
        path = plot_task_scores(
            result, Path(figure_dir if figure_dir is not None else tmp) / "tasks_scores.png"
        )
        parts.append("<h3>Score against measured × dyn (cache bytes / dynamic's)</h3>" + _png_tag(path, "tasks scores"))
    return "\n".join(parts)


def render_report(
    eval_result: Mapping[str, Any] | None = None,
    tasks_result: Mapping[str, Any] | None = None,
    figure_dir: str | os.PathLike | None = None,
) -> str:
    """The page of an eval result with the tasks section (:func:`tasks_section`) after its figures, or of a tasks
    result alone.

    Raises:
        ValueError: neither result given.
        TypeError: as :func:`kvlab.report_html.render_html`.
    """
    if eval_result is None and tasks_result is None:
        raise ValueError("give an eval result, a tasks result or both")
    sections = () if tasks_result is None else (tasks_section(tasks_result, figure_dir),)
    if eval_result is not None:
        return render_html(eval_result, figure_dir, sections)
    title = f"kvlab tasks report: {(tasks_result.get('model') or {}).get('name', '')}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n{sections[0]}\n</body></html>\n"
    )


def write_report(
    out_path: str | os.PathLike,
    eval_result: Mapping[str, Any] | None = None,
    tasks_result: Mapping[str, Any] | None = None,
    *,
    overwrite: bool = False,
) -> Path:
    """Write :func:`render_report` to ``out_path`` atomically (:func:`kvlab.runtime.atomic.atomic_write_text`).

    Raises:
        FileExistsError: ``out_path`` exists and ``overwrite`` is false (a report is never silently replaced).
        ValueError, TypeError: as :func:`render_report`.
    """
    out_path = Path(out_path)
    if out_path.exists() and not overwrite:
        raise FileExistsError(f"{out_path} exists; pass overwrite=True (--force) to replace it")
    page = render_report(eval_result, tasks_result)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(out_path, page)
