"""The hand-off between a fused KIVICache / FP8Cache and kvlab attention through the forward context: never a
silently wrong step (an unread hand-off fails the forward that left it, a one-layer model's included), nothing left
for another forward after one fails, and nothing kept alive after the step that read it."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from transformers import DynamicCache

import kvlab.attention
from kvlab.attention.context import current, forward_context
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
    assert current() is None  # every forward closed its context


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
    assert current() is None  # nothing of this cache is left for another forward to pick up


def test_a_forward_that_fails_after_a_hand_off_leaves_nothing_for_the_next(model):
    """A forward that raises between a cache's hand-off and its attention drops its context unchecked (the
    original error goes on, with no second one): the next forward, another cache's, gets exact logits."""
    ids = torch.randint(1, 256, (1, 60), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(input_ids=ids, **{cache_kwarg(model): DynamicCache()}, use_cache=True).logits
    kvlab.attention.enable(model)
    cache = KIVICache(nbits=4, group_size=16, residual_length=16, attention="fused")
    cache.load(_prefill(model, ids[:, :-1]))
    real = cache.update

    def fail_after_layer_1(k, v, idx, *args, **kwargs):
        out = real(k, v, idx, *args, **kwargs)
        if idx == 1:
            assert current().handoff[1].segments  # handed off, not yet read
            raise KeyError("between the hand-off and the attention")
        return out

    cache.update = fail_after_layer_1
    with pytest.raises(KeyError, match="between the hand-off"), torch.no_grad():
        model(input_ids=ids[:, -1:], **{cache_kwarg(model): cache}, use_cache=True)
    assert current() is None
    with torch.no_grad():
        got = model(input_ids=ids, **{cache_kwarg(model): DynamicCache()}, use_cache=True).logits
    torch.testing.assert_close(got, ref)


def test_a_hand_off_outside_a_forward_needs_a_context_and_is_checked_when_it_closes(model):
    """Updating a fused cache by hand: with tokens quantized, no open context is the not-enabled error (nothing
    appended); inside ``forward_context()`` the entry is filed, and leaving it unread raises naming the layer."""
    ids = torch.randint(1, 256, (1, 60), generator=torch.Generator().manual_seed(2))
    cache = KIVICache(nbits=4, group_size=16, residual_length=16, attention="fused")
    cache.load(_prefill(model, ids[:, :-1]))
    held = cache.get_seq_length()
    k = torch.randn(1, 2, 1, 32)
    with pytest.raises(
        RuntimeError, match=r"needs kvlab attention .*layer 0's quantized prefix has no forward"
    ):
        cache.update(k, k, 0)
    assert cache.get_seq_length() == held
    with pytest.raises(
        RuntimeError, match=r"KIVICache\(attention='fused'\) .*layer 0's quantized prefix was never"
    ):
        with forward_context() as ctx:
            cache.update(k, k, 0)
            assert ctx.handoff[0].segments and list(ctx.handoff) == [0]
    assert current() is None and cache.get_seq_length() == held + 1


def test_a_hand_off_read_with_other_keys_falls_back_to_sdpa_and_fails_the_forward(model):
    """K/V the model changed after the cache returned them (e.g. repeated per expert) never read the entry: the
    attention is SDPA over what it was given, and the end of the forward names the changed K/V."""
    from kvlab.attention.interface import kvlab_attention_forward, sdpa

    ids = torch.randint(1, 256, (1, 60), generator=torch.Generator().manual_seed(7))
    cache = KIVICache(nbits=4, group_size=16, residual_length=16, attention="fused")
    cache.load(_prefill(model, ids[:, :-1]))
    layer = model.model.layers[0].self_attn
    q, k = torch.randn(1, 4, 1, 32), torch.randn(1, 2, 1, 32)
    with pytest.raises(
        RuntimeError, match=r"layer 0's quantized prefix was never read; .*repeated them per expert"
    ):
        with forward_context() as ctx:
            kw, vw = cache.update(k, k, 0)
            other = kw.clone()
            out, _ = kvlab_attention_forward(layer, q, other, vw, None, scaling=32**-0.5)
            want, _ = sdpa(layer, q, other, vw, None, scaling=32**-0.5)
            assert torch.equal(out, want) and 0 in ctx.handoff
    assert current() is None


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
    assert current() is None


def test_fused_attention_refuses_dropout(model):
    ids = torch.randint(1, 256, (1, 60), generator=torch.Generator().manual_seed(4))
    kvlab.attention.enable(model)
    cache = KIVICache(nbits=4, group_size=16, residual_length=16, attention="fused")
    cache.load(_prefill(model, ids[:, :-1]))
    from kvlab.attention.interface import kvlab_attention_forward

    layer = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 1, 32)
    k = torch.randn(1, 2, 1, 32)
    with pytest.raises(ValueError, match="dropout=0.1"), forward_context():
        kw, vw = cache.update(k, k, 0)
        kvlab_attention_forward(layer, q, kw, vw, None, dropout=0.1, scaling=32**-0.5)
    assert current() is None


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
    assert current() is None
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
    assert current() is None


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
def test_a_one_layer_model_hands_off_like_any_other_and_an_unread_hand_off_fails_its_forward(
    family, monkeypatch
):
    """A one-layer model has no next layer to find its hand-off unread; the end of the forward does: without kvlab
    attention (never enabled: no context; enabled then switched to SDPA: the hand-off left unread) the decode step
    raises instead of returning wrong logits (once 0.4-0.8 off), and with it the fused cache reads its history
    as the dequantize path does."""
    from kvlab.attention import interface
    from kvlab.caches.fp8 import FP8Cache
    from tests.conftest import make_tiny_qwen2

    def make(attention):
        if family == "fp8":
            return FP8Cache("e4m3", "per-head", "hadamard", attention=attention)
        return KIVICache(nbits=2, group_size=16, residual_length=16, attention=attention)

    what = "FP8 history" if family == "fp8" else "quantized prefix"
    one = make_tiny_qwen2(head_dim=32, max_positions=256, layers=1)
    one.set_attn_implementation("sdpa")
    ids = torch.randint(1, 256, (1, 60), generator=torch.Generator().manual_seed(5))
    with pytest.raises(RuntimeError, match=rf"needs kvlab attention .*layer 0's {what} has no forward"):
        _decode_logits(one, make("fused"), ids, 1)
    kvlab.attention.enable(one)
    kind = interface.PendingFP8 if family == "fp8" else interface.PendingPrefix
    taken, real = [], kind.attend
    monkeypatch.setattr(kind, "attend", lambda self, *a, **k: taken.append(1) or real(self, *a, **k))
    fused = _decode_logits(one, make("fused"), ids, 1)
    assert taken == [1]  # the decode step's attention read the hand-off (a prefill hands nothing off)
    plain = _decode_logits(one, make("dequantize"), ids, 1)
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-4)
    one.set_attn_implementation("sdpa")
    with pytest.raises(RuntimeError, match=rf"needs kvlab attention .*layer 0's {what} was never read"):
        _decode_logits(one, make("fused"), ids, 1)
    assert current() is None


def test_a_fused_fp8_layer_updated_without_a_layer_index_reads_the_rotation_back():
    from kvlab.caches.fp8 import FP8Layer

    g = torch.Generator().manual_seed(6)
    first, second = torch.randn(1, 2, 5, 32, generator=g), torch.randn(1, 2, 1, 32, generator=g)
    out = []
    for attention in ("fused", "dequantize"):
        layer = FP8Layer("e4m3", "per-head", "hadamard", attention)
        layer.update(first, first)
        out.append(layer.update(second, second)[0])
    assert torch.equal(out[0], out[1]) and current() is None


@pytest.mark.parametrize("layers", [1, 2])
def test_a_query_request_no_attention_answered_fails_its_own_forward(layers):
    """A query-scored cache's request, its last layer's included, is checked when the forward ends: a model switched
    away from kvlab attention fails the prefill that asked, not a later step; enabled, the prefill evicts."""
    from kvlab.caches.snapkv import SnapKVCache
    from tests.conftest import make_tiny_qwen2

    m = make_tiny_qwen2(head_dim=32, max_positions=256, layers=layers)
    prompt = torch.randint(1, 256, (1, 64), generator=torch.Generator().manual_seed(8))
    kvlab.attention.enable(m)
    cache = SnapKVCache(compression_ratio=0.5)
    with torch.no_grad():
        m(input_ids=prompt, use_cache=True, **{cache_kwarg(m): cache})
    assert cache.evicted_tokens(layers - 1) == 32
    m.set_attn_implementation("sdpa")
    with pytest.raises(RuntimeError, match=r"^SnapKVCache needs kvlab attention"), torch.no_grad():
        m(input_ids=prompt, use_cache=True, **{cache_kwarg(m): SnapKVCache(compression_ratio=0.5)})
    assert current() is None


def test_enable_opens_one_context_per_forward_however_often_it_is_called(model):
    """``enable`` twice adds its hooks once; the model's and its bare decoder's hooks share one context."""
    kvlab.attention.enable(model)
    hooks = (len(model._forward_pre_hooks), len(model.model._forward_pre_hooks))
    kvlab.attention.enable(model)
    assert (len(model._forward_pre_hooks), len(model.model._forward_pre_hooks)) == hooks
    seen = []
    layer = model.model.layers[0].self_attn
    handle = layer.register_forward_pre_hook(lambda *a: seen.append(current()))
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([[1, 2, 3]]), **{cache_kwarg(model): DynamicCache()}, use_cache=True)
            model.model(input_ids=torch.tensor([[1, 2, 3]]))
    finally:
        handle.remove()
    assert len(seen) == 2 and all(c is not None for c in seen) and seen[0] is not seen[1]
    assert current() is None
