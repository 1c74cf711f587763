"""Evicting caches through the eval's long-context probes on the bundled model: a SinkCache with a small window
loses the passkeys it evicted (the metric can fail, and the eval's gates reject it), SnapKV runs its own prefill
through the probes; and both run as ``kvlab eval`` candidates under their registry names."""

from __future__ import annotations

import pytest
from transformers import DynamicCache

from kvlab.caches.sink import SinkCache
from kvlab.caches.snapkv import SnapKVCache
from kvlab.eval.candidates import Candidate, check_candidate_names
from kvlab.eval.config import Gates
from kvlab.eval.decision import apply_gates
from kvlab.eval.longctx import heldout_probes, long_context_fields, measure_long_context, prefill_states

CONTEXT = 512
PROTECTED_TAIL = 128 + 32  # the eval's default R + G: needles lie before the newest 160 tokens
SINKS, WINDOW = 4, 96  # keeps the first 4 and the newest 96 tokens: every needle is evicted by the prefill
MIN_BASELINE_PASSKEY = 0.9


@pytest.fixture(scope="module")
def measured(reference_bf16):
    model, tokenizer = reference_bf16
    probes = heldout_probes(tokenizer, CONTEXT, protected_tail=PROTECTED_TAIL, passkey_trials=10, seed=0)
    probes = {"passkey": probes["passkey"]}
    states = {name: prefill_states(model, p.prompt_ids) for name, p in probes.items()}
    base = measure_long_context(model, DynamicCache, probes, states)
    return probes, states, base


def test_sink_cache_loses_the_passkeys_it_evicted_and_is_rejected(reference_bf16, measured):
    model, _ = reference_bf16
    probes, states, base = measured
    if base["passkey"]["accuracy"] < MIN_BASELINE_PASSKEY:
        pytest.skip(
            f"DynamicCache passkey accuracy {base['passkey']['accuracy']:.2f}: the model does not retrieve"
        )
    sink = measure_long_context(model, lambda: SinkCache(SINKS, WINDOW, config=model.config), probes, states)
    info = probes["passkey"].info
    evicted = [
        depth
        for depth, start, end in zip(info["depths"], info["needle_start_tokens"], info["needle_end_tokens"])
        if start >= SINKS and end <= CONTEXT - WINDOW
    ]
    assert evicted, "no needle lies in the evicted range: the probe placement changed"
    by_depth = {d["depth"]: d for d in sink["passkey"]["depths"]}
    for depth in evicted:
        assert by_depth[depth]["accuracy"] <= 0.5, (depth, by_depth[depth])
    row = {
        "candidate": f"sink:sink_tokens={SINKS}:window_length={WINDOW}",
        "context_length": CONTEXT,
        "nll_delta": 0.0,
        "topk_overlap": 1.0,
        "latency_ratio": 1.0,
        "cache_bytes_saved": 10**9,
        **long_context_fields(sink, base),
    }
    assert apply_gates(row, Gates())["passkey_drop"] is False


def test_snapkv_runs_its_own_prefill_through_the_probes(measured):
    import kvlab.attention
    from kvlab.models import load_model

    model, _ = load_model(
        None, dtype="bfloat16", device="cpu"
    )  # its own instance: kvlab attention switched on
    kvlab.attention.enable(model)
    probes, states, base = measured
    made = []

    def make():
        made.append(SnapKVCache(compression_ratio=0.5, config=model.config))
        return made[-1]

    snap = measure_long_context(model, make, probes, states)
    assert [d["trials"] for d in snap["passkey"]["depths"]] == [10] * len(base["passkey"]["depths"])
    assert 0 <= snap["passkey"]["accuracy"] <= 1
    assert all(c.evicted_tokens() == CONTEXT // 2 for c in made)  # each chunk's prompt was compressed


def test_eviction_candidates_are_eval_names():
    names = (
        "dynamic",
        "sink",
        "sink:sink_tokens=0:window_length=128",
        "snapkv",
        "kivi-4:compression_ratio=0.5",
    )
    check_candidate_names(names)
    assert Candidate.parse("snapkv:compression_ratio=0.25").family == "snapkv"
    with pytest.raises(ValueError, match="name no setting the run sets"):
        Candidate.parse("kivi-4:group_size=64")  # KIVI's settings stay the run's
