"""One self-contained HTML page for a ``kvlab eval`` result: provenance, decision, gates, tables and figures.

The page has no external resource: CSS is inline and every figure is a PNG embedded as base64, so the file can
be mailed or archived alone. Every number on it is read from the result dict it is given (and the figures are
drawn from that dict by :mod:`kvlab.figures` when the page is written). Rows are read by the keys of the eval
schema (``matrix``, ``candidate``, ``context_length``, ``residual_length``, ``cache_bytes``,
``cache_bytes_ratio``, ``nll_delta``, ``topk_overlap``, ``latency_ratio``, ...); keys it does not know are still
shown, in the "Other fields" section, so nothing in the file is hidden.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvlab.eval.decision import preference
from kvlab.eval.decision_words import (
    GATE_NAMES,
    GREEDY_AGREEMENT_WHY,
    alternative_line,
    bundled_model_note,
    decision_rule,
    decision_text,
    gate_names,
    no_candidate_advice,
    window_quality_note,
)
from kvlab.eval.io import current_command
from kvlab.eval.resume import elapsed_words
from kvlab.eval.schema import REQUIRED_FIELDS
from kvlab.figures import gate_bounds, plot_eval_figures
from kvlab.runtime.atomic import atomic_write_text

# Row columns in display order (shown when at least one row has them), with their headers.
ROW_COLUMNS = (
    ("candidate", "candidate"),
    ("context_length", "context"),
    ("new_tokens", "new tokens"),
    ("residual_length", "R"),
    ("group_size", "G"),
    ("cache_bytes", "cache bytes"),
    ("cache_bytes_ratio", "bytes / dynamic"),
    ("mean_nll", "mean NLL"),
    ("nll_delta", "NLL delta"),
    ("topk_overlap", "top-k overlap"),
    ("token_agreement_rate", "token agreement"),
    ("first_divergence_index", "first divergence"),
    ("kl_mean", "KL mean (nats)"),
    ("kl_p99", "KL p99 (nats)"),
    ("recall_accuracy", "recall accuracy"),
    ("recall_drop", "recall drop"),
    ("passkey_accuracy", "passkey accuracy"),
    ("passkey_drop", "passkey drop"),
    ("median_ms", "median ms"),
    ("ms_per_token", "ms / token"),
    ("latency_ratio", "latency / dynamic"),
    ("incremental_peak_bytes", "incremental peak bytes"),
    ("eligible", "verdict"),
)
# Which per-row gate (``row["gates"]``, written by the runner) judges which column.
GATE_OF_COLUMN = {
    "cache_bytes_ratio": "saves_memory",
    "nll_delta": "nll_delta",
    "topk_overlap": "topk_overlap",
    "latency_ratio": "latency_ratio",
    "recall_drop": "recall_drop",
    "passkey_drop": "passkey_drop",
    "kl_mean": "kl_mean",
}
# the sections the page draws (the rest of a result shows as raw JSON at the end): the schema's fields and the run's
_SECTIONS_SHOWN = {*REQUIRED_FIELDS, "created_utc", "command", "elapsed_s"}

_CSS = """
body { font-family: -apple-system, 'Segoe UI', 'DejaVu Sans', Arial, sans-serif; margin: 24px auto;
       padding: 0 16px; box-sizing: border-box;
       max-width: 1400px; color: #1d1d1f; background: #ffffff; line-height: 1.4; }
h1 { color: #1f4e79; border-bottom: 3px solid #1f4e79; padding-bottom: 6px; }
h2 { color: #1f4e79; margin-top: 32px; }
table { border-collapse: collapse; margin: 8px 0 16px 0; font-size: 12px; }
.scroll { overflow-x: auto; }
th, td { border: 1px solid #c8d3de; padding: 3px 6px; text-align: right; vertical-align: top; }
th { background: #1f4e79; color: #ffffff; }
td.key, th.key { text-align: left; }
td.key { max-width: 640px; overflow-wrap: anywhere; }
tr:nth-child(even) td { background: #f2f6fa; }
td.pass { background: #d8eed9 !important; color: #1b5e20; }
td.fail { background: #f8d7d3 !important; color: #b71c1c; font-weight: bold; }
.decision { font-size: 20px; padding: 12px 16px; border-left: 8px solid #c1440e; background: #fbeee8; }
.decision.accept { border-left-color: #2e7d32; background: #e8f5e9; }
.decision.caveat { border-left-color: #b8860b; background: #fff8e1; }
.warning { padding: 8px 16px; margin: 6px 0; border-left: 8px solid #b8860b; background: #fff8e1; }
td.untrusted { background: #fff3cd !important; color: #7a5a00; }
td.verdict { white-space: nowrap; overflow-wrap: normal; }
img { max-width: 100%; border: 1px solid #c8d3de; margin: 8px 0; }
pre { background: #f2f6fa; padding: 8px; font-size: 11px; overflow-x: auto; }
summary { cursor: pointer; color: #1f4e79; margin: 8px 0; }
.muted { color: #6b6b6b; font-size: 12px; }
"""


def _fmt(value: Any) -> str:
    """A cell's text: ints with thousands separators, floats to 4 significant digits, JSON for containers."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        # >= 1000: whole numbers with separators (no "1.675e+04" next to "2166" in one column)
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, default=str)
    return str(value)


def _num(value: Any) -> str:
    """A measured value's text: floats to 3 significant digits, trailing zeros kept so that a column reads at one
    precision ("2.20" next to "1.32"; "1.00e-05" for tiny ones), whole numbers with separators from 1000 and an
    exact zero as "0"; anything else as :func:`_fmt`."""
    if isinstance(value, bool) or not isinstance(value, float) or not math.isfinite(value):
        return _fmt(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if value == 0:
        return "0"
    text = f"{value:#.3g}"
    return text if "e" in text else text.rstrip(".")


def _interval(ci: Any) -> str:
    """A 95 % interval ``[lo, hi]`` of a fraction as ``0.96-1.00`` (the text report's form); ``-`` for none."""
    if not isinstance(ci, list | tuple) or len(ci) != 2 or not all(isinstance(v, int | float) for v in ci):
        return "-"
    return f"{ci[0]:.2f}-{ci[1]:.2f}"


def _flatten(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested mappings as ``(dotted.key, leaf)`` pairs; lists stay leaves."""
    if isinstance(data, Mapping):
        items = []
        for key, value in data.items():
            items.extend(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return items or [(prefix, {})]
    return [(prefix, data)]


def _kv_table(data: Any) -> str:
    rows = "".join(
        f'<tr><td class="key">{html.escape(k)}</td><td class="key">{html.escape(_fmt(v))}</td></tr>'
        for k, v in _flatten(data)
    )
    return f'<div class="scroll"><table><tr><th class="key">field</th><th class="key">value</th></tr>{rows}</table></div>'


def _cell_class(row: Mapping[str, Any], column: str, bounds: Mapping[str, tuple[str, float]]) -> str:
    """``pass``/``fail`` from the row's own gate verdicts when it has them, else from the result's thresholds."""
    verdicts = row.get("gates")
    if isinstance(verdicts, Mapping) and GATE_OF_COLUMN.get(column) in verdicts:
        verdict = verdicts[GATE_OF_COLUMN[column]]
        if verdict is None:  # a gate not used for this row (e.g. latency timed on a busy machine)
            return "untrusted"
        return "pass" if verdict else "fail"
    value = row.get(column)
    if column not in bounds or isinstance(value, bool) or not isinstance(value, int | float):
        return ""
    side, threshold = bounds[column]
    return "pass" if (value <= threshold if side == "max" else value >= threshold) else "fail"


def _verdict(row: Mapping[str, Any]) -> tuple[str, str]:
    if "eligible" not in row:
        return ("baseline", "verdict") if row.get("candidate") == "dynamic" else ("-", "verdict")
    return ("eligible", "pass verdict") if row["eligible"] else ("rejected", "fail verdict")


def _table(header: list[str], body: list[list[tuple[str, str]]], left: set[int]) -> str:
    """``body`` cells are ``(text, css class)``; columns in ``left`` are left-aligned."""

    def attr(classes: str) -> str:
        return f' class="{classes}"' if classes else ""

    head = "".join(
        f"<th{attr('key' if i in left else '')}>{html.escape(h)}</th>" for i, h in enumerate(header)
    )
    rows = []
    for cells in body:
        tds = []
        for i, (text, css) in enumerate(cells):
            classes = " ".join(c for c in ("key" if i in left else "", css) if c)
            tds.append(f"<td{attr(classes)}>{html.escape(text)}</td>")
        rows.append("<tr>" + "".join(tds) + "</tr>")
    return f'<div class="scroll"><table><tr>{head}</tr>{"".join(rows)}</table></div>'


def _rows_table(rows: list[Mapping[str, Any]], bounds: Mapping[str, tuple[str, float]]) -> str:
    columns = [(k, h) for k, h in ROW_COLUMNS if any(k in r for r in rows)]
    body = []
    for r in rows:
        cells = []
        for k, _ in columns:
            cells.append(_verdict(r) if k == "eligible" else (_num(r.get(k)), _cell_class(r, k, bounds)))
        body.append(cells)
    return _table(
        [h for _, h in columns], body, {0, len(columns) - 1} if columns[-1][0] == "eligible" else {0}
    )


def _records_table(records: list[Any]) -> str:
    """A table of flat records (candidates, failures): one column per key seen."""
    records = [r for r in records if isinstance(r, Mapping)]
    keys = list(dict.fromkeys(k for r in records for k in r))
    body = [[(_fmt(r.get(k)), "") for k in keys] for r in records]
    return _table(keys, body, set(range(len(keys))))


# Candidate settings that families record under different names (kvlab.eval.candidates, ``describe``): KIVI
# writes key_axis/value_axis ("per-channel"/"per-token"), transformers' QuantizedCache (HQQ, quanto) writes its
# own arguments axis_key/axis_value (an axis index). The candidates table shows both in one pair of columns,
# the index as ``axis_key=1`` so it is not mistaken for KIVI's wording; the result file is not changed.
_CANDIDATE_COLUMN_OF = {"axis_key": "key_axis", "axis_value": "value_axis"}


def _candidates_table(records: list[Any]) -> str:
    """:func:`_records_table` of the candidates, with ``axis_key``/``axis_value`` in the ``key_axis``/
    ``value_axis`` columns."""
    unified = []
    for r in records:
        if not isinstance(r, Mapping):
            continue
        row: dict[str, Any] = {}
        for key, value in r.items():
            column = _CANDIDATE_COLUMN_OF.get(key)
            if column is None or column in r:  # both names in one record: keep both, hide nothing
                row[key] = value
            else:
                row[column] = f"{key}={_fmt(value)}"
        unified.append(row)
    return _records_table(unified)


def _passkey_table(rows: list[Mapping[str, Any]]) -> str:
    """Correct / trials per needle depth for every capacity row with the passkey grid, with the mean accuracy and
    its Wilson 95 % interval; empty when no row has it."""
    rows = [r for r in rows if r.get("matrix") == "capacity" and isinstance(r.get("passkey"), Mapping)]
    if not rows:
        return ""
    depths = sorted({d["depth"] for r in rows for d in r["passkey"].get("depths", [])})
    body = []
    for r in rows:
        by_depth = {d["depth"]: d for d in r["passkey"].get("depths", [])}
        cells = [
            (f"{by_depth[p]['correct']}/{by_depth[p]['trials']}", "") if p in by_depth else ("-", "")
            for p in depths
        ]
        acc, drop = r.get("passkey_accuracy"), r.get("passkey_drop")
        body.append(
            [(_fmt(r.get("context_length")), ""), (_fmt(r.get("candidate")), "")]
            + cells
            + [  # two decimals, as in the text report
                ("-" if not isinstance(acc, int | float) else f"{acc:.2f}", ""),
                (_interval(r["passkey"].get("ci95")), ""),
                (
                    "-" if not isinstance(drop, int | float) else f"{drop:+.2f}",
                    _cell_class(r, "passkey_drop", {}),
                ),
            ]
        )
    header = ["context", "candidate", *[f"depth {100 * p:g} %" for p in depths], "mean", "95 % CI", "drop"]
    return _table(header, body, {1}) + (
        '<p class="muted">A trial is correct when every answer token is the argmax, teacher-forced through the '
        "cache. Depth 0 % is the prompt's start, 100 % the latest position outside the residual window.</p>"
    )


# summary fields holding a warning the reader must see next to the decision, not in a table row under it
WARNING_KEYS = (
    "latency_warning",
    "long_context_warning",
    "long_context_not_measured",
    "eviction_warning",
    "dtype_warning",
    "positions_warning",
)


# what the summary's fields are called on the page (kvlab.eval.decision.summarize writes them); a field not named
# here is shown under its key, so nothing in the file is hidden
SUMMARY_LABELS = {
    "decision": "decision",
    "decision_gates": "judged on",
    "memory_reduction_onset_context": "memory-reduction onset (first context saving bytes)",
    "eligible_crossover_context": "eligible crossover (first context passing every gate)",
    "eligible_candidate_count": "eligible capacity rows",
    "latency_trusted": "latency trusted (every capacity cell timed on a quiet machine)",
    "failed_candidates": "not judged (failed in every capacity cell)",
    "latency_warning": "latency warning",
    "long_context_warning": "long-context warning",
    "long_context_not_measured": "long context not measured",
    "eviction_warning": "eviction warning",
    "dtype_warning": "dtype warning",
    "positions_warning": "positions warning",
}
SELECTED_LABELS = {
    "candidate": "candidate",
    "context_length": "context (tokens)",
    "residual_length": "residual window R",
    "group_size": "group size G",
    "cache_bytes": "cache bytes",
    "cache_bytes_ratio": "cache bytes / dynamic",
    "cache_bytes_saved": "cache bytes saved",
    "nll_delta": "ΔNLL (nats/token)",
    "nll_ratio": "NLL / dynamic",
    "topk_overlap": "top-k overlap",
    "latency_ratio": "latency / dynamic",
    "incremental_peak_saved_bytes": "peak bytes saved",
}
PER_CANDIDATE_COLUMNS = (
    ("memory_reduction_onset_context", "memory-reduction onset"),
    ("eligible_crossover_context", "eligible crossover"),
    ("eligible_contexts", "eligible contexts"),
)


def _summary_value(key: str, value: Any) -> str:
    """A summary field's text: gate names for ``decision_gates``, the decision in words (:func:`decision_text`),
    each failed candidate with its first failure, contexts without separators in a list (``512, 2048``), measured
    numbers by :func:`_num`."""
    if key == "decision_gates" and isinstance(value, list):
        return ", ".join(gate_names(value))
    if key == "decision" and isinstance(value, str):
        return decision_text({"decision": value})
    if key == "failed_candidates" and isinstance(value, list):
        return (
            "; ".join(
                f"{f.get('candidate')} (first at {f.get('stage')}: {f.get('type')}: {f.get('message')})"
                if isinstance(f, Mapping)
                else _fmt(f)
                for f in value
            )
            or "none"
        )
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return ", ".join(map(str, value)) or "none"
    return _num(value)


def _no_warning(key: str, result: Mapping[str, Any] | None) -> str:
    """The text of a warning field that holds none: "none", and for ``long_context_not_measured`` what that means
    (every probe fit its context; or, in a ``--no-long-context`` run, that no probe ran: "-" read as either)."""
    if key != "long_context_not_measured":
        return "none"
    settings = (result or {}).get("settings")
    if isinstance(settings, Mapping) and settings.get("long_context") is False:
        return "not measured: the run had --no-long-context (recall and passkey skipped)"
    return "none: every recall and passkey probe fit its context"


def _summary_tables(summary: Mapping[str, Any], result: Mapping[str, Any] | None = None) -> str:
    """The summary's fields under readable names: the decision, the selected row and the other fields (a warning
    field holding none says so, :func:`_no_warning`), then the per-candidate onsets and crossovers as a table."""
    head = [k for k in ("decision", "decision_gates") if k in summary]
    rows = [(SUMMARY_LABELS[k], _summary_value(k, summary[k])) for k in head]
    selected = summary.get("selected_candidate")
    if isinstance(selected, Mapping):
        rows += [
            (f"selected: {SELECTED_LABELS.get(k, k)}", _summary_value(k, v)) for k, v in selected.items()
        ]
    elif "selected_candidate" in summary:
        rows.append(("selected", _fmt(selected)))
    for key, value in summary.items():
        if key not in ("per_candidate", "selected_candidate", *head):
            text = _no_warning(key, result) if key in WARNING_KEYS and value is None else _summary_value(key, value)
            rows.append((SUMMARY_LABELS.get(key, key), text))
    body = [[(label, ""), (text, "")] for label, text in rows]
    out = _table(["field", "value"], body, {0, 1})
    per = summary.get("per_candidate")
    if isinstance(per, Mapping) and per:
        table = [
            [(str(name), "")]
            + [
                (_summary_value(k, p.get(k)) if isinstance(p, Mapping) else "-", "")
                for k, _ in PER_CANDIDATE_COLUMNS
            ]
            for name, p in per.items()
        ]
        out += _table(["candidate", *[h for _, h in PER_CANDIDATE_COLUMNS]], table, {0, 3})
    return out


def _decision_block(summary: Any, result: Mapping[str, Any] | None = None) -> str:
    """The decision banner (green: accepted with no warning; amber: accepted with warnings, shown under it; red:
    no candidate accepted, with what that means and what to try) and the summary's fields."""
    warnings: list[str] = []
    if isinstance(summary, Mapping):
        name, detail = summary.get("decision"), _summary_tables(summary, result)
        warnings = [str(summary[k]) for k in WARNING_KEYS if summary.get(k)]
    else:
        name, detail = summary, ""
    css = "decision"
    if name and str(name).startswith("accept"):
        css = "decision caveat" if warnings else "decision accept"
    gates = summary.get("decision_gates") if isinstance(summary, Mapping) else None
    rests = (
        f' <span class="muted">(judged on: {html.escape(", ".join(gate_names(gates)))})</span>'
        if gates
        else ""
    )
    advice = no_candidate_advice(dict(result, summary=summary)) if isinstance(result, Mapping) else None
    notes = f"<p>{html.escape(advice)}</p>" if advice else ""
    notes += "".join(f'<div class="warning">warning: {html.escape(w)}</div>' for w in warnings)
    prefer = preference(dict(result)) if isinstance(result, Mapping) else "memory"
    rule = decision_rule(summary, prefer) if isinstance(summary, Mapping) else None
    notes += f'<p class="muted">({html.escape(rule)})</p>' if rule else ""
    other = alternative_line(dict(result, summary=summary)) if isinstance(result, Mapping) else None
    notes += f"<p>{html.escape(other)}</p>" if other else ""
    shown = decision_text(summary) if isinstance(summary, Mapping) else _fmt(name)  # words, not the file's token
    return f'<div class="{css}">Decision: <b>{html.escape(shown)}</b>{rests}</div>{notes}{detail}'


def _settings_shown(result: Mapping) -> Any:
    """The settings as requested, with what an automatic one resolved to in this run beside it (``threads: -`` and
    ``device: auto`` read as unknown while the provenance had the values) and the prompt marked unused in held-out
    mode."""
    settings = result.get("settings")
    if not isinstance(settings, Mapping):
        return settings
    shown = dict(settings)
    prov = result.get("provenance") if isinstance(result.get("provenance"), Mapping) else {}
    hardware = prov.get("hardware") if isinstance(prov.get("hardware"), Mapping) else {}
    if shown.get("threads") is None and prov.get("torch_threads") is not None:
        shown["threads"] = f"auto ({prov['torch_threads']} in this run)"
    if shown.get("device") == "auto" and hardware.get("device"):
        shown["device"] = f"auto ({hardware['device']} in this run)"
    if shown.get("prompt_mode") == "heldout" and shown.get("prompt"):
        shown["prompt"] = f"{shown['prompt']} (unused: prompt_mode heldout cuts the held-out text)"
    return shown


def _gates_table(gates: Any) -> str:
    bounds = gate_bounds(gates if isinstance(gates, Mapping) else None)
    if not bounds:
        return _kv_table(gates) if gates else "<p>No gates recorded.</p>"
    body = [
        [(GATE_NAMES.get(m, m), ""), ("<=" if side == "max" else ">=", ""), (f"{threshold:g}", "")]
        for m, (side, threshold) in bounds.items()
    ]
    return _table(["metric", "passes if", "threshold"], body, {0}) + (
        '<p class="muted">A candidate row is eligible when it passes every gate and saves cache bytes.</p>'
    )


def _png_tag(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _details(title: str, data: Any) -> str:
    text = json.dumps(data, indent=1, default=str)
    return f"<details><summary>{html.escape(title)}</summary><pre>{html.escape(text)}</pre></details>"


def _header(result: Mapping[str, Any]) -> dict:
    """The fields at the top of the page: status, times, schema and the command; a resumed run's elapsed time in words
    too (the last session's and the whole run's, :func:`kvlab.eval.resume.elapsed_words`)."""
    header = {k: result[k] for k in ("status", "created_utc", "elapsed_s", "schema_version") if k in result}
    if isinstance(result.get("provenance"), Mapping) and result["provenance"].get("resumed"):
        header["elapsed"] = elapsed_words(dict(result))
    if isinstance(result.get("command"), list):  # as a shell takes it: an empty value was lost in " ".join
        command, notes = current_command(result["command"])  # --window-residuals '' as the CLI spells it now
        header["command"] = shlex.join(command) + "".join(f" ({n})" for n in notes)
    return header


def _matrix_sections(result: Mapping[str, Any], rows: list, bounds: Mapping[str, tuple[str, float]]) -> list[str]:
    """A heading, a note and a table per matrix (rows without one: "rows"); the window matrix's table has the note
    on transformers' QuantizedCache under it (:func:`kvlab.eval.decision_words.window_quality_note`)."""
    parts = []
    for matrix in dict.fromkeys(r.get("matrix", "rows") for r in rows):
        subset = [r for r in rows if r.get("matrix", "rows") == matrix]
        parts.append(f"<h2>Table: {html.escape(str(matrix))} matrix ({len(subset)} rows)</h2>")
        parts.append(
            '<p class="muted">Cells judged by a gate are green when they pass it and red when they fail; '
            "every field of every row is in the raw rows below. Token agreement compares the greedy tokens "
            "generated with the cache and with dynamic, first divergence is the first that differs (from 0): "
            f"{html.escape(GREEDY_AGREEMENT_WHY)}.</p>"
        )
        parts.append(_rows_table(subset, bounds))
        note = window_quality_note(dict(result)) if matrix == "window" else None
        if note:
            parts.append(f'<p class="muted">note: {html.escape(note)}</p>')
    return parts


def render_html(
    result: Mapping[str, Any], figure_dir: str | os.PathLike | None = None, sections: tuple[str, ...] = ()
) -> str:
    """The page as a string. Figures are drawn into ``figure_dir`` (a temporary folder when ``None``) and
    embedded; ``sections`` (HTML, e.g. :func:`kvlab.report_tasks.tasks_section`) go after the figures.

    Raises:
        TypeError: ``result`` is not a mapping or its ``rows`` is not a list.
    """
    if not isinstance(result, Mapping):
        raise TypeError(f"`result` must be a mapping (a parsed eval result), got {type(result).__name__}")
    rows = result.get("rows")
    rows = [] if rows is None else rows
    if not isinstance(rows, list):
        raise TypeError(f"`result['rows']` must be a list, got {type(rows).__name__}")
    gates = result.get("gates") if isinstance(result.get("gates"), Mapping) else None
    bounds = gate_bounds(gates)
    label = result.get("label")
    title = f"kvlab eval report{': ' + str(label) if label else ''}"

    parts = [f"<h1>{html.escape(title)}</h1>"]
    header = _header(result)
    if header:
        parts.append(_kv_table(header))
    parts.append("<h2>Decision</h2>" + _decision_block(result.get("summary", result.get("decision")), result))
    from kvlab.eval.margins import margin_warning

    close = margin_warning(result) if isinstance(result, Mapping) else None
    if close:
        parts.append(f'<div class="warning">warning: {html.escape(close)}</div>')
    note = bundled_model_note(result) if isinstance(result, Mapping) else None
    if note:
        parts.append(f'<div class="warning">note: {html.escape(note)}</div>')
    parts.append("<h2>Gates</h2>" + _gates_table(result.get("gates")))
    if result.get("candidates"):
        parts.append("<h2>Candidates</h2>" + _candidates_table(result["candidates"]))

    parts.extend(_matrix_sections(result, rows, bounds))
    passkey = _passkey_table(rows)
    if passkey:
        parts.append("<h2>Passkey retrieval</h2>" + passkey)
    if result.get("failures"):
        parts.append(f"<h2>Failures ({len(result['failures'])})</h2>" + _records_table(result["failures"]))

    with tempfile.TemporaryDirectory(prefix="kvlab-report-") as tmp:
        figures = plot_eval_figures(result, figure_dir if figure_dir is not None else tmp)
        if figures:
            parts.append("<h2>Figures</h2>")
            for path in figures:
                parts.append(
                    f"<h3>{html.escape(path.stem.replace('_', ' '))}</h3>" + _png_tag(path, path.stem)
                )

    parts.extend(sections)
    parts.append("<h2>Provenance</h2>" + _kv_table(result.get("provenance", {})))
    if "settings" in result:
        parts.append("<h2>Settings</h2>" + _kv_table(_settings_shown(result)))
    other = {k: v for k, v in result.items() if k not in _SECTIONS_SHOWN}
    if other:
        parts.append("<h2>Other fields</h2>" + _kv_table(other))
    if rows:
        parts.append("<h2>Raw data</h2>" + _details(f"all {len(rows)} rows, every field", rows))
    if result.get("plan"):
        parts.append(_details(f"the plan ({len(result['plan'])} cells)", result["plan"]))
    body = "\n".join(parts)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def write_html_report(
    result: Mapping[str, Any], out_path: str | os.PathLike, *, overwrite: bool = False
) -> Path:
    """Write :func:`render_html` of ``result`` to ``out_path`` atomically
    (:func:`kvlab.runtime.atomic.atomic_write_text`).

    Raises:
        FileExistsError: ``out_path`` exists and ``overwrite`` is false (a report is never silently replaced).
        TypeError: see :func:`render_html`.
    """
    out_path = Path(out_path)
    if out_path.exists() and not overwrite:
        raise FileExistsError(f"{out_path} exists; pass overwrite=True (--force) to replace it")
    page = render_html(result)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(out_path, page)
