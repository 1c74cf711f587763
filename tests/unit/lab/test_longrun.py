"""What the lab's real-model runs check before their work (:mod:`kvlab.lab.longrun`): the progress spans, the
position-limit warning, the available memory, and ``kvlab lab --real``'s memory estimate (:func:`peak_bytes`)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig

from kvlab.lab.exactness import EXACT_CACHES, check_exact_caches, check_steps, fitting_tokens, peak_bytes
from kvlab.lab.longrun import (
    STEP_TOKENS,
    configured_max_positions,
    memory_refusal,
    position_warning,
    spans,
)
from kvlab.runtime.provenance import available_memory_bytes


def test_spans_cover_the_range_in_steps_and_an_empty_loop_is_one_step():
    assert spans(4, 300, 128) == [(4, 132), (132, 260), (260, 300)]
    assert spans(0, 128, 128) == [(0, 128)]
    assert spans(7, 7) == [(7, 7)] and spans(9, 3) == [(9, 9)]
    assert sum(b - a for a, b in spans(1, 10_001)) == 10_000
    assert all(b - a <= STEP_TOKENS for a, b in spans(1, 10_001))
    with pytest.raises(ValueError, match="`size` must be >= 1, got 0"):
        spans(0, 5, 0)


def test_position_warning_names_the_flag_the_value_and_the_limit():
    assert position_warning("--tokens", 8192, 8192, "x") is None  # at the limit: every position trained
    assert position_warning("--tokens", 10_000, None, "x") is None  # no limit stated
    text = position_warning("--tokens", 10_000, 8192, "positions it was not trained on")
    assert text == (
        "--tokens 10,000 passes the model's max_position_embeddings (8,192): positions it was not trained on"
    )


def test_configured_limit_is_read_from_the_files_without_loading(tmp_path):
    from kvlab.models import reference_model_path

    bundled = json.loads((reference_model_path() / "config.json").read_text())
    assert configured_max_positions(None) == bundled["max_position_embeddings"]
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**bundled, "max_position_embeddings": 16}))
    assert configured_max_positions(str(model)) == 16
    (model / "config.json").write_text("not json")
    assert configured_max_positions(str(model)) is None  # unreadable: the command's load reports it


def test_configured_limit_of_a_gguf_not_yet_converted_is_read_from_its_header(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    from tests.unit.plan.test_gguf import write_gguf

    monkeypatch.setenv("KVLAB_MODEL_DIR", str(tmp_path / "model-cache"))
    path = write_gguf(tmp_path / "tiny.gguf")  # context_length 4096
    assert configured_max_positions(str(path)) == 4096
    assert not (tmp_path / "model-cache").exists()  # nothing converted


def test_available_memory_is_mem_available_of_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   23532904 kB\n")
    assert available_memory_bytes(meminfo) == 23532904 * 1024
    fallback = available_memory_bytes(tmp_path / "missing")  # no /proc: free physical pages, or unknown
    assert fallback is None or fallback > 0


def test_memory_refusal_says_what_is_needed_and_what_is_there():
    assert memory_refusal("x", 10, 20) is None and memory_refusal("x", 10, None) is None
    text = memory_refusal("--tokens 9", 3 * 2**30, 2**30, "at most about 3 tokens fit")
    assert (
        text
        == "--tokens 9 needs about 3.00 GiB of memory, the machine has 1.00 GiB available; at most about 3 tokens fit"
    )


SMOLLM2 = LlamaConfig(  # SmolLM2-135M's shapes: the model whose --tokens 10000 reached 13.6 GB
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
)


def test_the_estimate_grows_with_the_logits_it_keeps():
    """Two float32 [batch, tokens, vocab] logits (the reference and DynamicCache's) are the term that grows; the
    estimate is above them and below the five copies the check kept before it compared forward by forward."""
    logits = 10_000 * 49152 * 4
    need = peak_bytes(SMOLLM2, tokens=10_000, batch=1, dtype=torch.float32)
    assert 2 * logits < need < 5 * logits
    assert peak_bytes(SMOLLM2, tokens=10_000, batch=2, dtype=torch.float32) > 1.9 * need
    bf16 = peak_bytes(SMOLLM2, tokens=10_000, batch=1, dtype=torch.bfloat16)
    assert bf16 > 2 * logits  # the comparison is float32 whatever the model dtype
    budget = 4 * 2**30
    fit = fitting_tokens(SMOLLM2, batch=1, dtype=torch.float32, budget=budget, upto=10_000)
    assert 0 < fit < 10_000
    assert peak_bytes(SMOLLM2, tokens=fit, batch=1, dtype=torch.float32) <= budget
    assert peak_bytes(SMOLLM2, tokens=fit + 1, batch=1, dtype=torch.float32) > budget


def test_the_check_reports_each_span_and_a_nan_fails_it(tiny_qwen2):
    from transformers import DynamicCache

    ids = torch.randint(0, 256, (1, 132), generator=torch.Generator().manual_seed(6))
    steps: list[str] = []
    dynamic = {"dynamic": EXACT_CACHES["dynamic"]}
    r = check_exact_caches(tiny_qwen2, ids, prefill_tokens=2, caches=dynamic, progress=steps.append)
    assert len(steps) == check_steps(132, caches=1, prefill_tokens=2) == 3 and r["all_passed"] is True
    assert steps == [
        "reference: one forward of 1 x 132 tokens, no cache",
        "dynamic: tokens 1-130 of 132",  # the prefill (2) and 128 decoded tokens
        "dynamic: tokens 131-132 of 132",
    ]
    assert check_steps(96) == 1 + len(EXACT_CACHES)  # the default --tokens: one span per cache

    class NaNAtTheEnd(DynamicCache):  # exact until its last token: a NaN there must not be lost in a max
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if self.get_seq_length(layer_idx) == 11:
                value_states = torch.full_like(value_states, float("nan"))
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    nan = {"nan": lambda m, n: NaNAtTheEnd(config=m.config)}
    bad = check_exact_caches(tiny_qwen2, ids[:, :12], prefill_tokens=4, caches=nan)
    assert bad["rows"][0]["status"] == "ok" and bad["rows"][0]["passed"] is False and not bad["all_passed"]
