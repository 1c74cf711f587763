"""KIVIState.crop: exact in the residual window; into the quantized prefix, whole groups dropped, the kept part of
the cut group restored dequantized, nothing re-quantized; the bytes follow; bad input named, nothing changed."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.quant import KIVIConfig, KIVIState, quantize_groups


def kv(t, b=1, h=2, d=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, t, d, generator=g).to(dtype), torch.randn(b, h, t, d, generator=g).to(dtype)


def visible(state):
    """What the dequantize path hands to attention: the dequantized prefix followed by the residual window."""
    prefix = state.dequantize_prefix()
    if prefix is None:
        return state.key_residual.clone(), state.value_residual.clone()
    return (
        torch.cat((prefix[0], state.key_residual), dim=-2),
        torch.cat((prefix[1], state.value_residual), dim=-2),
    )


def groups(state):
    """Every quantized tensor of the state, concatenated over blocks (codes, scales, zeros of K and V)."""
    segs = list(state.segments())
    if not segs:
        return None
    names = ("k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero")
    return [torch.cat([getattr(s, n) for s in segs], dim=-2).clone() for n in names]


def ledger_bytes(cfg, q, r, b=1, h=2, d=8, p=4, m=4):
    """KIVI byte ledger (kvlab.quant.kivi module docstring) for Q quantized and r residual tokens, fp32."""
    per_head = 2 * q * d * cfg.nbits // 8 + 2 * m * q * d // cfg.group_size * 2 + 2 * r * d * p
    return b * h * per_head


def filled(cfg, total, seed=0, chunks=(1,)):
    """A state that received ``total`` tokens: a prefill of half, then appends of ``chunks`` tokens in turn."""
    state = KIVIState(cfg)
    k, v = kv(total, seed=seed)
    pos = total // 2
    state.append(k[..., :pos, :], v[..., :pos, :])
    i = 0
    while pos < total:
        t = min(chunks[i % len(chunks)], total - pos)
        state.append(k[..., pos : pos + t, :], v[..., pos : pos + t, :])
        pos, i = pos + t, i + 1
    return state, k, v


def test_crop_inside_the_residual_window_is_exact():
    cfg = KIVIConfig(nbits=2, group_size=4, residual_length=8)
    state, k, v = filled(cfg, 30)
    assert state.quantized_tokens == 20 and state.residual_tokens == 10
    before = groups(state)
    state.crop(28)
    assert (state.quantized_tokens, state.residual_tokens) == (20, 8)
    assert torch.equal(state.key_residual, k[..., 20:28, :]) and torch.equal(
        state.value_residual, v[..., 20:28, :]
    )
    assert all(torch.equal(a, b) for a, b in zip(groups(state), before))
    assert state.restored_tokens == 0
    # equal, code for code, to a state that received only the kept tokens (it holds the same 20 quantized)
    fresh = KIVIState(cfg)
    fresh.append(k[..., :28, :], v[..., :28, :])
    assert fresh.quantized_tokens == 20
    assert all(torch.equal(a, b) for a, b in zip(groups(state), groups(fresh)))
    assert torch.equal(state.key_residual, fresh.key_residual)


@pytest.mark.parametrize("keep", [17, 18, 19, 16, 13, 4, 1])
def test_crop_into_the_quantized_prefix_restores_the_cut_group_dequantized(keep):
    cfg = KIVIConfig(nbits=4, group_size=4, residual_length=8)
    state, k, v = filled(cfg, 30, seed=keep)
    assert state.quantized_tokens == 20
    seen_k, seen_v = visible(state)
    before = groups(state)
    state.crop(keep)
    whole, part = keep // 4 * 4, keep % 4
    assert (state.quantized_tokens, state.residual_tokens, state.total_tokens) == (whole, part, keep)
    assert state.restored_tokens == part
    # attention reads, bit for bit, the first `keep` tokens it read before
    got_k, got_v = visible(state)
    assert torch.equal(got_k, seen_k[..., :keep, :]) and torch.equal(got_v, seen_v[..., :keep, :])
    # the restored tokens are the dequantized values, not the originals
    if part:
        assert torch.equal(state.key_residual, seen_k[..., whole:keep, :])
        assert not torch.equal(state.key_residual, k[..., whole:keep, :])
    # whole groups before the cut keep their codes, scales and zeros (nothing re-quantized)
    after = groups(state)
    if whole:
        assert torch.equal(after[0], before[0][..., :whole, :])  # key codes
        assert torch.equal(after[1], before[1][..., : whole // 4, :])  # key scales: one row per group
        assert torch.equal(after[3], before[3][..., :whole, :])  # value codes
        assert torch.equal(after[5], before[5][..., :whole, :])  # value zeros
    else:
        assert after is None and not state.blocks


def test_crop_to_zero_then_a_prefill_equals_a_fresh_state():
    cfg = KIVIConfig(nbits=2, group_size=4, residual_length=8)
    state, _, _ = filled(cfg, 30)
    state.crop(0)
    assert state.total_tokens == 0 and state.quantized_tokens == 0 and not state.blocks
    assert state.nbytes_breakdown()["total"] == 0
    k, v = kv(23, seed=9)
    state.append(k, v)
    fresh = KIVIState(cfg)
    fresh.append(k, v)
    assert all(torch.equal(a, b) for a, b in zip(groups(state), groups(fresh)))
    assert torch.equal(state.key_residual, fresh.key_residual)
    assert torch.equal(state.value_residual, fresh.value_residual)


def test_after_a_cut_group_the_next_flush_quantizes_restored_and_new_tokens_together():
    """Defines what holds after a crop into a group: the state continues exactly as a KIVI state whose residual
    window holds the dequantized kept tokens: the next flushed group is the restored tokens plus the new ones,
    quantized once more (the restored tokens' second quantization), and earlier groups never change."""
    cfg = KIVIConfig(nbits=4, group_size=4, residual_length=4)
    state, _, _ = filled(cfg, 26)
    state.crop(10)  # 8 quantized + 2 restored
    restored_k, restored_v = state.key_residual.clone(), state.value_residual.clone()
    kept = groups(state)
    k, v = kv(6, seed=3)
    for t in range(6):
        state.append(k[..., t : t + 1, :], v[..., t : t + 1, :])
    assert state.quantized_tokens == 12  # 16 tokens, R 4: Q(16) = 12
    after = groups(state)
    assert torch.equal(after[0][..., :8, :], kept[0]) and torch.equal(after[3][..., :8, :], kept[3])
    window_k = torch.cat((restored_k, k[..., :2, :]), dim=-2)  # [1, 2, 4, 8]: the group of tokens 8..11
    window_v = torch.cat((restored_v, v[..., :2, :]), dim=-2)
    ref_k = quantize_groups(window_k, 4, 4, axis=-2)
    ref_v = quantize_groups(window_v, 4, 4, axis=-1)
    assert torch.equal(after[0][..., 8:, :], ref_k.codes) and torch.equal(after[1][..., 2:, :], ref_k.scale)
    assert torch.equal(after[3][..., 8:, :], ref_v.codes) and torch.equal(after[4][..., 8:, :], ref_v.scale)
    assert torch.equal(state.key_residual, k[..., 2:, :])


def test_bytes_after_a_crop_count_only_the_kept_tokens_and_freed_blocks_are_released():
    cfg = KIVIConfig(nbits=4, group_size=4, residual_length=8, block_tokens=8)
    state, _, _ = filled(cfg, 60, chunks=(1, 3))
    assert len(state.blocks) > 2
    state.crop(13)  # 12 quantized (blocks of 8: one full, one holding 4) + 1 restored
    assert len(state.blocks) == 2 and [b.filled for b in state.blocks] == [8, 4]
    info = state.nbytes_breakdown()
    assert (
        info["total"] == info["codes"] + info["scales_zeros"] + info["residual"] == ledger_bytes(cfg, 12, 1)
    )
    held = sum(t.numel() * t.element_size() for b in state.blocks for t in b.tensors())
    held += 2 * state._kbuf.numel() * state._kbuf.element_size()
    assert info["allocated_unused"] == held - info["total"]
    state.crop(5)  # the cut falls inside the first block: the second is freed
    assert len(state.blocks) == 1 and state.blocks[0].filled == 4
    assert state.nbytes_breakdown()["total"] == ledger_bytes(cfg, 4, 1)


@settings(max_examples=40, deadline=None)
@given(
    g=st.sampled_from([2, 4]),
    r_groups=st.integers(0, 3),
    nbits=st.sampled_from([2, 4, 8]),
    ops=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 12)), min_size=1, max_size=8),
)
def test_any_sequence_of_appends_and_crops_keeps_a_prefix_of_what_attention_read(g, r_groups, nbits, ops):
    """After every crop the visible keys/values are the first tokens of those before it, bit for bit; Q stays a
    multiple of G; the bytes follow the ledger of Q quantized and r residual tokens."""
    cfg = KIVIConfig(nbits=nbits, group_size=g, residual_length=g * r_groups, block_tokens=2 * g)
    state = KIVIState(cfg)
    k, v = kv(9 * len(ops), seed=len(ops))
    pos = 0
    for add, drop in ops:
        state.append(k[..., pos : pos + add, :], v[..., pos : pos + add, :])
        pos += add
        seen_k, seen_v = visible(state)
        keep = max(state.total_tokens - drop, 0)
        state.crop(keep)
        assert state.total_tokens == keep and state.quantized_tokens % g == 0
        if keep:
            got_k, got_v = visible(state)
            assert torch.equal(got_k, seen_k[..., :keep, :]) and torch.equal(got_v, seen_v[..., :keep, :])
        assert state.nbytes_breakdown()["total"] == ledger_bytes(
            cfg, state.quantized_tokens, state.residual_tokens
        )
        assert sum(b.filled for b in state.blocks) == state.quantized_tokens
        assert all(b.filled for b in state.blocks)


@pytest.mark.parametrize(
    "tokens,err,msg",
    [
        (-1, ValueError, r"must be in \[0, 30\].*got -1"),
        (31, ValueError, r"must be in \[0, 30\].*got 31"),
        (2.0, TypeError, r"must be an int, got 2.0"),
        (True, TypeError, r"must be an int, got True"),
    ],
)
def test_bad_crop_is_named_and_changes_nothing(tokens, err, msg):
    cfg = KIVIConfig(nbits=2, group_size=4, residual_length=8)
    state, _, _ = filled(cfg, 30)
    before_k, _ = visible(state)
    with pytest.raises(err, match=msg):
        state.crop(tokens)
    assert state.total_tokens == 30 and torch.equal(visible(state)[0], before_k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_crop_of_a_batch_in_half_precision_restores_every_row_in_the_cache_dtype(dtype):
    cfg = KIVIConfig(nbits=2, group_size=4, residual_length=4)
    state = KIVIState(cfg)
    k, v = kv(23, b=3, dtype=dtype, seed=5)
    state.append(k[..., :11, :], v[..., :11, :])
    for t in range(11, 23):
        state.append(k[..., t : t + 1, :], v[..., t : t + 1, :])
    seen_k, seen_v = visible(state)
    state.crop(6)  # 4 quantized + 2 restored, every row
    assert state.key_residual.dtype == dtype and state.key_residual.shape == (3, 2, 2, 8)
    got_k, got_v = visible(state)
    assert torch.equal(got_k, seen_k[..., :6, :]) and torch.equal(got_v, seen_v[..., :6, :])
