"""Presets: every public config parses, and the KV bytes and parameter counts match the models' public numbers."""

from __future__ import annotations

import pytest

from kvlab.plan import kv_bytes, kv_bytes_per_token, load_spec, presets
from kvlab.plan.config_fields import FULL, NO_KV, SHARED, SLIDING


@pytest.mark.parametrize("name", presets.names())
def test_every_preset_parses_and_has_a_source(name):
    preset = presets.get(name)
    spec = load_spec(name)
    assert spec.kv_layers >= 1
    assert preset.source_url.startswith("https://huggingface.co/") and preset.hub_id in preset.source_url
    assert presets.find(preset.hub_id.upper()) is preset


def test_at_least_a_dozen_presets():
    assert len(presets.names()) >= 12


# Bytes per token from the architecture as published (2 x KV layers x KV heads x head_dim x 2 B, bf16).
@pytest.mark.parametrize(
    "name, expected",
    [
        ("llama-3-8b", 2 * 32 * 8 * 128 * 2),  # 131072, mechanics chapter §3.3
        ("llama-3.1-8b", 2 * 32 * 8 * 128 * 2),
        ("llama-3-70b", 2 * 80 * 8 * 128 * 2),
        ("mistral-small-24b", 2 * 40 * 8 * 128 * 2),  # head_dim 128, not 5120/32 = 160
        ("gpt-oss-20b", 2 * 24 * 8 * 64 * 2),  # head_dim 64, not 2880/64 = 45
        ("qwen2.5-0.5b", 2 * 24 * 2 * 64 * 2),
        ("deepseek-v3", 61 * (512 + 64) * 2),  # 70272: MLA latent
        ("jamba-v0.1", 2 * 4 * 8 * 128 * 2),  # attention in 4 of 32 layers
        ("gemma-3n-e4b", 2 * 20 * 2 * 256 * 2),  # 15 of 35 layers share KV
        ("falcon-7b", 2 * 32 * 1 * 64 * 2),  # multi_query
        ("gemma-3-1b", 2 * 26 * 1 * 256 * 2),
    ],
)
def test_kv_bytes_per_token_of_public_models(name, expected):
    assert kv_bytes_per_token(load_spec(name)) == expected


def test_deepseek_v3_is_about_25x_smaller_than_a_naive_mha_count():
    spec = load_spec("deepseek-v3")
    naive = 2 * 61 * 128 * (7168 // 128) * 2  # kv heads 128 x head_dim derived 56
    assert kv_bytes_per_token(spec) == 70272
    assert 24 < naive / 70272 < 26


def test_layer_patterns_of_sliding_presets():
    oss = load_spec("gpt-oss-20b")
    assert oss.layer_kinds[:4] == (SLIDING, FULL, SLIDING, FULL) and oss.sliding_window == 128
    gemma2 = load_spec("gemma-2-9b")
    assert gemma2.count(SLIDING) == gemma2.count(FULL) == 21 and gemma2.layer_kinds[0] == SLIDING
    gemma3 = load_spec("gemma-3-1b")
    assert [i for i, k in enumerate(gemma3.layer_kinds) if k == FULL] == [5, 11, 17, 23]
    jamba = load_spec("jamba-v0.1")
    assert [i for i, k in enumerate(jamba.layer_kinds) if k != NO_KV] == [4, 12, 20, 28]
    e4b = load_spec("gemma-3n-e4b")
    assert e4b.layer_kinds[20:] == (SHARED,) * 15
    assert load_spec("qwen2.5-7b").count(FULL) == 28  # use_sliding_window false


def test_gpt_oss_sliding_layers_cap_at_128_tokens():
    spec = load_spec("gpt-oss-20b")
    per_layer = 2 * 8 * 64 * 2
    assert kv_bytes(spec, 131072) == 12 * 131072 * per_layer + 12 * 128 * per_layer
    assert kv_bytes(spec, 131072, mode="allocated") == 24 * 131072 * per_layer


# Public parameter totals (model cards / hub safetensors counts), checked within 1 %.
@pytest.mark.parametrize(
    "name, params",
    [
        ("llama-3-8b", 8.03e9),
        ("llama-3-70b", 70.6e9),
        ("mistral-7b-v0.1", 7.24e9),
        ("qwen2.5-0.5b", 0.494e9),
        ("qwen2.5-7b", 7.62e9),
        ("gemma-2-9b", 9.24e9),
        ("gpt-oss-20b", 20.9e9),
        ("deepseek-v3", 671e9),
        ("jamba-v0.1", 51.6e9),
        ("falcon-7b", 6.92e9),
        ("gpt2", 124.4e6),
    ],
)
def test_parameter_estimate_matches_public_totals(name, params):
    assert load_spec(name).num_parameters == pytest.approx(params, rel=0.01)


def test_moe_active_parameters():
    assert load_spec("deepseek-v3").num_active_parameters == pytest.approx(37e9, rel=0.03)  # "37B activated"
    # gpt-oss-20b card: 3.6B active excluding the 0.58B embedding table, which our count includes
    assert load_spec("gpt-oss-20b").num_active_parameters - 201088 * 2880 == pytest.approx(3.6e9, rel=0.03)


def test_llama_3_1_has_llama_3_geometry_at_a_128k_limit():
    """Llama-3.1-8B: the KV of llama-3-8b, its context limit 131,072 (a new user found no preset for it)."""
    spec, old = load_spec("llama-3.1-8b"), load_spec("llama-3-8b")
    assert kv_bytes_per_token(spec) == kv_bytes_per_token(old)
    assert spec.context_limit == 131072 and old.context_limit == 8192
    assert load_spec("meta-llama/Llama-3.1-8B").context_limit == 131072
