"""Fused KIVI attention equals dequantize-then-attention; in generate() it equals the dequantize path."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

import kvlab.attention as kvattn
import kvlab.attention.torch_kivi as torch_kivi
from kvlab.attention.quantized import kivi_attention
from kvlab.caches import KIVICache
from kvlab.quant import KIVIConfig, KIVIState
from kvlab.runtime.hf_api import cache_kwarg


def reference(query, keys, values, scaling, mask):
    """Float attention with repeated KV heads; ``mask`` bool [B,1,q,kv] (True = attend)."""
    g = query.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(g, dim=1).float()
    v = values.repeat_interleave(g, dim=1).float()
    scores = query.float() @ k.transpose(-1, -2) * scaling
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@given(
    batch=st.integers(1, 2),
    kv_heads=st.sampled_from([1, 2]),
    groups=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([16, 32]),
    nbits=st.sampled_from([2, 4, 8]),
    group=st.sampled_from([4, 8, 16]),
    residual_groups=st.integers(0, 2),
    prefix=st.integers(0, 70),
    q_len=st.integers(1, 5),
    block=st.sampled_from([16, 32, 1024]),
    padded=st.booleans(),
    seed=st.integers(0, 999),
    online=st.booleans(),
    chunk=st.sampled_from([4, 8, 1024]),
    backend=st.sampled_from(
        ["auto", "torch"]
    ),  # auto: the compiled CPU kernel for decode sizes when it builds
)
@settings(max_examples=60, deadline=None)
def test_fused_equals_dequantize_then_attention(
    batch,
    kv_heads,
    groups,
    head_dim,
    nbits,
    group,
    residual_groups,
    prefix,
    q_len,
    block,
    padded,
    seed,
    online,
    chunk,
    backend,
):
    torch.manual_seed(seed)
    cfg = KIVIConfig(
        nbits=nbits,
        group_size=group,
        residual_length=residual_groups * group,
        block_tokens=max(block // group, 1) * group,
    )
    state = KIVIState(cfg)
    k0, v0 = (
        torch.randn(batch, kv_heads, prefix + 1, head_dim),
        torch.randn(batch, kv_heads, prefix + 1, head_dim),
    )
    state.append(k0, v0)  # history: some of it quantized, the rest in the residual window
    segments = list(state.segments())
    deq = state.dequantize_prefix()
    k_new, v_new = (
        torch.randn(batch, kv_heads, q_len, head_dim),
        torch.randn(batch, kv_heads, q_len, head_dim),
    )
    kw, vw = state.append(k_new, v_new)  # window = old residual + new tokens
    total = (0 if deq is None else deq[0].shape[-2]) + kw.shape[-2]
    keys = kw if deq is None else torch.cat([deq[0], kw], dim=-2)
    values = vw if deq is None else torch.cat([deq[1], vw], dim=-2)
    assert keys.shape[-2] == total
    query = torch.randn(batch, kv_heads * groups, q_len, head_dim)
    past = total - q_len
    causal = torch.arange(total)[None, :] <= (past + torch.arange(q_len))[:, None]  # [q, kv]
    mask = causal[None, None].expand(batch, 1, q_len, total).clone()
    if padded and batch > 1:
        mask[1, :, :, : min(3, past)] = False  # left padding of row 1
    scale = head_dim**-0.5
    ref = reference(query, keys, values, scale, mask)
    saved, saved_chunk = torch_kivi.TWO_PASS_MAX_SCORES, torch_kivi.CHUNK_TOKENS
    torch_kivi.TWO_PASS_MAX_SCORES = 0 if online else saved  # both the online-softmax and two-pass paths
    torch_kivi.CHUNK_TOKENS = chunk  # blocks unpacked whole or in chunks
    try:
        got = kivi_attention(
            query, segments, kw, vw, nbits, group, scale, attention_mask=mask, backend=backend
        )
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
        if not padded:  # mask=None must apply the same causal rule inside the window
            got_none = kivi_attention(
                query, segments, kw, vw, nbits, group, scale, attention_mask=None, backend=backend
            )
            torch.testing.assert_close(got_none, ref, rtol=1e-4, atol=1e-4)
    finally:
        torch_kivi.TWO_PASS_MAX_SCORES, torch_kivi.CHUNK_TOKENS = saved, saved_chunk


def test_additive_float_mask_accepted():
    torch.manual_seed(0)
    state = KIVIState(KIVIConfig(4, 8, 8))
    state.append(torch.randn(1, 1, 40, 16), torch.randn(1, 1, 40, 16))
    segs = list(state.segments())
    kw, vw = state.append(torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16))
    q = torch.randn(1, 2, 1, 16)
    n = state.total_tokens
    bool_mask = torch.ones(1, 1, 1, n, dtype=torch.bool)
    bool_mask[..., :5] = False
    float_mask = torch.zeros(1, 1, 1, n).masked_fill(~bool_mask, torch.finfo(torch.float32).min)
    a = kivi_attention(q, segs, kw, vw, 4, 8, 0.25, attention_mask=bool_mask)
    b = kivi_attention(q, segs, kw, vw, 4, 8, 0.25, attention_mask=float_mask)
    torch.testing.assert_close(a, b)


def _greedy(model, ids, cache, mask):
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=20,
            min_new_tokens=20,
            do_sample=False,
            **{cache_kwarg(model): cache},
            pad_token_id=0,
        )


def test_fused_generate_matches_dequantize_path(tiny_qwen2):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 256, (2, 70), generator=g)
    mask = torch.ones_like(ids)
    ids[1, :4], mask[1, :4] = 0, 0
    tiny_qwen2.set_attn_implementation("sdpa")
    deq = _greedy(tiny_qwen2, ids, KIVICache(nbits=2, group_size=16, residual_length=16), mask)
    ref = _greedy(tiny_qwen2, ids, DynamicCache(), mask)
    try:
        kvattn.enable(tiny_qwen2)
        assert torch.equal(_greedy(tiny_qwen2, ids, DynamicCache(), mask), ref)  # SDPA fallback is exact
        fused = _greedy(
            tiny_qwen2, ids, KIVICache(nbits=2, group_size=16, residual_length=16, attention="fused"), mask
        )
    finally:
        tiny_qwen2.set_attn_implementation("sdpa")
    assert torch.equal(fused, deq)


def test_fused_without_kvlab_attention_raises_before_a_wrong_step(tiny_qwen2):
    tiny_qwen2.set_attn_implementation("sdpa")
    ids = torch.randint(1, 256, (1, 40))
    with pytest.raises(RuntimeError, match=r"kvlab.attention.enable\(model\)"):
        _greedy(
            tiny_qwen2,
            ids,
            KIVICache(nbits=4, group_size=16, residual_length=16, attention="fused"),
            torch.ones_like(ids),
        )


def test_bad_attention_mode_named():
    with pytest.raises(ValueError, match="got 'flash'"):
        KIVICache(attention="flash")


def test_sdpa_reference_sanity():
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    torch.testing.assert_close(reference(q, k, v, 8**-0.5, mask), F.scaled_dot_product_attention(q, k, v))


def test_unknown_backend_named():
    q = torch.randn(1, 2, 1, 16)
    kw = torch.randn(1, 1, 3, 16)
    with pytest.raises(ValueError, match="got 'cuda-magic'"):
        kivi_attention(q, [], kw, kw, 4, 8, 0.25, backend="cuda-magic")


@pytest.mark.parametrize("threads", [1, 2])
def test_attention_leaves_the_thread_count_as_it_found_it(threads):
    """Small decode problems run on one intra-op thread; the caller's setting is restored, also after an error."""
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        state = KIVIState(KIVIConfig(4, 8, 8))
        state.append(torch.randn(1, 1, 40, 16), torch.randn(1, 1, 40, 16))
        segs = list(state.segments())
        kw, vw = state.append(torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16))
        kivi_attention(torch.randn(1, 2, 1, 16), segs, kw, vw, 4, 8, 0.25)
        assert torch.get_num_threads() == threads
        bad_mask = torch.ones(1, 2, 1, state.total_tokens, dtype=torch.bool)  # per-head masks are rejected
        with pytest.raises(ValueError, match="per-head"):
            kivi_attention(torch.randn(1, 2, 1, 16), segs, kw, vw, 4, 8, 0.25, attention_mask=bad_mask)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("nbits", [2, 4, 8])
@pytest.mark.parametrize("head_dim,groups", [(64, 2), (128, 4), (256, 8)])
def test_fused_matches_reference_at_real_head_dims(nbits, head_dim, groups, backend):
    """Head dims and GQA ratios of real models (the hypothesis test stays small). The shift-free unpacking
    rescales the query side by up to 2^b per part, so fp32 round-off grows a little with head_dim: 5e-4."""
    torch.manual_seed(nbits * head_dim)
    cfg = KIVIConfig(nbits=nbits, group_size=32, residual_length=64)
    state = KIVIState(cfg)
    state.append(torch.randn(2, 2, 700, head_dim), torch.randn(2, 2, 700, head_dim))
    segments, deq = list(state.segments()), state.dequantize_prefix()
    kw, vw = state.append(torch.randn(2, 2, 1, head_dim), torch.randn(2, 2, 1, head_dim))
    keys, values = torch.cat([deq[0], kw], dim=-2), torch.cat([deq[1], vw], dim=-2)
    query = torch.randn(2, 2 * groups, 1, head_dim)
    mask = torch.ones(2, 1, 1, keys.shape[-2], dtype=torch.bool)
    mask[1, ..., :5] = False  # left padding of row 1
    scale = head_dim**-0.5
    got = kivi_attention(query, segments, kw, vw, nbits, 32, scale, attention_mask=mask, backend=backend)
    torch.testing.assert_close(got, reference(query, keys, values, scale, mask), rtol=5e-4, atol=5e-4)


@pytest.mark.parametrize("tokens", [32, 96, 896, 4064, 4096, 16384])
@pytest.mark.parametrize("chunk", [32, 256, 448, 1024, 4096])
def test_chunks_are_few_balanced_and_cover_the_block(tokens, chunk):
    """A block is cut into as few chunks as the largest chunk allows, of balanced sizes (multiples of G)."""
    step = torch_kivi._chunk_step(tokens, chunk, 32)
    count = -(-tokens // step)
    assert step % 32 == 0 and 0 < step <= chunk
    assert count == -(-tokens // chunk)  # no more chunks than needed
    last = tokens - (count - 1) * step
    assert 0 < last and step - last < count * 32  # balanced: only whole-group rounding, no small remainder
    if (tokens, chunk) == (896, 256):
        assert step == 224  # 4 x 224, not 256 + 256 + 256 + 128


def test_chunk_never_below_the_tile_floor_nor_above_the_cap():
    """The tile is at least MIN_TILE_BYTES (fewer operators at short contexts) and at most MAX_CHUNK_TOKENS."""
    token_bytes = 2 * 64 * 4 // 2  # B*H = 2, head_dim 64, 4 bits: 32 bytes a head, fp32
    c = torch_kivi.chunk_tokens(1024, 4, 32, token_bytes)
    assert c * token_bytes >= torch_kivi.MIN_TILE_BYTES - 32 * token_bytes
    assert c > torch_kivi.chunk_tokens(1024, 4, 32)  # without the floor: 1/8 of the layer
    assert torch_kivi.chunk_tokens(1 << 20, 4, 32, token_bytes) == torch_kivi.MAX_CHUNK_TOKENS
