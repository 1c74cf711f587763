"""Paged KV-cache bookkeeping and capacity simulation (no torch).

block_pool   blocks with reference counts, an O(1) free queue, chained full-block prefix hashes
block_table  per-sequence logical -> physical block map and slot mapping (copy-on-write on append)
budget       KV bytes a device can hold (the mechanics chapter's Llama-3-8B account, or the planner's numbers)
static       concurrency and waste of contiguous reservation vs paging
trace        the requests a simulation replays: Trace, a Poisson trace, the trace CSV file
residual     a KIVI cache's full-precision residual window in the block accounting (blocks per request)
policy       memory policies (contiguous, paged, prefix sharing, quantized, capped) and the pool each gets
simulate     discrete-event serving simulation: arrivals, growth, preemption by recompute, prefix sharing
figure       the paged-layout figure (imports matplotlib lazily)
"""

from kvlab.paging.block_pool import BlockPool, FreeBlockQueue, KVBlock, hash_block_tokens, prefix_block_hashes
from kvlab.paging.block_table import BlockTable
from kvlab.paging.budget import KVBudget, default_budget, planner_budget
from kvlab.paging.policy import Policy, default_policies
from kvlab.paging.simulate import simulate
from kvlab.paging.static import run_static, static_capacity, workload
from kvlab.paging.trace import Trace, load_trace, poisson_trace

__all__ = [
    "BlockPool",
    "BlockTable",
    "FreeBlockQueue",
    "KVBlock",
    "KVBudget",
    "Policy",
    "Trace",
    "default_budget",
    "default_policies",
    "hash_block_tokens",
    "load_trace",
    "planner_budget",
    "poisson_trace",
    "prefix_block_hashes",
    "run_static",
    "simulate",
    "static_capacity",
    "workload",
]
