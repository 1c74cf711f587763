"""``kvlab`` command line: parses arguments and dispatches to ``kvlab.commands.*``; no logic here."""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from kvlab import __version__, commands


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser from every module in ``kvlab.commands`` (each has ``register``)."""
    parser = argparse.ArgumentParser(
        prog="kvlab",
        description="Measure, compress and plan the KV cache of transformer decoders.",
    )
    parser.add_argument("--version", action="version", version=f"kvlab {__version__}")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also show other libraries' progress bars, logging and warnings (hidden by default)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"kvlab.commands.{info.name}")
        module.register(sub)
    _set_prog(parser)
    commands.read_dtype_aliases(parser)  # bf16/fp16/fp32 in every model --dtype
    return parser


def _set_prog(parser: argparse.ArgumentParser) -> None:
    """Give every parser's namespace ``kvlab_prog`` (``kvlab paging static``): the prefix of its error lines; a
    subcommand registered with a one-line ``help`` only gets it as its ``--help`` description too. No parser takes
    an abbreviated flag: ``kvlab paging static --gpu H100`` read ``--gpu`` as ``--gpu-mem-gib`` ("invalid float
    value: 'H100'") where ``plan`` and ``roofline`` have a ``--gpu NAME``; now it is an unknown flag."""
    parser.set_defaults(kvlab_prog=parser.prog)
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if not (sub.description or "").strip() and helps.get(name):
                    text = helps[name]
                    sub.description = text + ("" if text.endswith(".") else ".")  # "ms/token" keeps its case
                _set_prog(sub)


def _parser_of(parser: argparse.ArgumentParser, prog: str) -> argparse.ArgumentParser:
    """The parser (``parser`` or one of its subcommands, at any depth) whose ``prog`` is ``prog``; else ``parser``."""
    if parser.prog == prog:
        return parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found = _parser_of(sub, prog)
                if found is not sub or sub.prog == prog:
                    return found
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kvlab`` console script; returns the process exit status.

    A reader that closes stdout early (``kvlab plan MODEL --json | head -1``) ends the command quietly with
    status 1, as Python's documentation advises for ``BrokenPipeError``, instead of a traceback.
    """
    try:
        try:
            return _dispatch(argv)
        finally:
            sys.stdout.flush()  # output still buffered meets the closed pipe here, not at interpreter exit
    except BrokenPipeError:
        _stdout_to_devnull()
        return 1


# rich cuts tables at 80 columns when stdout is not a terminal (pipes, CI logs): give them room instead
PIPE_COLUMNS = "160"


def _dispatch(argv: list[str] | None) -> int:
    if "COLUMNS" not in os.environ and not sys.stdout.isatty():
        os.environ["COLUMNS"] = PIPE_COLUMNS
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse reports a subcommand's unknown flag as the top parser's ("kvlab: error:", its usage)
        _parser_of(parser, getattr(args, "kvlab_prog", parser.prog)).error(
            f"unrecognized arguments: {' '.join(extra)}"
        )
    if not getattr(args, "func", None):
        return commands.missing_subcommand(parser, parser._subparsers._group_actions[0], args)
    try:
        # other libraries' bars and warnings: only with --verbose
        with commands.quiet_third_party(args.verbose):
            return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C where the command does not record it itself: one line, not a traceback
        print(f"\n{getattr(args, 'kvlab_prog', 'kvlab')}: interrupted", file=sys.stderr)
        return commands.EXIT_INTERRUPTED


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at /dev/null so the interpreter's final flush of stdout cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (embedded or captured): nothing to redirect
        pass
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
