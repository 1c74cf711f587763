"""What the ``kvlab lab`` commands share: the status line of long work, warning lines, library arguments named by
their flags in messages, the model flags checked early, and the result printed as tables (one value per row:
:func:`value_table`; with the verdict and warning lines under them) or JSON."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from kvlab.commands import dtype_problem, table


def status(message: str, quiet: bool):
    """A spinner on stderr while long work runs on a terminal; off a terminal (logs, CI) one plain line saying what
    runs, since a spinner there prints nothing; nothing with --json."""
    import contextlib

    if quiet:
        return contextlib.nullcontext()
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        console.print(message, markup=False, highlight=False)
        return contextlib.nullcontext()
    return console.status(message)


def flag_names(message: object, flags: dict[str, str]) -> str:
    """``message`` with each library argument (`` `tokens` ``) named by the flag the user typed (``--tokens``)."""
    text = str(message)
    for field, flag in flags.items():
        text = text.replace(f"`{field}`", flag)
    return text


def warn(console, message: str) -> None:
    """One ``warning: ...`` line on ``console`` (stderr), printed as it comes, before the work it is about."""
    console.print(f"warning: {message}", style="yellow", markup=False, highlight=False, soft_wrap=True)


def note(console, message: str) -> None:
    """One ``note: ...`` line on ``console`` (stderr), printed as it comes: information about the work that follows
    (a wall-time estimate), not a warning."""
    console.print(f"note: {message}", markup=False, highlight=False, soft_wrap=True)


def value_table(title: str, label: str, rows: list[tuple[str, str]]):
    """A rich table titled ``title`` with one row per ``(name, value)`` of ``rows``: the names under ``label``,
    the values right-justified under ``value``."""
    t = table(title, "value", labels=(label,))
    for name, value in rows:
        t.add_row(name, value)
    return t


def print_verdict(console, checks: dict[str, bool]) -> None:
    """The line under a lab's tables: ``all checks passed``, or ``FAILED: <name>, ...`` naming the checks that
    failed."""
    failed = [name for name, ok in checks.items() if not ok]
    console.print("all checks passed" if not failed else f"FAILED: {', '.join(failed)}")


def print_warnings(console, warnings: list[str]) -> None:
    """A result's warnings under its tables on ``console`` (stdout), one ``warning: ...`` line each, wrapped to the
    console's width (:func:`warn` is the line on stderr as a warning comes)."""
    for warning in warnings:
        console.print(f"warning: {warning}", style="yellow", markup=False, highlight=False)


def add_model_flags(parser: argparse.ArgumentParser, help_prefix: str = "") -> None:
    """The ``--model`` and ``--dtype`` flags of a lab on a real model (checked by :func:`check_model_flags`);
    ``help_prefix`` starts their help (``"--real: "`` where only one mode reads them)."""
    parser.add_argument(
        "--model",
        default=None,
        help=f"{help_prefix}local dir, GGUF file, named model (kvlab models) or HF id (default: the bundled model)",
    )
    parser.add_argument("--dtype", default="float32", help=f"{help_prefix}model dtype (default float32)")


def check_model_flags(args: argparse.Namespace) -> None:
    """Refuse a bad --dtype or --model before the first progress line (the library names the model by its path).

    Raises:
        ValueError: a --dtype in the words of every command (:func:`kvlab.commands.dtype_problem`).
        ValueError / OSError: as :func:`kvlab.models.check_local_model`.
    """
    from kvlab.models import check_local_model

    problem = dtype_problem(args.dtype)
    if problem:
        raise ValueError(problem)
    check_local_model(args.model)


def finish(args: argparse.Namespace, result: dict, print_tables: Callable[[dict], None]) -> int:
    """Print ``result`` (JSON with ``--json``, else ``print_tables``'s tables); exit 0 when every check of the lab
    passed (``result["all_passed"]``), else 1."""
    if getattr(args, "json", False):
        print(json.dumps(result, indent=1))
    else:
        print_tables(result)
    return 0 if result["all_passed"] else 1
