"""Block table of one sequence: its logical blocks mapped to physical blocks of a :class:`BlockPool`.

Token ``pos`` of a sequence lives in logical block ``pos // block_size`` at offset ``pos % block_size``; the block
table maps the logical block to a physical ``block_id``, and the *slot mapping* flattens that to
``block_id * block_size + offset``, the row a kernel writes the token's K/V to (PagedAttention, arXiv:2309.06180
section 4.2; vLLM's ``slot_mapping``). A table always holds exactly ``ceil(num_tokens / block_size)`` blocks, all full
but the last.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.paging.block_pool import BlockPool, KVBlock
from kvlab.plan.config_fields import count_text


class BlockTable:
    """Logical -> physical block map of one sequence.

    Args:
        pool: the :class:`BlockPool` the blocks come from.

    Every method that takes blocks raises ``ValueError`` (``need n blocks, f free``) and leaves the table and the
    pool unchanged when the pool cannot provide them.
    """

    __slots__ = ("pool", "blocks", "num_tokens")

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.blocks: list[KVBlock] = []  # logical block i -> physical block
        self.num_tokens = 0  # KV slots this sequence has written

    def __repr__(self) -> str:
        return f"BlockTable(num_tokens={self.num_tokens}, block_ids={self.block_ids})"

    @property
    def block_ids(self) -> list[int]:
        """Physical block ids in logical order (what a paged-attention kernel reads)."""
        return [block.block_id for block in self.blocks]

    @property
    def last_block_tokens(self) -> int:
        """Slots used in the last block (0 for an empty table)."""
        if not self.blocks:
            return 0
        return self.num_tokens - (len(self.blocks) - 1) * self.pool.block_size_tokens

    @property
    def internal_waste_tokens(self) -> int:
        """Unused slots in this table's blocks (only the last block can have any)."""
        return len(self.blocks) * self.pool.block_size_tokens - self.num_tokens

    def _prefix_hits(self, num_tokens: int, block_hashes: Sequence[int]) -> list[KVBlock]:
        """The cached blocks of the longest run of leading ``block_hashes`` a prefill of ``num_tokens`` reuses (at
        least one token is always left to compute, as in vLLM)."""
        pool = self.pool
        hits: list[KVBlock] = []
        if block_hashes and pool.enable_prefix_caching:
            for block_hash in block_hashes[: max(num_tokens - 1, 0) // pool.block_size_tokens]:
                block = pool.lookup(block_hash)
                if block is None:
                    break
                hits.append(block)
        return hits

    def blocks_needed(self, num_tokens: int, block_hashes: Sequence[int] = ()) -> int:
        """Free blocks :meth:`allocate` of ``num_tokens`` would take from the pool: new blocks plus cached free
        blocks it revives (a cached block another table holds costs none). Nothing changes."""
        hits = self._prefix_hits(num_tokens, block_hashes)
        return -(-num_tokens // self.pool.block_size_tokens) - sum(1 for block in hits if block.ref_cnt > 0)

    def allocate(self, num_tokens: int, block_hashes: Sequence[int] = ()) -> int:
        """Give an empty table ``num_tokens`` slots (a prefill), reusing cached full blocks where it can.

        Args:
            num_tokens: prompt tokens to store.
            block_hashes: chained hashes of the prompt's full blocks (:func:`prefix_block_hashes`); the longest
                run of leading hashes found in the pool's prefix cache is shared instead of allocated. At least one
                token is always left to compute, as in vLLM. New full blocks get their hash registered.

        Returns:
            The number of leading blocks reused from the prefix cache.
        """
        if self.blocks:
            raise ValueError(f"allocate() needs an empty table, this one holds {self.num_tokens} tokens")
        if num_tokens < 0:
            raise ValueError(f"`num_tokens` must be >= 0, got {num_tokens!r}")
        pool = self.pool
        bs = pool.block_size_tokens
        hits = self._prefix_hits(num_tokens, block_hashes)
        n_new = -(-num_tokens // bs) - len(hits)
        n_revived = sum(1 for block in hits if block.ref_cnt == 0)
        if n_new + n_revived > pool.num_free:
            raise ValueError(
                f"need {count_text(n_new + n_revived, 'block')} for {num_tokens:,} tokens, {pool.num_free:,} free "
                f"({len(hits)} prefix blocks cached)"
            )
        pool.touch(hits)
        pool.prefix_hits += len(hits)
        new = pool.allocate(n_new)
        remaining = num_tokens - len(hits) * bs
        for block in new:
            block.num_tokens = min(bs, remaining)
            remaining -= block.num_tokens
        pool.num_filled_slots += num_tokens - len(hits) * bs
        self.blocks = hits + new
        self.num_tokens = num_tokens
        for i in range(len(hits), min(len(block_hashes), num_tokens // bs)):
            pool.cache_block(self.blocks[i], block_hashes[i])
        return len(hits)

    def append_tokens(self, n: int = 1) -> list[tuple[int, int]]:
        """Reserve slots for ``n`` more tokens (decode), taking new blocks as the last one fills.

        A shared, partly filled last block is copied first (copy-on-write), so a fork never sees this table's
        writes.

        Returns:
            ``(src_block_id, dst_block_id)`` copies the caller must apply to the KV storage before writing.
        """
        if n < 0:
            raise ValueError(f"`n` must be >= 0, got {n!r}")
        pool = self.pool
        bs = pool.block_size_tokens
        blocks = self.blocks
        room = len(blocks) * bs - self.num_tokens
        cow = n > 0 and room > 0 and blocks[-1].ref_cnt > 1
        need = -(-(n - room) // bs) if n > room else 0
        if need + cow > pool.free_queue.num_free:
            raise ValueError(
                f"need {count_text(need + cow, 'block')} to append {count_text(n, 'token')}, "
                f"{pool.free_queue.num_free:,} free "
                f"(pool of {pool.num_blocks:,} blocks x {bs:,} tokens)"
            )
        copies: list[tuple[int, int]] = []
        if cow:
            old = blocks[-1]
            blocks[-1] = pool.copy_on_write(old, bs - room)
            copies.append((old.block_id, blocks[-1].block_id))
        if room and n:
            take = min(n, room)
            blocks[-1].num_tokens += take
            pool.num_filled_slots += take
            self.num_tokens += take
            n -= take
        if n:
            for block in pool.allocate(need):
                block.num_tokens = min(bs, n)
                pool.num_filled_slots += block.num_tokens
                self.num_tokens += block.num_tokens
                n -= block.num_tokens
                blocks.append(block)
        return copies

    def evict_front(self, n_blocks: int = 1) -> int:
        """Drop the ``n_blocks`` oldest blocks and their tokens (an evicting cache dropping its oldest tokens); the
        blocks lose a holder and return to the pool at none. Storage positions shift down by the dropped tokens (after
        eviction a token's slot is no longer its position, as in kvlab's evicting caches).

        Returns:
            ``n_blocks``.

        Raises:
            ValueError: ``n_blocks`` not in ``[0, len(blocks)]``.
        """
        if (
            isinstance(n_blocks, bool)
            or not isinstance(n_blocks, int)
            or not 0 <= n_blocks <= len(self.blocks)
        ):
            raise ValueError(f"`n_blocks` must be an integer in [0, {len(self.blocks)}], got {n_blocks!r}")
        dropped = self.blocks[:n_blocks]
        self.pool.free(reversed(dropped))
        del self.blocks[:n_blocks]
        self.num_tokens -= min(self.num_tokens, n_blocks * self.pool.block_size_tokens)
        return n_blocks

    def fork(self) -> BlockTable:
        """A new table sharing every block of this one (reference counts +1; no copy until a write)."""
        child = BlockTable(self.pool)
        child.blocks = list(self.blocks)
        child.num_tokens = self.num_tokens
        self.pool.touch(child.blocks)
        return child

    def truncate(self, num_tokens: int) -> list[tuple[int, int]]:
        """Drop every token from ``num_tokens`` on, freeing blocks that become empty.

        If the cut falls inside a shared block, this table gets a private copy of it first (copy-on-write), so
        every holder of a block always agrees on its fill.

        Returns:
            ``(src_block_id, dst_block_id)`` copies the caller must apply to the KV storage.
        """
        if not 0 <= num_tokens <= self.num_tokens:
            raise ValueError(f"`num_tokens` must be in [0, {self.num_tokens}], got {num_tokens!r}")
        pool = self.pool
        keep = -(-num_tokens // pool.block_size_tokens)
        fill = num_tokens - (keep - 1) * pool.block_size_tokens if keep else 0
        copies: list[tuple[int, int]] = []
        if keep and self.blocks[keep - 1].ref_cnt > 1 and fill < self.blocks[keep - 1].num_tokens:
            if pool.num_free == 0:
                raise ValueError(
                    f"need 1 block to cut inside a shared block, 0 free (pool of {pool.num_blocks:,})"
                )
            old = self.blocks[keep - 1]
            self.blocks[keep - 1] = pool.copy_on_write(old, fill)
            copies.append((old.block_id, self.blocks[keep - 1].block_id))
        pool.free(reversed(self.blocks[keep:]))
        del self.blocks[keep:]
        self.num_tokens = num_tokens
        if keep and self.blocks[-1].num_tokens != fill:  # private block cut short
            last = self.blocks[-1]
            pool.num_filled_slots -= last.num_tokens - fill
            last.num_tokens = fill
            if last.block_hash is not None:  # no longer full: its cached prefix is gone
                del pool.cached[last.block_hash]
                last.block_hash = None
        return copies

    def free(self) -> None:
        """Release every block (last block first, so tails are reallocated before shared prefixes)."""
        self.pool.free(reversed(self.blocks))
        self.blocks = []
        self.num_tokens = 0

    def slot(self, pos: int) -> tuple[int, int]:
        """``(block_id, offset)`` of token ``pos``."""
        if not 0 <= pos < self.num_tokens:
            raise ValueError(f"`pos` must be in [0, {self.num_tokens}), got {pos!r}")
        bs = self.pool.block_size_tokens
        return self.blocks[pos // bs].block_id, pos % bs

    def slot_mapping(self, start: int, stop: int) -> list[int]:
        """Flat slots ``block_id * block_size + offset`` of tokens ``start..stop-1``."""
        if not 0 <= start <= stop <= self.num_tokens:
            raise ValueError(
                f"need 0 <= start <= stop <= {self.num_tokens}, got start={start!r}, stop={stop!r}"
            )
        bs = self.pool.block_size_tokens
        blocks = self.blocks
        return [blocks[pos // bs].block_id * bs + pos % bs for pos in range(start, stop)]
