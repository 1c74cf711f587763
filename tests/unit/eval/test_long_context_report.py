"""The long-context results shown from the result file alone: summary table and passkey table, HTML report,
passkey heatmap data, schema checks, and the CLI flags that set the probes and gates."""

from __future__ import annotations

import argparse
import io

import pytest
from rich.console import Console

from kvlab.eval.render import matrix_tables, passkey_tables, print_summary
from kvlab.eval.schema import validate_result
from kvlab.figures import passkey_grid, plot_passkey_heatmap
from kvlab.report_html import render_html


def _passkey(correct: list[int], trials: int = 20) -> dict:
    depths = [0.0, 0.25, 0.5, 0.75, 1.0]
    per = [
        {"depth": p, "trials": trials, "correct": k, "accuracy": k / trials, "ci95": [0.0, 1.0]}
        for p, k in zip(depths, correct)
    ]
    return {
        "accuracy": sum(k / trials for k in correct) / 5,
        "correct": sum(correct),
        "trials": 5 * trials,
        "ci95": [0.1, 0.9],
        "depths": per,
    }


def _row(candidate: str, ctx: int, passkey: dict | None, **extra) -> dict:
    row = {
        "matrix": "capacity",
        "candidate": candidate,
        "context_length": ctx,
        "median_ms": 10.0,
        "ms_per_token": 1.0,
        "cache_bytes": 1000,
        "mean_nll": 2.0,
        "recall_accuracy": 0.9,
        **extra,
    }
    if passkey is not None:
        row["passkey"] = passkey
        row["passkey_accuracy"] = passkey["accuracy"]
    if candidate != "dynamic":
        row.update(
            {
                "cache_bytes": 500,  # half the float cache's 1000: the ratio and the bytes saved follow
                "cache_bytes_ratio": 0.5,
                "cache_bytes_saved": 500,
                "latency_ratio": 1.0,
                "nll_delta": 0.0,
                "topk_overlap": 1.0,
                "token_agreement_rate": 1.0,
                "eligible": False,
            }
        )
    return row


@pytest.fixture
def result():
    rows = [
        _row("dynamic", 512, _passkey([20, 20, 19, 20, 20])),
        _row(
            "evict-256",
            512,
            _passkey([0, 1, 0, 20, 20]),
            recall_accuracy=0.3,
            recall_drop=0.6,
            passkey_drop=0.58,  # the float cache's 0.99 - 0.41 (a drop that follows)
            kl_mean=0.4321,
            gates={"recall_drop": False, "passkey_drop": False, "kl_mean": False},
        ),
        _row("dynamic", 2048, None),
    ]
    return {
        "schema_version": "kvlab.eval/1",
        "label": "lc",
        "status": "complete",
        "settings": {},
        "gates": {
            "max_nll_delta": 0.5,
            "min_topk_overlap": 0.6,
            "max_latency_ratio": 2.0,
            "max_recall_drop": 0.05,
            "max_passkey_drop": 0.05,
            "max_kl_mean": 0.1,
        },
        "candidates": [],
        "plan": [],
        "provenance": {},
        "rows": rows,
        "failures": [],
        "summary": {
            "memory_reduction_onset_context": 512,
            "eligible_crossover_context": None,
            "eligible_candidate_count": 0,
            "selected_candidate": None,
            "decision": "tune_cache_policy",
            "long_context_warning": None,
        },
    }


def _text(renderable) -> str:
    buf = io.StringIO()
    Console(file=buf, width=160, color_system=None).print(renderable)
    return buf.getvalue()


def test_summary_table_has_recall_passkey_and_kl_within_160_columns(result):
    text = _text(matrix_tables(result, "capacity", None)[0])
    assert max(len(line) for line in text.splitlines()) <= 160
    header = next(line for line in text.splitlines() if "candidate" in line and "ctx" in line)
    assert "recall" in header and "passkey" in header and "KL" in header
    lossy = next(line for line in text.splitlines() if "evict-256" in line)
    assert "0.300 ✗" in lossy and "0.41 ✗" in lossy and "0.4321 ✗" in lossy  # accuracy shown, the drop judged


def test_passkey_table_counts_per_depth(result):
    text = _text(passkey_tables(result, None)[0])
    lossy = next(line for line in text.splitlines() if "evict-256" in line)
    cells = [c.strip() for c in lossy.split("│") if c.strip()]
    assert cells[:7] == ["512", "evict-256", "0/20", "1/20", "0/20", "20/20", "20/20"]
    assert "fail" in lossy


def test_print_summary_names_the_long_context_gates(result):
    buf = io.StringIO()
    print_summary(result, Console(file=buf, width=160, color_system=None))
    out = buf.getvalue()
    assert "recall drop ≤ 0.05" in out and "passkey drop ≤ 0.05" in out and "KL mean ≤ 0.1" in out
    del result["gates"]["max_kl_mean"]  # a result written before the long-context gates still renders
    print_summary(result, Console(file=io.StringIO(), width=160))


def test_html_report_shows_passkey_grid_and_new_columns(result, tmp_path):
    page = render_html(result, tmp_path)
    assert "<h2>Passkey retrieval</h2>" in page and "eval_passkey" in page
    assert "KL mean (nats)" in page and "recall drop" in page
    assert (tmp_path / "eval_passkey.png").is_file()


def test_passkey_grid_is_depth_by_context(result):
    grid = passkey_grid(result)
    assert list(grid) == ["dynamic", "evict-256"]
    assert grid["evict-256"]["contexts"] == [512] and grid["evict-256"]["depths"] == [
        0.0,
        0.25,
        0.5,
        0.75,
        1.0,
    ]
    assert grid["evict-256"]["correct"] == [[0], [1], [0], [20], [20]]
    assert grid["dynamic"]["accuracy"][2] == [0.95]
    result["rows"] = [r for r in result["rows"] if "passkey" not in r]
    assert passkey_grid(result) == {} and plot_passkey_heatmap(result, "unused.png") is None


def test_schema_checks_long_context_fields(result):
    assert validate_result(result) == []
    result["rows"][1]["passkey_accuracy"] = 1.5
    result["rows"][1]["kl_mean"] = -0.1
    result["rows"][0]["recall"] = {"distances": "not a list"}
    problems = validate_result(result)
    assert "rows[1].passkey_accuracy: must be a fraction in [0, 1], got 1.5" in problems
    assert "rows[1].kl_mean: must be a finite number >= 0, got -0.1" in problems
    assert "rows[0].recall: must be an object with a 'distances' list" in problems


def _args(argv: list[str]) -> argparse.Namespace:
    from kvlab.cli import build_parser

    return build_parser().parse_args(["eval", *argv])


def test_cli_flags_set_probes_and_gates():
    from kvlab.commands.eval.settings import config_from_args

    cfg = config_from_args(
        _args(
            [
                "--max-recall-drop", "0.1",
                "--max-passkey-drop", "0.2",
                "--max-kl-mean", "0.3",
                "--passkey-trials", "25",
                "--passkey-depths", "0,0.5,1",
                "--recall-rows", "3",
                "--recall-fractions", "0.3,0.8",
                "--recall-span", "16",
                "--retrieval-contexts", "2048,4096",
            ]
        )
    )  # fmt: skip
    assert (cfg.gates.max_recall_drop, cfg.gates.max_passkey_drop, cfg.gates.max_kl_mean) == (0.1, 0.2, 0.3)
    assert (cfg.passkey_trials, cfg.passkey_depths, cfg.recall_rows) == (25, (0.0, 0.5, 1.0), 3)
    assert (cfg.recall_fractions, cfg.recall_span_tokens) == ((0.3, 0.8), 16)
    assert cfg.passkey_contexts() == (2048, 4096)
    assert config_from_args(_args(["--quick", "--retrieval-contexts", "all"])).passkey_contexts() == (
        256,
        1024,
    )
    assert config_from_args(_args(["--retrieval-contexts", "none"])).passkey_contexts() == ()
    assert config_from_args(_args(["--no-long-context"])).long_context is False
    assert config_from_args(_args([])).passkey_contexts() == (512,)


def test_cli_bad_retrieval_context_is_named(tmp_path, capsys):
    from kvlab.cli import main

    code = main(
        ["eval", "--dry-run", "--retrieval-contexts", "300", "--out-dir", str(tmp_path), "--label", "x"]
    )
    assert code == 2 and "got [300] that are not" in capsys.readouterr().err


def test_summary_table_hides_long_context_columns_of_an_older_result(result):
    for row in result["rows"]:
        for key in ("recall_accuracy", "passkey_accuracy", "kl_mean", "passkey"):
            row.pop(key, None)
    header = next(
        line
        for line in _text(matrix_tables(result, "capacity", None)[0]).splitlines()
        if "candidate" in line and "ctx" in line
    )
    assert "recall" not in header and "passkey" not in header and "KL" not in header and "verdict" in header


def test_a_long_cache_name_folds_instead_of_being_cut():
    from rich.console import Console

    from kvlab.eval.render import matrix_tables

    name = "sink:sink_tokens=4:window_length=256"
    rows = [
        {
            "matrix": "capacity",
            "candidate": "dynamic",
            "context_length": 512,
            "median_ms": 1.0,
            "ms_per_token": 1.0,
            "cache_bytes": 1024,
        },
        {
            "matrix": "capacity",
            "candidate": name,
            "context_length": 512,
            "median_ms": 1.0,
            "ms_per_token": 1.0,
            "cache_bytes": 512,
        },
    ]
    console = Console(width=120, record=True)
    console.print(matrix_tables({"rows": rows}, "capacity", None)[0])
    column = "".join(
        line.split("│")[2].strip() for line in console.export_text().splitlines() if line.count("│") > 3
    )
    assert name in column and "…" not in column


def test_print_summary_explains_its_columns(result):
    """ms/tok (a whole generate() call / new tokens) and lat × (median paired ratio) do not divide into each other;
    a new user read them as the same thing. One legend line under the tables says what each column holds."""
    buf = io.StringIO()
    print_summary(result, Console(file=buf, width=400, color_system=None))
    text = buf.getvalue()
    assert "ms/tok = one whole generate() call (prefill + decode) / new tokens" in text
    assert "lat × = median of the per-round paired ratios to dynamic" in text
    assert "eligible crossover (first context passing every gate)" in text


def test_print_summary_states_the_selection_rule_when_several_rows_pass():
    import json
    from pathlib import Path

    record = (
        Path(__file__).resolve().parents[3] / "docs" / "examples" / "eval-default-cpu-avx2-2026-12-01.json"
    )
    result = json.loads(record.read_text(encoding="utf-8"))
    buf = io.StringIO()
    print_summary(result, Console(file=buf, width=160, color_system=None))
    eligible = sum(1 for r in result["rows"] if r["matrix"] == "capacity" and r.get("eligible"))
    assert (
        f"of the {eligible} rows that pass every gate, the one saving the most cache bytes" in buf.getvalue()
    )
    result["summary"]["eligible_candidate_count"] = 1  # one row passing: nothing was chosen between
    buf = io.StringIO()
    print_summary(result, Console(file=buf, width=160, color_system=None))
    assert "the one saving the most" not in buf.getvalue()


def test_a_quick_runs_decision_says_it_is_a_smoke_run_and_the_html_label_reads_plainly(result):
    """A --quick verdict looked final ('decision: accept kivi-4 at context 512'); the HTML's trust label read as a
    double negative ('latency trusted (no capacity cell timed on a busy machine) | no')."""
    def printed(res):
        buf = io.StringIO()
        print_summary(res, Console(file=buf, width=160, color_system=None))
        return buf.getvalue()

    result["command"] = ["kvlab", "eval", "--contexts", "512"]
    assert "smoke run" not in printed(result)
    result["command"] = ["kvlab", "eval", "--quick", "--contexts", "512"]
    out = printed(result)
    assert "(a --quick smoke run: short contexts, few tokens and trials; decide with the default matrix)" in out
    assert out.index("decision:") < out.index("smoke run")
    result["summary"]["latency_trusted"] = False
    html = render_html(result)
    assert "no capacity cell timed on a busy machine" not in html
    assert "latency trusted (every capacity cell timed on a quiet machine)" in html
