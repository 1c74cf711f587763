"""``kvlab plan`` / ``kvlab roofline`` / ``kvlab video``: every issue-3 value through ``--json``."""

from __future__ import annotations

import json

import pytest

from kvlab.cli import main

GIB = 1024**3


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def cfg_4096(tmp_path):
    """issue 3: {layers 2, hidden 2880, heads 64, head_dim 64, kv heads 8, bf16}."""
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            dict(
                num_hidden_layers=2,
                hidden_size=2880,
                num_attention_heads=64,
                head_dim=64,
                num_key_value_heads=8,
                torch_dtype="bfloat16",
            )
        )
    )
    return str(path)


def test_plan_llama_seed_values(capsys):
    r = run_json(capsys, "plan", "llama-3-8b", "--context", "8192", "--batch", "32")
    for key in (
        "kv_bytes_per_token",
        "kv_bytes_total",
        "weight_bytes",
        "max_batch",
        "decode_step_lower_bound_ms",
    ):
        assert key in r
    assert r["kv_bytes_per_token"] == 131072
    assert r["kv_bytes_total"] == 32 * GIB
    assert round(r["weight_bytes"] / GIB, 2) == 14.96
    assert round(r["kv_to_weight_ratio"], 2) == 2.14
    r1 = run_json(capsys, "plan", "llama-3-8b", "--context", "8192", "--batch", "1", "--gpu", "a100-80gb")
    assert r1["kv_bytes_total"] == GIB
    assert round(r1["decode_step_lower_bound_ms"], 1) == 8.4
    assert round(r1["tokens_per_s_upper_bound"]) == 119
    mha = run_json(capsys, "plan", "llama-3-8b", "--kv-heads", "32")
    assert mha["kv_bytes_per_token"] == 524288


def test_plan_fit_with_gib_budget_and_reserve(capsys):
    r = run_json(capsys, "plan", "llama-3-8b", "--gpu-mem-gib", "80", "--reserve-gib", "4")
    assert r["max_batch"] == 61  # seed: 61.04 GiB left for KV at 1 GiB per sequence
    assert r["budget"]["memory_bytes"] == 80 * GIB and r["budget"]["reserve_bytes"] == 4 * GIB
    assert r["max_context"] > 8192 and r["max_context_above_model_limit"] is True


def test_plan_config_path_4096_and_kivi_1280(capsys, cfg_4096):
    assert run_json(capsys, "plan", cfg_4096)["kv_bytes_per_token"] == 4096
    r = run_json(capsys, "plan", cfg_4096, "--kv-dtype", "kivi4", "--group-size", "32", "--residual", "128")
    assert r["kv_bytes_per_token"] == 1280
    assert r["kv_dtype"]["bytes_per_element"] == 0.625


def test_plan_mla_and_deepseek(capsys, tmp_path):
    path = tmp_path / "mla.json"
    path.write_text(
        json.dumps(
            dict(
                num_hidden_layers=2,
                hidden_size=1024,
                num_attention_heads=16,
                kv_lora_rank=512,
                qk_rope_head_dim=64,
                torch_dtype="bfloat16",
            )
        )
    )
    assert run_json(capsys, "plan", str(path))["kv_bytes_per_token"] == 2304
    assert run_json(capsys, "plan", "deepseek-v3")["kv_bytes_per_token"] == 70272


def test_plan_sliding_theoretical_and_allocated(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            dict(
                num_hidden_layers=4,
                hidden_size=512,
                num_attention_heads=8,
                num_key_value_heads=8,
                head_dim=64,
                sliding_window=128,
                torch_dtype="bfloat16",
                layer_types=["sliding_attention", "full_attention"] * 2,
            )
        )
    )
    r = run_json(capsys, "plan", str(tmp_path), "--context", "1000")  # a directory works too
    assert r["kv_bytes_total"] == 4_620_288 and r["kv_bytes_total_allocated"] == 8_192_000
    r = run_json(capsys, "plan", str(path), "--context", "100")
    assert r["kv_bytes_total"] == r["kv_bytes_total_allocated"] == 819_200


def test_plan_kv_shared(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            dict(
                num_hidden_layers=6,
                hidden_size=512,
                num_attention_heads=4,
                num_key_value_heads=4,
                head_dim=128,
                num_kv_shared_layers=2,
                torch_dtype="bfloat16",
            )
        )
    )
    assert run_json(capsys, "plan", str(path))["kv_bytes_per_token"] == 8192


def test_roofline_seed_values(capsys):
    r = run_json(capsys, "roofline", "--gpu", "A100-80GB")
    assert round(r["ridge_flop_per_byte"]) == 153
    assert round(r["prefill"]["intensity_flop_per_byte"], 1) == 3973.9
    assert round(r["decode_step_lower_bound_ms"], 1) == 8.4
    assert round(r["tokens_per_s_upper_bound"]) == 119
    assert [row["intensity_flop_per_byte"] for row in r["decode_intensity_table"]][:3] == [1.0, 2.0, 4.0]
    assert r["probe"] is None


def test_roofline_issue_example_through_cli(capsys, cfg_4096):
    r = run_json(
        capsys,
        "roofline",
        "--model",
        cfg_4096,
        "--weight-bytes",
        "1e9",
        "--bandwidth-gb-s",
        "1000",
        "--batch",
        "4",
        "--context",
        "1000",
        "--measured-step-ms",
        "2.032768",
    )
    assert r["bytes_per_step"] == 1_016_384_000
    assert r["decode_step_lower_bound_ms"] == pytest.approx(1.016384)
    assert r["measured"]["fraction_of_bound"] == pytest.approx(0.5)
    p = run_json(
        capsys,
        "plan",
        cfg_4096,
        "--weight-bytes",
        "1e9",
        "--bandwidth-gb-s",
        "1000",
        "--batch",
        "4",
        "--context",
        "1000",
    )
    assert p["decode_step_lower_bound_ms"] == pytest.approx(1.016384) and p["max_batch"] is None


def test_video_seed_values(capsys):
    r = run_json(capsys, "video", "--seconds", "5", "10", "30")
    assert [round(c["kv_bytes"] / GIB, 2) for c in r["clips"]] == [52.73, 105.47, 316.41]
    assert r["clips"][0]["tokens"] == 432000


def test_human_output_states_units(capsys):
    assert main(["plan", "llama-3-8b"]) == 0
    out = capsys.readouterr().out
    assert "GiB" in out and "GB" in out and "131,072" in out
    assert main(["roofline"]) == 0
    assert "153.0" in capsys.readouterr().out
    assert main(["video"]) == 0
    assert "52.73 GiB" in capsys.readouterr().out
    assert main(["plan", "--list-presets"]) == 0
    assert "gpt-oss-20b" in capsys.readouterr().out
    assert main(["roofline", "--list-gpus"]) == 0
    assert "2.039" in capsys.readouterr().out


def _row(out: str, label: str) -> str:
    """The one table line whose quantity cell is exactly ``label``."""
    lines = [line for line in out.splitlines() if line.startswith(f"│ {label} ") and "│" in line[2:]]
    assert len(lines) == 1 and lines[0].split("│")[1].strip() == label, (label, out)
    return lines[0]


@pytest.mark.parametrize("argv", [["deepseek-v3", "--tp", "8"], ["llama-3-8b", "--tp", "4"]])
def test_human_output_labels_per_gpu_and_all_gpu_kv(capsys, monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "200")  # one line per row
    r = run_json(capsys, "plan", *argv)
    tp = r["tp"]
    assert main(["plan", *argv]) == 0
    out = capsys.readouterr().out
    assert "(all GPUs)" not in out
    assert f"{r['kv_bytes_per_token_per_gpu']:,} B" in _row(out, "KV bytes per token, per GPU")
    row = _row(out, f"KV bytes per token, all {tp} GPUs")
    assert f"{r['kv_bytes_per_token']:,} B" in row and f"= {tp} x per GPU" in row
    assert r["kv_bytes_per_token"] == tp * r["kv_bytes_per_token_per_gpu"]
    for label, key in (
        ("KV total, theoretical, per GPU", "kv_bytes_total_per_gpu"),
        (f"KV total, theoretical, all {tp} GPUs", "kv_bytes_total"),
        ("KV total, engine-allocated, per GPU", "kv_bytes_allocated_per_gpu"),
        (f"KV total, engine-allocated, all {tp} GPUs", "kv_bytes_total_allocated"),
    ):
        assert f"{r[key] / 1e9:,.2f} GB" in _row(out, label), label


def test_human_output_with_one_gpu_has_one_kv_row_each(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["plan", "llama-3-8b"]) == 0
    out = capsys.readouterr().out
    assert "131,072 B" in _row(out, "KV bytes per token")
    assert "per GPU" not in _row(out, "KV total, theoretical") and "all 1 GPUs" not in out


def test_replicated_kv_under_tp_is_explained_in_a_note():
    from kvlab.plan.report import plan_report

    mla = plan_report("deepseek-v3", tp=8)
    assert any("whole MLA latent" in n and "8 x the model's KV" in n for n in mla["notes"])
    # llama-3-8b has 8 KV heads: tp 16 stores each twice, tp 4 splits them (no replica, no note)
    copies = plan_report("llama-3-8b", tp=16)
    assert any("each KV head is stored on 2 GPUs" in n for n in copies["notes"])
    assert copies["kv_bytes_per_token"] == 2 * plan_report("llama-3-8b")["kv_bytes_per_token"]
    assert not any("stored on" in n or "MLA" in n for n in plan_report("llama-3-8b", tp=4)["notes"])


@pytest.mark.parametrize(
    "argv, match",
    [
        (["plan", "no-such-model"], "preset"),
        (["plan", "llama-3-8b", "--gpu", "tpu"], "unknown GPU"),
        (["plan", "llama-3-8b", "--tp", "3"], "tp"),
        (["plan"], "MODEL"),
        (["roofline", "--tflops", "100"], "bandwidth"),
    ],
)
def test_cli_errors_are_messages_not_tracebacks(capsys, argv, match):
    assert main(argv) == 2
    assert match in capsys.readouterr().err


def test_malformed_config_through_cli_names_the_field(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=3))
    )
    assert main(["plan", str(path)]) == 2
    assert "num_key_value_heads" in capsys.readouterr().err
