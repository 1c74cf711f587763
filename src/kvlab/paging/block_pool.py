"""Block pool: fixed-size KV blocks, an O(1) free queue, reference counts and full-block prefix hashing.

Pure bookkeeping (no torch), in the style of vLLM v1 ``block_pool.py`` / ``kv_cache_utils.py``; the design is
PagedAttention (Kwon et al., arXiv:2309.06180, section 4.2 block tables, section 4.4 sharing with reference counts and
copy-on-write). A *block* holds ``block_size_tokens`` KV slots of one sequence position range; the physical
storage (a tensor per layer) lives elsewhere and is indexed by ``block_id``.

Free blocks sit in a doubly linked queue: allocation pops from the head, freeing appends to the tail, and a
prefix-cache hit on a free block unlinks it from the middle, all in O(1). A full block may carry a chained prefix
hash (:func:`hash_block_tokens`); while it is free it stays findable by that hash until it is reallocated
(least recently freed first), which is how vLLM reuses a shared system prompt across requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvlab.plan.config_fields import count_text
from kvlab.runtime.checks import check_int


@dataclass(slots=True, eq=False)
class KVBlock:
    """One physical block of KV slots (bookkeeping only; identity equality)."""

    block_id: int  # row of the pool tensor that stores this block's K/V
    ref_cnt: int = 0  # block tables holding this block; 0 means free
    num_tokens: int = 0  # slots written, 0..block_size_tokens (every holder agrees)
    block_hash: int | None = None  # chained prefix hash while the block is full and cached, else None
    prev_free: KVBlock | None = field(default=None, repr=False)  # free-queue neighbour to the head, or None
    next_free: KVBlock | None = field(default=None, repr=False)  # free-queue neighbour to the tail, or None


def hash_block_tokens(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """Chained hash of one full block: it depends on the block's tokens and on every block before it.

    Two sequences get equal hashes for block ``i`` only if their first ``(i + 1) * block_size`` tokens agree
    (up to hash collisions), as in vLLM's ``hash_block_tokens``.
    """
    return hash((parent_hash, tuple(token_ids)))


def prefix_block_hashes(token_ids: Sequence[int], block_size_tokens: int) -> list[int]:
    """Chained hashes of every *full* block of ``token_ids`` (a trailing partial block gets none)."""
    if block_size_tokens < 1:
        raise ValueError(f"`block_size_tokens` must be >= 1, got {block_size_tokens!r}")
    hashes: list[int] = []
    parent = None
    for start in range(0, len(token_ids) - block_size_tokens + 1, block_size_tokens):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size_tokens])
        hashes.append(parent)
    return hashes


class FreeBlockQueue:
    """Doubly linked queue of free blocks with sentinels: ``popleft``, ``append`` and ``remove`` are O(1)."""

    def __init__(self, blocks: Iterable[KVBlock] = ()) -> None:
        self._head = KVBlock(-1)  # sentinel before the first free block
        self._tail = KVBlock(-1)  # sentinel after the last free block
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free

    def popleft(self) -> KVBlock:
        """Remove and return the block at the head (the least recently freed)."""
        block = self._head.next_free
        if block is self._tail:
            raise ValueError("no free block: the free queue is empty")
        self.remove(block)
        return block

    def append(self, block: KVBlock) -> None:
        """Put ``block`` at the tail (it will be reallocated last)."""
        assert block.prev_free is None and block.next_free is None, f"block {block.block_id} already queued"
        last = self._tail.prev_free
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free += 1

    def remove(self, block: KVBlock) -> None:
        """Unlink ``block`` from anywhere in the queue."""
        prev, nxt = block.prev_free, block.next_free
        assert prev is not None and nxt is not None, f"block {block.block_id} is not in the free queue"
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def __iter__(self):
        block = self._head.next_free
        while block is not self._tail:
            yield block
            block = block.next_free


class BlockPool:
    """A fixed set of KV blocks with reference counts, a free queue and an optional prefix cache.

    Args:
        num_blocks: physical blocks in the pool.
        block_size_tokens: KV slots per block (vLLM's default is 16).
        enable_prefix_caching: keep full blocks findable by their chained hash (:meth:`lookup`).

    Raises:
        ValueError: on a non-positive size, or from :meth:`allocate` when fewer blocks are free than needed.
    """

    def __init__(self, num_blocks: int, block_size_tokens: int, enable_prefix_caching: bool = False) -> None:
        check_int("num_blocks", num_blocks, 0)
        check_int("block_size_tokens", block_size_tokens, 1)
        self.block_size_tokens = block_size_tokens
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[int, KVBlock] = {}  # chained block hash -> the block holding those tokens
        self.num_used = 0  # blocks with ref_cnt > 0, counted independently of the free queue
        self.num_filled_slots = 0  # sum of num_tokens over used blocks
        self.prefix_hits = 0  # blocks reused through lookup() + touch()
        self.cow_copies = 0  # shared partial blocks copied before a write
        self.evictions = 0  # cached free blocks whose hash was dropped on reallocation

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return self.free_queue.num_free

    def usage(self) -> float:
        """Fraction of blocks in use, 0..1."""
        return self.num_used / self.num_blocks if self.blocks else 0.0

    def add_blocks(self, n: int) -> None:
        """Grow the pool by ``n`` free blocks (ids continue from the current size).

        Raises:
            ValueError: ``n`` not an integer >= 0.
        """
        check_int("n", n, 0)
        for block_id in range(len(self.blocks), len(self.blocks) + n):
            block = KVBlock(block_id)
            self.blocks.append(block)
            self.free_queue.append(block)

    def allocate(self, n: int) -> list[KVBlock]:
        """Take ``n`` empty blocks from the head of the free queue (ref_cnt 1, num_tokens 0).

        Raises:
            ValueError: ``n`` not an integer >= 0; ``need n blocks, f free`` when the pool cannot provide them
                (nothing is taken then).
        """
        check_int("n", n, 0)
        if n > self.free_queue.num_free:
            raise ValueError(
                f"need {count_text(n, 'block')}, {self.free_queue.num_free:,} free (pool of {len(self.blocks):,} blocks "
                f"x {self.block_size_tokens:,} tokens)"
            )
        out = []
        for _ in range(n):
            block = self.free_queue.popleft()
            if block.block_hash is not None:  # evict its cached prefix: the slots are about to be overwritten
                if self.cached.get(block.block_hash) is block:
                    del self.cached[block.block_hash]
                block.block_hash = None
                self.evictions += 1
            block.ref_cnt = 1
            block.num_tokens = 0
            out.append(block)
        self.num_used += n
        return out

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Add a holder to each block (a fork, or a prefix-cache hit); free blocks leave the free queue.

        Raises:
            ValueError: a block of another pool (nothing is changed).
        """
        blocks = self._own(blocks)
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
                self.num_used += 1
                self.num_filled_slots += block.num_tokens
            block.ref_cnt += 1

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one holder from each block; a block reaching 0 goes to the tail of the free queue.

        Pass a sequence's blocks in reverse order (as :class:`BlockTable` does) so that its tail blocks, the least
        likely to be shared, are reallocated first (vLLM's eviction order).

        Raises:
            ValueError: a block of another pool, or one without a holder (a double free; nothing is changed).
        """
        blocks = self._own(blocks)
        holders: dict[int, int] = {}
        for block in blocks:
            holders[block.block_id] = holders.get(block.block_id, 0) + 1
            if holders[block.block_id] > block.ref_cnt:
                raise ValueError(
                    f"double free of block {block.block_id}: {block.ref_cnt} holder(s), freed "
                    f"{holders[block.block_id]} time(s) (nothing was freed)"
                )
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)
                self.num_used -= 1
                self.num_filled_slots -= block.num_tokens

    def copy_on_write(self, block: KVBlock, num_tokens: int) -> KVBlock:
        """Replace a shared ``block`` by a private copy holding its first ``num_tokens`` slots.

        The caller copies the slot contents (``block.block_id`` -> returned block's ``block_id``).

        Raises:
            ValueError: a block of another pool, or one with a single holder (nothing to copy it away from).
        """
        (block,) = self._own([block])
        if block.ref_cnt <= 1:
            raise ValueError(f"copy-on-write of unshared block {block.block_id} ({block.ref_cnt} holder(s))")
        (new,) = self.allocate(1)
        new.num_tokens = num_tokens
        self.num_filled_slots += num_tokens
        self.free([block])
        self.cow_copies += 1
        return new

    def _own(self, blocks: Iterable[KVBlock]) -> list[KVBlock]:
        """``blocks`` as a list, each checked to be this pool's (its id indexes this very block)."""
        blocks = list(blocks)
        for block in blocks:
            bid = getattr(block, "block_id", None)
            if not isinstance(bid, int) or not 0 <= bid < len(self.blocks) or self.blocks[bid] is not block:
                raise ValueError(
                    f"block {bid!r} is not a block of this pool ({len(self.blocks)} blocks): it came from another "
                    "pool or is not a KVBlock"
                )
        return blocks

    def lookup(self, block_hash: int) -> KVBlock | None:
        """The cached block holding the tokens behind ``block_hash``, or None."""
        return self.cached.get(block_hash)

    def cache_block(self, block: KVBlock, block_hash: int) -> None:
        """Make a full ``block`` findable by ``block_hash`` (a second block with the same hash stays private)."""
        if not self.enable_prefix_caching:
            return
        assert block.num_tokens == self.block_size_tokens, f"caching a partial block {block.block_id}"
        if block.block_hash is None and block_hash not in self.cached:
            block.block_hash = block_hash
            self.cached[block_hash] = block

    def check_invariants(self, tables: Iterable[BlockTableLike] | None = None) -> None:
        """Assert the pool's bookkeeping; with ``tables``, also that ref counts equal the holders among them.

        Checks: free + used = total (counted two ways); the free queue is well linked and holds exactly the
        blocks with ref_cnt 0; slot counts are within a block; cached blocks are full and indexed by their own
        hash, and a block carries a prefix hash only while the cache maps that hash to it (a reallocated block
        carries none); each table holds ``ceil(tokens / block_size)`` blocks, all full but the last.
        """
        queued = list(self.free_queue)
        assert len(queued) == self.free_queue.num_free, "free queue length counter is off"
        assert len({id(b) for b in queued}) == len(queued), "a block is queued twice"
        assert all(b.ref_cnt == 0 for b in queued), "a block in the free queue has holders"
        used = [b for b in self.blocks if b.ref_cnt > 0]
        assert len(used) == self.num_used, f"used counter {self.num_used} != {len(used)} blocks with holders"
        assert self.num_free + self.num_used == self.num_blocks, (
            f"free {self.num_free} + used {self.num_used} != total {self.num_blocks}"
        )
        assert all(b.ref_cnt >= 0 for b in self.blocks), "negative ref count"
        assert all(0 <= b.num_tokens <= self.block_size_tokens for b in self.blocks), (
            "slot count out of range"
        )
        assert self.num_filled_slots == sum(b.num_tokens for b in used), "filled-slot counter is off"
        for block_hash, block in self.cached.items():
            assert block.block_hash == block_hash, f"cached block {block.block_id} has another hash"
            assert block.num_tokens == self.block_size_tokens, f"cached block {block.block_id} is not full"
        for block in self.blocks:  # a hash outside the cache is stale: the block can never be cached again
            assert block.block_hash is None or self.cached.get(block.block_hash) is block, (
                f"block {block.block_id} carries prefix hash {block.block_hash} that the prefix cache does not map "
                "to it (stale after reallocation or truncation)"
            )
        if tables is None:
            return
        holders: dict[int, int] = {}
        bs = self.block_size_tokens
        for table in tables:
            n_blocks = -(-table.num_tokens // bs)
            assert len(table.blocks) == n_blocks, (
                f"{table.num_tokens} tokens need {n_blocks} blocks, table holds {len(table.blocks)}"
            )
            for i, block in enumerate(table.blocks):
                holders[block.block_id] = holders.get(block.block_id, 0) + 1
                fill = min(bs, table.num_tokens - i * bs)
                assert block.num_tokens >= fill, (
                    f"block {block.block_id} holds fewer slots than its table uses"
                )
                if block.ref_cnt == 1:
                    assert block.num_tokens == fill, f"private block {block.block_id} fill != its table's"
        for block in self.blocks:
            assert block.ref_cnt == holders.get(block.block_id, 0), (
                f"block {block.block_id}: ref_cnt {block.ref_cnt} != {holders.get(block.block_id, 0)} holders"
            )


class BlockTableLike(Protocol):
    """What :meth:`BlockPool.check_invariants` reads from a table (see :class:`kvlab.paging.BlockTable`)."""

    blocks: list[KVBlock]
    num_tokens: int
