"""The Poisson trace ``kvlab paging simulate`` generates without ``--trace``: its flags, their defaults, and the
trace they ask for."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvlab.commands import file_exists_message
from kvlab.commands.paging.checks import check_requests_memory, paging_int, range_flag
from kvlab.runtime.atomic import output_problem

# the Poisson trace flags of `paging simulate` (dest: default); None in the parser means "not given"
POISSON_DEFAULTS = {
    "rate": 2.0,
    "requests": 500,
    "prompt_tokens": (256, 2048),
    "output_tokens": (64, 1024),
    "prefix_groups": 4,
    "prefix_tokens": 512,
    "seed": 0,
    "save_trace": None,
}


def poisson_flags_given(args: argparse.Namespace) -> list[str]:
    """The Poisson trace flags given on the command line (as ``--flag value``)."""
    given = []
    for dest in POISSON_DEFAULTS:
        value = getattr(args, dest)
        if value is None:
            continue
        if isinstance(value, tuple):  # --prompt-tokens LO:HI
            value = ":".join(f"{v:,}" for v in value)
        elif isinstance(value, float):  # --rate
            value = f"{value:g}"
        elif isinstance(value, int):  # --requests 100,000
            value = f"{value:,}"
        given.append(f"--{dest.replace('_', '-')} {value}")
    return given


def poisson_trace_of(args: argparse.Namespace):
    """The generated trace of the Poisson flags and its description (the caller writes ``--save-trace``).

    Raises:
        ValueError: a bad Poisson flag, ``--prefix-tokens`` > 0 given with ``--prefix-groups 0`` (the prefix would
            be silently dropped), or a ``--save-trace`` folder that does not exist or is a file.
    """
    from kvlab.paging.simulate import simulate_memory_bytes
    from kvlab.paging.trace import poisson_trace

    if args.prefix_groups == 0 and args.prefix_tokens:
        raise ValueError(
            f"--prefix-tokens {args.prefix_tokens:,} sizes a shared prefix, but --prefix-groups 0 means none; "
            "pass both > 0 or drop --prefix-tokens"
        )
    prefix_tokens_given = args.prefix_tokens is not None
    for dest, default in POISSON_DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)
    if args.requests >= 1:  # below 1: poisson_trace names it
        check_requests_memory("--requests", args.requests, simulate_memory_bytes(args.requests))
    trace = poisson_trace(
        args.requests,
        args.rate,
        args.prompt_tokens,
        args.output_tokens,
        args.prefix_groups,
        # the default 512 goes with the default groups: --prefix-groups 0 alone means no prefix
        args.prefix_tokens if args.prefix_groups or prefix_tokens_given else 0,
        args.seed,
    )
    if args.save_trace:
        problem = output_problem(args.save_trace, "--save-trace", folder_must_exist=True)
        if problem:
            raise ValueError(problem)
        if Path(args.save_trace).exists() and not args.force:  # before the run, not after it
            raise FileExistsError(file_exists_message(args.save_trace))
    return trace, f"poisson(rate={args.rate:g}/step, n={args.requests}, seed={args.seed})"


def add_poisson_flags(m) -> None:
    """The flags of the Poisson trace ``paging simulate`` generates without ``--trace``, each ``None`` when not
    given (so that one given with --trace is refused, not ignored); their defaults are :data:`POISSON_DEFAULTS`."""
    for flag, kind, text in (
        ("--rate", float, "Poisson arrivals per engine step (default {rate})"),
        ("--requests", paging_int, "requests in the Poisson trace (default {requests})"),
        ("--prompt-tokens", range_flag, "prompt range LO:HI ({prompt_tokens[0]}:{prompt_tokens[1]})"),
        ("--output-tokens", range_flag, "output range LO:HI ({output_tokens[0]}:{output_tokens[1]})"),
        ("--prefix-groups", paging_int, "shared system prompts (default {prefix_groups}; 0: none)"),
        (
            "--prefix-tokens",
            paging_int,
            "length of each shared prefix (default {prefix_tokens}; 0 with --prefix-groups 0)",
        ),
        ("--seed", paging_int, "RNG seed of the Poisson trace (default {seed})"),
    ):
        m.add_argument(flag, type=kind, default=None, help=text.format(**POISSON_DEFAULTS))
