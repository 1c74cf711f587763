"""``kvlab plan --from-log`` searches each figure's pattern only in the lines that hold one of its words
(:data:`kvlab.plan.vllm_log.LINE_WORDS`, :func:`kvlab.plan.vllm_log.log_matches`), not over the whole log once per
figure. That is the same search only if every match holds one of the words and no match runs past a line's end:
here the matches of the line scan are compared, position by position, with ``re.finditer`` over the whole text, for
the real startup logs of tests/data and for lines written to sit at the edges (the first and last line, a line
without its newline, CRLF ends, a value at a line's start, statements on adjacent lines, one line holding many)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvlab.plan.vllm_log import LINE_WORDS, LOG_LINES, log_matches, read_vllm_log

LOGS = Path(__file__).resolve().parents[2] / "data" / "vllm_startup_logs" / "logs"

EDGES = [
    "Available KV cache memory: 5.00 GiB",  # the whole text, no newline
    "1.5 GiB for weight\n2.0 GiB for peak activation\n0.1 GiB for non-torch memory\n0.2 GiB for CUDAGraph memory",
    "x\r\nAvailable KV cache memory: 5.00 GiB\r\nGPU KV cache size: 1,024 tokens\r\nINFO vLLM 0.11.0\r\n",
    "--max-model-len 4096\n--block-size 32\n--dtype half\n--kv-cache-dtype fp8\n--tensor-parallel-size 2\n",
    "non-default args: {'model': 'org/m', 'max_model_len': 8192, 'block_size': 16, 'dtype': 'bfloat16'}\n"
    "engine (v0.6.3) config: model='org/m', tensor_parallel_size=1, decode_context_parallel_size=1, "
    "max_num_batched_tokens=2048, kv_cache_dtype=auto, gpu_memory_utilization=0.9\n",
    "vllm serve --enforce-eager --port 8000 org/m --gpu-memory-utilization 0.85\nvllm serve org/n\n",
    "Memory profiling results: total_gpu_memory=23.58GiB non_torch_memory=0.35GiB kv_cache_size=3.81GiB\n"
    "# GPU blocks: 1952, # CPU blocks: 2048\nMaximum concurrency for 20000 tokens per request: 1.56x\n",
    "Free memory on device (70.1/79.18 GiB) on startup. Desired GPU memory utilization is (0.9, 71.26 GiB).\n"
    "Model loading took 1.12 GiB memory\nLoading model weights took 14.9888 GB\n"
    "Graph capturing finished in 5 secs, took 0.52 GiB\n",
    "dtype=torch.float16 dtype=torch.float16\ndtypes dtype\nmodelmodel model='a' model='a'\n",  # many on one line
    "\n\n\nAvailable KV cache memory: 1 GiB\n\n",
]


def _corpus() -> list[str]:
    logs = sorted(LOGS.glob("*.log"))
    assert len(logs) >= 8  # the case logs were found
    texts = [p.read_text() for p in logs]
    return [*texts, "\n".join(texts), *EDGES]


@pytest.mark.parametrize("key", list(LOG_LINES))
def test_the_line_scan_finds_every_match_a_whole_text_search_finds(key):
    for text in _corpus():
        whole = [(m.span(), m.groups()) for m in re.finditer(LOG_LINES[key][0], text)]
        scanned = [(m.span(), m.groups()) for m in log_matches(text, key)]
        assert scanned == whole, (key, text[:80])


def test_every_figure_has_its_words_and_each_word_is_in_its_pattern():
    assert set(LINE_WORDS) == set(LOG_LINES)
    for key, words in LINE_WORDS.items():
        assert words
        pattern = LOG_LINES[key][0].replace("\\(", "(")
        assert all(word in pattern for word in words), key


def test_the_edge_corpus_states_each_figure_somewhere():
    # the comparison above means something only where the figure is found at all
    found = {key for key in LOG_LINES for text in _corpus() if log_matches(text, key)}
    assert found == set(LOG_LINES)


def test_a_log_repeated_reads_as_the_log_once():
    log = (LOGS / "llmd-qwen3-0.6b.log").read_text()
    assert read_vllm_log(log * 50) == read_vllm_log(log)
