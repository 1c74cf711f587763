"""KIVI over a SnapKV-compressed prompt: the kept tokens are quantized once (the state equals a KIVI cache loaded
with exactly SnapKV's kept K/V), the bytes meet the issue's bound, decoding runs on both attention paths."""

import pytest
import torch
from transformers import DynamicCache

import kvlab.attention
from kvlab.caches.kivi import KIVICache
from kvlab.caches.kivi_snapkv import KIVISnapKVCache
from kvlab.caches.measure import cache_nbytes
from kvlab.caches.registry import resolve
from kvlab.caches.snapkv import SnapKVCache
from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2
from tests.conftest import random_prompt as _prompt

pytestmark = pytest.mark.usefixtures("no_grad")


@pytest.fixture(scope="module")
def model():
    return kvlab.attention.enable(make_tiny_qwen2(head_dim=32, max_positions=4200))


def test_kept_tokens_are_quantized_once_as_a_fresh_kivi_prefill_of_them(model):
    prompt = _prompt(2, 320)
    snap = SnapKVCache(compression_ratio=0.5)
    model(prompt, **{cache_kwarg(model): snap}, use_cache=True)
    loaded = KIVICache(nbits=4, group_size=32, residual_length=64)
    loaded.load(
        [(layer.keys, layer.values) for layer in snap.layers]
    )  # SnapKV's kept float K/V, quantized once
    composed = KIVISnapKVCache(nbits=4, group_size=32, residual_length=64, compression_ratio=0.5)
    model(prompt, **{cache_kwarg(model): composed}, use_cache=True)
    assert composed.evicted_tokens() == 160 and composed.get_seq_length() == 320
    for a, b in zip(composed.layers, loaded.layers):
        assert a.state.quantized_tokens == b.state.quantized_tokens > 0
        for x, y in zip(a.state.dequantize_prefix(), b.state.dequantize_prefix()):
            assert torch.equal(x, y)
        assert torch.equal(a.state.key_residual, b.state.key_residual)
    assert composed.nbytes_breakdown() == loaded.nbytes_breakdown()


def test_kivi4_with_snapkv_half_is_under_018x_bf16_dynamic_at_4096_tokens(model):
    bf16 = make_tiny_qwen2(head_dim=32, max_positions=4200, dtype=torch.bfloat16)
    kvlab.attention.enable(bf16)
    prompt = _prompt(1, 4096, seed=1)
    dynamic = DynamicCache()
    bf16(prompt, **{cache_kwarg(bf16): dynamic}, use_cache=True, logits_to_keep=1)
    composed = resolve("kivi-4:compression_ratio=0.5").make(bf16.config)
    bf16(prompt, **{cache_kwarg(bf16): composed}, use_cache=True, logits_to_keep=1)
    ratio = cache_nbytes(composed) / cache_nbytes(dynamic)
    assert ratio <= 0.18, ratio
    assert composed.evicted_tokens() == 2048


@pytest.mark.parametrize("attention", ["dequantize", "fused"])
def test_decoding_runs_on_both_attention_paths(model, attention):
    prompt = _prompt(2, 200, seed=2)
    cache = KIVISnapKVCache(
        nbits=4, group_size=32, residual_length=32, compression_ratio=0.5, attention=attention
    )
    out = model.generate(
        prompt, **{cache_kwarg(model): cache}, max_new_tokens=40, do_sample=False, pad_token_id=0
    )
    assert out.shape == (2, 240) and cache.get_seq_length() == 239
    assert cache.layers[0].state.total_tokens == 100 + 39  # kept prompt + decoded tokens
    ref = KIVICache(nbits=4, group_size=32, residual_length=32, attention=attention)
    model.generate(prompt, **{cache_kwarg(model): ref}, max_new_tokens=40, do_sample=False, pad_token_id=0)
    assert cache.nbytes() < ref.nbytes()


def test_a_model_without_kvlab_attention_is_refused():
    plain = make_tiny_qwen2(head_dim=32, max_positions=512)
    with pytest.raises(RuntimeError, match=r"kvlab.attention.enable\(model\)"):
        plain(
            _prompt(1, 96),
            **{cache_kwarg(plain): KIVISnapKVCache(nbits=4, compression_ratio=0.5)},
            use_cache=True,
        )


def test_registry_name_and_bad_ratio():
    r = resolve("kivi-4:compression_ratio=0.5")
    assert r.uses_kvlab_attention and r.describe()["compression_ratio"] == 0.5
    assert isinstance(resolve("kivi-2:token_budget=64").make(None), KIVISnapKVCache)
    assert not isinstance(resolve("kivi-4").make(None), KIVISnapKVCache)  # no setting: plain KIVI
    with pytest.raises(ValueError, match=r"`compression_ratio` must be in \(0, 1\), got 2"):
        resolve("kivi-4:compression_ratio=2")
