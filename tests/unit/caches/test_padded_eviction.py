"""Evicting caches (SinkCache, TOVA, SnapKV, SnapKV under KIVI) refuse a left-padded batch when eviction begins
(transformers masks a cache by contiguous positions, so a padded row would attend to its pad tokens); a padded
batch the cache never evicts from, and an unpadded batch, run as before."""

import warnings

import pytest
import torch
from transformers import DynamicCache

import kvlab.attention
from kvlab.caches.kivi_snapkv import KIVISnapKVCache
from kvlab.caches.sink import SinkCache
from kvlab.caches.snapkv import SnapKVCache
from kvlab.caches.tova import TOVACache
from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2, random_prompt

pytestmark = pytest.mark.usefixtures("no_grad")

PAD = 3  # left-padding tokens of row 1


@pytest.fixture(scope="module")
def model():
    return kvlab.attention.enable(make_tiny_qwen2(head_dim=32, max_positions=512))


def _padded_batch(tokens=48):
    """Row 0: ``tokens`` real tokens; row 1: ``PAD`` pad tokens (id 0) then ``tokens - PAD`` real ones."""
    ids = random_prompt(2, tokens)
    ids[1, :PAD] = 0
    mask = torch.ones_like(ids)
    mask[1, :PAD] = 0
    return ids, mask


def _generate(model, ids, mask, cache, new=6):
    return model.generate(
        ids, attention_mask=mask, **{cache_kwarg(model): cache}, max_new_tokens=new, do_sample=False, pad_token_id=0
    )


CACHES = {
    "sink": lambda m: SinkCache(4, 24, config=m.config),
    "tova": lambda m: TOVACache(token_budget=24, config=m.config),
    "snapkv": lambda m: SnapKVCache(token_budget=40, window_size=8, config=m.config),
    "kivi-snapkv": lambda m: KIVISnapKVCache(4, 32, 0, token_budget=40, window_size=8, config=m.config),
}


@pytest.mark.parametrize("name", sorted(CACHES))
def test_a_padded_batch_is_refused_when_eviction_begins(model, name):
    ids, mask = _padded_batch()
    with pytest.raises(ValueError, match=r"cannot evict from a padded batch: row\(s\) \[1\]"):
        _generate(model, ids, mask, CACHES[name](model))


@pytest.mark.parametrize("name", sorted(CACHES))
def test_an_unpadded_batch_evicts_without_a_word(model, name):
    ids = random_prompt(2, 48)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _generate(model, ids, torch.ones_like(ids), CACHES[name](model))


def test_a_padded_batch_that_never_evicts_equals_dynamic_cache(model):
    ids, mask = _padded_batch(20)
    cache = SinkCache(4, 60, config=model.config)
    assert torch.equal(_generate(model, ids, mask, cache), _generate(model, ids, mask, DynamicCache()))
    assert cache.evicted_tokens() == 0


def test_padding_is_read_again_after_reset(model):
    cache = SinkCache(4, 24, config=model.config)
    ids = random_prompt(2, 48)
    _generate(model, ids, torch.ones_like(ids), cache)
    cache.reset()
    ids, mask = _padded_batch()
    with pytest.raises(ValueError, match="padded batch"):
        _generate(model, ids, mask, cache)


def test_without_position_ids_a_batch_is_taken_as_unpadded_without_a_warning():
    keys = torch.randn(2, 2, 10, 8)  # 10 tokens into a 4-token window: the first update evicts
    cache = SinkCache(0, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.update(keys, keys, 0)
    assert cache.evicted_tokens() == 6
    cache = SinkCache(0, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.update(keys[:1], keys[:1], 0)
    assert cache.evicted_tokens() == 6


def test_positions_that_continue_the_count_pass_and_others_are_named():
    keys = torch.randn(2, 2, 10, 8)
    cache = SinkCache(0, 4)
    cache.update(keys, keys, 0, kwargs={"position_ids": torch.arange(10).expand(2, 10)})
    cache = SinkCache(0, 4)
    pos = torch.stack((torch.arange(10), torch.arange(10) - 2))
    with pytest.raises(ValueError, match=r"row\(s\) \[1\]"):
        cache.update(keys, keys, 0, kwargs={"position_ids": pos})
