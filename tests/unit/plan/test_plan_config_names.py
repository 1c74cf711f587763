"""The planner reads KV heads, head_dim and sliding windows under every name the transformers and vLLM loaders
know, and refuses a config it cannot read with certainty, naming the field (never a guess)."""

from __future__ import annotations

import re

import pytest

from kvlab.plan import kv_bytes_per_token, spec_from_config
from kvlab.plan.config_fields import FULL, NO_KV, SLIDING


def chatglm(**kw):
    """The fields of THUDM/chatglm3-6b's config.json that size the cache (remote-code ChatGLMConfig names)."""
    cfg = dict(
        model_type="chatglm",
        num_layers=28,
        hidden_size=4096,
        num_attention_heads=32,
        kv_channels=128,
        multi_query_attention=True,
        multi_query_group_num=2,
        seq_length=32768,
        padded_vocab_size=65024,
        ffn_hidden_size=13696,
        torch_dtype="float16",
    )
    cfg.update(kw)
    return {k: v for k, v in cfg.items() if v is not None}


def test_chatglm_reads_multi_query_group_num_and_kv_channels():
    spec = spec_from_config(chatglm())
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (28, 2, 128)
    assert spec.max_position_embeddings == 32768  # `seq_length`
    # 2 (K and V) x 28 layers x 2 KV heads x 128 x 2 B (fp16) = 28,672 B/token, not 458,752 (32 heads)
    assert kv_bytes_per_token(spec) == 28_672


def test_chatglm_multi_query_switch():
    # the switch off: every query head has its own K/V, as ChatGLM's model code reads it
    mha = spec_from_config(chatglm(multi_query_attention=False))
    assert mha.num_kv_heads == 32 and kv_bytes_per_token(mha) == 458_752
    assert any("multi_query_group_num" in n for n in mha.notes)
    # no switch on a ChatGLM config: its config class defaults it to false, vLLM reads 2 KV heads -> refused
    with pytest.raises(ValueError, match="multi_query_attention"):
        spec_from_config(chatglm(multi_query_attention=None))
    # no switch and no ChatGLM model type: read as vLLM's ModelConfig does, and said so
    plain = spec_from_config(chatglm(multi_query_attention=None, model_type=None))
    assert plain.num_kv_heads == 2 and any("vLLM" in n for n in plain.notes)


def test_kv_channels_is_the_head_width_even_when_hidden_over_heads_differs():
    spec = spec_from_config(chatglm(kv_channels=64))
    assert spec.head_dim == 64 and kv_bytes_per_token(spec) == 28_672 // 2
    assert any("kv_channels" in n for n in spec.notes)


def mpt(attn_config, **kw):
    """MPT/DBRX names: n_layers, d_model, n_heads and a nested attn_config (transformers MptConfig)."""
    return dict(model_type="mpt", n_layers=4, d_model=256, n_heads=8, attn_config=attn_config, **kw)


@pytest.mark.parametrize(
    "attn_config, kv_heads",
    [
        ({"attn_type": "grouped_query_attention", "kv_n_heads": 2}, 2),
        ({"attn_type": "multiquery_attention"}, 1),
        ({"attn_type": "multiquery_attention", "kv_n_heads": 1}, 1),
        ({"attn_type": "multihead_attention"}, 8),
        ({}, 8),
        ({"kv_n_heads": 8}, 8),
    ],
)
def test_mpt_attn_config(attn_config, kv_heads):
    spec = spec_from_config(mpt(attn_config))
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads) == (4, 256, 8)
    assert spec.num_kv_heads == kv_heads and spec.head_dim == 32


def test_dbrx_reads_kv_n_heads():
    cfg = mpt({"kv_n_heads": 2}, num_attention_heads=None)  # transformers writes the alias as null
    cfg["model_type"] = "dbrx"
    assert spec_from_config(cfg).num_kv_heads == 2


@pytest.mark.parametrize(
    "cfg, field",
    [
        # transformers' MPT model reads multi-head attention, vLLM reads kv_n_heads
        (mpt({"kv_n_heads": 2}), "attn_config.attn_type"),
        (mpt({"attn_type": "multiquery_attention", "kv_n_heads": 2}), "attn_config.kv_n_heads"),
        (mpt({"attn_type": "grouped_query_attention"}), "attn_config.kv_n_heads"),
        (mpt({"attn_type": "sparse_attention"}), "attn_config.attn_type"),
        (mpt([1, 2]), "attn_config"),
        # DBRX without kv_n_heads: transformers defaults it to 1, vLLM to the query heads
        ({**mpt({}), "model_type": "dbrx"}, "attn_config.kv_n_heads"),
        (mpt({"attn_type": "grouped_query_attention", "kv_n_heads": 2}, num_key_value_heads=4), "kv_n_heads"),
    ],
)
def test_attn_config_that_cannot_be_read_with_certainty_is_refused(cfg, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        spec_from_config(cfg)


def llama(**kw):
    cfg = dict(num_hidden_layers=2, hidden_size=256, num_attention_heads=8, torch_dtype="bfloat16")
    cfg.update(kw)
    return cfg


@pytest.mark.parametrize("name", ["num_key_value_heads", "num_kv_heads", "n_head_kv", "n_kv_heads"])
def test_every_kv_head_name(name):
    assert spec_from_config(llama(**{name: 2})).num_kv_heads == 2


def test_two_names_for_the_kv_heads_must_agree():
    assert spec_from_config(llama(num_key_value_heads=2, num_kv_heads=2)).num_kv_heads == 2
    with pytest.raises(ValueError, match=r"`num_key_value_heads` \(2\) and `num_kv_heads` \(4\) disagree"):
        spec_from_config(llama(num_key_value_heads=2, num_kv_heads=4))


@pytest.mark.parametrize("name", ["head_dim", "kv_channels", "hidden_size_per_head", "attention_head_dim"])
def test_every_head_dim_name(name):
    spec = spec_from_config(llama(num_key_value_heads=2, **{name: 64}))
    assert spec.head_dim == 64 and kv_bytes_per_token(spec) == 2 * 2 * 2 * 64 * 2


def test_two_names_for_the_head_width_must_agree():
    with pytest.raises(ValueError, match=r"`head_dim` \(64\) and `kv_channels` \(128\) disagree"):
        spec_from_config(llama(head_dim=64, kv_channels=128))


def test_mistral_params_json_names():
    # Mistral's consolidated params.json, which vLLM loads with --config-format mistral
    spec = spec_from_config(dict(dim=4096, n_layers=32, head_dim=128, n_heads=32, n_kv_heads=8))
    assert (spec.num_layers, spec.hidden_size, spec.num_kv_heads, spec.head_dim) == (32, 4096, 8, 128)
    assert kv_bytes_per_token(spec) == 131_072


def test_falcon_and_gpt_bigcode_default_to_one_kv_head():
    # FalconConfig and GPTBigCodeConfig default `multi_query` to True: a config that omits it has one KV head
    falcon7b = dict(model_type="falcon", num_hidden_layers=32, hidden_size=4544, num_attention_heads=71)
    assert spec_from_config(falcon7b).num_kv_heads == 1
    assert spec_from_config({**falcon7b, "multi_query": False}).num_kv_heads == 71
    falcon40b = dict(model_type="falcon", num_hidden_layers=60, hidden_size=8192, num_attention_heads=128)
    assert (
        spec_from_config({**falcon40b, "new_decoder_architecture": True, "num_kv_heads": 8}).num_kv_heads == 8
    )
    bigcode = dict(model_type="gpt_bigcode", n_layer=2, n_embd=256, n_head=8)
    assert spec_from_config(bigcode).num_kv_heads == 1
    # FalconConfig().to_dict() writes num_kv_heads = the query heads next to multi_query true; Falcon's attention
    # and vLLM read multi_query first, so the count is not read
    written = spec_from_config({**falcon7b, "multi_query": True, "num_kv_heads": 71})
    assert written.num_kv_heads == 1 and any("num_kv_heads" in n for n in written.notes)
    assert spec_from_config({**bigcode, "multi_query": False, "num_key_value_heads": 8}).num_kv_heads == 8


@pytest.mark.parametrize(
    "cfg, field",
    [
        # the original Falcon-40B config: n_head_kv 8 but neither switch; vLLM's RWConfig guesses from hidden_size
        (dict(model_type="RefinedWeb", n_layer=2, hidden_size=8192, n_head=128, n_head_kv=8), "n_head_kv"),
        (llama(multi_query=True, num_key_value_heads=4), "multi_query"),
        (llama(num_key_value_heads=3), "num_key_value_heads"),
        (llama(multi_query_group_num=4, num_key_value_heads=2), "multi_query_group_num"),
        (llama(is_encoder_decoder=True), "is_encoder_decoder"),
        (llama(block_configs=[{"attention": {"n_heads_in_group": 8}}] * 2), "block_configs"),
        (llama(num_key_value_heads=[2, 4]), "num_key_value_heads"),  # OpenELM-style per-layer list
        (llama(n_heads=4), "n_heads"),  # two names for the query heads that disagree
    ],
)
def test_configs_read_without_certainty_are_refused(cfg, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        spec_from_config(cfg)


def qwen2_moe(**kw):
    """The fields of Qwen2MoeConfig().to_dict() as transformers writes them (24 layers, 16 KV heads, head_dim
    null -> 2048 / 16 = 128, "sliding_window": 0 with "use_sliding_window": false)."""
    cfg = dict(
        model_type="qwen2_moe",
        num_hidden_layers=24,
        hidden_size=2048,
        num_attention_heads=16,
        num_key_value_heads=16,
        head_dim=None,
        sliding_window=0,
        use_sliding_window=False,
        max_window_layers=28,
        layer_types=["full_attention"] * 24,
        dtype="bfloat16",
    )
    cfg.update(kw)
    return {k: v for k, v in cfg.items() if not (k == "layer_types" and v is None)}


def test_sliding_window_zero_switched_off_means_every_layer_full():
    spec = spec_from_config(qwen2_moe())
    assert spec.layer_kinds == (FULL,) * 24 and spec.sliding_window is None
    assert kv_bytes_per_token(spec) == 196_608  # 2 x 24 x 16 x 128 x 2 B
    assert kv_bytes_per_token(spec_from_config(qwen2_moe(layer_types=None))) == 196_608
    assert kv_bytes_per_token(spec_from_config(qwen2_moe(sliding_window=None, layer_types=None))) == 196_608


def test_sliding_window_zero_with_explicit_full_layers_needs_no_switch():
    cfg = qwen2_moe(model_type="llama", use_sliding_window=None)
    assert spec_from_config(cfg).layer_kinds == (FULL,) * 24


@pytest.mark.parametrize(
    "extra",
    [
        # 0, and nothing switches sliding off
        dict(model_type="mistral", use_sliding_window=None, layer_types=None),
        dict(use_sliding_window=True, layer_types=None),
        dict(use_sliding_window=None, model_type="llama", layer_types=["sliding_attention"] * 24),
    ],
)
def test_sliding_window_zero_that_is_not_switched_off_is_refused(extra):
    with pytest.raises(ValueError, match="sliding_window"):
        spec_from_config(qwen2_moe(**extra))


def test_qwen2_moe_config_written_by_transformers():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen2MoeConfig().to_dict()
    if cfg.get("use_sliding_window") is not False or cfg.get("num_hidden_layers") != 24:
        pytest.skip("this transformers writes another Qwen2-MoE default config")
    assert kv_bytes_per_token(spec_from_config(cfg)) == 196_608


def test_hybrid_layer_lists_the_loaders_read():
    base = dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, torch_dtype="bfloat16")
    # Bamba: attention only at `attn_layer_indices` (none listed: every layer is Mamba)
    bamba = spec_from_config(
        {**base, "model_type": "bamba", "num_hidden_layers": 8, "attn_layer_indices": [3, 7]}
    )
    assert [i for i, k in enumerate(bamba.layer_kinds) if k == FULL] == [3, 7] and bamba.kv_layers == 2
    with pytest.raises(ValueError, match="no layer that stores K/V"):
        spec_from_config({**base, "model_type": "bamba", "num_hidden_layers": 8, "attn_layer_indices": None})
    with pytest.raises(ValueError, match="attn_layer_indices"):
        spec_from_config({**base, "num_hidden_layers": 8, "attn_layer_indices": [8]})
    # RecurrentGemma: `block_types` cycled over the layers; its attention is local (`attention_window_size`)
    rg = spec_from_config(
        {**base, "num_hidden_layers": 5, "block_types": ["recurrent", "recurrent", "attention"],
         "attention_window_size": 64}
    )  # fmt: skip
    assert rg.layer_kinds == (NO_KV, NO_KV, SLIDING, NO_KV, NO_KV) and rg.sliding_window == 64
    # Nemotron-H as transformers writes it: no layer count, only the per-layer list
    nh = spec_from_config({**base, "layers_block_type": ["mamba", "attention", "moe", "mamba"]})
    assert nh.num_layers == 4 and nh.layer_kinds == (NO_KV, FULL, NO_KV, NO_KV)


def test_xglm_names():
    spec = spec_from_config(dict(num_layers=2, d_model=256, attention_heads=8))
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.head_dim) == (2, 256, 8, 32)
