"""Block pool and block tables: docs/paging.md's figures, sharing, copy-on-write, prefix reuse, invariants."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.paging import BlockPool, BlockTable, FreeBlockQueue, KVBlock, prefix_block_hashes


def test_exact_multiple_of_block_size_holds_exactly_that_many_blocks():
    pool = BlockPool(10, 16)
    table = BlockTable(pool)
    table.allocate(32)
    assert len(table.blocks) == 2 and table.last_block_tokens == 16 and table.internal_waste_tokens == 0


def test_one_token_past_a_multiple_opens_a_block_with_15_empty_slots():
    pool = BlockPool(10, 16)
    table = BlockTable(pool)
    table.allocate(33)
    assert len(table.blocks) == 3 and table.last_block_tokens == 1 and table.internal_waste_tokens == 15


def test_decode_growth_crosses_the_boundary_at_the_same_place():
    pool = BlockPool(10, 16)
    table = BlockTable(pool)
    table.allocate(31)
    table.append_tokens(1)
    assert len(table.blocks) == 2 and table.last_block_tokens == 16
    table.append_tokens(1)
    assert len(table.blocks) == 3 and table.last_block_tokens == 1


def test_1601_tokens_with_100_free_blocks_needs_101_and_is_rejected():
    pool = BlockPool(100, 16)
    table = BlockTable(pool)
    with pytest.raises(ValueError, match=r"need 101 blocks.*100 free"):
        table.allocate(1601)
    assert pool.num_free == 100 and table.num_tokens == 0  # nothing taken
    table.allocate(1600)
    assert pool.num_free == 0
    with pytest.raises(ValueError, match=r"need 1 block to append 1 token, 0 free"):
        table.append_tokens(1)
    assert table.num_tokens == 1600
    pool.check_invariants([table])


def test_slot_mapping_follows_the_block_table():
    pool = BlockPool(8, 4)
    a, b = BlockTable(pool), BlockTable(pool)
    for _ in range(6):  # interleaved growth: a gets blocks 0, 2; b gets 1, 3
        a.append_tokens(1)
        b.append_tokens(1)
    assert a.block_ids == [0, 2] and b.block_ids == [1, 3]
    assert a.slot(5) == (2, 1)
    assert a.slot_mapping(0, 6) == [0, 1, 2, 3, 8, 9]
    assert b.slot_mapping(3, 6) == [7, 12, 13]
    with pytest.raises(ValueError, match="pos"):
        a.slot(6)


def test_free_queue_is_fifo_and_removes_from_the_middle():
    blocks = [KVBlock(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[2])
    assert [b.block_id for b in queue] == [0, 1, 3, 4] and len(queue) == 4
    assert queue.popleft().block_id == 0
    queue.append(blocks[2])
    assert [b.block_id for b in queue] == [1, 3, 4, 2]


def test_freed_blocks_return_tail_first_and_are_reused_last():
    pool = BlockPool(6, 4)
    table = BlockTable(pool)
    table.allocate(12)  # blocks 0, 1, 2
    table.free()
    assert [b.block_id for b in pool.free_queue] == [3, 4, 5, 2, 1, 0]
    pool.check_invariants([table])


def test_fork_shares_blocks_and_copy_on_write_protects_the_parent():
    pool = BlockPool(10, 4)
    parent = BlockTable(pool)
    parent.allocate(6)  # blocks 0 (full), 1 (2 of 4)
    child = parent.fork()
    assert child.block_ids == parent.block_ids and [b.ref_cnt for b in parent.blocks] == [2, 2]
    copies = child.append_tokens(1)
    assert copies == [(1, 2)]  # the shared partial block is copied before the write
    assert child.block_ids == [0, 2] and parent.block_ids == [0, 1]
    assert [b.ref_cnt for b in parent.blocks] == [2, 1] and pool.cow_copies == 1
    assert pool.blocks[2].num_tokens == 3 and pool.blocks[1].num_tokens == 2
    assert parent.append_tokens(1) == []  # the parent's block is private again: written in place
    pool.check_invariants([parent, child])
    parent.free()
    assert pool.blocks[0].ref_cnt == 1
    child.free()
    assert pool.num_free == 10
    pool.check_invariants([])


def test_fork_at_a_full_block_needs_no_copy():
    pool = BlockPool(10, 4)
    parent = BlockTable(pool)
    parent.allocate(8)
    child = parent.fork()
    assert child.append_tokens(1) == [] and pool.cow_copies == 0
    pool.check_invariants([parent, child])


def test_prefix_cache_shares_full_blocks_and_revives_freed_ones():
    pool = BlockPool(10, 4, enable_prefix_caching=True)
    system = list(range(100, 108))  # two full blocks of shared prompt
    a_tokens, b_tokens = system + [1, 2, 3], system + [7, 8]
    a, b = BlockTable(pool), BlockTable(pool)
    assert a.allocate(len(a_tokens), prefix_block_hashes(a_tokens, 4)) == 0
    assert b.allocate(len(b_tokens), prefix_block_hashes(b_tokens, 4)) == 2
    assert b.block_ids[:2] == a.block_ids[:2] and b.block_ids[2] != a.block_ids[2]
    assert pool.num_used == 4 and pool.prefix_hits == 2
    pool.check_invariants([a, b])
    a.free()
    b.free()
    c = BlockTable(pool)
    assert c.allocate(len(a_tokens), prefix_block_hashes(a_tokens, 4)) == 2  # still cached while free
    pool.check_invariants([c])


def test_prefix_cache_leaves_one_token_to_compute():
    pool = BlockPool(10, 4, enable_prefix_caching=True)
    tokens = list(range(8))
    a, b = BlockTable(pool), BlockTable(pool)
    a.allocate(8, prefix_block_hashes(tokens, 4))
    assert b.allocate(8, prefix_block_hashes(tokens, 4)) == 1  # the last block is recomputed, not shared
    pool.check_invariants([a, b])


def test_reallocating_a_cached_free_block_evicts_its_hash():
    pool = BlockPool(2, 4, enable_prefix_caching=True)
    tokens = list(range(8))
    a = BlockTable(pool)
    a.allocate(8, prefix_block_hashes(tokens, 4))
    a.free()
    assert len(pool.cached) == 2
    b = BlockTable(pool)
    b.allocate(5)  # takes both blocks, least recently freed first
    assert pool.cached == {} and pool.evictions == 2
    c = BlockTable(pool)
    with pytest.raises(ValueError, match=r"need 2 blocks.*0 prefix blocks cached"):  # the prefix is gone
        c.allocate(5, prefix_block_hashes(tokens, 4))


def test_a_reallocated_block_carries_no_stale_prefix_hash_and_can_be_cached_again():
    pool = BlockPool(4, 4, enable_prefix_caching=True)
    first, second = list(range(16)), list(range(100, 109))
    a = BlockTable(pool)
    a.allocate(16, prefix_block_hashes(first, 4))  # four full blocks, all cached
    a.free()  # free but still findable: queue 3, 2, 1, 0
    pool.check_invariants([])
    b = BlockTable(pool)
    b.allocate(9, prefix_block_hashes(second, 4))  # reallocates 3, 2, 1: their old hashes are evicted
    pool.check_invariants([b])
    assert all(pool.blocks[i].block_hash is None for i in b.block_ids[2:])  # the partial block has none
    assert [pool.lookup(h) for h in prefix_block_hashes(second, 4)] == b.blocks[:2]  # cached under new hashes
    c = BlockTable(pool)
    # 2 hits + 1 new block: fits only through the hits, with 1 block free
    assert c.allocate(9, prefix_block_hashes(second[:8] + [7], 4)) == 2
    assert pool.prefix_hits == 2 and pool.num_free == 0
    pool.check_invariants([b, c])


def test_check_invariants_catches_a_stale_prefix_hash():
    pool = BlockPool(2, 4, enable_prefix_caching=True)
    table = BlockTable(pool)
    table.allocate(8, prefix_block_hashes(list(range(8)), 4))
    table.free()
    del pool.cached[pool.blocks[0].block_hash]  # as an eviction that forgot to clear the block's own hash
    with pytest.raises(AssertionError, match="stale"):
        pool.check_invariants([])


def test_truncate_frees_trailing_blocks_and_uncaches_a_partial_block():
    pool = BlockPool(10, 4, enable_prefix_caching=True)
    tokens = list(range(12))
    table = BlockTable(pool)
    table.allocate(12, prefix_block_hashes(tokens, 4))
    table.truncate(6)
    assert len(table.blocks) == 2 and table.last_block_tokens == 2 and pool.num_used == 2
    assert table.blocks[1].block_hash is None  # partial now: no longer a prefix
    assert len(pool.cached) == 2  # the freed third block still holds a valid prefix until reallocated
    pool.check_invariants([table])


def test_check_invariants_catches_corruption():
    pool = BlockPool(4, 4)
    table = BlockTable(pool)
    table.allocate(5)
    pool.blocks[0].ref_cnt += 1
    with pytest.raises(AssertionError, match="ref_cnt"):
        pool.check_invariants([table])
    pool.blocks[0].ref_cnt -= 1
    pool.num_used += 1
    with pytest.raises(AssertionError, match="used"):
        pool.check_invariants()


def test_pool_grows():
    pool = BlockPool(1, 4)
    pool.add_blocks(2)
    assert pool.num_blocks == 3 and pool.num_free == 3
    pool.check_invariants()


@pytest.mark.parametrize(
    "bad", [{"num_blocks": -1, "block_size_tokens": 4}, {"num_blocks": 4, "block_size_tokens": 0}]
)
def test_bad_sizes_are_rejected(bad):
    with pytest.raises(ValueError):
        BlockPool(**bad)


ops = st.lists(
    st.tuples(
        st.sampled_from(["new", "append", "fork", "free", "truncate"]), st.integers(0, 40), st.integers(0, 7)
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, block_size=st.sampled_from([1, 3, 4, 16]), caching=st.booleans())
def test_random_operation_sequences_keep_every_invariant(ops, block_size, caching):
    pool = BlockPool(24, block_size, enable_prefix_caching=caching)
    tables: list[BlockTable] = []
    for op, n, pick in ops:
        table = tables[pick % len(tables)] if tables else None
        free_before, used_before = pool.num_free, pool.num_used
        try:
            if op == "new" or table is None:
                t = BlockTable(pool)
                tokens = [pick] * 4 + list(range(n))  # small prompts that often share a first block
                t.allocate(len(tokens), prefix_block_hashes(tokens, block_size))
                tables.append(t)
            elif op == "append":
                table.append_tokens(n % 9)
            elif op == "fork":
                tables.append(table.fork())
            elif op == "free":
                table.free()
                tables.remove(table)
            else:
                table.truncate(n % (table.num_tokens + 1))
        except ValueError as e:  # only a capacity refusal is expected here, and it must be a true one
            need = re.match(r"need (\d+) blocks?\b.*?, (\d+) free", str(e))
            assert need is not None, f"unexpected refusal: {e}"
            assert int(need[2]) == free_before < int(need[1]), str(e)  # it asked for more than was free
            assert (pool.num_free, pool.num_used) == (free_before, used_before)  # a refusal takes nothing
        pool.check_invariants(tables)
    for t in tables:
        t.free()
    pool.check_invariants([])
    assert pool.num_free == pool.num_blocks and pool.num_filled_slots == 0


def test_cutting_inside_a_shared_block_copies_it_first():
    pool = BlockPool(4, 4)
    parent = BlockTable(pool)
    parent.allocate(8)  # blocks 0, 1, both full
    child = parent.fork()
    assert child.truncate(6) == [(1, 2)]
    assert child.block_ids == [0, 2] and pool.blocks[1].num_tokens == 4 and pool.blocks[2].num_tokens == 2
    pool.check_invariants([parent, child])
    pool.allocate(1)  # exhaust the pool: a second cut inside a shared block is refused
    sibling = parent.fork()
    with pytest.raises(ValueError, match="need 1 block to cut inside a shared block, 0 free"):
        sibling.truncate(5)
    assert sibling.num_tokens == 8


def test_paging_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, kvlab.paging, kvlab.paging.figure; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
