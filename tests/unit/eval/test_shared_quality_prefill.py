"""The quality pass of every cache of a cell starts from the baseline's float prefill (one prompt forward per cell,
not one per cache): the scores equal those of the cache's own prefill, and a cache that must score its prompt
itself, or refuses the fill, runs its own."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from kvlab.caches.registry import resolve
from kvlab.eval.config import EvalConfig
from kvlab.eval.measure import CellMeasurer
from kvlab.eval.metrics import fixed_continuation
from tests.conftest import make_tiny_qwen2, random_prompt


@pytest.fixture(scope="module")
def tiny():
    """kvlab attention enabled, as ``kvlab eval`` does when a fused cache runs (others fall back to SDPA)."""
    from kvlab.attention import enable

    model = make_tiny_qwen2(head_dim=32, max_positions=512)
    enable(model)
    return model


def _baseline(model, ids, continuation):
    return fixed_continuation(model, ids, continuation, DynamicCache(), 5)


@pytest.mark.parametrize("name", ["dynamic", "kivi-4", "kivi-2", "fp8-e4m3", "fp8-e4m3-hadamard", "sink"])
def test_shared_prefill_scores_equal_the_caches_own(tiny, name):
    ids, continuation = random_prompt(2, 200, seed=1), random_prompt(2, 6, seed=2)
    entry = resolve(name)

    def make():
        return entry.make(tiny.config)

    cell = CellMeasurer(EvalConfig(top_k=5), tiny, 0, {"failures": []}, print)
    shared = cell.quality(make, ids, continuation, _baseline(tiny, ids, continuation))
    own = fixed_continuation(tiny, ids, continuation, make(), 5)
    assert shared["prefill_shared"] is True
    assert own["prefill_shared"] is False
    assert shared["topk_ids"] == own["topk_ids"]
    assert shared["mean_nll"] == pytest.approx(own["mean_nll"], abs=1e-5)
    assert torch.allclose(shared["logits"], own["logits"], atol=1e-4)
    assert "prefill_states" not in shared  # only the baseline keeps its K/V


def test_a_cache_that_refuses_the_fill_runs_its_own_prefill(tiny):
    class Halving(DynamicCache):  # its prefill attends to other K/V than the float cache's: cannot share
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            return super().update(key_states * 0.5, value_states * 0.5, layer_idx, *args, **kwargs)

    ids, continuation = random_prompt(1, 64, seed=3), random_prompt(1, 4, seed=4)
    cell = CellMeasurer(EvalConfig(top_k=5), tiny, 0, {"failures": []}, print)
    q = cell.quality(Halving, ids, continuation, _baseline(tiny, ids, continuation))
    own = fixed_continuation(tiny, ids, continuation, Halving(), 5)
    assert q["prefill_shared"] is False
    assert q["mean_nll"] == pytest.approx(own["mean_nll"], abs=1e-6)


def test_baseline_keeps_its_prefill_states_for_the_cell(tiny):
    ids, continuation = random_prompt(1, 40, seed=5), random_prompt(1, 3, seed=6)
    q = fixed_continuation(tiny, ids, continuation, DynamicCache(), 5)
    states = q["prefill_states"]
    assert len(states) == tiny.config.num_hidden_layers
    assert states[0][0].shape == (1, 2, 40, 32)  # [batch, kv_heads, prompt tokens, head_dim]: the prompt only
