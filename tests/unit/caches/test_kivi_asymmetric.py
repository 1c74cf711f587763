"""KIVICache with different key and value bits (``kivi-k8v4``): each half stored at its own width, the fused path
refusing the combination by name, and bad widths named."""

import pytest
import torch
from transformers import DynamicCache

from kvlab.caches import KIVICache
from kvlab.caches.registry import resolve
from kvlab.runtime.hf_api import cache_kwarg

TOKENS, G, R = 100, 16, 32


def _prefill(model, cache, tokens=TOKENS, batch=2):
    ids = torch.randint(1, 256, (batch, tokens), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        model(ids, use_cache=True, **{cache_kwarg(model): cache})
    return cache


@pytest.mark.parametrize("key_bits, value_bits", [(8, 4), (4, 2), (2, 8), (4, 4)])
def test_key_and_value_bits_reach_their_own_storage(tiny_qwen2, key_bits, value_bits):
    """Bytes of each half: Q quantized tokens x head_dim x bits / 8, per layer, batch row and KV head."""
    cache = _prefill(
        tiny_qwen2, KIVICache(key_bits=key_bits, value_bits=value_bits, group_size=G, residual_length=R)
    )
    cfg = tiny_qwen2.config
    q = (TOKENS - R) // G * G
    rows = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads  # layers x batch x KV heads
    parts = cache.nbytes_breakdown()
    assert parts["key_codes"] == rows * q * cfg.head_dim * key_bits // 8
    assert parts["value_codes"] == rows * q * cfg.head_dim * value_bits // 8
    assert parts["codes"] == parts["key_codes"] + parts["value_codes"]
    block = cache.layers[0].state.blocks[0]
    assert block.k_codes.shape[-1] == cfg.head_dim * key_bits // 8
    assert block.v_codes.shape[-1] == cfg.head_dim * value_bits // 8


def test_more_key_bits_lower_the_key_error_only(tiny_qwen2):
    """k8v4 keys are as close to the float keys as kivi-8's; its values as close as kivi-4's."""
    ref = _prefill(tiny_qwen2, DynamicCache())

    def errors(cache):
        k, v = _prefill(tiny_qwen2, cache).layers[0].state.dequantize_prefix()
        q = k.shape[-2]
        return (
            float((k - ref.layers[0].keys[:, :, :q]).abs().max()),
            float((v - ref.layers[0].values[:, :, :q]).abs().max()),
        )

    k8v4 = errors(KIVICache(key_bits=8, value_bits=4, group_size=G, residual_length=R))
    k8 = errors(KIVICache(nbits=8, group_size=G, residual_length=R))
    k4 = errors(KIVICache(nbits=4, group_size=G, residual_length=R))
    assert k8v4[0] == k8[0] and k8v4[1] == k4[1]
    assert k8v4[0] < k4[0] / 4


def test_names_read_key_and_value_bits():
    cache = resolve("kivi-k8v4").make(None)
    assert (cache.kivi_config.key_bits, cache.kivi_config.value_bits, cache.kivi_config.nbits) == (8, 4, None)
    assert resolve("kivi-k4v4").name.canonical == "kivi-4"
    assert "key_bits=8, value_bits=4" in repr(cache)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"key_bits": 3}, r"`key_bits` must be one of \[2, 4, 8\], got 3"),
        ({"value_bits": 16}, r"`value_bits` must be one of \[2, 4, 8\], got 16"),
        ({"key_bits": 8, "value_bits": True}, r"`value_bits` must be one of \[2, 4, 8\], got True"),
        ({"nbits": 5}, r"`nbits` must be one of \[2, 4, 8\], got 5"),
        (
            {"key_bits": 8, "value_bits": 4, "attention": "fused"},
            r"key_bits=8, value_bits=4 \(kivi-k8v4\) is not supported yet: use attention='dequantize'",
        ),
    ],
)
def test_bad_bits_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KIVICache(**kwargs)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("kivi-k8v3", r"needs key and value bits in \[2, 4, 8\], got k8v3"),
        ("kivi-k8v4-fused", r"kivi-k8v4\) is not supported yet"),
        ("hqq-k8v4", "takes one bit width for keys and values, got k8v4"),
        ("paged-k8v4", "takes no bits, got k8v4"),
    ],
)
def test_bad_names_are_named(name, match):
    with pytest.raises(ValueError, match=match):
        resolve(name).make(None)


def test_an_nbits_both_widths_contradict_is_refused():
    """KIVICache(nbits=2, key_bits=8, value_bits=8) was an 8-bit cache, nbits dropped without a word."""
    with pytest.raises(ValueError, match=r"`nbits`=2 conflicts with key_bits=8, value_bits=8"):
        KIVICache(nbits=2, key_bits=8, value_bits=8)
    assert KIVICache(nbits=8, key_bits=8, value_bits=8).kivi_config.nbits == 8  # consistent: fine
    assert KIVICache(key_bits=8).kivi_config.value_bits == 4  # one width given: the other takes nbits (4)
    assert KIVICache(nbits=2, key_bits=8).kivi_config.value_bits == 2
    assert KIVICache().kivi_config.nbits == 4
