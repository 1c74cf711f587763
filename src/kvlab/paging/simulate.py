"""Dynamic KV-cache simulation: requests arrive, prefill, grow one token per step, finish or get preempted.

Static capacity (:mod:`kvlab.paging.static`) is a snapshot: it leaves out arrivals, release, dynamic
growth and scheduling. This module adds them with a discrete-event loop over engine steps, in the manner of vLLM's v1
scheduler (PagedAttention, arXiv:2309.06180 section 4.5):

* a *step* is one model forward: every running request decodes one token (its previous token's K/V takes a slot),
  then waiting requests are admitted first-come-first-served while their prefill fits (head-of-line blocking);
* a request is finished once it has sampled ``output_tokens`` tokens; its blocks return to the pool;
* when a running request needs a block and none is free, the most recently admitted running request is preempted
  (recompute: its blocks are freed and it rejoins the front of the queue; on readmission it prefills its prompt
  plus every token it had generated). No admission happens in a step that preempted (vLLM v1 does the same);
* idle stretches are skipped: with nothing running or waiting, time jumps to the next arrival.

The policies run side by side on the same trace: contiguous reservation (one ``max_len`` block per request),
paged, paged with prefix sharing (full prompt blocks found by chained hash are shared, reference counted), and
paged with a quantized cache (fewer bytes per token, so more blocks in the same bytes; a KIVI cache's requests also
hold blocks for their full-precision residual window, :mod:`kvlab.paging.residual`), and optionally paged
with a capped footprint (``Policy.keep_tokens`` N: an evicting cache, docs/EVICTION.md; a request holds at most
``ceil(N / block_size)`` blocks: when it needs a new block at that cap its oldest block's tokens are evicted and
the block returns to the pool: at its cap a request reuses its own memory and never preempts). Block conservation
(``free + used = total``) is asserted every step and the pool must be empty at the end.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kvlab.paging.block_pool import BlockPool, hash_block_tokens
from kvlab.paging.block_table import BlockTable
from kvlab.paging.budget import KVBudget, default_budget
from kvlab.paging.policy import Policy, PoolGeometry, default_policies, pool_geometry
from kvlab.paging.residual import ResidualCharge
from kvlab.paging.static import MAX_LEN_TOKENS
from kvlab.paging.trace import Trace
from kvlab.runtime.checks import check_int

# Peak memory per request of a simulation (its trace, block tables, per-request records): measured 2-7 KB from
# 2,000 to 80,000 requests at 2 to 50 arrivals per step; 8 KiB, to be safe
SIMULATE_BYTES_PER_REQUEST = 8 * 1024


def simulate_memory_bytes(n_requests: int) -> int:
    """About how much memory :func:`simulate` needs for a trace of ``n_requests`` (a caller compares it with the
    machine's before generating a billion-request trace)."""
    return n_requests * SIMULATE_BYTES_PER_REQUEST


@dataclass
class _Series:
    """Per executed step, for the output (filled in the loop)."""

    step: list[int] = field(default_factory=list)  # engine step index
    running: list[int] = field(default_factory=list)  # requests holding KV after the step
    waiting: list[int] = field(default_factory=list)  # requests queued after the step
    used_blocks: list[int] = field(default_factory=list)  # blocks with holders
    filled_slots: list[int] = field(default_factory=list)  # slots written in used blocks
    tokens: list[int] = field(default_factory=list)  # tokens computed (decode + prefill)


def _stats(values: np.ndarray) -> dict:
    if len(values) == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "mean": float(values.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(values.max()),
    }


def _prompt_hashes(request: int, group: int, prefix: int, prompt: int, block_size: int) -> list[int]:
    """Chained hashes of a simulated prompt's full blocks: equal across a prefix group inside its shared prefix.

    The simulator has no token ids; a block is named by what it holds: ``(group, i)`` for block ``i`` wholly
    inside the shared prefix, ``(request, i)`` otherwise (so a preempted request can find its own blocks again).
    """
    hashes = []
    parent = None
    for i in range(prompt // block_size):
        shared = group >= 0 and (i + 1) * block_size <= prefix
        parent = hash_block_tokens(parent, (-1 - group, i) if shared else (request, i))
        hashes.append(parent)
    return hashes


def check_run_settings(max_len: int, max_running: int | None, check_every: int) -> None:
    """Raise ValueError naming ``max_len`` < 1, ``check_every`` < 0 or ``max_running`` < 1 (or a non-integer)."""
    check_int("max_len", max_len, 1)
    check_int("check_every", check_every, 0)
    if max_running is not None:
        check_int("max_running", max_running, 1)


def check_pools(trace: Trace, policies: list[Policy], budget: KVBudget, max_len: int) -> None:
    """Raise before any policy runs what :func:`simulate_policy` would raise for one of ``policies`` later: the
    trace's largest request exceeds ``max_len``, or alone needs more blocks than a policy's pool has."""
    for policy in policies:
        pool_geometry(trace, policy, budget, max_len)


class _Engine:
    """State of one :func:`simulate_policy` run: the pool, each request's block table and progress, the running
    list and the waiting queue, the counters; one method per phase of an engine step (module docstring)."""

    def __init__(
        self,
        trace: Trace,
        pool: BlockPool,
        prefix_sharing: bool,
        max_running: int | None,
        keep_tokens: int | None = None,
        charge: ResidualCharge | None = None,
    ) -> None:
        n = len(trace)
        self.pool = pool
        self.charge = charge  # a KIVI policy's residual-window blocks, or None
        self.bs = pool.block_size_tokens
        # blocks a request may hold: ceil(keep_tokens / block size), None without a cap
        self.cap_blocks = None if keep_tokens is None else -(-keep_tokens // self.bs)
        self.evicted_blocks = self.max_request_blocks = 0
        self.prefix_sharing = prefix_sharing
        self.max_running = max_running
        self.arrival = np.ceil(trace.arrival_step).astype(np.int64).tolist()
        self.prompt = trace.prompt_tokens.tolist()
        self.output = trace.output_tokens.tolist()
        self.group = trace.prefix_group.tolist()
        self.prefix = trace.prefix_tokens.tolist()
        self.hashes: list[list[int] | None] = [None] * n
        self.tables = [BlockTable(pool) for _ in range(n)]
        self.generated = [0] * n  # tokens sampled so far
        self.admitted_at = [-1] * n  # step of first admission
        self.finished_at = [-1] * n  # step whose output completed the request
        self.preempted = [0] * n  # times each request was preempted
        self.running: list[int] = []  # admission order: the tail is preempted first
        self.waiting: deque[int] = deque()
        self.series = _Series()
        self.preemptions = self.recomputed_tokens = self.prefill_tokens = self.decode_tokens = 0
        self.events = self.finished = self.full_checks = 0
        self.next_arrival = 0

    def arrive(self, step: int) -> None:
        """Queue every request that has arrived by ``step``."""
        while self.next_arrival < len(self.arrival) and self.arrival[self.next_arrival] <= step:
            self.waiting.append(self.next_arrival)
            self.next_arrival += 1
            self.events += 1

    def held_blocks(self, r: int) -> int:
        """Blocks request ``r`` holds: its block table's and its residual window's."""
        return len(self.tables[r].blocks) + (self.charge.held(r) if self.charge is not None else 0)

    def all_tables(self, requests) -> list[BlockTable]:
        """The block tables of ``requests`` and of their residual windows (what the pool's holders must match)."""
        tables = [self.tables[r] for r in requests]
        return tables if self.charge is None else tables + [self.charge.tables[r] for r in requests]

    def _free(self, r: int) -> None:
        """Return every block of ``r`` to the pool (finished or preempted)."""
        self.tables[r].free()
        if self.charge is not None:
            self.charge.free(r)

    def _preempt_for(self, r: int, need: int) -> bool:
        """Preempt running requests, last admitted first, until ``need`` blocks are free for ``r``'s next token;
        True when any was preempted. Stops once ``r`` itself is preempted."""
        preempted_now = False
        while self.pool.free_queue.num_free < need:
            victim = self.running.pop()  # preempt by recompute, last admitted first
            self._free(victim)
            self.waiting.appendleft(victim)
            self.preempted[victim] += 1
            self.preemptions += 1
            self.events += 1
            preempted_now = True
            if victim == r:
                break
        return preempted_now

    def decode(self, done: list[int]) -> tuple[int, bool]:
        """Phase 1: every running request appends its last token's K/V (admission order), preempting when the
        pool is out of blocks. Appends finished requests to ``done``; returns ``(tokens, preempted)``."""
        step_tokens = 0
        preempted_now = False
        charge = self.charge
        i = 0
        while i < len(self.running):
            r = self.running[i]
            table = self.tables[r]
            blocks = table.blocks
            full = table.num_tokens == len(blocks) * self.bs
            if full and self.cap_blocks is not None and len(blocks) >= self.cap_blocks:
                # at the cap: its oldest block's tokens are evicted and the block returns to the pool
                self.evicted_blocks += table.evict_front(1)
            # a new block (or a copy of a shared one), and the residual-window blocks one more token needs
            need = int(table.num_tokens == len(blocks) * self.bs or blocks[-1].ref_cnt > 1)
            if charge is not None:
                more = charge.extra[table.num_tokens + 1] - len(charge.tables[r].blocks)
                if more < 0:  # a flush: G window tokens became codes, their blocks go back
                    more = charge.shrink(r, table.num_tokens + 1)
                need += more
            if need > self.pool.free_queue.num_free:
                preempted_now |= self._preempt_for(r, need)
                if i == len(self.running):  # r itself was preempted
                    break
            table.append_tokens(1)
            if need:  # r took blocks: for its table, its residual window or both
                if self.charge is not None:
                    self.charge.grow(r, table.num_tokens)
                self.max_request_blocks = max(self.max_request_blocks, self.held_blocks(r))
            self.generated[r] += 1
            step_tokens += 1
            self.events += 1
            if self.generated[r] == self.output[r]:
                done.append(r)
            i += 1
        self.decode_tokens += step_tokens
        return step_tokens, preempted_now

    def admit(self, step: int, done: list[int]) -> int:
        """Phase 2: admit waiting requests first-come-first-served while their prefill fits (head-of-line
        blocking). Appends requests finished by their first token to ``done``; returns the prefill tokens."""
        step_tokens = 0
        while self.waiting and (self.max_running is None or len(self.running) < self.max_running):
            r = self.waiting[0]
            known = (
                self.prompt[r] + self.generated[r]
            )  # a preempted request recomputes its prompt and outputs
            if self.prefix_sharing and self.hashes[r] is None:
                self.hashes[r] = _prompt_hashes(r, self.group[r], self.prefix[r], self.prompt[r], self.bs)
            # a capped request computes its whole prefill but keeps at most its cap of blocks
            held = known if self.cap_blocks is None else min(known, self.cap_blocks * self.bs)
            need = self.tables[r].blocks_needed(held, self.hashes[r] or ())
            if self.charge is not None:
                need += self.charge.extra[held]
            if need > self.pool.free_queue.num_free:
                break  # head-of-line blocking
            hits = self.tables[r].allocate(held, self.hashes[r] or ())
            if self.charge is not None:
                self.charge.grow(r, held)
            self.max_request_blocks = max(self.max_request_blocks, self.held_blocks(r))
            self.waiting.popleft()
            computed = known - hits * self.bs
            step_tokens += computed
            self.prefill_tokens += computed
            if self.generated[r]:
                self.recomputed_tokens += computed
            else:
                self.admitted_at[r] = step
            self.generated[r] += 1
            self.running.append(r)
            self.events += 1
            if self.generated[r] == self.output[r]:
                done.append(r)
        return step_tokens

    def release(self, step: int, done: list[int]) -> None:
        """Phase 3: finished requests release their blocks and leave the running list."""
        if not done:
            return
        for r in done:
            self._free(r)
            self.finished_at[r] = step
        self.finished += len(done)
        self.events += len(done)
        finishing = set(done)
        self.running = [r for r in self.running if r not in finishing]

    def record(self, step: int, step_tokens: int, check_every: int) -> None:
        """Check block conservation (every step; the full invariants every ``check_every`` steps) and append the
        step to the series."""
        pool = self.pool
        assert pool.free_queue.num_free + pool.num_used == pool.num_blocks, (
            f"step {step}: free {pool.free_queue.num_free} + used {pool.num_used} != {pool.num_blocks}"
        )
        if check_every and step % check_every == 0:
            pool.check_invariants(self.all_tables(self.running))
            self.full_checks += 1
        series = self.series
        series.step.append(step)
        series.running.append(len(self.running))
        series.waiting.append(len(self.waiting))
        series.used_blocks.append(pool.num_used)
        filled = pool.num_filled_slots
        if self.charge is not None:  # a residual window's blocks count as full: take off what its bytes leave
            filled -= self.charge.unpaid_slots([self.tables[r].num_tokens for r in self.running])
        series.filled_slots.append(filled)
        series.tokens.append(step_tokens)

    def run(self, check_every: int) -> float:
        """Step until every request has finished; returns the wall-clock seconds of the loop."""
        n = len(self.tables)
        step = 0
        t0 = time.perf_counter()
        while self.finished < n:
            self.arrive(step)
            if not self.running and not self.waiting:
                step = self.arrival[self.next_arrival]  # discrete-event jump over an idle stretch
                continue
            done: list[int] = []
            step_tokens, preempted_now = self.decode(done)
            if not preempted_now:  # no admission in a step that preempted
                step_tokens += self.admit(step, done)
            self.release(step, done)
            self.record(step, step_tokens, check_every)
            step += 1
        return time.perf_counter() - t0


def _summary(engine: _Engine, policy: Policy, geometry: PoolGeometry, wall_s: float, all_freed: bool) -> dict:
    """The result dict of :func:`simulate_policy` from a finished ``engine``."""
    series, pool, bs = engine.series, engine.pool, engine.bs
    num_blocks = pool.num_blocks
    running_s = np.array(series.running)
    used = np.array(series.used_blocks, dtype=np.float64)
    filled = np.array(series.filled_slots, dtype=np.float64)
    busy = used > 0
    waste_slots = used * bs - filled
    queue_delay = np.array(engine.admitted_at) - np.array(engine.arrival)
    steps = len(series.step)
    return {
        "policy": policy.name,
        "kind": policy.kind,
        "kv_dtype": geometry.kv_dtype,
        "residual_window": None if geometry.residual is None else geometry.residual.as_dict(),
        "prefix_sharing": policy.prefix_sharing,
        "keep_tokens": policy.keep_tokens,
        "max_blocks_per_request": engine.max_request_blocks,
        "evicted_blocks": engine.evicted_blocks,
        "block_size": bs,
        "kv_bytes_per_token": geometry.kv_bytes_per_token,
        "num_blocks": num_blocks,
        "capacity_tokens": num_blocks * bs,
        "requests": len(engine.tables),
        "finished": engine.finished,
        "steps": steps,
        "makespan_steps": series.step[-1] + 1,
        "concurrency": {"mean": float(running_s.mean()), "max": int(running_s.max())},
        "utilization": float(filled[busy].sum() / (used[busy].sum() * bs)) if busy.any() else 0.0,
        "memory_used_fraction": float(used.mean() / num_blocks),
        "preemptions": engine.preemptions,
        "preempted_requests": sum(1 for p in engine.preempted if p),
        "recomputed_tokens": engine.recomputed_tokens,
        "prefix_hit_blocks": pool.prefix_hits,
        "prefix_hit_tokens": pool.prefix_hits * bs,
        "queue_delay_steps": _stats(queue_delay.astype(np.float64)),
        "tokens_per_step": {
            "mean": float(np.mean(series.tokens)),
            "decode_mean": engine.decode_tokens / steps,
            "prefill_mean": engine.prefill_tokens / steps,
        },
        "waste": {
            "mean_slots": float(waste_slots.mean()),
            "mean_bytes": float(waste_slots.mean() * geometry.kv_bytes_per_token),
            "fraction_of_allocated": float(waste_slots[busy].sum() / (used[busy].sum() * bs))
            if busy.any()
            else 0.0,
        },
        "events": engine.events,
        "wall_s": wall_s,
        "events_per_s": engine.events / wall_s if wall_s > 0 else math.inf,
        "conservation": {
            "checked_steps": steps,
            "full_checks": engine.full_checks + 1,
            "all_freed": all_freed,
        },
    }


def simulate_policy(
    trace: Trace,
    policy: Policy,
    budget: KVBudget,
    max_len: int = MAX_LEN_TOKENS,
    max_running: int | None = None,
    check_every: int = 0,
    keep_series: bool = False,
) -> dict:
    """Serve ``trace`` under ``policy`` in the KV bytes of ``budget``; one policy's result.

    Args:
        trace: the requests.
        policy: memory policy.
        budget: device KV bytes (:attr:`KVBudget.free_bytes`) and the default bytes per token.
        max_len: contiguous reservation per request, tokens (every request must fit in it).
        max_running: cap on running requests (vLLM's ``max_num_seqs``); None for no cap.
        check_every: run the full :meth:`BlockPool.check_invariants` every this many steps (0: only at the end).
            The O(1) conservation check runs every step regardless.
        keep_series: include the per-step series (``series``) and per-request steps (``per_request``).

    Returns:
        Summary dict: concurrency, utilization, preemptions, prefix hits, queueing delay (steps), tokens per
        step, waste, events and events per second, and the conservation record. ``kv_bytes_per_token`` is one slot's
        bytes; ``residual_window`` the KIVI window charged per request (None without one); ``utilization`` and
        ``waste`` count a window's blocks at the bytes its tokens cost.

    Raises:
        ValueError: when a request's peak KV exceeds ``max_len`` or alone needs more blocks than the pool has, or
            ``max_len`` < 1, ``max_running`` < 1, ``check_every`` < 0.
    """
    check_run_settings(max_len, max_running, check_every)
    geometry = pool_geometry(trace, policy, budget, max_len)
    pool = BlockPool(geometry.num_blocks, geometry.block_size, enable_prefix_caching=policy.prefix_sharing)
    charge = None  # a contiguous reservation already holds the window's peak
    if geometry.residual is not None and policy.kind == "paged":
        charge = ResidualCharge(pool, len(trace), geometry.kv_bytes_per_token, geometry.residual, geometry.max_tokens)
    engine = _Engine(trace, pool, policy.prefix_sharing, max_running, policy.keep_tokens, charge)
    wall_s = engine.run(check_every)
    pool.check_invariants(engine.all_tables(range(len(trace))))
    all_freed = pool.num_used == 0 and pool.num_free == pool.num_blocks and pool.num_filled_slots == 0
    assert all_freed, f"{pool.num_used} blocks still used after every request finished"
    result = _summary(engine, policy, geometry, wall_s, all_freed)
    if keep_series:
        result["series"] = {k: list(v) for k, v in vars(engine.series).items()}
        result["per_request"] = {
            "admitted_at": engine.admitted_at,
            "finished_at": engine.finished_at,
            "preempted": engine.preempted,
        }
    return result


def simulate(
    trace: Trace,
    policies: list[Policy] | None = None,
    budget: KVBudget | None = None,
    max_len: int = MAX_LEN_TOKENS,
    max_running: int | None = None,
    check_every: int = 0,
    keep_series: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Every policy on the same trace and budget: ``{"config": ..., "policies": {name: result}}``.

    Defaults: :func:`default_policies` and the mechanics chapter's Llama-3-8B budget (61.04 GiB of KV).
    ``progress(step)`` is called as each policy's run starts (one step per policy).

    Raises:
        ValueError: a run setting :func:`check_run_settings` refuses (before any policy runs), no policy, two
            policies of one name, or a request too long for ``max_len`` or a policy's pool (:func:`check_pools`).
    """
    check_run_settings(max_len, max_running, check_every)  # before any policy runs, not after the first
    budget = budget or default_budget()
    policies = policies if policies is not None else default_policies()
    if not policies:
        raise ValueError("`policies` must name at least one policy, got none")
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise ValueError(f"policy names must be unique, got {names}")
    out = {
        "config": {
            **budget.as_dict(),
            "max_len": max_len,
            "max_running": max_running,
            "requests": len(trace),
            "prompt_tokens_mean": float(trace.prompt_tokens.mean()),
            "output_tokens_mean": float(trace.output_tokens.mean()),
            "prefix_requests": int((trace.prefix_group >= 0).sum()),
            "last_arrival_step": float(trace.arrival_step[-1]),
        },
        "policies": {},
    }
    check_pools(trace, policies, budget, max_len)  # before the first policy runs, not after it
    for policy in policies:
        if progress is not None:
            progress(f"policy {policy.name}: {len(trace):,} requests")
        out["policies"][policy.name] = simulate_policy(
            trace, policy, budget, max_len, max_running, check_every, keep_series
        )
    return out
