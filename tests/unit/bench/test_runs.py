"""Each benchmark's run(quick=True) returns its documented keys with sane values; ratios come from the same dict.

No timing assertions: only signs, keys and arithmetic between numbers of one result.
"""

import math

import pytest
import torch

from kvlab.bench import decode, flush, kernel, memory, prepare
from kvlab.caches.registry import CacheSettings


@pytest.fixture(scope="module")
def decode_result(tiny_lm):
    # the profiled context lies beyond the timed ones: the prompt must cover it (it came up empty once)
    return decode.run(model=tiny_lm, quick=True, contexts=(64, 200), profile_context=300)


def test_decode_quick_keys_and_ratios(decode_result):
    r = decode_result
    for key in ("device", "model", "settings", "contexts", "candidates", "prompt_source", "rows", "target"):
        assert key in r
    assert [c["name"] for c in r["candidates"]] == list(decode.DEFAULT_CANDIDATES)
    assert len(r["rows"]) == len(decode.DEFAULT_CANDIDATES) * 2
    dyn = {row["context"]: row["median_ms"] for row in r["rows"] if row["candidate"] == "dynamic"}
    for row in r["rows"]:
        if row["status"] == "skipped":  # an optional backend missing here
            assert row["candidate"].startswith(("hqq", "quanto")) and row["error"]
            continue
        assert row["status"] == "ok", row
        assert len(row["times_ms"]) == r["settings"]["steps"]
        assert all(t > 0 for t in row["times_ms"])
        assert min(row["times_ms"]) <= row["median_ms"] <= max(row["times_ms"])
        assert row["ratio_to_dynamic"] == pytest.approx(row["median_ms"] / dyn[row["context"]])
        assert row["cache_bytes"] > 0
        # kvlab attention for fused KIVI, and for every cache when float32 GEMMs run (its SDPA in float32 too)
        float32 = r["settings"]["cpu_matmul"] == "float32"
        assert row["attention"] == ("kvlab" if row["candidate"].endswith("-fused") or float32 else "sdpa")
    assert r["target"]["status"] == "not measured"  # no 4096-token cell in a quick run
    # the bf16 tiny model: the GEMM path was decided from this CPU's measured ratio and recorded
    ratio = r["settings"]["matmul_time_ratio_vs_float32"]
    assert ratio > 0 and r["settings"]["cpu_matmul"] == ("float32" if ratio > 2.0 else "native")
    assert set(r["profile"]) == {"dynamic", "kivi4-fused"}
    for name in ("dynamic", "kivi4-fused"):
        ops = r["profile"][name]
        assert isinstance(ops, list) and ops, ops  # a failed profile is a dict with "error"
        assert all(op["self_cpu_ms"] >= 0 for op in ops)


def test_decode_quantized_caches_are_smaller_than_dynamic(decode_result):
    rows = {(row["candidate"], row["context"]): row for row in decode_result["rows"] if row["status"] == "ok"}
    assert rows[("kivi4-fused", 200)]["cache_bytes"] < rows[("dynamic", 200)]["cache_bytes"]
    assert rows[("kivi2-fused", 200)]["cache_bytes"] < rows[("kivi4-fused", 200)]["cache_bytes"]


@pytest.mark.parametrize("bad", [0, -5, True])
def test_decode_refuses_a_bad_profile_context(bad):
    with pytest.raises(ValueError, match="profile_context"):
        decode.run(model="unused", quick=True, contexts=(64,), profile_context=bad)


def test_decode_records_a_failing_cell_and_goes_on(tiny_lm):
    # G=48 divides neither head_dim 64 nor, in the KIVI config, residual 96's grouping of 64-dim values
    r = decode.run(
        model=tiny_lm,
        quick=True,
        contexts=(64,),
        candidates=("dynamic", "kivi4-fused"),
        cache_settings=CacheSettings(group_size=48, residual_length=96),
    )
    status = {row["candidate"]: row for row in r["rows"]}
    assert status["dynamic"]["status"] == "ok"
    assert status["kivi4-fused"]["status"] == "failed" and "group_size" in status["kivi4-fused"]["error"]
    assert "ratio_to_dynamic" not in status["kivi4-fused"]
    assert r["settings"]["kivi_cpu_path"]  # a fused KIVI cache was in the run: its kernel path is named


def test_decode_rejects_bad_settings(tiny_lm):
    with pytest.raises(ValueError, match="dynamic"):
        decode.run(model=tiny_lm, quick=True, candidates=("kivi4-fused",))
    with pytest.raises(ValueError, match="unknown cache"):
        decode.run(model=tiny_lm, quick=True, candidates=("dynamic", "kivi3-fused"))
    with pytest.raises(ValueError, match="contexts"):
        decode.run(model=tiny_lm, quick=True, contexts=(0,))
    with pytest.raises(ValueError, match="'fp32'"):
        decode.run(model=tiny_lm, quick=True, cpu_matmul="fp32")


def test_an_fp8_run_names_the_kernel_path_it_took(tiny_lm):
    """Fused FP8 caches read their codes through the CPU kernel too: the record says which path ran."""
    r = decode.run(model=tiny_lm, quick=True, contexts=(64,), candidates=("dynamic", "fp8-e4m3"))
    assert {row["candidate"]: row["status"] for row in r["rows"]} == {"dynamic": "ok", "fp8-e4m3": "ok"}
    assert r["settings"]["kivi_cpu_path"] == decode.kivi_cpu_path(torch.device("cpu"))
    assert r["candidates"][1]["attention"] == "fused"


def test_decode_runs_the_layers_as_float32_gemms_when_asked(tiny_lm, gemm_spy):
    r = decode.run(model=tiny_lm, quick=True, contexts=(64,), cpu_matmul="float32", candidates=("dynamic",))
    assert r["settings"]["cpu_matmul"] == "float32" and gemm_spy and gemm_spy[0][1] > 0
    # no fused cache ran: the record names no kernel path
    assert r["settings"]["kivi_cpu_path"] is None
    assert all("forward" not in vars(m) for m in tiny_lm.modules()), "the layers are restored after the run"
    r = decode.run(model=tiny_lm, quick=True, contexts=(64,), cpu_matmul="native", candidates=("dynamic",))
    assert r["settings"]["cpu_matmul"] == "native" and len(gemm_spy) == 1


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("dynamic", ("dynamic", None, None)),
        ("kivi2-dequant", ("kivi", 2, "dequantize")),
        ("kivi8-fused", ("kivi", 8, "fused")),
        ("hqq4", ("hqq", 4, None)),
        ("quanto2", ("quanto", 2, None)),
    ],
)
def test_candidate_names(text, parsed):
    c = prepare.BenchCandidate.parse(text)
    assert (c.family, c.nbits, c.attention) == parsed


@pytest.mark.parametrize(
    "text, name",
    [
        ("kivi-4-fused", "kivi4-fused"),
        ("KIVI-4-fused", "kivi4-fused"),
        ("hqq-4", "hqq4"),
        ("kivi-2-dequant", "kivi2-dequant"),
        ("FP8-E4M3-Hadamard", "fp8-e4m3-hadamard"),
        ("DYNAMIC", "dynamic"),
        ("dynamic", "dynamic"),
    ],
)
def test_registry_spellings_take_the_bench_spelling_the_targets_look_for(text, name):
    """``kivi-4-fused`` (the registry's grammar) or ``KIVI-4-fused`` once kept its spelling, so the targets reported
    'not measured' for a cell that was measured and the same cache could run twice."""
    assert prepare.BenchCandidate.parse(text).name == name
    with pytest.raises(ValueError):
        prepare.parse_candidates(["dynamic", name, text] if text != name else ["dynamic", "dynamic"])


def test_memory_quick_keys_and_ratios(tiny_lm):
    r = memory.run(
        model=tiny_lm, quick=True, contexts=(96,), candidates=("dynamic", "kivi4-fused", "kivi4-dequant")
    )
    assert {"device", "method", "model", "contexts", "candidates", "rows", "target"} <= set(r)
    rows = {row["candidate"]: row for row in r["rows"]}
    for row in rows.values():
        assert row["status"] == "ok", row
        steps = [row["plain_step"]] + ([row["flush_step"]] if row.get("flush_step") else [])
        for s in steps:
            assert s["peak_bytes"] >= s["retained_bytes"]
            assert s["transient_bytes"] == s["peak_bytes"] - s["retained_bytes"]
        assert row["transient_bytes"] == max(s["transient_bytes"] for s in steps)
        assert row["transient_ratio"] == pytest.approx(row["transient_bytes"] / row["bf16_cache_bytes"])
        assert row["cache_bytes"] > 0
    assert "flush_step" not in rows["dynamic"]  # a DynamicCache never flushes
    assert rows["kivi4-fused"]["flush_step"]["transient_bytes"] > 0
    # CPU accounting says which operators allocated during the step
    by_op = rows["kivi4-fused"]["plain_step"]["allocated_by_op"]
    assert by_op and all(v > 0 for v in by_op.values())
    assert r["target"]["status"] in ("met", "not met")
    assert r["target"]["ratios"] == {96: rows["kivi4-fused"]["transient_ratio"]}


def test_flush_quick_keys_and_ratios():
    r = flush.run(quick=True, kv_heads=2, head_dim=64, caches=("kivi4", "quanto4"))
    assert {"device", "shape", "settings", "contexts", "rows", "ratios", "target"} <= set(r)
    assert r["contexts"] == list(flush.QUICK_CONTEXTS)
    ok = {}
    for row in r["rows"]:
        if row["status"] == "skipped":
            continue
        assert row["status"] == "ok", row
        assert row["flush_us"] > 0 and row["plain_append_us"] > 0
        assert len(row["flush_us_all"]) == row["reps"]
        assert row["cycles"] == (flush.KIVI_CYCLES if row["cache"].startswith("kivi") else 1)
        assert row["history_tokens"] >= row["context"]
        ok[(row["cache"], row["context"])] = row["flush_us"]
    lo, hi = flush.QUICK_CONTEXTS
    assert r["ratios"]["kivi4"]["ratio"] == pytest.approx(ok[("kivi4", hi)] / ok[("kivi4", lo)])
    assert r["target"]["status"] == "not measured"  # 16k is not in a quick run


def test_kivi_flush_quantizes_only_the_new_chunk():
    # the harness's flushing append must flush exactly once, writing G tokens, whatever the history
    subject = flush._subject("kivi4", {"group_size": 32, "residual_length": 128})
    assert isinstance(subject, flush._KIVISubject)
    k = torch.randn(1, 2, 1000, 64, dtype=torch.bfloat16)
    subject.append(k, k)
    q0 = subject.state.quantized_tokens
    n = subject.steps_to_flush()
    subject.append(k[:, :, :n], k[:, :, :n])
    assert subject.state.quantized_tokens == q0
    subject.append(k[:, :, :1], k[:, :, :1])
    assert subject.state.quantized_tokens == q0 + 32


def test_kernel_quick_keys_and_ratios():
    r = kernel.run(quick=True, contexts=(256,), q_heads=4, kv_heads=2, head_dim=64, copy_bytes=2**20)
    assert {"device", "shape", "settings", "copy", "rows", "target"} <= set(r)
    cp = r["copy"]
    assert cp["best_gb_s"] >= cp["median_gb_s"] > 0
    (row,) = r["rows"]
    assert row["status"] == "ok", row
    bd = row["kivi_bytes_breakdown"]
    assert row["kivi_bytes"] == bd["codes"] + bd["scales_zeros"] + bd["residual"]
    assert row["sdpa_bytes"] == 2 * 256 * 2 * 64 * 2  # K and V, bf16
    assert row["kivi_gb_s"] == pytest.approx(row["kivi_bytes"] / (row["kivi_us"] * 1e-6) / 1e9)
    assert row["kivi_fraction_of_copy"] == pytest.approx(row["kivi_gb_s"] / cp["best_gb_s"])
    assert row["kivi_time_over_sdpa"] == pytest.approx(row["kivi_us"] / row["sdpa_us"])
    assert math.isfinite(row["sdpa_gb_s"]) and row["sdpa_gb_s"] > 0
    assert r["target"]["status"] == "not applicable"


def test_kernel_float16_layer_is_measured_not_a_keyerror_row():
    # the integer CPU kernel reads bf16/fp32 only: given float16 it raised KeyError(torch.float16) in every row
    r = kernel.run(
        contexts=(256,), reps=1, q_heads=4, kv_heads=2, head_dim=64, dtype="float16", copy_bytes=2**20
    )
    (row,) = r["rows"]
    assert row["status"] == "ok", row
    assert "kivi4" in row["kernels"] and "sdpa" in row["kernels"] and "kivi4-int8" not in row["kernels"]


@pytest.mark.parametrize(
    "kwargs, said",
    [
        # a value group of 2 x 2 bits is not a whole byte: every row failed inside fused attention
        ({"head_dim": 4, "group_size": 2, "residual_length": 2, "nbits": 2}, "group_size x nbits (2 x 2)"),
        # all 256 tokens quantized, no window for the query's token: every row failed on the causal rule
        ({"residual_length": 0}, "--residual-length 0 quantizes all of --contexts 256"),
        # nothing quantized: the kivi rows timed the full-precision window under the kivi<b> label
        (
            {"residual_length": 256, "group_size": 32},
            "--contexts 256 is below --residual-length 256 + --group-size 32 = 288 tokens: KIVI keeps all of it "
            "in the full-precision window",
        ),
    ],
)
def test_kernel_settings_no_row_could_run_are_refused_before_measuring(kwargs, said, monkeypatch):
    def no_copy(*a, **k):
        raise AssertionError("the copy probe ran")

    monkeypatch.setattr(kernel, "copy_bandwidth", no_copy)
    shape = {"q_heads": 4, "kv_heads": 2, "head_dim": 64} | kwargs
    with pytest.raises(ValueError) as e:
        kernel.run(contexts=(256,), reps=1, copy_bytes=2**20, **shape)
    assert said in str(e.value)


@pytest.mark.parametrize("name", ["kivi4-dequant", "quanto4"])
def test_fill_cache_leaves_the_state_of_a_single_chunk_prefill(tiny_lm, name):
    from kvlab.runtime.hf_api import cache_kwarg

    cand = prepare.BenchCandidate.parse(name)
    if cand.unavailable_reason():
        pytest.skip(cand.unavailable_reason())
    settings = CacheSettings()
    ids = torch.randint(0, 256, (1, 300), generator=torch.Generator().manual_seed(1))
    direct, filled = cand.make(tiny_lm.config, settings), cand.make(tiny_lm.config, settings)
    with torch.inference_mode():
        prepare.set_attention(tiny_lm, cand)
        tiny_lm(input_ids=ids, use_cache=True, **{cache_kwarg(tiny_lm): direct})
        prepare.fill_cache(filled, prepare.exact_prefill(tiny_lm, ids, chunk_tokens=ids.shape[1]))
    for a, b in zip(direct.layers, filled.layers):
        ta, tb = _state_tensors(a), _state_tensors(b)
        assert len(ta) == len(tb) > 0
        for x, y in zip(ta, tb):
            assert torch.equal(x, y)


def _state_tensors(layer):
    """The stored data of a layer: for KIVI its filled blocks and residual window (spare capacity is uninitialised),
    for any other cache every tensor it holds."""
    from kvlab.caches.measure import _tensors

    state = getattr(layer, "state", None)
    if state is not None:
        views = [t for seg in state.segments() for t in vars(seg).values() if isinstance(t, torch.Tensor)]
        return views + [state.key_residual, state.value_residual]
    return list(_tensors(layer, set()))


def test_one_flush_times_consecutive_flushes_of_one_layer():
    settings = {"group_size": 4, "residual_length": 8}
    k = torch.randn(1, 1, 200, 8)
    f_us, p_us, history = flush._one_flush(
        "kivi4", 32, (k, k.clone()), settings, torch.device("cpu"), cycles=3
    )
    assert f_us > 0 and p_us > 0
    # history at the first timed flush: the fill, then up to the step before it (R + G - 1 tokens in the window)
    assert history == 32 + 8 + 4 - 1 - 8
