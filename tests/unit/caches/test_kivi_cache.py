"""KIVICache inside generate(): exactness at 8 bits with a long residual, batch 2, bytes, bad settings."""

import pytest
import torch
from transformers import DynamicCache, Qwen2Config

from kvlab.caches import KIVICache, cache_nbytes
from kvlab.runtime.hf_api import cache_kwarg


def greedy(model, ids, cache, n=24, mask=None):
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            **{cache_kwarg(model): cache},
            pad_token_id=0,
        )


def test_8bit_with_long_residual_equals_dynamic(tiny_qwen2):
    ids = torch.randint(1, 256, (1, 40), generator=torch.Generator().manual_seed(1))
    ref = greedy(tiny_qwen2, ids, DynamicCache())
    cache = KIVICache(nbits=8, group_size=32, residual_length=128)
    out = greedy(tiny_qwen2, ids, cache)
    assert torch.equal(out, ref)
    assert cache.quantized_tokens() == 0


def test_batch_two_with_left_padding(tiny_qwen2):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 256, (2, 48), generator=g)
    mask = torch.ones_like(ids)
    ids[1, :7] = 0
    mask[1, :7] = 0
    ref = greedy(tiny_qwen2, ids, DynamicCache(), mask=mask)
    exact = greedy(tiny_qwen2, ids, KIVICache(nbits=8, group_size=32, residual_length=256), mask=mask)
    assert torch.equal(exact, ref)
    cache = KIVICache(nbits=4, group_size=16, residual_length=16)
    out = greedy(tiny_qwen2, ids, cache, mask=mask)
    assert out.shape == ref.shape
    assert cache.quantized_tokens() == ((48 + 23 - 16) // 16) * 16  # 23 appended K/V before the last token
    assert cache.layers[0].state.key_residual.shape[0] == 2


def test_quantized_generation_close_to_dynamic(tiny_qwen2):
    ids = torch.randint(1, 256, (1, 96), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = tiny_qwen2(ids).logits[:, -1]
        cache = KIVICache(nbits=4, group_size=32, residual_length=32)
        tiny_qwen2(ids[:, :-1], **{cache_kwarg(tiny_qwen2): cache})
        got = tiny_qwen2(ids[:, -1:], **{cache_kwarg(tiny_qwen2): cache}).logits[:, -1]
    assert cache.quantized_tokens() == 64
    rel = (got - ref).abs().max() / ref.abs().max()
    assert 0 < rel < 0.2  # quantization changes the logits, but not wildly


def test_nbytes_equals_formula_and_beats_dynamic(tiny_qwen2):
    ids = torch.randint(1, 256, (2, 300), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        dyn = DynamicCache()
        tiny_qwen2(ids, **{cache_kwarg(tiny_qwen2): dyn})
        kivi = KIVICache(nbits=2, group_size=32, residual_length=64)
        tiny_qwen2(ids, **{cache_kwarg(tiny_qwen2): kivi})
    layers, b, h, d, t, p, m = 2, 2, 2, 32, 300, 4, 4  # fp32 model: 4-byte metadata
    q = (t - 64) // 32 * 32
    expect = layers * b * h * (2 * q * d * 2 // 8 + 4 * m * q * d // 32 + 2 * (t - q) * d * p)
    assert kivi.nbytes() == expect
    bd = kivi.nbytes_breakdown()
    assert bd["codes"] + bd["scales_zeros"] + bd["residual"] == bd["total"] == expect
    assert cache_nbytes(dyn) == layers * b * h * t * d * p * 2
    assert cache_nbytes(kivi) == expect < cache_nbytes(dyn)


def test_group_size_not_dividing_head_dim_fails_at_first_update():
    cache = KIVICache(nbits=4, group_size=64, residual_length=128)
    k = torch.randn(1, 2, 5, 96)
    with pytest.raises(ValueError, match=r"`group_size` \(64\) must divide head_dim \(96\)"):
        cache.update(k, k.clone(), 0)


def test_group_size_checked_at_construction_with_config():
    cfg = Qwen2Config(
        hidden_size=192, num_attention_heads=2, num_key_value_heads=1, head_dim=96, num_hidden_layers=1
    )
    with pytest.raises(ValueError, match=r"head_dim \(96\)"):
        KIVICache(nbits=4, group_size=64, residual_length=128, config=cfg)


@pytest.mark.parametrize(
    "kwargs,msg",
    [
        ({"nbits": 3}, r"`nbits` must be one of \[2, 4, 8\], got 3"),
        ({"residual_length": 100}, r"`residual_length` \(100\) must be a multiple of `group_size` \(32\)"),
        ({"group_size": 0}, r"`group_size` must be an int >= 1, got 0"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        KIVICache(**kwargs)


def test_sliding_window_model_rejected():
    cfg = Qwen2Config(
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        use_sliding_window=True,
        sliding_window=64,
    )
    with pytest.raises(ValueError, match="sliding_attention"):
        KIVICache(config=cfg)


@pytest.mark.parametrize("attention", ["dequantize", "fused"])
def test_load_equals_a_single_chunk_prefill_and_decodes(tiny_qwen2, attention):
    """``load`` writes a DynamicCache prefill into a KIVICache; the next forward (fused included) works and gives
    the logits of a cache that saw the same prefill through the model."""
    import kvlab.attention

    ids = torch.randint(1, 256, (1, 90), generator=torch.Generator().manual_seed(4))
    kvlab.attention.enable(tiny_qwen2)
    try:
        with torch.no_grad():
            source = DynamicCache()
            tiny_qwen2(input_ids=ids[:, :-1], **{cache_kwarg(tiny_qwen2): source}, use_cache=True)
            direct = KIVICache(nbits=4, group_size=16, residual_length=32, attention=attention)
            tiny_qwen2(input_ids=ids[:, :-1], **{cache_kwarg(tiny_qwen2): direct}, use_cache=True)
            loaded = KIVICache(nbits=4, group_size=16, residual_length=32, attention=attention)
            loaded.load((layer.keys, layer.values) for layer in source.layers)
            assert loaded.get_seq_length() == direct.get_seq_length() == 89
            assert loaded.nbytes_breakdown() == direct.nbytes_breakdown()
            a = tiny_qwen2(input_ids=ids[:, -1:], **{cache_kwarg(tiny_qwen2): direct}, use_cache=True).logits
            b = tiny_qwen2(input_ids=ids[:, -1:], **{cache_kwarg(tiny_qwen2): loaded}, use_cache=True).logits
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)
    finally:
        tiny_qwen2.set_attn_implementation("sdpa")


def test_load_rejects_more_layers_than_the_model_has(tiny_qwen2):
    cfg = tiny_qwen2.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache = KIVICache(group_size=8, residual_length=8, config=cfg)
    n = len(cache.layers)
    kv = torch.randn(1, cfg.num_key_value_heads, 4, head_dim)
    with pytest.raises(ValueError, match=f"layer {n} is beyond this cache's {n} layers"):
        cache.load([(kv, kv)] * (n + 1))
