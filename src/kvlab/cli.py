"""``kvlab`` command line: parses arguments and dispatches to ``kvlab.commands.*``; no logic here."""

from __future__ import annotations

import argparse
import importlib
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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"kvlab.commands.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kvlab`` console script; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
