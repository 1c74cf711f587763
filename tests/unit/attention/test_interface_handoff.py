"""The hand-off between a fused KIVICache and kvlab attention: never a silently wrong step, never a stale prefix
read by another cache's forward, and nothing kept alive after the step that read it."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from transformers import DynamicCache

import kvlab.attention
from kvlab.attention.interface import pending
from kvlab.caches import KIVICache
from kvlab.runtime.hf_api import cache_kwarg


def _prefill(model, ids):
    with torch.no_grad():
        source = DynamicCache()
        model(input_ids=ids, **{cache_kwarg(model): source}, use_cache=True)
    return [(layer.keys, layer.values) for layer in source.layers]


@pytest.fixture
def model(tiny_qwen2):
    yield tiny_qwen2
    tiny_qwen2.set_attn_implementation("sdpa")
    pending().clear()


def test_fused_cache_read_by_sdpa_raises_in_the_same_forward(model):
    """After load(), the first step's quantized prefix used to be dropped silently by SDPA (wrong logits, no
    error): a model without kvlab attention must fail before it returns logits."""
    ids = torch.randint(1, 256, (1, 60), generator=torch.Generator().manual_seed(1))
    model.set_attn_implementation("sdpa")
    cache = KIVICache(nbits=8, group_size=16, residual_length=16, attention="fused")
    cache.load(_prefill(model, ids[:, :-1]))
    assert cache.quantized_tokens() > 0
    with pytest.raises(RuntimeError, match=r"kvlab.attention.enable\(model\)"), torch.no_grad():
        model(input_ids=ids[:, -1:], **{cache_kwarg(model): cache}, use_cache=True)
    assert not pending()  # nothing of this cache is left for another forward to pick up


def test_a_stale_prefix_is_never_read_by_another_cache(model):
    ids = torch.randint(1, 256, (1, 60), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(input_ids=ids, **{cache_kwarg(model): DynamicCache()}, use_cache=True).logits
    # a prefix handed off by a fused cache whose attention never ran (e.g. an exception in between)
    cache = KIVICache(nbits=4, group_size=16, residual_length=16, attention="fused")
    cache.load(_prefill(model, ids[:, :-1]))
    k = torch.randn(1, 2, 1, 32)
    cache.update(k, k, 0)
    assert pending()[0].segments and not pending()[0].consumed
    kvlab.attention.enable(model)
    with torch.no_grad():
        got = model(input_ids=ids, **{cache_kwarg(model): DynamicCache()}, use_cache=True).logits
    torch.testing.assert_close(got, ref)


def test_a_finished_fused_cache_is_not_kept_alive(model):
    ids = torch.randint(1, 256, (1, 60), generator=torch.Generator().manual_seed(3))
    kvlab.attention.enable(model)
    cache = KIVICache(nbits=4, group_size=16, residual_length=16, attention="fused")
    with torch.no_grad():
        model.generate(ids, **{cache_kwarg(model): cache}, max_new_tokens=4, do_sample=False, pad_token_id=0)
    block = weakref.ref(cache.layers[0].state.blocks[0].k_codes)
    del cache
    gc.collect()
    assert block() is None
    assert not pending()


def test_fused_attention_refuses_dropout(model):
    ids = torch.randint(1, 256, (1, 60), generator=torch.Generator().manual_seed(4))
    kvlab.attention.enable(model)
    cache = KIVICache(nbits=4, group_size=16, residual_length=16, attention="fused")
    cache.load(_prefill(model, ids[:, :-1]))
    from kvlab.attention.interface import kvlab_attention_forward

    layer = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 1, 32)
    k = torch.randn(1, 2, 1, 32)
    kw, vw = cache.update(k, k, 0)
    with pytest.raises(ValueError, match="dropout=0.1"):
        kvlab_attention_forward(layer, q, kw, vw, None, dropout=0.1, scaling=32**-0.5)
