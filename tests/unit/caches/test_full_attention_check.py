"""One full-attention check for every kvlab cache built from a model config (:func:`kvlab.caches.base.
check_full_attention`): SinkCache refused a Qwen2-style ``use_sliding_window`` config, while the copies of the
check in KIVICache, PagedCache and MixedCache only read ``layer_types`` and took it (their tokens outside the
window would be attended to by the cache and masked by the model, or the reverse)."""

import pytest
from transformers import Qwen2Config

from kvlab.caches.base import check_full_attention
from kvlab.caches.registry import resolve

CONFIG_CACHES = ["kivi-4", "kivi-4-fused", "paged", "sink", "snapkv", "tova", "mixed-demo"]


def _config(**kw) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, intermediate_size=256, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("name", CONFIG_CACHES)
def test_a_sliding_window_model_is_refused_by_every_cache(name):
    sliding = _config(
        use_sliding_window=True, sliding_window=64
    )  # layer_types stay full: max_window_layers=28
    assert set(sliding.layer_types) == {"full_attention"}
    with pytest.raises(
        ValueError, match=r"supports full-attention layers only; the model has \['sliding_window=64'\]"
    ):
        resolve(name).make(sliding)


@pytest.mark.parametrize("name", CONFIG_CACHES)
def test_a_full_attention_model_is_accepted_by_every_cache(name):
    assert resolve(name).make(_config()) is not None


def test_the_check_names_the_cache_and_counts_the_layers():
    assert check_full_attention(_config(), "KIVICache") == 2
    with pytest.raises(
        ValueError, match=r"^KIVICache supports full-attention layers only; .*sliding_attention"
    ):
        check_full_attention(_config(layer_types=["full_attention", "sliding_attention"]), "KIVICache")
