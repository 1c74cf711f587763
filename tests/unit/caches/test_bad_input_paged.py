"""Hostile input to PagedCache: a ValueError naming the value, as KIVICache does; never a silent reinterpretation of
the pool's memory, a row dropped by a bad index or repeat count, or an IndexError from inside torch."""

from __future__ import annotations

import pytest
import torch

from kvlab.caches.paged import PagedCache


def _filled(batch=2, tokens=10, heads=2, head_dim=64):
    cache = PagedCache(block_size=4)
    for layer in range(2):
        cache.update(
            torch.randn(batch, heads, tokens, head_dim), torch.randn(batch, heads, tokens, head_dim), layer
        )
    return cache


@pytest.mark.parametrize("block_size", [2.0, True, "4"])
def test_block_size_must_be_an_int(block_size):
    with pytest.raises(ValueError, match=rf"`block_size` must be an int >= 1, got {block_size!r}"):
        PagedCache(block_size=block_size)


@pytest.mark.parametrize(
    "shape, fragment",
    [
        ((1, 2, 1, 32), "head_dim"),  # was accepted: 32-wide rows written into a 64-wide pool's memory
        ((1, 4, 1, 64), "kv_heads"),  # was IndexError from index_copy_
    ],
)
def test_states_that_do_not_fit_the_pools_are_named(shape, fragment):
    cache = _filled(batch=1)
    with pytest.raises(ValueError, match=fragment):
        cache.update(torch.randn(shape), torch.randn(shape), 0)


@pytest.mark.parametrize(
    "keys, values",
    [
        (torch.randn(1, 2, 8, 64), torch.randn(1, 2, 7, 64)),  # was IndexError from index_copy_
        (torch.randn(2, 8, 64), torch.randn(2, 8, 64)),  # was "not enough values to unpack"
    ],
)
def test_malformed_states_are_named(keys, values):
    with pytest.raises(ValueError, match=r"\[batch, kv_heads, tokens, head_dim\]"):
        PagedCache(block_size=4).update(keys, values, 0)


@pytest.mark.parametrize("repeats", [0, -1, 2.0, True])
def test_batch_repeat_interleave_names_bad_repeats(repeats):
    # 0 and -1 silently dropped every row (rows=0), 2.0 was a TypeError from range()
    cache = _filled()
    with pytest.raises(ValueError, match=rf"`repeats` must be a positive integer, got {repeats!r}"):
        cache.batch_repeat_interleave(repeats)
    assert len(cache.tables) == 2


@pytest.mark.parametrize(
    "index, fragment",
    [
        (torch.tensor([5]), "5"),  # was IndexError: list index out of range
        (torch.tensor([-1]), "-1"),  # was silently the last row (Python indexing)
        (torch.tensor([0.0, 1.0]), "integers"),
        (torch.tensor([[0, 1]]), "1-D"),
    ],
)
def test_reorder_cache_names_a_bad_index(index, fragment):
    cache = _filled()
    with pytest.raises((ValueError, TypeError), match=fragment):
        cache.reorder_cache(index)
    assert len(cache.tables) == 2


def test_good_reorders_and_repeats_still_work():
    cache = _filled()
    cache.reorder_cache(torch.tensor([1, 0, 0]))
    assert len(cache.tables) == 3
    cache.reorder_cache([0, 1])  # a list, as KIVICache takes
    cache.batch_repeat_interleave(2)
    assert len(cache.tables) == 4 and cache.get_seq_length() == 10
