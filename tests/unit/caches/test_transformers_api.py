"""kvlab speaks the installed transformers' cache argument: ``cache=`` from 5.24 on, ``past_key_values=`` before.

transformers 5.24 deprecates ``past_key_values`` with a ``FutureWarning`` (removed for ``forward`` in 5.40, for
``generate`` in 6.0). Here that warning is an error while ``generate()`` and a following ``forward`` run through
every registered cache, so a kvlab code path that still passes the old name fails on the newest release. The
suite as a whole turns the same warning into an error (``filterwarnings`` in pyproject.toml).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers
from packaging.version import Version

from kvlab.caches.registry import CacheSettings, cache_names, resolve
from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2

RENAMED_IN = Version("5.24.0")  # the release whose models take `cache=` and warn on `past_key_values=`
HAS_CACHE_ARG = Version(transformers.__version__) >= RENAMED_IN
PKV_WARNING = r".*`past_key_values`"  # transformers' deprecate_kwarg message names the old argument first
SETTINGS = CacheSettings(group_size=32, residual_length=32, hqq_group_size=32, block_size=16)


class _NewStyle(torch.nn.Module):
    def forward(self, input_ids, cache=None, use_cache=True):
        return input_ids


class _OldStyle(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None, use_cache=True):
        return input_ids


def test_cache_kwarg_reads_the_forward_signature():
    assert cache_kwarg(_NewStyle()) == "cache"
    assert cache_kwarg(_OldStyle()) == "past_key_values"
    with pytest.raises(TypeError, match="got int"):
        cache_kwarg(3)


def test_cache_kwarg_follows_the_installed_release(tiny_qwen2):
    assert cache_kwarg(tiny_qwen2) == ("cache" if HAS_CACHE_ARG else "past_key_values")


@pytest.fixture(scope="module")
def model():
    import kvlab.attention

    return kvlab.attention.enable(make_tiny_qwen2(head_dim=32, max_positions=512))


def _generate_then_forward(model, kv_cache, **call):
    ids = torch.randint(1, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, **call)
        model(input_ids=out[:, -1:], use_cache=True, **call)  # one more step on the generate()d cache
    assert kv_cache.get_seq_length() == ids.shape[1] + 4


@pytest.mark.parametrize("name", cache_names())
def test_generate_and_forward_through_every_cache_raise_no_past_key_values_warning(name, model):
    resolved = resolve(name, SETTINGS)
    if resolved.unavailable_reason():
        pytest.skip(resolved.unavailable_reason())
    cache = resolved.make(model.config)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=PKV_WARNING, category=FutureWarning)
        _generate_then_forward(model, cache, **{cache_kwarg(model): cache})


@pytest.mark.skipif(not HAS_CACHE_ARG, reason=f"transformers {transformers.__version__} has no `cache=` yet")
def test_the_filter_catches_the_old_name_on_this_release(model):
    """The check above can fail: the old name, under the same filter, is an error on >= 5.24."""
    cache = resolve("kivi-4", SETTINGS).make(model.config)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=PKV_WARNING, category=FutureWarning)
        with pytest.raises(FutureWarning, match="past_key_values"):
            _generate_then_forward(model, cache, past_key_values=cache)
