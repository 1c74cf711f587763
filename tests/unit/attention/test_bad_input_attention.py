"""Hostile input to kivi_attention: a clear ValueError/TypeError naming the bad value, raised before any work
(the caller's intra-op thread count untouched), never a crash inside torch or a silently broadcast result."""

from __future__ import annotations

import pytest
import torch

from kvlab.attention.quantized import kivi_attention
from kvlab.quant import KIVIConfig, KIVIState

B, HKV, G, D, NBITS = 2, 2, 8, 16, 4


def problem(b=B, hkv=HKV, d=D, q_len=1, seed=0):
    torch.manual_seed(seed)
    state = KIVIState(KIVIConfig(NBITS, G, G))
    state.append(torch.randn(b, hkv, 40, d), torch.randn(b, hkv, 40, d))
    segs = list(state.segments())
    kw, vw = state.append(torch.randn(b, hkv, q_len, d), torch.randn(b, hkv, q_len, d))
    q = torch.randn(b, 2 * hkv, q_len, d)
    return q, segs, kw, vw, state.total_tokens


@pytest.fixture(params=[1, 2])
def threads(request):
    saved = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    assert torch.get_num_threads() == request.param
    torch.set_num_threads(saved)


def call(q, segs, kw, vw, nbits=NBITS, group=G, scale=0.25, **kw_):
    return kivi_attention(q, segs, kw, vw, nbits, group, scale, **kw_)


def test_query_must_be_a_4d_floating_tensor(threads):
    q, segs, kw, vw, _ = problem()
    with pytest.raises(ValueError, match=r"query.*\[batch, q_heads, q_len, head_dim\].*\(2, 4, 16\)"):
        call(q[:, :, 0], segs, kw, vw)
    with pytest.raises(ValueError, match="query.*torch.int64"):
        call(q.long(), segs, kw, vw)


@pytest.mark.parametrize(
    "what", ["query batch", "window batch", "value head_dim", "value tokens", "value heads"]
)
def test_mismatched_shapes_are_named(threads, what):
    q, segs, kw, vw, _ = problem()
    if what == "query batch":
        q = q[:1]
    elif what == "window batch":  # used to broadcast silently over the query's batch
        kw, vw = kw[:1], vw[:1]
    elif what == "value head_dim":
        vw = vw[..., :8]
    elif what == "value tokens":
        vw = vw[..., :3, :]
    else:
        vw = vw[:, :1]
    with pytest.raises(ValueError, match=r"\(\d+, \d+, \d+, \d+\)"):
        call(q, segs, kw, vw)


@pytest.mark.parametrize(
    "nbits,group,msg",
    [
        (3, G, r"`nbits` must be one of \[2, 4, 8\], got 3"),
        (NBITS, 0, r"`group_size` must be an int >= 1, got 0"),
        (2, G, r"segment 0 .*nbits 2"),
        (8, G, r"segment 0 .*nbits 8"),
        (NBITS, 4, r"segment 0 .*group_size 4"),
        (NBITS, 16, r"segment 0 .*group_size 16"),
    ],
)
def test_settings_that_do_not_match_the_segments_are_named(threads, nbits, group, msg):
    q, segs, kw, vw, _ = problem()
    with pytest.raises(ValueError, match=msg):
        call(q, segs, kw, vw, nbits=nbits, group=group)


@pytest.mark.parametrize("other", [dict(b=1), dict(hkv=1), dict(d=32)])
def test_segments_of_another_cache_are_named(threads, other):
    q, _, kw, vw, _ = problem()
    _, segs, _, _, _ = problem(**other)
    with pytest.raises(ValueError, match=r"segment 0 .*\(\d+, \d+, \d+, \d+\)"):
        call(q, segs, kw, vw)


def test_bad_scaling_is_named(threads):
    q, segs, kw, vw, _ = problem()
    for bad in (None, "x", True, float("nan")):
        with pytest.raises((TypeError, ValueError), match="scaling"):
            call(q, segs, kw, vw, scale=bad)


@pytest.mark.parametrize(
    "shape",
    [(B, 1, 1, -1), (B, 1, 1, +5), (B, 1, 3, 0), (3, 1, 1, 0), (B, 1, 0), (B, 0)],
    ids=["short", "long", "q_len", "batch", "3d", "2d"],
)
def test_mask_of_the_wrong_shape_is_named(threads, shape):
    q, segs, kw, vw, total = problem()
    shape = shape[:-1] + (total + shape[-1],)
    mask = torch.ones(shape, dtype=torch.bool)
    with pytest.raises(ValueError, match="attention_mask"):
        call(q, segs, kw, vw, attention_mask=mask)


def test_mask_of_batch_one_broadcasts(threads):
    q, segs, kw, vw, total = problem()
    mask = torch.ones(1, 1, 1, total, dtype=torch.bool)
    mask[..., :5] = False
    got = call(q, segs, kw, vw, attention_mask=mask)
    torch.testing.assert_close(got, call(q, segs, kw, vw, attention_mask=mask.expand(B, 1, 1, total)))


def test_integer_mask_is_refused_not_read_as_additive(threads):
    """An int 0/1 mask used to be read as additive (1 != 0: masked), so a mask of ones silently gave zeros."""
    q, segs, kw, vw, total = problem()
    with pytest.raises(ValueError, match="attention_mask.*torch.int64"):
        call(q, segs, kw, vw, attention_mask=torch.ones(B, 1, 1, total, dtype=torch.int64))


@pytest.mark.parametrize("bad", [1.0, -0.5, float("nan"), float("inf")])
def test_float_mask_other_than_zero_or_large_negative_is_refused(threads, bad):
    """A float mask is read as 0 = attend, large negative = masked; a general additive bias used to be read as
    'masked' silently."""
    q, segs, kw, vw, total = problem()
    mask = torch.zeros(B, 1, 1, total)
    mask[1, 0, 0, 7] = bad
    with pytest.raises(ValueError, match=r"attention_mask.*\[1, 0, 0, 7\]"):
        call(q, segs, kw, vw, attention_mask=mask)


@pytest.mark.parametrize("masked", [float("-inf"), torch.finfo(torch.float32).min, -1e4])
def test_float_mask_of_zero_or_large_negative_still_works(threads, masked):
    q, segs, kw, vw, total = problem()
    bool_mask = torch.ones(B, 1, 1, total, dtype=torch.bool)
    bool_mask[1, ..., :9] = False
    float_mask = torch.zeros(B, 1, 1, total).masked_fill(~bool_mask, masked)
    torch.testing.assert_close(
        call(q, segs, kw, vw, attention_mask=float_mask), call(q, segs, kw, vw, attention_mask=bool_mask)
    )


def test_causal_rule_needs_the_queries_inside_the_window(threads):
    q, segs, kw, vw, _ = problem(q_len=3)
    with pytest.raises(ValueError, match=r"q_len \(3\).*window \(2\)"):
        call(q, segs, kw[..., -2:, :], vw[..., -2:, :])
    w = kw.shape[-2]
    for bad in (-1, w - 2, 1.5):
        with pytest.raises((TypeError, ValueError), match="window_offset"):
            call(q, segs, kw, vw, window_offset=bad)


def test_numpy_scaling_is_accepted(threads):
    np = pytest.importorskip("numpy")
    q, segs, kw, vw, _ = problem()
    torch.testing.assert_close(
        call(q, segs, kw, vw, scale=np.float32(0.25)), call(q, segs, kw, vw, scale=0.25)
    )


@pytest.mark.parametrize("nbits,group", [(2, 1), (2, 2), (4, 1)])
def test_value_groups_narrower_than_a_byte_are_named(threads, nbits, group):
    """The fused path unpacks a value group (G channels) byte by byte: G * nbits must fill whole bytes. The state
    accepts such settings (dequantize path), the fused attention used to crash in a view."""
    torch.manual_seed(0)
    state = KIVIState(KIVIConfig(nbits, group, 4 * group))
    state.append(torch.randn(1, 1, 40, 16), torch.randn(1, 1, 40, 16))
    segs = list(state.segments())
    kw, vw = state.append(torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16))
    with pytest.raises(ValueError, match=rf"group_size \({group}\).*nbits \({nbits}\).*whole bytes"):
        kivi_attention(torch.randn(1, 2, 1, 16), segs, kw, vw, nbits, group, 0.25)


@pytest.mark.parametrize("nbits,group", [(2, 1), (2, 2), (4, 1)])
def test_fused_cache_with_value_groups_narrower_than_a_byte_is_refused_at_construction(nbits, group):
    from kvlab.caches import KIVICache

    with pytest.raises(ValueError, match=rf"group_size \({group}\).*nbits \({nbits}\).*whole bytes"):
        KIVICache(nbits=nbits, group_size=group, residual_length=0, attention="fused")
    KIVICache(nbits=nbits, group_size=group, residual_length=0)  # the dequantize path handles them
