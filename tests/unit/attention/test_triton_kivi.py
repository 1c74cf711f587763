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
