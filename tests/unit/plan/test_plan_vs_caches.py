"""The planner's predicted bytes equal what kvlab's caches measure, on a tiny random Qwen2 (CPU).

The lead's integration test does the same on the bundled reference model; this one covers the same path with a
random model so it runs without the bundled weights.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kvlab.plan import kivi_kv_bytes_breakdown, kv_bytes, load_spec, paged_kv_bytes  # noqa: E402
from kvlab.plan.ledger import kv_metadata_bytes  # noqa: E402
from kvlab.runtime.hf_api import cache_kwarg  # noqa: E402


@pytest.fixture(scope="module")
def tiny_qwen2():
    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config).eval()


def _prefill(model, cache, dtype, tokens, batch):
    ids = torch.randint(0, 64, (batch, tokens), generator=torch.Generator().manual_seed(tokens))
    with torch.no_grad():
        model.to(dtype)(ids, **{cache_kwarg(model): cache}, use_cache=True)
    return cache


@pytest.mark.parametrize("dtype, p", [(torch.float32, 4), (torch.bfloat16, 2)])
@pytest.mark.parametrize("tokens", [5, 159, 160, 161, 300])
def test_kivi_cache_bytes_match_planner(tiny_qwen2, dtype, p, tokens):
    from kvlab.caches.kivi import KIVICache

    cache = _prefill(tiny_qwen2, KIVICache(nbits=4, group_size=32, residual_length=128), dtype, tokens, 2)
    predicted = kivi_kv_bytes_breakdown(
        tiny_qwen2.config.to_dict(),
        tokens,
        2,
        nbits=4,
        group_size=32,
        residual_length=128,
        cache_dtype_bytes=p,
    )
    measured = cache.nbytes_breakdown()
    assert {k: measured[k] for k in predicted} == predicted
    spec = load_spec({**tiny_qwen2.config.to_dict(), "torch_dtype": "float32" if p == 4 else "bfloat16"})
    assert (
        kv_metadata_bytes(spec, tokens, 2, "kivi4") == measured["scales_zeros"]
    )  # the plan's "of which" row


@pytest.mark.parametrize("tokens", [5, 16, 17, 100])
def test_dynamic_and_paged_cache_bytes_match_planner(tiny_qwen2, tokens):
    from kvlab.caches.measure import cache_nbytes
    from kvlab.caches.paged import PagedCache

    spec = load_spec({**tiny_qwen2.config.to_dict(), "torch_dtype": "bfloat16"})
    dynamic = _prefill(tiny_qwen2, transformers.DynamicCache(), torch.bfloat16, tokens, 3)
    assert cache_nbytes(dynamic) == kv_bytes(spec, tokens, 3)
    paged = _prefill(tiny_qwen2, PagedCache(block_size=16), torch.bfloat16, tokens, 3)
    assert paged.nbytes() == paged_kv_bytes(spec, tokens, 3, block_size_tokens=16)


@pytest.mark.parametrize(
    "name", ["fp8-e4m3", "fp8_e5m2", "fp8-e4m3-tensor", "fp8-e5m2-unscaled", "fp8-e4m3-hadamard"]
)
@pytest.mark.parametrize("tokens, batch", [(1, 1), (37, 3)])
def test_fp8_cache_bytes_match_planner(tiny_qwen2, name, tokens, batch):
    """FP8Cache: half of the bf16 cache plus its fp32 scales, as the planner predicts for --kv-dtype <name>."""
    from kvlab.caches.registry import resolve
    from kvlab.plan.kv_formats import kv_dtype
    from kvlab.plan.ledger import fp8_scale_bytes

    spec = load_spec({**tiny_qwen2.config.to_dict(), "torch_dtype": "bfloat16"})
    cache = _prefill(tiny_qwen2, resolve(name.replace("_", "-")).make(None), torch.bfloat16, tokens, batch)
    assert cache.nbytes() == kv_bytes(spec, tokens, batch, name)
    scales = fp8_scale_bytes(spec, kv_dtype(name), tokens) * spec.kv_layers * batch
    assert cache.nbytes_breakdown()["scales"] == scales
    assert kv_metadata_bytes(spec, tokens, batch, name) == scales  # the plan's "of which FP8 scales" row
    assert 2 * (cache.nbytes() - scales) == kv_bytes(spec, tokens, batch, "bf16")  # exactly half of bf16


@pytest.mark.parametrize("key_bits, value_bits", [(8, 4), (4, 2)])
def test_asymmetric_kivi_cache_bytes_match_planner(tiny_qwen2, key_bits, value_bits):
    from kvlab.caches.kivi import KIVICache

    tokens = 300
    cache = KIVICache(key_bits=key_bits, value_bits=value_bits, group_size=32, residual_length=128)
    _prefill(tiny_qwen2, cache, torch.bfloat16, tokens, 2)
    predicted = kivi_kv_bytes_breakdown(
        tiny_qwen2.config.to_dict(), tokens, 2, nbits=key_bits, value_bits=value_bits, cache_dtype_bytes=2
    )
    measured = cache.nbytes_breakdown()
    assert {k: measured[k] for k in predicted} == predicted
    spec = load_spec({**tiny_qwen2.config.to_dict(), "torch_dtype": "bfloat16"})
    assert cache.nbytes() == kv_bytes(spec, tokens, 2, f"kivi-k{key_bits}v{value_bits}")
    assert kv_metadata_bytes(spec, tokens, 2, f"kivi-k{key_bits}v{value_bits}") == measured["scales_zeros"]
