"""Prefill once, ask many: one float prefill per context and sample whatever the number of caches; a query-scored
cache filled from the shared prefill equals its own prefill; a damaged cache fails the needles it dropped."""

from __future__ import annotations

import pytest
import torch

import kvlab.attention
from kvlab.caches.registry import resolve
from kvlab.eval.tasks_judge import judge
from kvlab.eval.tasks_run import fill_from_prefill, prefill_with_queries, run_task_cell, summarize
from kvlab.runtime.hf_api import cache_kwarg
from kvlab.tasks import generate, noise_haystack, text_haystack
from tests.conftest import make_tiny_qwen2
from tests.damaged_caches import NewestTokensCache

CANDIDATES = ["dynamic", "kivi-4", "fp8-e4m3", "snapkv:compression_ratio=0.5", "tova:token_budget=64", "sink"]


class ByteTokenizer:
    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode(errors="replace")


@pytest.fixture(scope="module")
def tiny():
    model = make_tiny_qwen2(head_dim=32, max_positions=1024)
    kvlab.attention.enable(model)
    return model


def _count_context_forwards(model, context):
    seen = []

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] == context:
            seen.append(ids.shape[0])

    return seen, model.register_forward_pre_hook(hook, with_kwargs=True)


def test_one_prefill_per_context_and_sample(tiny):
    tok, context, n = ByteTokenizer(), 400, 3
    samples = generate("niah_single_1", tok, {"noise": noise_haystack(tok)}, context, n, protected_tail=32)
    caches = {name: (lambda name=name: resolve(name).make(tiny.config)) for name in CANDIDATES}
    caches["newest"] = lambda: NewestTokensCache(64)
    seen, handle = _count_context_forwards(tiny, context)
    try:
        out = run_task_cell(tiny, tok, samples, caches)
    finally:
        handle.remove()
    assert sum(seen) == n, f"{len(caches)} caches ran {sum(seen)} context rows through the model, not {n}"
    assert set(out["caches"]) == set(caches)
    assert out["caches"]["dynamic"]["cache_bytes_ratio"] == pytest.approx(1.0)  # cache / float, as kvlab eval's
    assert out["caches"]["snapkv:compression_ratio=0.5"]["cache_bytes_ratio"] == pytest.approx(0.5, rel=0.01)
    assert out["caches"]["kivi-4"]["cache_bytes_ratio"] < 0.67


@pytest.mark.parametrize(
    "name", ["snapkv:compression_ratio=0.5", "tova:token_budget=64", "kivi-4:token_budget=96"]
)
def test_query_scored_cache_from_shared_prefill_equals_its_own_prefill(tiny, name):
    torch.manual_seed(1)
    ids = torch.randint(0, 256, (2, 300))
    question = torch.randint(0, 256, (2, 7))
    kw = cache_kwarg(tiny)
    own = resolve(name).make(tiny.config)
    with torch.inference_mode():
        tiny(input_ids=ids, use_cache=True, **{kw: own})
        evicted = own.evicted_tokens(0)
        want = tiny(input_ids=question, use_cache=True, **{kw: own}).logits
    states, queries = prefill_with_queries(tiny, ids, 64)
    shared = fill_from_prefill(resolve(name).make(tiny.config), states, queries)
    assert shared.evicted_tokens(0) == evicted > 0
    with torch.inference_mode():
        got = tiny(input_ids=question, use_cache=True, **{kw: shared}).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_query_scored_cache_needs_the_queries(tiny):
    states, _ = prefill_with_queries(tiny, torch.randint(0, 256, (1, 100)), 0)
    with pytest.raises(ValueError, match="pass the prefill's queries"):
        fill_from_prefill(resolve("snapkv").make(tiny.config), states, None)


def test_summarize_and_judge_by_hand():
    s = summarize([{"score": 1.0, "correct": True}, {"score": 0.5, "correct": False}])
    assert (
        s["score"] == 0.75 and (s["correct"], s["trials"]) == (1, 2) and 0 < s["ci95"][0] < 0.5 < s["ci95"][1]
    )
    cells = [
        {
            "task": "a",
            "context": 8,
            "caches": {"dynamic": {"score": 0.9}, "x": {"score": 0.85}, "y": {"score": 0.1}},
        },
        {
            "task": "b",
            "context": 8,
            "caches": {"dynamic": {"score": 0.2}, "x": {"score": 0.0}, "y": {"score": 0.0}},
        },
    ]
    out = judge(cells, max_drop=0.1)
    status = {(g["task"], g["cache"]): g["status"] for g in out["gates"]}
    assert status == {
        ("a", "x"): "pass",
        ("a", "y"): "fail",
        ("b", "x"): "not informative",
        ("b", "y"): "not informative",
    }
    assert out["decision"]["x"]["verdict"] == "accepted" and out["decision"]["y"]["verdict"] == "rejected"
    assert out["decision"]["y"]["failed"] == ["a@8"]
    only_uninformative = judge(cells[1:])
    assert only_uninformative["decision"]["x"]["verdict"] == "not judged"
    with pytest.raises(ValueError, match="`max_drop` must be in"):
        judge(cells, max_drop=2)


@pytest.mark.parametrize("task", ["niah_single_2", "niah_multikey_1"])
def test_newest_tokens_cache_fails_needles_it_dropped(task):
    """The bundled model: needles in the first half of a 512-token context, the damaged cache keeping the newest
    127; the float cache finds them (the task is informative), the damaged cache scores <= 0.2 and is rejected."""
    from kvlab.models import heldout_text, load_model

    model, tok = load_model(None, dtype="float32")
    window, context = 128, 512
    hay = {"noise": noise_haystack(tok), "text": text_haystack(tok, heldout_text())}
    samples = generate(task, tok, hay, context, 10, depths=(0.0, 0.25, 0.5), protected_tail=160)
    assert all(s.needle_spans[0][1] < context - window for s in samples), "a needle inside the kept window"
    caches = {
        "dynamic": lambda: resolve("dynamic").make(model.config),
        "newest": lambda: NewestTokensCache(window),
    }
    cell = run_task_cell(model, tok, samples, caches, stop_id=tok.eos_token_id)
    assert cell["caches"]["dynamic"]["score"] >= 0.5
    assert cell["caches"]["newest"]["score"] <= 0.2
    verdict = judge([{"task": task, "context": context, **cell}])["decision"]["newest"]["verdict"]
    assert verdict == "rejected"
