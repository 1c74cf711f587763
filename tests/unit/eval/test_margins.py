"""A long-context verdict inside the probe's sampling error is reported as such (kvlab.eval.margins)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.eval.margins import close_calls, drop_standard_error, margin_warning

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"
REAL = EXAMPLES / "eval-smollm2-default-cpu-2026-12-02.json"


def test_standard_error_of_a_drop():
    assert drop_standard_error(0.7, 0.6, 100) == pytest.approx(math.sqrt(0.21 / 100 + 0.24 / 100))
    assert drop_standard_error(1.0, 1.0, 5) == 0.0
    with pytest.raises(ValueError, match="`n`"):
        drop_standard_error(0.5, 0.5, 0)
    with pytest.raises(ValueError, match="`cand`"):
        drop_standard_error(0.5, 1.5, 10)


def test_the_real_models_decision_is_flagged_as_inside_the_noise():
    result = json.loads(REAL.read_text())
    text = margin_warning(result)
    assert text.startswith("hqq-4 at 2,048 passes the recall gate (recall drop 0.048 against 0.05")
    assert "kivi-4 at 4,096 fails the recall gate" in text and "--recall-rows" in text


def _row(drop: float, acc: float, n: int, passed: bool) -> dict:
    return {
        "matrix": "capacity",
        "candidate": "kivi-4",
        "context_length": 4096,
        "residual_length": 128,
        "eligible": passed,
        "gates": {"recall_drop": passed},
        "recall": {"distances": [{"accuracy": acc, "accuracy_drop": drop, "scored_tokens": n}]},
    }


def test_a_clear_margin_is_not_flagged_and_a_close_one_is():
    gates = {"max_recall_drop": 0.05}
    assert close_calls(_row(0.0, 0.9, 10_000, True), gates) == []  # 0.05 away, error ~0.004
    (call,) = close_calls(_row(0.04, 0.9, 62, True), gates)
    assert call["probe"] == "recall" and call["passed"] and call["n"] == 62
    assert close_calls(_row(0.30, 0.6, 62, False), gates) == []  # fails by 0.25, error ~0.09


def test_no_selection_and_no_close_rejection_gives_no_warning():
    result = {
        "gates": {"max_recall_drop": 0.05},
        "summary": {"selected_candidate": None},
        "rows": [_row(0.30, 0.6, 62, False)],
    }
    assert margin_warning(result) is None
    close = copy.deepcopy(result)
    close["rows"][0]["recall"]["distances"][0]["accuracy_drop"] = 0.07
    assert "kivi-4 at 4,096 fails the recall gate" in margin_warning(close)


def test_kvlab_report_prints_it(capsys):
    assert main(["report", str(REAL)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "warning: hqq-4 at 2,048 passes the recall gate" in out
