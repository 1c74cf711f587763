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
        (["--batch", "7"], "--batch (drop"),
        (["--measured-step-ms", "3"], "--measured-step-ms (drop"),
        (["--context", "100", "--batch", "7", "--measured-step-ms", "3"], "--batch, --measured-step-ms (drop"),
        (["--tp", "2", "--kv-dtype", "fp8"], "--kv-dtype (drop --from-log to plan with it)"),
        (["--emit", "vllm", "--block-size", "32"], "--emit (drop --from-log to plan with it)"),
    ],
)
def test_from_log_refuses_the_planner_flags_it_would_ignore(extra, named, capsys):
    """The log's own settings size what it printed: --batch, --measured-step-ms ... were silently ignored (the
    same table, exit 0); they are refused as --list-gpus refuses them (--context and --tp, which stand in for a
    setting the log lacks, are named where the log states it: test_context_and_tp_*)."""
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


@pytest.mark.parametrize(
    "flag, value, stated",
    [
        ("--context", "100", "states 8,192 (line 3, '--max-model-len 8192') (drop --context)"),
        ("--context", "8192", "states 8,192 (line 3, '--max-model-len 8192') (drop --context)"),  # the default too
        ("--tp", "2", "states 1 (line 3, 'tensor_parallel_size=1') (drop --tp)"),
        ("--tp", "1", "states 1 (line 3, 'tensor_parallel_size=1') (drop --tp)"),
    ],
)
def test_context_and_tp_are_refused_where_the_log_states_them_naming_its_line(flag, value, stated, capsys):
    """The L4 log states max_model_len and tensor_parallel_size: a flag beside it disagrees or repeats it."""
    assert main(["plan", *GEMMA, "--gpu-mem-gib", "22.49", flag, value]) == 2
    captured = capsys.readouterr()
    key = "max_model_len" if flag == "--context" else "tensor_parallel_size"
    assert captured.out == ""
    assert f"{flag} {value} gives {key} where the log does not; {GEMMA[2]} {stated}" in captured.err


def _silent(tmp_path: Path, *dropped: str) -> str:
    """The llava log without its args line (tensor_parallel_size, max_model_len, utilization) nor the lines of
    ``dropped``."""
    lines = LLAVA_LOG.read_text().splitlines()
    return _log(tmp_path, "\n".join(x for x in lines if not any(d in x for d in ("non-default args", *dropped))))


def test_context_and_tp_stand_in_where_the_log_does_not_state_them(tmp_path, capsys):
    """A log without tensor_parallel_size and max_model_len: --tp and --context were refused ('it takes no --tp'),
    kvlab assuming 1 and the config's limit; now they size the KV cache, noted as given."""
    path = _silent(tmp_path, "Maximum concurrency")
    base = ["plan", str(LLAVA), "--from-log", path, "--json"]
    assert main(base) == 0
    assumed = json.loads(capsys.readouterr().out)
    assert assumed["settings"]["tp"] == 1 and assumed["settings"]["max_model_len"] == 32768
    assert main([*base, "--tp", "2", "--context", "4096"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["settings"]["tp"] == 2 and r["settings"]["max_model_len"] == 4096
    assert "tensor_parallel_size not in the log: --tp 2" in r["notes"]
    assert "max_model_len not in the log: --context 4096" in r["notes"]
    assert not any("kvlab assumes" in n for n in r["notes"] if n.startswith(("tensor_parallel", "max_model_len")))
    # tokens from the same KV memory: half the KV heads per GPU hold twice the tokens
    tokens = [x["kvlab"] for x in (assumed, r) for x in x["lines"] if x["line"].startswith("GPU KV cache size")]
    assert tokens[1] > 1.9 * tokens[0]
    assert main([*base, "--context", "8192"]) == 0  # the default, given: not the config's 32,768
    assert json.loads(capsys.readouterr().out)["settings"]["max_model_len"] == 8192


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--tp", "3"], "--from-log {path}: --tp (3) must divide the query heads (32)"),
        # a value no log could take is refused before the log is read, as plain plan refuses it
        (["--tp", "0"], "--tp must be a positive integer, got 0"),
        (["--context", "0"], "--context must be a positive integer, got 0"),  # was the config's limit, silently
    ],
)
def test_context_and_tp_standing_in_are_checked_as_the_planner_checks_them(extra, said, tmp_path, capsys):
    path = _silent(tmp_path, "Maximum concurrency")
    assert main(["plan", str(LLAVA), "--from-log", path, *extra]) == 2
    assert capsys.readouterr().err == f"kvlab plan: error: {said.format(path=path)}\n"


def test_the_concurrency_line_states_max_model_len(tmp_path, capsys):
    """vLLM prints its max_model_len as the concurrency line's L: a log with that line states it."""
    path = _silent(tmp_path)
    assert main(["plan", str(LLAVA), "--from-log", path, "--context", "4096"]) == 2
    err = capsys.readouterr().err
    assert f"--context 4096 gives max_model_len where the log does not; {path} states 4,096 (line 8, 'Maximum " in err
    assert main(["plan", str(LLAVA), "--from-log", path, "--tp", "2", "--json"]) == 0  # TP: still not stated
    assert json.loads(capsys.readouterr().out)["settings"]["tp"] == 2


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


def test_from_log_takes_gpu_and_gpu_mem_gib_together_as_plain_plan_does(capsys):
    """--gpu and --gpu-mem-gib beside a log that states no memory were refused ("both give the device memory");
    plain plan and kvlab paging take them as the device and its memory: one rule, the note saying which counts."""
    assert main(["plan", *GEMMA, "--gpu", "L4", "--gpu-mem-gib", "20", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert any(n.startswith("device memory not in the log: --gpu-mem-gib 20 GiB in place of the L4's") for n in r["notes"])
    total = next(t for t in r["terms"] if t["name"] == "total")
    assert total["bytes"] == 20 * 2**30  # --gpu-mem-gib, not the L4's 22.49 GiB
    assert main(["plan", *GEMMA, "--gpu-mem-gib", "20", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["terms"] == r["terms"]
