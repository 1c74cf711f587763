"""Roofline, hardware table, fit, video and the probe (mechanics chapter §3.4, §6.3, appendix [B]/[C])."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvlab.plan import (
    DecodeStepBound,
    VideoClip,
    budget_from_gib,
    budget_from_hardware,
    decode_attention_intensity,
    decode_step_bound,
    get_hardware,
    kv_bytes,
    kv_dtype,
    load_spec,
    max_batch,
    max_context,
    model_decode_attention_intensity,
    prefill_intensity,
    spec_from_config,
    video_kv,
    weight_bytes,
)
from kvlab.plan.hardware import HARDWARE
from kvlab.plan.probe import probe

GIB = 1024**3


def test_a100_row_and_ridge_point():
    a100 = get_hardware("a100-80gb")
    assert (a100.tflops_16bit, a100.bandwidth_tb_s) == (312, 2.039)  # mechanics chapter §3.4
    assert round(a100.ridge_flop_per_byte) == 153
    assert get_hardware("A100_80GB") is a100 is get_hardware(" a100 ")


def test_hardware_table_rows_have_sources_and_names_match_case_insensitively():
    for hw in HARDWARE:
        assert hw.source.startswith("https://")
        assert get_hardware(hw.name.lower()) is hw and get_hardware(hw.name.upper()) is hw
    assert get_hardware("h100-sxm").bandwidth_tb_s == 3.35
    assert get_hardware("H200").memory_mib == 143_771 and get_hardware("H200").datasheet_memory_gb == 141
    with pytest.raises(ValueError, match="A100-80GB"):
        get_hardware("tpu-v9")


def test_decode_intensity_is_2g_over_p():
    assert decode_attention_intensity(1, 2) == 1.0  # MHA, bf16
    assert decode_attention_intensity(4, 2) == 4.0  # Llama-3 GQA
    assert decode_attention_intensity(32, 2) == 32.0  # MQA
    assert model_decode_attention_intensity(load_spec("llama-3-8b")) == 4.0
    assert model_decode_attention_intensity(load_spec("llama-3-8b"), "fp8") == 8.0
    # KIVI-4, G=32, 16-bit metadata: p = 0.5 + 4/32 = 0.625 B/element
    assert model_decode_attention_intensity(load_spec("llama-3-8b"), "kivi4") == pytest.approx(8 / 0.625)
    # MLA (absorbed): 2 n_q (2r + d_rope) / ((r + d_rope) p)
    assert model_decode_attention_intensity(load_spec("deepseek-v3")) == pytest.approx(
        2 * 128 * 1088 / (576 * 2)
    )


def test_seed_prefill_intensity():
    # mechanics chapter §3.4 / [C2]: Llama-3-8B, S = 8192, N = 8.03e9, bf16 -> 3973.9 FLOP/byte
    assert round(prefill_intensity(32, 32, 128, 8.03e9, 2, 8192)["intensity_flop_per_byte"], 1) == 3973.9


def test_seed_decode_bound_llama_a100():
    # mechanics chapter §3.4: (14.96 + 1.00) GiB / 2.039 TB/s = 8.4 ms, ~119 tokens/s at batch 1, 8192 tokens
    spec, a100 = load_spec("llama-3-8b"), get_hardware("A100-80GB")
    bound = decode_step_bound(
        spec, 8192, 1, weight_bytes(spec).total_bytes, a100.bandwidth_bytes_s, a100.peak_flops
    )
    assert round(bound.lower_bound_s * 1e3, 1) == 8.4
    assert round(bound.tokens_per_s_upper_bound) == 119
    assert bound.limiter == "memory" and bound.compute_bound_s < bound.memory_bound_s


def test_decode_flops_leave_out_the_embedding_lookup_and_count_the_lm_head():
    # Llama-3-8B (untied, vocab 128,256, hidden 4,096) at 8,192 tokens, by hand:
    #   parameters 8,030,261,248 - input embedding 128,256 x 4,096 = 525,336,576 -> 7,504,924,672 multiplied
    #   (the LM head, also 525,336,576, stays in); 2 x 7,504,924,672 = 15,009,849,344 FLOP
    #   attention: 4 x 32 q heads x 128 x 8,192 tokens x 32 layers = 4,294,967,296 FLOP
    #   total 19,304,816,640 FLOP/token (counting the lookup as a matmul gave 20,355,489,792, 5.4 % more)
    from kvlab.plan.roofline import decode_flops_per_step

    spec = load_spec("llama-3-8b")
    assert spec.num_decode_flop_parameters == 8_030_261_248 - 128_256 * 4_096 == 7_504_924_672
    assert decode_flops_per_step(spec, 8192, 1) == 19_304_816_640
    assert decode_flops_per_step(spec, 8192, 3) == 3 * 19_304_816_640


def test_tied_and_untied_models_do_the_same_decode_flops():
    # a tied LM head is still a vocab x hidden matmul per token; only the lookup is free
    from kvlab.plan.roofline import decode_flops_per_step

    cfg = dict(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=1000
    )
    tied = spec_from_config({**cfg, "tie_word_embeddings": True})
    untied = spec_from_config({**cfg, "tie_word_embeddings": False})
    assert untied.num_parameters - tied.num_parameters == 1000 * 64  # the separate LM head
    assert tied.num_decode_flop_parameters == untied.num_decode_flop_parameters
    assert decode_flops_per_step(tied, 16, 1) == decode_flops_per_step(untied, 16, 1)
    # per layer: q, k, v, o (4 x 64 x 64) + gated MLP (3 x 64 x 128) + 2 norms (2 x 64); final norm 64; LM head
    layer = 4 * 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert tied.num_decode_flop_parameters == 2 * layer + 64 + 1000 * 64


def test_gpt2_learned_positions_are_a_lookup_too():
    cfg = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128)
    spec = spec_from_config(cfg)
    # the position table; the tied LM head is the token table, which stays in
    assert spec.num_parameters - spec.num_decode_flop_parameters == 128 * 64


def test_issue_decode_bound_example():
    # issue 3: weights 1e9 B, 1 TB/s, batch 4, context 1000, 4096 B/token -> 1,016,384,000 B, 1.016 ms
    spec = spec_from_config(
        dict(
            num_hidden_layers=2,
            hidden_size=2880,
            num_attention_heads=64,
            head_dim=64,
            num_key_value_heads=8,
            torch_dtype="bfloat16",
        )
    )
    bound = decode_step_bound(spec, 1000, 4, 10**9, 1e12)
    assert bound.bytes_per_step == 1_016_384_000
    assert bound.lower_bound_s * 1e3 == pytest.approx(1.016384)
    assert bound.tokens_per_s_upper_bound == pytest.approx(4 / 1.016384e-3)
    cmp = bound.compare(2.032768)
    assert cmp["fraction_of_bound"] == pytest.approx(0.5) and cmp["achieved_bandwidth_gb_s"] == pytest.approx(
        500
    )


def test_compute_bound_wins_when_flops_dominate():
    b = DecodeStepBound(
        weight_bytes=10, kv_bytes=0, batch=1, bandwidth_bytes_s=1e12, flops_per_step=1e12, peak_flops=1e12
    )
    assert b.limiter == "compute" and b.lower_bound_s == 1.0
    with pytest.raises(ValueError, match="bandwidth"):
        DecodeStepBound(1, 1, 1, 0.0)


def test_fit_seed_budget():
    # mechanics chapter §3.3 / paged_alloc.py: 80 GiB - 14.96 GiB weights - 4 GiB reserve = 61.04 GiB -> 61 x 1 GiB
    spec = load_spec("llama-3-8b")
    budget = budget_from_gib(80, reserve_gib=4)
    free = budget.kv_budget_bytes(weight_bytes(spec).total_bytes)
    assert round(free / GIB, 2) == 61.04
    assert max_batch(spec, 8192, free) == 61
    ctx = max_context(spec, 61, free)
    assert kv_bytes(spec, ctx, 61) <= free < kv_bytes(spec, ctx + 1, 61)
    assert max_batch(spec, 8192, -5) == 0


def test_fit_from_a_table_row_is_the_memory_the_device_reports():
    # an "80GB" A100 reports 81,920 MiB (nvidia-smi memory.total): 80 GiB, not 80e9 B = 74.5 GiB
    budget = budget_from_hardware(get_hardware("A100-80GB"), reserve_gib=1)
    assert budget.memory_bytes == 81_920 * 2**20 == 80 * GIB and budget.reserve_bytes == GIB
    assert "81,920 MiB" in budget.source


# memory.total as each device reports it (MiB), checked row by row against the sources the table names
DEVICE_MIB = {
    "A100-40GB": 40_960,
    "A100-80GB": 81_920,
    "A100-80GB-PCIe": 81_920,
    "H100-SXM": 81_559,
    "H100-PCIe": 81_559,
    "H200": 143_771,
    "L4": 23_034,
    "L40S": 46_068,
    "A10": 23_028,
    "RTX-4090": 24_564,
    "MI300X": 196_592,  # rocminfo: 201,310,208 KiB
}


def test_every_row_holds_the_memory_its_device_reports_and_names_where_it_was_read():
    assert {hw.name for hw in HARDWARE} == set(DEVICE_MIB)
    for hw in HARDWARE:
        assert hw.memory_mib == DEVICE_MIB[hw.name], hw.name
        assert hw.memory_bytes == hw.memory_mib * 2**20
        assert hw.memory_source and "github.com" in hw.memory_source, hw.name
        # the device reports at most its datasheet's "GB" in GiB and never less than that many decimal GB
        assert hw.datasheet_memory_gb * 1e9 < hw.memory_bytes <= hw.datasheet_memory_gb * GIB, hw.name


def test_hardware_rejects_bad_memory():
    from kvlab.plan.hardware import Hardware, custom_hardware

    for bad in (0, -1, 80.5, True):
        with pytest.raises(ValueError, match="memory_mib"):
            Hardware("x", 1.0, 1.0, bad, "https://example.org")
    assert custom_hardware(1000).memory_bytes is None
    assert custom_hardware(1000, memory_mib=1024).memory_bytes == GIB


def test_max_context_brute_force_and_unbounded():
    spec = spec_from_config(
        dict(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            sliding_window=50,
            layer_types=["sliding_attention", "full_attention"],
            torch_dtype="bfloat16",
        )
    )
    kvd = kv_dtype("kivi4", "bfloat16", group_size=16, residual_length=32)
    budget = 30_000
    ctx = max_context(spec, 2, budget, kvd)
    running_max, brute = 0, None
    for t in range(2000):
        running_max = max(running_max, kv_bytes(spec, t, 2, kvd))
        if running_max > budget:
            brute = t - 1
            break
    assert brute is not None and ctx == brute
    all_sliding = spec_from_config(
        dict(
            num_hidden_layers=1,
            hidden_size=64,
            num_attention_heads=2,
            head_dim=32,
            sliding_window=50,
            model_type="mistral",
        )
    )
    assert max_context(all_sliding, 1, 10**9) is None
    assert max_context(spec, 1, 10) == 0


def test_seed_video_numbers():
    # mechanics chapter §01 / [B4]: 5 s / 10 s / 30 s at 24 fps, 720p, 4x time, 8x8 space -> 52.73 / 105.47 / 316.41 GiB
    spec = load_spec("llama-3-8b")
    got = [round(video_kv(spec, VideoClip(s))["kv_bytes"] / GIB, 2) for s in (5, 10, 30)]
    assert got == [52.73, 105.47, 316.41]
    clip = VideoClip(5)
    assert (clip.frames, clip.latent_frames, clip.tokens_per_frame, clip.tokens) == (120, 30, 14400, 432000)
    # mechanics chapter §6.3
    assert round(video_kv(spec, clip)["kv_bytes_first_latent_frame"] / GIB, 2) == 1.76
    assert VideoClip(5, patch_size=2).tokens_per_frame == 14400 // 4
    assert VideoClip(5, causal_first_frame=True).latent_frames == 1 + 119 // 4
    with pytest.raises(ValueError, match="frames"):
        VideoClip(0.01, fps=24)
    with pytest.raises(ValueError, match="fps"):
        VideoClip(5, fps=0)


def test_probe_small_sizes_return_positive_roofs():
    result = probe(matmul_n=128, stream_elements=100_000, repeat=1)
    assert result.peak_flops > 0 and result.bandwidth_bytes_s > 0 and result.ridge_flop_per_byte > 0
    assert result.to_dict()["dtype"] == "float32"
    with pytest.raises(ValueError, match="matmul_n"):
        probe(matmul_n=0)


def test_kvlab_plan_imports_no_torch():
    code = (
        "import sys, kvlab.plan, kvlab.plan.report, kvlab.plan.probe, kvlab.commands.plan\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_roofline_without_a_compute_peak_says_there_is_no_ridge(capsys):
    """--bandwidth-gb-s alone gives no ridge point: the intensity table printed '--bound' in every row."""
    from kvlab.cli import main

    assert main(["roofline", "--bandwidth-gb-s", "100"]) == 0
    out = capsys.readouterr().out
    assert "--bound" not in out and "no peak FLOP/s: no ridge" in out
    assert main(["roofline", "--bandwidth-gb-s", "100", "--tflops", "50"]) == 0
    assert "memory-bound" in capsys.readouterr().out


def test_roofline_warns_when_the_weights_and_kv_do_not_fit_the_gpu():
    """A new user's `kvlab roofline --gpu H100 --model llama-3-70b --batch 16` printed a decode bound for 171 GiB on an
    80 GB GPU with no warning (`kvlab plan` said it does not fit); with tp 4 it fits and nothing is said."""
    from kvlab.plan.report import roofline_report

    alone = roofline_report(gpu="H100", model="llama-3-70b", batch=16)
    held = alone["weight_bytes"] + alone["kv_bytes_read"]
    assert held > alone["gpu"]["memory_bytes"]
    assert [w for w in alone["warnings"] if "does not fit" in w] == [
        f"the weights and KV need {held / 2**30:,.2f} GiB per GPU and {alone['gpu']['name']} has "
        f"{alone['gpu']['memory_bytes'] / 2**30:,.2f} GiB: this setup does not fit (see `kvlab plan` for what "
        "fits); the decode bound is for memory it does not have"
    ]
    assert alone["decode_step_memory_bound_ms"] > 0  # still computed
    assert not [w for w in roofline_report(gpu="H100", model="llama-3-70b", batch=16, tp=4)["warnings"] if "fit" in w]


BUSY = {"busy": True, "reason": "other processes used 1.90 cores on average", "threads": 2}


def test_a_probe_on_a_busy_machine_says_so(monkeypatch, capsys):
    # 27 GFLOP/s under load and 98 minutes later, with no warning (eval and lab warn: busy_warnings)
    import kvlab.plan.probe as probe_mod
    from kvlab.cli import main
    from kvlab.figures.data import roofline_data

    small = {"matmul_n": 64, "stream_elements": 10_000, "repeat": 1}
    quiet = probe(**small)
    assert quiet.warnings == () or all("busy" in w for w in quiet.warnings)
    monkeypatch.setattr(probe_mod, "contention", lambda *a, **k: BUSY)
    result = probe(**small)
    assert result.warnings[0] == (
        f"the machine was busy while timing ({BUSY['reason']}): the measured GFLOP/s is not trusted; rerun on a "
        "quiet machine"
    )  # no "--threads" advice: the probe has no such flag
    assert "the measured GB/s is not trusted" in result.warnings[1]
    assert result.to_dict()["warnings"] == list(result.warnings)
    monkeypatch.setattr(probe_mod, "probe", lambda **kw: result)
    assert main(["roofline", "--probe"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "warning: the machine was busy while timing" in out and "the measured GFLOP/s is not trusted" in out
    panel = roofline_data(run_probe=True)["panels"][0]
    assert panel["title"] == "this machine (probe, fp32; busy: roofs not trusted)"
    assert panel["probe"]["warnings"] == list(result.warnings)


def test_kvlab_figures_reads_the_probe_warnings_it_prints(tmp_path):
    import json

    from kvlab.commands.figures import _probe_warnings

    numbers = tmp_path / "figures.json"
    panels = [{"title": "this machine", "probe": {"warnings": ["busy"]}}, {"title": "H100", "source": "datasheet"}]
    numbers.write_text(json.dumps({"roofline": {"panels": panels}}))
    assert _probe_warnings(numbers) == ["busy"]
    numbers.write_text(json.dumps({"roofline": {"panels": panels[1:]}}))  # --no-probe
    assert _probe_warnings(numbers) == []


def test_roofline_names_its_decode_bound_in_the_fields_term(capsys):
    """The decode step lower bound is the floor under TPOT, the term a serving benchmark reports decode in; the
    help and docs/plan.md said only 'decode step lower bound'."""
    from pathlib import Path

    from kvlab.cli import main

    with pytest.raises(SystemExit):
        main(["roofline", "--help"])
    assert "floor under TPOT (time per output token)" in " ".join(capsys.readouterr().out.split())
    doc = (Path(__file__).resolve().parents[3] / "docs" / "plan.md").read_text(encoding="utf-8")
    assert "the floor under TPOT (time per\noutput token" in doc
