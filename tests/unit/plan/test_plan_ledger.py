"""Ledger: the mechanics chapter's [B] numbers, sliding/allocated, KIVI exact bytes and flush peaks, TP, paged, weights."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.plan import (
    build_ledger,
    kivi_bytes_per_head,
    kivi_kv_bytes,
    kivi_kv_bytes_breakdown,
    kv_bytes,
    kv_bytes_peak,
    kv_bytes_per_token,
    kv_dtype,
    kv_heads_per_rank,
    load_spec,
    max_context,
    paged_kv_bytes,
    quantized_tokens,
    read_safetensors_bytes,
    spec_from_config,
    weight_bytes,
)

GIB = 1024**3


@pytest.fixture(scope="module")
def llama():
    return load_spec("llama-3-8b")


def four_layer_sliding():
    # issue 3: 4 layers [sliding, full, sliding, full], window 128, 2048 B/token/layer (8 KV heads x 64 x 2 x 2 B)
    return spec_from_config(
        dict(
            num_hidden_layers=4,
            hidden_size=512,
            num_attention_heads=8,
            num_key_value_heads=8,
            head_dim=64,
            sliding_window=128,
            torch_dtype="bfloat16",
            layer_types=["sliding_attention", "full_attention"] * 2,
        )
    )


def test_seed_llama_ledger(llama):
    # mechanics chapter §01/§3.3: 131072 B/token; 8192 tokens = 1.0000 GiB; weights 14.96 GiB; batch 32 = 32.00 GiB, 2.14x
    assert kv_bytes_per_token(llama) == 131072
    assert kv_bytes(llama, 8192) == GIB
    weights = weight_bytes(llama)
    assert round(weights.total_bytes / GIB, 2) == 14.96
    ledger = build_ledger(llama, 8192, 32, weights)
    assert ledger.kv_bytes_total == 32 * GIB
    assert round(ledger.kv_to_weight_ratio, 2) == 2.14
    assert kv_bytes_per_token(llama.with_kv_heads(32)) == 524288  # MHA variant, mechanics chapter [B3]


def four_layer_chunked():
    # Llama-4 style: 3 chunked layers (chunks of 64 tokens) and one full layer, 2048 B/token/layer
    return spec_from_config(
        dict(
            num_hidden_layers=4,
            hidden_size=512,
            num_attention_heads=8,
            num_key_value_heads=8,
            head_dim=64,
            attention_chunk_size=64,
            torch_dtype="bfloat16",
            layer_types=["chunked_attention"] * 3 + ["full_attention"],
        )
    )


def test_chunked_layers_keep_at_most_one_chunk():
    spec = four_layer_chunked()
    # 1000 tokens: 3 chunked layers x 64 tokens + 1 full layer x 1000 tokens, 2048 B per token per layer
    assert kv_bytes(spec, 1000) == (3 * 64 + 1000) * 2048 == 2_441_216
    assert kv_bytes(spec, 1000, batch=3) == 3 * 2_441_216
    assert kv_bytes(spec, 1000, mode="allocated") == 4 * 1000 * 2048  # engines reserving full length
    assert kv_bytes(spec, 50) == kv_bytes(spec, 50, mode="allocated") == 4 * 50 * 2048  # within one chunk
    ledger = build_ledger(spec, 1000, 1, weight_bytes(spec, override_bytes=0))
    rows = {r.kind: r for r in ledger.rows}
    assert (rows["chunked"].tokens_stored, rows["chunked"].tokens_allocated) == (64, 1000)
    assert rows["chunked"].bytes_theoretical == 3 * 64 * 2048
    # KIVI-4 (G=32, R=64): a chunked layer's 64 tokens all sit in the residual window at 2 B
    per_head_full = kivi_bytes_per_head(1000, 64, 4, 32, 64, 2, 2)["total"]
    assert kivi_kv_bytes(spec, 1000, residual_length=64) == 8 * (3 * 64 * 64 * 2 * 2 + per_head_full)
    # the fit: the chunked layers stop growing, so each extra token costs one layer's 2048 B
    budget = kv_bytes(spec, 10_000)
    assert max_context(spec, 1, budget) == 10_000


def test_sliding_theoretical_vs_allocated():
    spec = four_layer_sliding()
    assert kv_bytes_per_token(spec) / 4 == 2048
    assert kv_bytes(spec, 1000) == 4_620_288
    assert kv_bytes(spec, 1000, mode="allocated") == 8_192_000
    assert kv_bytes(spec, 100) == kv_bytes(spec, 100, mode="allocated") == 819_200
    ledger = build_ledger(spec, 1000, 1, weight_bytes(spec, override_bytes=0))
    rows = {r.kind: r for r in ledger.rows}
    assert rows["sliding"].tokens_stored == 128 and rows["sliding"].tokens_allocated == 1000
    assert ledger.kv_bytes_allocated == 8_192_000


def test_kv_dtypes_scale_bytes(llama):
    assert kv_bytes_per_token(llama, "fp8") == 131072 // 2
    assert kv_bytes_per_token(llama, "fp32") == 131072 * 2
    assert kv_dtype("auto", "float32").name == "fp32"
    with pytest.raises(ValueError, match="kv_dtype"):
        kv_dtype("int3")


def test_kivi4_per_token_figure():
    # issue 3: KIVI-4, G=32, 16-bit scale+zero: 2048 elements per token cost 1024 + 2048/32 x 4 = 1280 B
    spec = spec_from_config(
        dict(
            num_hidden_layers=2,
            hidden_size=2880,
            num_attention_heads=64,
            head_dim=64,
            num_key_value_heads=8,
            torch_dtype="bfloat16",
        )
    )
    assert 2 * spec.kv_elements_per_token_per_layer == 2048
    assert kv_bytes_per_token(spec, kv_dtype("kivi4", "bfloat16", group_size=32)) == 1280
    # 2-bit: 512 B of codes + the same 256 B of metadata
    assert kv_bytes_per_token(spec, kv_dtype("kivi2", "bfloat16", group_size=32)) == 768


def _kivi_tensor_bytes(tokens, d, b, g, r, p, m):
    """Bytes of the tensors a KIVI layer holds for one head, built as numpy arrays of the documented shapes
    (token-by-token flush simulation: the residual spills G tokens once it reaches R + G)."""
    quantized = residual = 0
    for _ in range(tokens):
        residual += 1
        if residual == r + g:
            quantized, residual = quantized + g, residual - g
    meta = np.float16 if m == 2 else np.float32
    arrays = [
        np.zeros((quantized, d * b // 8), np.uint8),  # K codes, packed along head_dim
        np.zeros((quantized // g, d), meta),
        np.zeros((quantized // g, d), meta),  # K scale, zero per channel
        np.zeros((quantized, d * b // 8), np.uint8),  # V codes
        np.zeros((quantized, d // g), meta),
        np.zeros((quantized, d // g), meta),  # V scale, zero per token
        np.zeros((residual, d), np.float16 if p == 2 else np.float32),  # K residual
        np.zeros((residual, d), np.float16 if p == 2 else np.float32),  # V residual
    ]
    return quantized, sum(a.nbytes for a in arrays)


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.integers(0, 400),
    d=st.sampled_from([32, 64, 128]),
    b=st.sampled_from([2, 4, 8]),
    g=st.sampled_from([16, 32]),
    r_groups=st.integers(0, 4),
    p=st.sampled_from([2, 4]),
)
def test_kivi_exact_bytes_match_tensor_shapes(tokens, d, b, g, r_groups, p):
    r, m = r_groups * g, (4 if p == 4 else 2)
    quantized, expected = _kivi_tensor_bytes(tokens, d, b, g, r, p, m)
    assert quantized_tokens(tokens, g, r) == quantized
    got = kivi_bytes_per_head(tokens, d, b, g, r, p, m)
    assert got["total"] == expected == got["codes"] + got["scales_zeros"] + got["residual"]


def test_kivi_model_bytes_from_a_transformers_config_dict():
    cfg = dict(
        num_hidden_layers=3,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        torch_dtype="float32",
        model_type="qwen2",
    )
    spec = load_spec(cfg)
    per_head = kivi_bytes_per_head(300, 64, 4, 32, 128, 4, 4)["total"]
    assert kivi_kv_bytes(cfg, 300, batch=2) == 3 * 2 * 2 * per_head  # layers x batch x kv heads
    assert kivi_kv_bytes(spec, 300, 2) == kv_bytes(spec, 300, 2, "kivi4")
    breakdown = kivi_kv_bytes_breakdown(cfg, 300, 2, cache_dtype_bytes=2, metadata_bytes=2)
    assert set(breakdown) == {"codes", "scales_zeros", "residual", "total"}
    assert breakdown["total"] == sum(breakdown[k] for k in ("codes", "scales_zeros", "residual"))
    with pytest.raises(ValueError, match="MLA"):
        kivi_kv_bytes("deepseek-v3", 10)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(nbits=3), "nbits"),
        (dict(group_size=48), "group_size"),
        (dict(residual_length=40), "residual_length"),
    ],
)
def test_kivi_rejects_bad_settings(kwargs, match):
    args = (
        dict(
            tokens=10,
            head_dim=64,
            nbits=4,
            group_size=32,
            residual_length=128,
            cache_dtype_bytes=2,
            metadata_bytes=2,
        )
        | kwargs
    )
    with pytest.raises(ValueError, match=match):
        kivi_bytes_per_head(**args)


@settings(max_examples=40, deadline=None)
@given(
    window=st.integers(1, 200),
    r_groups=st.integers(0, 3),
    g=st.sampled_from([8, 16, 32]),
    pattern=st.lists(st.sampled_from(["sliding_attention", "full_attention"]), min_size=1, max_size=3),
    tokens=st.integers(0, 300),
)
def test_kivi_peak_equals_brute_force_prefix_max(window, r_groups, g, pattern, tokens):
    spec = spec_from_config(
        dict(
            num_hidden_layers=len(pattern),
            hidden_size=64,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            sliding_window=window,
            layer_types=pattern,
            torch_dtype="bfloat16",
        )
    )
    kvd = kv_dtype("kivi2", "bfloat16", group_size=g, residual_length=r_groups * g)
    brute = max(kv_bytes(spec, t, 1, kvd) for t in range(tokens + 1))
    assert kv_bytes_peak(spec, tokens, 1, kvd) == brute


def test_tensor_parallel_splits_replicates_and_keeps_mla_latent(llama):
    assert kv_heads_per_rank(llama, 2) == 4
    assert kv_bytes_per_token(llama, tp=2) == 131072 // 2
    assert kv_heads_per_rank(llama, 16) == 1  # 16 ranks, 8 heads: each head on two ranks
    assert kv_bytes_per_token(llama, tp=16) * 16 == 2 * 131072
    with pytest.raises(ValueError, match="tp"):
        kv_heads_per_rank(llama, 3)
    with pytest.raises(ValueError, match="tp"):
        kv_heads_per_rank(llama, 0)
    ds = load_spec("deepseek-v3")
    assert kv_bytes_per_token(ds, tp=8) == 70272  # latent replicated on every rank
    ledger = build_ledger(ds, 1000, 1, weight_bytes(ds), tp=8)
    assert ledger.kv_bytes_total == 8 * ledger.kv_bytes_total_per_gpu == 8 * 70272 * 1000


def test_paged_bytes_round_up_to_blocks(llama):
    assert paged_kv_bytes(llama, 17, 2, block_size_tokens=16) == kv_bytes(llama, 32, 2)
    assert paged_kv_bytes(llama, 32, 1, block_size_tokens=16) == kv_bytes(llama, 32, 1)
    with pytest.raises(ValueError, match="block_size_tokens"):
        paged_kv_bytes(llama, 1, block_size_tokens=0)


def _write_safetensors(path, tensors):
    """A minimal safetensors file: u64 header length, JSON header, zeroed data."""
    header, offset = {}, 0
    for name, (dtype, shape, itemsize) in tensors.items():
        size = int(np.prod(shape)) * itemsize
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))
    return offset


def test_weight_bytes_from_safetensors_header_index_and_directory(tmp_path):
    n = _write_safetensors(tmp_path / "model.safetensors", {"a": ("BF16", (3, 4), 2), "b": ("F32", (5,), 4)})
    assert n == 3 * 4 * 2 + 5 * 4
    assert read_safetensors_bytes(tmp_path / "model.safetensors")[0] == n
    cfg = dict(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=10
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = load_spec(tmp_path)
    assert spec.checkpoint_bytes == n
    assert weight_bytes(spec).total_bytes == n and "safetensors" in weight_bytes(spec).source
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 12345}, "weight_map": {}}))
    assert weight_bytes(spec, index_path=index).total_bytes == 12345
    assert read_safetensors_bytes(tmp_path)[0] == 12345  # the index wins in a directory
    index.write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(ValueError, match="total_size"):
        read_safetensors_bytes(index)


def test_weight_bytes_dtype_override_and_moe_active():
    spec = load_spec("llama-3-8b")
    assert weight_bytes(spec, "fp8").total_bytes == spec.num_parameters
    assert weight_bytes(spec, override_bytes=10**9).total_bytes == 10**9
    with pytest.raises(ValueError, match="weight_dtype"):
        weight_bytes(spec, "int3")
    ds = weight_bytes(load_spec("deepseek-v3"))
    assert ds.active_bytes < ds.total_bytes / 10
