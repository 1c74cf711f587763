"""FP8Cache: bytes (half of bf16 plus the scales), calibrated scales, saturation/underflow counts, crop, bad input."""

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from kvlab.caches.fp8 import FP8Cache, FP8Layer
from kvlab.caches.measure import cache_nbytes
from kvlab.caches.registry import resolve
from kvlab.quant.fp8 import calibrate, decode, encode, format_range
from kvlab.runtime.hf_api import cache_kwarg


def _prefill(model, cache, tokens=37, batch=2):
    ids = torch.randint(1, 256, (batch, tokens), generator=torch.Generator().manual_seed(tokens))
    with torch.no_grad():
        model(ids, use_cache=True, **{cache_kwarg(model): cache})
    return cache


@pytest.fixture(scope="module")
def bf16_model(tiny_qwen2):
    import copy

    return copy.deepcopy(tiny_qwen2).to(torch.bfloat16)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize(
    "scale, scales_per_layer", [("per-head", 2 * 2 * 2), ("per-tensor", 2 * 2), ("none", 0)]
)
def test_bytes_are_half_of_bf16_plus_the_scales(bf16_model, fmt, scale, scales_per_layer):
    """tiny Qwen2: 2 layers, 2 KV heads, batch 2; one fp32 scale per (K or V, batch row[, head]) and layer."""
    dynamic = _prefill(bf16_model, DynamicCache())
    fp8 = _prefill(bf16_model, FP8Cache(fmt, scale))
    parts = fp8.nbytes_breakdown()
    assert 2 * parts["codes"] == cache_nbytes(dynamic)
    assert parts["scales"] == 2 * scales_per_layer * 4  # 2 layers, 4 B per scale
    assert fp8.nbytes() == parts["codes"] + parts["scales"] == cache_nbytes(fp8)
    assert fp8.layers[0].keys.dtype == (torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2)


def test_per_head_scales_map_each_heads_prefill_max_to_the_format_max():
    x = torch.randn(1, 3, 20, 8) * torch.tensor([0.01, 1.0, 900.0]).view(1, 3, 1, 1)  # [B, H, T, D]
    s = calibrate(x, "e4m3", "per-head")
    assert s.shape == (1, 3, 1, 1)
    torch.testing.assert_close(s.flatten(), x.abs().amax(dim=(2, 3)).flatten() / 448.0)
    enc = encode(x, "e4m3", s)
    assert int(enc.saturated) == 0 and int(enc.underflow) == 0
    rel = ((decode(enc.codes, s, torch.float32) - x).abs() / x.abs().clamp_min(1e-30)).amax(dim=(0, 2, 3))
    # every head keeps e4m3's relative precision (2^-4 for normal values) whatever its magnitude
    assert float(rel.max()) <= 2**-4 + 1e-6
    # one per-tensor scale serves the smallest head badly: its values fall into subnormals or flush to zero
    st = calibrate(x, "e4m3", "per-tensor")
    small = decode(encode(x, "e4m3", st).codes, st, torch.float32)[:, 0]
    assert float(((small - x[:, 0]).abs() / x[:, 0].abs()).max()) > 2**-4


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_saturation_and_underflow_are_counted_with_scale_one(fmt):
    fmax, tiny = format_range(fmt)
    layer = FP8Layer(fmt, "none", "none", "dequantize")
    k = torch.zeros(1, 1, 4, 4)
    k[0, 0, 0, :3] = torch.tensor([fmax * 4, -fmax * 2, tiny / 4])  # two saturate, one flushes
    v = torch.full((1, 1, 4, 4), 0.5)
    first_k, first_v = layer.update(k, v)
    assert torch.equal(first_k, k) and torch.equal(first_v, v)  # the writing step attends in full precision
    keys, values = layer.update(torch.zeros(1, 1, 0, 4), torch.zeros(1, 1, 0, 4))  # read back from FP8
    c = layer.counts()
    assert (c["key_saturated"], c["key_underflow"], c["value_saturated"], c["value_underflow"]) == (
        2,
        1,
        0,
        0,
    )
    assert c["elements"] == 16
    assert float(keys[0, 0, 0, 0]) == fmax and float(keys[0, 0, 0, 1]) == -fmax  # clamped, not inf/NaN
    assert torch.equal(values, v)
    # a decode token beyond the prefill's calibrated range saturates too
    cal = FP8Layer(fmt, "per-head", "none", "dequantize")
    cal.update(torch.ones(1, 1, 3, 4), torch.ones(1, 1, 3, 4))
    cal.update(torch.full((1, 1, 1, 4), 3.0), torch.ones(1, 1, 1, 4))
    assert cal.counts()["key_saturated"] == 4 and cal.counts()["value_saturated"] == 0


def test_generate_runs_and_crop_keeps_a_prefix(tiny_qwen2):
    cache = _prefill(tiny_qwen2, FP8Cache("e4m3"), tokens=30, batch=1)
    keys = cache.layers[0].keys.clone()
    cache.crop(-4)
    assert cache.get_seq_length() == 26
    assert torch.equal(cache.layers[0].keys.view(torch.uint8), keys[:, :, :26].view(torch.uint8))
    cache.crop(10)  # a positive n keeps the first n (transformers 5.0's max_length)
    assert cache.get_seq_length() == 10
    with pytest.raises(TypeError, match="integer number of tokens"):
        cache.crop(1.5)
    ids = torch.randint(1, 256, (1, 24), generator=torch.Generator().manual_seed(3))
    out = tiny_qwen2.generate(
        ids, max_new_tokens=5, do_sample=False, pad_token_id=0, **{cache_kwarg(tiny_qwen2): FP8Cache("e5m2")}
    )
    assert out.shape == (1, 29)


def test_beam_reorder_moves_codes_and_scales_together(tiny_qwen2):
    cache = _prefill(tiny_qwen2, FP8Cache("e4m3", "per-head"), tokens=12, batch=2)
    layer = cache.layers[1]
    keys, scale = layer.keys.view(torch.uint8).clone(), layer.key_scale.clone()
    cache.reorder_cache(torch.tensor([1, 0]))
    assert torch.equal(layer.keys.view(torch.uint8), keys.flip(0)) and torch.equal(
        layer.key_scale, scale.flip(0)
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"format": "e3m4"}, r"`format` must be one of \['e4m3', 'e5m2'\], got 'e3m4'"),
        ({"format": "fp8"}, "got 'fp8'"),
        (
            {"scale": "per-channel"},
            r"`scale` must be one of \['none', 'per-tensor', 'per-head'\], got 'per-channel'",
        ),
        ({"rotation": "walsh"}, r"`rotation` must be one of \['none', 'hadamard'\], got 'walsh'"),
    ],
)
def test_bad_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FP8Cache(**kwargs)


def test_a_torch_without_the_float8_dtype_is_named(monkeypatch):
    monkeypatch.delattr(torch, "float8_e5m2")
    with pytest.raises(ValueError, match=r"'e5m2' needs torch.float8_e5m2, which this torch build .* lacks"):
        FP8Cache("e5m2")
    with pytest.raises(ValueError, match="needs torch.float8_e5m2"):
        resolve("fp8-e5m2").make(None)


def test_inf_and_nan_are_refused():
    layer = FP8Layer("e4m3", "per-head", "none", "dequantize")
    bad = torch.ones(1, 1, 2, 4)
    bad[0, 0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="inf or NaN"):
        layer.update(bad, torch.ones(1, 1, 2, 4))
    assert not layer.is_initialized


def test_registry_names_pick_format_and_scale():
    for name, fmt, scale in [
        ("fp8-e4m3", "e4m3", "per-head"),
        ("fp8-e5m2-tensor", "e5m2", "per-tensor"),
        ("fp8-e4m3-unscaled", "e4m3", "none"),
        ("fp8-e5m2-hadamard", "e5m2", "per-head"),
    ]:
        cache = resolve(name).make(None)
        assert (cache.format, cache.scale) == (fmt, scale), name
        assert cache.rotation == ("hadamard" if name.endswith("hadamard") else "none"), name
    with pytest.raises(ValueError, match="`fp8` needs a variant"):
        resolve("fp8")
    with pytest.raises(ValueError, match="got 'e4m4'"):
        resolve("fp8-e4m4")


def test_e4m3_bit_path_equals_torchs_cast_for_every_code():
    """kvlab's float16-bit-pattern decode of e4m3 must equal torch's cast for all 254 non-NaN codes (and -0.0)."""
    from kvlab.quant.fp8 import e4m3_to_float32

    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    ref, got = codes.to(torch.float32), e4m3_to_float32(codes)
    finite = ~torch.isnan(ref)
    assert int(finite.sum()) == 254
    assert torch.equal(got[finite], ref[finite])
    assert torch.equal(torch.signbit(got[finite]), torch.signbit(ref[finite]))  # -0.0 stays negative
    x = torch.randn(2, 3, 50, 8) * 40
    enc = encode(x, "e4m3", None)
    assert torch.equal(decode(enc.codes, None, torch.float32), enc.codes.to(torch.float32))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        e4m3_to_float32(torch.zeros(3, dtype=torch.float8_e5m2))


# --- Hadamard rotation (fp8-*-hadamard) ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 64, 128])
def test_hadamard_is_orthonormal_and_fixed(n):
    from kvlab.quant.rotation import hadamard

    r = hadamard(n)
    assert r.shape == (n, n) and r.dtype == torch.float32
    torch.testing.assert_close(r @ r.T, torch.eye(n), atol=1e-6, rtol=0)
    assert torch.equal(r, hadamard(n))  # the sign draw is seeded: every cache rotates the same way
    assert torch.equal(r.abs(), torch.full((n, n), n**-0.5))  # every channel spread over all of them
    assert torch.equal(hadamard(np.int64(n)), r)  # a numpy integer head_dim is an integer too


@pytest.mark.parametrize("n", [0, 3, 80, -64, 64.0, True])
def test_hadamard_names_a_head_dim_that_is_not_a_power_of_two(n):
    from kvlab.quant.rotation import hadamard

    with pytest.raises(ValueError, match=f"power-of-two head_dim .*got {n!r}"):
        hadamard(n)


def test_a_head_dim_that_is_not_a_power_of_two_is_refused_before_anything_is_stored():
    layer = FP8Layer("e4m3", "per-head", "hadamard", "dequantize")
    with pytest.raises(ValueError, match="power-of-two head_dim .*got 80"):
        layer.update(torch.ones(1, 2, 3, 80), torch.ones(1, 2, 3, 80))
    assert not layer.is_initialized


def _stored_then_read(rotation, keys):
    """Write ``keys`` as a prefill, then read them back with one more token: the first T rows of the step's keys."""
    layer = FP8Layer("e4m3", "per-head", rotation, "dequantize")
    layer.update(keys, keys)
    k, _ = layer.update(keys[:, :, :1], keys[:, :, :1])
    return layer, k[:, :, : keys.shape[2]]


def test_rotation_spreads_an_outlier_channel_and_keeps_scores_closer():
    """Keys whose score is carried by one outlier channel (KIVI §3's per-channel structure): plain e4m3 moves each
    score by e4m3's relative error of that channel's product; the rotated cache spreads that product over 64
    channels (expected RMS score error ~0.38x here; measured 0.44x). The read-back keys are the stored ones rotated
    back (a rotation not undone would put them off by O(1))."""
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(1, 2, 256, 64, generator=g)
    keys[..., 7] = 20.0 + torch.randn(1, 2, 256, generator=g)  # a large, slowly varying channel
    q = torch.randn(1, 2, 1, 64, generator=g)
    q[..., 7] = 3.0
    exact = q @ keys.transpose(-1, -2)  # [1, 2, 1, 256] scores
    err = {}
    for rotation in ("none", "hadamard"):
        layer, read = _stored_then_read(rotation, keys)
        assert float((read - keys).norm() / keys.norm()) < 0.04  # e4m3's ~2.6 % RMS, rotated back
        err[rotation] = float((q @ read.transpose(-1, -2) - exact).pow(2).mean().sqrt())
        assert (layer.key_rotation is None) is (rotation == "none")
    assert err["hadamard"] < 0.6 * err["none"], err


def test_rotated_cache_bytes_equal_the_plain_cache_and_reset_drops_the_rotation(bf16_model):
    plain = _prefill(bf16_model, FP8Cache("e4m3", "per-head"))
    rotated = _prefill(bf16_model, FP8Cache("e4m3", "per-head", "hadamard"))
    assert rotated.nbytes_breakdown() == plain.nbytes_breakdown()
    assert not torch.equal(rotated.layers[0].keys.view(torch.uint8), plain.layers[0].keys.view(torch.uint8))
    layer = rotated.layers[0]
    layer.reset()
    assert layer.key_rotation is None and layer.value_rotation is None and not layer.is_initialized
