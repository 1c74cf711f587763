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


# --- FP8Cache(attention="fused"): codes read by kvlab attention (rotated: in their rotated basis) ------------------------------


def _decode_logits(model, cache, ids, steps):
    """Prefill ``ids[:, :-steps]`` then feed the last ``steps`` tokens one at a time: ``[steps, vocab]`` logits."""
    kw = cache_kwarg(model)
    out = []
    with torch.no_grad():
        model(input_ids=ids[:, :-steps], use_cache=True, **{kw: cache})
        for i in range(ids.shape[1] - steps, ids.shape[1]):
            out.append(model(input_ids=ids[:, i : i + 1], use_cache=True, **{kw: cache}).logits[0, -1])
    return torch.stack(out)


def test_fused_rotated_fp8_equals_the_dequantize_path(model):
    """Rotating the query and the output instead of every stored token is the same arithmetic (orthonormal R):
    the fused FP8 path matches the path that rotates the history back, to float32 rounding, at every step; the
    rotations are read once per layer and step and nothing is left behind."""
    from kvlab.caches.fp8 import FP8Cache

    ids = torch.randint(1, 256, (1, 70), generator=torch.Generator().manual_seed(3))
    kvlab.attention.enable(model)
    plain = _decode_logits(model, FP8Cache("e4m3", "per-head", "hadamard"), ids, 6)
    cache = FP8Cache("e4m3", "per-head", "hadamard", attention="fused")
    fused = _decode_logits(model, cache, ids, 6)
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-4)
    assert not pending()
    dynamic = _decode_logits(model, DynamicCache(), ids, 6)
    assert float((fused - dynamic).abs().max()) > 1e-4  # the FP8 rounding is really there (not a float copy)


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_fused_fp8_read_by_sdpa_raises(model, rotation):
    from kvlab.caches.fp8 import FP8Cache

    ids = torch.randint(1, 256, (1, 40), generator=torch.Generator().manual_seed(4))
    model.set_attn_implementation("sdpa")
    cache = FP8Cache("e4m3", "per-head", rotation, attention="fused")
    with torch.no_grad():
        model(
            input_ids=ids[:, :-1], use_cache=True, **{cache_kwarg(model): cache}
        )  # a prefill hands nothing off
        with pytest.raises(
            RuntimeError, match=r"FP8Cache\(attention='fused'\) needs kvlab attention .*FP8 history"
        ):
            model(input_ids=ids[:, -1:], use_cache=True, **{cache_kwarg(model): cache})
    assert not pending()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"attention": "dense"}, r"`attention` must be one of .*got 'dense'"),
        ({"rotation": "hadamard", "attention": "flash"}, r"`attention` must be one of .*got 'flash'"),
    ],
)
def test_fp8_attention_settings_are_checked(kwargs, match):
    from kvlab.caches.fp8 import FP8Cache

    with pytest.raises(ValueError, match=match):
        FP8Cache(**kwargs)


@pytest.mark.parametrize("family", ["fp8", "kivi"])
def test_a_one_layer_model_without_kvlab_attention_gets_right_logits_from_a_fused_cache(family):
    """A hand-off is checked by the next layer's update in the same forward; a one-layer model has no next layer,
    so one decode step after the prefill once returned wrong logits (0.4-0.8 off) with no error. Its only layer now
    runs the dequantize path itself."""
    from kvlab.caches.fp8 import FP8Cache
    from tests.conftest import make_tiny_qwen2

    def make(attention):
        if family == "fp8":
            return FP8Cache("e4m3", "per-head", "hadamard", attention=attention)
        return KIVICache(nbits=2, group_size=16, residual_length=16, attention=attention)

    one = make_tiny_qwen2(head_dim=32, max_positions=256, layers=1)
    one.set_attn_implementation("sdpa")
    ids = torch.randint(1, 256, (1, 60), generator=torch.Generator().manual_seed(5))
    fused = _decode_logits(one, make("fused"), ids, 1)
    plain = _decode_logits(one, make("dequantize"), ids, 1)
    torch.testing.assert_close(fused, plain, rtol=0, atol=1e-5)
    assert not pending()


def test_a_fused_fp8_layer_updated_without_a_layer_index_reads_the_rotation_back():
    from kvlab.caches.fp8 import FP8Layer

    g = torch.Generator().manual_seed(6)
    first, second = torch.randn(1, 2, 5, 32, generator=g), torch.randn(1, 2, 1, 32, generator=g)
    out = []
    for attention in ("fused", "dequantize"):
        layer = FP8Layer("e4m3", "per-head", "hadamard", attention)
        layer.update(first, first)
        out.append(layer.update(second, second)[0])
    assert torch.equal(out[0], out[1]) and not pending()
