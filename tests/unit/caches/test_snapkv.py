"""SnapKVCache: the scores are SnapKV's (checked against a direct computation), the prompt's bytes really drop to the
kept share, decoding continues from the compressed cache, and bad settings / a model without kvlab attention are
refused by name."""

import pytest
import torch
from transformers import DynamicCache, Qwen2Config

import kvlab.attention
from kvlab.caches.measure import cache_nbytes
from kvlab.caches.registry import resolve
from kvlab.caches.snapkv import SnapKVCache, SnapKVConfig, keep_indices, snapkv_scores
from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2
from tests.conftest import random_prompt as _prompt

pytestmark = pytest.mark.usefixtures("no_grad")


@pytest.fixture(scope="module")
def model():
    return kvlab.attention.enable(make_tiny_qwen2(head_dim=32, max_positions=512))


def test_scores_are_the_window_votes_pooled_and_grouped():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 3, 8, generator=gen), torch.randn(1, 2, 10, 8, generator=gen)  # GQA 4/2, w = 3
    scores = snapkv_scores(q, k, scale=8**-0.5, kernel_size=1)
    ref = torch.zeros(1, 2, 7)
    for h in range(4):
        for i in range(3):  # query i sits at position 7 + i and sees keys 0..7 + i
            w = torch.softmax(q[0, h, i] @ k[0, h // 2, : 8 + i].T * 8**-0.5, dim=-1)
            ref[0, h // 2] += (
                w[:7] / 2
            )  # summed over the window, averaged over the 2 query heads of a KV head
    torch.testing.assert_close(scores, ref)
    pooled = snapkv_scores(q, k, scale=8**-0.5, kernel_size=3)
    raw = snapkv_scores(q, k, scale=8**-0.5, kernel_size=1)
    assert (pooled >= raw - 1e-6).all() and not torch.allclose(pooled, raw)  # max pooling only raises scores
    idx = keep_indices(raw, kept=5, window=3)
    assert idx.shape == (1, 2, 5) and (idx[..., 2:] == torch.tensor([7, 8, 9])).all()
    assert set(idx[0, 0, :2].tolist()) == set(raw[0, 0].topk(2).indices.tolist())


@pytest.mark.parametrize("batch", [1, 2])
def test_ratio_half_frees_half_the_prompt_bytes(model, batch):
    prompt = _prompt(batch, 96)
    dynamic, snap = DynamicCache(), SnapKVCache(compression_ratio=0.5, config=model.config)
    model(prompt, **{cache_kwarg(model): dynamic}, use_cache=True)
    model(prompt, **{cache_kwarg(model): snap}, use_cache=True)
    assert cache_nbytes(snap) <= 0.52 * cache_nbytes(dynamic)
    storage = sum(t.untyped_storage().nbytes() for layer in snap.layers for t in (layer.keys, layer.values))
    assert storage == cache_nbytes(snap)  # new tensors: no view keeps the prompt's bytes alive
    assert snap.held_tokens() == 48 and snap.evicted_tokens() == 48 and snap.get_seq_length() == 96


def test_compressed_cache_keeps_the_chosen_tokens_and_decodes_on(model):
    prompt = _prompt(1, 80, seed=2)
    dynamic, snap = DynamicCache(), SnapKVCache(token_budget=40, config=model.config)
    model(prompt, **{cache_kwarg(model): dynamic}, use_cache=True)
    model(prompt, **{cache_kwarg(model): snap}, use_cache=True)
    for d, s in zip(dynamic.layers, snap.layers):  # every kept key is one of the prompt's, per head
        for h in range(s.keys.shape[1]):
            match = (s.keys[0, h, :, None, :] == d.keys[0, h, None, :, :]).all(-1)  # [kept, 80]
            positions = match.float().argmax(-1)
            assert (
                match.any(-1).all()
                and (positions.diff() > 0).all()
                and (positions[-32:] == torch.arange(48, 80)).all()
            )
    # one decode step from the compressed cache equals a DynamicCache holding the same kept K/V (same positions)
    token = _prompt(1, 1, seed=3)
    ref = DynamicCache()
    for i, s in enumerate(snap.layers):
        ref.update(s.keys.clone(), s.values.clone(), i)
    out = model(token, **{cache_kwarg(model): snap}, use_cache=True).logits
    expected = model(
        token, **{cache_kwarg(model): ref}, position_ids=torch.tensor([[80]]), use_cache=True
    ).logits
    torch.testing.assert_close(out, expected)
    assert snap.held_tokens() == 41 and snap.get_seq_length() == 81


def test_short_prompt_is_not_compressed_and_equals_dynamic_cache(model):
    prompt = _prompt(2, 30)  # within the 32-token observation window: nothing to drop
    out = model.generate(
        prompt, **{cache_kwarg(model): SnapKVCache(compression_ratio=0.5)}, max_new_tokens=5, do_sample=False
    )
    ref = model.generate(prompt, **{cache_kwarg(model): DynamicCache()}, max_new_tokens=5, do_sample=False)
    assert torch.equal(out, ref)


def test_a_model_without_kvlab_attention_is_refused():
    plain = make_tiny_qwen2(head_dim=32, max_positions=512)
    with pytest.raises(RuntimeError, match=r"kvlab.attention.enable\(model\)"):
        plain(_prompt(1, 64), **{cache_kwarg(plain): SnapKVCache(compression_ratio=0.5)}, use_cache=True)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"compression_ratio": 1.5}, r"`compression_ratio` must be in \(0, 1\), got 1.5"),
        ({"compression_ratio": 0.0}, r"`compression_ratio` must be in \(0, 1\), got 0.0"),
        ({"compression_ratio": 1}, r"`compression_ratio` must be in \(0, 1\), got 1"),
        ({"token_budget": 0}, "`token_budget` must be an int >= 1, got 0"),
        ({}, "exactly one of `compression_ratio` and `token_budget`"),
        ({"compression_ratio": 0.5, "token_budget": 8}, "exactly one"),
        ({"compression_ratio": 0.5, "kernel_size": 4}, "`kernel_size` must be odd"),
        ({"compression_ratio": 0.5, "pooling": "mean"}, "`pooling` must be one of"),
    ],
)
def test_bad_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SnapKVConfig(**kwargs)


def test_sliding_window_model_is_refused():
    cfg = Qwen2Config(
        vocab_size=32,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        use_sliding_window=True,
        sliding_window=16,
        max_window_layers=0,
    )
    with pytest.raises(ValueError, match="SnapKVCache supports full-attention layers only"):
        SnapKVCache(compression_ratio=0.5, config=cfg)


def test_registry_names_with_ratio_and_budget(model):
    r = resolve("snapkv:compression_ratio=0.25")
    assert r.describe() == {
        "name": "snapkv:compression_ratio=0.25",
        "family": "snapkv",
        "compression_ratio": 0.25,
    }
    assert r.uses_kvlab_attention and r.entry.evicts
    assert r.make(model.config).snapkv_config.compression_ratio == 0.25
    assert resolve("snapkv:token_budget=64").make(model.config).snapkv_config.token_budget == 64
    for bad, match in (("snapkv:compression_ratio=1.5", "got 1.5"), ("snapkv:compression_ratio=0", "got 0")):
        with pytest.raises(ValueError, match=match):
            resolve(bad)
    with pytest.raises(ValueError, match="`group_size` must be an int >= 1, got 2.5"):
        resolve("kivi-4:group_size=2.5")
