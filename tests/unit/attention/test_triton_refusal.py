"""triton_refusal names why the Triton KIVI kernel cannot run (checked without Triton or a GPU: the module's
HAS_TRITON is patched), and kivi_attention(backend="triton") carries that reason in its error."""

import pytest
import torch

from kvlab.attention import triton_kivi
from kvlab.attention.quantized import kivi_attention
from kvlab.quant import KIVIConfig, KIVIState

CPU = torch.empty(0)


def test_each_refusal_names_its_reason(monkeypatch):
    monkeypatch.setattr(triton_kivi, "HAS_TRITON", False)
    assert triton_kivi.triton_refusal(CPU, 64, 4, 32) == "Triton is not installed"
    monkeypatch.setattr(triton_kivi, "HAS_TRITON", True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "got device cpu" in triton_kivi.triton_refusal(CPU, 64, 4, 32)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_kivi.triton_refusal(CPU, 64, 4, 32) is None
    assert "(96 x 4 / 8 = 48 B) must be a power of two" in triton_kivi.triton_refusal(CPU, 96, 4, 32)
    assert "(16 x 4 / 8 = 8 B)" in triton_kivi.triton_refusal(CPU, 16, 4, 16)
    assert "group_size 48 must divide" in triton_kivi.triton_refusal(CPU, 64, 4, 48)


def test_kivi_attention_with_backend_triton_says_why_it_cannot_run():
    query = torch.randn(1, 2, 1, 64)
    if triton_kivi.triton_refusal(query, 64, 4, 32) is None:
        pytest.skip("Triton runs here")
    state = KIVIState(KIVIConfig(nbits=4, group_size=32, residual_length=32))
    state.append(torch.randn(1, 1, 100, 64), torch.randn(1, 1, 100, 64))
    segments = list(state.segments())
    kw, vw = state.append(torch.randn(1, 1, 1, 64), torch.randn(1, 1, 1, 64))
    why = triton_kivi.triton_refusal(query, 64, 4, 32)
    with pytest.raises(
        RuntimeError, match=r"cannot run here \(device cpu, head_dim 64, nbits 4, group_size 32\): "
    ) as e:
        kivi_attention(query, segments, kw, vw, 4, 32, 0.125, backend="triton")
    assert str(e.value).endswith(why)
