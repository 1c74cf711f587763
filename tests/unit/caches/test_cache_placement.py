"""Caches follow the states they receive: every stored tensor on the device of that layer's K/V, in their dtype.

transformers' convention (``CacheLayerMixin.lazy_initialization``): a layer allocates at its first update, from
the key/value states it is given, so a model split over devices (``device_map="auto"``) keeps each layer's cache
next to that layer, and a model moved or cast between ``generate()`` calls gets a cache in its new placement.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from kvlab.caches import KIVICache, PagedCache
from kvlab.caches.measure import _tensors
from kvlab.caches.registry import CacheSettings, cache_names, resolve
from kvlab.quant.codec import metadata_dtypes
from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[CUDA, pytest.mark.gpu])]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SETTINGS = CacheSettings(group_size=32, residual_length=32, hqq_group_size=32, block_size=16)


def _stored(cache_or_layer) -> list[torch.Tensor]:
    """Every distinct tensor reachable from a cache or a layer (the byte counter's walk)."""
    return list(_tensors(cache_or_layer, set()))


def _states(tokens: int, dtype: torch.dtype, device: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    k, v = torch.randn(2, 1, 2, tokens, 64, generator=gen)  # [batch 1, kv_heads 2, tokens, head_dim 64] each
    return k.to(device=device, dtype=dtype), v.to(device=device, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kivi_stores_codes_metadata_and_residual_like_its_states(dtype, device):
    cache = KIVICache(nbits=4, group_size=32, residual_length=32)
    for step, tokens in enumerate((80, 1, 1)):  # prefill flushes 32 tokens into codes; two decode steps
        keys, values = _states(tokens, dtype, device, seed=step)
        k_out, v_out = cache.update(keys, values, 0)
        assert (k_out.dtype, k_out.device, v_out.dtype, v_out.device) == (
            dtype,
            keys.device,
            dtype,
            keys.device,
        )
    state = cache.layers[0].state
    assert state.quantized_tokens > 0 and state.blocks  # the metadata below exists
    scale_dtype, zero_dtype = metadata_dtypes(dtype)
    assert state.key_residual.dtype == state.value_residual.dtype == dtype
    for block in state.blocks:
        assert block.k_codes.dtype == block.v_codes.dtype == torch.uint8
        assert block.k_scale.dtype == block.v_scale.dtype == scale_dtype
        assert block.k_zero.dtype == block.v_zero.dtype == zero_dtype
    stored = _stored(cache.layers[0])
    assert stored and {t.device for t in stored} == {keys.device}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_pools_and_block_tables_live_with_the_states(dtype, device):
    cache = PagedCache(block_size=16)
    for step, tokens in enumerate((40, 1)):
        keys, values = _states(tokens, dtype, device, seed=step)
        k_out, _ = cache.update(keys, values, 0)
        assert (k_out.dtype, k_out.device) == (dtype, keys.device)
    layer = cache.layers[0]
    assert layer.keys.dtype == layer.values.dtype == dtype
    stored = _stored(cache)  # pools, block-table and slot-mapping tensors
    assert stored and {t.device for t in stored} == {keys.device}


def test_a_reset_paged_cache_follows_states_of_a_new_dtype_and_refuses_them_while_holding_tokens():
    cache = PagedCache(block_size=16)
    cache.update(*_states(20, torch.float32, "cpu"), 0)
    with pytest.raises(ValueError, match=r"holds 20 tokens as torch.float32.*reset\(\)"):
        cache.update(*_states(1, torch.bfloat16, "cpu"), 0)
    assert cache.get_seq_length() == 20  # refused before anything was written
    cache.reset()
    keys, values = _states(20, torch.bfloat16, "cpu")
    k_out, _ = cache.update(keys, values, 0)
    assert cache.layers[0].keys.dtype == torch.bfloat16
    torch.testing.assert_close(k_out, keys, rtol=0, atol=0)


# ---- a real model moved and cast between generate() calls -----------------------------------------------------
@pytest.fixture(scope="module")
def model():
    """A private tiny Qwen2 (this module moves and casts it) with kvlab attention for the fused KIVI caches."""
    import kvlab.attention

    return kvlab.attention.enable(make_tiny_qwen2(head_dim=32, max_positions=512))


def _generate(model, cache, device):
    ids = torch.randint(1, 256, (2, 40), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=6,
            min_new_tokens=6,
            do_sample=False,
            pad_token_id=0,
            **{cache_kwarg(model): cache},
        )
    return out[:, ids.shape[1] :].cpu()


_MOVES = [("cpu", torch.float32), ("cpu", torch.bfloat16), ("cpu", torch.float32)]
if torch.cuda.is_available():
    _MOVES[1:1] = [("cuda", torch.bfloat16), ("cuda", torch.float32)]


@pytest.mark.parametrize("name", cache_names())
def test_generate_follows_the_model_across_dtypes_and_devices(name, model):
    """fp32 -> bf16 (-> CUDA where present) -> fp32 between generate() calls: a fresh cache and a reset one both
    take the model's new placement, give the same tokens, and exact caches give DynamicCache's. The reset cache is
    checked for kvlab's own classes: transformers before 5.24 zeroes a reset DynamicLayer in its old dtype."""
    resolved = resolve(name, SETTINGS)
    if resolved.unavailable_reason():
        pytest.skip(resolved.unavailable_reason())
    reused = resolved.make(model.config)
    caches = [reused] if type(reused).__module__.startswith("kvlab.") else []
    try:
        for device, dtype in _MOVES:
            model.to(device=device, dtype=dtype)
            fresh = resolved.make(model.config)
            tokens = _generate(model, fresh, device)
            for cache in caches:
                cache.reset()
                assert torch.equal(_generate(model, cache, device), tokens), (name, "reset", device, dtype)
            for cache in [fresh, *caches]:
                assert {t.device.type for t in _stored(cache.layers)} == {device}, (name, device, dtype)
            if resolved.exact:
                assert torch.equal(tokens, _generate(model, DynamicCache(), device)), (name, device, dtype)
    finally:
        model.to(device="cpu", dtype=torch.float32)


# ---- a model split over two devices ---------------------------------------------------------------------------
def _place(module: torch.nn.Module, device: str) -> None:
    """Put ``module`` on ``device`` and move every tensor argument it receives there (what device_map hooks do)."""

    def move(x):
        if isinstance(x, torch.Tensor):
            return x.to(device)
        if isinstance(x, tuple):
            return tuple(move(y) for y in x)
        return x

    module.to(device)
    module.register_forward_pre_hook(
        lambda _m, args, kwargs: (move(args), {k: move(v) for k, v in kwargs.items()}), with_kwargs=True
    )


@CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("make", [KIVICache, lambda: KIVICache(nbits=8, residual_length=512), PagedCache])
def test_a_model_split_over_cuda_and_cpu_keeps_each_layers_cache_on_its_device(make):
    model = make_tiny_qwen2(head_dim=32, max_positions=512)  # 2 layers: layer 0 on CUDA, layer 1 on the CPU
    inner = model.model
    for module, device in (
        (inner.embed_tokens, "cuda"),
        (inner.rotary_emb, "cuda"),
        (inner.layers[0], "cuda"),
    ):
        _place(module, device)
    for module in (inner.layers[1], inner.norm, model.lm_head):
        _place(module, "cpu")
    ids = torch.randint(1, 256, (1, 70), generator=torch.Generator().manual_seed(2))
    kw = cache_kwarg(model)
    cache, reference = make(), DynamicCache()
    with torch.no_grad():
        for chunk in (
            ids[:, :64],
            ids[:, 64:65],
            ids[:, 65:66],
        ):  # prefill (KIVI-4 flushes), two decode steps
            logits = model(input_ids=chunk, use_cache=True, **{kw: cache}).logits
            ref = model(input_ids=chunk, use_cache=True, **{kw: reference}).logits
    for layer_idx, device in enumerate(("cuda", "cpu")):
        assert {t.device.type for t in _stored(cache.layers[layer_idx])} == {device}, layer_idx
    if not isinstance(cache, KIVICache) or cache.kivi_config.residual_length >= ids.shape[1]:  # exact caches
        torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    else:
        assert float((logits - ref).abs().max()) <= 0.05 * float(ref.abs().max())
