"""A capped per-request footprint (``Policy.keep_tokens`` / ``kvlab paging simulate --keep-tokens N``): a request never
holds more than ceil(N / block_size) blocks, the oldest block returns to the pool, more requests run at once, and
the block pool's invariants hold at every step."""

import json

import numpy as np
import pytest

from kvlab.cli import main
from kvlab.paging import BlockPool, BlockTable, KVBudget, Policy, Trace, poisson_trace, simulate
from kvlab.paging.simulate import simulate_policy


def tiny_budget(tokens: int) -> KVBudget:
    """A device holding exactly ``tokens`` KV tokens at 1 byte per token."""
    return KVBudget(gpu_bytes=tokens, weight_bytes=0, overhead_bytes=0, kv_bytes_per_token=1, source="test")


def trace_of(rows) -> Trace:
    a, p, o = (np.array(c) for c in zip(*rows))
    return Trace(a.astype(float), p, o, np.full(len(a), -1), np.zeros(len(a), dtype=np.int64))


def test_a_capped_request_timeline_recycles_its_oldest_block():
    # prompt 10 tokens, cap 8 tokens = 2 blocks of 4: the prefill keeps 8 (2 blocks); each time the last block is
    # full the oldest goes back to the pool before a new one is taken, so the request holds 2 blocks throughout
    res = simulate_policy(
        trace_of([(0, 10, 12)]),
        Policy("keep8", block_size_tokens=4, keep_tokens=8),
        tiny_budget(64),
        64,
        check_every=1,
        keep_series=True,
    )
    assert res["series"]["used_blocks"][:-1] == [2] * (len(res["series"]["used_blocks"]) - 1)
    assert res["max_blocks_per_request"] == 2 and res["keep_tokens"] == 8
    # the prefill leaves both blocks full: 11 decoded K/V slots open a new block at slots 1, 5 and 9
    assert res["evicted_blocks"] == -(-11 // 4) == 3
    uncapped = simulate_policy(
        trace_of([(0, 10, 12)]), Policy("paged", block_size_tokens=4), tiny_budget(64), 64, keep_series=True
    )
    assert uncapped["max_blocks_per_request"] == -(-(10 + 11) // 4) and uncapped["evicted_blocks"] == 0


@pytest.mark.parametrize("keep", [100, 128, 256])
def test_more_requests_run_at_once_under_a_cap_and_the_pool_stays_consistent(keep):
    trace = poisson_trace(60, 4.0, prompt_tokens=(64, 512), output_tokens=(256, 1024), seed=3)
    policies = [
        Policy("paged", block_size_tokens=16),
        Policy("capped", block_size_tokens=16, keep_tokens=keep),
    ]
    out = simulate(trace, policies, tiny_budget(16 * 400), max_len=2048, check_every=1)["policies"]
    paged, capped = out["paged"], out["capped"]
    cap_blocks = -(-keep // 16)
    assert capped["max_blocks_per_request"] == cap_blocks < paged["max_blocks_per_request"]
    assert capped["concurrency"]["mean"] > paged["concurrency"]["mean"]
    assert capped["concurrency"]["max"] > paged["concurrency"]["max"]
    assert capped["preemptions"] < paged["preemptions"]
    assert capped["evicted_blocks"] > 0 and paged["evicted_blocks"] == 0
    for r in (paged, capped):  # full check_invariants every step, every block back in the pool at the end
        assert r["finished"] == 60 and r["conservation"]["all_freed"]
        assert r["conservation"]["full_checks"] == r["steps"] + 1


def test_evict_front_keeps_the_table_and_pool_consistent():
    pool = BlockPool(8, 4)
    table = BlockTable(pool)
    table.allocate(10)  # 3 blocks: 4 + 4 + 2
    assert table.evict_front(2) == 2
    assert table.num_tokens == 2 and len(table.blocks) == 1 and pool.num_free == 7
    pool.check_invariants([table])
    table.append_tokens(5)  # 2 + 5 = 7 tokens: 2 blocks
    pool.check_invariants([table])
    for bad in (-1, 3, 1.0, True):
        with pytest.raises(ValueError, match="n_blocks"):
            table.evict_front(bad)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(keep_tokens=0), "--keep-tokens"),
        (dict(keep_tokens=-4), "--keep-tokens"),
        (dict(keep_tokens=2.5), "--keep-tokens"),
        (dict(keep_tokens="64"), "--keep-tokens"),
        (dict(keep_tokens=64, kind="contiguous"), "contiguous"),
        (dict(keep_tokens=64, prefix_sharing=True), "prefix_sharing=True"),
    ],
)
def test_bad_keep_tokens_policies_are_named(kwargs, fragment):
    with pytest.raises(ValueError, match="keep_tokens") as exc:
        Policy("x", **kwargs)
    assert fragment in str(exc.value)


SHAPE = [
    "--requests",
    "40",
    "--prompt-tokens",
    "64:256",
    "--output-tokens",
    "128:512",
    "--prefix-groups",
    "0",
]
SHAPE += ["--gpu-mem-gib", "20", "--max-len", "1024", "--check-every", "1"]


def test_cli_keep_tokens_adds_a_capped_policy(capsys):
    argv = [
        "paging",
        "simulate",
        *SHAPE,
        "--policies",
        "paged,paged+keep128",
        "--keep-tokens",
        "128",
        "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)["policies"]
    assert list(out) == ["paged", "paged+keep128"]
    assert out["paged+keep128"]["keep_tokens"] == 128
    assert out["paged+keep128"]["max_blocks_per_request"] == 8 < out["paged"]["max_blocks_per_request"]
    assert (
        main(["paging", "simulate", *SHAPE, "--policies", "paged,paged+keep128", "--keep-tokens", "128"]) == 0
    )
    assert "evicted blocks" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["0", "-1", "2.5", "x"])
def test_cli_bad_keep_tokens_is_named(capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["paging", "simulate", "--keep-tokens", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--keep-tokens" in err and f"got {value!r}" in err
