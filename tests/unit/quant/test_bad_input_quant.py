"""Hostile input to the codec and the KIVI state: a clear ValueError/TypeError naming the value, or a finite,
correct result; never a silent wrong number or a crash inside torch."""

from __future__ import annotations

import pytest
import torch

from kvlab.quant import quantize_groups
from kvlab.quant.codec import dequantize
from kvlab.quant.kivi import KIVIConfig, KIVIState

FLOATS = (torch.bfloat16, torch.float16, torch.float32)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("nbits", (2, 4, 8))
def test_dequantize_of_the_largest_finite_values_stays_finite(dtype, nbits):
    fmax = torch.finfo(dtype).max
    x = torch.tensor(
        [[fmax, -fmax, 0.0, fmax / 2], [fmax, fmax / 2, fmax / 4, fmax / 8], [-fmax, -fmax, -fmax, fmax]],
        dtype=dtype,
    )
    y = dequantize(quantize_groups(x, nbits, 4))
    assert torch.isfinite(y).all(), y
    # the error of each element stays within one quantization step of its group (max - min) / (2**b - 1)
    span = (x.double().amax(-1, keepdim=True) - x.double().amin(-1, keepdim=True)) / (2**nbits - 1)
    assert ((y.double() - x.double()).abs() <= span * 1.01).all()


@pytest.mark.parametrize("dtype", FLOATS)
def test_huge_keys_in_a_kivi_state_dequantize_finite(dtype):
    fmax = torch.finfo(dtype).max
    gen = torch.Generator().manual_seed(0)
    k = (torch.rand(1, 2, 64, 32, generator=gen) * 2 - 1).to(dtype) * fmax
    state = KIVIState(KIVIConfig(nbits=2, group_size=32, residual_length=0))
    state.append(k, k)
    keys, values = state.dequantize_prefix()
    assert torch.isfinite(keys).all() and torch.isfinite(values).all()


@pytest.mark.parametrize("axis", (4, -5, 100))
def test_axis_out_of_range_is_named(axis):
    with pytest.raises(ValueError, match=f"`axis`.*got {axis}"):
        quantize_groups(torch.zeros(1, 2, 4, 8), 4, 4, axis=axis)


@pytest.mark.parametrize("axis", (1.5, None, "-1"))
def test_axis_of_the_wrong_type_is_named(axis):
    with pytest.raises(TypeError, match="`axis`"):
        quantize_groups(torch.zeros(1, 2, 4, 8), 4, 4, axis=axis)


def test_non_tensor_input_is_a_type_error():
    with pytest.raises(TypeError, match="torch.Tensor.*list"):
        quantize_groups([[1.0] * 8], 4, 4)


def test_zero_token_tensors_round_trip():
    for axis in (-1, -2):
        x = torch.zeros(1, 2, 0, 8)
        y = dequantize(quantize_groups(x, 4, 4, axis=axis))
        assert y.shape == x.shape


def test_kivi_state_rejects_non_tensors_and_empty_head_dim():
    state = KIVIState(KIVIConfig(nbits=4, group_size=32, residual_length=32))
    with pytest.raises(TypeError, match="torch.Tensor"):
        state.append([1.0], [1.0])
    with pytest.raises(ValueError, match="head_dim"):
        state.append(torch.zeros(1, 2, 8, 0), torch.zeros(1, 2, 8, 0))


def test_kivi_state_append_of_zero_tokens_changes_nothing():
    state = KIVIState(KIVIConfig(nbits=4, group_size=32, residual_length=32))
    x = torch.randn(1, 2, 100, 64)
    state.append(x, x)
    before = (state.total_tokens, state.quantized_tokens, state.nbytes_breakdown())
    kw, vw = state.append(torch.zeros(1, 2, 0, 64), torch.zeros(1, 2, 0, 64))
    assert (state.total_tokens, state.quantized_tokens, state.nbytes_breakdown()) == before
    assert kw.shape == (1, 2, state.residual_tokens, 64)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("value_name", ("tiny", "subnormal", "max", "-max"))
def test_constant_groups_of_extreme_values_come_back_exact(dtype, value_name):
    info = torch.finfo(dtype)
    value = {"tiny": info.tiny, "subnormal": info.tiny / 8, "max": info.max, "-max": -info.max}[value_name]
    x = torch.full((2, 8), value, dtype=dtype)
    for axis in (-1, -2):
        y = dequantize(quantize_groups(x, 2, 2, axis=axis))
        assert torch.equal(y, x)


@pytest.mark.parametrize("dtype", FLOATS)
def test_tiny_groups_stay_finite_and_within_their_range(dtype):
    tiny = torch.finfo(dtype).tiny
    x = torch.tensor([[tiny, 2 * tiny, 0.0, -tiny], [tiny / 4, tiny / 8, 0.0, -tiny / 2]], dtype=dtype)
    y = dequantize(quantize_groups(x, 4, 4)).double()
    lo, hi = x.double().amin(-1, keepdim=True), x.double().amax(-1, keepdim=True)
    assert torch.isfinite(y).all() and (y >= lo - tiny).all() and (y <= hi + tiny).all()


@pytest.mark.parametrize("bad", (float("nan"), float("inf"), float("-inf")))
@pytest.mark.parametrize("which", ("keys", "values"))
def test_kivi_state_rejects_non_finite_tokens_at_append(bad, which):
    """A NaN/inf must be refused when it arrives, naming the tensor and the position, not accepted into the
    full-precision residual window (where it would poison attention and make a later flush fail)."""
    cfg = KIVIConfig(nbits=4, group_size=4, residual_length=8)
    state = KIVIState(cfg)
    k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    state.append(k, v)
    before = (state.total_tokens, state.key_residual.clone(), state.value_residual.clone())
    k1, v1 = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    (k1 if which == "keys" else v1)[0, 1, 0, 3] = bad
    with pytest.raises(ValueError, match=rf"{which} .*(nan|inf).*\[0, 1, 0, 3\]"):
        state.append(k1, v1)
    # nothing was written: the cache keeps working
    assert state.total_tokens == before[0]
    assert torch.equal(state.key_residual, before[1]) and torch.equal(state.value_residual, before[2])
    state.append(torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8))
    assert state.total_tokens == 25


def test_kivi_state_rejects_non_finite_first_append():
    state = KIVIState(KIVIConfig(nbits=4, group_size=4, residual_length=8))
    k = torch.randn(1, 1, 3, 8)
    k[0, 0, 2, 0] = float("nan")
    with pytest.raises(ValueError, match=r"keys .*nan.*\[0, 0, 2, 0\]"):
        state.append(k, torch.randn(1, 1, 3, 8))
    assert state.total_tokens == 0 and state.key_residual is None


def test_kivi_state_accepts_finite_tokens_whose_sum_overflows():
    """The append guard sums the new tokens in fp32; huge finite values overflow that sum to inf, and the exact
    search that follows must then find nothing and accept them (bf16 keeps values up to ~3.4e38)."""
    state = KIVIState(KIVIConfig(nbits=4, group_size=4, residual_length=8))
    k = torch.full((1, 1, 3, 8), 3e38, dtype=torch.bfloat16)
    state.append(k, -k)
    assert state.total_tokens == 3 and torch.equal(state.key_residual, k)


def test_kivi_state_rejects_a_device_change():
    state = KIVIState(KIVIConfig(nbits=4, group_size=4, residual_length=8))
    state.append(torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8))
    other = torch.empty(1, 1, 1, 8, device="meta")
    with pytest.raises(ValueError, match="meta.*do not match the cache on cpu"):
        state.append(other, other)
    assert state.total_tokens == 3


@pytest.mark.parametrize(
    "codes,nbits,err,msg",
    [
        (torch.tensor([5, 0, 0, 0], dtype=torch.uint8), 2, ValueError, r"codes must be in \[0, 3\].*, got 5"),
        (torch.tensor([16, 0]), 4, ValueError, r"codes must be in \[0, 15\].*, got 16"),
        (torch.tensor([-1, 0, 0, 0]), 2, ValueError, r"codes must be in \[0, 3\].*, got -1"),
        (torch.tensor([300]), 8, ValueError, r"codes must be in \[0, 255\].*, got 300"),
        (torch.tensor([1.7, 0.0, 0.0, 0.0]), 2, TypeError, r"integer.*torch.float32"),
        (torch.tensor(1, dtype=torch.uint8), 2, ValueError, r"0-d"),
        ([1, 2, 3, 0], 2, TypeError, r"torch.Tensor.*list"),
    ],
)
def test_pack_codes_refuses_codes_it_would_corrupt(codes, nbits, err, msg):
    """A code >= 2**nbits used to spill into its neighbours' bits (5 at 2 bits packed as codes 1, 1)."""
    with pytest.raises(err, match=msg):
        from kvlab.quant import pack_codes

        pack_codes(codes, nbits)


@pytest.mark.parametrize(
    "packed,err,msg",
    [
        (torch.tensor([255, -1]), TypeError, r"uint8.*torch.int64"),
        (torch.tensor([3.0]), TypeError, r"uint8.*torch.float32"),
        (torch.tensor(3, dtype=torch.uint8), ValueError, r"0-d"),
    ],
)
@pytest.mark.parametrize("nbits", (2, 8))
def test_unpack_codes_needs_packed_uint8(packed, err, msg, nbits):
    from kvlab.quant import unpack_codes

    with pytest.raises(err, match=msg):
        unpack_codes(packed, nbits)


@pytest.mark.parametrize("dtype", (torch.int32, torch.bool, "float32"))
def test_dequantize_to_a_non_floating_dtype_is_named(dtype):
    qt = quantize_groups(torch.randn(4, 8), 4, 4)
    with pytest.raises((TypeError, ValueError), match=f"dtype.*{dtype}"):
        dequantize(qt, dtype)


@pytest.mark.parametrize("scale", ["per-head", "per-tensor"])
@pytest.mark.parametrize("shape", [(1, 2, 0, 8), (1, 2, 3, 0)])
def test_fp8_calibrate_on_no_elements_is_named(scale, shape):
    from kvlab.quant.fp8 import calibrate

    # was IndexError from amax(): "Expected reduction dim 2 to have non-zero size"
    with pytest.raises(ValueError, match=r"no tokens or channels to calibrate on"):
        calibrate(torch.randn(shape), "e4m3", scale)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("scale", ["per-head", "per-tensor"])
def test_fp8_calibrate_refuses_non_finite_input(scale, bad):
    from kvlab.quant.fp8 import calibrate

    x = torch.randn(1, 2, 3, 8)
    x[0, 1, 2, 5] = bad
    # NaN gave scale 1.0 (amax NaN is not > 0), inf gave scale inf (every code then decodes to 0): both silent
    with pytest.raises(ValueError, match=r"inf or NaN"):
        calibrate(x, "e4m3", scale)


def test_fp8_calibrate_refuses_integer_input():
    from kvlab.quant.fp8 import calibrate

    with pytest.raises(ValueError, match=r"floating.*int32"):
        calibrate(torch.ones(1, 2, 3, 8, dtype=torch.int32), "e4m3", "per-head")


@pytest.mark.parametrize("nbits", [3, "4", 4.0])
def test_kivi_config_checks_nbits_even_when_key_and_value_bits_are_given(nbits):
    # KIVIConfig(nbits=3, key_bits=8, value_bits=4) was accepted: nbits was never looked at
    with pytest.raises(ValueError, match=rf"`nbits` must be one of \[2, 4, 8\], got {nbits!r}"):
        KIVIConfig(nbits=nbits, key_bits=8, value_bits=4)
