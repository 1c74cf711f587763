"""The CPU integer-path target of ``kvlab bench decode``: ``kivi4:dot=int8`` against the float C kernel baseline,
judged only where the integer path ran."""

from __future__ import annotations

import pytest

from kvlab.bench.decode import evaluate_int8_target


def _result(int8_ms, ckernel_ms, path="int8 (avx2)", device="cpu"):
    rows = []
    for ctx, a, b in zip((4096, 16384), int8_ms, ckernel_ms):
        rows.append(
            {
                "candidate": "kivi4:dot=int8",
                "context": ctx,
                "status": "ok",
                "median_ms": a,
                "key_score_path": path,
            }
        )
        rows.append({"candidate": "dynamic-ckernel", "context": ctx, "status": "ok", "median_ms": b})
    rows.append({"candidate": "dynamic", "context": 4096, "status": "ok", "median_ms": 9.0})
    return {"device_type": device, "rows": rows}


@pytest.mark.parametrize(
    "int8, ckernel, status",
    [((1.0, 2.0), (1.2, 2.5), "met"), ((1.0, 2.6), (1.2, 2.5), "not met")],
)
def test_the_target_compares_every_context(int8, ckernel, status):
    (t,) = evaluate_int8_target(_result(int8, ckernel))
    assert t["status"] == status and "at 4096" in t["detail"] and "int8 (avx2)" in t["detail"]
    assert ("misses at 16384" in t["detail"]) == (status == "not met")


def test_an_exact_path_is_not_reported_as_the_integer_one():
    (t,) = evaluate_int8_target(
        _result((1.0, 2.0), (1.2, 2.5), path="exact (int8 does not take 4-bit codes)")
    )
    assert t["status"] == "not measured" and "the integer path did not run: exact" in t["detail"]


def test_records_without_both_caches_or_on_cuda_get_no_target():
    r = _result((1.0, 2.0), (1.2, 2.5))
    assert (
        evaluate_int8_target({**r, "rows": [x for x in r["rows"] if x["candidate"] != "dynamic-ckernel"]})
        == []
    )
    assert evaluate_int8_target(_result((1.0, 2.0), (1.2, 2.5), device="cuda")) == []
