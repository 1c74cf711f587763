"""TOVACache: the decode-time eviction keeps at most its budget with real bytes, drops exactly the tokens the
current query attends to least (checked against a direct computation), and bad settings are named."""

import pytest
import torch
from transformers import DynamicCache

import kvlab.attention
from kvlab.caches.registry import resolve
from kvlab.caches.tova import TOVACache, tova_scores
from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2
from tests.conftest import random_prompt as _prompt

pytestmark = pytest.mark.usefixtures("no_grad")


@pytest.fixture(scope="module")
def model():
    return kvlab.attention.enable(make_tiny_qwen2(head_dim=32, max_positions=512))


def test_scores_are_the_current_querys_weights_averaged_over_heads():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 3, 8, generator=gen), torch.randn(2, 2, 10, 8, generator=gen)
    ref = torch.zeros(2, 10)
    for h in range(4):  # query head h reads KV head h // 2; the last query row is the current one
        ref += torch.softmax(torch.einsum("bd,btd->bt", q[:, h, -1], k[:, h // 2]) * 0.5, dim=-1) / 4
    torch.testing.assert_close(tova_scores(q, k, 0.5), ref)


def test_budget_is_held_with_real_bytes_and_the_least_attended_token_goes(model):
    cache = TOVACache(token_budget=40, config=model.config)
    model(_prompt(2, 64), **{cache_kwarg(model): cache}, use_cache=True)
    assert cache.held_tokens() == 40 and cache.evicted_tokens() == 24 and cache.get_seq_length() == 64
    per_row_token = 2 * 2 * 2 * 32 * 4  # layers * (K, V) * kv_heads * head_dim * fp32
    for step in range(10):
        before = [layer.keys.clone() for layer in cache.layers]
        model(_prompt(2, 1, seed=step + 1), **{cache_kwarg(model): cache}, use_cache=True)
        assert cache.held_tokens() == 40 and cache.nbytes() == 2 * 40 * per_row_token
        # each row lost exactly one of the 40 it held before the step (or the new token itself)
        for old, layer in zip(before, cache.layers):
            kept_old = (layer.keys[:, :, :, None, :] == old[:, :, None, :, :]).all(-1).any(-2)  # [B, H, 40]
            assert (kept_old.sum(-1) >= 39).all()
    storage = sum(t.untyped_storage().nbytes() for layer in cache.layers for t in (layer.keys, layer.values))
    assert storage == cache.nbytes()


def test_dropped_token_is_the_argmin_of_the_scores(model, monkeypatch):
    import kvlab.caches.tova as tova

    seen = {}
    real = tova.tova_scores

    def spy(query, keys, scale):
        out = real(query, keys, scale)
        seen.setdefault("scores", []).append((out, keys.clone()))
        return out

    monkeypatch.setattr(tova, "tova_scores", spy)
    cache = TOVACache(token_budget=20, config=model.config)
    model(_prompt(1, 20), **{cache_kwarg(model): cache}, use_cache=True)  # at the budget: nothing scored
    assert "scores" not in seen
    model(_prompt(1, 1, seed=5), **{cache_kwarg(model): cache}, use_cache=True)
    scores, keys = seen["scores"][0]  # layer 0: 21 tokens scored, one dropped
    dropped = int(scores[0].argmin())
    expected = torch.cat((keys[:, :, :dropped], keys[:, :, dropped + 1 :]), dim=2)
    assert torch.equal(cache.layers[0].keys, expected)


def test_ratio_keeps_a_share_of_every_token_seen(model):
    cache = TOVACache(compression_ratio=0.25, config=model.config)
    out = model.generate(
        _prompt(1, 64), **{cache_kwarg(model): cache}, max_new_tokens=8, do_sample=False, pad_token_id=0
    )
    seen = 64 + 7
    assert out.shape == (1, 72) and cache.held_tokens() == seen - int(seen * 0.25)


def test_under_the_budget_it_equals_dynamic_cache(model):
    prompt = _prompt(2, 30)
    out = model.generate(
        prompt, **{cache_kwarg(model): TOVACache(token_budget=100)}, max_new_tokens=6, do_sample=False
    )
    assert torch.equal(
        out, model.generate(prompt, **{cache_kwarg(model): DynamicCache()}, max_new_tokens=6, do_sample=False)
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"token_budget": 0}, "`token_budget` must be an int >= 1, got 0"),
        ({"compression_ratio": 1.0}, r"`compression_ratio` must be in \(0, 1\), got 1.0"),
        ({}, "exactly one"),
    ],
)
def test_bad_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TOVACache(**kwargs)


def test_registry_name(model):
    cache = resolve("tova:token_budget=32").make(model.config)
    assert isinstance(cache, TOVACache) and cache.snapkv_config.token_budget == 32
    assert resolve("tova").uses_kvlab_attention and resolve("tova").entry.evicts


def test_a_model_without_kvlab_attention_names_tova():
    """The refusal named SnapKVCache, the class TOVA borrows it from."""
    from tests.conftest import make_tiny_qwen2

    plain = make_tiny_qwen2(head_dim=32, max_positions=512)
    ids = torch.randint(1, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    cache = TOVACache(token_budget=16)
    with pytest.raises(RuntimeError, match=r"^TOVACache needs kvlab attention"), torch.no_grad():
        for i in range(3):  # the prefill asks for queries; a later step finds they never came
            plain(
                ids[:, : 38 + i] if i == 0 else ids[:, 37 + i : 38 + i],
                **{cache_kwarg(plain): cache},
                use_cache=True,
            )


@pytest.mark.parametrize(
    "kwargs, tova, snapkv",
    [
        ({"token_budget": 64}, "TOVACache(token_budget=64)", "SnapKVCache(token_budget=64, window_size=32)"),
        (
            {"compression_ratio": 0.25},
            "TOVACache(compression_ratio=0.25)",
            "SnapKVCache(compression_ratio=0.25, window_size=32)",
        ),
    ],
)
def test_repr_names_what_is_kept(kwargs, tova, snapkv):
    """The budget as given, in the same words as SnapKVCache's repr (one SnapKVConfig.budget_text)."""
    from kvlab.caches.snapkv import SnapKVCache

    assert repr(TOVACache(**kwargs)) == tova
    assert repr(SnapKVCache(**kwargs)) == snapkv
