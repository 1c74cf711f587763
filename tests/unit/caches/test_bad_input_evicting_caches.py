"""Hostile input to today's caches (SinkCache, SnapKVCache, TOVACache, FP8Cache): bad indices, repeats, shapes and
budgets get a ValueError naming the value, as KIVICache does, never an IndexError/AttributeError from inside torch or
transformers, nor a setting silently replaced.
"""

from __future__ import annotations

import pytest
import torch

import kvlab.attention
from kvlab.caches import FP8Cache
from kvlab.caches.kivi_snapkv import KIVISnapKVCache
from kvlab.caches.sink import SinkCache
from kvlab.caches.snapkv import SnapKVCache, SnapKVConfig
from kvlab.caches.tova import TOVACache
from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2
from tests.conftest import random_prompt as _prompt

pytestmark = pytest.mark.usefixtures("no_grad")


@pytest.fixture(scope="module")
def model():
    return kvlab.attention.enable(make_tiny_qwen2(head_dim=32, max_positions=512))


def _filled(model, make, batch=2, tokens=64):
    cache = make(model.config)
    model(_prompt(batch, tokens), **{cache_kwarg(model): cache}, use_cache=True)
    return cache


MAKERS = {
    "sink": lambda config: SinkCache(4, 16, config=config),
    "snapkv": lambda config: SnapKVCache(compression_ratio=0.5, config=config),
    "tova": lambda config: TOVACache(token_budget=20, config=config),
    "fp8": lambda config: FP8Cache(),
}


@pytest.mark.parametrize("make", [SnapKVCache, KIVISnapKVCache])
def test_a_snapkv_budget_below_the_observation_window_is_refused(make):
    with pytest.raises(ValueError, match=r"`token_budget` \(16\).*`window_size` \(32\)"):
        make(token_budget=16)


def test_tova_keeps_a_budget_below_snapkvs_window():
    # TOVA shares SnapKVConfig but has no observation window: a budget of 16 is 16 tokens (measured in kvlab eval)
    assert TOVACache(token_budget=16).snapkv_config.token_budget == 16
    assert SnapKVConfig(token_budget=40).kept_tokens(64) == 40


@pytest.mark.parametrize("name", ["snapkv", "tova"])
def test_batch_repeat_interleave_of_an_evicting_cache(model, name):
    cache = _filled(model, MAKERS[name], batch=1)
    held = cache.layers[0].keys.shape[-2]
    cache.batch_repeat_interleave(2)
    assert cache.layers[0].keys.shape[0] == 2 and cache.layers[0].keys.shape[-2] == held


@pytest.mark.parametrize("repeats", [0, -1])
def test_sink_batch_repeat_interleave_names_bad_repeats(model, repeats):
    cache = _filled(model, MAKERS["sink"])
    with pytest.raises(ValueError, match=rf"`repeats` must be a positive integer, got {repeats}"):
        cache.batch_repeat_interleave(repeats)


@pytest.mark.parametrize("name", ["sink", "snapkv", "tova", "fp8"])
def test_reorder_cache_names_a_row_outside_the_batch(model, name):
    cache = _filled(model, MAKERS[name])
    with pytest.raises(ValueError, match=r"5.*batch of 2"):
        cache.reorder_cache(torch.tensor([5]))


def test_fp8_first_update_with_no_tokens_is_named():
    # was IndexError from amax() while calibrating; kvlab.quant.fp8.calibrate now names it (a cache that defers
    # calibration to its first non-empty update, returning empty K/V as DynamicCache does, would also be fine)
    with pytest.raises(ValueError, match=r"no tokens or channels to calibrate on.*\(1, 2, 0, 64\)"):
        FP8Cache().update(torch.randn(1, 2, 0, 64), torch.randn(1, 2, 0, 64), 0)


@pytest.mark.parametrize("name", ["sink", "snapkv", "tova"])
def test_update_refuses_keys_and_values_of_different_token_counts(model, name):
    cache = MAKERS[name](model.config)
    with pytest.raises(ValueError, match=r"\(1, 2, 8, 32\).*\(1, 2, 7, 32\)"):
        cache.update(torch.randn(1, 2, 8, 32), torch.randn(1, 2, 7, 32), 0)


@pytest.mark.parametrize(
    "make, name",
    [
        (MAKERS["tova"], "TOVACache"),
        (MAKERS["sink"], "SinkCache"),
        (MAKERS["snapkv"], "SnapKVCache"),
        (lambda config: KIVISnapKVCache(nbits=4, compression_ratio=0.5, config=config), "KIVISnapKVCache"),
    ],
)
def test_crop_after_eviction_names_the_cache(model, make, name):
    cache = _filled(model, make, batch=1)
    with pytest.raises(ValueError, match=rf"^{name} cannot crop to 63 tokens after evicting \d+: evicted"):
        cache.crop(-1)
    cache.crop(0)  # a crop that removes nothing is no error


@pytest.mark.parametrize(
    "make",
    [
        lambda cfg: __import__("kvlab.caches.sink", fromlist=["SinkCache"]).SinkCache(4, 8, config=cfg),
        lambda cfg: __import__("kvlab.caches.snapkv", fromlist=["x"]).SnapKVCache(
            token_budget=64, config=cfg
        ),
        lambda cfg: __import__("kvlab.caches.tova", fromlist=["x"]).TOVACache(token_budget=64, config=cfg),
        lambda cfg: __import__("kvlab.caches.kivi_snapkv", fromlist=["x"]).KIVISnapKVCache(
            compression_ratio=0.5, config=cfg
        ),
        lambda cfg: __import__("kvlab.caches.kivi", fromlist=["x"]).KIVICache(config=cfg),
        lambda cfg: __import__("kvlab.caches.paged", fromlist=["x"]).PagedCache(config=cfg),
    ],
    ids=["sink", "snapkv", "tova", "kivi-snapkv", "kivi", "paged"],
)
@pytest.mark.parametrize("config", ["x", 12, {"num_hidden_layers": 2}])
def test_a_config_that_is_not_a_model_config_is_named(make, config):
    # was AttributeError: 'str' object has no attribute 'num_hidden_layers'
    with pytest.raises(ValueError, match=r"`config` must be the model's config") as exc:
        make(config)
    assert repr(config) in str(exc.value)
