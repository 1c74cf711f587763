"""crop(n) on every kvlab cache, as transformers' Cache.crop reads n, and the generate modes that need it.

What holds after ``crop`` (one row of ``CROPS`` per case: residual-only, into a quantized group, to 0, negative
beyond the length, positive ``max_length``):

* PagedCache: exact. Further decoding equals a ``DynamicCache`` cropped the same way, bit for bit, and a fresh
  cache fed the kept tokens; the blocks in use are those of the kept tokens.
* KIVICache: attention reads, bit for bit, the first ``k`` keys/values it read before the crop (the kept part of a
  cut group as its dequantized values). Further decoding therefore equals a ``DynamicCache`` holding those kept
  dequantized keys/values: bit for bit on the dequantize path, within the fused kernel's rounding on the fused path
  (checked while the residual window does not flush again). The bytes are the ledger of what is kept.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

import kvlab.attention
from kvlab.attention.context import current
from kvlab.caches import KIVICache, PagedCache
from kvlab.caches.crop import crop_keep
from kvlab.runtime.hf_api import cache_kwarg
from tests.crop_helpers import layer_skip_draft, recording

PROMPT = 70  # R = G = 16: Q = (70 - 16) // 16 * 16 = 48 quantized, 22 in the residual window
STEPS = 4  # decode steps after the crop: the window never flushes within them
CROPS = {  # name -> (crop argument, tokens kept)
    "residual_only": (-10, 60),
    "into_a_group": (-30, 40),  # 32 quantized tokens kept, 8 of the cut group restored
    "group_boundary": (-38, 32),
    "to_zero": (-PROMPT, 0),
    "beyond_the_length": (-1000, 0),
    "max_length": (45, 45),
}


def kivi(attention="dequantize"):
    return KIVICache(nbits=4, group_size=16, residual_length=16, attention=attention)


def prompt_ids(n=PROMPT, seed=11, high=256):
    return torch.randint(1, high, (1, n), generator=torch.Generator().manual_seed(seed))


def kept_view(cache):
    """Per layer, the keys/values the dequantize path hands to attention: dequantized prefix, then the window."""
    out = []
    for layer in cache.layers:
        prefix = layer.state.dequantize_prefix()
        k, v = layer.state.key_residual, layer.state.value_residual
        if prefix is not None:
            k, v = torch.cat((prefix[0], k), dim=-2), torch.cat((prefix[1], v), dim=-2)
        out.append((k.clone(), v.clone()))
    return out


def dynamic_from(states, keep):
    ref = DynamicCache()
    if keep:
        for idx, (k, v) in enumerate(states):
            ref.update(k[..., :keep, :], v[..., :keep, :], idx)
    return ref


def decode(model, cache, tokens):
    """Logits of single-token forwards of ``tokens`` ``[1, n]`` on ``cache``: ``[n, vocab]``."""
    out = []
    with torch.no_grad():
        for t in range(tokens.shape[1]):
            step = model(input_ids=tokens[:, t : t + 1], **{cache_kwarg(model): cache}, use_cache=True)
            out.append(step.logits[0, -1])
    return torch.stack(out)


@pytest.fixture
def model(tiny_qwen2):
    yield tiny_qwen2
    tiny_qwen2.set_attn_implementation("sdpa")
    assert current() is None  # every forward closed its context


@pytest.mark.parametrize(
    "n,held,keep",
    [
        (-3, 10, 7),
        (-10, 10, 0),
        (-11, 10, 0),
        (0, 10, 10),
        (4, 10, 4),
        (10, 10, 10),
        (12, 10, 10),
        (-1, 0, 0),
    ],
)
def test_crop_argument_reads_as_transformers(n, held, keep):
    assert crop_keep(n, held) == keep
    assert crop_keep(torch.tensor(n), held) == keep  # a 0-d integer tensor is an integer


@pytest.mark.parametrize("case", list(CROPS))
def test_kivi_crop_then_decode_equals_a_dynamic_cache_of_the_kept_dequantized_tokens(model, case):
    n, keep = CROPS[case]
    ids, nxt = prompt_ids(), prompt_ids(STEPS, seed=12)
    cache = kivi()
    with torch.no_grad():
        model(input_ids=ids, **{cache_kwarg(model): cache}, use_cache=True)
    assert cache.quantized_tokens() == 48
    before = kept_view(cache)
    cache.crop(n)
    assert cache.get_seq_length() == keep
    assert cache.quantized_tokens() == (keep // 16 * 16 if keep < 48 else 48)
    restored = cache.layers[0].state.restored_tokens
    assert restored == (keep % 16 if keep < 48 else 0)
    after = kept_view(cache)
    for (k0, v0), (k1, v1) in zip(before, after):
        assert torch.equal(k1, k0[..., :keep, :]) and torch.equal(v1, v0[..., :keep, :])
    ref = dynamic_from(before, keep)
    got, want = decode(model, cache, nxt), decode(model, ref, nxt)
    assert torch.equal(got, want)
    assert cache.get_seq_length() == keep + STEPS


@pytest.mark.parametrize("case", ["residual_only", "into_a_group", "to_zero"])
def test_fused_kivi_crop_then_decode_matches_the_same_reference(model, case):
    n, keep = CROPS[case]
    ids, nxt = prompt_ids(), prompt_ids(STEPS, seed=12)
    kvlab.attention.enable(model)
    cache = kivi("fused")
    with torch.no_grad():
        # prefill: nothing quantized before it, exact
        model(input_ids=ids, **{cache_kwarg(model): cache}, use_cache=True)
    before = kept_view(cache)
    cache.crop(n)
    assert cache.get_seq_length() == keep
    got = decode(model, cache, nxt)
    assert (
        current() is None
    )  # each forward read its hand-offs (an unread one fails it) and closed its context
    model.set_attn_implementation("sdpa")
    want = decode(model, dynamic_from(before, keep), nxt)
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("case", ["residual_only", "into_a_group", "to_zero"])
def test_kivi_bytes_after_a_crop_are_the_ledger_of_the_kept_tokens(model, case):
    n, keep = CROPS[case]
    cache = kivi()
    with torch.no_grad():
        model(input_ids=prompt_ids(), **{cache_kwarg(model): cache}, use_cache=True)
    cache.crop(n)
    q = cache.quantized_tokens()
    r = keep - q
    d, heads, layers, nbits, g, fp32 = 32, 2, 2, 4, 16, 4
    codes = layers * heads * 2 * q * d * nbits // 8
    meta = layers * heads * 4 * fp32 * q * d // g  # scale + zero, K per-channel and V per-token
    residual = layers * heads * 2 * r * d * fp32
    info = cache.nbytes_breakdown()
    assert (info["codes"], info["scales_zeros"], info["residual"]) == (codes, meta, residual)
    assert cache.nbytes() == info["total"] == codes + meta + residual


def test_kivi_crop_through_transformers_cache_crop_and_bad_arguments(model):
    cache = kivi()
    with torch.no_grad():
        model(input_ids=prompt_ids(), **{cache_kwarg(model): cache}, use_cache=True)
    # Cache.is_croppable exists from transformers 5.17 on; the layers' flag is kvlab's own
    assert getattr(cache, "is_croppable", True) and all(layer.is_croppable for layer in cache.layers)
    Cache.crop(cache, -3)  # transformers' own loop over the layers
    assert [layer.get_seq_length() for layer in cache.layers] == [67, 67]
    for bad in (1.5, "3", True, None, torch.tensor([1, 2]), torch.tensor(True), np.bool_(True)):
        with pytest.raises(TypeError, match=r"`crop` takes an integer number of tokens, got"):
            cache.crop(bad)
    assert cache.get_seq_length() == 67
    cache.crop(0)  # transformers' no-op (generate calls it after each step when it defers the stop check)
    cache.crop(500)  # max_length beyond the length: nothing to do
    assert cache.get_seq_length() == 67
    assert KIVICache().crop(-4) is None  # an empty cache: nothing to do


@pytest.mark.parametrize("case", list(CROPS))
def test_paged_crop_is_exact_and_frees_blocks(model, case):
    n, keep = CROPS[case]
    ids, nxt = prompt_ids(), prompt_ids(STEPS, seed=12)
    paged, dynamic = PagedCache(block_size=8), DynamicCache()
    with torch.no_grad():
        model(input_ids=ids, **{cache_kwarg(model): paged}, use_cache=True)
        model(input_ids=ids, **{cache_kwarg(model): dynamic}, use_cache=True)
    paged.crop(n)
    dynamic.crop(keep - PROMPT)
    assert paged.get_seq_length() == keep and paged.allocator.num_used == -(-keep // 8)
    paged.check_invariants()
    fresh = PagedCache(block_size=8)
    if keep:
        with torch.no_grad():
            model(input_ids=ids[:, :keep], **{cache_kwarg(model): fresh}, use_cache=True)
    got_bytes, want_bytes = paged.nbytes_breakdown(), fresh.nbytes_breakdown()
    for key in ("blocks_in_use", "tokens", "internal_waste", "total"):  # the pool itself may be larger
        assert got_bytes[key] == want_bytes[key], key
    got = decode(model, paged, nxt)
    assert torch.equal(got, decode(model, dynamic, nxt))
    torch.testing.assert_close(got, decode(model, fresh, nxt), rtol=1e-5, atol=1e-5)
    paged.check_invariants()


def test_paged_crop_inside_a_block_shared_by_beams_copies_it_first(model):
    paged = PagedCache(block_size=8)
    with torch.no_grad():
        model(input_ids=prompt_ids(13), **{cache_kwarg(model): paged}, use_cache=True)  # blocks: 8 + 5 tokens
    paged.batch_repeat_interleave(2)  # two rows share both blocks
    paged.crop(-2)
    assert paged.get_seq_length() == 11
    tables = paged.block_tables()
    assert tables[0][0] == tables[1][0] and tables[0][1] != tables[1][1]  # the cut block is copied once
    paged.check_invariants()
    for bad in (2.5, True):
        with pytest.raises(TypeError, match=rf"got {bad!r}"):
            paged.crop(bad)
    assert paged.get_seq_length() == 11


# ---- generate modes that crop: assisted (speculative) decoding and prompt-lookup decoding ---------------------
def greedy(model, ids, cache, n=30, **kwargs):
    with torch.no_grad():
        return model.generate(
            ids,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            **{cache_kwarg(model): cache},
            pad_token_id=0,
            **kwargs,
        )


@pytest.mark.parametrize(
    "make",
    [lambda: KIVICache(nbits=8, group_size=32, residual_length=256), lambda: PagedCache(block_size=4)],
    ids=["kivi8-long-residual", "paged"],
)
def test_assisted_decoding_gives_the_tokens_of_plain_greedy(model, make):
    ids = prompt_ids(40, seed=1)
    draft = layer_skip_draft(model)
    plain = greedy(model, ids, DynamicCache())
    assisted_dynamic = greedy(model, ids, DynamicCache(), assistant_model=draft)
    cache, calls = recording(make())
    out = greedy(model, ids, cache, assistant_model=draft)
    assert torch.equal(out, assisted_dynamic) and torch.equal(out, plain)
    assert any(c < 0 for c in calls) and 0 in calls  # drafts rejected and drafts accepted whole
    assert cache.get_seq_length() == out.shape[1] - 1


@pytest.mark.parametrize(
    "make",
    [lambda: KIVICache(nbits=8, group_size=32, residual_length=256), lambda: PagedCache(block_size=4)],
    ids=["kivi8-long-residual", "paged"],
)
def test_prompt_lookup_decoding_runs_and_gives_the_tokens_of_plain_greedy(model, make):
    ids = prompt_ids(60, seed=1, high=12)  # a small alphabet: n-grams repeat, so lookups propose drafts
    plain = greedy(model, ids, DynamicCache())
    cache, calls = recording(make())
    out = greedy(model, ids, cache, prompt_lookup_num_tokens=4)
    assert torch.equal(out, plain)
    assert any(c < 0 for c in calls)


@pytest.mark.parametrize("attention", ["dequantize", "fused"])
def test_assisted_decoding_runs_when_drafts_are_cut_inside_quantized_groups(model, attention):
    """R = 0: every verified draft is flushed, so rejections cut into quantized groups and restore tokens."""
    ids = prompt_ids(40, seed=1)
    draft = layer_skip_draft(model)
    if attention == "fused":
        kvlab.attention.enable(model)
    cache = KIVICache(nbits=4, group_size=16, residual_length=0, attention=attention)
    out = greedy(model, ids, cache, assistant_model=draft)
    assert out.shape == (1, 70) and cache.get_seq_length() == 69
    assert cache.layers[0].state.restored_tokens > 0
    q = cache.quantized_tokens()
    assert q % 16 == 0 and 0 <= 69 - q < 16  # R = 0: fewer than G tokens outside the quantized groups
    assert current() is None


def test_a_rejected_draft_that_crossed_a_flush_leaves_tokens_quantized_that_greedy_holds_in_float():
    """Why speculative decoding on KIVI is not lossless against the same cache's greedy decoding (KIVICache's Notes,
    the README): 60 tokens, then 1 accepted + 4 drafted ones overflow the window (R 32 + G 32) and flush 32 tokens;
    the crop of the 4 drafts leaves them quantized, where greedy decoding of the same 61 tokens quantized none."""
    x = torch.randn(1, 2, 65, 32, generator=torch.Generator().manual_seed(0))
    speculative, plain = (KIVICache(nbits=4, group_size=32, residual_length=32) for _ in range(2))
    for cache in (speculative, plain):
        cache.update(x[:, :, :60], x[:, :, :60], 0)
    speculative.update(x[:, :, 60:65], x[:, :, 60:65], 0)
    speculative.crop(-4)
    plain.update(x[:, :, 60:61], x[:, :, 60:61], 0)
    assert speculative.get_seq_length() == plain.get_seq_length() == 61
    assert (speculative.quantized_tokens(), plain.quantized_tokens()) == (32, 0)
    k_spec, _ = speculative.update(x[:, :, 61:62], x[:, :, 61:62], 0)
    k_plain, _ = plain.update(x[:, :, 61:62], x[:, :, 61:62], 0)
    assert torch.equal(k_plain, x[:, :, :62])  # greedy still attends to the float keys
    assert not torch.equal(k_spec, k_plain)


@pytest.mark.parametrize("bad", [torch.tensor(True), torch.tensor(False), np.bool_(True)], ids=str)
def test_paged_crop_refuses_a_bool_scalar_like_a_python_bool(model, bad):
    paged = PagedCache(block_size=8)
    with torch.no_grad():
        model(input_ids=prompt_ids(), **{cache_kwarg(model): paged}, use_cache=True)
    held = paged.get_seq_length()
    with pytest.raises(TypeError, match=r"`crop` takes an integer number of tokens, got"):
        paged.crop(bad)
    assert paged.get_seq_length() == held
    paged.check_invariants()
