"""Dynamic simulation: hand-checked timelines, conservation, preemption order, prefix sharing, policies."""

import numpy as np
import pytest

from kvlab.paging import KVBudget, Policy, Trace, default_policies, load_trace, poisson_trace, simulate
from kvlab.paging.simulate import simulate_policy
from kvlab.paging.trace import TRACE_COLUMNS, save_trace


def tiny_budget(tokens: int) -> KVBudget:
    """A device holding exactly ``tokens`` KV tokens at 1 byte per token."""
    return KVBudget(gpu_bytes=tokens, weight_bytes=0, overhead_bytes=0, kv_bytes_per_token=1, source="test")


def trace_of(rows) -> Trace:
    a, p, o = (np.array(c) for c in zip(*rows))
    return Trace(a.astype(float), p, o, np.full(len(a), -1), np.zeros(len(a), dtype=np.int64))


def test_single_request_timeline():
    # prefill 10 tokens at step 0 (samples token 1), then 4 decode steps append tokens 10..13 and sample 2..5
    res = simulate_policy(
        trace_of([(0, 10, 5)]), Policy("paged", block_size_tokens=4), tiny_budget(64), 64, keep_series=True
    )
    assert res["makespan_steps"] == 5 and res["steps"] == 5
    assert res["series"]["tokens"] == [10, 1, 1, 1, 1]
    assert res["series"]["used_blocks"] == [3, 3, 3, 4, 0]  # 10 -> 11, 12 (block 3 full) -> 13 opens block 4
    assert res["events"] == 1 + 1 + 4 + 1  # arrival, admission, 4 decode tokens, completion
    assert res["queue_delay_steps"]["max"] == 0 and res["preemptions"] == 0


def test_idle_time_is_skipped():
    res = simulate_policy(
        trace_of([(0, 4, 2), (1000, 4, 2)]),
        Policy("paged", block_size_tokens=4),
        tiny_budget(64),
        64,
        keep_series=True,
    )
    assert res["steps"] == 4 and res["makespan_steps"] == 1002
    assert res["series"]["step"] == [0, 1, 1000, 1001]


def test_preemption_takes_the_last_admitted_request():
    trace = trace_of([(0, 8, 16), (1, 8, 16)])  # 6 blocks of 4; each peaks at 23 tokens
    res = simulate_policy(
        trace, Policy("paged", block_size_tokens=4), tiny_budget(24), 64, check_every=1, keep_series=True
    )
    assert res["preemptions"] >= 1
    assert res["per_request"]["preempted"][0] == 0 and res["per_request"]["preempted"][1] >= 1
    assert res["recomputed_tokens"] > 0 and res["finished"] == 2
    assert res["conservation"]["all_freed"]


@pytest.fixture(scope="module")
def shared_prefix_run():
    trace = poisson_trace(
        160, 0.5, prompt_tokens=(8, 64), output_tokens=(8, 96), prefix_groups=2, prefix_tokens=256, seed=3
    )
    policies = [
        Policy("contiguous", kind="contiguous"),
        Policy("paged", block_size_tokens=16),
        Policy("paged+prefix", block_size_tokens=16, prefix_sharing=True),
        Policy("paged+q", block_size_tokens=16, kv_bytes_per_token=0.25),
    ]
    return simulate(trace, policies, tiny_budget(4096), max_len=512, check_every=1)


def test_every_policy_conserves_blocks_and_frees_everything(shared_prefix_run):
    for name, res in shared_prefix_run["policies"].items():
        c = res["conservation"]
        assert (
            c["all_freed"] and c["checked_steps"] == res["steps"] and c["full_checks"] == res["steps"] + 1
        ), name
        assert res["finished"] == res["requests"] == 160


def test_prefix_sharing_admits_more_than_plain_paging(shared_prefix_run):
    p = shared_prefix_run["policies"]
    assert p["paged+prefix"]["prefix_hit_blocks"] > 0 and p["paged"]["prefix_hit_blocks"] == 0
    assert p["paged+prefix"]["concurrency"]["max"] > p["paged"]["concurrency"]["max"]
    assert p["paged+prefix"]["concurrency"]["mean"] > p["paged"]["concurrency"]["mean"]
    assert p["paged+prefix"]["queue_delay_steps"]["mean"] < p["paged"]["queue_delay_steps"]["mean"]


def test_paging_beats_contiguous_and_quantization_beats_both(shared_prefix_run):
    p = shared_prefix_run["policies"]
    assert p["contiguous"]["concurrency"]["max"] <= p["contiguous"]["num_blocks"] == 4096 // 512
    assert p["contiguous"]["preemptions"] == 0  # a reservation never needs a second block
    assert p["paged"]["concurrency"]["max"] > p["contiguous"]["concurrency"]["max"]
    assert p["paged"]["utilization"] > p["contiguous"]["utilization"]
    assert p["paged+q"]["num_blocks"] == 4 * p["paged"]["num_blocks"]
    assert p["paged+q"]["concurrency"]["mean"] > p["paged"]["concurrency"]["mean"]
    assert p["paged"]["preemptions"] > 0  # the budget is tight: growth forces recompute


def test_same_seed_same_result():
    trace = poisson_trace(40, 1.0, prompt_tokens=(8, 32), output_tokens=(4, 32), seed=5)
    a = simulate(trace, [Policy("paged")], tiny_budget(512), max_len=128)["policies"]["paged"]
    b = simulate(trace, [Policy("paged")], tiny_budget(512), max_len=128)["policies"]["paged"]
    for key in ("steps", "preemptions", "concurrency", "queue_delay_steps", "events"):
        assert a[key] == b[key]


def test_trace_round_trip_and_validation(tmp_path):
    trace = poisson_trace(5, 0.1, prefix_groups=2, prefix_tokens=32, seed=1)
    path = save_trace(trace, tmp_path / "t.csv")
    back = load_trace(path)
    assert np.allclose(back.arrival_step, trace.arrival_step)
    assert back.prompt_tokens.tolist() == trace.prompt_tokens.tolist()
    assert back.prefix_group.tolist() == trace.prefix_group.tolist()
    with pytest.raises(ValueError, match="exists; pass overwrite=True to replace it"):
        save_trace(trace, path)
    save_trace(poisson_trace(3, 0.1, seed=2), path, overwrite=True)
    assert len(load_trace(path)) == 3
    (tmp_path / "bad.csv").write_text("arrival_step,prompt_tokens\n0,5\n")
    with pytest.raises(ValueError, match="missing columns"):
        load_trace(tmp_path / "bad.csv")
    (tmp_path / "header.csv").write_text(
        "a,b,c\n"
    )  # a wrong header alone: its columns named, not "no requests"
    with pytest.raises(ValueError, match=r"missing columns \['arrival_step', 'prompt_tokens', 'output_tokens'\]; "
                       r"have \['a', 'b', 'c'\]"):  # fmt: skip
        load_trace(tmp_path / "header.csv")
    (tmp_path / "empty.csv").write_text(",".join(TRACE_COLUMNS) + "\n")
    with pytest.raises(ValueError, match="no requests"):
        load_trace(tmp_path / "empty.csv")
    with pytest.raises(ValueError, match="output"):
        trace_of([(0, 5, 0)])


def test_requests_that_cannot_fit_are_rejected():
    with pytest.raises(ValueError, match="holding 149 KV tokens exceeds `max_len` 128"):
        simulate_policy(trace_of([(0, 100, 50)]), Policy("paged"), tiny_budget(4096), max_len=128)
    with pytest.raises(ValueError, match="needs 7 blocks, the pool has 4"):
        simulate_policy(trace_of([(0, 100, 1)]), Policy("paged"), tiny_budget(64), max_len=128)


def test_default_policies_use_kivi4_bytes():
    names = [p.name for p in default_policies()]
    assert names == ["contiguous", "paged", "paged+prefix", "paged+kivi4"]
    assert default_policies()[3].kv_bytes_per_token == 40960
    with pytest.raises(ValueError, match="kind"):
        Policy("x", kind="buddy")
    with pytest.raises(ValueError, match="prefix sharing"):
        Policy("x", kind="contiguous", prefix_sharing=True)
