"""Words a newcomer can read: what the eval and inspect reports print, checked on the recorded examples in
docs/examples."""

from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from kvlab.eval.render import COLUMN_LEGEND, print_summary
from kvlab.report_html import render_html

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"
EVICTION = "eval-quick-eviction-2026-12-01.json"  # sink:sink_tokens=0:window_length=256 in every matrix
# kivi-4:compression_ratio=0.5 and the passkey grid at 512 only
MORE_CACHES = "eval-smollm2-more-caches-cpu-2026-12-02.json"
TOVA = "eval-quick-tova-2026-12-01.json"  # no row eligible: decision tune_cache_policy


def _record(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text(encoding="utf-8"))


def _text(result: dict, width: int = 160) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, record=True)
    print_summary(result, console)
    return console.export_text()


def _html_text(page: str) -> str:
    """The page's visible text, cells separated by ' | '."""
    page = re.sub(r"<(style|details)[^>]*>.*?</\1>", "", page, flags=re.S)
    return re.sub(r"\s*(<[^>]+>\s*)+", " | ", page)


def test_column_key_explains_rg_peak_and_the_missing_passkey():
    text = " ".join(_text(_record(MORE_CACHES), width=400).split())
    assert "R/G = residual window R" in text and "group size G (KIVI's or HQQ's quantization group)" in text
    assert "peak MiB = peak of the tensor bytes one generate() call creates" in text
    assert "the weights not counted" in text and "- where not measured" in text
    assert "passkey - = no passkey grid at that context (it runs at --retrieval-contexts" in text
    assert "default the smallest context only" in COLUMN_LEGEND


def test_tune_cache_policy_says_what_it_means_and_what_to_do():
    result = _record(TOVA)
    assert result["summary"]["decision"] == "tune_cache_policy"
    text = " ".join(_text(result, width=400).split())
    decision = text[text.index("decision: none: keep DynamicCache (no candidate passed every gate)") :]
    assert "no candidate passed every gate at any context of the capacity matrix" in decision
    assert "tune_cache_policy" not in text and "None" not in text  # the file's token and Python's None: not words
    assert "eligible crossover (first context passing every gate): none (no context passed every gate)" in text
    assert "recall drop: 2 of 2 rows, passkey drop: 1 of 2 rows" in decision  # the gates the rows failed
    assert "--max-recall-drop, --max-passkey-drop" in decision and "a larger --residual" in decision
    page = _html_text(render_html(result))
    banner = page[page.index("Decision:") : page.index("Gates")]
    assert "none: keep DynamicCache (no candidate passed every gate)" in banner and "tune_cache_policy" not in banner
    assert "no candidate passed every gate at any context" in banner
    accepted = _text(_record(EVICTION), width=400)
    assert "tune_cache_policy" not in accepted and "keep DynamicCache" not in accepted
    from kvlab.eval.decision_words import no_candidate_advice

    nothing = {"summary": {"decision": "tune_cache_policy"}, "rows": []}
    assert "no candidate cache was measured in the capacity matrix" in no_candidate_advice(nothing)
    for row in result["rows"]:
        row.get("gates", {}).update(saves_memory=False)
    assert "longer --contexts" in no_candidate_advice(result)


def test_gates_are_named_in_the_reports_and_the_json_keeps_the_fields(tmp_path, capsys):
    result = _record(EVICTION)
    fields = [
        "nll_delta",
        "topk_overlap",
        "latency_ratio",
        "saves_memory",
        "recall_drop",
        "passkey_drop",
        "kl_mean",
    ]
    assert result["summary"]["decision_gates"] == fields
    names = "ΔNLL, top-k overlap, latency ratio, memory saved, recall drop, passkey drop, KL mean"
    text = " ".join(_text(result, width=400).split())
    assert f"(judged on: {names})" in text and "nll_delta" not in text
    page = render_html(result)
    assert f"(judged on: {names})" in page
    gates = _html_text(page[page.index("<h2>Gates</h2>") : page.index("<h2>Candidates</h2>")])
    assert "| ΔNLL |" in gates and "| KL mean |" in gates and "nll_delta" not in gates
    from kvlab.cli import main

    assert main(["report", str(EXAMPLES / EVICTION), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["decision_gates"] == fields


def _candidate_cells(text: str) -> list[str]:
    """The candidate column of every table body line (the second cell between │)."""
    return [line.split("│")[2].strip() for line in text.splitlines() if line.count("│") > 3]


@pytest.mark.parametrize("record", [EVICTION, MORE_CACHES])
@pytest.mark.parametrize("width", [80, 160])
def test_tables_never_cut_a_cache_name(record, width):
    result = _record(record)
    text = _text(result, width=width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    assert "…" not in text  # rich's ellipsis: a cut cell
    names = {r["candidate"] for r in result["rows"]}
    cells = _candidate_cells(text)
    assert set(cells) <= names | {"candidate"}, set(cells) - names  # every cell a whole name, none folded
    titles = [line.strip() for line in lines if "matrix" in line or "Passkey retrieval" in line]
    for matrix, title in (("capacity", "Capacity matrix"), ("window", "Residual-window matrix")):
        if any(r["matrix"] == matrix for r in result["rows"]):
            assert any(t.startswith(title) for t in titles), (matrix, titles)
    assert any(t.startswith("Passkey retrieval") for t in titles)
    long = max(names, key=len)
    assert cells.count(long) >= 3  # capacity, window (or its parts) and passkey tables each name it whole


def test_a_table_too_wide_for_the_terminal_is_split_and_keeps_every_column():
    result = _record(MORE_CACHES)
    narrow, wide = _text(result, width=80), _text(result, width=400)
    assert "part 1 of" in narrow and "part 1 of" not in wide
    header = next(line for line in wide.splitlines() if "┃" in line and "R/G" in line)
    for column in [c.strip() for c in header.split("┃") if c.strip()]:
        assert column in narrow, column


def test_inspect_legend_says_what_sat_and_flush_count(capsys):
    import argparse

    from kvlab.commands.inspect import _print_tables

    report = json.loads((EXAMPLES / "inspect-reference-4096.json").read_text(encoding="utf-8"))
    _print_tables(report, argparse.Namespace(json=None, figure=None))
    out = " ".join(capsys.readouterr().out.split())
    assert "sat / flush = share of the layer's K and V elements (all its KV heads)" in out
    assert "448 for e4m3 and 57344 for e5m2: clamped to it) / flushed to zero (non-zero, stored as 0)" in out
    assert f"calibrated on the first {report['settings']['calibrate_tokens']} prompt tokens" in out


def test_html_summary_has_readable_labels_and_one_precision():
    result = _record(MORE_CACHES)
    page = render_html(result)
    summary = _html_text(page[page.index("<h2>Decision</h2>") : page.index("<h2>Gates</h2>")])
    assert "per_candidate" not in summary and "memory_reduction_onset_context" not in summary
    assert "| memory-reduction onset (first context saving bytes) | 512 |" in summary
    assert "| selected: ΔNLL (nats/token) | 0.00107 |" in summary  # 3 significant digits, not 0.001073
    assert "| selected: top-k overlap | 0.988 |" in summary
    assert "| kivi-k8v4 | 512 | 512 | 512, 2048, 4096 |" in summary  # the per-candidate table
    assert "| judged on | ΔNLL, top-k overlap" in summary
    passkey = _html_text(page[page.index("<h2>Passkey retrieval</h2>") : page.index("<h2>Figures</h2>")])
    assert "| 0.70 | 0.60-0.78 |" in passkey and not re.search(r"\d - \d", passkey)  # was "0.6042 - 0.7811"
    rows = _html_text(page[page.index("<h2>Table: capacity") : page.index("<h2>Passkey retrieval</h2>")])
    assert "| -0.0151 |" in rows and "| 0.963 |" in rows and "-0.01510" not in rows
    assert "0.9625" not in rows and "0.003604" not in rows  # 4 significant digits before


def test_html_summary_keeps_a_field_it_does_not_know():
    result = copy.deepcopy(_record(TOVA))
    result["summary"]["a_new_field"] = 0.123456
    summary = _html_text(render_html(result).split("<h2>Gates</h2>")[0])
    assert "| a_new_field | 0.123 |" in summary


def test_a_dry_run_report_says_no_device_was_loaded(tmp_path, capsys):
    from kvlab.cli import main

    assert main(["eval", "--dry-run", "--quick", "--out-dir", str(tmp_path), "--label", "dry"]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "dry.json")]) == 0
    out = capsys.readouterr().out
    assert "device not loaded (dry run; --device auto)" in out and "device None" not in out
    recorded = _record(EVICTION)  # a measured run still names its device
    printed = io.StringIO()
    print_summary(recorded, Console(file=printed, width=200))
    assert f"device {recorded['provenance']['hardware']['device']}" in printed.getvalue()


def test_a_run_without_long_context_probes_does_not_print_their_gates():
    # `kvlab eval --no-long-context` printed "long-context gates: recall drop ≤ 0.05 ..., passkey drop ≤ 0.05"
    # above a table with no recall or passkey column
    result = _record("eval-fp8-kl512-4096-2026-12-01.json")
    assert result["settings"]["long_context"] is False
    text = " ".join(_text(result).split())
    assert "long-context gates: KL mean ≤ 0.1 nats; recall and passkey not measured (--no-long-context)" in text
    assert "recall drop ≤" not in text
    probed = " ".join(_text(_record("eval-default-cpu-2026-12-01.json")).split())
    assert "long-context gates: recall drop ≤ 0.05 (worst distance), passkey drop ≤ 0.05" in probed


def test_column_key_explains_only_the_columns_shown():
    """A --no-long-context run has no recall, passkey or KL column: its legend does not explain them (it did)."""
    result = copy.deepcopy(_record(MORE_CACHES))
    full = " ".join(_text(result, width=400).split())
    assert "recall = accuracy" in full and "KL = mean KL(dynamic || cache)" in full and "passkey - =" in full
    for row in result["rows"]:
        for key in ("recall_accuracy", "passkey_accuracy", "kl_mean"):
            row.pop(key, None)
    from kvlab.eval.render import column_legend

    legend = column_legend(result)
    assert "recall" not in legend and "passkey" not in legend and "KL =" not in legend
    assert legend.startswith("columns: R/G = residual window R") and "peak MiB = peak" in legend


def test_a_dry_run_report_says_what_is_planned_and_that_nothing_was_measured(tmp_path, capsys):
    """kvlab report on a --dry-run result printed its header only: now the planned cells per matrix."""
    from kvlab.cli import main

    assert main(["eval", "--dry-run", "--contexts", "512,1024", "--out-dir", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("eval-*.json")
    result = json.loads(path.read_text(encoding="utf-8"))
    capacity = sum(c["matrix"] == "capacity" for c in result["plan"])
    window = len(result["plan"]) - capacity
    assert capacity and window and not result["rows"]
    capsys.readouterr()
    assert main(["report", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"{len(result['plan'])} cells planned ({capacity} capacity, {window} window), nothing measured" in out
    assert "without --dry-run" in out
    done = _record(MORE_CACHES)
    assert "cells planned" not in _text(done)


def test_the_summary_says_how_quiet_the_machine_was_while_timing():
    """A run on a loaded machine just under the busy limits was reported as trusted with no word about the load
    (a new user's 243 s run): every summary now shows the CPU share and the other processes' cores."""
    from kvlab.eval.render import timing_line
    from kvlab.runtime.timing import MIN_CPU_SHARE

    result = copy.deepcopy(_record(MORE_CACHES))
    cont = [r["timing_contention"] for r in result["rows"] if r.get("timing_contention")]
    share = min(c["cpu_share"] for c in cont)
    text = " ".join(_text(result, width=400).split())
    assert f"timing: this process got {share:.0%} or more" in text and f"busy below {MIN_CPU_SHARE:.0%}" in text
    assert f"0 of {len(cont)} timed cells busy" in text
    row = next(r for r in result["rows"] if r.get("timing_contention"))
    row["timing_contention"] = {**row["timing_contention"], "cpu_share": 0.42, "other_cores": 1.7, "busy": True}
    line = timing_line(result)
    assert "got 42% or more" in line and "at most 1.70 of 2 cores" in line and f"1 of {len(cont)} timed" in line
    for r in result["rows"]:
        r.pop("timing_contention", None)
    assert timing_line(result) is None


def test_a_faster_eligible_row_is_named_beside_a_slower_selection():
    """The rule picks the most bytes saved: hqq-4 at 1.5x latency over a kivi-4 that is faster than the float cache
    (a new user asked why); the summary and the HTML page now name the faster eligible row and the flag."""
    from kvlab.eval.decision_words import FASTER, faster_alternative

    result = _record("eval-default-cpu-2026-12-01.json")
    sel = result["summary"]["selected_candidate"]
    rows = [
        r
        for r in result["rows"]
        if r["matrix"] == "capacity" and r.get("eligible") and r["context_length"] == sel["context_length"]
        and r["candidate"] != sel["candidate"]
    ]
    fast = min(rows, key=lambda r: r["latency_ratio"])
    assert fast["latency_ratio"] <= FASTER * sel["latency_ratio"]
    line = faster_alternative(result)
    assert line.startswith(f"faster and eligible at {sel['context_length']:,}: {fast['candidate']}, cache ")
    assert f"{fast['latency_ratio']:.2f}x latency (selected {sel['candidate']}" in line
    assert "--max-latency-ratio N leaves out rows slower than N x dynamic" in line
    assert line in " ".join(_text(result, width=1000).split())
    assert line in " ".join(_html_text(render_html(result)).split()).replace("&#x27;", "'")
    slow = copy.deepcopy(result)  # every other eligible row as slow as the selection: nothing to name
    for r in slow["rows"]:
        if r in rows or (r["matrix"] == "capacity" and r["context_length"] == sel["context_length"]
                         and r["candidate"] != sel["candidate"]):
            r["latency_ratio"] = sel["latency_ratio"]
    assert faster_alternative(slow) is None


def test_agree_says_what_it_measures_why_it_may_be_low_and_where_it_first_differs():
    """kivi-4's agree of 0.06 beside a top-k of 0.99 read as alarming: the legend says a low agree is expected
    after one flip and that the gates read the teacher-forced numbers; the cell names the first differing token."""
    result = _record(MORE_CACHES)
    row = next(r for r in result["rows"] if r["candidate"] != "dynamic" and r["first_divergence_index"] is not None)
    text = " ".join(_text(result, width=400).split())
    assert "agree = share of the generated greedy tokens equal to dynamic's, @n = the first that differs" in text
    assert "so a low value beside good top-k and KL is expected: the gates use the teacher-forced NLL" in text
    assert f"{row['token_agreement_rate']:.2f} @{row['first_divergence_index']}" in text
    exact = copy.deepcopy(result)
    for r in exact["rows"]:
        if r["candidate"] != "dynamic":
            r["first_divergence_index"] = None  # no token differs: no @n
    assert " @" not in " ".join(_text(exact, width=400).split()).split("columns:")[0]
    page = _html_text(render_html(result))
    assert "first divergence is the first that differs (from 0): once one token differs" in page


def test_html_warning_rows_without_a_warning_say_none_and_what_not_measured_means():
    """"long context not measured: -" read as "long context was not measured": a warning field holding none says
    "none", and the probes' row says whether every probe fit or the run skipped them (--no-long-context)."""
    result = _record(MORE_CACHES)
    assert result["summary"]["long_context_not_measured"] is None and result["summary"]["eviction_warning"] is None
    page = _html_text(render_html(result))
    assert "long context not measured | none: every recall and passkey probe fit its context |" in page
    assert "eviction warning | none |" in page and "eviction warning | - |" not in page
    skipped = copy.deepcopy(result)
    skipped["settings"]["long_context"] = False
    page = _html_text(render_html(skipped))
    assert "long context not measured | not measured: the run had --no-long-context" in page
