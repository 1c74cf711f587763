"""Hostile input to KIVICache: load() of partial, inconsistent or repeated states, a model with more layers than
were loaded, and batch reordering with bad indices: a clear error naming the value, the cache left unchanged.
States that are not 4-d and a cache reused for another batch get the same words from every cache."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import DynamicCache

from kvlab.caches import FP8Cache, KIVICache, PagedCache, SinkCache
from kvlab.runtime.hf_api import cache_kwarg


def _states(model, ids):
    with torch.no_grad():
        source = DynamicCache()
        model(input_ids=ids, **{cache_kwarg(model): source}, use_cache=True)
    return [(layer.keys, layer.values) for layer in source.layers]


def _ids(n=60, seed=1):
    return torch.randint(1, 256, (1, n), generator=torch.Generator().manual_seed(seed))


def _empty(cache):
    return all(layer.get_seq_length() == 0 for layer in cache.layers)


def test_load_into_a_cache_holding_tokens_is_refused(tiny_qwen2):
    states = _states(tiny_qwen2, _ids()[:, :-1])
    cache = KIVICache(nbits=4, group_size=16, residual_length=16)
    cache.load(states)
    with pytest.raises(ValueError, match=r"holds 59 tokens.*reset\(\)"):
        cache.load(states)
    assert cache.get_seq_length() == 59
    cache.reset()
    cache.load(states)
    assert cache.get_seq_length() == 59


def test_load_of_fewer_layers_than_a_config_cache_has_is_refused(tiny_qwen2):
    states = _states(tiny_qwen2, _ids()[:, :-1])
    cache = KIVICache(nbits=4, group_size=16, residual_length=16, config=tiny_qwen2.config)
    with pytest.raises(ValueError, match=r"1 layer.*2 layers"):
        cache.load(states[:1])
    assert _empty(cache)


@pytest.mark.parametrize("attention", ["dequantize", "fused"])
def test_a_layer_the_load_left_out_fails_at_its_first_update(tiny_qwen2, attention):
    """A lazily built cache cannot know the model's layer count at load(); the first forward must then refuse
    the layer that holds nothing (it used to attend to the new token only: wrong logits, no error)."""
    import kvlab.attention

    ids = _ids()
    cache = KIVICache(nbits=4, group_size=16, residual_length=16, attention=attention)
    cache.load(_states(tiny_qwen2, ids[:, :-1])[:1])
    kvlab.attention.enable(tiny_qwen2)
    try:
        with pytest.raises(ValueError, match=r"layer 1 .*1 token.*layer 0 holds 60"), torch.no_grad():
            tiny_qwen2(input_ids=ids[:, -1:], **{cache_kwarg(tiny_qwen2): cache}, use_cache=True)
    finally:
        tiny_qwen2.set_attn_implementation("sdpa")
        from kvlab.attention.context import current

        assert current() is None  # every forward closed its context


@pytest.mark.parametrize("bad", ["tokens", "batch", "head_dim", "nan"])
def test_inconsistent_layers_are_refused_before_anything_is_written(tiny_qwen2, bad):
    states = _states(tiny_qwen2, _ids()[:, :-1])
    k, v = states[1]
    if bad == "tokens":
        k, v = k[..., :30, :], v[..., :30, :]
        msg = r"layer 1 .*30 tokens.*layer 0 .*59"
    elif bad == "batch":
        k, v = k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1)
        msg = r"layer 1 .*batch 2.*layer 0 .*batch 1"
    elif bad == "head_dim":
        k, v = k[..., :8], v[..., :8]
        msg = r"layer 1: .*head_dim \(8\)"
    else:
        k = k.clone()
        k[0, 0, 3, 0] = float("nan")
        msg = r"layer 1: keys hold nan"
    cache = KIVICache(nbits=4, group_size=16, residual_length=16)
    with pytest.raises(ValueError, match=msg):
        cache.load([states[0], (k, v)])
    assert _empty(cache)


@pytest.mark.parametrize(
    "states,err,msg",
    [
        ([], ValueError, "no layers"),
        ([torch.zeros(1, 2, 3, 32)], TypeError, r"layer 0: expected a \(keys, values\) pair"),
        ([(torch.zeros(1, 2, 3, 32),) * 3], TypeError, r"layer 0: expected a \(keys, values\) pair"),
    ],
)
def test_load_of_malformed_states_is_named(states, err, msg):
    cache = KIVICache(nbits=4, group_size=16, residual_length=16)
    with pytest.raises(err, match=msg):
        cache.load(states)
    assert _empty(cache)


def _filled(batch=2, layers=2):
    cache = KIVICache(nbits=4, group_size=4, residual_length=4)
    g = torch.Generator().manual_seed(0)
    for i in range(layers):
        cache.update(torch.randn(batch, 1, 10, 8, generator=g), torch.randn(batch, 1, 10, 8, generator=g), i)
    return cache


@pytest.mark.parametrize(
    "index,err,msg",
    [
        (torch.tensor([0, 5]), ValueError, r"index .*5.*batch of 2"),
        (torch.tensor([-1, 0]), ValueError, r"index .*-1.*batch of 2"),
        (torch.tensor([0.0, 1.0]), TypeError, r"index .*torch.float32"),
        (torch.tensor([[0, 1]]), ValueError, r"index .*1-D.*\(1, 2\)"),
    ],
)
def test_reorder_with_a_bad_index_is_named_and_changes_nothing(index, err, msg):
    cache = _filled()
    before = [layer.state.key_residual.clone() for layer in cache.layers]
    with pytest.raises(err, match=msg):
        cache.reorder_cache(index)
    with pytest.raises(err, match=msg):
        cache.batch_select_indices(index)
    assert all(torch.equal(a, layer.state.key_residual) for a, layer in zip(before, cache.layers))


def test_reorder_accepts_a_list_and_repeat_follows_the_new_batch():
    cache = _filled()
    rows = cache.layers[0].state.key_residual.clone()
    cache.reorder_cache([1, 0, 1])  # a different batch size: later repeats must use it, not the old one
    assert cache.layers[0].batch_size == 3
    cache.batch_repeat_interleave(2)
    got = cache.layers[0].state.key_residual
    assert got.shape[0] == 6 and cache.layers[0].batch_size == 6
    assert torch.equal(got, rows[[1, 1, 0, 0, 1, 1]])


@pytest.mark.parametrize("repeats", [0, -1, 2.0, True])
def test_bad_repeats_are_named(repeats):
    cache = _filled()
    with pytest.raises((TypeError, ValueError), match=rf"repeats.*{repeats!r}"):
        cache.batch_repeat_interleave(repeats)
    assert cache.layers[0].state.key_residual.shape[0] == 2


@pytest.mark.parametrize("layer_idx", [-1, "a", 1.0])
def test_update_names_a_bad_layer_index(layer_idx):
    # -1 was an IndexError from transformers' cache_utils, 'a' a TypeError inside kivi.py
    k = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match=re.escape(f"`layer_idx` must be an int >= 0, got {layer_idx!r}")):
        KIVICache().update(k, k, layer_idx)


# one cache of each storage kind: quantized, FP8, evicting, paged
CACHE_MAKERS = [
    lambda: KIVICache(nbits=4, group_size=32, residual_length=32),
    FP8Cache,
    lambda: SinkCache(0, 8),
    lambda: PagedCache(block_size=16),
]


@pytest.mark.parametrize("make", CACHE_MAKERS)
def test_three_d_states_are_told_to_be_4d(make):
    k = torch.randn(2, 40, 64)
    with pytest.raises(ValueError, match=r"4-d \[batch, kv_heads, tokens, head_dim\].*3-d \(2, 40, 64\)"):
        make().update(k, k, 0)


@pytest.mark.parametrize("make", CACHE_MAKERS)
def test_a_cache_reused_for_another_batch_size_says_reset(make):
    cache = make()
    one, two = torch.randn(1, 2, 5, 32), torch.randn(2, 2, 5, 32)
    cache.update(one, one, 0)
    with pytest.raises(ValueError, match=r"reset\(\)"):
        cache.update(two, two, 0)
    cache.reset()
    keys, _ = cache.update(two, two, 0)
    assert keys.shape[0] == 2
