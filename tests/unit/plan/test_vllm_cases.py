"""kvlab's model of vLLM's KV cache against real vLLM startup logs (tests/data/vllm_startup_logs: cases.jsonl with
each log's source, the configs the cases are planned from, and logs/ rebuilt from the cases' figures).

Per case: the tokens vLLM printed, from the log's own "Available KV cache memory", within 1 % (the log rounds the
memory to 0.01 GiB); the predicted "Available KV cache memory" within 10 % where the log gives the device memory
(or its GPU is in the hardware table), the utilization and the weights; and ``kvlab plan --from-log`` on its log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.plan import presets
from kvlab.plan.hardware import get_hardware
from kvlab.plan.spec import spec_from_config
from kvlab.plan.vllm_kv import vllm_kv_cache
from kvlab.plan.vllm_log import explain_vllm_log, read_vllm_log
from kvlab.plan.vllm_memory import GIB, available_kv_memory

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm_startup_logs"
CASES = {c["id"]: c for c in map(json.loads, (DATA / "cases.jsonl").read_text().splitlines())}
MODELS = json.loads((DATA / "models.json").read_text())


def _config(case_id: str) -> dict:
    ref = MODELS[case_id]
    if ref.startswith("preset:"):
        return dict(presets.find(ref.removeprefix("preset:")).config)
    return json.loads((DATA / ref).read_text())


def _total_gib(case: dict) -> float | None:
    """The device memory the log prints, else its GPU's row in the hardware table (the L4: 23,034 MiB)."""
    if case["gpu_total_memory_gib_printed"] is not None:
        return case["gpu_total_memory_gib_printed"]
    if case["gpu"] and "L4" in case["gpu"]:
        return get_hardware("L4").memory_gib
    return None


def _explain(case_id: str) -> dict:
    case = CASES[case_id]
    config = _config(case_id)
    log = read_vllm_log((DATA / "logs" / f"{case_id}.log").read_text())
    return explain_vllm_log(log, spec_from_config(config), config, total_gib=_total_gib(case))


def _line(r: dict, start: str) -> dict:
    return next(line for line in r["lines"] if line["line"].startswith(start))


def test_every_case_has_a_config_and_a_log():
    assert len(CASES) == 8
    assert set(MODELS) - {"_note"} == set(CASES)
    assert all((DATA / "logs" / f"{i}.log").is_file() for i in CASES)


WITH_TOKENS = [
    i for i, c in CASES.items() if c["measured"]["gpu_kv_cache_tokens"] or c["measured"]["num_gpu_blocks"]
]


@pytest.mark.parametrize("case_id", WITH_TOKENS)
def test_tokens_from_the_logs_kv_memory_within_1_percent(case_id):
    line = _line(_explain(case_id), "GPU KV cache size")
    assert line["log"] is not None
    assert abs(line["error_pct"]) < 1.0, line


WITH_MEMORY = [
    i
    for i, c in CASES.items()
    if _total_gib(c) and c["gpu_memory_utilization"] and c["measured"]["model_weights_gib"] is not None
]


@pytest.mark.parametrize("case_id", WITH_MEMORY)
def test_available_kv_memory_within_10_percent(case_id):
    line = _line(_explain(case_id), "Available KV cache memory")
    assert line["log"] == CASES[case_id]["measured"]["available_kv_cache_gib"]
    assert abs(line["error_pct"]) < 10.0, line


def test_the_cases_cover_what_the_acceptance_names():
    assert len(WITH_TOKENS) == 5 and len(WITH_MEMORY) == 7  # Kimi-K2 states no utilization or weights


def test_a_model_that_does_not_fit_is_predicted_with_its_shortfall():
    """Llama-3-70B in bf16 (~131 GiB of weights) on one 79.18 GiB H100 at 0.9: no KV memory at all."""
    config = dict(presets.find("llama-3-70b").config)
    spec = spec_from_config(config)
    weights = 2 * 70_553_706_496  # bf16 bytes of Llama-3-70B's parameters
    terms = available_kv_memory(
        config,
        spec,
        total_bytes=int(79.18 * GIB),
        total_source="given",
        gpu_memory_utilization=0.9,
        weight_bytes=weights,
        weight_source="given",
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
    )
    available = terms[-1]
    assert available.name == "available" and available.bytes < 0
    expected = int(0.9 * 79.18 * GIB) - weights - terms[3].bytes - terms[4].bytes
    assert available.bytes == expected
    log = {
        "available_kv_cache_gib": 1.0,
        "total_gib": 79.18,
        "gpu_memory_utilization": 0.9,
        "weights_gib": weights / GIB,
    }
    notes = explain_vllm_log(log, spec, config)["notes"]
    assert any(n.startswith(f"does not fit: {-expected / GIB:.2f} GiB short") for n in notes)


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_from_log_prints_each_line_beside_kvlabs_figure(case_id, capsys):
    ref = MODELS[case_id]
    model = ref.removeprefix("preset:") if ref.startswith("preset:") else str(DATA / ref)
    argv = ["plan", model, "--from-log", str(DATA / "logs" / f"{case_id}.log"), "--json"]
    total = _total_gib(CASES[case_id])
    if total and CASES[case_id]["gpu_total_memory_gib_printed"] is None:
        argv += ["--gpu-mem-gib", str(total)]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    names = [line["line"] for line in r["lines"]]
    assert any(n.startswith("GPU KV cache size") for n in names)
    if case_id in WITH_MEMORY:
        assert [t["name"] for t in r["terms"]] == [
            "total",
            "budget",
            "weights",
            "activation_peak",
            "non_torch",
            "available",
        ]
        assert all(t["assumes"] for t in r["terms"])
    assert main([a for a in argv if a != "--json"]) == 0
    text = capsys.readouterr().out
    assert "Available KV cache memory" in text or case_id not in WITH_MEMORY
    assert "GPU KV cache size" in text and "kvlab" in text


def test_from_log_refuses_a_file_that_is_not_a_vllm_log(tmp_path, capsys):
    f = tmp_path / "x.log"
    f.write_text("hello\n")
    assert main(["plan", "llama-3-8b", "--from-log", str(f)]) == 2
    assert "not a vLLM startup log" in capsys.readouterr().err


def test_gemma4_groups_as_vllms_hybrid_allocator():
    """15 KV layers (12 sliding of 1 x 256, 3 full of 1 x 512): sliding blocks doubled to 32 tokens to match the
    full layers' page, groups of 3 layers: 4 sliding groups + 1 full."""
    spec = spec_from_config(_config("log-gemma-4-e2b-l4"))
    kv = vllm_kv_cache(spec, 10 * GIB, max_model_len=8192, max_num_batched_tokens=2048)
    assert kv.group_size == 3 and len(kv.groups) == 5
    assert (
        sorted((s.kind, s.block_size, n) for s, n in kv.groups)
        == [("full", 16, 3)] + [("sliding", 32, 3)] * 4
    )
    assert kv.page_size_bytes == 2 * 16 * 512 * 2
    assert kv.num_blocks == 10 * GIB // kv.page_size_bytes // 3
    assert kv.kv_cache_tokens == kv.num_blocks // 5 * 16  # the 'blocks' report


def test_tp_dcp_fp8_and_mla():
    llama = spec_from_config(dict(presets.find("llama-3-8b").config))
    one = vllm_kv_cache(llama, 8 * GIB, max_model_len=8192)
    assert one.page_size_bytes == 2 * 16 * 8 * 128 * 2
    assert vllm_kv_cache(llama, 8 * GIB, max_model_len=8192, tp=2).num_blocks == 2 * one.num_blocks
    replicated = vllm_kv_cache(llama, 8 * GIB, max_model_len=8192, tp=16)  # 8 KV heads, 16 ranks: 1 head each
    assert replicated.page_size_bytes == 2 * 16 * 1 * 128 * 2
    assert (
        vllm_kv_cache(llama, 8 * GIB, max_model_len=8192, kv_cache_dtype="fp8").num_blocks
        == 2 * one.num_blocks
    )
    assert vllm_kv_cache(llama, 8 * GIB, max_model_len=8192, dcp=4).kv_cache_tokens == 4 * one.kv_cache_tokens
    kimi = spec_from_config(_config("recipes-kimi-k2-thinking-tp8"))
    mla = vllm_kv_cache(kimi, 8 * GIB, max_model_len=8192, tp=8)
    assert mla.page_size_bytes == 16 * 576 * 2  # one latent, replicated on every rank
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        vllm_kv_cache(llama, GIB, max_model_len=8192, kv_cache_dtype="int8")


def test_text_config_filled_from_its_architecture_defaults():
    spec = spec_from_config(_config("log-llava-v1.6-mistral-7b-80gb"))
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads) == (
        32,
        4096,
        32,
        8,
    )
    note = next(n for n in spec.notes if "config class defaults" in n)
    assert "num_hidden_layers 32" in note and "intermediate_size" not in note  # the config states that one


def test_emit_vllm_predicts_the_log_term_by_term(capsys):
    argv = [
        "plan",
        "llama-3-8b",
        "--batch",
        "32",
        "--gpu-mem-gib",
        "80",
        "--reserve-gib",
        "4",
        "--emit",
        "vllm",
    ]
    assert main([*argv, "--json"]) == 0
    v = json.loads(capsys.readouterr().out)["vllm"]
    p = v["predicted_log"]
    assert [t["name"] for t in p["terms"]] == [
        "total",
        "budget",
        "weights",
        "activation_peak",
        "non_torch",
        "available",
    ]
    assert p["fits"] and p["terms"][-1]["bytes"] == v["kv_memory_bytes_per_gpu"] - sum(
        t["bytes"] for t in p["terms"][3:5]
    )
    assert 0 < p["kv_cache_tokens"] < v["kv_cache_tokens"]  # the activations come out of the upper bound
    assert main(argv) == 0
    assert f"GPU KV cache size: {p['kv_cache_tokens']:,} tokens" in capsys.readouterr().out


def test_the_quote_of_a_v0_log_reads_as_the_log_it_quotes():
    """vllm-i10517-a's quote (its source's words, ' / ' between lines) writes "GPU blocks: 1952" without V0's "#":
    the block count is read all the same, and the max_model_len its concurrency line states is not reported as an
    assumption."""
    case = CASES["vllm-i10517-a"]
    quote = case["source"]["quote"].replace(" / ", "\n")
    assert "GPU blocks: 1952" in quote and "# GPU blocks" not in quote
    log = read_vllm_log(quote)
    assert log["num_gpu_blocks"] == 1952 == read_vllm_log((DATA / "logs" / "vllm-i10517-a.log").read_text())[
        "num_gpu_blocks"
    ]
    r = explain_vllm_log(log, spec_from_config(_config("vllm-i10517-a")), _config("vllm-i10517-a"))
    assert _line(r, "GPU KV cache size")["log"] == 1952 * 16
    assert not any(n.startswith("max_model_len") for n in r["notes"])
    assert "block_size not in the log: kvlab assumes 16" in r["notes"]
