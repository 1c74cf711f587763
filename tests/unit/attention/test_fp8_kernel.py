"""The FP8 decode path of the compiled CPU kernel: every float8 code converts exactly, attention over codes equals
decode-then-attention, and a fused FP8Cache gives the logits of its dequantize path (kernel or not)."""

import pytest
import torch
from transformers import DynamicCache

import kvlab.attention
from kvlab.attention import cpu_kernel
from kvlab.attention.context import current
from kvlab.caches.fp8 import FP8Cache
from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2

needs_kernel = pytest.mark.skipif(
    cpu_kernel.unavailable_reason() is not None,
    reason=f"the CPU kernel cannot be built here: {cpu_kernel.unavailable_reason()}",
)
FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]


def _finite_codes(dtype: torch.dtype) -> torch.Tensor:
    """Every finite code of ``dtype`` (subnormals, both zeros and the extremes included), as ``dtype``."""
    codes = torch.arange(256, dtype=torch.uint8).view(dtype)
    return codes[torch.isfinite(codes.float())]


def _reference(query, keys, values, scaling, valid):
    """Float attention, KV heads repeated; ``valid`` bool ``[B, q, kv]`` (True = attend) or None."""
    g = query.shape[1] // keys.shape[1]
    k, v = (x.float().repeat_interleave(g, dim=1) for x in (keys, values))
    scores = query.float() @ k.transpose(-1, -2) * scaling
    if valid is not None:
        scores = scores.masked_fill(~valid[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_code_converts_exactly(fmt):
    """Uniform attention (a zero query) over one token per code returns their mean: each code's value must be
    torch's own conversion, subnormals and negative zero included (the kernel moves bits, it does not round)."""
    codes = _finite_codes(fmt)  # [n]
    n = codes.numel()
    values = codes.view(1, 1, n, 1).expand(1, 1, n, 8).contiguous()  # token i holds code i in every channel
    query = torch.zeros(1, 1, 1, 8)
    window = torch.zeros(1, 1, 0, 8)
    for t in range(n):  # the output is the one unmasked token's value: code t exactly
        valid = torch.zeros(1, 1, n, dtype=torch.bool)
        valid[0, 0, t] = True
        out = cpu_kernel.fp8_decode_attention(
            query, values, values, None, None, window, window, 1.0, valid, 0
        )
        assert out[0, 0, 0, 0].item() == codes[t].float().item(), (t, codes[t])


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("head_dim", [64, 128, 40])
@pytest.mark.parametrize("tokens", [1, 8, 37, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_decode_then_attention(fmt, head_dim, tokens, dtype):
    """Batch 2, GQA 4/2, per-head key scales and per-sequence value scales, a one-token window, left padding in
    row 1: fp32 to float32 rounding; a bf16 query gets the fp32 result rounded once."""
    torch.manual_seed(tokens)
    b, h, w = 2, 2, 1
    query = torch.randn(b, 4, 1, head_dim).to(dtype)
    kc, vc = ((torch.randn(b, h, tokens, head_dim) * 3).to(fmt) for _ in range(2))
    ks, vs = torch.rand(b, h, 1, 1) + 0.5, torch.rand(b, 1, 1, 1) + 0.5
    kw, vw = (torch.randn(b, h, w, head_dim).to(dtype) for _ in range(2))
    valid = torch.ones(b, 1, tokens + w, dtype=torch.bool)
    valid[1, :, : min(3, tokens)] = False
    keys = torch.cat((kc.float() * ks, kw.float()), dim=2)
    values = torch.cat((vc.float() * vs, vw.float()), dim=2)
    want = _reference(query, keys, values, head_dim**-0.5, valid)
    got = cpu_kernel.fp8_decode_attention(query, kc, vc, ks, vs, kw, vw, head_dim**-0.5, valid, 0)
    assert got.dtype == dtype and got.shape == want.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(got, want.to(dtype), rtol=0, atol=float(want.abs().max()) * 2**-7)


def _decode_logits(model, cache, ids, steps):
    """Prefill ``ids[:, :-steps]``, then feed the last ``steps`` tokens one at a time: ``[B, steps, vocab]``."""
    kw = cache_kwarg(model)
    mask = (ids != 0).long()
    out = []
    with torch.no_grad():
        n = ids.shape[1] - steps
        model(input_ids=ids[:, :n], attention_mask=mask[:, :n], use_cache=True, **{kw: cache})
        for i in range(n, ids.shape[1]):
            step = model(
                input_ids=ids[:, i : i + 1], attention_mask=mask[:, : i + 1], use_cache=True, **{kw: cache}
            )
            out.append(step.logits[:, -1])
    return torch.stack(out, dim=1)


@pytest.fixture(scope="module")
def models():
    """The tiny Qwen2 with head_dim 32 (kernel) and 36 (not a multiple of 8: the decode-then-SDPA fallback)."""
    return {d: make_tiny_qwen2(head_dim=d, max_positions=512) for d in (32, 36)}


@pytest.mark.parametrize("settings", [("e4m3", "per-head", "none"), ("e5m2", "per-tensor", "none"),
                                      ("e4m3", "none", "none"), ("e4m3", "per-head", "hadamard")])  # fmt: skip
@pytest.mark.parametrize("head_dim", [32, 36])
@pytest.mark.parametrize("kernel", [True, False])
def test_fused_cache_equals_its_dequantize_path(models, settings, head_dim, kernel, monkeypatch):
    """Batch 2 with left padding in row 1, 6 decode steps: the fused cache (codes read in the attention, by the
    kernel or decoded there) gives the dequantize path's logits, and the FP8 rounding is really there."""
    if settings[2] == "hadamard" and head_dim == 36:
        pytest.skip("the rotation needs a power-of-two head_dim")
    if kernel and cpu_kernel.unavailable_reason() is not None:
        pytest.skip(f"the CPU kernel cannot be built here: {cpu_kernel.unavailable_reason()}")
    if not kernel:
        monkeypatch.setenv("KVLAB_CPU_KERNEL", "0")
    calls = []
    real = cpu_kernel.fp8_decode_attention
    monkeypatch.setattr(cpu_kernel, "fp8_decode_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = models[head_dim]
    ids = torch.randint(1, 256, (2, 50), generator=torch.Generator().manual_seed(5))
    ids[1, :4] = 0  # left padding
    kvlab.attention.enable(model)
    try:
        plain = _decode_logits(model, FP8Cache(*settings), ids, 6)
        fused = _decode_logits(model, FP8Cache(*settings, attention="fused"), ids, 6)
        dynamic = _decode_logits(model, DynamicCache(), ids, 6)
    finally:
        model.set_attn_implementation("sdpa")
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-4)
    assert float((fused - dynamic).abs().max()) > 1e-4  # the FP8 rounding is really there
    assert bool(calls) == (
        kernel and head_dim % 8 == 0
    )  # 6 steps x 2 layers went through the kernel, or none
    assert current() is None
