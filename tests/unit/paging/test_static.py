"""Static capacity: every figure of docs/paging.md ("Static capacity"), from its workloads and budget."""

import numpy as np
import pytest

from kvlab.paging import default_budget, run_static, static_capacity, workload
from kvlab.paging.budget import KVBudget, default_kv_bytes_per_token
from kvlab.paging.static import block_size_sweep, demo_layout, greedy_admit, load_lengths, waste_split

GIB, MIB = 1024**3, 1024**2


@pytest.fixture(scope="module")
def seed_result():
    return run_static()


def test_budget_is_the_seeds_61_gib():
    budget = default_budget()  # from the planner: Llama-3-8B preset, A100-80GB, 4 GiB reserve
    assert budget.kv_bytes_per_token == 131072
    assert budget.weight_bytes == 8_030_261_248 * 2
    assert budget.capacity_tokens == 500059
    assert round(budget.budget_bytes / GIB, 2) == 61.04
    assert round(budget.weight_bytes / GIB, 2) == 14.96


def test_uniform_workload_122_vs_214(seed_result):
    a = seed_result["A"]["uniform"]
    assert (a["k_cont"], a["k_paged"]) == (122, 214)
    assert round(a["gain"], 2) == 1.75
    assert f"{a['util_cont']:.2%}" == "56.59%" and f"{a['util_paged']:.2%}" == "99.70%"
    assert f"{a['bytes_cont'] / GIB:.2f}" == "61.00" and f"{a['bytes_paged'] / GIB:.2f}" == "60.85"
    assert f"{a['real_cont'] / GIB:.2f}" == "34.52" and f"{a['real_paged'] / GIB:.2f}" == "60.67"


def test_heavy_tail_workload_122_vs_405(seed_result):
    a = seed_result["A"]["heavy"]
    assert (a["k_cont"], a["k_paged"]) == (122, 405)
    assert round(a["gain"], 2) == 3.32
    assert f"{a['util_cont']:.2%}" == "30.11%" and f"{a['util_paged']:.2%}" == "99.40%"
    assert f"{a['bytes_paged'] / GIB:.2f}" == "60.79" and f"{a['real_cont'] / GIB:.2f}" == "18.37"


def test_waste_split_223_26_mib_vs_0_93_mib(seed_result):
    b = seed_result["B"]
    assert f"{b['reserve_waste'] / MIB:.2f}" == "223.26"
    assert f"{b['frag'] / MIB:.2f}" == "0.93"
    assert f"{b['ratio']:.1f}" == "239.0"
    assert round(b["mean_len"]) == 2310


def test_block_size_sweep(seed_result):
    rows = {r["bs"]: r for r in seed_result["C"]["rows"]}
    assert sorted(rows) == [1, 4, 8, 16, 32, 64, 128, 256]
    assert rows[1]["frag"] == 0 and rows[1]["util"] == 1
    # empty slots are about 0.32 % / 0.67 % of the length
    mean_len = seed_result["C"]["mean_len"]
    assert f"{rows[16]['frag'] / mean_len:.2%}" == "0.32%" and f"{rows[32]['frag'] / mean_len:.2%}" == "0.67%"
    frags = [rows[bs]["frag"] for bs in sorted(rows)]
    tables = [rows[bs]["nblk"] for bs in sorted(rows)]
    assert frags == sorted(frags) and tables == sorted(tables, reverse=True)
    # empty slots near (bs - 1) / 2 when remainders are uniform
    for bs, row in rows.items():
        assert abs(row["frag"] - (bs - 1) / 2) <= max(1.0, 0.05 * bs)


def test_seed_json_keys(seed_result):
    assert {"A", "B", "C", "demo"} <= set(seed_result)
    assert {"k_cont", "k_paged", "util_cont", "util_paged", "gain"} <= set(seed_result["A"]["heavy"])
    assert seed_result["A"]["cap_tokens"] == 500059
    assert "ratio" in seed_result["B"] and "rows" in seed_result["C"]


def test_greedy_admission_matches_a_loop_that_stops_at_the_first_misfit():
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 100, 500)
    budget = 10_000
    used = k = 0
    for s in sizes:
        if used + s > budget:
            break
        used += s
        k += 1
    assert greedy_admit(sizes, budget) == (k, used)
    assert greedy_admit(sizes, 0) == (0, 0)


def test_demo_layout_interleaves_blocks_of_three_requests():
    demo = demo_layout()
    seqs = demo["seqs"]
    assert [(s["length"], s["n_blocks"], s["last_used"]) for s in seqs] == [
        (37, 3, 5),
        (21, 2, 5),
        (45, 3, 13),
    ]
    assert [s["block_ids"] for s in seqs] == [[0, 3, 6], [1, 4], [2, 5, 7]]
    assert len(demo["physical"]) == 8 + 3 and demo["physical"][-1]["owner"] is None


def test_quantized_bytes_per_token_fit_more_requests():
    # KIVI-4, G=32, 16-bit scale and zero: per layer and KV head 2*128*4/8 code bytes + 4*2*128/32 metadata
    # bytes = 160 B, x 32 layers x 8 KV heads
    assert default_kv_bytes_per_token("kivi4") == 160 * 32 * 8 == 40960
    lens = workload("uniform")
    bf16 = static_capacity(lens, default_budget(), 16)
    q = static_capacity(lens, default_budget("kivi4"), 16)
    # 3.2x fewer bytes per token, less each request's residual window (128 tokens at bf16's 131,072 B)
    assert q["k_paged"] > 2.5 * bf16["k_paged"] and q["k_cont"] > 2.5 * bf16["k_cont"]


def test_a_million_requests_admit_like_the_seeds_loop():
    lens = workload("heavy", n=1_000_000)
    budget = default_budget()
    a = static_capacity(lens, budget, 16)
    used = k = 0
    # the mechanics chapter's loop; it stops at the first misfit, a few hundred requests in
    for n in lens.tolist():
        b = -(-n // 16) * 16 * budget.kv_bytes_per_token
        if used + b > budget.budget_bytes:
            break
        used, k = used + b, k + 1
    assert (a["k_paged"], a["bytes_paged"], a["k_cont"]) == (k, used, 122)
    assert a["n_requests"] == 1_000_000


def test_lengths_from_files(tmp_path):
    (tmp_path / "plain.txt").write_text("100\n200\n\n300\n")
    (tmp_path / "trace.csv").write_text("arrival_step,prompt_tokens,output_tokens\n0,10,5\n1,20,7\n")
    assert load_lengths(tmp_path / "plain.txt").tolist() == [100, 200, 300]
    assert load_lengths(tmp_path / "trace.csv").tolist() == [15, 27]
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="columns"):
        load_lengths(tmp_path / "bad.csv")


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="kind"):
        workload("bursty")
    with pytest.raises(ValueError, match="exceeds the contiguous reservation"):
        static_capacity(np.array([5000]), default_budget())
    with pytest.raises(ValueError, match="nothing left"):
        KVBudget(gpu_bytes=GIB, weight_bytes=2 * GIB, overhead_bytes=0, kv_bytes_per_token=2)
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        KVBudget(gpu_bytes=GIB, weight_bytes=0, overhead_bytes=0, kv_bytes_per_token=0)


def test_waste_split_and_sweep_on_hand_lengths():
    lens = np.array([16, 17, 31])
    b = waste_split(lens, kv_bytes_per_token=1, block_size_tokens=16, max_len=32)
    assert b["reserve_waste"] == pytest.approx((16 + 15 + 1) / 3) and b["frag"] == pytest.approx(
        (0 + 15 + 1) / 3
    )
    c = block_size_sweep(lens, [16])
    assert c["rows"][0]["nblk"] == pytest.approx((1 + 2 + 2) / 3)


def test_a_workload_with_no_last_block_waste_has_no_ratio_and_prints_strict_json(capsys, tmp_path):
    """Every request filling its last block made the ratio float('inf'): '"ratio": Infinity' in --json (not JSON;
    jq refused it) and 'infx' in the table."""
    import json

    import numpy as np

    from kvlab.cli import main
    from kvlab.paging.static import waste_split

    assert waste_split(np.array([4096] * 10), 131072, 16, 4096)["ratio"] is None
    work = tmp_path / "w.csv"
    work.write_text("prompt_tokens,output_tokens\n" + "2048,2048\n" * 20)
    assert main(["paging", "static", "--workload", str(work), "--json"]) == 0
    out = capsys.readouterr().out
    assert "Infinity" not in out and json.loads(out)["B"]["ratio"] is None
    assert main(["paging", "static", "--workload", str(work)]) == 0
    assert "- (no last-block waste)" in capsys.readouterr().out
