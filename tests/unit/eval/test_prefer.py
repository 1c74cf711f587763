"""``kvlab eval --prefer {memory,latency}``: the rule that selects among the rows passing every gate, on hand-made
rows, through the result file, ``kvlab report`` (text and HTML) and ``kvlab eval --dry-run``. Expected selections
are written out here, not re-computed with the code under test."""

from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from kvlab.cli import main
from kvlab.eval.config import EvalConfig, Gates
from kvlab.eval.decision import apply_gates, decide, preference, summarize
from kvlab.eval.decision_words import alternative_line, decision_rule, faster_alternative, smaller_alternative
from kvlab.eval.io import read_result
from kvlab.eval.render import print_summary
from kvlab.eval.schema import validate_result
from kvlab.report_html import render_html

GATES = Gates(max_nll_delta=0.5, min_topk_overlap=0.6, max_latency_ratio=2.0)
EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "eval-default-cpu-2026-12-01.json"


def cap_row(name: str, ctx: int, saved: int, lat: float, nll: float = 0.1) -> dict:
    row = {
        "matrix": "capacity",
        "candidate": name,
        "context_length": ctx,
        "cache_bytes_saved": saved,
        "cache_bytes_ratio": (100 - saved) / 100,
        "nll_delta": nll,
        "topk_overlap": 0.9,
        "latency_ratio": lat,
    }
    row["gates"] = apply_gates(row, GATES)
    row["eligible"] = all(row["gates"].values())
    return row


def test_latency_selects_the_fastest_eligible_row_at_the_context_memory_selects():
    rows = [
        cap_row("kivi-8", 512, 20, lat=0.5),  # fastest of all, but at another context
        cap_row("hqq-4", 4096, 70, lat=1.8),  # the most bytes: memory's choice, its context 4096
        cap_row("kivi-4", 4096, 60, lat=1.1),
        cap_row("kivi-8", 4096, 40, lat=0.9),  # the fastest eligible row at 4096
        cap_row("kivi-2", 4096, 80, lat=0.6, nll=0.9),  # faster still, but fails the NLL gate
    ]
    assert decide(rows) == (rows[1], "accept hqq-4 at context 4096")
    assert decide(rows, "memory") == (rows[1], "accept hqq-4 at context 4096")
    assert decide(rows, "latency") == (rows[3], "accept kivi-8 at context 4096")


def test_latency_breaks_a_latency_tie_on_bytes_then_takes_the_earlier_row():
    rows = [cap_row("kivi-8", 2048, 40, lat=1.2), cap_row("kivi-4", 2048, 60, lat=1.2), cap_row("hqq-4", 2048, 70, 1.5)]
    assert decide(rows, "latency")[0] is rows[1]
    same = [cap_row("kivi-4", 2048, 60, lat=1.2), cap_row("hqq-4", 2048, 60, lat=1.2)]
    assert decide(same, "latency")[0] is same[0]
    assert decide([cap_row("kivi-2", 512, 60, lat=1.0, nll=0.9)], "latency") == (None, "tune_cache_policy")


def test_an_unknown_preference_is_refused_by_name():
    with pytest.raises(ValueError, match=r"`prefer` must be one of \['memory', 'latency'\], got 'speed'"):
        decide([cap_row("kivi-4", 512, 10, lat=1.0)], "speed")
    with pytest.raises(ValueError, match=r"`prefer` must be one of .* got 'fast'"):
        EvalConfig(prefer="fast")
    with pytest.raises(ValueError, match=r"settings.prefer must be one of .* got 'fast'"):
        preference({"settings": {"prefer": "fast"}})


def test_a_result_without_the_setting_reads_as_memory():
    assert preference({"settings": {}}) == "memory" and preference({}) == "memory"
    settings = EvalConfig(prefer="latency").to_dict()
    assert settings["prefer"] == "latency" and EvalConfig.from_dict(settings).prefer == "latency"
    del settings["prefer"]  # a file written before --prefer resumes under the rule it ran under
    assert EvalConfig.from_dict(settings).prefer == "memory"


def test_the_rule_line_states_the_preference():
    summary = {
        "eligible_candidate_count": 4,
        "selected_candidate": {"candidate": "kivi-8", "context_length": 4096},
        "per_candidate": {
            "kivi-8": {"eligible_contexts": [512, 4096]},
            "kivi-4": {"eligible_contexts": [4096]},
            "hqq-4": {"eligible_contexts": [2048, 4096]},
        },
    }
    assert "the one saving the most cache bytes (--prefer memory)" in decision_rule(summary)
    rule = decision_rule(summary, "latency")
    assert rule.startswith("the rule: of the 3 rows that pass every gate at context 4,096")
    assert "the lowest latency ratio (--prefer latency)" in rule and "most cache bytes" in rule
    summary["per_candidate"] = {"kivi-8": {"eligible_contexts": [512, 4096]}, "hqq-4": {"eligible_contexts": [512]}}
    assert decision_rule(summary, "latency") is None  # one eligible row at 4096: no choice was made there


def _report_text(result: dict) -> str:
    console = Console(file=io.StringIO(), width=1000, color_system=None, record=True)
    print_summary(result, console)
    return " ".join(console.export_text().split())


def _page_text(result: dict) -> str:
    page = re.sub(r"<(style|details)[^>]*>.*?</\1>", "", render_html(result), flags=re.S)
    return " ".join(re.sub(r"\s*(<[^>]+>\s*)+", " ", page).split()).replace("&#x27;", "'")


def test_latency_round_trips_through_the_result_file_and_the_reports(tmp_path, capsys):
    """The recorded default-matrix run: memory accepts hqq-4 at 4,096 (0.29x dynamic, 1.49x latency) beside an
    eligible kivi-4 (0.34x, 0.70x); latency accepts kivi-4 there, not kivi-4 at 2,048 (0.7037x, another context)."""
    memory = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    assert memory["summary"]["decision"] == "accept hqq-4 at context 4096" and "prefer" not in memory["settings"]
    latency = copy.deepcopy(memory)
    latency["settings"]["prefer"] = "latency"
    latency["summary"] = summarize(latency)
    assert latency["summary"]["decision"] == "accept kivi-4 at context 4096"
    path = tmp_path / "latency.json"
    path.write_text(json.dumps(latency), encoding="utf-8")
    again = read_result(path)  # validated
    assert again["settings"]["prefer"] == "latency" and summarize(again) == latency["summary"]

    assert faster_alternative(again) is None  # the rule picked the fastest: nothing faster to name
    line = smaller_alternative(again)
    assert line.startswith("smaller and eligible at 4,096: hqq-4, cache 0.292x dynamic at 1.49x latency")
    assert "(selected kivi-4: 0.339x at 0.70x)" in line and "--prefer memory selects" in line
    assert alternative_line(again) == line
    capsys.readouterr()
    assert main(["report", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "decision: accept kivi-4 at context 4096" in out and line in out
    assert "selection (--prefer latency): the lowest latency ratio" in out
    assert "the rule: of the 2 rows that pass every gate at context 4,096" in out and "faster and eligible" not in out
    html = tmp_path / "r.html"
    assert main(["report", str(path), "--html", str(html)]) == 0
    page = _page_text(again)
    assert line in page and "(--prefer latency)" in page and "faster and eligible" not in page

    text = _report_text(memory)  # the file without the setting: memory, as before
    assert "decision: accept hqq-4 at context 4096" in text and "--prefer latency" in text  # named in the line
    assert smaller_alternative(memory) is None and faster_alternative(memory).startswith("faster and eligible at")
    assert "selection (--prefer latency)" not in text


def test_an_unknown_preference_in_a_file_is_refused_by_report(tmp_path, capsys):
    result = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    result["settings"]["prefer"] = "speed"
    assert 'settings.prefer: "speed" not in ["memory", "latency"]' in validate_result(result)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(result), encoding="utf-8")
    assert main(["report", str(path)]) == 2
    assert 'settings.prefer: "speed"' in " ".join(capsys.readouterr().err.split())


def test_dry_run_records_the_preference(tmp_path, capsys):
    out = str(tmp_path)
    assert main(["eval", "--dry-run", "--quick", "--prefer", "latency", "--label", "lat", "--out-dir", out]) == 0
    assert read_result(tmp_path / "lat.json")["settings"]["prefer"] == "latency"
    assert main(["eval", "--dry-run", "--quick", "--label", "mem", "--out-dir", out]) == 0
    assert read_result(tmp_path / "mem.json")["settings"]["prefer"] == "memory"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:  # argparse's choices: exit 2 naming the value
        main(["eval", "--dry-run", "--quick", "--prefer", "speed", "--label", "x", "--out-dir", out])
    assert exc.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "kvlab eval: error: argument --prefer: invalid choice: 'speed'" in err
    assert main(["eval", "--resume", str(tmp_path / "lat.json"), "--prefer", "memory"]) == 2
    assert "takes its settings, label and folder from the file; drop --prefer" in " ".join(
        capsys.readouterr().err.split()
    )
