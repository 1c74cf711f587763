"""Generate modes that roll the cache back with ``crop``, on the bundled model (fp32, CPU: in bf16 its repetitive
continuations meet near-ties that layout-dependent rounding breaks either way): assisted (speculative)
decoding with a small draft model and prompt-lookup decoding, with kvlab's caches.

Where the cache returns the exact keys/values (PagedCache; an 8-bit KIVICache whose residual window is longer than
the whole generation, so nothing is quantized mid-way) assisted decoding gives the tokens of ``DynamicCache`` with
the same draft, bit for bit, and those are plain greedy's tokens. Where drafts are cut inside quantized groups
(``residual_length=0``) it runs and keeps the cache consistent; its tokens are those of a quantized cache, not
compared here.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import kvlab.attention
from kvlab.attention.context import current
from kvlab.caches import KIVICache, PagedCache
from kvlab.models import heldout_token_ids
from kvlab.runtime.hf_api import cache_kwarg
from tests.crop_helpers import layer_skip_draft, recording

NEW_TOKENS = 32
EXACT_CACHES = {
    "kivi8-long-residual": lambda: KIVICache(
        nbits=8, group_size=32, residual_length=512
    ),  # > 200 + 32 tokens
    "paged": lambda: PagedCache(block_size=16),
}


@pytest.fixture(scope="module")
def reference_fp32():
    """(model, tokenizer) of the bundled model in float32 on CPU."""
    from kvlab.models import load_model, reference_model_path

    if not (reference_model_path() / "model.safetensors").is_file():
        pytest.skip("the bundled reference model is not in this checkout")
    return load_model(None, dtype="float32", device="cpu")


@pytest.fixture
def model(reference_fp32):
    model, tok = reference_fp32
    model.set_attn_implementation("sdpa")
    yield model, tok
    model.set_attn_implementation("sdpa")
    assert current() is None  # every forward closed its context


@pytest.fixture(scope="module")
def draft(reference_fp32):
    """The bundled model's first 2 of 4 layers (shared embeddings and head, a layer-skip draft): it proposes 6
    tokens per step, some accepted and some rejected, so the target's cache is cropped by 0 to 6 tokens."""
    return layer_skip_draft(reference_fp32[0], num_layers=2)


def greedy(model, ids, cache, **kwargs):
    with torch.no_grad():
        return model.generate(
            ids,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            **{cache_kwarg(model): cache},
            pad_token_id=0,
            **kwargs,
        )


@pytest.mark.parametrize("name", list(EXACT_CACHES))
def test_assisted_decoding_with_a_draft_model_gives_plain_greedy_tokens(model, draft, name):
    model, tok = model
    ids = torch.tensor([heldout_token_ids(tok, 200, offset=3000)])
    plain = greedy(model, ids, DynamicCache())
    assisted_dynamic = greedy(model, ids, DynamicCache(), assistant_model=draft)
    cache, calls = recording(EXACT_CACHES[name]())
    out = greedy(model, ids, cache, assistant_model=draft)
    assert torch.equal(out, assisted_dynamic)  # the same verification forwards, the same keys/values
    assert torch.equal(out, plain)
    assert min(calls) < -1 and 0 in calls  # multi-token rejections and whole drafts accepted
    assert cache.get_seq_length() == out.shape[1] - 1
    if isinstance(cache, KIVICache):
        assert cache.quantized_tokens() == 0
    else:
        cache.check_invariants()
        assert cache.allocator.num_used == -(-cache.get_seq_length() // 16)  # rejected drafts' blocks freed


@pytest.mark.parametrize("name", list(EXACT_CACHES))
def test_prompt_lookup_decoding_runs_and_gives_plain_greedy_tokens(model, name):
    model, tok = model
    ids = torch.tensor([heldout_token_ids(tok, 300, offset=8000)])
    plain = greedy(model, ids, DynamicCache())
    cache, calls = recording(EXACT_CACHES[name]())
    out = greedy(model, ids, cache, prompt_lookup_num_tokens=4)
    assert torch.equal(out, plain)
    assert any(c < 0 for c in calls)  # some looked-up drafts were rejected and cropped
    assert cache.get_seq_length() == out.shape[1] - 1


@pytest.mark.parametrize("attention", ["dequantize", "fused"])
def test_assisted_decoding_cutting_quantized_groups_runs_consistently(model, draft, attention):
    model, tok = model
    ids = torch.tensor([heldout_token_ids(tok, 200, offset=3000)])
    if attention == "fused":
        kvlab.attention.enable(model)
    cache = KIVICache(nbits=4, group_size=32, residual_length=0, attention=attention)
    out = greedy(model, ids, cache, assistant_model=draft)
    held = cache.get_seq_length()
    assert out.shape == (1, 200 + NEW_TOKENS) and held == out.shape[1] - 1
    assert cache.layers[0].state.restored_tokens > 0  # rejections cut inside quantized groups
    q = cache.quantized_tokens()
    assert q % 32 == 0 and held - q < 32
    assert current() is None
