"""Group-wise codec: packing, error bounds, metadata range, constant groups, bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.quant import dequantize, metadata_dtypes, pack_codes, quantize_groups, unpack_codes


@pytest.mark.parametrize("nbits,per_byte", [(2, 4), (4, 2), (8, 1)])
def test_codes_are_really_packed(nbits, per_byte):
    x = torch.randn(2, 3, 64, 32)
    qt = quantize_groups(x, nbits, 32, axis=-2)
    assert qt.codes.dtype == torch.uint8
    assert qt.codes.shape == (2, 3, 64, 32 // per_byte)


@given(nbits=st.sampled_from([2, 4, 8]), n=st.integers(1, 6), seed=st.integers(0, 2**16))
@settings(max_examples=40, deadline=None)
def test_pack_unpack_roundtrip(nbits, n, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 1 << nbits, (3, 8 * n), generator=g, dtype=torch.uint8)
    packed = pack_codes(codes, nbits)
    assert packed.shape[-1] == 8 * n * nbits // 8
    assert torch.equal(unpack_codes(packed, nbits), codes)


def test_pack_layout_low_bits_first():
    codes = torch.tensor([[1, 2, 3, 0]], dtype=torch.uint8)
    assert pack_codes(codes, 2).tolist() == [[1 | (2 << 2) | (3 << 4)]]
    assert pack_codes(codes, 4).tolist() == [[1 | (2 << 4), 3]]


def _half_step_violation(x, qt, out_dtype):
    """Largest ``|x - x_hat| - bound`` over the elements (``<= 0`` when the bound holds), the bound being half a
    stored step, plus float32 arithmetic (``2**-21`` of the values involved) and, for a 16-bit ``out_dtype``, half
    an ulp of ``x_hat`` in it."""
    axis, g = qt.axis, qt.group_size
    step = qt.scale.float().repeat_interleave(g, dim=axis)
    zero = qt.zero.float().repeat_interleave(g, dim=axis)
    x_hat = dequantize(qt, out_dtype).float()
    qmax = (1 << qt.nbits) - 1
    arith = (x.float().abs() + zero.abs() + qmax * step) * 2**-21
    own = torch.finfo(out_dtype).eps / 2 * x_hat.abs() + torch.finfo(out_dtype).tiny
    bound = step / 2 + arith + (own if out_dtype != torch.float32 else 0)
    return ((x_hat - x.float()).abs() - bound).max().item()


@given(
    nbits=st.sampled_from([2, 4, 8]),
    axis=st.sampled_from([-1, -2]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    magnitude=st.sampled_from([1e-3, 1.0, 1e3]),
    offset=st.sampled_from([0.0, 1.0, 30.0]),
    spike=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=150, deadline=None)
def test_reconstruction_error_within_half_step(nbits, axis, dtype, magnitude, offset, spike, seed):
    # |x - x_hat| <= scale / 2 with the stored scale (KIVI section 3.1's min-max quantizer): the stored scale is
    # rounded up, so no value needs a code past the top one; `spike` makes one element per group the lone maximum
    # (the group whose top value was clamped when the bf16 scale was rounded down)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 2, 32, 16, generator=g) * magnitude + offset * magnitude
    if spike:
        x = x.movedim(axis, -1).reshape(2, 2, -1, 16)  # [..., groups, 16]
        top = x.amax(-1) + torch.rand(x.shape[:-1], generator=g) * 5 * magnitude
        x[..., 0] = top
        x = x.reshape(2, 2, -1, 32 if axis == -2 else 16).movedim(-1, axis)
    x = x.to(dtype)
    qt = quantize_groups(x, nbits, 16, axis=axis)
    assert _half_step_violation(x, qt, torch.float32) <= 0
    assert _half_step_violation(x, qt, dtype) <= 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_top_value_reachable_when_the_scale_rounds_down(dtype):
    # 255.875 / 255 rounds down to 1.0 in bf16: the top value needed code 255.875 and was clamped to 255 (-> 255.0)
    x = torch.tensor([[0.0] * 31 + [255.875]], dtype=dtype)
    qt = quantize_groups(x, 8, 32)
    assert qt.scale.float().item() * 255 >= x.float().max().item()  # every value is within the codes' reach
    assert abs(dequantize(qt, torch.float32)[0, -1].item() - x[0, -1].float().item()) <= qt.scale.float().item() / 2
    assert _half_step_violation(x, qt, dtype) <= 0


def test_fp32_scale_is_not_rounded():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    qt = quantize_groups(x, 4, 32)
    g = x.reshape(4, 2, 32)
    assert torch.equal(qt.scale, g.amax(-1) / 15 - g.amin(-1) / 15)


def test_meta_tensor_refused_up_front():
    with pytest.raises(ValueError, match="meta device"):
        quantize_groups(torch.empty(1, 64, device="meta"), 4, 32)


def test_scale_and_zero_axes_follow_kivi():
    k = torch.randn(1, 2, 64, 32)
    per_channel = quantize_groups(k, 4, 32, axis=-2)  # keys: groups of 32 tokens per channel
    per_token = quantize_groups(k, 4, 32, axis=-1)  # values: groups of 32 channels per token
    assert per_channel.scale.shape == (1, 2, 2, 32)
    assert per_token.scale.shape == (1, 2, 64, 1)


def test_bf16_group_with_minus_70000_stays_finite():
    x = torch.zeros(1, 32, dtype=torch.bfloat16)
    x[0, 0] = -70000.0
    x[0, 1] = 1000.0
    qt = quantize_groups(x, 4, 32, axis=-1)
    assert (
        qt.scale.dtype == torch.bfloat16 and torch.isfinite(qt.scale).all() and torch.isfinite(qt.zero).all()
    )
    x_hat = dequantize(qt)
    assert torch.isfinite(x_hat).all()
    assert x_hat[0, 0].item() == x[0, 0].item()  # the minimum is the zero point: exact (bf16 -70144)


def test_fp16_tiny_group_keeps_its_scale():
    x = (torch.linspace(1e-7, 9e-7, 32)).to(torch.float16).reshape(1, 32)
    qt = quantize_groups(x, 8, 32, axis=-1)
    assert qt.scale.float().item() > 0  # an fp16 scale would underflow here
    err = (dequantize(qt, torch.float32) - x.float()).abs().max().item()
    assert err < 0.05 * x.float().max().item()


@pytest.mark.parametrize("value", [9.0, 0.0, -3.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_constant_group_comes_back_exactly(value, dtype):
    x = torch.full((2, 64), value, dtype=dtype)
    qt = quantize_groups(x, 2, 32, axis=-1)
    x_hat = dequantize(qt)
    assert not torch.isnan(x_hat).any()
    assert torch.equal(x_hat, x)


def test_huge_finite_fp32_group_does_not_overflow_metadata():
    x = torch.tensor([[-3.0e38, 3.0e38, 0.0, 1.0]])
    qt = quantize_groups(x, 2, 4, axis=-1)
    assert torch.isfinite(qt.scale).all() and torch.isfinite(qt.zero).all()


def test_metadata_dtypes():
    assert metadata_dtypes(torch.bfloat16) == (torch.bfloat16, torch.bfloat16)
    assert metadata_dtypes(torch.float16) == (torch.bfloat16, torch.float16)
    assert metadata_dtypes(torch.float32) == (torch.float32, torch.float32)


@pytest.mark.parametrize("nbits", [1, 3, 16, "4", True])
def test_unsupported_nbits_named(nbits):
    with pytest.raises(ValueError, match="nbits"):
        quantize_groups(torch.randn(4, 32), nbits, 32)


def test_group_not_dividing_axis_named():
    with pytest.raises(ValueError, match="group_size 64 must divide axis -1 of length 96"):
        quantize_groups(torch.randn(4, 96), 4, 64, axis=-1)


def test_non_finite_and_integer_inputs_rejected():
    with pytest.raises(ValueError, match="inf or NaN"):
        quantize_groups(torch.tensor([[float("nan")] * 4]), 4, 4)
    with pytest.raises(ValueError, match="floating"):
        quantize_groups(torch.ones(4, 4, dtype=torch.int32), 4, 4)
