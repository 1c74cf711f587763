"""``kvlab plan`` and the model's context limit, and what ``--emit vllm``'s ``--max-num-seqs`` means.

A user ran ``kvlab plan gpt2 --emit vllm``: exit 0 and a "runnable" command with ``--max-model-len 8192``, which vLLM
refuses for gpt2 (max_position_embeddings 1,024), and ``--max-num-seqs 1`` (one request at a time) with nothing
saying so; ``kvlab plan gpt2`` warned about "--context 8192", a flag the user never gave.
"""

from __future__ import annotations

import json
import math

from kvlab.cli import main
from kvlab.plan import presets
from kvlab.plan.load import load_spec
from kvlab.plan.report import plan_report
from kvlab.plan.scenario import DEFAULT_CONTEXT_TOKENS

GIB = 1024**3


def run(capsys, *argv: str) -> tuple[int, dict | None, str]:
    code = main(["plan", *argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else None, captured.err


def test_default_context_follows_the_models_limit(capsys):
    code, r, err = run(capsys, "gpt2")
    limit = r["spec"]["max_position_embeddings"]
    assert code == 0 and limit < 8192
    assert r["context"] == limit  # min(8192, max_position_embeddings)
    assert r["warnings"] == [] and "warning" not in err  # no word about a --context never given
    said = [n for n in r["notes"] if f"context {limit:,} tokens" in n]
    assert said and "n_positions" in said[0] and "no --context" in said[0], r["notes"]  # gpt2 states n_positions


def test_default_context_of_a_model_with_a_longer_limit_is_8192_without_a_note(capsys):
    code, r, _ = run(capsys, "llama-3-8b")
    assert code == 0 and r["context"] == 8192
    assert not any("no --context" in n for n in r["notes"])


def test_an_explicit_context_beyond_the_limit_is_still_warned_about(capsys):
    code, r, err = run(capsys, "gpt2", "--context", "4096")
    assert code == 0 and r["context"] == 4096
    assert any("--context 4,096" in w and "1,024" in w for w in r["warnings"]), r["warnings"]
    assert "--context 4,096" in err


def test_python_api_default_context_follows_the_limit():
    assert plan_report("gpt2")["context"] == plan_report("gpt2", context=None)["context"] == 1024
    assert plan_report("gpt2", context=2048)["context"] == 2048


def test_emit_vllm_never_emits_a_max_model_len_beyond_the_models_limit(capsys):
    code, r, _ = run(capsys, "gpt2", "--emit", "vllm")
    assert code == 0
    v = r["vllm"]
    command = v["command"]
    max_model_len = int(command[command.index("--max-model-len") + 1])
    assert max_model_len == v["max_model_len"] <= r["spec"]["max_position_embeddings"]
    assert any("n_positions" in n for n in v["notes"]), v["notes"]  # the command says why, by gpt2's field


def test_emit_vllm_refuses_an_explicit_context_beyond_the_limit_naming_both(capsys):
    code, _, err = run(capsys, "gpt2", "--context", "8192", "--emit", "vllm")
    assert code == 2
    assert "8,192" in err and "1,024" in err and "--context" in err and "Traceback" not in err, err
    assert capsys.readouterr().out == ""


def test_emit_vllm_takes_the_rope_scaled_limit_as_vllm_does(capsys, tmp_path):
    # vLLM's _get_and_verify_max_len: yarn scales original_max_position_embeddings by its factor
    config = dict(presets.find("llama-3-8b").config)
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    code, r, _ = run(capsys, str(path), "--context", "32768", "--emit", "vllm")
    assert code == 0 and r["vllm"]["max_model_len"] == 32768
    code, _, err = run(capsys, str(path), "--context", "32769", "--emit", "vllm")
    assert code == 2 and "32,769" in err and "32,768" in err and "rope_scaling" in err, err
    # llama3 rope scaling states the scaled length itself: vLLM does not multiply
    config["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    path.write_text(json.dumps(config), encoding="utf-8")
    code, _, err = run(capsys, str(path), "--context", "16384", "--emit", "vllm")
    assert code == 2 and "8,192" in err, err


def test_max_num_seqs_without_batch_is_what_the_kv_memory_holds(capsys):
    code, r, _ = run(capsys, "llama-3-8b", "--gpu-mem-gib", "80", "--reserve-gib", "4", "--emit", "vllm")
    assert code == 0
    v = r["vllm"]
    held = math.floor(v["max_concurrency"])
    assert held > 1 and v["max_num_seqs"] == held  # not 1: the server runs as many as fit at full length
    assert "--max-num-seqs" in v["command"] and v["command"][v["command"].index("--max-num-seqs") + 1] == str(held)
    note = next(n for n in v["notes"] if n.startswith("--max-num-seqs"))
    assert "at a time" in note and f"{held:,} requests of 8,192 tokens" in note and "--batch" in note, note


def test_max_num_seqs_without_batch_stops_at_vllms_default(capsys):
    # gpt2 at 1,024 tokens: the KV memory holds thousands of requests; vLLM's own default on an 80 GiB device is
    # 1,024 (vllm_memory.scheduler_defaults), which a larger count would only raise the sampler's memory above
    code, r, _ = run(capsys, "gpt2", "--emit", "vllm")
    v = r["vllm"]
    assert code == 0 and math.floor(v["max_concurrency"]) > 1024
    assert v["max_num_seqs"] == 1024
    assert any("vLLM's default" in n for n in v["notes"] if n.startswith("--max-num-seqs")), v["notes"]


def test_max_num_seqs_given_by_batch_says_what_it_means(capsys):
    code, r, _ = run(capsys, "llama-3-8b", "--batch", "1", "--emit", "vllm")
    v = r["vllm"]
    assert code == 0 and v["max_num_seqs"] == 1
    note = next(n for n in v["notes"] if n.startswith("--max-num-seqs"))
    assert "--batch 1" in note and "at a time" in note, note


def test_roofline_default_context_follows_the_models_limit(capsys):
    assert main(["roofline", "--model", "gpt2", "--json"]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    assert r["context"] == 1024 and r["warnings"] == [] and "warning" not in captured.err
    assert any("no --context" in n for n in r["notes"]), r["notes"]


def _refusal(capsys, *argv: str) -> str:
    assert main(["plan", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "error:" in captured.err  # no command printed that cannot run
    return captured.err


def test_a_request_that_does_not_fit_names_the_default_context_not_a_flag_never_given(capsys):
    # the KV cache of 17 GiB less 1.5 GiB and llama-3-8b's weights holds fewer tokens than one default request;
    # the refusal said "--context 8,192 tokens of KV ...", a flag the user did not give
    err = _refusal(capsys, "llama-3-8b", "--emit", "vllm", "--gpu-mem-gib", "17", "--reserve-gib", "1.5")
    assert f"--context {DEFAULT_CONTEXT_TOKENS:,}" not in err, err
    assert f"the default context {DEFAULT_CONTEXT_TOKENS:,} tokens (no --context given)" in err, err
    assert "refuses to start" in err, err


def test_a_request_that_does_not_fit_names_the_models_limit_where_it_set_the_context(capsys):
    limit = load_spec("gpt2").max_position_embeddings
    err = _refusal(capsys, "gpt2", "--emit", "vllm", "--gpu-mem-gib", "4.25")
    assert f"--context {limit:,}" not in err, err
    assert f"the context {limit:,} tokens (gpt2's n_positions; no --context given)" in err, err


def test_a_request_that_does_not_fit_still_names_a_context_given(capsys):
    argv = ["llama-3-8b", "--emit", "vllm", "--gpu-mem-gib", "17", "--reserve-gib", "1.5"]
    err = _refusal(capsys, *argv, "--context", str(DEFAULT_CONTEXT_TOKENS))
    assert f"--context {DEFAULT_CONTEXT_TOKENS:,}" in err and "no --context given" not in err, err
