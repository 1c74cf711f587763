"""TensorBytesTracker counts storages exactly: new allocations, views, temporaries, pre-existing frees."""

import torch

from kvlab.bench.memory import bf16_cache_bytes, measure_step
from kvlab.runtime.tensor_bytes import TensorBytesTracker


def test_counts_a_known_allocation_exactly():
    with TensorBytesTracker() as tracker:
        x = torch.empty(1000, dtype=torch.float32)  # 4000 bytes
    assert tracker.peak_bytes == 4000
    assert tracker.current_bytes == 4000
    del x
    assert tracker.current_bytes == 0  # freed after the block: still followed


def test_views_are_free_and_temporaries_are_transient():
    with TensorBytesTracker() as tracker:
        a = torch.zeros(256, dtype=torch.float32)  # 1024 B, kept
        view = a[10:].view(-1, 2)  # no new storage
        tmp = a * 3  # 1024 B, freed below
        del tmp
        kept = torch.zeros(64, dtype=torch.float64)  # 512 B, kept
    assert tracker.peak_bytes == 2048
    assert tracker.current_bytes == 1024 + 512
    assert tracker.allocated_bytes == 1024 + 1024 + 512
    assert tracker.allocated_by_op["aten.mul"] == 1024
    del a, view, kept


def test_storage_shared_by_views_is_freed_once_when_the_last_view_dies():
    with TensorBytesTracker() as tracker:
        a = torch.ones(100, dtype=torch.float32)
        v = a[50:]
        del a
        assert tracker.current_bytes == 400  # v keeps the storage alive
        del v
    assert tracker.current_bytes == 0 and tracker.peak_bytes == 400


def test_pre_existing_storage_freed_inside_lowers_the_count():
    old = torch.ones(1000, dtype=torch.float32)  # 4000 B, allocated before the block
    holder = {"buf": old}
    del old
    with TensorBytesTracker() as tracker:
        # a growing cache: new = cat(old, one more element); the old buffer dies
        holder["buf"] = torch.cat([holder["buf"], torch.zeros(1)])  # 4 B temp + 4004 B new
    # peak: the 4 B input and the 4004 B result coexisted with the old buffer
    assert tracker.peak_bytes == 4 + 4004
    # after: the new buffer (4004) minus the freed old one (4000); the 4 B input died
    assert tracker.current_bytes == 4004 - 4000


def test_measure_step_transient_is_peak_minus_retained():
    def step():
        scratch = torch.ones(2000, dtype=torch.float32)  # 8000 B scratch
        out = scratch.sum(dim=0, keepdim=True)  # 4 B kept
        del scratch
        return out

    m = measure_step(step, torch.device("cpu"))
    assert m["peak_bytes"] == 8004
    assert m["retained_bytes"] == 4
    assert m["transient_bytes"] == 8000


def test_bf16_cache_bytes_matches_a_dynamic_cache(tiny_lm):
    from transformers import DynamicCache

    from kvlab.bench.prepare import _model_shape
    from kvlab.caches.measure import cache_nbytes
    from kvlab.runtime.hf_api import cache_kwarg

    cache = DynamicCache()
    with torch.inference_mode():
        tiny_lm(input_ids=torch.arange(37)[None], use_cache=True, **{cache_kwarg(tiny_lm): cache})
    assert bf16_cache_bytes(_model_shape(tiny_lm), 37) == cache_nbytes(cache)
