"""A run on the bundled model says its decision is a test result and names the real-model command, in the text
summary and the HTML report; a run on any other model does not."""

from __future__ import annotations

import json
from pathlib import Path

from kvlab.cli import main
from kvlab.eval.decision_words import REAL_MODEL_COMMAND, bundled_model_note

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "eval-default-cpu-2026-12-01.json"


def test_the_bundled_models_summary_names_the_real_model_command(capsys, tmp_path):
    result = json.loads(EXAMPLE.read_text())
    assert REAL_MODEL_COMMAND in bundled_model_note(result)
    assert main(["report", str(EXAMPLE)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "bundled 5 M-parameter test model" in out and REAL_MODEL_COMMAND in out
    page = tmp_path / "r.html"
    assert main(["report", str(EXAMPLE), "--html", str(page)]) == 0
    assert REAL_MODEL_COMMAND in page.read_text()


def test_another_models_summary_has_no_such_note():
    result = json.loads(EXAMPLE.read_text())
    result["provenance"]["model"]["id_or_path"] = "smollm2-135m"
    assert bundled_model_note(result) is None
