"""``kvlab plan MODEL --from-log FILE`` on a value it cannot read, or reads only as vLLM does: each is named with its
line, not skipped as a missing line nor read as a wrong number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.cli import main

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm_startup_logs"
LLAVA = str(DATA / "configs" / "llava-v1.6-mistral-7b-hf.json")
LLAVA_LOG = (DATA / "logs" / "log-llava-v1.6-mistral-7b-80gb.log").read_text()


def _run(tmp_path: Path, text: str, *extra: str) -> tuple[int, str]:
    """``kvlab plan llava.json --from-log <text> --json``: (exit status, the log's path)."""
    path = tmp_path / "vllm.log"
    path.write_text(text)
    return main(["plan", LLAVA, "--from-log", str(path), "--json", *extra]), str(path)


def _refused(tmp_path, capsys, old: str, new: str, *extra: str) -> str:
    assert old in LLAVA_LOG
    rc, path = _run(tmp_path, LLAVA_LOG.replace(old, new), *extra)
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    assert captured.err.startswith(f"kvlab plan: error: --from-log {path}: ")
    return captured.err


@pytest.mark.parametrize(
    "old, new, said",
    [
        ("55.15 GiB", "-5 GiB", "line 7, 'Available KV cache memory: -5 GiB' (KV memory per GPU (V1)): not a number "
         "of GiB >= 0: '-5'"),
        ("55.15 GiB", "nan GiB", "'Available KV cache memory: nan GiB' (KV memory per GPU (V1)): not a number of GiB"),
        ("55.15 GiB", "55150 MiB", "'Available KV cache memory: 55150 MiB' (KV memory per GPU (V1)): vLLM prints "
         "this figure in GiB; got 55150 MiB (write it in GiB)"),
        ("--gpu-memory-utilization 0.9", "--gpu-memory-utilization .", "line 3, '--gpu-memory-utilization .' "
         "(utilization): not a fraction of the device's memory in (0, 1]: '.'"),
        ("451,744 tokens", "451.744 tokens", "line 8, 'GPU KV cache size: 451.744 tokens' (tokens of KV per GPU "
         "group): not a whole number >= 0: '451.744'"),
        ("451,744 tokens", "-451744 tokens", "'GPU KV cache size: -451744 tokens'"),
        ("kv_cache_dtype=auto", "kv_cache_dtype=int3", "line 3, 'kv_cache_dtype=int3' (KV dtype): kvlab reads "
         "vLLM's KV cache dtypes auto, fp8, fp8_e4m3, fp8_e5m2, bfloat16, float16; not 'int3'"),
        ("max_num_batched_tokens=16384", "max_num_batched_tokens=16,384", "line 3, 'max_num_batched_tokens=16,384' "
         "(scheduler token budget): not a whole number >= 1: '16,384'"),  # read as 16 (vLLM's int() refuses it)
        ("--max-model-len 4096", "--max-model-len 4096 --block-size 7", "line 3, '--block-size 7' (tokens per "
         "block): block_size must be one of [1, 8, 16, 32, 64, 128] (vLLM's BlockSize), got 7"),  # was sized
        ("kv_cache_dtype=auto", "kv_cache_dtype=auto block_size=256", "line 3, 'block_size=256' (tokens per "
         "block): block_size must be one of [1, 8, 16, 32, 64, 128] (vLLM's BlockSize), got 256"),
    ],
)  # fmt: skip
def test_an_unreadable_value_is_named_with_its_line(old, new, said, tmp_path, capsys):
    """-5 GiB and nan GiB read as no KV memory line at all; 55150 MiB too; '.' gave a bare float() error; 451.744
    tokens read as 451; kv_cache_dtype=int3 read as auto. Each is now refused naming the line and the value."""
    assert said in _refused(tmp_path, capsys, old, new)


def test_negative_cuda_graph_memory_as_vllm_prints_it_is_read(tmp_path, capsys):
    """vLLM's CUDA graph and non-torch memory are differences of two snapshots and may be below 0 (the llm-d
    Llama-3.3-70B log prints -0.42 GiB): read, not refused."""
    rc, _ = _run(tmp_path, LLAVA_LOG.replace("0.67 GiB for CUDAGraph", "-0.42 GiB for CUDAGraph"))
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["log"]["cuda_graph_gib"] == -0.42


@pytest.mark.parametrize(
    "written, tokens",
    [("4k", 4000), ("4K", 4096), ("25.6k", 25600), ("1m", 1_000_000), ("2M", 2 * 2**20), ("8192", 8192)],
)
def test_max_model_len_is_read_as_vllms_argument_parser_reads_it(written, tokens):
    """'--max-model-len 4k' was read as 4 (the pattern stopped at the letter): vLLM's human_readable_int makes
    k/m/g/t decimal and K/M/G/T binary."""
    from kvlab.plan.vllm_log import read_vllm_log

    log = read_vllm_log(f"vllm serve m --max-model-len {written}\nAvailable KV cache memory: 5.00 GiB\n")
    assert log["max_model_len"] == tokens


@pytest.mark.parametrize("written", ["auto", "-1", "None"])
def test_max_model_len_left_to_vllm_is_not_stated(written):
    from kvlab.plan.vllm_log import read_vllm_log

    log = read_vllm_log(f"vllm serve m --max-model-len {written}\nAvailable KV cache memory: 5.00 GiB\n")
    assert "max_model_len" not in log


@pytest.mark.parametrize(
    "written, said",
    [
        ("1.5K", "vLLM takes no decimals with the binary suffix K: '1.5K'"),
        ("4x", "not a whole number >= 1 nor vLLM's 4k (4,000) / 4K (4,096): '4x'"),
        ("0", "not a whole number >= 1: '0'"),
        ("4,096", "not a whole number >= 1 nor vLLM's 4k (4,000) / 4K (4,096): '4,096'"),  # was read as 4
    ],
)
def test_a_max_model_len_vllm_would_refuse_is_named(written, said, tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--max-model-len 4096", f"--max-model-len {written}")
    assert f"line 3, '--max-model-len {written}' (tokens per request): {said}" in err


def test_from_log_sizes_the_concurrency_with_a_human_max_model_len(tmp_path, capsys):
    rc, _ = _run(tmp_path, LLAVA_LOG.replace("--max-model-len 4096", "--max-model-len 4K"))
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert r["log"]["max_model_len"] == 4096 == r["settings"]["max_model_len"]


def test_a_max_model_len_the_concurrency_line_contradicts_is_refused(tmp_path, capsys):
    """'max_model_len': 8192 beside 'Maximum concurrency for 4,096 tokens' was compared as if the concurrency
    were for 8,192 tokens; the two lines are of different starts of vLLM: refused naming both, as two different
    concurrency lengths are."""
    err = _refused(tmp_path, capsys, "--max-model-len 4096", "'max_model_len': 8192")
    assert (
        "max_model_len 8,192 contradicts 'Maximum concurrency for 4,096 tokens per request' (vLLM prints its "
        "max_model_len there): the lines are of different starts of vLLM; keep one start's lines"
    ) in err


@pytest.mark.parametrize(
    "old, new, said",
    [
        ("--max-model-len 4096", "--max-model-len 4096 --max-model-len 8192", "max_model_len 4,096 (line 3, "
         "'--max-model-len 4096') and 8,192 (line 3, '--max-model-len 8192')"),
        ("INFO Model loading", "INFO args: --max-model-len 8192\nINFO Model loading", "max_model_len 4,096 (line 3, "
         "'--max-model-len 4096') and 8,192 (line 4, '--max-model-len 8192')"),
        ("with config: model=", "with config: dtype=torch.float32, model=", "dtype float32 (line 2, "
         "'dtype=torch.float32') and float16 (line 3, '--dtype float16')"),
        ("kv_cache_dtype=auto", "kv_cache_dtype=auto kv_cache_dtype=fp8", "kv_cache_dtype auto (line 3, "
         "'kv_cache_dtype=auto') and fp8 (line 3, 'kv_cache_dtype=fp8')"),
        ("--max-model-len 4096", "block_size=32 --block-size 64 --max-model-len 4096", "block_size 32 (line 3, "
         "'block_size=32') and 64 (line 3, '--block-size 64')"),
    ],
)  # fmt: skip
def test_a_setting_stated_with_two_values_is_refused_naming_both(old, new, said, tmp_path, capsys):
    """Each was read as its first value, without a note (vLLM's argparse keeps the last of a flag given twice);
    now refused naming both values and lines. A setting stated twice alike is read once."""
    text = LLAVA_LOG.replace("--gpu-memory-utilization 0.9", "--gpu-memory-utilization 0.9 --dtype float16")
    assert old in text
    rc, path = _run(tmp_path, text.replace(old, new))
    assert rc == 2
    err = capsys.readouterr().err
    assert f"--from-log {path}: the log states {said}: one start of vLLM runs with one; keep one start's" in err
    alike = "--max-model-len 4K max_model_len=4096 dtype=half {'draft_tensor_parallel_size': 2}"  # not TP's
    rc, _ = _run(tmp_path, text.replace("--max-model-len 4096", alike))
    assert rc == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert settings["max_model_len"] == 4096 and settings["tp"] == 1


def _tokens_line(r: dict) -> dict:
    return next(line for line in r["lines"] if line["line"].startswith("GPU KV cache size"))


def test_kv_auto_takes_the_model_dtype_the_log_states(tmp_path, capsys):
    """The engine config line's dtype=torch.float32 was ignored: KV auto was sized in the config's bfloat16 (451,776
    tokens, as if vLLM stored 2 B per value); now in float32, as vLLM stores it, with a note."""
    engine = "with config: model='llava-hf"
    rc, _ = _run(tmp_path, LLAVA_LOG.replace(engine, "with config: dtype=torch.float32, model='llava-hf"))
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert r["log"]["model_dtype"] == "float32"
    assert _tokens_line(r)["kvlab"] == 225_888  # half of bfloat16's 451,776
    assert "model dtype float32 from the log (the config says bfloat16): KV auto is float32" in r["notes"]
    rc, _ = _run(tmp_path, LLAVA_LOG)  # silent: the config's, said
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert _tokens_line(r)["kvlab"] == 451_776
    assert "model_dtype not in the log: kvlab assumes bfloat16" in r["notes"]


def test_a_kv_dtype_in_an_args_dict_is_read_and_an_unknown_model_dtype_refused(tmp_path, capsys):
    """"'kv_cache_dtype': 'fp8'" (vLLM's non-default args dict) was not read: KV auto, twice the bytes."""
    rc, _ = _run(tmp_path, LLAVA_LOG.replace("kv_cache_dtype=auto", "{'kv_cache_dtype': 'fp8'}"))
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["settings"]["kv_cache_dtype"] == "fp8"
    err = _refused(tmp_path, capsys, "kv_cache_dtype=auto", "dtype=torch.int8")
    assert "line 3, 'dtype=torch.int8' (model dtype (KV auto)): kvlab reads vLLM's model dtypes bfloat16, float16, " in err


def test_block_size_stands_in_where_the_log_states_none(tmp_path, capsys):
    """--from-log refused --block-size even where the log states no block size (noting 'kvlab assumes 16'); it now
    sizes the blocks, noted; a log stating another block size refuses it, as an unknown block size is."""
    rc, _ = _run(tmp_path, LLAVA_LOG, "--block-size", "128")
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert r["settings"]["block_size"] == 128
    assert "block_size not in the log: --block-size 128" in r["notes"]
    assert "block_size not in the log: kvlab assumes 16" not in r["notes"]
    stated = LLAVA_LOG.replace("--max-model-len 4096", "--max-model-len 4096 --block-size 128")
    assert _run(tmp_path, stated, "--block-size", "128")[0] == 0
    capsys.readouterr()
    rc, path = _run(tmp_path, stated, "--block-size", "16")
    assert rc == 2
    err = capsys.readouterr().err
    assert f"--block-size 16 gives the block size where the log does not; {path} states 128 (drop --block-size)" in err
    assert _run(tmp_path, LLAVA_LOG, "--block-size", "0")[0] == 2
    err = capsys.readouterr().err
    assert "--block-size must be one of [1, 8, 16, 32, 64, 128] (vLLM's BlockSize), got 0" in err


@pytest.mark.parametrize(
    "old, new, said",
    [
        ("tensor_parallel_size=1", "tensor_parallel_size=3", ": the log's tensor_parallel_size (3) must divide the "
         "query heads (32)\n"),  # was "--tp (3) must divide ...", a flag --from-log refuses
        ("(0.0/79.19 GiB)", "(0.0/0 GiB)", ": line 5, 'Free memory on device (0.0/0 GiB)' (device memory (torch)): "
         "not a number of GiB > 0: '0'\n"),  # was "memory must be > 0 and weights >= 0 bytes, got 0 and ..."
    ],
)  # fmt: skip
def test_a_logged_setting_the_model_cannot_take_is_named_as_the_log_states_it(old, new, said, tmp_path, capsys):
    assert _refused(tmp_path, capsys, old, new).endswith(said)


def test_assumed_counts_and_groups_read_as_the_other_numbers(tmp_path, capsys):
    """A log without the scheduler budget was noted 'max_num_batched_tokens not in the log: kvlab assumes 8192' beside
    '4,096 tokens' and '28,236 blocks, 1 groups'."""
    rc, _ = _run(tmp_path, LLAVA_LOG.replace(" max_num_batched_tokens=16384", ""))
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert "max_num_batched_tokens not in the log: kvlab assumes 8,192" in r["notes"]
    assert "model_dtype not in the log: kvlab assumes bfloat16" in r["notes"]
    assert _tokens_line(r)["how"].startswith("28,236 blocks, 1 group (")


def test_a_json_file_is_named_as_json_not_a_log(tmp_path, capsys):
    """A case file of quoted logs (JSON) passed as --from-log: the refusal says the file is JSON, not a log's text
    (a new user passed the shared cases .jsonl and read only 'more than one start of vLLM')."""
    from kvlab.cli import main

    json_file, log_file = tmp_path / "cases.jsonl", tmp_path / "plain.log"
    json_file.write_text('{"id": "a", "quote": "INFO no kv lines"}\n', encoding="utf-8")
    log_file.write_text("INFO no kv lines\n", encoding="utf-8")
    assert main(["plan", "llama-3-8b", "--from-log", str(json_file)]) == 2
    err = capsys.readouterr().err
    assert "not a vLLM startup log" in err and f"{json_file} holds JSON, not a vLLM log's text" in err
    assert main(["plan", "llama-3-8b", "--from-log", str(log_file)]) == 2
    assert "holds JSON" not in capsys.readouterr().err
