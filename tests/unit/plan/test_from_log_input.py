"""``kvlab plan MODEL --from-log FILE`` on input it cannot explain as given: planner flags it would ignore, a log
that lacks the lines it needs, and a log with the KV memory line more than once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.cli import main

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm_startup_logs"
GEMMA = [str(DATA / "configs" / "gemma-4-e2b.json"), "--from-log", str(DATA / "logs" / "log-gemma-4-e2b-l4.log")]
LLAVA = DATA / "configs" / "llava-v1.6-mistral-7b-hf.json"
LLAVA_LOG = DATA / "logs" / "log-llava-v1.6-mistral-7b-80gb.log"


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--context", "100"], "--context (drop --from-log to plan with it)"),
        (["--batch", "7"], "--batch (drop"),
        (["--measured-step-ms", "3"], "--measured-step-ms (drop"),
        (["--context", "100", "--batch", "7", "--measured-step-ms", "3"], "--context, --batch, --measured-step-ms"),
        (["--tp", "2", "--kv-dtype", "fp8"], "--kv-dtype, --tp (drop --from-log to plan with them)"),
        (["--emit", "vllm", "--block-size", "32"], "--emit (drop --from-log to plan with it)"),
    ],
)
def test_from_log_refuses_the_planner_flags_it_would_ignore(extra, named, capsys):
    """The log's own settings size what it printed: --context, --batch, --measured-step-ms ... were silently
    ignored (the same table, exit 0); they are refused as --list-gpus refuses them."""
    assert main(["plan", *GEMMA, "--gpu-mem-gib", "22.49", *extra]) == 2
    err = capsys.readouterr().err
    assert "--from-log sets kvlab's model beside the log's KV lines, sized by the log's own settings" in err
    assert f"it takes no {named}" in err


def test_from_log_takes_gpu_mem_gib_only_where_the_log_does_not_state_the_memory(capsys):
    """The L4 log states no device memory: --gpu-mem-gib gives it. The llava log states 79.19 GiB, which won over
    --gpu-mem-gib silently; now the flag is refused."""
    assert main(["plan", *GEMMA, "--gpu-mem-gib", "22.49", "--json"]) == 0
    capsys.readouterr()
    assert main(["plan", str(LLAVA), "--from-log", str(LLAVA_LOG), "--gpu-mem-gib", "80"]) == 2
    err = capsys.readouterr().err
    assert f"--gpu-mem-gib 80 gives the device memory where the log does not; {LLAVA_LOG} states 79.19 GiB" in err


def _log(tmp_path: Path, text: str) -> str:
    f = tmp_path / "vllm.log"
    f.write_text(text)
    return str(f)


@pytest.mark.parametrize("keep", ["Model loading took", "GPU KV cache size"])
def test_a_log_without_its_kv_memory_line_is_named_not_an_empty_table(keep, tmp_path, capsys):
    """A log cut before vLLM sized its KV cache (the L4 log up to its weights line), or one that kept only the tokens
    line, printed an empty or partial table with exit 0; now exit 2 naming the file and the missing line."""
    lines = (DATA / "logs" / "log-gemma-4-e2b-l4.log").read_text().splitlines()
    kept = lines[: next(i for i, line in enumerate(lines) if keep in line) + 1]
    if keep == "GPU KV cache size":
        kept = kept[-1:]
    path = _log(tmp_path, "\n".join(kept) + "\n")
    assert main(["plan", GEMMA[0], "--from-log", path, "--gpu-mem-gib", "22.49"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        f"--from-log {path}: no 'Available KV cache memory: N GiB' line (V0: 'kv_cache_size=N GiB'), which kvlab "
        "sizes the tokens and concurrency from: the log stops before vLLM sized its KV cache" in captured.err
    )
    figure = "weights_gib" if keep == "Model loading took" else "gpu_kv_cache_tokens"
    assert "(the figures it has: " in captured.err and figure in captured.err


def test_explaining_a_log_with_nothing_to_explain_is_refused():
    from kvlab.plan import presets
    from kvlab.plan.spec import spec_from_config
    from kvlab.plan.vllm_log import explain_vllm_log

    config = dict(presets.find("llama-3-8b").config)
    with pytest.raises(ValueError, match="nothing to explain: no 'Available KV cache memory"):
        explain_vllm_log({"gpu_kv_cache_tokens": 1000}, spec_from_config(config), config)


KIMI = [str(DATA / "configs" / "kimi-k2-thinking.json"), "--from-log"]
KIMI_WORKERS = """INFO non-default args: tensor_parallel_size=8
(Worker_TP0 pid=11) INFO Available KV cache memory: 47.31 GiB
(Worker_TP1 pid=12) INFO Available KV cache memory: 46.80 GiB
(Worker_TP2 pid=13) INFO Available KV cache memory: 47.31 GiB
INFO GPU KV cache size: 715,072 tokens
"""


def test_a_kv_memory_line_per_worker_is_read_as_vllm_sizes_the_cache_by_the_smallest(tmp_path, capsys):
    """Each TP worker logs its own KV memory and vLLM gives every worker the smallest's blocks (715,072 tokens
    is 46.80 GiB's): the first line (47.31 GiB, +1.1 % tokens) was taken; now the smallest, with a note."""
    assert main(["plan", *KIMI, _log(tmp_path, KIMI_WORKERS), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["log"]["available_kv_cache_gib"] == 46.8
    assert r["log"]["per_worker"] == {"available_kv_cache_gib": [47.31, 46.8, 47.31]}
    tokens = next(line for line in r["lines"] if line["line"].startswith("GPU KV cache size"))
    assert abs(tokens["error_pct"]) < 0.01, tokens
    assert (
        "3 'Available KV cache memory' lines (47.31, 46.8, 47.31 GiB), one per worker: kvlab takes the smallest, "
        "46.8 GiB, as vLLM sizes every worker's KV cache by the smallest" in " ".join(r["notes"])
    )


def test_a_log_pasted_twice_reads_as_once_and_two_starts_are_refused(tmp_path, capsys):
    text = LLAVA_LOG.read_text()
    assert main(["plan", str(LLAVA), "--from-log", str(LLAVA_LOG), "--json"]) == 0
    once = json.loads(capsys.readouterr().out)
    assert main(["plan", str(LLAVA), "--from-log", _log(tmp_path, text + text), "--json"]) == 0
    twice = json.loads(capsys.readouterr().out)
    assert twice["lines"] == once["lines"] and twice["notes"] == once["notes"]
    other = text.replace("4,096 tokens per request", "8,192 tokens per request")
    path = _log(tmp_path, text + other)
    assert main(["plan", str(LLAVA), "--from-log", path]) == 2
    assert (
        f"--from-log {path}: 'Maximum concurrency for L tokens per request' gives 2 max_model_len (4,096, 8,192): "
        "more than one start of vLLM; keep one start's lines" in capsys.readouterr().err
    )
