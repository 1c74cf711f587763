"""Weights (and reserve) past the GPU memory: ``kvlab plan`` printed "left for KV per GPU -95.42 GiB", "max batch 0"
and "max context 0 tokens" with nothing saying why (kvlab.plan.fit.max_batch returns 0 for a negative budget);
now a ``does not fit`` note names the shortfall. ``--emit vllm`` and ``kvlab paging`` already refused it."""

from __future__ import annotations

import pytest

from kvlab.cli import main
from kvlab.plan.fit import GIB, max_batch
from kvlab.plan.load import load_spec
from kvlab.plan.report import plan_report

MODEL, SMALL_GIB, RESERVE_GIB = "llama-3-8b", 10, 4  # 8B bf16 weights (~15 GiB) do not fit 10 GiB


def _shortfall(notes: list[str]) -> list[str]:
    return [n for n in notes if n.startswith("does not fit")]


@pytest.mark.parametrize("kv", ["auto", "mixed-demo"])
@pytest.mark.parametrize("reserve", [0, RESERVE_GIB])
def test_weights_past_the_memory_are_said_with_the_shortfall(kv, reserve):
    r = plan_report(MODEL, kv=kv, gpu_mem_gib=SMALL_GIB, reserve_gib=reserve)
    free = r["kv_budget_bytes_per_gpu"]
    assert free < 0 and r["max_batch"] == 0 and r["max_context"] == 0
    (note,) = _shortfall(r["notes"])
    assert f"by {-free / GIB:,.2f} GiB" in note and f"({SMALL_GIB:.2f} GiB)" in note, note
    assert f"the weights ({r['weight_bytes_per_gpu'] / GIB:,.2f} GiB per GPU)" in note, note
    assert ("reserve" in note) == (reserve > 0), note


@pytest.mark.parametrize("kv", ["auto", "mixed-demo"])
def test_a_plan_with_room_for_kv_has_no_shortfall_note(kv):
    r = plan_report(MODEL, kv=kv, gpu_mem_gib=80, reserve_gib=RESERVE_GIB)
    assert r["kv_budget_bytes_per_gpu"] > 0 and not _shortfall(r["notes"])


def test_max_batch_of_a_negative_budget_is_0():
    assert max_batch(load_spec(MODEL), 1024, -1) == 0  # the documented 0, explained by the report's note


def test_the_cli_prints_the_note(capsys):
    assert main(["plan", MODEL, "--gpu-mem-gib", str(SMALL_GIB)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "note: does not fit: the weights" in out and "no KV cache fits" in out, out
