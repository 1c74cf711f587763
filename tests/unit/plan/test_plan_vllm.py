"""``kvlab plan ... --emit vllm``: a runnable ``vllm serve`` command whose numbers are the plan's, and the KV cache
size vLLM would report for that memory."""

from __future__ import annotations

import json
import math
import os
import shlex
import stat
import subprocess
import sys

import pytest

from kvlab.cli import main
from kvlab.plan import load_spec
from kvlab.plan.kv_formats import kv_dtype
from kvlab.plan.vllm import vllm_model_argument, vllm_serve_plan

GIB = 1024**3


def plan_json(capsys, *argv):
    assert main(["plan", *argv, "--emit", "vllm", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    r["batch_given"] = "--batch" in argv  # for check_against_plan's --max-num-seqs
    return r


def flags(command: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a ``vllm serve MODEL ...`` argv."""
    assert command[:2] == ["vllm", "serve"]
    rest = [x for x in command[3:] if x != "--calculate-kv-scales"]  # the one flag without a value
    assert len(rest) % 2 == 0 and all(k.startswith("--") for k in rest[::2])
    return dict(zip(rest[::2], rest[1::2], strict=True))


def check_against_plan(r: dict) -> dict:
    """Every number of the vllm key, recomputed from the plan's own keys."""
    v = r["vllm"]
    f = flags(v["command"])
    assert int(f["--max-model-len"]) == r["context"] == v["max_model_len"]
    # --max-num-seqs: the --batch given, else the requests of --max-model-len the KV memory holds, at most vLLM's
    # default for the device (1,024 from 70 GiB, else 256)
    default = 1024 if r["budget"]["memory_bytes"] >= 70 * GIB else 256
    seqs = r["batch"] if r.get("batch_given", True) else min(math.floor(v["max_concurrency"]), default)
    assert int(f["--max-num-seqs"]) == seqs == v["max_num_seqs"]
    assert int(f["--tensor-parallel-size"]) == r["tp"] == v["tensor_parallel_size"]
    assert int(f["--block-size"]) == v["block_size"]
    util = float(f["--gpu-memory-utilization"])
    memory, reserve = r["budget"]["memory_bytes"], r["budget"]["reserve_bytes"]
    assert util == v["gpu_memory_utilization"] and util <= (memory - reserve) / memory < util + 1e-4
    assert v["weight_bytes_per_gpu"] == r["weight_bytes_per_gpu"]
    assert v["kv_memory_bytes_per_gpu"] == int(util * memory) - r["weight_bytes_per_gpu"]
    assert (
        v["kv_memory_bytes_per_gpu"] <= r["kv_budget_bytes_per_gpu"]
    )  # never more than the plan's KV memory
    # a block of every layer holds block_size tokens at the plan's bytes per token
    assert v["page_size_bytes"] * v["num_layers"] == v["block_size"] * r["kv_bytes_per_token_per_gpu"]
    blocks = v["kv_memory_bytes_per_gpu"] // v["page_size_bytes"] // v["num_layers"]
    assert v["num_gpu_blocks"] == blocks and v["kv_cache_tokens"] == blocks * v["block_size"]
    assert v["max_concurrency"] == blocks / math.ceil(r["context"] / v["block_size"])
    return f


def test_llama_3_8b_on_the_chapters_80_gib(capsys):
    r = plan_json(capsys, "llama-3-8b", "--batch", "32", "--gpu-mem-gib", "80", "--reserve-gib", "4")
    f = check_against_plan(r)
    assert r["vllm"]["command"][2] == "meta-llama/Meta-Llama-3-8B"  # the preset's hub id
    assert f == {
        "--dtype": "bfloat16",
        "--max-model-len": "8192",
        "--kv-cache-dtype": "auto",
        "--block-size": "16",
        "--gpu-memory-utilization": "0.95",  # (80 - 4) / 80 GiB
        "--max-num-seqs": "32",
        "--tensor-parallel-size": "1",
    }
    # by hand: 0.95 x 85,899,345,920 B (80 GiB) = 81,604,378,624 B, less 16,060,522,496 B of weights
    # (8,030,261,248 x 2 B) = 65,543,856,128 B (61.04 GiB, the plan's KV memory); a block is 16 tokens x 2 x 8 KV
    # heads x 128 x 2 B = 65,536 B per layer, x 32 layers = 2,097,152 B; 65,543,856,128 // 2,097,152 = 31,253
    # blocks = 500,048 tokens; 31,253 / (8,192 / 16) = 61.04 sequences of 8,192 tokens
    v = r["vllm"]
    assert v["kv_memory_bytes_per_gpu"] == 65_543_856_128 == r["kv_budget_bytes_per_gpu"]
    assert (v["page_size_bytes"], v["num_gpu_blocks"], v["kv_cache_tokens"]) == (65_536, 31_253, 500_048)
    assert math.floor(v["max_concurrency"]) == r["max_batch"] == 61
    # the plan's own token capacity, rounded down to whole blocks
    assert v["kv_cache_tokens"] == r["kv_budget_bytes_per_gpu"] // r["kv_bytes_per_token_per_gpu"] // 16 * 16


def test_tensor_parallel_fp8_and_block_size(capsys):
    r = plan_json(
        capsys,
        "llama-3-8b",
        "--tp",
        "2",
        "--kv-dtype",
        "fp8",
        "--block-size",
        "32",
        "--gpu",
        "h100-sxm",
        "--context",
        "1000",  # not a multiple of the block: a request holds ceil(1000 / 32) = 32 blocks
        "--reserve-gib",
        "0",
    )
    f = check_against_plan(r)
    assert (f["--tensor-parallel-size"], f["--kv-cache-dtype"], f["--block-size"]) == ("2", "fp8", "32")
    assert r["vllm"]["page_size_bytes"] == 32 * 2 * 4 * 128 * 1  # 4 KV heads per rank, 1 B per element
    assert f["--gpu-memory-utilization"] == "1"  # no reserve: the plan gives vLLM the whole device
    assert r["vllm"]["max_concurrency"] == r["vllm"]["num_gpu_blocks"] / 32


def test_mla_latent_pages(capsys):
    r = plan_json(
        capsys, "deepseek-v3", "--tp", "8", "--gpu", "h200", "--weight-dtype", "fp8", "--reserve-gib", "8"
    )
    check_against_plan(r)
    assert r["vllm"]["page_size_bytes"] == 16 * (512 + 64) * 2  # one latent per token, replicated per rank
    assert r["vllm"]["num_layers"] == 61


def test_output_is_a_runnable_shell_command(capsys, tmp_path):
    """The printed text runs as it is: a fake `vllm` on PATH receives exactly the planned argv."""
    model_dir = tmp_path / "my model's dir"  # a space and a quote: the path must be shell-quoted
    model_dir.mkdir()
    (model_dir / "config.json").write_text(
        json.dumps(
            dict(
                num_hidden_layers=2,
                hidden_size=256,
                num_attention_heads=8,
                num_key_value_heads=2,
                intermediate_size=512,
                vocab_size=1000,
                torch_dtype="float16",
            )
        )
    )
    argv = [
        "plan",
        str(model_dir / "config.json"),
        "--gpu-mem-gib",
        "1",
        "--reserve-gib",
        "0.25",
        "--batch",
        "4",
    ]
    assert main([*argv, "--emit", "vllm"]) == 0
    script = capsys.readouterr().out
    lines = script.splitlines()
    assert lines[0].startswith("vllm serve ") and all(line.startswith("# ") for line in lines[1:])
    assert main([*argv, "--emit", "vllm", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["vllm"]
    assert shlex.split(lines[0]) == planned["command"] and planned["command"][2] == str(model_dir)
    assert flags(planned["command"])["--dtype"] == "float16"
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    ran = subprocess.run(["sh"], input=script, capture_output=True, text=True, env=env, check=True)
    assert json.loads(ran.stdout) == planned["command"][1:]


def test_human_output_states_the_kv_cache_tokens(capsys):
    assert (
        main(
            [
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
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "500,048 tokens" in text and "61.04x" in text and "--max-num-seqs 32" in text


@pytest.mark.parametrize(
    "argv, fragment",
    [
        # the registry's spelling, however it was typed
        (["llama-3-8b", "--kv-dtype", "kivi4"], "vLLM has no KIVI cache: --kv-dtype kivi-4 has no --kv-cache-dtype"),
        (["llama-3-8b", "--kv-dtype", "kivi-2:group_size=64"], "--kv-dtype kivi-2 has no --kv-cache-dtype"),
        (["llama-3-8b", "--kv-dtype", "kivi-k8v4"], "--kv-dtype kivi-k8v4 has no --kv-cache-dtype"),
        (["llama-3-8b", "--kv-dtype", "fp16"], "--kv-dtype fp16"),  # bf16 model: vLLM's auto is bf16
        (["gpt-oss-20b"], "12 sliding"),
        # vLLM reads the config's 8 KV heads: the token count of 32 was printed beside a command that builds 8
        (["llama-3-8b", "--kv-heads", "32"], "--kv-heads 32 is a what-if vLLM would not see"),
        (["llama-3-8b", "--kv-heads", "32", "--kv-dtype", "mixed-demo"], "--kv-heads 32 is a what-if"),
        (["llama-3-8b", "--block-size", "24"], "--block-size"),
        (["llama-3-8b", "--block-size", "0"], "--block-size"),
        (["llama-3-8b", "--bandwidth-gb-s", "1000"], "--gpu-mem-gib"),  # a custom device has no memory
        (["llama-3-8b", "--gpu-mem-gib", "12"], "nothing is left for the KV cache"),
        # the utilization comes from --reserve-gib: the flag the user gave is named, not one they never typed
        (["llama-3-8b", "--reserve-gib", "70"], "--reserve-gib 70 leaves --gpu-memory-utilization 0.125 for vLLM, "
         "10,737,418,240 of 85,899,345,920 B: the weights (16,060,522,496 B per GPU) do not fit"),
        (["deepseek-v3", "--tp", "8", "--gpu", "h200", "--weight-dtype", "fp8", "--kv-dtype", "fp8"], "MLA"),
        # vLLM has no rotation: the same bytes, but not what kvlab's -hadamard cache stores
        (["llama-3-8b", "--kv-dtype", "fp8-e4m3-hadamard"], "--kv-dtype fp8-e4m3 has the same bytes"),
    ],
)
def test_plans_vllm_would_size_differently_are_refused(capsys, argv, fragment):
    assert main(["plan", *argv, "--emit", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and fragment in err, err


def test_library_refusals_and_model_argument(tmp_path):
    spec = load_spec("llama-3-8b")
    common = dict(model="m", context=8192, batch=1, tp=1, weight_bytes_per_gpu=0, memory_bytes=80 * GIB)
    with pytest.raises(ValueError, match="reserve"):
        vllm_serve_plan(spec, kv_dtype("auto"), reserve_bytes=80 * GIB, **common)
    with pytest.raises(ValueError, match="batch"):
        vllm_serve_plan(spec, kv_dtype("auto"), reserve_bytes=0, **{**common, "batch": 0})
    assert vllm_model_argument("llama-3-8b") == "meta-llama/Meta-Llama-3-8B"
    assert vllm_model_argument("some-org/some-model") == "some-org/some-model"
    (tmp_path / "config.json").write_text("{}")
    assert vllm_model_argument(tmp_path / "config.json") == str(tmp_path)
    assert vllm_model_argument(str(tmp_path)) == str(tmp_path)


@pytest.mark.parametrize(
    "kv, cache_dtype, calculate, note",
    [
        ("fp8_e4m3", "fp8_e4m3", False, "per-head scales"),
        ("fp8-e5m2-tensor", "fp8_e5m2", True, "--calculate-kv-scales"),
        ("fp8-e4m3-unscaled", "fp8_e4m3", False, "scales are 1.0"),
    ],
)
def test_kvlab_fp8_caches_map_to_vllms_fp8_flags(capsys, kv, cache_dtype, calculate, note):
    """kvlab's FP8Cache names (and vLLM's own spellings of them) become --kv-cache-dtype fp8_e4m3 / fp8_e5m2 at
    1 B per element; per-tensor calibration adds --calculate-kv-scales; a note says how the scales differ."""
    r = plan_json(
        capsys, "llama-3-8b", "--kv-dtype", kv, "--gpu", "h200", "--context", "8192", "--batch", "16"
    )
    v = r["vllm"]
    assert ("--calculate-kv-scales" in v["command"]) is calculate
    f = check_against_plan(r)
    assert f["--kv-cache-dtype"] == v["kv_cache_dtype"] == cache_dtype
    assert v["page_size_bytes"] == 16 * 2 * 8 * 128 * 1  # 8 KV heads x 128, K and V, 1 B per element
    assert any(note in n for n in v["notes"])


def test_the_emitted_headline_calls_its_token_count_an_upper_bound(capsys):
    """The headline said 'KV cache vLLM would report per GPU: 500,048 tokens' and a few lines later 'its log would
    say: ... GPU KV cache size: 491,312 tokens': two counts for one claim. The first is now the upper bound."""
    from kvlab.cli import main

    assert main(["plan", "llama-3-8b", "--batch", "32", "--reserve-gib", "4", "--emit", "vllm"]) == 0
    out = capsys.readouterr().out
    assert "# KV cache per GPU, at most (before vLLM's activation deductions): 500,048 tokens" in out
    assert "#   GPU KV cache size: 491,312 tokens" in out and "would report per GPU" not in out
