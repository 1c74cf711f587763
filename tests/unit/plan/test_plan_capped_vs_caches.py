"""The planner's capped bytes (``--keep-tokens N``) equal what kvlab's evicting caches measure, on a tiny Qwen2 (CPU):
SinkCache(4, W) after more than 4 + W tokens holds the bytes of ``--keep-tokens 4+W``; KIVI over SnapKV with a token
budget holds, after its prefill, the bytes of ``--kv-dtype kivi-4 --keep-tokens budget``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvlab.plan import kv_bytes, kv_dtype, load_spec  # noqa: E402
from kvlab.runtime.hf_api import cache_kwarg  # noqa: E402
from tests.conftest import make_tiny_qwen2  # noqa: E402


def _spec(model):
    dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[model.dtype]
    return load_spec({**model.config.to_dict(), "torch_dtype": dtype})


def _ids(batch, tokens, seed=0):
    return torch.randint(1, 256, (batch, tokens), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window, prompt, steps", [(16, 40, 5), (32, 20, 30), (60, 100, 0)])
def test_sink_cache_bytes_equal_the_planner_capped_at_sinks_plus_window(dtype, window, prompt, steps):
    from kvlab.caches.sink import SinkCache

    model = make_tiny_qwen2(head_dim=32, max_positions=512, dtype=dtype)
    cache = SinkCache(num_sink_tokens=4, window_length=window, config=model.config)
    ids = _ids(2, prompt)
    with torch.no_grad():
        out = model(ids, **{cache_kwarg(model): cache}, use_cache=True)
        for _ in range(steps):  # greedy decode, one token per step
            ids = out.logits[:, -1:].argmax(-1)
            out = model(ids, **{cache_kwarg(model): out.past_key_values}, use_cache=True)
    seen = prompt + steps
    assert seen > 4 + window and cache.get_seq_length() == seen
    assert cache.evicted_tokens() == seen - 4 - window  # the cap is in force
    spec = _spec(model)
    capped = kv_dtype("auto", spec.dtype, keep_tokens=4 + window)
    assert cache.nbytes() == kv_bytes(spec, seen, 2, capped)
    assert cache.nbytes() < kv_bytes(spec, seen, 2)  # and it is not the uncapped figure


@pytest.mark.parametrize("budget, prompt", [(96, 300), (200, 260)])
def test_kivi_over_snapkv_budget_bytes_equal_the_planner_kivi_capped(budget, prompt):
    import kvlab.attention
    from kvlab.caches.kivi_snapkv import KIVISnapKVCache

    model = kvlab.attention.enable(make_tiny_qwen2(head_dim=32, max_positions=512))
    cache = KIVISnapKVCache(nbits=4, group_size=32, residual_length=64, token_budget=budget)
    with torch.no_grad():
        model(_ids(2, prompt, seed=1), **{cache_kwarg(model): cache}, use_cache=True)
    assert cache.evicted_tokens() == prompt - budget
    spec = _spec(model)
    capped = kv_dtype("kivi-4", spec.dtype, group_size=32, residual_length=64, keep_tokens=budget)
    assert cache.nbytes() == kv_bytes(spec, prompt, 2, capped)
