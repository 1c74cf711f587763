"""The Triton KIVI kernel equals the torch path. Runs on CUDA, or on the CPU under TRITON_INTERPRET=1
(`TRITON_INTERPRET=1 pytest tests/unit/attention/test_triton_kivi.py` with triton installed); skips otherwise."""

import os

import pytest
import torch

from kvlab.attention.quantized import kivi_attention
from kvlab.attention.triton_kivi import HAS_TRITON
from kvlab.quant import KIVIConfig, KIVIState

pytestmark = pytest.mark.skipif(
    not HAS_TRITON or not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"),
    reason="needs triton and CUDA (or TRITON_INTERPRET=1 on the CPU)",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("nbits", [2, 4, 8])
@pytest.mark.parametrize("batch,kv_heads,groups", [(1, 1, 1), (2, 2, 3), (1, 2, 8)])
@pytest.mark.parametrize("tokens", [32, 150, 300])
def test_triton_equals_torch(nbits, batch, kv_heads, groups, tokens):
    torch.manual_seed(tokens + nbits)
    head_dim, group = 64, 32
    state = KIVIState(KIVIConfig(nbits=nbits, group_size=group, residual_length=32, block_tokens=128))
    k = torch.randn(batch, kv_heads, tokens, head_dim, device=DEVICE)
    state.append(k, torch.randn_like(k))
    segments = list(state.segments())
    kw, vw = state.append(
        torch.randn(batch, kv_heads, 1, head_dim, device=DEVICE),
        torch.randn(batch, kv_heads, 1, head_dim, device=DEVICE),
    )
    q = torch.randn(batch, kv_heads * groups, 1, head_dim, device=DEVICE)
    mask = torch.ones(batch, 1, 1, state.total_tokens, dtype=torch.bool, device=DEVICE)
    if batch > 1:
        mask[1, ..., :7] = False  # left padding
    ref = kivi_attention(q, segments, kw, vw, nbits, group, 0.125, attention_mask=mask, backend="torch")
    got = kivi_attention(q, segments, kw, vw, nbits, group, 0.125, attention_mask=mask, backend="triton")
    torch.testing.assert_close(got, ref, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("nbits", [2, 4])
def test_many_blocks_one_merge_equals_torch(nbits):
    """Sixteen blocks, the last one partly filled (a strided view of its storage, read in place), left padding on
    one batch row: the one-merge Triton path equals the torch path."""
    torch.manual_seed(nbits)
    head_dim, group = 128, 32
    state = KIVIConfig(nbits=nbits, group_size=group, residual_length=32, block_tokens=64)
    state = KIVIState(state)
    k = torch.randn(2, 2, 1040, head_dim, device=DEVICE)
    state.append(k, torch.randn_like(k))
    segments = list(state.segments())
    assert len(segments) >= 16 and not segments[-1].k_codes.is_contiguous()
    kw, vw = state.append(
        torch.randn(2, 2, 1, head_dim, device=DEVICE), torch.randn(2, 2, 1, head_dim, device=DEVICE)
    )
    q = torch.randn(2, 8, 1, head_dim, device=DEVICE)
    mask = torch.ones(2, 1, 1, state.total_tokens, dtype=torch.bool, device=DEVICE)
    mask[1, ..., :100] = False
    ref = kivi_attention(q, segments, kw, vw, nbits, group, 0.088, attention_mask=mask, backend="torch")
    got = kivi_attention(q, segments, kw, vw, nbits, group, 0.088, attention_mask=mask, backend="triton")
    torch.testing.assert_close(got, ref, rtol=2e-4, atol=2e-4)


def test_partials_refuse_a_valid_list_of_the_wrong_length():
    from kvlab.attention.triton_kivi import kivi_partials

    state = KIVIState(KIVIConfig(nbits=4, group_size=32, residual_length=32, block_tokens=64))
    k = torch.randn(1, 1, 200, 64, device=DEVICE)
    state.append(k, torch.randn_like(k))
    segments = list(state.segments())
    with pytest.raises(ValueError, match=r"one entry per segment \(\d+\), got 1"):
        kivi_partials(torch.randn(1, 1, 1, 64, device=DEVICE), segments, 4, 32, 1.0, [None])
