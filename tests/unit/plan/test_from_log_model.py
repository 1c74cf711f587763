"""``kvlab plan MODEL --from-log FILE``: a log of another model is refused, and the device memory and weights a log
lacks come from --gpu and --weight-bytes / --weight-dtype / --weights-index, as --tp and --context stand in.

A user ran ``kvlab plan gemma-3-1b --from-log <llava log>``: exit 0, errors of +357 %, though the log names
llava-hf/llava-v1.6-mistral-7b-hf; on the AWQ log cut before its weights line, --weight-bytes was refused while
the output said "no memory prediction: the log does not state the weights"; --gpu L4 was refused though
docs/plan.md said the device memory comes from the hardware table where the log lacks it.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.plan import load_spec
from kvlab.plan.hardware import get_hardware
from kvlab.plan.model_names import base_name, model_names, same_model
from kvlab.plan.vllm_log import LOG_LINES, quoted_statement, read_vllm_log
from kvlab.plan.vllm_memory import GIB
from kvlab.plan.weights import weight_bytes

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm_startup_logs"
LOGS = DATA / "logs"
LLAVA_LOG = LOGS / "log-llava-v1.6-mistral-7b-80gb.log"
AWQ_LOG = LOGS / "log-qwen2.5-7b-awq-rtx4080.log"
GEMMA4 = [str(DATA / "configs" / "gemma-4-e2b.json"), "--from-log", str(LOGS / "log-gemma-4-e2b-l4.log")]


def run(capsys, *argv: str) -> tuple[int, dict | None, str]:
    code = main(["plan", *argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else None, captured.err


def _without_weights(tmp_path: Path) -> str:
    """The AWQ log cut of its weights lines ('Model loading took', 'GiB for weight')."""
    lines = [x for x in AWQ_LOG.read_text().splitlines() if "Model loading" not in x and "for weight" not in x]
    path = tmp_path / "awq-no-weights.log"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _term(r: dict, name: str) -> dict:
    return next(t for t in r["terms"] if t["name"] == name)


def test_a_log_of_another_model_is_refused_naming_its_line_and_both(capsys):
    code, _, err = run(capsys, "gemma-3-1b", "--from-log", str(LLAVA_LOG))
    assert code == 2
    assert "llava-hf/llava-v1.6-mistral-7b-hf" in err and "gemma-3-1b" in err and "line 2" in err, err
    assert "--force" in err  # the way out
    assert capsys.readouterr().out == ""


def test_force_explains_a_log_of_another_model(capsys):
    code, r, _ = run(capsys, "gemma-3-1b", "--from-log", str(LLAVA_LOG), "--force")
    assert code == 0 and r["lines"]


def test_force_without_from_log_is_refused(capsys):
    code, _, err = run(capsys, "llama-3-8b", "--force")
    assert code == 2 and "--force" in err and "--from-log" in err


@pytest.mark.parametrize(
    "log_model, model, same",
    [
        ("llava-hf/llava-v1.6-mistral-7b-hf", "gemma-3-1b", False),
        ("Qwen2.5-7B-Instruct-AWQ", "qwen2.5-7b", True),  # a quantized, instruct copy of the preset
        ("Qwen/Qwen2.5-7B-Instruct-AWQ", "Qwen/Qwen2.5-7B", True),
        ("google/gemma-4-E2B", str(DATA / "configs" / "gemma-4-e2b.json"), True),  # a config file's stem
        ("openai-community/gpt2", "gpt2", True),  # the preset's hub id
        ("gpt2-xl", "gpt2", False),  # another size is another model
        ("meta-llama/Llama-3.1-8B-Instruct", "gemma-3-1b", False),
        ("~/models/SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m", True),
    ],
)
def test_same_model_compares_names_loosely(log_model, model, same):
    assert same_model(log_model, model_names(model)) is same


def test_a_config_json_goes_by_its_folder_and_its_name_or_path(tmp_path):
    folder = tmp_path / "Mistral-7B-v0.1"
    folder.mkdir()
    assert "mistral-7b-v0.1" in model_names(folder / "config.json")
    assert base_name("mistralai/Mistral-7B-Instruct-v0.2") in model_names(
        "x.json", {"_name_or_path": "mistralai/Mistral-7B-Instruct-v0.2"}
    )


@pytest.mark.parametrize(
    "line",
    [
        "INFO non-default args: {'max_model_len': 4096, 'model': 'llava-hf/llava-v1.6-mistral-7b-hf'}",
        "$ vllm serve llava-hf/llava-v1.6-mistral-7b-hf --max-model-len 4096",
        "$ python -m vllm.entrypoints.openai.api_server --model llava-hf/llava-v1.6-mistral-7b-hf",
    ],
)
def test_the_model_is_read_from_an_args_dict_and_command_lines(line):
    log = read_vllm_log(line + "\nINFO Available KV cache memory: 5.0 GiB\n")
    assert log["model"] == "llava-hf/llava-v1.6-mistral-7b-hf"


def test_a_log_without_weights_takes_weight_bytes(tmp_path, capsys):
    log = _without_weights(tmp_path)
    code, r, _ = run(capsys, "qwen2.5-7b", "--from-log", log)
    assert code == 0 and r["terms"] == []
    assert any("no memory prediction" in n and "the weights" in n and "--weight-bytes" in n for n in r["notes"])
    given = 5_680_000_000
    code, r, _ = run(capsys, "qwen2.5-7b", "--from-log", log, "--weight-bytes", str(given))
    assert code == 0
    assert _term(r, "weights")["bytes"] == given and _term(r, "weights")["source"] == "given"
    line = next(x for x in r["lines"] if x["line"].startswith("Available KV cache memory"))
    assert line["log"] == 8.0 and line["kvlab"] is not None
    assert any("weights not in the log" in n and f"{given:,} B" in n for n in r["notes"]), r["notes"]


def test_a_log_without_weights_takes_weight_dtype(tmp_path, capsys):
    code, r, _ = run(capsys, "qwen2.5-7b", "--from-log", _without_weights(tmp_path), "--weight-dtype", "int4")
    assert code == 0
    assert _term(r, "weights")["bytes"] == weight_bytes(load_spec("qwen2.5-7b"), "int4").total_bytes


def test_weight_flags_are_refused_where_the_log_states_the_weights_naming_its_line(capsys):
    code, _, err = run(capsys, "qwen2.5-7b", "--from-log", str(AWQ_LOG), "--weight-bytes", "5680000000")
    assert code == 2
    assert "--weight-bytes 5680000000 gives the weights where the log does not" in err
    assert "5.29 GiB per GPU" in err and "Model loading took 5.29 GiB" in err and "line 4" in err, err


def test_the_actual_usage_line_states_the_weights():
    text = "INFO Actual usage is 14.08 GiB for weight, 1.97 GiB for peak activation\nAvailable KV cache memory: 5 GiB"
    assert read_vllm_log(text)["weights_gib"] == 14.08


def test_gpu_gives_the_device_memory_a_log_lacks(capsys):
    code, r, _ = run(capsys, *GEMMA4, "--gpu", "L4")
    assert code == 0
    assert _term(r, "total")["bytes"] == int(get_hardware("L4").memory_gib * GIB)
    assert any("--gpu L4" in n and "hardware table" in n for n in r["notes"]), r["notes"]
    code, same, _ = run(capsys, *GEMMA4, "--gpu-mem-gib", str(get_hardware("L4").memory_gib))
    assert code == 0 and same["lines"] == r["lines"]


def test_gpu_is_refused_where_the_log_states_the_memory(capsys):
    """(Beside --gpu-mem-gib it is the device and that flag its memory, as in plain plan and kvlab paging:
    test_from_log_input.test_from_log_takes_gpu_and_gpu_mem_gib_together_as_plain_plan_does.)"""
    code, _, err = run(capsys, str(DATA / "configs" / "llava-v1.6-mistral-7b-hf.json"), "--from-log", str(LLAVA_LOG), "--gpu", "L4")
    assert code == 2 and "--gpu L4 gives the device memory" in err and "79.19 GiB" in err and "line 5" in err, err


def test_a_log_of_another_model_is_refused_quoting_its_model_line_whole(capsys):
    # the refusal quoted "model='llava-hf/llava-v1.6-mistral-7b-hf": the value's closing quote was dropped
    statement = re.search(r"model='[^']*'", LLAVA_LOG.read_text()).group(0)
    code, _, err = run(capsys, "gemma-3-1b", "--from-log", str(LLAVA_LOG))
    assert code == 2
    assert repr(statement) in err, err


@pytest.mark.parametrize(
    "line, statement",
    [
        ("INFO with config: model='org/a', dtype=auto", "model='org/a'"),
        ("INFO args: {'model': 'org/a', 'dtype': 'auto'}", "'model': 'org/a'"),
        ('INFO args: {"model": "org/a", "dtype": "auto"}', '"model": "org/a"'),
        ("INFO vllm serve org/a --dtype auto", "vllm serve org/a"),
    ],
)
def test_a_quoted_statement_is_the_key_and_value_whole_with_their_quotes(line, statement):
    # the pattern starts at the key's name and stops at the value's end: "'model': 'org/a" was quoted as "model':
    # 'org/a" (quotes paired the wrong way round)
    assert statement in line
    m = re.search(LOG_LINES["model"][0], line)
    assert ast.literal_eval(quoted_statement(m, line)) == statement


def test_two_values_of_a_setting_are_quoted_with_their_closing_quotes():
    text = "args: {'max_model_len': 4096}\nengine: kv_cache_dtype='fp8', x\nengine: kv_cache_dtype='fp8_e5m2', x\n"
    with pytest.raises(ValueError) as exc:
        read_vllm_log(text)
    assert "\"kv_cache_dtype='fp8'\"" in str(exc.value) and "\"kv_cache_dtype='fp8_e5m2'\"" in str(exc.value)
