"""PagedCache inside generate(): equal to DynamicCache (batch 1, batch 2 left-padded, beam search), slot mapping,
copy-on-write, crop, bytes, pool growth and its cap."""

import pytest
import torch
from transformers import DynamicCache, Qwen2Config

from kvlab.caches.paged import PagedCache
from kvlab.runtime.hf_api import cache_kwarg


def greedy(model, ids, cache, n=24, mask=None, **kwargs):
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            **{cache_kwarg(model): cache},
            pad_token_id=0,
            **kwargs,
        )


@pytest.fixture(scope="module")
def prompt_and_reference(tiny_qwen2):
    ids = torch.randint(1, 256, (1, 40), generator=torch.Generator().manual_seed(1))
    return ids, greedy(tiny_qwen2, ids, DynamicCache())


@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_batch_one_equals_dynamic(tiny_qwen2, prompt_and_reference, block_size):
    ids, ref = prompt_and_reference
    cache = PagedCache(block_size=block_size)
    out = greedy(tiny_qwen2, ids, cache)
    assert torch.equal(out, ref)
    tokens = 40 + 24 - 1  # the last sampled token is never fed back
    assert cache.get_seq_length() == tokens
    assert cache.block_tables()[0] == list(range(-(-tokens // block_size)))  # one row: blocks in order
    cache.check_invariants()


def test_batch_two_with_left_padding_equals_dynamic(tiny_qwen2):
    ids = torch.randint(1, 256, (2, 48), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    ids[1, :7] = 0
    mask[1, :7] = 0
    ref = greedy(tiny_qwen2, ids, DynamicCache(), mask=mask)
    cache = PagedCache(block_size=4)
    out = greedy(tiny_qwen2, ids, cache, mask=mask)
    assert torch.equal(out, ref)
    tables = cache.block_tables()
    assert len(tables) == 2 and not set(tables[0]) & set(tables[1])
    # decode steps alternate rows, so the rows' later blocks interleave in the pool
    assert tables[0][-1] - tables[0][-2] == 2
    cache.check_invariants()


def test_slot_mapping_writes_each_token_where_the_block_table_says(tiny_qwen2):
    ids = torch.randint(1, 256, (2, 11), generator=torch.Generator().manual_seed(3))
    paged, dynamic = PagedCache(block_size=4), DynamicCache()
    with torch.no_grad():
        tiny_qwen2(ids, **{cache_kwarg(tiny_qwen2): paged})
        tiny_qwen2(ids, **{cache_kwarg(tiny_qwen2): dynamic})
    for layer_idx in range(2):
        ref_k = dynamic.layers[layer_idx].keys  # [B, H, T, D]
        pool = paged.layers[layer_idx].keys  # [num_blocks, block_size, H, D]
        for row, table in enumerate(paged.tables):
            for pos in (0, 3, 4, 10):
                block_id, offset = table.slot(pos)
                assert torch.equal(pool[block_id, offset], ref_k[row, :, pos])


def test_beam_search_forks_tables_and_copies_on_write(tiny_qwen2):
    ids = torch.randint(1, 256, (1, 21), generator=torch.Generator().manual_seed(4))
    ref = greedy(tiny_qwen2, ids, DynamicCache(), n=12, num_beams=3)
    cache = PagedCache(block_size=4)
    out = greedy(tiny_qwen2, ids, cache, n=12, num_beams=3)
    assert torch.equal(out, ref)
    tokens = cache.get_seq_length()
    assert cache.allocator.num_used < 3 * -(-tokens // 4)  # beams share their common prefix blocks
    assert cache.allocator.cow_copies > 0
    cache.check_invariants()


def test_crop_matches_dynamic(tiny_qwen2):
    ids = torch.randint(1, 256, (1, 30), generator=torch.Generator().manual_seed(5))
    paged, dynamic = PagedCache(block_size=4), DynamicCache()
    with torch.no_grad():
        tiny_qwen2(ids, **{cache_kwarg(tiny_qwen2): paged})
        tiny_qwen2(ids, **{cache_kwarg(tiny_qwen2): dynamic})
        paged.crop(-7)
        dynamic.crop(-7)
        assert paged.get_seq_length() == 23 and paged.allocator.num_used == 6
        a = tiny_qwen2(ids[:, :5], **{cache_kwarg(tiny_qwen2): paged}).logits
        b = tiny_qwen2(ids[:, :5], **{cache_kwarg(tiny_qwen2): dynamic}).logits
    assert torch.equal(a, b)
    paged.check_invariants()


def test_bytes_count_blocks_in_use(tiny_qwen2):
    ids = torch.randint(1, 256, (2, 33), generator=torch.Generator().manual_seed(6))
    cache = PagedCache(block_size=16)
    with torch.no_grad():
        tiny_qwen2(ids, **{cache_kwarg(tiny_qwen2): cache})
    per_token = 2 * 2 * 2 * 32 * 4  # K+V x layers x kv heads x head_dim x fp32 bytes
    b = cache.nbytes_breakdown()
    assert b["tokens"] == 2 * 33 * per_token
    assert b["total"] == cache.nbytes() == 2 * 3 * 16 * per_token  # 33 tokens -> 3 blocks per row
    assert b["internal_waste"] == 2 * 15 * per_token
    assert b["pool_capacity"] >= b["total"]


def test_pool_grows_and_a_capped_pool_refuses_with_numbers(tiny_qwen2):
    ids = torch.randint(1, 256, (1, 40), generator=torch.Generator().manual_seed(7))
    grown = PagedCache(block_size=4, num_blocks=1)
    ref = greedy(tiny_qwen2, ids, DynamicCache(), n=8)
    assert torch.equal(greedy(tiny_qwen2, ids, grown, n=8), ref)
    assert grown.allocator.num_blocks >= 12 and grown.layers[0].keys.shape[0] == grown.allocator.num_blocks
    capped = PagedCache(block_size=4, max_num_blocks=9)  # 40 prompt tokens need 10 blocks of 4
    with pytest.raises(ValueError, match=r"need 10 blocks, 0 free \(pool capped at 9 blocks"):
        with torch.no_grad():
            tiny_qwen2(ids, **{cache_kwarg(tiny_qwen2): capped})


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="block_size"):
        PagedCache(block_size=0)
    with pytest.raises(ValueError, match="num_blocks"):
        PagedCache(num_blocks=5, max_num_blocks=4)
    cfg = Qwen2Config(
        num_hidden_layers=2,
        layer_types=["full_attention", "sliding_attention"],
        use_sliding_window=True,
        sliding_window=8,
    )
    with pytest.raises(ValueError, match="sliding_attention"):
        PagedCache(config=cfg)
