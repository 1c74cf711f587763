"""CLI subcommands: one module per command family.

Each module defines ``register(subparsers) -> None``, which adds its parser(s) and sets
``func=<callable(args) -> int>`` as the parser default. ``kvlab.cli`` discovers modules here, so adding a
command never edits a shared file.
"""
