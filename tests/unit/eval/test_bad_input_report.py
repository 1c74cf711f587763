"""Well-formed JSON with wrong field types given to ``kvlab report`` (text and ``--html``): one line
``kvlab report: error: <file> is not a valid kvlab eval result (nor a kvlab tasks result): <where>: <what>`` and exit status 2, never a
traceback; and the report is never written over its own input."""

from __future__ import annotations

import copy
import json
import math

import pytest

from kvlab.cli import main


def _passkey() -> dict:
    depths = [
        {"depth": p, "trials": 4, "correct": 3, "accuracy": 0.75, "ci95": [0.3, 0.95]} for p in (0.0, 1.0)
    ]
    return {"accuracy": 0.75, "correct": 6, "trials": 8, "ci95": [0.4, 0.9], "depths": depths}


def _valid() -> dict:
    base = {
        "matrix": "capacity",
        "candidate": "dynamic",
        "context_length": 512,
        "residual_length": None,
        "group_size": None,
        "median_ms": 10.0,
        "ms_per_token": 1.0,
        "cache_bytes": 4096,
        "mean_nll": 2.0,
        "recall_accuracy": 0.9,
        "passkey": _passkey(),
        "passkey_accuracy": 0.75,
    }
    row = {
        **base,
        "candidate": "kivi-4",
        "residual_length": 32,
        "group_size": 32,
        "cache_bytes": 2048,
        "cache_bytes_ratio": 0.5,
        "cache_bytes_saved": 2048,
        "latency_ratio": 1.1,
        "mean_nll": 2.01,  # nll_delta follows from it
        "nll_delta": 0.01,
        "topk_overlap": 0.95,
        "token_agreement_rate": 1.0,
        "recall_drop": 0.0,
        "passkey_drop": 0.0,
        "kl_mean": 0.001,
        "gates": {"nll_delta": True, "topk_overlap": True, "latency_ratio": True, "passkey_drop": True},
        "eligible": True,
    }
    return {
        "schema_version": "kvlab.eval/1",
        "label": "typed",
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
        "candidates": [{"name": "kivi-4", "family": "kivi", "available": True, "skip_reason": None}],
        "plan": [],
        "provenance": {"software": {}, "hardware": {}, "model": {"id_or_path": "m"}},
        "rows": [base, row],
        "failures": [
            {"candidate": "kivi-2", "context_length": 512, "stage": "decode", "type": "E", "message": "m"}
        ],
        "summary": {
            "memory_reduction_onset_context": 512,
            "eligible_crossover_context": 512,
            "eligible_candidate_count": 1,
            "selected_candidate": {
                "candidate": "kivi-4",
                "context_length": 512,
                "cache_bytes_ratio": 0.5,
                "nll_delta": 0.01,
                "topk_overlap": 0.95,
                "latency_ratio": 1.1,
            },
            "decision": "accept kivi-4 at context 512",
        },
        "elapsed_s": 3.0,
    }


_DELETE = object()


def _set(result: dict, path: str, value: object) -> dict:
    """``result`` with the dotted ``path`` (list indices as numbers) set to ``value`` (or deleted)."""
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    target = result
    for k in keys[:-1]:
        target = target[k]
    if value is _DELETE:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return result


BAD = [
    ("failures", None, "failures"),
    ("failures", [5], "failures[0]"),
    ("failures", {"a": 1}, "failures"),
    ("failures", ["boom"], "failures[0]"),
    ("candidates", None, "candidates"),
    ("gates", {}, "gates"),
    ("gates", None, "gates"),
    ("provenance", None, "provenance"),
    ("elapsed_s", "x", "elapsed_s"),
    ("rows.1.cache_bytes", None, "rows[1].cache_bytes"),
    ("rows.1.nll_delta", "x", "rows[1].nll_delta"),
    ("rows.1.gates", None, "rows[1].gates"),
    ("rows.1.gates", [1], "rows[1].gates"),
    ("rows.1.candidate", 5, "rows[1].candidate"),
    ("rows.1.passkey_drop", "0.1", "rows[1].passkey_drop"),
    ("rows.1.recall_drop", "0.1", "rows[1].recall_drop"),
    ("rows.1.passkey_drop", math.nan, "rows[1].passkey_drop"),
    ("summary.selected_candidate", "kivi-4", "summary.selected_candidate"),
    ("summary.selected_candidate.context_length", _DELETE, "summary.selected_candidate"),
    ("rows.0.passkey.depths.0.depth", _DELETE, "rows[0].passkey.depths[0]"),
    ("rows.0.passkey.depths.0.trials", _DELETE, "rows[0].passkey.depths[0]"),
    ("rows.0.passkey.depths.0.depth", "0", "rows[0].passkey.depths[0].depth"),
    ("rows.0.passkey.depths.0.accuracy", "0.5", "rows[0].passkey.depths[0].accuracy"),
]


def test_the_valid_result_reports(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_valid()))
    assert main(["report", str(path)]) == 0
    assert main(["report", str(path), "--html", str(tmp_path / "r.html")]) == 0


@pytest.mark.parametrize("html", [False, True], ids=["text", "html"])
@pytest.mark.parametrize("path, value, where", BAD, ids=[f"{p}={v!r}" for p, v, _ in BAD])
def test_wrong_field_types_are_refused_in_one_line(tmp_path, capsys, path, value, where, html):
    result = _set(copy.deepcopy(_valid()), path, value)
    file = tmp_path / "r.json"
    file.write_text(json.dumps(result))
    argv = ["report", str(file)] + (["--html", str(tmp_path / "r.html")] if html else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(
        f"kvlab report: error: {file} is not a valid kvlab eval result (nor a kvlab tasks result): "
    )
    assert f"{where}: " in err
    assert not (tmp_path / "r.html").exists()


def test_report_html_over_its_own_input_is_refused(tmp_path, capsys):
    file = tmp_path / "r.json"
    text = json.dumps(_valid())
    file.write_text(text)
    for target in (file, tmp_path / "." / "r.json"):
        assert main(["report", str(file), "--html", str(target), "--force"]) == 2
        err = capsys.readouterr().err
        assert "kvlab report: error:" in err and "its own input" in err, err
    assert file.read_text() == text


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"schema_version": "kvlab.bench/1", "what": "a bench record"}, "'kvlab.bench/1'"),
        ({"model": {"id_or_path": "x"}, "layers": [], "fp8": {}}, "no schema_version"),  # inspect --json
    ],
    ids=["another-schema", "no-schema"],
)
def test_another_kind_of_json_file_says_so_first(tmp_path, capsys, body, fragment):
    path = tmp_path / "other.json"
    path.write_text(json.dumps(body))
    assert main(["report", str(path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "not a kvlab eval result" in err and fragment in err and "kvlab.eval/1" in err, err
    assert "missing field" not in err, err  # not eight missing fields of a file of another kind


def test_an_empty_html_path_is_refused_not_read_as_no_html(tmp_path, capsys):
    # --html '' used to print the text report as if --html had not been given
    result = tmp_path / "r.json"
    result.write_text(json.dumps(_valid()))
    assert main(["report", str(result), "--html", ""]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--html" in err and "''" in err, err
