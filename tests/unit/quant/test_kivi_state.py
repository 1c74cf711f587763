"""KIVI state: residual window, G-aligned flushes, streaming == bulk, no rewriting, token conservation."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.quant import KIVIConfig, KIVIState, quantize_groups


def kv(t, b=1, h=2, d=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, t, d, generator=g).to(dtype), torch.randn(b, h, t, d, generator=g).to(dtype)


def codes_and_meta(state):
    return [
        tuple(t.clone() for t in (s.k_codes, s.k_scale, s.k_zero, s.v_codes, s.v_scale, s.v_zero))
        for s in state.segments()
    ]


@pytest.mark.parametrize("r,g", [(6, 4), (10, 8), (5, 2)])
def test_residual_must_be_multiple_of_group(r, g):
    with pytest.raises(
        ValueError, match=rf"`residual_length` \({r}\) must be a multiple of `group_size` \({g}\)"
    ):
        KIVIConfig(nbits=4, group_size=g, residual_length=r)


@pytest.mark.parametrize("nbits", [1, 3, 5, 16])
def test_unsupported_nbits(nbits):
    with pytest.raises(ValueError, match=rf"got {nbits}"):
        KIVIConfig(nbits=nbits)


def test_five_token_prefill_keeps_everything_exact():
    state = KIVIState(KIVIConfig(nbits=2, group_size=4, residual_length=8))
    k, v = kv(5)
    kw, vw = state.append(k, v)
    assert state.quantized_tokens == 0
    assert torch.equal(kw, k) and torch.equal(vw, v)
    assert torch.equal(state.key_residual, k) and torch.equal(state.value_residual, v)


def test_twelve_token_prefill_quantizes_exactly_tokens_0_to_3():
    state = KIVIState(KIVIConfig(nbits=2, group_size=4, residual_length=8))
    k, v = kv(12)
    state.append(k, v)
    assert state.quantized_tokens == 4 and state.residual_tokens == 8
    assert torch.equal(state.key_residual, k[..., 4:, :])
    assert torch.equal(state.value_residual, v[..., 4:, :])
    (seg,) = list(state.segments())
    ref_k = quantize_groups(k[..., :4, :], 2, 4, axis=-2)
    ref_v = quantize_groups(v[..., :4, :], 2, 4, axis=-1)
    assert torch.equal(seg.k_codes, ref_k.codes) and torch.equal(seg.k_scale, ref_k.scale)
    assert torch.equal(seg.v_codes, ref_v.codes) and torch.equal(seg.v_zero, ref_v.zero)


def test_prefill_then_single_token_appends():
    state = KIVIState(KIVIConfig(nbits=4, group_size=4, residual_length=4))
    k, v = kv(16)
    state.append(k[..., :4, :], v[..., :4, :])
    for t in range(4, 16):
        state.append(k[..., t : t + 1, :], v[..., t : t + 1, :])
    assert state.quantized_tokens == 12 and state.residual_tokens == 4
    assert torch.equal(state.key_residual, k[..., 12:, :])


@given(
    total=st.integers(1, 90),
    g=st.sampled_from([2, 4, 8]),
    r_groups=st.integers(0, 3),
    nbits=st.sampled_from([2, 4, 8]),
    chunks=st.lists(st.integers(1, 9), min_size=1, max_size=30),
    block=st.sampled_from([None, 8, 16]),
)
@settings(max_examples=60, deadline=None)
def test_streaming_equals_bulk_and_conserves_tokens(total, g, r_groups, nbits, chunks, block):
    cfg = KIVIConfig(
        nbits=nbits,
        group_size=g,
        residual_length=r_groups * g,
        block_tokens=None if block is None else max(block // g, 1) * g,
    )
    k, v = kv(total, d=8, seed=total)
    bulk = KIVIState(cfg)
    bulk.append(k, v)
    stream = KIVIState(cfg)
    t = 0
    i = 0
    while t < total:
        n = min(chunks[i % len(chunks)], total - t)
        before = codes_and_meta(stream)
        prev_k = None if stream.key_residual is None else stream.key_residual.clone()
        prev_v = None if stream.value_residual is None else stream.value_residual.clone()
        kw, vw = stream.append(k[..., t : t + n, :], v[..., t : t + n, :])
        # the window is the residual before the call followed by the new tokens (in place or not)
        assert torch.equal(
            kw, k[..., t : t + n, :] if prev_k is None else torch.cat((prev_k, k[..., t : t + n, :]), -2)
        )
        assert torch.equal(
            vw, v[..., t : t + n, :] if prev_v is None else torch.cat((prev_v, v[..., t : t + n, :]), -2)
        )
        t += n
        i += 1
        # quantized data already written is never rewritten
        after = codes_and_meta(stream)
        for old, new in zip(before, after):
            for a, b in zip(old, new):
                assert torch.equal(a, b[..., : a.shape[-2], :])
        assert stream.total_tokens == t  # conservation
        assert stream.quantized_tokens == cfg.quantized_tokens(t)  # the flush rule holds after every append
    assert stream.quantized_tokens == bulk.quantized_tokens == cfg.quantized_tokens(total)
    assert torch.equal(stream.key_residual, bulk.key_residual)
    sk, sv = stream.dequantize_prefix() or (None, None)
    bk, bv = bulk.dequantize_prefix() or (None, None)
    if sk is not None:
        assert torch.equal(sk, bk) and torch.equal(sv, bv)


def test_streaming_codes_identical_to_bulk_codes():
    cfg = KIVIConfig(nbits=4, group_size=4, residual_length=4, block_tokens=8)
    k, v = kv(30, seed=3)
    bulk, stream = KIVIState(cfg), KIVIState(cfg)
    bulk.append(k, v)
    for t in range(30):
        stream.append(k[..., t : t + 1, :], v[..., t : t + 1, :])
    for i in range(6):  # k_codes, k_scale, k_zero, v_codes, v_scale, v_zero
        joined = [torch.cat([seg[i] for seg in codes_and_meta(s)], dim=-2) for s in (bulk, stream)]
        assert torch.equal(*joined)


def test_nbytes_breakdown_matches_ledger_formula():
    cfg = KIVIConfig(nbits=4, group_size=32, residual_length=128)
    b, h, d, t = 2, 2, 64, 1000
    k, v = kv(t, b=b, h=h, d=d, dtype=torch.bfloat16)
    state = KIVIState(cfg)
    state.append(k, v)
    q = cfg.quantized_tokens(t)
    m, p = 2, 2
    per_row_head = 2 * q * d * 4 // 8 + 2 * m * q * d // 32 + 2 * m * q * d // 32 + 2 * (t - q) * d * p
    assert state.nbytes_breakdown()["total"] == b * h * per_row_head
    assert state.nbytes_breakdown()["codes"] == b * h * 2 * q * d * 4 // 8


def test_shape_change_rejected():
    state = KIVIState(KIVIConfig(nbits=4, group_size=4, residual_length=4))
    state.append(*kv(3))
    with pytest.raises(ValueError, match="do not match the cache"):
        state.append(*kv(1, h=3))


def test_decode_appends_write_the_window_in_place():
    """After the prefill, single-token appends reuse one residual storage of R + G tokens: the window handed to
    attention is a view of it (no per-step copy), and the spare capacity is reported as allocated, not stored."""
    cfg = KIVIConfig(nbits=4, group_size=4, residual_length=8)
    state = KIVIState(cfg)
    k, v = kv(40, seed=7)
    state.append(k[..., :20, :], v[..., :20, :])
    storage = state.key_residual.untyped_storage().data_ptr()
    for t in range(20, 40):
        kw, _ = state.append(k[..., t : t + 1, :], v[..., t : t + 1, :])
        assert kw.untyped_storage().data_ptr() == storage
        assert torch.equal(state.key_residual, k[..., cfg.quantized_tokens(t + 1) : t + 1, :])
    info = state.nbytes_breakdown()
    per_token = 2 * 1 * 2 * 8 * 4  # K and V, batch 1, 2 heads, head_dim 8, fp32
    assert info["residual"] == state.residual_tokens * per_token
    blocks = sum(t.numel() * t.element_size() for b in state.blocks for t in b.tensors())
    spare = blocks - info["codes"] - info["scales_zeros"]
    assert (
        info["allocated_unused"]
        == spare + (cfg.residual_length + cfg.group_size - state.residual_tokens) * per_token
    )


def test_residual_storage_grows_with_the_tokens_not_with_residual_length():
    """A huge residual_length must not allocate R + G tokens of storage up front: a 3-token prompt under
    R = 2**40 holds 3 tokens (no allocation failure), and storage grows geometrically, capped at R + G."""
    state = KIVIState(KIVIConfig(nbits=4, group_size=32, residual_length=2**40))
    k, v = kv(3, d=32)
    state.append(k, v)
    assert state._kbuf.shape[-2] == 32  # max(2 * tokens, G), not R + G
    cfg = KIVIConfig(nbits=4, group_size=4, residual_length=64)
    state = KIVIState(cfg)
    k, v = kv(200, seed=3)
    state.append(k[..., :2, :], v[..., :2, :])
    for t in range(2, 200):
        kw, _ = state.append(k[..., t : t + 1, :], v[..., t : t + 1, :])
        assert torch.equal(kw[..., -1:, :], k[..., t : t + 1, :])
        assert torch.equal(state.key_residual, k[..., cfg.quantized_tokens(t + 1) : t + 1, :])
        assert state._kbuf.shape[-2] <= max(2 * state.residual_tokens, cfg.group_size)
        assert state._kbuf.shape[-2] <= cfg.residual_length + cfg.group_size
    assert state._kbuf.shape[-2] == cfg.residual_length + cfg.group_size
