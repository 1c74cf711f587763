"""``dynamic-ckernel``: DynamicCache whose decode attention runs kvlab's float C kernel; its logits are
DynamicCache's up to fp32 rounding, and it records which attention ran."""

from __future__ import annotations

import shutil

import pytest
import torch

from kvlab.attention import cpu_kernel, enable
from kvlab.caches.registry import make_cache, resolve
from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2

needs_kernel = pytest.mark.skipif(
    shutil.which(cpu_kernel.COMPILER) is None or cpu_kernel.unavailable_reason() is not None,
    reason=f"the CPU kernel cannot be built here: {cpu_kernel.unavailable_reason()}",
)


@pytest.fixture(scope="module")
def model():
    return enable(make_tiny_qwen2(head_dim=32, max_positions=512))


def _decode(model, ids, name, steps=6):
    cache = make_cache(name, model.config)
    kw = cache_kwarg(model)
    with torch.inference_mode():
        logits = [model(input_ids=ids, use_cache=True, **{kw: cache}).logits[:, -1]]
        for _ in range(steps):
            nxt = logits[-1].argmax(-1, keepdim=True)
            logits.append(model(input_ids=nxt, use_cache=True, **{kw: cache}).logits[:, -1])
    return torch.stack(logits, 1), cache


def test_the_name_resolves_to_kvlab_attention():
    r = resolve("dynamic-ckernel")
    assert not r.exact and r.logit_bound == 1e-4 and r.uses_kvlab_attention
    assert r.describe()["attention"] == "float C kernel"
    assert not resolve("dynamic").uses_kvlab_attention and resolve("dynamic").describe() == {
        "name": "dynamic",
        "family": "dynamic",
    }


@needs_kernel
def test_decode_runs_the_float_kernel_and_matches_dynamic(model):
    ids = torch.randint(1, 256, (1, 40), generator=torch.Generator().manual_seed(3))
    ref, _ = _decode(model, ids, "dynamic")
    out, cache = _decode(model, ids, "dynamic-ckernel")
    assert cache.attention_paths() == [f"float C kernel ({cpu_kernel.isa()})"]
    scale = float(ref.abs().max())
    assert (
        0 < float((out - ref).abs().max()) <= 1e-5 * scale
    )  # 0 would mean SDPA ran: another summation order


def test_a_padded_batch_falls_back_to_sdpa_and_says_why(model):
    ids = torch.randint(1, 256, (2, 20), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, :5] = 0  # left padding: the kernel attends every key, so it must not take the step
    cache = make_cache("dynamic-ckernel", model.config)
    kw = cache_kwarg(model)
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask, use_cache=True, **{kw: cache})
        mask = torch.cat((mask, torch.ones(2, 1, dtype=torch.long)), 1)
        model(input_ids=ids[:, -1:], attention_mask=mask, use_cache=True, **{kw: cache})
    assert cache.attention_paths() == ["sdpa (a mask that drops keys (padding))"]
