"""A KIVI policy charges each request its full-precision residual window, as the planner's ledger does.

The simulator sized KIVI-4 with the planner's long-context bytes per token (40,960 B for Llama-3-8B, the window
amortized away), so a running request's newest 128-159 tokens cost 40,960 B instead of bf16's 131,072 B: about 18
blocks of 16 tokens too few per request.
"""

import math

import numpy as np
import pytest

from kvlab.paging import KVBudget, Policy, Trace, default_budget, default_policies, planner_budget, simulate
from kvlab.paging.residual import (
    ResidualWindow,
    peak_blocks,
    request_blocks,
    request_bytes,
    reservation_bytes,
)
from kvlab.paging.simulate import simulate_policy
from kvlab.paging.static import static_capacity
from kvlab.plan import kv_bytes, kv_bytes_peak, kv_dtype, load_spec

SPEC = load_spec("llama-3-8b")
KIVI4 = kv_dtype("kivi4", SPEC.dtype)
BS = 16
BLOCK_BYTES = 40960 * BS


def ledger(n: int) -> int:
    """The planner's bytes of one Llama-3-8B request holding ``n`` tokens in KIVI-4 (every layer holds them all)."""
    return kv_bytes(SPEC, n, 1, KIVI4, mode="allocated")


def trace_of(rows) -> Trace:
    a, p, o = (np.array(c) for c in zip(*rows))
    return Trace(a.astype(float), p, o, np.full(len(a), -1), np.zeros(len(a), dtype=np.int64))


def test_the_kivi_budget_carries_its_window_from_the_planner():
    budget = default_budget("kivi4")
    assert budget.kv_bytes_per_token == 40960 and budget.kv_dtype == "kivi4"
    assert budget.residual == ResidualWindow(128, 32, 131072, "bf16")
    assert default_budget().residual is None and default_budget("fp8").residual is None
    assert planner_budget(None, "kivi-2:group_size=64:residual_length=256").residual == ResidualWindow(
        256, 64, 131072, "bf16"
    )
    quant = default_policies()[3]
    assert (quant.name, quant.kv_bytes_per_token, quant.residual) == ("paged+kivi4", 40960, budget.residual)


@pytest.mark.parametrize("n", [*range(0, 300), 1000, 2047, 2048, 2049, 4095, 4096])
def test_request_bytes_are_the_ledgers_and_blocks_round_them_up_once(n):
    budget = default_budget("kivi4")
    assert request_bytes(n, 40960, budget.residual) == ledger(n)
    blocks = request_blocks(n, BS, 40960, budget.residual)
    assert 0 <= blocks * BLOCK_BYTES - ledger(n) < BLOCK_BYTES
    assert blocks >= -(-n // BS)  # never fewer than its block table's


def test_a_2k_request_holds_18_more_blocks_than_the_amortized_figure():
    residual = default_budget("kivi4").residual
    assert request_blocks(2048, BS, 40960, None) == 128
    assert request_blocks(2048, BS, 40960, residual) == math.ceil(ledger(2048) / BLOCK_BYTES) == 146
    assert ledger(2048) / (2048 * 40960) == pytest.approx(1.1375)  # 14 % more than the amortized bytes


@pytest.mark.parametrize("max_len", [1, 127, 128, 129, 159, 160, 1000, 4096])
def test_a_reservation_holds_the_ledgers_peak(max_len):
    residual = default_budget("kivi4").residual
    assert reservation_bytes(max_len, 40960, residual) == kv_bytes_peak(SPEC, max_len, 1, KIVI4, mode="allocated")
    assert peak_blocks(max_len, BS, 40960, residual) == math.ceil(
        kv_bytes_peak(SPEC, max_len, 1, KIVI4, mode="allocated") / BLOCK_BYTES
    )


def test_one_request_holds_the_ledgers_bytes_in_whole_blocks_at_every_step():
    budget = planner_budget(None, "kivi4", gpu_gib=20, overhead_gib=0)
    prompt, output = 100, 200  # passes R = 128 and several flushes
    res = simulate_policy(
        trace_of([(0, prompt, output)]), default_policies(BS, budget)[3], budget, 4096, check_every=1,
        keep_series=True,
    )  # fmt: skip
    held = [prompt + k for k in range(output)]  # tokens after the prefill, then one more per step
    assert res["series"]["used_blocks"][:-1] == [math.ceil(ledger(n) / BLOCK_BYTES) for n in held[:-1]]
    assert res["series"]["filled_slots"][:-1] == pytest.approx([ledger(n) / 40960 for n in held[:-1]])
    assert res["max_blocks_per_request"] == max(math.ceil(ledger(n) / BLOCK_BYTES) for n in held)
    assert res["residual_window"] == {"residual_length": 128, "group_size": 32, "bytes_per_token": 131072,
                                      "dtype": "bf16"}  # fmt: skip
    assert res["conservation"]["all_freed"]


def test_short_requests_run_fewer_at_once_than_with_the_window_amortized():
    budget = planner_budget(None, "kivi4", gpu_gib=16, overhead_gib=0)  # ~1 GiB of KV: ~28k KIVI-4 tokens
    rng = np.random.default_rng(0)
    n = 300
    trace = trace_of([(0, int(p), int(o)) for p, o in zip(rng.integers(64, 256, n), rng.integers(16, 64, n))])
    charged = Policy("kivi", block_size_tokens=BS, kv_bytes_per_token=40960, kv_dtype="kivi4",
                     residual=budget.residual)  # fmt: skip
    amortized = Policy("amortized", block_size_tokens=BS, kv_bytes_per_token=40960, kv_dtype="kivi4")
    out = simulate(trace, [charged, amortized], budget, max_len=512, check_every=7)["policies"]
    assert out["kivi"]["num_blocks"] == out["amortized"]["num_blocks"]
    assert out["kivi"]["concurrency"]["max"] < 0.6 * out["amortized"]["concurrency"]["max"]
    assert out["kivi"]["concurrency"]["mean"] < out["amortized"]["concurrency"]["mean"]
    assert out["kivi"]["steps"] > out["amortized"]["steps"]
    # at most as many requests as the pool holds the ledger's bytes of their prompts
    fewest = min(math.ceil(ledger(int(p)) / BLOCK_BYTES) for p in trace.prompt_tokens)
    assert out["kivi"]["concurrency"]["max"] <= out["kivi"]["num_blocks"] // fewest
    for res in out.values():
        assert res["finished"] == n and res["conservation"]["all_freed"]


def test_a_kivi_budget_charges_every_policy_that_takes_its_bytes():
    budget = planner_budget(None, "kivi4", gpu_gib=20, overhead_gib=0)
    trace = trace_of([(0, 300, 100), (1, 200, 50)])
    out = simulate(trace, [Policy("contiguous", kind="contiguous"), Policy("paged")], budget, max_len=1024)
    cont, paged = out["policies"]["contiguous"], out["policies"]["paged"]
    assert cont["kv_dtype"] == paged["kv_dtype"] == "kivi4"
    assert cont["residual_window"] == paged["residual_window"] == budget.residual.as_dict()
    peak = kv_bytes_peak(SPEC, 1024, 1, KIVI4, mode="allocated")  # one reservation: the window's peak included
    assert cont["num_blocks"] == int(budget.free_bytes // peak)
    assert paged["max_blocks_per_request"] == max(math.ceil(ledger(n) / BLOCK_BYTES) for n in range(300, 400))


def test_static_capacity_charges_the_window():
    budget = default_budget("kivi4")
    lens = np.array([2048] * 1000)
    a = static_capacity(lens, budget, BS)
    assert a["k_paged"] == int(budget.budget_bytes // (146 * BLOCK_BYTES))  # not // (128 blocks)
    assert a["real_paged"] == a["k_paged"] * ledger(2048)
    assert a["k_cont"] == int(budget.budget_bytes // kv_bytes_peak(SPEC, 4096, 1, KIVI4, mode="allocated"))


def test_bad_residual_settings_are_refused_with_their_values():
    window = ResidualWindow(128, 32, 131072, "bf16")
    with pytest.raises(ValueError, match="`kv_bytes_per_token`, got none"):
        Policy("q", residual=window)
    with pytest.raises(ValueError, match="131072 B/token.*below the quantized 196608 B/token"):
        Policy("q", kv_bytes_per_token=196608, residual=window)
    with pytest.raises(ValueError, match=r"`residual_length` must be a non-negative multiple of `group_size` \(32\), got 100"):
        ResidualWindow(100, 32, 131072, "bf16")
    with pytest.raises(ValueError, match="`group_size` must be an integer >= 1, got 0"):
        ResidualWindow(128, 0, 131072, "bf16")
    with pytest.raises(ValueError, match="below the quantized"):
        KVBudget(2**30, 0, 0, 196608, residual=window)


def test_the_cli_says_the_window_is_charged(capsys):
    from kvlab.cli import main

    small = ["--requests", "20", "--prompt-tokens", "64:256", "--output-tokens", "16:64", "--max-len", "1024"]
    assert main(["paging", "simulate", *small]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "│ + residual window │ - │ - │ - │ R=128 at bf16 │" in out
    assert main(["paging", "static", "--workload", "heavy", "--kv-dtype", "kivi4"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "each request also holds its KIVI residual window, R=128 tokens (up to 159 before a flush) at bf16's 131,072 B/token" in out
    assert main(["paging", "simulate", *small, "--quant-kv-dtype", "kivi8:group_size=2"]) == 2
    err = capsys.readouterr().err
    assert "--quant-kv-dtype 'kivi8:group_size=2'" in err and "below the quantized 196608 B/token" in err
