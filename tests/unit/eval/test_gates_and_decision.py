"""The eval's own gate and decision code (docs/EVAL.md) on hand-made rows: boundaries, selection,
'tune_cache_policy'. Every expected value is written out here; nothing is re-computed with the code under test."""

from __future__ import annotations

import math

import pytest
import torch

from kvlab.eval.candidates import Candidate
from kvlab.eval.config import EvalConfig, Gates
from kvlab.eval.decision import apply_gates, decide, summarize

GATES = Gates(max_nll_delta=0.5, min_topk_overlap=0.6, max_latency_ratio=2.0)
PASSING = {"nll_delta": 0.1, "topk_overlap": 0.9, "latency_ratio": 1.0, "cache_bytes_saved": 10}
ALL_PASS = {"nll_delta": True, "topk_overlap": True, "latency_ratio": True, "saves_memory": True}


def gated(**changes):
    return apply_gates({**PASSING, **changes}, GATES)


def test_a_row_inside_every_gate_passes_them_all():
    assert gated() == ALL_PASS


@pytest.mark.parametrize(
    "field, value, gate, passes",
    [
        ("nll_delta", 0.5, "nll_delta", True),  # on the boundary: <= passes
        ("nll_delta", 0.5000001, "nll_delta", False),
        ("nll_delta", 0.9, "nll_delta", False),
        ("nll_delta", -0.3, "nll_delta", True),  # better than the float cache
        ("nll_delta", None, "nll_delta", False),  # quality not measured
        ("nll_delta", math.nan, "nll_delta", False),
        ("topk_overlap", 0.6, "topk_overlap", True),  # on the boundary: >= passes
        ("topk_overlap", 0.5999999, "topk_overlap", False),
        ("topk_overlap", 0.2, "topk_overlap", False),
        ("topk_overlap", 1.0, "topk_overlap", True),
        ("topk_overlap", None, "topk_overlap", False),
        ("topk_overlap", math.nan, "topk_overlap", False),
        ("latency_ratio", 2.0, "latency_ratio", True),  # on the boundary: <= passes
        ("latency_ratio", 2.0000001, "latency_ratio", False),
        ("latency_ratio", 0.5, "latency_ratio", True),
        ("cache_bytes_saved", 1, "saves_memory", True),
        ("cache_bytes_saved", 0, "saves_memory", False),  # saving nothing is not saving memory
        ("cache_bytes_saved", -5, "saves_memory", False),
    ],
)
def test_each_gate_at_and_around_its_boundary(field, value, gate, passes):
    got = gated(**{field: value})
    assert got == {**ALL_PASS, gate: passes}  # the other gates are untouched


def test_missing_quality_metric_fails_its_gate():
    row = {k: v for k, v in PASSING.items() if k != "topk_overlap"}
    assert apply_gates(row, GATES) == {**ALL_PASS, "topk_overlap": False}


def test_gates_follow_the_configured_thresholds():
    strict = Gates(max_nll_delta=0.05, min_topk_overlap=0.95, max_latency_ratio=1.1)
    assert apply_gates(PASSING, strict) == {
        "nll_delta": False,
        "topk_overlap": False,
        "latency_ratio": True,
        "saves_memory": True,
    }


def test_apply_gates_bad_input_is_named():
    with pytest.raises(TypeError, match="`gates` must be a kvlab.eval.config.Gates, got dict"):
        apply_gates(PASSING, {"max_nll_delta": 0.5})
    baseline = {"candidate": "dynamic", "context_length": 512, "nll_delta": 0.0}
    with pytest.raises(
        ValueError, match=r"'dynamic' at context 512 has no \['latency_ratio', 'cache_bytes_saved'\]"
    ):
        apply_gates(baseline, GATES)


# ---- build_row: a measurement paired with the baseline and gated with apply_gates --------------------------------


def row_of(matrix, cand, ctx, new_tokens, residual, group, meas, base, cfg):
    """The JSON row :func:`kvlab.eval.rows.build_row` makes of the hand-made measurement ``meas`` (a dict of
    :class:`~kvlab.eval.measure.Measurement` fields), paired with ``base`` (None: ``meas`` is the baseline)."""
    from kvlab.eval.cells import Cell
    from kvlab.eval.measure import CellMeasurement, Measurement, compare
    from kvlab.eval.rows import build_row

    def of(d, c, r):
        return Measurement(
            c, r, lambda: None, d["perf"], d["cache_bytes"], d["cache_tokens"], d["generated"],
            quality=d.get("quality"), long_context=d.get("long_context"),
        )  # fmt: skip

    cell = Cell(matrix, ctx, new_tokens, (residual or 0,), group or 1)
    if base is None:
        bm = of(meas, Candidate.parse("dynamic"), None)
        return build_row(CellMeasurement(cell, None, bm, []), bm, cfg).to_json()
    bm, cm = of(base, Candidate.parse("dynamic"), None), of(meas, cand, residual)
    cm.compared = compare(bm, cm, cfg.top_k)
    return build_row(CellMeasurement(cell, None, bm, [cm]), cm, cfg).to_json()


def measurement(mean_nll, topk_ids, median_ms, cache_bytes, generated):
    return {
        "perf": {
            "median_ms": median_ms,
            "min_ms": median_ms,
            "timings_ms": [median_ms],
            "ms_per_token": median_ms / 4,
            "incremental_peak_bytes": None,
        },
        "cache_bytes": cache_bytes,
        "cache_tokens": 19,
        "quality": {"mean_nll": mean_nll, "topk_ids": topk_ids, "prefill_ms": 1.0, "decode_ms": 0.5},
        "generated": torch.tensor(generated),
    }


BASE_TOPK = [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]  # [steps][batch][k], k = 2
BASE = measurement(2.0, BASE_TOPK, 100.0, 1000, [[1, 2, 3, 4], [5, 6, 7, 8]])


def paired_row(mean_nll, topk_ids, median_ms=150.0, cache_bytes=400, gates=GATES):
    cfg = EvalConfig(top_k=2, gates=gates)
    meas = measurement(mean_nll, topk_ids, median_ms, cache_bytes, [[1, 2, 3, 4], [5, 6, 0, 8]])
    return row_of("capacity", Candidate.parse("kivi-4"), 16, 4, 128, 32, meas, BASE, cfg)


def test_row_pairs_a_candidate_with_the_baseline():
    # top-2 intersections per (step, row): 2, 1, 1, 0 -> 4 / (4 * 2) = 0.5
    row = paired_row(2.25, [[[2, 1], [3, 9]], [[6, 0], [0, 9]]])
    assert row["nll_delta"] == pytest.approx(0.25) and row["nll_ratio"] == pytest.approx(1.125)
    assert row["topk_overlap"] == pytest.approx(0.5)
    assert row["latency_ratio"] == pytest.approx(1.5)
    assert row["cache_bytes_ratio"] == pytest.approx(0.4) and row["cache_bytes_saved"] == 600
    assert row["token_agreement_rate"] == pytest.approx(7 / 8) and row["first_divergence_index"] == 2
    assert row["gates"] == {**ALL_PASS, "topk_overlap": False}  # 0.5 < 0.6
    assert row["eligible"] is False


def test_row_nll_gate_passes_on_the_boundary_and_fails_above():
    same_topk = [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]
    at = paired_row(2.5, same_topk)  # 2.5 - 2.0 = 0.5 exactly
    assert at["nll_delta"] == 0.5 and at["gates"] == ALL_PASS and at["eligible"] is True
    above = paired_row(2.75, same_topk)
    assert above["gates"] == {**ALL_PASS, "nll_delta": False} and above["eligible"] is False
    better = paired_row(1.5, same_topk)  # lower NLL than the float cache
    assert better["gates"]["nll_delta"] is True


def test_row_latency_and_memory_gates():
    same_topk = [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]
    slow = paired_row(2.0, same_topk, median_ms=250.0)  # 2.5x the baseline's 100 ms
    assert slow["gates"] == {**ALL_PASS, "latency_ratio": False}
    no_saving = paired_row(2.0, same_topk, cache_bytes=1000)
    assert no_saving["gates"] == {**ALL_PASS, "saves_memory": False}


def test_baseline_row_is_not_gated():
    cfg = EvalConfig(top_k=2)
    row = row_of("capacity", Candidate.parse("dynamic"), 16, 4, None, None, BASE, None, cfg)
    assert "gates" not in row and "eligible" not in row and row["mean_nll"] == 2.0


# ---- decide / summarize -------------------------------------------------------------------------------------------


def cap_row(cand, ctx, saved, nll=0.1, topk=0.9, lat=1.0, matrix="capacity"):
    """A capacity row of 100 float-cache bytes, gated by the runner's own :func:`apply_gates`."""
    row = {
        "matrix": matrix,
        "candidate": cand,
        "context_length": ctx,
        "residual_length": 128,
        "group_size": 32,
        "cache_bytes": 100 - saved,
        "cache_bytes_ratio": (100 - saved) / 100,
        "cache_bytes_saved": saved,
        "nll_delta": nll,
        "nll_ratio": 1.0,
        "topk_overlap": topk,
        "latency_ratio": lat,
        "incremental_peak_saved_bytes": None,
    }
    row["gates"] = apply_gates(row, GATES)
    row["eligible"] = all(row["gates"].values())
    return row


def test_decide_selects_most_bytes_saved_then_lower_latency():
    rows = [
        cap_row("kivi-4", 512, 40, lat=1.2),
        cap_row("kivi-2", 512, 70, nll=0.8),  # saves most but fails the NLL gate
        cap_row("hqq-4", 512, 50, lat=1.9),
        cap_row("kivi-8", 512, 50, lat=1.1),  # ties hqq-4 on bytes, faster
    ]
    selected, decision = decide(rows)
    assert selected is rows[3] and decision == "accept kivi-8 at context 512"


def test_decide_breaks_a_byte_tie_on_kl_before_latency():
    """fp8-e4m3 and fp8-e4m3-hadamard store the same bytes: a 1,024-position run once accepted the plain one (KL
    9.9e-3) over the rotated one (2.2e-3) on one timed round's latency (1.69x vs 1.88x)."""
    plain, rotated = cap_row("fp8-e4m3", 4096, 50, lat=1.69), cap_row("fp8-e4m3-hadamard", 4096, 50, lat=1.88)
    plain["kl_mean"], rotated["kl_mean"] = 9.9e-3, 2.2e-3
    assert decide([plain, rotated])[0] is rotated
    unmeasured = cap_row("hqq-4", 4096, 50, lat=1.0)  # no KL: loses the tie to a measured one
    assert decide([unmeasured, plain])[0] is plain
    smaller = cap_row("kivi-4", 4096, 60, lat=1.9)
    smaller["kl_mean"] = 5e-2
    assert decide([plain, rotated, smaller])[0] is smaller  # bytes first


def test_decide_counts_bytes_within_one_percent_as_a_tie():
    """fp8-e5m2-unscaled saves an FP8 cache's scales (64 B) more than fp8-e4m3: a quick run accepted it with KL
    0.036 over fp8-e4m3's 0.0026. Within 1 % of the most bytes saved is a tie; beyond it, bytes decide."""
    scaled = cap_row("fp8-e4m3", 1024, 600_000, lat=1.3)
    unscaled = cap_row("fp8-e5m2-unscaled", 1024, 600_064, lat=1.2)
    for row in (scaled, unscaled):
        row["cache_bytes"] = 1_200_000 - row["cache_bytes_saved"]
    scaled["kl_mean"], unscaled["kl_mean"] = 2.6e-3, 3.6e-2
    assert decide([unscaled, scaled])[0] is scaled
    unscaled["cache_bytes_saved"] = 600_000 * 1.011  # 1.1 % more: no longer a tie
    assert decide([unscaled, scaled])[0] is unscaled
    # in a tie without KL difference the latency decides, then the bytes
    a, b = cap_row("kivi-4", 1024, 1000, lat=1.5), cap_row("hqq-4", 1024, 995, lat=1.1)
    assert decide([a, b])[0] is b
    b["latency_ratio"] = 1.5
    assert decide([b, a])[0] is a


def test_decide_first_row_wins_a_full_tie():
    rows = [cap_row("kivi-4", 1024, 50), cap_row("hqq-4", 1024, 50)]
    assert decide(rows)[0] is rows[0]


def test_decide_without_eligible_rows_tunes_the_policy():
    rows = [cap_row("kivi-2", 512, 60, topk=0.3), cap_row("kivi-4", 512, 0)]
    assert decide(rows) == (None, "tune_cache_policy")
    assert decide([]) == (None, "tune_cache_policy")


def test_decide_refuses_an_ungated_row():
    row = cap_row("kivi-4", 512, 40)
    del row["eligible"]
    with pytest.raises(ValueError, match=r"rows at positions \[1\] have no 'eligible' field"):
        decide([cap_row("kivi-2", 512, 10), row])


def test_summarize_on_hand_made_rows():
    rows = [
        {"matrix": "capacity", "candidate": "dynamic", "context_length": 512, "cache_bytes_saved": 0},
        cap_row("kivi-4", 4096, 45, lat=1.5),
        cap_row("kivi-4", 512, 0),  # saves nothing: not eligible
        cap_row("kivi-4", 2048, 40),
        cap_row("kivi-2", 512, 20, topk=0.59),  # saves bytes from 512 on, fails top-k
        cap_row("kivi-2", 2048, 60, nll=0.51),  # fails NLL just above the gate
        cap_row("kivi-2", 4096, 65, lat=2.01),  # fails latency just above the gate
        cap_row("kivi-2", 512, 99, matrix="window"),  # window rows never count
    ]
    s = summarize({"rows": rows})
    assert s["memory_reduction_onset_context"] == 512
    assert s["eligible_crossover_context"] == 2048
    assert s["eligible_candidate_count"] == 2
    assert s["per_candidate"] == {
        "kivi-2": {
            "memory_reduction_onset_context": 512,
            "eligible_crossover_context": None,
            "eligible_contexts": [],
        },
        "kivi-4": {
            "memory_reduction_onset_context": 2048,
            "eligible_crossover_context": 2048,
            "eligible_contexts": [2048, 4096],
        },
    }
    assert s["decision"] == "accept kivi-4 at context 4096"
    assert s["selected_candidate"] == {
        "candidate": "kivi-4",
        "context_length": 4096,
        "residual_length": 128,
        "group_size": 32,
        "cache_bytes": 55,
        "cache_bytes_ratio": 0.55,
        "cache_bytes_saved": 45,
        "nll_delta": 0.1,
        "nll_ratio": 1.0,
        "topk_overlap": 0.9,
        "latency_ratio": 1.5,
        "incremental_peak_saved_bytes": None,
    }


def test_summarize_with_nothing_eligible_tunes_the_policy():
    rows = [
        cap_row("kivi-2", 512, 30, nll=0.6),
        cap_row("kivi-2", 2048, 60, topk=0.5),
        cap_row("kivi-4", 2048, 50, lat=3.0),
        cap_row("kivi-8", 512, 0),
        cap_row("kivi-8", 512, 90, matrix="window"),  # eligible, but the window matrix does not decide
    ]
    s = summarize({"rows": rows})
    assert s["decision"] == "tune_cache_policy" and s["selected_candidate"] is None
    assert s["eligible_candidate_count"] == 0 and s["eligible_crossover_context"] is None
    assert s["memory_reduction_onset_context"] == 512
