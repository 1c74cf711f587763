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
