"""A model dtype the CPU emulates sets a run's pace and its latencies: the run measures that and says so."""

import json
from pathlib import Path

import pytest
import torch

from kvlab.eval.decision import dtype_warning, summarize
from kvlab.eval.schema import validate_result
from kvlab.runtime.dtype_speed import SLOW_DTYPE_RATIO
from kvlab.runtime.dtypes import matmul_time_ratio
from kvlab.runtime.provenance import hardware_info

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "eval-quick-tova-2026-12-01.json"


def _result(ratio, dtype="bfloat16", capability="AVX2"):
    hardware = {"device": "cpu", "cpu_capability": capability, "matmul_time_ratio_vs_float32": ratio}
    return {"provenance": {"hardware": hardware, "model": {"dtype": dtype}}, "rows": []}


def test_warns_with_the_measured_ratio_and_the_capability():
    text = dtype_warning(_result(7.93))
    assert "7.9x" in text and "AVX2" in text and "bfloat16" in text and "--dtype float32" in text


def test_silent_at_or_below_the_threshold_and_without_a_measurement():
    assert dtype_warning(_result(SLOW_DTYPE_RATIO)) is None
    assert dtype_warning(_result(1.1)) is None
    assert dtype_warning(_result(None)) is None
    assert dtype_warning({"provenance": {"hardware": {}}, "rows": []}) is None
    assert dtype_warning({"rows": []}) is None


def test_summary_carries_it_and_the_schema_accepts_it():
    result = _result(9.0)
    summary = summarize(result)
    assert summary["dtype_warning"] == dtype_warning(result)
    recorded = json.loads(EXAMPLE.read_text(encoding="utf-8"))  # a real result file, its summary replaced
    # its dtype warning only: the rest of a summary of no rows would not follow from the file's rows
    assert validate_result({**recorded, "summary": {**recorded["summary"], "dtype_warning": summary["dtype_warning"]}}) == []
    bad = validate_result({**recorded, "summary": {**recorded["summary"], "dtype_warning": 3}})
    assert any("dtype_warning" in p for p in bad), "a number where a string belongs must be reported"


def test_ratio_is_measured_on_the_cpu_only_and_not_for_float32():
    assert matmul_time_ratio("float32") is None
    assert matmul_time_ratio(torch.bfloat16, "cuda") is None
    ratio = matmul_time_ratio("bfloat16", "cpu", rounds=1)
    assert isinstance(ratio, float) and ratio > 0


@pytest.mark.parametrize(
    ("kwargs", "bad"), [({"dtype": "int8"}, "int8"), ({"dtype": "bfloat16", "rounds": 0}, "0")]
)
def test_bad_arguments_are_named(kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        matmul_time_ratio(**kwargs)


def test_hardware_info_names_the_cpu_capability():
    assert hardware_info(torch.device("cpu"))["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
