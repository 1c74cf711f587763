"""The eval engine's rooms keep to their jobs: the decision needs no torch, the records are the schema's, the matrix
rule lives in one function that every consumer asks, and result files written by earlier kvlab still read."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.eval import schema
from kvlab.eval.config import EvalConfig
from kvlab.eval.records import Failure, Paired, Row, fail_run, finish_status, row_keys, set_status

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "docs" / "examples").glob("eval-*.json"))
# the row keys kvlab.eval.longctx.long_context_fields writes
LONG_CONTEXT_KEYS = {
    "recall",
    "recall_accuracy",
    "recall_nll",
    "recall_drop",
    "recall_nll_delta",
    "passkey",
    "passkey_accuracy",
    "passkey_drop",
    "long_context_ms",
}


@pytest.mark.parametrize("module", ["kvlab.eval.decision", "kvlab.eval.records", "kvlab.eval.cells"])
def test_the_decision_side_imports_no_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", f"{module} pulled in torch"


def test_the_schema_names_every_row_field_and_checks_only_real_ones():
    documented = set(re.findall(r"[a-z][a-z_0-9]*", schema.__doc__))
    assert row_keys() - documented == set(), "a Row field the schema does not describe"
    checked = {*schema._ROW, *schema._PAIRED, *schema._ROW_OPTIONAL_NUMBERS, *schema._ROW_NUMBERS}
    assert checked - (row_keys() | LONG_CONTEXT_KEYS) == set(), "the validator checks a field no Row writes"


def _row(**paired) -> Row:
    name, family, bits = ("kivi-4", "kivi", 4) if paired else ("dynamic", "dynamic", None)
    row = Row("capacity", name, family, bits, 512, 16, 128, 32, 10.0, 9.0, [9.0, 11.0], 11 / 9, 0.6, None,
              None, 543, 1000, None, None, None, True)  # fmt: skip
    if paired:
        row.paired = Paired(**paired)
    return row


def test_a_row_json_has_the_fixed_fields_then_the_paired_ones_and_is_valid():
    base = _row().to_json()
    assert list(base)[:3] == ["matrix", "candidate", "family"] and "gates" not in base
    outputs = {"greedy_exact_match": True, "token_agreement_rate": 1.0, "first_divergence_index": None}
    cand = _row(
        dynamic_cache_bytes=4000, cache_bytes_ratio=0.25, cache_bytes_saved=3000, latency_ratio=1.1,
        incremental_peak_saved_bytes=None, incremental_peak_reduction_ratio=None, outputs=outputs,
        nll_delta=0.1, nll_ratio=1.05, topk_overlap=0.9, gates={"nll_delta": True}, eligible=True,
    ).to_json()  # fmt: skip
    assert cand["cache_bytes_saved"] == 3000 and cand["gates"] == {"nll_delta": True} and cand["eligible"]
    assert "latency_ratio_min" not in cand and "decode_latency_ratio" not in cand  # not measured: absent
    assert set(cand) <= row_keys()
    result = {"rows": [base, cand]}
    problems = [p for i, r in enumerate(result["rows"]) for p in schema._row_problems(i, r)]
    assert problems == []


def test_failures_of_a_cell_and_of_the_run():
    cell = Failure("timing", "RuntimeError", "boom", "kivi-2", "capacity", 512, 128).to_json()
    assert cell == {
        "matrix": "capacity",
        "candidate": "kivi-2",
        "context_length": 512,
        "residual_length": 128,
        "stage": "timing",
        "type": "RuntimeError",
        "message": "boom",
    }
    result = {"status": "running", "failures": []}
    fail_run(result, "run", KeyboardInterrupt(), "interrupted by the user")
    assert result["status"] == "failed"
    assert result["failures"] == [
        {"candidate": None, "stage": "run", "type": "KeyboardInterrupt", "message": "interrupted by the user"}
    ]
    try:
        raise ValueError("bad cache")
    except ValueError as exc:
        caught = Failure.of_cell("generate", exc, "hqq-4", "window", 512, 16).to_json()
    assert caught["type"] == "ValueError" and "bad cache" in caught["traceback_tail"][-1]


def test_the_status_has_one_writer_that_knows_the_statuses():
    result = {"status": None, "failures": []}
    assert finish_status(result)["status"] == "complete"
    result["failures"].append({})
    assert finish_status(result)["status"] == "partial"
    with pytest.raises(ValueError, match="`status` must be one of .* got 'done'"):
        set_status(result, "done")
    for path in (REPO / "src" / "kvlab").rglob("*.py"):
        if path.name != "records.py":
            text = path.read_text(encoding="utf-8")
            assert not re.search(r"""\[["']status["']\]\s*=[^=]""", text) or "eval" not in path.parts, path


# decided before a byte tie went to the lower KL (fp8-e4m3 and fp8-e4m3-hadamard tie on bytes): the rule changed
DECIDED_BY_AN_EARLIER_RULE = {"eval-fp8-kl1024-4096-2026-12-01.json"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_result_files_of_earlier_kvlab_still_read_render_and_decide_the_same(path):
    import io

    from rich.console import Console

    from kvlab.eval.decision import summarize
    from kvlab.eval.decision_words import decision_text
    from kvlab.eval.io import read_result
    from kvlab.eval.render import print_summary

    result = read_result(path)  # validated
    out = io.StringIO()
    print_summary(result, Console(file=out, width=160))
    assert f"decision: {decision_text(result['summary'])}" in out.getvalue()
    again = summarize(result)
    keys = ("decision", "selected_candidate", "eligible_crossover_context", "memory_reduction_onset_context")
    if path.name in DECIDED_BY_AN_EARLIER_RULE:
        assert again["decision"] != result["summary"]["decision"], (
            "decided the same again: drop it from the list"
        )
    else:
        assert {k: again[k] for k in keys} == {k: result["summary"][k] for k in keys}


def _cfg(**kw) -> EvalConfig:
    base = dict(candidates=("dynamic", "kivi-4", "fp8-e4m3"), contexts=(96, 160), window_context=96)
    return EvalConfig(**{**base, "window_residuals": (16, 32), **kw})


def test_the_matrix_rule_is_one_function_every_consumer_asks(monkeypatch):
    """With cell_caches told that every cache runs once per cell, the plan, the step count, the probe jobs and
    the cells measured all follow it: none of them knows the rule on its own."""
    from kvlab.eval import cells, probes, runner

    cfg = _cfg()
    plan, steps = cells.plan_cells(cfg), cells.count_steps(cfg)
    window = [(c["candidate"], c["residual_length"]) for c in plan if c["matrix"] == "window"]
    assert window == [("dynamic", None), ("kivi-4", 16), ("fp8-e4m3", None), ("kivi-4", 32)]
    real = cells.cell_caches

    def once(candidates, cell):
        return [(c, r) for c, r in real(candidates, cell) if r == cell.residuals[0]]

    for module in (cells, probes, runner):
        assert module.cell_caches is real, f"{module.__name__} has a rule of its own"
        monkeypatch.setattr(module, "cell_caches", once)
    window = [
        (c["candidate"], c["residual_length"]) for c in cells.plan_cells(cfg) if c["matrix"] == "window"
    ]
    assert window == [("dynamic", None), ("kivi-4", 16), ("fp8-e4m3", None)]
    # one cache less in the window cell: its measurement step and its two probe steps (float cache excepted)
    assert cells.count_steps(cfg) == steps - 2


def test_the_run_measures_the_caches_cell_caches_names(monkeypatch):
    from kvlab.eval import runner
    from kvlab.eval.measure import CellMeasurer
    from tests.conftest import make_tiny_qwen2
    from tests.unit.eval.test_eval_unit import CharTokenizer, tiny_config

    seen = []
    monkeypatch.setattr(runner, "cell_caches", lambda candidates, cell: [(candidates[0], cell.residuals[-1])])
    real = CellMeasurer.measure_cell

    def spy(self, cell, ids, caches, advance, poll):
        seen.append((cell.matrix, [(c.name, r) for c, r in caches]))
        return real(self, cell, ids, caches, advance, poll)

    monkeypatch.setattr(CellMeasurer, "measure_cell", spy)
    cfg = tiny_config(
        candidates=("dynamic", "kivi-8", "kivi-2"), window_residuals=(16, 32), long_context=False
    )
    model = make_tiny_qwen2(head_dim=16, max_positions=512)
    result = runner.run_eval(
        cfg, model, CharTokenizer(), runner.new_result(cfg, "u", None), {"id_or_path": "t"}
    )
    assert seen and all(caches == [("kivi-8", cfg.residual_length)] for m, caches in seen if m == "capacity")
    assert [caches for m, caches in seen if m == "window"] == [[("kivi-8", 32)]]
    assert {r["candidate"] for r in result["rows"]} == {"dynamic", "kivi-8"}
    json.dumps(result)


def test_the_comparison_of_two_runs_ignores_timings_and_finds_any_other_change():
    """tests/eval_compare.py, the check that a redesign changed no number of ``kvlab eval``: on a committed
    result, a timing and a latency verdict may move (reported apart), a quality number may not."""
    from tests.eval_compare import LATENCY_VERDICTS, differences

    before = json.loads(EXAMPLES[0].read_text())
    after = json.loads(EXAMPLES[0].read_text())
    cand = next(r for r in after["rows"] if r["candidate"] != "dynamic")
    cand["median_ms"] *= 2
    cand["timing_contention"] = {"busy": True}
    cand["gates"]["latency_ratio"] = None
    after["elapsed_s"], after["label"] = 1.0, "another"
    found = differences(before, after)
    assert found and all(LATENCY_VERDICTS.search(d.split(":")[0]) for d in found), found
    cand["nll_delta"] += 1e-12
    assert [d for d in differences(before, after) if "nll_delta" in d and "gates" not in d]
