"""ModelSpec from config.json: head_dim, KV heads, GPT-2 names, nesting, MLA, sliding, hybrid, shared, errors."""

from __future__ import annotations

import json
import sys
import types

import pytest

from kvlab.plan import kv_bytes_per_token, load_spec, spec_from_config
from kvlab.plan.config_fields import CHUNKED, FULL, NO_KV, SHARED, SLIDING


def base(**kw):
    cfg = dict(
        num_hidden_layers=2,
        hidden_size=256,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=512,
        vocab_size=1000,
        torch_dtype="bfloat16",
    )
    cfg.update(kw)
    return cfg


def test_head_dim_read_from_config_not_derived():
    # issue 3: {layers 2, hidden 2880, heads 64, head_dim 64, kv heads 8, bf16} -> 4096 B/token (derived 45: 2880)
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
    assert spec.head_dim == 64
    assert kv_bytes_per_token(spec) == 4096
    assert any("45" in n for n in spec.notes)


def test_head_dim_null_falls_back_to_hidden_over_heads():
    spec = spec_from_config(base(head_dim=None))
    assert spec.head_dim == 256 // 8


def test_missing_kv_heads_means_mha_and_multi_query_means_one():
    cfg = base()
    del cfg["num_key_value_heads"]
    assert spec_from_config(cfg).num_kv_heads == 8
    assert spec_from_config(base(num_key_value_heads=None)).num_kv_heads == 8
    mq = base(multi_query=True)
    del mq["num_key_value_heads"]
    assert spec_from_config(mq).num_kv_heads == 1
    # Falcon-40B style: new_decoder_architecture uses num_kv_heads despite multi_query
    falcon40 = base(multi_query=True, new_decoder_architecture=True, num_kv_heads=4)
    del falcon40["num_key_value_heads"]
    assert spec_from_config(falcon40).num_kv_heads == 4


def test_gpt2_names():
    spec = spec_from_config(dict(n_layer=3, n_embd=96, n_head=4, vocab_size=100, n_positions=64))
    assert (
        spec.num_layers,
        spec.hidden_size,
        spec.num_attention_heads,
        spec.num_kv_heads,
        spec.head_dim,
    ) == (3, 96, 4, 4, 24)
    assert spec.max_position_embeddings == 64


def test_nested_text_config_inherits_outer_dtype():
    inner = base(torch_dtype=None)
    spec = spec_from_config({"model_type": "vlm", "torch_dtype": "float32", "text_config": inner})
    assert spec.dtype == "float32"
    assert spec.num_layers == 2
    assert any("text_config" in n for n in spec.notes)


def test_mla_caches_one_latent_not_k_and_v():
    # issue 3: MLA {layers 2, kv_lora_rank 512, qk_rope_head_dim 64, bf16} -> 2304 B/token
    cfg = dict(
        num_hidden_layers=2,
        hidden_size=1024,
        num_attention_heads=16,
        num_key_value_heads=16,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        head_dim=64,
        torch_dtype="bfloat16",
    )
    spec = spec_from_config(cfg)
    assert spec.is_mla
    assert kv_bytes_per_token(spec) == 2304 == 2 * (512 + 64) * 2


@pytest.mark.parametrize(
    "extra, kinds",
    [
        (
            dict(sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 2),
            [SLIDING, FULL] * 2,
        ),
        (dict(sliding_window=128, sliding_window_pattern=2), [SLIDING, FULL] * 2),
        (dict(sliding_window=128, model_type="gemma2"), [SLIDING, FULL] * 2),
        (dict(sliding_window=128, model_type="mistral"), [SLIDING] * 4),
        (dict(sliding_window=128, use_sliding_window=False), [FULL] * 4),
        (dict(sliding_window=128, model_type="qwen2"), [FULL] * 4),  # Qwen2 default: use_sliding_window false
        (
            dict(sliding_window=128, model_type="qwen2", use_sliding_window=True, max_window_layers=3),
            [FULL] * 3 + [SLIDING],
        ),
        (dict(sliding_window=None), [FULL] * 4),
        (dict(attn_layer_period=2, attn_layer_offset=1), [NO_KV, FULL] * 2),
        (dict(hybrid_override_pattern="M*-*"), [NO_KV, FULL, NO_KV, FULL]),
        (dict(layers_block_type=["mamba", "attention", "mamba", "attention"]), [NO_KV, FULL] * 2),
        (dict(layer_types=["linear_attention"] * 3 + ["full_attention"]), [NO_KV] * 3 + [FULL]),
        (
            dict(attention_chunk_size=64, layer_types=["chunked_attention"] * 3 + ["full_attention"]),
            [CHUNKED] * 3 + [FULL],
        ),
        (
            dict(num_kv_shared_layers=1, sliding_window=128, sliding_window_pattern=2),
            [SLIDING, FULL, SLIDING, SHARED],
        ),
    ],
)
def test_layer_kinds(extra, kinds):
    assert list(spec_from_config(base(num_hidden_layers=4, **extra)).layer_kinds) == kinds


def test_six_layers_two_shared_cost_four_layers():
    # issue 3: six layers with two KV-shared -> 8192 B/token (2048 B/token/layer: 2 x 4 heads x 128 x 2 B)
    spec = spec_from_config(
        dict(
            num_hidden_layers=6,
            hidden_size=512,
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=128,
            num_kv_shared_layers=2,
            torch_dtype="bfloat16",
        )
    )
    assert spec.count(SHARED) == 2
    assert kv_bytes_per_token(spec) == 8192


@pytest.mark.parametrize(
    "cfg, field",
    [
        ({"hidden_size": 64, "num_attention_heads": 4}, "num_hidden_layers"),
        (base(num_hidden_layers=0), "num_hidden_layers"),
        (base(num_hidden_layers="two"), "num_hidden_layers"),
        (base(num_attention_heads=2.5), "num_attention_heads"),
        (base(num_key_value_heads=3), "num_key_value_heads"),
        (base(head_dim=-1), "head_dim"),
        (base(hidden_size=250, num_attention_heads=8), "head_dim"),
        (base(sliding_window=16, layer_types=["full_attention"]), "layer_types"),
        (base(sliding_window=16, layer_types=["full_attention", "banana"]), "layer_types[1]"),
        (base(layer_types=["sliding_attention", "full_attention"]), "sliding_window"),
        (base(num_kv_shared_layers=2), "num_kv_shared_layers"),
        (base(kv_lora_rank=512), "qk_rope_head_dim"),
        (base(torch_dtype="int3"), "torch_dtype"),
        (base(hybrid_override_pattern="MX"), "hybrid_override_pattern[1]"),
        (base(attn_layer_period=2, attn_layer_offset=2), "attn_layer_offset"),
        (base(text_config=[1, 2]), "text_config"),
        (base(layer_types=["mamba", "mamba"]), "no layer that stores K/V"),
        (base(layer_types=["chunked_attention", "full_attention"]), "attention_chunk_size"),
    ],
)
def test_malformed_config_names_the_field(cfg, field):
    with pytest.raises(ValueError, match=__import__("re").escape(field)):
        spec_from_config(cfg)


def test_non_dict_config_rejected():
    with pytest.raises(ValueError, match="JSON object"):
        spec_from_config([1, 2, 3])


def test_load_from_file_directory_preset_and_dict(tmp_path):
    cfg = base()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    from_file = load_spec(tmp_path / "config.json")
    from_dir = load_spec(str(tmp_path))
    from_dict = load_spec(cfg)
    assert from_file.layer_kinds == from_dir.layer_kinds == from_dict.layer_kinds
    assert kv_bytes_per_token(from_file) == kv_bytes_per_token(from_dict) == 2 * 2 * 2 * 32 * 2
    assert load_spec("LLAMA-3-8B").name == "llama-3-8b"
    assert load_spec("meta-llama/meta-llama-3-8b").name == "llama-3-8b"
    assert load_spec(from_file) is from_file


def test_directory_without_config_and_bad_json(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        load_spec(tmp_path)
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_spec(bad)


def test_unknown_model_lists_presets():
    with pytest.raises(ValueError, match="llama-3-8b"):
        load_spec("no-such-model")


def test_hub_id_uses_huggingface_hub_when_importable(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps(base(num_hidden_layers=5)))
    calls = []

    def fake_download(repo_id, filename, local_files_only=False):
        calls.append((repo_id, filename, local_files_only))
        return str(tmp_path / "config.json")

    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(hf_hub_download=fake_download))
    spec = load_spec("some-org/some-model")
    assert spec.num_layers == 5 and spec.name == "some-org/some-model"
    assert calls[0] == ("some-org/some-model", "config.json", True)  # cached copy first


def test_hub_id_without_huggingface_hub_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import raises ImportError
    with pytest.raises(ValueError, match="huggingface_hub"):
        load_spec("some-org/some-model")


def test_with_kv_heads_mha_variant_and_mla_refuses():
    spec = load_spec("llama-3-8b")
    assert kv_bytes_per_token(spec.with_kv_heads(32)) == 524288  # mechanics chapter [B3]
    with pytest.raises(ValueError, match="MLA"):
        load_spec("deepseek-v3").with_kv_heads(8)
