"""CLI subcommands: one module per command family.

Each module defines ``register(subparsers) -> None``, which adds its parser(s) and sets
``func=<callable(args) -> int>`` as the parser default. ``kvlab.cli`` discovers modules here, so adding a
command never edits a shared file.

Every command reports a problem the same way: one line ``kvlab <command>: error: <message>`` on stderr (the
format argparse uses for a bad flag) and one exit status from this table:

====  =======================================================================================================
code  meaning
====  =======================================================================================================
0     done; every check the command makes passed
1     the command ran and something failed: a check or target not met, a model that could not be loaded (the
      result file records it), stdout closed early by the reader
2     bad input, nothing done: a flag value or setting refused, an input file missing or invalid, or an output
      file that exists (results are never overwritten without ``--force``)
====  =======================================================================================================
"""

from __future__ import annotations

import argparse
import sys

EXIT_OK = 0  # done, every check passed
EXIT_FAILED = 1  # ran, and a check, target or load failed
EXIT_USAGE = 2  # bad input (flags, settings, input files) or an output file that exists; nothing done
EXIT_FILE_EXISTS = EXIT_USAGE  # an output file exists and --force was not given: a bad input like any other


def fail(args: argparse.Namespace | None, message: object, code: int = EXIT_USAGE) -> int:
    """Print ``<prog>: error: <message>`` on stderr and return ``code`` for the command to return.

    ``prog`` is the full command (``kvlab paging static``), set on every parser by :func:`kvlab.cli.build_parser`.
    """
    prog = getattr(args, "kvlab_prog", None) or "kvlab"
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def file_exists_message(path: object, alternative: str = "") -> str:
    """The one wording of "an output file exists": ``<path> already exists; pass --force to replace it``."""
    more = f" or {alternative}" if alternative else ""
    return f"{path} already exists; pass --force to replace it{more}"
