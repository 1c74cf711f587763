"""The mechanics chapter's toy decoder (appendix [A]): cached decoding equals full recompute; its FLOP figures."""

import numpy as np
import pytest

from kvlab.lab import ToyConfig, run_toy_lab
from kvlab.lab.flops import (
    cached_generation_flops,
    decode_step_flops,
    full_forward_flops,
    naive_generation_flops,
)
from kvlab.lab.toy import (
    attention_full,
    attention_step,
    full_forward_logits,
    generate_cached,
    make_prompt,
    make_weights,
)


def test_seed_run_gives_192_identical_tokens(seed_lab_result):
    assert seed_lab_result["_exit_code"] == 0
    assert seed_lab_result["gen"] == 192
    assert seed_lab_result["same_tokens"] == 192
    assert seed_lab_result["first_divergence"] is None


def test_seed_run_last_logits_match_full_forward(seed_lab_result):
    r = seed_lab_result
    assert r["rel_err"] < 1e-5
    assert r["rel_err"] == pytest.approx(r["max_diff"] / r["ref_scale"])
    assert r["ref_scale"] > 1.0  # the logits are not trivially small


def test_seed_flop_figures(seed_lab_result):
    # docs/lab.md: 1.3005e+11 vs 1.2314e+09 = 105.61x
    assert f"{seed_lab_result['flops_naive']:.4e}" == "1.3005e+11"
    assert f"{seed_lab_result['flops_cached']:.4e}" == "1.2314e+09"
    assert round(seed_lab_result["flops_ratio"], 2) == 105.61


def test_seed_result_keys_and_timings(seed_lab_result):
    for key in (
        "same_tokens",
        "max_diff",
        "ref_scale",
        "flops_naive",
        "flops_cached",
        "flops_ratio",
        "t_naive",
        "t_cached",
        "speedup",
        "seq_end",
    ):
        assert key in seed_lab_result
    assert seed_lab_result["t_naive"] > 0 and seed_lab_result["t_cached"] > 0
    assert seed_lab_result["speedup"] == pytest.approx(
        seed_lab_result["t_naive"] / seed_lab_result["t_cached"]
    )
    assert seed_lab_result["seq_end"] == 208


def test_mha_variant_matches_and_stores_four_times_the_kv():
    gqa, mha = ToyConfig(new_tokens=24), ToyConfig(kv_heads=8, new_tokens=24)
    r = run_toy_lab(mha, warmup=False)
    assert r["same_tokens"] == 24 and r["rel_err"] < 1e-5
    assert mha.kv_bytes_per_token == 4 * gqa.kv_bytes_per_token
    assert r["config"]["kv_heads"] == 8


def test_reference_needs_the_right_tokens():
    """The mechanics chapter's off-by-one: feeding the last generated token too compares the next step's logits."""
    cfg = ToyConfig(new_tokens=16)
    weights, prompt = make_weights(cfg), make_prompt(cfg)
    tokens, logits = generate_cached(weights, cfg, prompt)
    right = full_forward_logits(weights, cfg, prompt + tokens[:-1])
    wrong = full_forward_logits(weights, cfg, prompt + tokens)
    scale = np.abs(right).max()
    assert np.abs(logits - right).max() / scale < 1e-5
    assert np.abs(logits - wrong).max() / scale > 1e-3


def test_gqa_attention_equals_repeated_heads():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(5, 8, 4)).astype(np.float32)  # [tokens, q_heads, head_dim]
    k = rng.normal(size=(2, 5, 4)).astype(np.float32)  # [kv_heads, tokens, head_dim]
    v = rng.normal(size=(2, 5, 4)).astype(np.float32)
    k_rep, v_rep = np.repeat(k, 4, axis=0), np.repeat(v, 4, axis=0)  # MHA with copied heads
    expected = []
    for t in range(5):
        s = np.einsum("hd,htd->ht", q[t], k_rep[:, : t + 1]) / 2.0
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        expected.append(np.einsum("ht,htd->hd", p, v_rep[:, : t + 1]).reshape(-1))
    np.testing.assert_allclose(attention_full(q, k, v), np.stack(expected), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(attention_step(q[-1], k, v), expected[-1], rtol=1e-5, atol=1e-6)


def test_flops_by_hand_for_a_small_config():
    cfg = ToyConfig(
        n_layers=1, q_heads=2, kv_heads=1, head_dim=2, ffn_mult=1, prompt_tokens=2, new_tokens=2, vocab_size=3
    )
    # d=4, kv=2, ffn=4: projections 2*(16+8+8+16+16+16) = 160 per token; head 2*4*3 = 24
    assert full_forward_flops(cfg, 3) == 3 * 160 + 4 * 2 * 2 * 9 + 24
    assert decode_step_flops(cfg, 3) == 160 + 4 * 2 * 2 * 3 + 24
    assert naive_generation_flops(cfg) == full_forward_flops(cfg, 2) + full_forward_flops(cfg, 3)
    assert cached_generation_flops(cfg) == full_forward_flops(cfg, 2) + decode_step_flops(cfg, 3)


@pytest.mark.parametrize(
    "kwargs",
    [{"kv_heads": 3}, {"n_layers": 0}, {"head_dim": -1}, {"new_tokens": 1.5}, {"vocab_size": True}],
)
def test_bad_config_names_the_value(kwargs):
    with pytest.raises(ValueError, match=repr(next(iter(kwargs.values())))):
        ToyConfig(**kwargs)


def test_bad_arguments():
    with pytest.raises(ValueError, match="repeat"):
        run_toy_lab(ToyConfig(new_tokens=2), repeat=0)
    with pytest.raises(ValueError, match="tokens"):
        full_forward_flops(ToyConfig(), 0)
    cfg = ToyConfig(new_tokens=2)
    with pytest.raises(ValueError, match="prompt"):
        generate_cached(make_weights(cfg), cfg, [])
