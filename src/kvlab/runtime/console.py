"""The rich console a command prints its tables and lines to (stdout).

On a terminal rich measures the window; into a pipe or a file it would take 80 columns, which cut a table's title
mid-phrase (``... tp`` / ``1``) and wrap its cells. There :func:`stdout_console` is :data:`PIPE_WIDTH` columns wide
unless ``COLUMNS`` says otherwise, as ``kvlab eval``'s summary already was.
"""

from __future__ import annotations

import os

from rich.console import Console

PIPE_WIDTH = 150  # columns of piped output: the widest tables (plan's ledger, eval's matrices) fit unwrapped


def stdout_console() -> Console:
    """A console on stdout: the terminal's width, or :data:`PIPE_WIDTH` columns where stdout is not a terminal and
    ``COLUMNS`` is not set."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=PIPE_WIDTH)
    return console
