"""Checks ``kvlab paging`` makes before any work, each naming the flags that set the refused values (the library,
:mod:`kvlab.paging`, names its parameters): the integer and range flag types, the memory a request count takes,
flags a file replaces, the block size, and the trace against the policies and the KV pool."""

from __future__ import annotations

import argparse

from kvlab.runtime.checks import int_flag, read_int

INT_LIMIT = 2**62  # the simulator's arrays are numpy int64: a larger count overflowed inside numpy

# the type of every one-integer flag of ``kvlab paging``: kvlab's one (``6,000`` read), below 2**62 in magnitude
paging_int = int_flag(below=INT_LIMIT)


def range_flag(text: str) -> tuple[int, int]:
    """A ``LO:HI`` token range flag of ``kvlab paging`` (``N`` alone: ``N:N``), each read by
    :func:`kvlab.runtime.checks.read_int` (``1,000:2,000``) and below 2**62 in magnitude."""
    lo, sep, hi = text.partition(":")
    try:
        pair = (read_int(lo), read_int(hi if sep else lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO:HI tokens, got {text!r}") from None
    if max(abs(pair[0]), abs(pair[1])) >= INT_LIMIT:
        raise argparse.ArgumentTypeError(f"must be below 2**62 (numpy int64 arrays), got {text}")
    return pair


def check_requests_memory(flag: str, n_requests: int, need: int) -> None:
    """Raise ValueError naming ``flag n_requests`` when the ``need`` bytes it takes pass the available memory."""
    from kvlab.lab.longrun import memory_refusal
    from kvlab.runtime.provenance import available_memory_bytes

    problem = memory_refusal(f"{flag} {n_requests:,}", need, available_memory_bytes(), "give fewer requests")
    if problem:
        raise ValueError(problem)




def replaced_flags_problem(given: list[str], generated: str, replacement: str) -> str | None:
    """The one refusal of flags that size a generated input given beside the file that replaces it (they would be
    silently ignored): ``--requests 7, --seed 3: flags of <generated>, which <replacement> replaces; drop them or
    <replacement flag>``; None when ``given`` (each ``--flag value``) is empty."""
    if not given:
        return None
    one = len(given) == 1
    return (
        f"{', '.join(given)}: {'a flag' if one else 'flags'} of {generated}, which {replacement} replaces; drop "
        f"{'it' if one else 'them'} or {replacement.split()[0]}"
    )


def check_block_size(args: argparse.Namespace) -> None:
    """Refuse a ``--block-size`` larger than ``--max-len``: every paged request would hold one block bigger than the
    whole contiguous reservation it is compared with (``--block-size 100000`` reported 12 GiB of last-block waste per
    request against a 4,096-token reservation).

    Raises:
        ValueError: naming both flags and their values.
    """
    if args.block_size > args.max_len >= 1:  # below 1: the library names --max-len
        raise ValueError(
            f"--block-size {args.block_size:,} is larger than --max-len {args.max_len:,} (the contiguous reservation "
            "per request): every paged request would hold one block bigger than that whole reservation; use a "
            "block size <= --max-len"
        )


def check_keep_evicts(args: argparse.Namespace, trace, policies) -> None:
    """Refuse ``--keep-tokens N`` when no request of the trace grows past N tokens: ``paged+keepN`` would evict
    nothing and repeat ``paged``.

    Raises:
        ValueError: naming the flag, its value and the longest request.
    """
    if args.keep_tokens is None or not any(p.keep_tokens for p in policies):
        return
    longest = int((trace.prompt_tokens + trace.output_tokens).max())
    if args.keep_tokens >= longest:
        raise ValueError(
            f"--keep-tokens {args.keep_tokens:,} is not below the longest request ({longest:,} tokens, prompt + "
            f"output): paged+keep{args.keep_tokens} would evict nothing and repeat paged; use a smaller N"
        )


def check_workload_max_len(workload: str, lengths, lines, max_len: int) -> None:
    """Refuse a ``--workload FILE`` request longer than ``--max-len``, the contiguous reservation every request is
    charged (``lengths`` and their file ``lines``: :func:`kvlab.paging.static.read_lengths`).

    Raises:
        ValueError: naming the file, the line of the first request too long, ``--max-len`` and the value that
            would hold the longest request (and its line).
    """
    over = lengths > max_len
    if not over.any():
        return
    first, longest = int(over.argmax()), int(lengths.argmax())
    where = "" if lengths[longest] == lengths[first] else f", line {int(lines[longest])}"
    raise ValueError(
        f"--workload {workload}: line {int(lines[first])}: a request of {int(lengths[first]):,} tokens exceeds "
        f"the contiguous reservation --max-len {max_len:,}; raise --max-len to at least {int(lengths[longest])} "
        f"tokens (the longest request{where}) or shorten the requests"
    )


def _requests_source(args: argparse.Namespace, trace, lines) -> str:
    """Where the requests came from, in flags: the longest request's line of ``--trace t.csv`` (``lines``: each
    request's file line), or the generated trace's length flags."""
    if args.trace:
        longest = int((trace.prompt_tokens + trace.output_tokens).argmax())
        return f"the longest request: line {int(lines[longest])} of --trace {args.trace}"
    prefix = f" + --prefix-tokens {args.prefix_tokens:,}" if args.prefix_groups and args.prefix_tokens else ""
    prompt, output = args.prompt_tokens, args.output_tokens
    return (
        f"the longest generated request: --prompt-tokens {prompt[0]:,}:{prompt[1]:,}{prefix} + --output-tokens "
        f"{output[0]:,}:{output[1]:,}"
    )


def check_fits(args: argparse.Namespace, trace, policies, budget, lines=None) -> None:
    """Refuse, before any policy runs, a trace whose longest request exceeds ``--max-len`` or alone does not fit a
    policy's KV pool (what ``--gpu-mem-gib`` leaves after the weights and ``--reserve-gib``); ``lines``: the file
    line of each request of a ``--trace`` (:class:`kvlab.paging.trace.TraceFile`).

    Raises:
        ValueError: the library's reason, then the flags that set the request lengths and the pool.
    """
    from kvlab.paging.simulate import check_pools

    try:
        check_pools(trace, policies, budget, args.max_len)
    except ValueError as exc:
        message = str(exc)
        if "`max_len`" in message:
            raise ValueError(
                f"{message.replace('`max_len`', '--max-len')} ({_requests_source(args, trace, lines)}); raise --max-len "
                f"to at least {int(trace.peak_kv_tokens)} or shorten the requests"
            ) from None
        gpu = f"--gpu-mem-gib {args.gpu_mem_gib:g}" if args.gpu_mem_gib is not None else "the device"
        raise ValueError(
            f"{message} ({_requests_source(args, trace, lines)}): the KV pool is {budget.free_bytes / 2**30:.2f} GiB, what {gpu} "
            f"leaves after {budget.weight_bytes / 2**30:.2f} GiB of --model weights and --reserve-gib "
            f"{args.reserve_gib:g}; give more memory or shorter requests"
            + (" or a smaller --max-len (a contiguous block)" if "'contiguous'" in message else "")
        ) from None
