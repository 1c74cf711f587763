"""``kvlab plan --from-log`` reads a log with a very long line (a 100 KB line: a progress bar's carriage returns, a
pasted args dump) in time linear in the line: a value printed before its words (``14.08 GiB for weight``) was
searched from every character of every word, each try running to the word's end (a 100 KB word took minutes); a
``vllm serve`` line whose options name no model after them was read every way its options split (time doubling
with each option); a key repeated within one word (``kv_cache_size=``, ``Graph capturing finished``) was scanned to
the line's end from each; nested speculative configs were blanked once each. Each test reads such a line and checks
what was read: without the fixes they ran for minutes (or never ended), so a run that finishes is the check, and no
time is measured here."""

from __future__ import annotations

from kvlab.plan.vllm_log import read_vllm_log

KB100 = 100_000
KV_LINE = "INFO [gpu_worker.py:276] Available KV cache memory: 55.15 GiB\n"


def test_a_100_kb_line_of_long_words_is_read():
    usage = (
        " Actual usage is 14.08 GiB for weight, 1.97 GiB for peak activation, 0.07 GiB for non-torch memory, and "
        "0.67 GiB for CUDAGraph memory. "
    )
    line = "x" * (KB100 // 2) + usage + "y" * (KB100 // 2)
    found = read_vllm_log(KV_LINE + line + "\n")
    assert len(line) > KB100
    assert found["weights_gib"] == 14.08
    assert found["activation_gib"] == 1.97
    assert found["non_torch_gib"] == 0.07
    assert found["cuda_graph_gib"] == 0.67
    assert found["available_kv_cache_gib"] == 55.15


def test_a_100_kb_word_before_a_value_is_not_read_as_the_value():
    found = read_vllm_log(KV_LINE + "z" * KB100 + " 14.08 GiB for weight\n")
    assert found["weights_gib"] == 14.08


def test_a_100_kb_vllm_serve_line_with_the_model_given_by_flag_is_read():
    """Thousands of options and ``--model`` last: the options are read once, then --model names the model."""
    options = "".join(f" --option-{i % 50} value{i}" for i in range(6_000))
    line = "$ vllm serve" + options + " --enforce-eager --model org/served-model --max-model-len 8192"
    found = read_vllm_log(KV_LINE + line + "\n")
    assert len(line) > KB100
    assert found["model"] == "org/served-model"
    assert found["max_model_len"] == 8192


def test_a_vllm_serve_line_with_many_options_before_the_model_is_read():
    """Options read once, left to right (not every way they split), still leave the model after them."""
    options = " --tensor-parallel-size 2" + " --trust-remote-code --block-size 16" * 40
    found = read_vllm_log(KV_LINE + "vllm serve" + options + " org/m --max-model-len 4096\n")
    assert found["model"] == "org/m"
    assert found["tensor_parallel_size"] == 2 and found["block_size"] == 16


def test_a_100_kb_line_repeating_a_key_is_read():
    """``Graph capturing finished`` repeated before its ``took``; ``non_torch_memory=`` repeated within one word."""
    graphs = "Graph capturing finished in 5 secs, " * (KB100 // 36) + "took 0.67 GiB"
    keys = "non_torch_memory=" * (KB100 // 17) + "0.35GiB"
    found = read_vllm_log(KV_LINE + graphs + "\n" + keys + "\n")
    assert found["cuda_graph_gib"] == 0.67
    assert found["non_torch_gib"] == 0.35


def test_nested_speculative_configs_on_a_100_kb_line_are_blanked():
    """The draft models inside are not read as a second served model."""
    depth = 4_200
    nested = "speculative_config=" + "{'speculative_config': " * depth + "{'model': 'org/draft'}" + "}" * depth
    found = read_vllm_log(KV_LINE + "model='org/served' " + nested + "\n")
    assert len(nested) > KB100
    assert found["model"] == "org/served"
