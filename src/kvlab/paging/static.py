"""Static capacity: how many requests fit at once under contiguous reservation vs paging.

The workloads and numbers of docs/paging.md ("Static capacity": seed 11, the
61 GiB budget): requests are admitted greedily in arrival order until the next one does not fit. Contiguous
reservation charges every request ``max_len`` tokens (the output length is unknown up front); paging charges
``ceil(len / block) * block`` tokens. A KIVI budget's requests also pay for their full-precision residual window
(:mod:`kvlab.paging.residual`): a reservation holds the most bytes a request reaches up to ``max_len``, a paged
request ``ceil(ledger bytes / block bytes)`` blocks. Admission is vectorised (``cumsum`` + ``searchsorted``), so
a million requests take milliseconds.

[A] concurrency and utilization per policy, [B] the two halves of the waste (reservation vs the last block's
empty slots), [C] the block-size sweep (empty slots vs block-table length). This is a static snapshot: arrivals,
growth, release and scheduling are :mod:`kvlab.paging.simulate`'s job.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvlab.paging.block_pool import BlockPool
from kvlab.paging.block_table import BlockTable
from kvlab.paging.budget import KVBudget, default_budget
from kvlab.paging.residual import (
    ResidualWindow,
    per_request,
    request_blocks,
    request_bytes,
    reservation_bytes,
    whole,
)
from kvlab.runtime.checks import check_int
from kvlab.runtime.text_files import read_text

# The most tokens one request of a workload or trace file may hold: 2**40 (about 1.1e12) is beyond any context yet
# leaves room in int64 for sums of lengths and lengths times bytes per token; a line of 99999999999999999999
# overflowed the int64 array (an OverflowError traceback).
REQUEST_TOKENS_LIMIT = 2**40

# The mechanics chapter's appendix (paged_alloc.py) workloads:
MAX_LEN_TOKENS = 4096  # longest request and the contiguous reservation, tokens
N_REQUESTS = 4000  # requests per built-in workload
WORKLOAD_SEED = 11  # RNG seed of the built-in workloads
SWEEP_BLOCK_SIZES = (1, 4, 8, 16, 32, 64, 128, 256)
DEMO_LENGTHS = (37, 21, 45)  # the mechanics chapter's figure: three requests cut into blocks of 16
WORKLOADS = ("uniform", "heavy")
# Peak memory per request of one built-in workload in run_static: its int64 lengths and the temporaries of the
# vectorised admission (measured ~24 B at 1-4 million requests; twice that, to be safe)
STATIC_BYTES_PER_REQUEST = 48


def static_memory_bytes(n_requests: int, n_workloads: int = len(WORKLOADS)) -> int:
    """About how much memory :func:`run_static` needs for ``n_workloads`` built-in workloads of ``n_requests``
    each (a caller compares it with the machine's before asking for a billion requests)."""
    return n_requests * n_workloads * STATIC_BYTES_PER_REQUEST


def check_seed(seed: object) -> None:
    """Refuse an RNG seed numpy does not take (it said only "expected non-negative integer").

    Raises:
        ValueError: ``seed`` not an integer >= 0, named with its value.
    """
    check_int("seed", seed, 0)


def workload(
    kind: str, n: int = N_REQUESTS, seed: int = WORKLOAD_SEED, max_len: int = MAX_LEN_TOKENS
) -> np.ndarray:
    """Request lengths in tokens, ``[n]`` int64, drawn exactly as the mechanics chapter draws them.

    ``uniform``: uniform on 512..max_len (batch jobs). ``heavy``: 80 % uniform on 256..1024 and 20 % on
    3072..max_len, shuffled (online chat).

    Raises:
        ValueError: ``n`` < 1, a ``seed`` that is not an integer >= 0, ``max_len`` too short for ``kind``, or an
            unknown ``kind`` (each named).
    """
    if n < 1:
        raise ValueError(f"`n` must be >= 1, got {n!r}")
    check_seed(seed)
    shortest = {"uniform": 512, "heavy": 3072}.get(kind, 1)  # the lower end of the longest draw
    if max_len < shortest:
        raise ValueError(f"`max_len` must be >= {shortest} for the {kind} workload, got {max_len!r}")
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return rng.integers(512, max_len + 1, n)
    if kind == "heavy":
        n_short = int(n * 0.8)
        lens = np.concatenate(
            [rng.integers(256, 1025, n_short), rng.integers(3072, max_len + 1, n - n_short)]
        )
        rng.shuffle(lens)
        return lens
    raise ValueError(f"`kind` must be one of {list(WORKLOADS)}, got {kind!r}")


def load_lengths(path: str | os.PathLike) -> np.ndarray:
    """Request lengths from a file (:func:`read_lengths`'s lengths, without their lines)."""
    return read_lengths(path)[0]


def read_lengths(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Request lengths from a file: one integer per line, or a CSV with a header; ``(lengths, lines)``, each
    ``[n]`` int64, ``lines`` the file line of each length (blank lines counted).

    A CSV column ``tokens`` or ``length`` is used as is; otherwise ``prompt_tokens + output_tokens`` (the
    :mod:`kvlab.paging.trace` format), the final KV length of each request. A file whose first line is a
    number (``100``, also ``2.5`` or ``nan``) is a list of lengths, not a CSV whose header is that number.

    Raises:
        ValueError: not a text file, no lengths, a line of a list that is not a whole number >= 1 (a request holds
            at least one token; naming the file, its line number and text) or is above
            :data:`REQUEST_TOKENS_LIMIT`, a CSV value above it (naming the file, line and column), a CSV ``tokens`` / ``length`` value
            that is not, or a ``prompt_tokens`` / ``output_tokens`` value below 0 or a row of them summing to 0
            (naming the file, line and column), a missing CSV value, a number written with thousands
            separators (``1,000``: said so), or a CSV without the columns.
    """
    path = Path(path)
    raw = read_text(path)  # by its byte-order mark: Excel's "CSV UTF-8" starts with one
    numbered = [(i, line.strip()) for i, line in enumerate(raw.splitlines(), start=1) if line.strip()]
    if not numbered:
        raise ValueError(f"{path}: no request lengths")
    if _is_number(numbered[0][1]) or _THOUSANDS.fullmatch(numbered[0][1]):  # one length per line: name the line that is not a whole number of tokens
        values = []
        for i, line in numbered:
            try:
                values.append(int(line))
            except ValueError:
                raise ValueError(
                    f"{path}: line {i}: expected a whole number of tokens (one per line), got {line!r}{_hint(line)}"
                ) from None
            if values[-1] < 1:
                raise ValueError(f"{path}: line {i}: a request length must be >= 1 token, got {line!r}")
            if values[-1] > REQUEST_TOKENS_LIMIT:
                raise ValueError(
                    f"{path}: line {i}: a request length must be at most {REQUEST_TOKENS_LIMIT:,} tokens (2**40), "
                    f"got {line}"
                )
        return np.array(values, dtype=np.int64), np.array([i for i, _ in numbered], dtype=np.int64)
    rows, cols = _csv_rows(path, raw, first=numbered[0][0])
    lines = np.array([i for i, _ in rows], dtype=np.int64)

    def column(name: str, least: int) -> np.ndarray:
        values = []
        for i, row in rows:
            text = (row.get(name) or "").strip()
            if not text:
                raise ValueError(f"{path}: line {i}: the `{name}` value is missing")
            try:
                values.append(int(text))
            except ValueError:
                raise ValueError(f"{path}: line {i}: `{name}` must be an integer, got {text!r}{_hint(text)}") from None
            if values[-1] < least:
                raise ValueError(f"{path}: line {i}: `{name}` must be >= {least}, got {values[-1]}")
            if values[-1] > REQUEST_TOKENS_LIMIT:
                raise ValueError(
                    f"{path}: line {i}: `{name}` must be at most {REQUEST_TOKENS_LIMIT:,} tokens (2**40), "
                    f"got {values[-1]}"
                )
        return np.array(values, dtype=np.int64)

    for name in ("tokens", "length"):
        if name in cols:
            return column(name, 1), lines  # a request holds at least one token
    if {"prompt_tokens", "output_tokens"} <= cols:
        lengths = column("prompt_tokens", 0) + column("output_tokens", 0)
        if (lengths < 1).any():
            i = int(np.argmax(lengths < 1))
            raise ValueError(f"{path}: line {rows[i][0]}: `prompt_tokens` + `output_tokens` must be >= 1 token, got 0")
        return lengths, lines
    raise ValueError(
        f"{path}: expected one integer per line or a CSV with `tokens`, `length` or "
        f"`prompt_tokens`+`output_tokens`, got columns {sorted(cols)}"
    )


_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+")  # 1,000: a number as a spreadsheet shows it


def _hint(text: str) -> str:
    """Why ``text`` is not read when it is a number written with thousands separators (``1,000``), else ''."""
    if not _THOUSANDS.search(text):
        return ""
    return "; thousands separators are not read (write 1000, not 1,000)"


def _csv_rows(path: Path, raw: str, first: int) -> tuple[list[tuple[int, dict]], set[str]]:
    """The rows of a workload CSV whose header is on line ``first``, each with its line number, and its columns.

    Raises:
        ValueError: a row with more fields than the header (naming the file and line; a number written ``1,000``
            unquoted is split at its comma: said so).
    """
    lines = [line if line.strip() else "" for line in raw.splitlines()[first - 1 :]]  # blank lines are skipped
    reader = csv.DictReader(lines)
    rows = [(first - 1 + reader.line_num, row) for row in reader]
    for i, row in rows:
        extra = [v for v in row.get(None) or () if v.strip()]
        if extra:
            raise ValueError(
                f"{path}: line {i}: {len(reader.fieldnames) + len(row[None])} fields, the header has "
                f"{len(reader.fieldnames)}{_hint(lines[i - first])}"
            )
    return rows, {name for name in reader.fieldnames or () if name}


def _is_number(text: str) -> bool:
    """``text`` reads as a number (``100``, ``2.5``, ``nan``, ``1e3``): a line of a lengths list, not a header."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def greedy_admit(bytes_per_request: np.ndarray, budget_bytes: float) -> tuple[int, float]:
    """Admit requests in order until the next one does not fit; ``(admitted, bytes used)``.

    ``bytes_per_request``: ``[n]``, every entry > 0. Equivalent to the mechanics chapter's loop with ``break``: the number of
    prefix sums that stay within the budget.
    """
    if len(bytes_per_request) == 0:
        return 0, 0
    prefix = np.cumsum(bytes_per_request)
    k = int(np.searchsorted(prefix, budget_bytes, side="right"))
    return k, (prefix[k - 1].item() if k else 0)


def _check_lengths(lens: np.ndarray, max_len: int) -> None:
    if len(lens) == 0 or lens.min() < 1:
        raise ValueError(
            f"request lengths must be >= 1 token, got min {int(lens.min()) if len(lens) else None}"
        )
    if lens.max() > max_len:
        i = int(np.argmax(lens > max_len))
        raise ValueError(
            f"request {i} ({int(lens[i]):,} tokens) exceeds the contiguous reservation `max_len` {max_len:,} "
            f"(the longest request holds {int(lens.max()):,} tokens)"
        )


def _request_costs(
    lens: np.ndarray, kv_bytes_per_token: float, residual: ResidualWindow | None, block_size_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(ledger bytes, blocks)`` of every request in ``lens``: :func:`kvlab.paging.residual.request_bytes` and
    :func:`~kvlab.paging.residual.request_blocks` (exact integers when the bytes per token are whole)."""
    bpt = whole(kv_bytes_per_token)
    real = per_request(lens, residual, lambda n: request_bytes(n, bpt, residual))
    blocks = per_request(lens, residual, lambda n: request_blocks(n, block_size_tokens, bpt, residual))
    return real, blocks


def static_capacity(
    lens: np.ndarray, budget: KVBudget, block_size_tokens: int = 16, max_len: int = MAX_LEN_TOKENS
) -> dict:
    """Section [A]: concurrency, bytes held and utilization of contiguous reservation vs paging.

    Args:
        lens: request lengths in tokens, ``[n]``.
        budget: KV budget (bytes per token, a KIVI residual window, capacity).
        block_size_tokens: paging block size.
        max_len: tokens reserved per request by the contiguous policy.

    Returns:
        The mechanics chapter's keys: ``k_cont``, ``k_paged``, ``util_cont``, ``util_paged``, ``gain``, ``bytes_cont``,
        ``bytes_paged``, ``real_cont``, ``real_paged`` (bytes held and bytes of real tokens, per policy; a KIVI
        budget's real bytes are the planner ledger's, residual window included).
    """
    lens = np.asarray(lens)
    _check_lengths(lens, max_len)
    if block_size_tokens < 1:
        raise ValueError(f"`block_size_tokens` must be >= 1, got {block_size_tokens!r}")
    bpt, residual = whole(budget.kv_bytes_per_token), budget.residual
    real, blocks = _request_costs(lens, bpt, residual, block_size_tokens)
    reserved = np.full(len(lens), reservation_bytes(max_len, bpt, residual))
    k_c, used_c = greedy_admit(reserved, budget.budget_bytes)
    k_p, used_p = greedy_admit(blocks * (block_size_tokens * bpt), budget.budget_bytes)
    if k_c == 0 or k_p == 0:
        raise ValueError(f"the budget ({budget.capacity_tokens:,} tokens) does not fit the first request")
    real_c, real_p = real[:k_c].sum().item(), real[:k_p].sum().item()
    return {
        "k_cont": k_c,
        "k_paged": k_p,
        "util_cont": real_c / used_c,
        "util_paged": real_p / used_p,
        "gain": k_p / k_c,
        "bytes_cont": used_c,
        "bytes_paged": used_p,
        "real_cont": real_c,
        "real_paged": real_p,
        "n_requests": int(len(lens)),
    }


def waste_split(
    lens: np.ndarray,
    kv_bytes_per_token: float,
    block_size_tokens: int = 16,
    max_len: int = MAX_LEN_TOKENS,
    residual: ResidualWindow | None = None,
) -> dict:
    """Section [B]: mean bytes wasted per request by reservation (``max_len - len`` tokens) vs the last block's
    slots; with a KIVI ``residual`` window, what a reservation or a request's blocks hold beyond its ledger bytes.

    Returns ``reserve_waste`` and ``frag`` (bytes per request), ``ratio`` (``reserve_waste / frag``; None where
    paging wastes nothing, every request filling its last block: no ratio, and ``float("inf")`` is not JSON) and
    ``mean_len`` (tokens).
    """
    lens = np.asarray(lens)
    _check_lengths(lens, max_len)
    bpt = whole(kv_bytes_per_token)
    real, blocks = _request_costs(lens, bpt, residual, block_size_tokens)
    reserve = float(reservation_bytes(max_len, bpt, residual) - real.mean())
    frag = float((blocks * block_size_tokens * bpt - real).mean())
    return {
        "reserve_waste": reserve,
        "frag": frag,
        "ratio": reserve / frag if frag else None,
        "mean_len": float(lens.mean()),
        "block_size": block_size_tokens,
    }


def block_size_sweep(
    lens: np.ndarray,
    block_sizes: Sequence[int] = SWEEP_BLOCK_SIZES,
    kv_bytes_per_token: float = 1,
    residual: ResidualWindow | None = None,
) -> dict:
    """Section [C]: per block size, empty slots per request, theoretical utilization and block-table length.

    Rows: ``bs``, ``frag`` (empty slots, tokens; with a KIVI ``residual`` window, slots of its blocks beyond its
    ledger bytes, in slots of ``kv_bytes_per_token``), ``util`` (ledger bytes / bytes held), ``nblk`` (blocks per
    request). Smaller blocks waste fewer slots but lengthen every block table (more gathers per attention call).
    """
    lens = np.asarray(lens)
    mean_len = float(lens.mean())
    bpt = whole(kv_bytes_per_token)
    rows = []
    for bs in block_sizes:
        real, n_blocks = _request_costs(lens, bpt, residual, bs)
        slots = real / bpt  # each request's ledger bytes in slots: its length without a residual window
        real_slots, frag = float(slots.mean()), float((n_blocks * bs - slots).mean())
        rows.append(
            {
                "bs": int(bs),
                "frag": frag,
                "util": real_slots / (real_slots + frag),
                "nblk": float(n_blocks.mean()),
            }
        )
    return {"rows": rows, "mean_len": mean_len}


def demo_layout(
    lengths: Sequence[int] = DEMO_LENGTHS, block_size_tokens: int = 16, spare_blocks: int = 3
) -> dict:
    """The example of the mechanics chapter's paged-layout figure, run on a real :class:`BlockPool`: requests grow one token each in turn.

    Returns ``block_size``, ``seqs`` (``idx``, ``length``, ``n_blocks``, ``last_used``, ``block_ids``) and
    ``physical`` (per block: ``block_id``, ``owner`` or None, ``fill``).
    """
    n_blocks = sum(-(-n // block_size_tokens) for n in lengths) + spare_blocks
    pool = BlockPool(n_blocks, block_size_tokens)
    tables = [BlockTable(pool) for _ in lengths]
    while any(t.num_tokens < n for t, n in zip(tables, lengths)):
        for table, n in zip(tables, lengths):
            if table.num_tokens < n:
                table.append_tokens(1)
    pool.check_invariants(tables)
    owner = {b.block_id: i for i, t in enumerate(tables) for b in t.blocks}
    return {
        "block_size": block_size_tokens,
        "seqs": [
            {
                "idx": i,
                "length": t.num_tokens,
                "n_blocks": len(t.blocks),
                "last_used": t.last_block_tokens,
                "block_ids": t.block_ids,
            }
            for i, t in enumerate(tables)
        ],
        "physical": [
            {"block_id": b.block_id, "owner": owner.get(b.block_id), "fill": b.num_tokens if b.ref_cnt else 0}
            for b in pool.blocks
        ],
    }


def run_static(
    workloads: Sequence[str] = WORKLOADS,
    block_size_tokens: int = 16,
    budget: KVBudget | None = None,
    max_len: int = MAX_LEN_TOKENS,
    n_requests: int = N_REQUESTS,
    seed: int = WORKLOAD_SEED,
    lengths: dict[str, np.ndarray] | None = None,
) -> dict:
    """Sections A, B, C and the layout demo, as the mechanics chapter's ``_paged_results.json`` (plus ``config``).

    Args:
        workloads: built-in workload names (:func:`workload`) evaluated in [A]; [B] and [C] use the first.
        block_size_tokens: paging block size for [A] and [B].
        budget: KV budget; the mechanics chapter's Llama-3-8B account when None.
        max_len: contiguous reservation per request, tokens.
        n_requests, seed: workload size and RNG seed.
        lengths: named request lengths to use instead of ``workloads`` (e.g. ``{"file": load_lengths(p)}``).

    Returns:
        ``{"config", "A": {<workload>: {...}, "cap_tokens", "budget_bytes"}, "B", "C", "demo"}``.

    Raises:
        ValueError: ``n_requests`` < 1 or a ``seed`` that is not an integer >= 0 (named; only without
            ``lengths``), or a bad workload, block size or ``max_len``.
    """
    budget = budget or default_budget()
    if lengths is None:
        if n_requests < 1:  # named here: workload() calls it `n`
            raise ValueError(f"`n_requests` must be >= 1, got {n_requests!r}")
        check_seed(seed)
        lengths = {kind: workload(kind, n_requests, seed, max_len) for kind in workloads}
    if not lengths:
        raise ValueError("no workload to evaluate")
    section_a: dict = {
        name: static_capacity(lens, budget, block_size_tokens, max_len) for name, lens in lengths.items()
    }
    section_a["cap_tokens"] = budget.capacity_tokens
    section_a["budget_bytes"] = budget.budget_bytes
    first = next(iter(lengths.values()))
    return {
        "config": {
            **budget.as_dict(),
            "block_size": block_size_tokens,
            "max_len": max_len,
            "n_requests": {name: int(len(lens)) for name, lens in lengths.items()},
            "rng_seed": seed,
            "workload_B_C": next(iter(lengths)),
        },
        "A": section_a,
        "B": waste_split(first, budget.kv_bytes_per_token, block_size_tokens, max_len, budget.residual),
        "C": block_size_sweep(first, SWEEP_BLOCK_SIZES, budget.kv_bytes_per_token, budget.residual),
        "demo": demo_layout(block_size_tokens=16),
    }
