"""``kvlab eval --resume RESULT`` continues an interrupted run: the cells it finished (timed, rows written) are kept,
so are those it measured but did not time, the others are measured from the start, and it ends with the rows of an
uninterrupted run with the same seed, timings aside (a Ctrl-C after minutes of measuring once kept 0 rows). Each
refusal is exit 2 and leaves the file as it was."""

from __future__ import annotations

import json

import pytest

from kvlab.eval import runner
from kvlab.eval.cells import count_steps
from kvlab.eval.config import EvalConfig, Gates
from kvlab.eval.resume import load_resumable, prepare_resume
from kvlab.eval.runner import new_result, run_eval
from kvlab.eval.schema import validate_result
from tests.conftest import make_tiny_qwen2
from tests.unit.eval.test_eval_unit import CharTokenizer, tiny_config

# the fields a timing sets (and the peak memory, which the allocator's state moves): everything else of a row is
# the same in an interrupted-and-resumed run as in an uninterrupted one
TIMING = {
    "median_ms",
    "min_ms",
    "timings_ms",
    "ms_per_token",
    "timing_spread",
    "timing_contention",
    "latency_trusted",
    "latency_ratio",
    "latency_ratio_min",
    "latency_ratio_max",
    "latency_ratio_unpaired",
    "decode_ms",
    "prefill_ms",
    "decode_latency_ratio",
    "long_context_ms",
    "incremental_peak_bytes",
    "incremental_peak_saved_bytes",
    "incremental_peak_reduction_ratio",
}
QUALITY = (
    "mean_nll",
    "nll_delta",
    "kl_mean",
    "topk_overlap",
    "recall_accuracy",
    "passkey_accuracy",
    "cache_bytes",
)


def untimed(value):
    """``value`` without its timing fields (any ``*_ms`` inside nested blocks too, and the latency gate)."""
    if isinstance(value, dict):
        out = {k: untimed(v) for k, v in value.items() if k not in TIMING and not k.endswith("_ms")}
        if "saves_memory" in out:  # a row's gates: the latency verdict rests on the timing
            out.pop("latency_ratio", None)
        return out
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def same_rows(a: dict, b: dict) -> None:
    """Both results hold the same rows, in the same order, timings aside; the quality fields are there."""
    rows_a, rows_b = untimed(a["rows"]), untimed(b["rows"])
    assert [(r["matrix"], r["context_length"], r["candidate"], r["residual_length"]) for r in rows_a] == [
        (r["matrix"], r["context_length"], r["candidate"], r["residual_length"]) for r in rows_b
    ]
    for x, y in zip(rows_a, rows_b):
        assert x == y, {k: (x.get(k), y.get(k)) for k in set(x) | set(y) if x.get(k) != y.get(k)}
    candidates = [r for r in rows_b if r["candidate"] != "dynamic"]
    assert all(r.get(k) is not None for r in candidates for k in QUALITY[:4] + ("cache_bytes",))
    assert any(r.get("recall_accuracy") is not None for r in candidates), "the recall probe ran"
    assert any(r.get("passkey_accuracy") is not None for r in candidates), "the passkey probe ran"


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_qwen2(head_dim=16, max_positions=512)


def cfg_of(**kw) -> EvalConfig:
    base = dict(
        candidates=("dynamic", "kivi-8", "kivi-2", "fp8-e4m3"),
        contexts=(96, 160),
        window_context=96,
        threads=1,
        workers=1,
        passkey_trials=2,
        gates=Gates(max_latency_ratio=1000),  # a tiny model's latency ratios are noise: decide on the others
    )
    base.update(kw)
    return tiny_config(**base)


def interrupt_after(monkeypatch, method: str, calls: int) -> None:
    """A Ctrl-C right after the ``calls``-th call of ``_Run.<method>`` returns (``time``: that cell's rows are
    written; ``measure``: still in the untimed phase)."""
    real = getattr(runner._Run, method)
    seen = []

    def wrapped(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        seen.append(1)
        if len(seen) == calls:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(runner._Run, method, wrapped)


@pytest.mark.parametrize(
    "method, calls, kept, measured",
    [("time", 1, 1, 2), ("measure", 1, 0, 1), ("measure", 2, 0, 2)],
)
def test_a_resumed_run_has_the_rows_of_an_uninterrupted_one(tiny, monkeypatch, method, calls, kept, measured):
    """Interrupted after the first cell's rows (the timing phase: the other two cells measured, not timed) or in the
    untimed phase after one or two cells, then resumed: the cells measured before are only timed, the others
    measured, and the rows, probes and summary are those of a run that was never interrupted."""
    from kvlab.eval.measure import CellMeasurer

    cfg = cfg_of()
    whole = run_eval(cfg, tiny, CharTokenizer(), new_result(cfg, "whole", None), {"id_or_path": "tiny"})
    assert whole["status"] == "complete" and len(whole["cells_done"]) == 3
    assert (
        "cells_measured" not in whole and "probes_done" not in whole
    )  # an uninterrupted run's file is unchanged
    interrupt_after(monkeypatch, method, calls)
    result = new_result(cfg, "cut", None)
    with pytest.raises(KeyboardInterrupt):
        run_eval(cfg, tiny, CharTokenizer(), result, {"id_or_path": "tiny"})
    monkeypatch.undo()
    result = json.loads(json.dumps(result))  # as the file holds it
    assert len(result["cells_done"]) == kept and len(result["cells_measured"]) == measured
    assert len(result["rows"]) == (4 if kept else 0)  # the first cell: the float cache and three candidates
    record = prepare_resume(result, cfg, None)
    assert record["cells_kept"] == kept and record["cells_measured_kept"] == measured
    assert record["cells_to_measure"] == 3 - kept - measured
    steps, cells = [], []
    real = CellMeasurer.measure_cell
    monkeypatch.setattr(
        CellMeasurer, "measure_cell", lambda self, cell, *a: cells.append(cell) or real(self, cell, *a)
    )
    run_eval(cfg, tiny, CharTokenizer(), result, {"id_or_path": "tiny"}, advance=lambda: steps.append(1))
    assert len(cells) == 3 - kept - measured, "a cell measured before the interrupt is not measured again"
    assert len(steps) == count_steps(cfg)  # the kept cells' steps counted done
    assert result["status"] == "complete" and validate_result(result) == []
    assert "cells_measured" not in result and "probes_done" not in result
    same_rows(whole, result)
    for key in ("decision", "per_candidate", "failed_candidates", "long_context_not_measured"):
        assert result["summary"][key] == whole["summary"][key]
    assert untimed(result["provenance"]["prompts"]) == untimed(whole["provenance"]["prompts"])
    assert all(p.get("prefill_ms", 0) is not None for p in result["provenance"]["prompts"])  # carried over


def test_load_resumable_pins_the_thread_count_of_the_earlier_session(tmp_path):
    """Settings that left the thread count to the machine resume with the count the first session used."""
    result = new_result(cfg_of(threads=None), "t", None)
    result["status"] = "running"
    result["provenance"]["torch_threads"] = 1
    path = tmp_path / "t.json"
    path.write_text(json.dumps(result))
    loaded, cfg = load_resumable(path)
    assert cfg.threads == 1 and cfg == cfg_of(threads=1) and loaded["label"] == "t"


def test_prepare_resume_keeps_only_the_finished_cells_rows_and_failures():
    """The window cell shares context 96 with the first capacity cell: its failure is told apart by its matrix
    and dropped (measured again) with the unfinished cell's row; the interrupt moves to the resume record."""
    cfg = cfg_of()
    result = new_result(cfg, "r", None)
    row = {"candidate": "dynamic", "median_ms": 1.0, "ms_per_token": 1.0, "cache_bytes": 1}
    result["rows"] = [
        {**row, "matrix": "capacity", "context_length": 96},
        {**row, "matrix": "capacity", "context_length": 160},
    ]
    failure = {"candidate": "kivi-2", "residual_length": 16, "stage": "generate", "type": "E", "message": "m"}
    result["failures"] = [
        {**failure, "matrix": "capacity", "context_length": 96},
        {**failure, "matrix": "window", "context_length": 96},
        {
            "candidate": None,
            "stage": "run",
            "type": "KeyboardInterrupt",
            "message": "interrupted during the run (capacity: context 160, kivi-2)",
        },
    ]
    result["cells_done"] = [{"matrix": "capacity", "context_length": 96}] * 2  # a duplicate is counted once
    result["status"], result["summary"], result["elapsed_s"] = "stopped", {"decision": "stale"}, 12.5
    record = prepare_resume(result, cfg, ["kvlab", "eval", "--resume", "r.json"])
    assert result["rows"] == [{**row, "matrix": "capacity", "context_length": 96}]
    assert result["failures"] == [{**failure, "matrix": "capacity", "context_length": 96}]
    assert result["cells_done"] == [{"matrix": "capacity", "context_length": 96}]
    assert result["summary"] is None and result["provenance"]["resumed"] == [record]
    assert {k: record[k] for k in ("cells_kept", "rows_kept", "cells_to_measure", "failures_dropped")} == {
        "cells_kept": 1,
        "rows_kept": 1,
        "cells_to_measure": 2,
        "failures_dropped": 1,
    }
    assert record["stopped_by"] == [
        {"stage": "run", "type": "KeyboardInterrupt", "message": "interrupted during the run (capacity: context 160, kivi-2)"}
    ]
    assert record["status_before"] == "stopped" and record["command"][-2:] == ["--resume", "r.json"]
    assert record["earlier_elapsed_s"] == 12.5 and result["elapsed_s"] is None  # the next session's, once it runs


def test_prepare_resume_keeps_a_measured_cell_and_its_failures_but_the_probes():
    """A cell measured but not timed keeps its measurements and the failures of its measurement; its long-context
    failures go (the probes are attached to it again), as does the record of a cell timed already."""
    cfg = cfg_of()
    result = new_result(cfg, "m", None)
    measured = {"matrix": "capacity", "context_length": 160, "base": {}, "measured": []}
    done = {"matrix": "capacity", "context_length": 96, "base": {}, "measured": []}
    result["cells_measured"] = [done, measured]
    result["cells_done"] = [{"matrix": "capacity", "context_length": 96}]
    failure = {
        "candidate": "kivi-2",
        "residual_length": 128,
        "type": "E",
        "message": "m",
        "matrix": "capacity",
    }
    result["failures"] = [
        {**failure, "context_length": 160, "stage": "generate"},
        {**failure, "context_length": 160, "stage": "long_context"},
        {**failure, "context_length": 96, "stage": "timing"},
        {**failure, "matrix": "window", "context_length": 96, "stage": "generate"},
    ]
    result["status"] = "failed"
    record = prepare_resume(result, cfg, None)
    assert result["cells_measured"] == [measured]
    assert [(f["context_length"], f["stage"]) for f in result["failures"]] == [
        (160, "generate"),
        (96, "timing"),
    ]
    assert (record["cells_kept"], record["cells_measured_kept"], record["cells_to_measure"]) == (1, 1, 1)
    assert record["failures_dropped"] == 2


@pytest.mark.parametrize(
    "earlier, words",
    [
        ([], "elapsed 30.0 s"),
        ([12.5], "elapsed 30.0 s in the last session, 42.5 s over the run's 2 sessions"),
        ([12.5, 7.5], "elapsed 30.0 s in the last session, 50.0 s over the run's 3 sessions"),
        ([None], "elapsed 30.0 s in the last session only (an earlier session of this resumed run recorded no time)"),
    ],
)
def test_elapsed_states_the_last_session_and_the_whole_run(earlier, words):
    """A resumed run's elapsed time: the last session's and the sum over every session, where each recorded its own;
    the HTML page's header says the same."""
    from kvlab.eval.resume import elapsed_words
    from kvlab.report_html import _header

    result = {"elapsed_s": 30.0, "provenance": {"resumed": [{"earlier_elapsed_s": e} for e in earlier]}}
    assert elapsed_words(result) == words
    assert _header(result).get("elapsed") == (words if earlier else None)
    assert elapsed_words({"elapsed_s": None}) is None
