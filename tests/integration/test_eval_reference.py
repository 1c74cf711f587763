"""`kvlab eval` on the bundled model: a valid result with every default candidate, both matrices, the byte
targets at context 4096, and an HTML report that a browser renders."""

import json

import numpy as np
import pytest

from kvlab.cli import main
from kvlab.eval.candidates import Candidate
from kvlab.eval.config import EvalConfig
from kvlab.eval.schema import validate_result


@pytest.fixture(scope="module")
def eval_result(tmp_path_factory, reference_bf16):
    out = tmp_path_factory.mktemp("results")
    args = [
        "eval",
        "--contexts",
        "4096",
        "--new-tokens",
        "4",
        "--quality-tokens",
        "4",
        "--warmup",
        "0",
        "--repeat",
        "1",
        "--window-context",
        "256",
        "--window-new-tokens",
        "24",
        "--window-residuals",
        "16,32",
        "--passkey-trials",  # the passkey grid at 4096 is 5 depths x trials prompts: keep the path, not the cost
        "1",
        "--recall-rows",
        "1",
        "--label",
        "it",
        "--out-dir",
        str(out),
        "--device",
        "cpu",
    ]
    assert main(args) == 0
    return json.loads((out / "it.json").read_text()), out / "it.json"


def test_result_is_valid_and_complete(eval_result):
    result, _ = eval_result
    assert validate_result(result) == []
    assert result["status"] == "complete", result["failures"]
    assert result["provenance"]["model"]["fingerprint"]
    assert result["provenance"]["prompts"][0]["ids_sha256"]
    defaults = EvalConfig().candidates
    ran = {r["candidate"] for r in result["rows"]}
    for name in defaults:
        reason = Candidate.parse(name).unavailable_reason()
        if reason is None:
            assert name in ran
        else:
            assert next(c for c in result["candidates"] if c["name"] == name)["skip_reason"] == reason
    assert {r["matrix"] for r in result["rows"]} == {"capacity", "window"}
    assert result["summary"]["decision"]


def test_kivi_bytes_targets_at_4096(eval_result):
    result, _ = eval_result
    rows = {
        r["candidate"]: r for r in result["rows"] if r["matrix"] == "capacity" and r["context_length"] == 4096
    }
    assert rows["kivi-4"]["group_size"] == 32 and rows["kivi-4"]["residual_length"] == 128
    assert rows["kivi-4"]["cache_bytes_ratio"] <= 0.34
    assert rows["kivi-2"]["cache_bytes_ratio"] <= 0.22
    # the ratio is the measured bytes of the two caches, as reported
    assert (
        rows["kivi-4"]["cache_bytes_ratio"] == rows["kivi-4"]["cache_bytes"] / rows["dynamic"]["cache_bytes"]
    )
    bd = rows["kivi-2"]["cache_bytes_breakdown"]
    assert bd["codes"] + bd["scales_zeros"] + bd["residual"] == rows["kivi-2"]["cache_bytes"]


def test_report_reads_the_file_alone(eval_result, capsys):
    _, path = eval_result
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Capacity matrix" in out and "decision" in out


@pytest.mark.browser
def test_html_report_of_a_real_result_renders(eval_result, tmp_path, chromium_screenshot):
    _, path = eval_result
    page = tmp_path / "report.html"
    assert main(["report", str(path), "--html", str(page)]) == 0
    pixels = chromium_screenshot(page)
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 200, f"only {len(colours)} distinct colours: the page looks blank"
    assert (pixels < 0.9).any(axis=-1).mean() > 0.05


def test_long_context_measured_in_every_capacity_row(eval_result, capsys):
    result, path = eval_result
    capacity = [r for r in result["rows"] if r["matrix"] == "capacity"]
    for r in capacity:
        assert [d["trials"] for d in r["passkey"]["depths"]] == [1] * 5, r["candidate"]
        assert 0 <= r["recall_accuracy"] <= 1 and r["recall"]["distances"]
        if r["candidate"] != "dynamic":
            assert r["kl_mean"] >= 0 and r["kl_p99"] >= r["kl_mean"] - 1e-12
            assert {"recall_drop", "passkey_drop", "kl_mean"} <= set(r["gates"])
    modes = {p.get("mode") for p in result["provenance"]["prompts"]}
    assert {"recall", "passkey"} <= modes
    assert main(["report", str(path)]) == 0
    assert "Passkey retrieval" in capsys.readouterr().out
