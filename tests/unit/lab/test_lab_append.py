"""Append cost: a growing torch.cat cache copies its history every step, a preallocated one does not."""

import pytest

from kvlab.lab.append import measure_append_cost


def test_append_cost_shapes_and_bytes():
    r = measure_append_cost((16, 64), batch=1, kv_heads=2, head_dim=8, steps=3)
    assert r["contexts_tokens"] == [16, 64]
    assert len(r["cat_us"]) == len(r["inplace_us"]) == 2
    assert all(t > 0 for t in r["cat_us"] + r["inplace_us"])
    token_bytes = 2 * 2 * 8 * 4  # K and V, 2 heads x 8 channels, fp32
    assert r["inplace_bytes_written"] == token_bytes
    assert r["cat_bytes_copied"] == [17 * token_bytes, 65 * token_bytes]


@pytest.mark.parametrize(
    "kwargs", [{"contexts_tokens": ()}, {"contexts_tokens": (0,)}, {"steps": 0}, {"dtype": "int8"}]
)
def test_append_cost_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        measure_append_cost(**kwargs)


def test_append_cost_refuses_caches_larger_than_memory():
    import os

    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    tokens = physical // (2 * 8 * 128 * 4) + 1  # one float32 history alone is larger than the machine
    with pytest.raises(ValueError, match=f"a context of {tokens} tokens needs about"):
        measure_append_cost((tokens,), kv_heads=8, head_dim=128)


def test_append_cost_takes_a_torch_dtype_and_records_its_name():
    import torch

    r = measure_append_cost((8,), kv_heads=1, head_dim=4, steps=1, dtype=torch.bfloat16)
    assert r["dtype"] == "bfloat16" and r["inplace_bytes_written"] == 2 * 1 * 4 * 2
