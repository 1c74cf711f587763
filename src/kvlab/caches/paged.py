"""``PagedCache``: a transformers ``Cache`` whose K/V live in fixed-size physical blocks addressed by block tables.

PagedAttention (Kwon et al., arXiv:2309.06180 section 4.1-4.4) as vLLM lays it out: each layer owns one pool tensor per
K and V of shape ``[num_blocks, block_size, kv_heads, head_dim]`` (vLLM's flash-attention layout, one block per
row), new tokens are written to the rows named by the *slot mapping* (``block_id * block_size + offset``), and a
step reads each sequence back through its *block table*. The bookkeeping (free queue, reference counts,
copy-on-write) is :mod:`kvlab.paging`'s, shared by every layer: layer ``l`` of token ``t`` lives in the same block
and offset in every layer's pool.

Without a paged-attention kernel, :meth:`PagedLayer.update` gathers the blocks into a contiguous
``[batch, kv_heads, seq_len, head_dim]`` tensor for the model's attention, so greedy ``generate()`` matches
``DynamicCache`` token for token. Beam reordering and row repetition fork block tables (shared blocks, reference
counts) instead of copying K/V; a later write to a shared partial block copies that block first.

Usage::

    cache = PagedCache(block_size=16)
    model.generate(input_ids, cache=cache, max_new_tokens=64)  # past_key_values=cache before transformers 5.24
    cache.block_tables(), cache.nbytes(), cache.nbytes_breakdown()
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from transformers.cache_utils import Cache

from kvlab.caches._rows import batch_index, check_kv_pair, check_repeats
from kvlab.caches.base import KVLayer, check_full_attention
from kvlab.caches.crop import crop_keep
from kvlab.paging import BlockPool, BlockTable


class PagedLayer(KVLayer):
    """One layer of :class:`PagedCache`: K and V pools ``[num_blocks, block_size, kv_heads, head_dim]``.

    ``keys``/``values`` are the pools themselves (physical storage), not per-sequence views.
    """

    cache_name = "PagedCache"
    is_croppable = True

    def __init__(self, cache: PagedCache, **kwargs: Any):
        super().__init__(**kwargs)
        self.cache = cache
        self.num_tokens = 0  # tokens this layer has written per batch row

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocate empty pools sized like the shared allocator, from ``[batch, kv_heads, t, head_dim]`` states."""
        _, kv_heads, _, head_dim = key_states.shape
        self.device, self.dtype = key_states.device, key_states.dtype
        self.batch_size = key_states.shape[0]
        shape = (self.cache.allocator.num_blocks, self.cache.block_size, kv_heads, head_dim)
        self.keys = torch.zeros(shape, dtype=key_states.dtype, device=self.device)
        self.values = torch.zeros(
            shape[:3] + (value_states.shape[-1],), dtype=value_states.dtype, device=self.device
        )
        self.is_initialized = True

    def _holds_like(self, key_states: torch.Tensor, value_states: torch.Tensor) -> bool:
        """Whether the pools have the dtype and device of these states (and so can store them)."""
        return (self.keys.dtype, self.keys.device, self.values.dtype, self.values.device) == (
            key_states.dtype,
            key_states.device,
            value_states.dtype,
            value_states.device,
        )

    def _check_states(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Raise ``ValueError`` for states that are not ``[batch, kv_heads, tokens, head_dim]`` pairs agreeing in
        batch, heads and tokens, or whose heads / head_dim differ from the tokens this layer holds (the pools are
        written through a view of that width: another width would land in the wrong memory)."""
        check_kv_pair(key_states, value_states)
        if self.is_initialized and self.num_tokens:
            held = (self.keys.shape[2], self.keys.shape[3], self.values.shape[3])
            got = (key_states.shape[1], key_states.shape[3], value_states.shape[3])
            if held != got:
                raise ValueError(
                    f"states with kv_heads {got[0]}, head_dim {got[1]}/{got[2]} (keys/values) do not continue this "
                    f"layer's {self.num_tokens} tokens of kv_heads {held[0]}, head_dim {held[1]}/{held[2]}"
                )

    def _grow(self, num_blocks: int) -> None:
        """Extend both pools to ``num_blocks`` blocks (existing blocks keep their ids and contents)."""
        extra = num_blocks - self.keys.shape[0]
        if extra > 0:
            self.keys = torch.cat([self.keys, self.keys.new_zeros((extra, *self.keys.shape[1:]))])
            self.values = torch.cat([self.values, self.values.new_zeros((extra, *self.values.shape[1:]))])

    def _copy_blocks(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy-on-write: physical blocks ``src`` -> ``dst`` (``[n]`` ids each)."""
        self.keys[dst] = self.keys[src]
        self.values[dst] = self.values[src]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[batch, kv_heads, t, head_dim]`` states by slot mapping; return ``[batch, kv_heads, seq_len,
        head_dim]`` keys and values gathered through the block tables.

        The pools live on the device and in the dtype of the states: allocated at the first update, and again at
        the first update after :meth:`reset` when the model was moved or cast in between.

        Raises:
            ValueError: the batch size differs from the cache's rows, a capped pool runs out of blocks, or states
                of another dtype/device than the tokens this layer holds.
        """
        self._check_states(key_states, value_states)
        if not (self.is_initialized and self._holds_like(key_states, value_states)):
            if self.is_initialized and self.num_tokens:
                raise ValueError(
                    f"states arrive as {key_states.dtype}/{value_states.dtype} on {key_states.device}/"
                    f"{value_states.device} but this layer holds {self.num_tokens} tokens as {self.keys.dtype}/"
                    f"{self.values.dtype} on {self.keys.device}: call reset() before moving or casting the model"
                )
            self.lazy_initialization(key_states, value_states)  # an empty layer follows its states
        batch, kv_heads, t, head_dim = key_states.shape
        start = self.num_tokens
        slots = self.cache._slot_mapping(start, start + t, batch, key_states.device)  # [batch * t]
        # [B, H, t, D] -> [B, t, H, D] -> [B*t, H, D]: one row per slot
        self.keys.view(-1, kv_heads, head_dim).index_copy_(
            0, slots, key_states.transpose(1, 2).reshape(-1, kv_heads, head_dim)
        )
        self.values.view(-1, kv_heads, value_states.shape[-1]).index_copy_(
            0, slots, value_states.transpose(1, 2).reshape(-1, kv_heads, value_states.shape[-1])
        )
        self.num_tokens += t
        table = self.cache._block_table_tensor(key_states.device)  # [B, n_blocks]
        return self._gather(self.keys, table), self._gather(self.values, table)

    def _gather(self, pool: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        # pool[table]: [B, n_blocks, block_size, H, D] -> [B, n_blocks * block_size, H, D] -> first T -> [B, H, T, D]
        gathered = pool[table].flatten(1, 2)[:, : self.num_tokens]
        return gathered.transpose(1, 2).contiguous()

    def get_seq_length(self) -> int:
        """Tokens stored per batch row."""
        return self.num_tokens

    def reset(self) -> None:
        """Forget every token (the pools stay allocated for reuse)."""
        self.num_tokens = 0

    # Batch-row operations are block-table operations, done once for all layers by PagedCache.
    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:  # pragma: no cover - PagedCache dispatches
        raise NotImplementedError("call PagedCache.reorder_cache: block tables are shared by all layers")

    def crop(self, tokens_to_remove: int) -> None:  # pragma: no cover - PagedCache dispatches
        raise NotImplementedError("call PagedCache.crop: block tables are shared by all layers")


class PagedCache(Cache):
    """KV cache in physical blocks: one pool per layer, one block table per batch row, shared bookkeeping.

    Args:
        block_size: tokens per block (vLLM's default 16).
        num_blocks: blocks to allocate up front; the pool doubles when it runs out (never below what is needed).
        max_num_blocks: cap on the pool; running out then raises ``ValueError`` (``need n blocks, f free``).
        config: optional model config; layers are then created up front and models with non-full-attention
            layers (sliding window, linear attention) are rejected.

    Raises:
        ValueError: ``block_size`` < 1, ``num_blocks`` > ``max_num_blocks``, or a config with other layer kinds.

    Source: PagedAttention (arXiv:2309.06180) section 4; vLLM v1 block pool and ``reshape_and_cache_flash`` layout.
    """

    def __init__(
        self,
        block_size: int = 16,
        num_blocks: int = 0,
        max_num_blocks: int | None = None,
        config: Any = None,
    ):
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"`block_size` must be an int >= 1, got {block_size!r}")
        if num_blocks < 0 or (max_num_blocks is not None and num_blocks > max_num_blocks):
            raise ValueError(
                f"need 0 <= num_blocks <= max_num_blocks, got {num_blocks!r} and {max_num_blocks!r}"
            )
        self.block_size = block_size
        self.max_num_blocks = max_num_blocks
        self.allocator = BlockPool(num_blocks, block_size)
        self.tables: list[BlockTable] = []  # one per batch row
        self.num_tokens = 0  # slots reserved per row (layers catch up within a forward)
        self._table_version = 0  # bumped whenever a block table changes
        # per device (a model split over devices has layers on several): (version, [batch, n_blocks] block ids) and
        # ((start, stop, version), [batch * t] slot mapping), so layers on different devices do not rebuild them
        self._tables: dict[torch.device, tuple[int, torch.Tensor]] = {}
        self._slots: dict[torch.device, tuple[tuple[int, int, int], torch.Tensor]] = {}
        if config is not None:
            n_layers = check_full_attention(config, "PagedCache")
            super().__init__(layers=[PagedLayer(self) for _ in range(n_layers)])
        else:
            super().__init__(layer_class_to_replicate=partial(PagedLayer, self))

    def __repr__(self) -> str:
        return (
            f"PagedCache(block_size={self.block_size}, rows={len(self.tables)}, tokens={self.num_tokens}, "
            f"blocks used {self.allocator.num_used}/{self.allocator.num_blocks})"
        )

    # ---- bookkeeping shared by all layers -------------------------------------------------------------------
    def _initialized_layers(self) -> list[PagedLayer]:
        return [layer for layer in self.layers if layer.is_initialized]

    def _ensure_free(self, need: int) -> None:
        """Grow the pool (doubling) so that ``need`` blocks are free, within ``max_num_blocks``."""
        pool = self.allocator
        if need <= pool.num_free:
            return
        target = max(pool.num_blocks + need - pool.num_free, 2 * pool.num_blocks)
        if self.max_num_blocks is not None:
            target = min(target, self.max_num_blocks)
        if target - pool.num_blocks < need - pool.num_free:
            raise ValueError(
                f"need {need} blocks, {pool.num_free} free (pool capped at {self.max_num_blocks} blocks of "
                f"{self.block_size} tokens)"
            )
        pool.add_blocks(target - pool.num_blocks)
        for layer in self._initialized_layers():
            layer._grow(target)

    def _apply_copies(self, copies: list[tuple[int, int]]) -> None:
        if not copies:
            return
        for layer in self._initialized_layers():
            src = torch.tensor([s for s, _ in copies], device=layer.device)
            dst = torch.tensor([d for _, d in copies], device=layer.device)
            layer._copy_blocks(src, dst)

    def _reserve(self, stop: int, batch: int) -> None:
        """Give every row's table ``stop`` slots (first call: one table per row)."""
        if not self.tables:
            self.tables = [BlockTable(self.allocator) for _ in range(batch)]
        if batch != len(self.tables):
            raise ValueError(
                f"the cache holds {len(self.tables)} batch rows, got states for {batch} (call cache.reset() before "
                "reusing it for another batch)"
            )
        n = stop - self.num_tokens
        need = 0
        for table in self.tables:
            room = len(table.blocks) * self.block_size - table.num_tokens
            cow = room > 0 and table.blocks[-1].ref_cnt > 1
            need += -(-(n - room) // self.block_size) if n > room else 0
            need += cow
        self._edit_tables(need, lambda table: table.append_tokens(n), stop)

    def _edit_tables(
        self, need: int, edit: Callable[[BlockTable], list[tuple[int, int]]], num_tokens: int
    ) -> None:
        """Make room for ``need`` more blocks, apply ``edit`` to every row's table (it returns the ``(src, dst)``
        block copies its copy-on-write needs), copy those blocks in every layer, and hold ``num_tokens``."""
        self._ensure_free(need)
        self._apply_copies([copy for table in self.tables for copy in edit(table)])
        self.num_tokens = num_tokens
        self._table_version += 1

    def _block_table_tensor(self, device: torch.device) -> torch.Tensor:
        """``[batch, n_blocks]`` physical block ids (every row holds the same number of tokens)."""
        version, table = self._tables.get(device, (None, None))
        if version != self._table_version:
            table = torch.tensor([t.block_ids for t in self.tables], dtype=torch.long, device=device)
            self._tables[device] = (self._table_version, table)
        return table

    def _slot_mapping(self, start: int, stop: int, batch: int, device: torch.device) -> torch.Tensor:
        """``[batch * (stop - start)]`` flat slots of positions ``start..stop-1`` of every row (reserving them)."""
        if stop > self.num_tokens:
            self._reserve(stop, batch)
        elif batch != len(self.tables):
            raise ValueError(
                f"the cache holds {len(self.tables)} batch rows, got states for {batch} (call cache.reset() before "
                "reusing it for another batch)"
            )
        key = (start, stop, self._table_version)
        cached_key, slots = self._slots.get(device, (None, None))
        if cached_key != key:
            table = self._block_table_tensor(device)
            pos = torch.arange(start, stop, device=device)
            slots = (table[:, pos // self.block_size] * self.block_size + pos % self.block_size).reshape(-1)
            self._slots[device] = (key, slots)
        return slots

    def _replace_tables(self, tables: list[BlockTable]) -> None:
        for table in self.tables:
            table.free()
        self.tables = tables
        self._table_version += 1
        for layer in self.layers:
            if layer.is_initialized:
                layer.batch_size = len(tables)

    # ---- transformers Cache API --------------------------------------------------------------------------------
    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Rows become ``beam_idx`` of the old rows: forks of their block tables, no K/V copied.

        Raises:
            TypeError: a non-integer index. ValueError: not 1-D, or a row outside ``0 .. rows - 1`` (nothing is
                changed; a negative row is refused, not read from the end).
        """
        rows = batch_index(beam_idx, len(self.tables)).tolist()
        self._replace_tables([self.tables[i].fork() for i in rows])

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the batch rows ``indices``."""
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each batch row ``repeats`` times (shared blocks, copy-on-write on the next write).

        Raises:
            ValueError: ``repeats`` not a positive int (0 would drop every row).
        """
        check_repeats(repeats)
        self._replace_tables([t.fork() for t in self.tables for _ in range(repeats)])

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the newest tokens of every row and free the blocks left empty (assisted / speculative decoding).

        Args:
            tokens_to_remove: transformers' ``Cache.crop`` argument: ``-n`` removes the newest ``n`` tokens (all of
                them when ``n`` is at least the tokens held), ``0`` removes nothing, a positive ``n`` keeps the first
                ``n`` tokens (``max_length`` as in transformers 5.0's ``DynamicCache.crop``).

        Exact: the kept tokens stay where they are; each row's block table is cut at the new length, whole blocks
        past it go back to the free queue, and a cut inside a block shared with another row (beam forks) gives this
        row a private copy first. ``nbytes()`` then counts the blocks in use, as for a cache that never held the
        dropped tokens.

        Raises:
            TypeError: ``tokens_to_remove`` not an integer. ValueError: a pool capped by ``max_num_blocks`` without
                a free block for the copy of a shared block that the cut falls inside (``need n blocks, f free``;
                nothing is changed).

        Source: transformers ``Cache.crop``; the block-table cut is :meth:`kvlab.paging.BlockTable.truncate`.
        """
        keep = crop_keep(tokens_to_remove, self.num_tokens)
        if keep == self.num_tokens or not self.tables:
            return
        # a cut inside a shared block copies it first: make room for the worst case before any table changes
        last, fill = -(-keep // self.block_size) - 1, keep % self.block_size
        need = sum(bool(fill) and t.blocks[last].ref_cnt > 1 for t in self.tables)
        self._edit_tables(need, lambda table: table.truncate(keep), keep)
        for layer in self.layers:
            layer.num_tokens = min(layer.num_tokens, keep)

    def reset(self) -> None:
        """Free every block and forget every token; pools stay allocated (and move with the next states)."""
        for table in self.tables:
            table.free()
        self.tables = []
        self.num_tokens = 0
        self._table_version += 1
        self._tables.clear()  # no block-table/slot tensors left on a device the model has left
        self._slots.clear()
        for layer in self.layers:
            layer.reset()

    # ---- inspection -------------------------------------------------------------------------------------------
    def block_tables(self) -> list[list[int]]:
        """Physical block ids of every batch row, in logical order."""
        return [t.block_ids for t in self.tables]

    def check_invariants(self) -> None:
        """Assert the shared block bookkeeping (conservation, ref counts = holders, one fill per block)."""
        self.allocator.check_invariants(self.tables)

    def nbytes_breakdown(self) -> dict[str, int]:
        """Bytes over all layers: ``blocks_in_use`` (= ``total``), of which ``tokens`` hold K/V and
        ``internal_waste`` are empty slots of partly filled blocks; ``pool_capacity`` counts free blocks too."""
        out = {"blocks_in_use": 0, "tokens": 0, "internal_waste": 0, "pool_capacity": 0, "total": 0}
        for layer in self._initialized_layers():
            block_bytes = (layer.keys[0].numel() * layer.keys.element_size()) + (
                layer.values[0].numel() * layer.values.element_size()
            )
            slot_bytes = block_bytes // self.block_size
            out["blocks_in_use"] += self.allocator.num_used * block_bytes
            out["tokens"] += self.allocator.num_filled_slots * slot_bytes
            out["pool_capacity"] += layer.keys.shape[0] * block_bytes
        out["internal_waste"] = out["blocks_in_use"] - out["tokens"]
        out["total"] = out["blocks_in_use"]
        return out

    def nbytes(self) -> int:
        """Bytes of the blocks in use (K and V, all layers); shared blocks count once."""
        return self.nbytes_breakdown()["total"]
