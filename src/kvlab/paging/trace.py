"""The requests a serving simulation replays: :class:`Trace` (arrival, prompt, output and shared-prefix columns),
a seeded Poisson trace, and the trace CSV file (load and save)."""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvlab.paging.static import REQUEST_TOKENS_LIMIT, check_seed
from kvlab.plan.config_fields import number_text
from kvlab.runtime.atomic import atomic_write, special_file
from kvlab.runtime.text_files import read_text

# Arrivals must come before engine step 2**53: arrival times are float64, which from 2**53 on cannot tell
# consecutive steps apart (2**53 + 1 reads as 2**53). Steps are counted in int64 arrays; beyond 2**63
# ceil(arrival) overflowed (an arrival at 1e20 read as a negative step and the makespan came out wrong, no error).
ARRIVAL_STEP_LIMIT = 2**53


@dataclass(frozen=True)
class Trace:
    """Requests to serve, one entry per request, sorted by arrival.

    Args:
        arrival_step: ``[n]`` float, arrival time in engine steps (a request can start at ``ceil(arrival)``).
        prompt_tokens: ``[n]`` int, prompt length (shared prefix included).
        output_tokens: ``[n]`` int >= 1, tokens to generate.
        prefix_group: ``[n]`` int, which shared prompt prefix the request starts with (-1: none).
        prefix_tokens: ``[n]`` int, length of that shared prefix (<= prompt_tokens).

    Raises:
        ValueError: columns of different lengths, no request, arrivals not finite, negative, unsorted or beyond
            :data:`ARRIVAL_STEP_LIMIT`, a prompt or output < 1 token, or a bad prefix length; the message names the
            first request that has it by its index and value (``request 3: `arrival_step` 2 is before request 2's
            5``), as :func:`read_trace` names a file's line.
    """

    arrival_step: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_group: np.ndarray
    prefix_tokens: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.arrival_step)
        for name in ("prompt_tokens", "output_tokens", "prefix_group", "prefix_tokens"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"`{name}` has {len(getattr(self, name))} entries, arrival_step has {n}")
        if n == 0:
            raise ValueError("a trace needs at least one request")
        problem = _arrival_problem(np.asarray(self.arrival_step))
        if problem:
            raise ValueError(problem)
        if self.arrival_step[-1] >= ARRIVAL_STEP_LIMIT:
            i = int(np.argmax(self.arrival_step >= ARRIVAL_STEP_LIMIT))
            raise ValueError(
                f"request {i}: `arrival_step` {float(self.arrival_step[i]):g} must be below step 2**53 "
                f"({ARRIVAL_STEP_LIMIT:,}), from which float64 times cannot tell consecutive steps apart"
            )
        for name in ("prompt_tokens", "output_tokens"):
            tokens = getattr(self, name)
            if tokens.min() < 1:
                i = int(np.argmin(tokens))
                raise ValueError(f"request {i}: `{name}` must be >= 1 token, got {int(tokens[i])}")
        bad = (self.prefix_tokens < 0) | (self.prefix_tokens > self.prompt_tokens)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(
                f"request {i}: prefix_tokens {int(self.prefix_tokens[i])} not in [0, prompt {int(self.prompt_tokens[i])}]"
            )

    def __len__(self) -> int:
        return len(self.arrival_step)

    @property
    def peak_kv_tokens(self) -> int:
        """Most KV slots one request ever holds: its prompt and every output token but the last."""
        return int((self.prompt_tokens + self.output_tokens).max()) - 1


def _arrival_problem(arrival: np.ndarray) -> str | None:
    """Why :class:`Trace` refuses ``arrival`` (``[n]`` engine steps), naming the first request that has it by its
    index and value, as :func:`read_trace` names a file's line: not finite, below 0, or before the request ahead of
    it (a trace is sorted by arrival); None when every arrival is fine."""
    checks = (
        (~np.isfinite(arrival), "must be a finite number of engine steps"),
        (arrival < 0, "must be >= 0 (engine steps from the start of the trace)"),
    )
    for bad, rule in checks:
        if bad.any():
            i = int(np.argmax(bad))
            return f"request {i}: `arrival_step` {rule}, got {number_text(float(arrival[i]))}"
    back = np.flatnonzero(np.diff(arrival) < 0)
    if len(back):
        i = int(back[0]) + 1
        return (
            f"request {i}: `arrival_step` {number_text(float(arrival[i]))} is before request {i - 1}'s "
            f"{number_text(float(arrival[i - 1]))}: a trace is sorted by arrival (order the requests by "
            "`arrival_step`, as kvlab.paging.trace.read_trace does a file's rows)"
        )
    return None


def poisson_trace(
    n_requests: int,
    rate_per_step: float,
    prompt_tokens: tuple[int, int] = (256, 2048),
    output_tokens: tuple[int, int] = (64, 1024),
    prefix_groups: int = 0,
    prefix_tokens: int = 0,
    seed: int = 0,
) -> Trace:
    """A seeded Poisson trace: exponential inter-arrival gaps of mean ``1 / rate_per_step`` steps.

    Prompt and output lengths are uniform on the inclusive ranges. With ``prefix_groups > 0`` every request
    starts with one of that many shared prefixes of ``prefix_tokens`` tokens (a system prompt), followed by its own
    prompt of the drawn length.

    Raises:
        ValueError: a bad count, rate, range, prefix pair or seed (named), or a rate so low that the last arrival
            falls at or past :data:`ARRIVAL_STEP_LIMIT` (``rate_per_step`` named).
    """
    if n_requests < 1:
        raise ValueError(f"`n_requests` must be >= 1, got {n_requests!r}")
    if not 0 < rate_per_step < math.inf:
        raise ValueError(f"`rate_per_step` must be finite and > 0, got {rate_per_step!r}")
    for name, (lo, hi) in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
        if not 1 <= lo <= hi:
            raise ValueError(f"`{name}` must be a range 1 <= lo <= hi, got {(lo, hi)!r}")
    if prefix_groups < 0 or prefix_tokens < 0 or (prefix_groups > 0) != (prefix_tokens > 0):
        raise ValueError(
            f"`prefix_groups` and `prefix_tokens` must both be > 0 or both 0, got {prefix_groups!r}, {prefix_tokens!r}"
        )
    check_seed(seed)
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_step, n_requests))
    if not arrivals[-1] < ARRIVAL_STEP_LIMIT:  # also inf: 1 / rate overflows for a subnormal rate
        raise ValueError(
            f"`rate_per_step` {rate_per_step!r} is too low: the last of {n_requests:,} arrivals falls "
            f"{'' if math.isinf(arrivals[-1]) else f'at step {arrivals[-1]:.3g}, '}past step 2**53 "
            f"({ARRIVAL_STEP_LIMIT:,}), from which float64 times cannot tell consecutive steps apart"
        )
    prompts = rng.integers(prompt_tokens[0], prompt_tokens[1] + 1, n_requests)
    outputs = rng.integers(output_tokens[0], output_tokens[1] + 1, n_requests)
    if prefix_groups:
        groups = rng.integers(0, prefix_groups, n_requests)
        prefixes = np.full(n_requests, prefix_tokens)
        prompts = prompts + prefix_tokens
    else:
        groups = np.full(n_requests, -1)
        prefixes = np.zeros(n_requests, dtype=np.int64)
    return Trace(arrivals, prompts, outputs, groups, prefixes)


TRACE_COLUMNS = ("arrival_step", "prompt_tokens", "output_tokens")


@dataclass(frozen=True)
class TraceFile:
    """A trace CSV as :func:`read_trace` reads it: the trace, sorted by arrival, and where each request stands in
    the file."""

    trace: Trace  # sorted by arrival (ties in file order)
    lines: np.ndarray  # [n] the file line of each request of `trace` (the header is line 1; blank lines count)

    def order_note(self) -> str | None:
        """None when the file's rows are in arrival order; else that they were sorted, naming the first row that
        arrives before the row above it (a trace is replayed by arrival time, whatever the order of its rows)."""
        by_line = np.argsort(self.lines, kind="stable")  # the requests in file order
        arrival = self.trace.arrival_step[by_line]
        back = np.flatnonzero(np.diff(arrival) < 0)
        if not len(back):
            return None
        i = int(back[0]) + 1
        line, above = (int(self.lines[by_line[j]]) for j in (i, i - 1))
        return (
            f"the rows are not in arrival order (line {line} arrives at step {number_text(float(arrival[i]))}, "
            f"before line {above} above it at step {number_text(float(arrival[i - 1]))}): the requests are "
            "replayed sorted by arrival time (rows of equal arrival in file order); request i of the results is "
            "the i-th to arrive, not the file's i-th row"
        )


def load_trace(path: str | os.PathLike) -> Trace:
    """The trace of a trace CSV, sorted by arrival: :func:`read_trace`'s ``trace``."""
    return read_trace(path).trace


def read_trace(path: str | os.PathLike) -> TraceFile:
    """A trace from CSV: ``arrival_step,prompt_tokens,output_tokens[,prefix_group,prefix_tokens]`` with a header.

    Arrival times are in engine steps. The requests are sorted by arrival (a trace is replayed by arrival time, rows
    of equal arrival in file order); :meth:`TraceFile.order_note` says when the rows were not in that order.

    A ``prefix_group`` is one shared prefix: every row of a group gives the same ``prefix_tokens``.

    Raises:
        ValueError: an empty or undecodable file, a column named twice in the header (only the last would be
            read), missing columns, a row with the wrong number of fields, a value that is not a number, an arrival
            at or past :data:`ARRIVAL_STEP_LIMIT`, a token count or group above
            :data:`kvlab.paging.static.REQUEST_TOKENS_LIMIT` in size, a row :class:`Trace` would refuse (an arrival
            not finite or below 0, a prompt or output of no token, a prefix outside its prompt; each with the file
            and line), or two rows of one ``prefix_group`` with different ``prefix_tokens`` (both lines named).
    """
    path = Path(path)
    rows, lines = _read_rows(path)

    def column(name: str, parse, default=None) -> np.ndarray:
        values = []
        for i, row in zip(lines, rows):
            text = row.get(name)
            try:
                values.append(parse(text) if text not in (None, "") or default is None else default)
            except ValueError:
                raise ValueError(f"{path}: line {i}: `{name}` must be a number, got {text!r}") from None
            if parse is int and abs(values[-1]) > REQUEST_TOKENS_LIMIT:  # past int64 it overflowed (a traceback)
                raise ValueError(
                    f"{path}: line {i}: `{name}` must be at most {REQUEST_TOKENS_LIMIT:,} (2**40) in size, got {text}"
                )
        return np.array(values)

    arrival = column("arrival_step", float).astype(np.float64)
    late = np.flatnonzero((arrival >= ARRIVAL_STEP_LIMIT) & np.isfinite(arrival))
    if len(late):
        raise ValueError(
            f"{path}: line {lines[late[0]]}: `arrival_step` {rows[late[0]]['arrival_step']!r} must be below step "
            f"2**53 ({ARRIVAL_STEP_LIMIT:,}), from which float64 times cannot tell consecutive steps apart"
        )
    prompt = column("prompt_tokens", int).astype(np.int64)
    output = column("output_tokens", int).astype(np.int64)
    group = column("prefix_group", int, -1).astype(np.int64)
    prefix = column("prefix_tokens", int, 0).astype(np.int64)
    prefix[group < 0] = 0
    parsed = {
        "arrival_step": arrival, "prompt_tokens": prompt, "output_tokens": output, "prefix_group": group,
        "prefix_tokens": prefix,
    }  # fmt: skip
    _check_values(path, lines, rows, parsed)
    _check_prefix_groups(path, lines, group, prefix)
    order = np.argsort(arrival, kind="stable")
    trace = Trace(arrival[order], prompt[order], output[order], group[order], prefix[order])
    return TraceFile(trace, np.array(lines, dtype=np.int64)[order])


def _read_rows(path: Path) -> tuple[list[dict], list[int]]:
    """The rows of the trace CSV at ``path`` and the file line of each (the header is line 1; blank lines, which
    are skipped, count, as in :func:`kvlab.paging.static.load_lengths`).

    Raises:
        ValueError: no such file (or a folder), an empty file, a column named twice, missing columns, no row, or a
            row with the wrong number of fields (naming the file and line).
    """
    if not path.is_file():  # a trace to write is suggested only where nothing stands at the path
        odd = special_file(path)  # /dev/urandom, a FIFO: reading it would never end
        what = (
            "a folder" if path.is_dir() else f"{odd}, not a regular file" if odd
            else "a broken link" if path.is_symlink() else None
        )  # fmt: skip
        if what is not None:
            raise ValueError(f"trace {path}: {what}; pass a trace CSV (columns {', '.join(TRACE_COLUMNS)})")
        if not path.parent.is_dir():
            raise ValueError(f"trace {path}: no such file (folder {path.parent} does not exist)")
        raise ValueError(f"trace {path}: no such file (write one with `kvlab paging simulate --save-trace {path}`)")
    reader = csv.DictReader(io.StringIO(read_text(path, newline=""), newline=""))  # by its byte-order mark
    rows, lines = [], []
    for row in reader:
        rows.append(row)
        lines.append(reader.line_num)  # the row's (last) line: a quoted field may hold a line break
    names = list(reader.fieldnames or [])  # read here: an empty file's header is read again, lazily
    if not names:
        raise ValueError(
            f"{path}: empty file, no header and no requests (a trace starts with the header "
            f"{','.join(TRACE_COLUMNS)})"
        )
    twice = next((name for i, name in enumerate(names) if name and name in names[:i]), None)
    if twice is not None:  # csv.DictReader keeps the last of them: one column would be silently dropped
        where = [i for i, name in enumerate(names, start=1) if name == twice]
        raise ValueError(
            f"{path}: the header names column `{twice}` {len(where)} times (columns "
            f"{', '.join(map(str, where))}); name each column once"
        )
    missing = [c for c in TRACE_COLUMNS if c not in names]
    if missing:  # checked on the header: a wrong header with no row under it is named too
        raise ValueError(f"{path}: missing columns {missing}; have {sorted(k for k in names if k)}")
    if not rows:
        raise ValueError(f"{path}: no requests")
    for i, row in zip(lines, rows):
        if None in row or None in row.values():  # DictReader's marks for fields beyond / short of the header
            n = len(names) - list(row.values()).count(None) + len(row.get(None) or ())
            raise ValueError(f"{path}: line {i} has {n} fields, the header has {len(names)}")
    return rows, lines


def _check_values(path: Path, lines: list[int], rows: list[dict], columns: dict[str, np.ndarray]) -> None:
    """Refuse what :class:`Trace` refuses of one request, naming the file and line of the first row that has it: an
    arrival that is not finite or is before step 0, a prompt or output of no token, a prefix group below -1 (it was
    read as none), a prefix outside its prompt.

    Raises:
        ValueError: naming the file, the line, the column and the value as written.
    """
    arrival, prompt, prefix = columns["arrival_step"], columns["prompt_tokens"], columns["prefix_tokens"]
    checks = (
        ("arrival_step", ~np.isfinite(arrival), "must be a finite number of engine steps"),
        ("arrival_step", arrival < 0, "must be >= 0 (engine steps from the start of the trace)"),
        ("prompt_tokens", prompt < 1, "must be >= 1 token"),
        ("output_tokens", columns["output_tokens"] < 1, "must be >= 1 token"),
        ("prefix_group", columns["prefix_group"] < -1, "must be a group id >= 0, or -1 (or empty) for no shared prefix"),
        ("prefix_tokens", (prefix < 0) | (prefix > prompt), "must be in [0, `prompt_tokens`]: a prefix of the prompt"),
    )
    for name, bad, rule in checks:
        if bad.any():
            i = int(np.argmax(bad))
            also = f" (`prompt_tokens` {int(prompt[i])})" if name == "prefix_tokens" else ""
            raise ValueError(f"{path}: line {lines[i]}: `{name}` {rule}, got {rows[i].get(name)!r}{also}")


def _check_prefix_groups(path: Path, lines: list[int], group: np.ndarray, prefix: np.ndarray) -> None:
    """Refuse a ``prefix_group`` whose rows give different ``prefix_tokens`` (a group is one shared prefix, of one
    length), naming the group's first row and the first row that differs by their file ``lines``.

    Raises:
        ValueError: naming both lines, the group and both lengths.
    """
    first: dict[int, int] = {}
    for i, (g, n) in enumerate(zip(group.tolist(), prefix.tolist())):
        if g < 0:
            continue
        j = first.setdefault(g, i)
        if prefix[j] != n:
            raise ValueError(
                f"{path}: lines {lines[j]} and {lines[i]}: `prefix_group` {g} has `prefix_tokens` {int(prefix[j])} and "
                f"{n}; a prefix group is one shared prefix, give every row of it the same prefix_tokens"
            )


def save_trace(trace: Trace, path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write ``trace`` as CSV, atomically, and return ``path``.

    Raises:
        ValueError: ``path`` exists and ``overwrite`` is False (``kvlab paging simulate --save-trace`` without
            ``--force``), as :func:`kvlab.paging.figure.plot_paged_layout` refuses it.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise ValueError(f"{path} exists; pass overwrite=True to replace it")

    def write(f) -> None:
        w = csv.writer(f)
        w.writerow((*TRACE_COLUMNS, "prefix_group", "prefix_tokens"))
        for row in zip(
            trace.arrival_step.tolist(),
            trace.prompt_tokens.tolist(),
            trace.output_tokens.tolist(),
            trace.prefix_group.tolist(),
            trace.prefix_tokens.tolist(),
        ):
            w.writerow(row)

    return atomic_write(path, write, newline="")
