"""One error format and one exit-code table for every ``kvlab`` command (see ``kvlab.commands``).

Every runnable command gets a bad input here and must answer with one line ``kvlab <command>: error: ...`` on
stderr and exit status 2, before doing any work; every command that writes a result refuses to replace an
existing file with the same status. A command added without a case here fails
:func:`test_every_command_has_a_bad_input_case`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

import pytest

from kvlab.cli import build_parser, main
from kvlab.commands import EXIT_FILE_EXISTS, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_RESULT = ROOT / "docs" / "examples" / "eval-default-cpu-2026-12-01.json"

# command -> arguments that are wrong in a way the command (or the library under it) refuses
BAD_INPUT = {
    "kvlab bench decode": ["--threads", "0"],
    "kvlab bench memory": ["--threads", "0"],
    "kvlab bench flush": ["--threads", "0"],
    "kvlab bench kernel": ["--threads", "0"],
    "kvlab bench paging": ["--threads", "0"],
    "kvlab bench lab": ["--threads", "0"],
    "kvlab bench docs": ["--results-dir", "{tmp}/no-such-dir", "--out", "{tmp}/page.md", "--include-quick"],
    "kvlab eval": ["--dry-run", "--candidates", "no-such-cache", "--out-dir", "{tmp}"],
    "kvlab figures": ["--out", "{file}"],
    "kvlab inspect": ["--tokens", "1"],
    "kvlab lab": ["--repeat", "0", "--no-append"],
    "kvlab lab video": ["--frames", "0"],
    "kvlab lab eviction": ["--window", "0"],
    "kvlab models": ["get", "no-such-model"],
    "kvlab paging static": ["--block-size", "0"],
    "kvlab paging simulate": ["--policies", "no-such-policy"],
    "kvlab paging figure": ["--out", "{file}"],  # exists: refused without --force
    "kvlab plan": ["llama-3-8b", "--batch", "0"],
    "kvlab roofline": ["--gpu", "no-such-gpu"],
    "kvlab video": ["--seconds", "-1"],
    "kvlab report": ["{tmp}/no-such-result.json"],
    "kvlab sensitivity sweep": ["--context", "0", "--out", "{tmp}/sweep.json"],
    "kvlab sensitivity verify": ["{tmp}/no-such-result.json"],
    "kvlab tasks": ["--n", "0", "--out", "{tmp}/tasks.json"],
    "kvlab sensitivity allocate": [
        "{tmp}/no-such.json",
        "--budget",
        "kivi-4",
        "--name",
        "p",
        "--out-dir",
        "{tmp}",
    ],
}

# command -> arguments that would write onto {file}, an existing file
FILE_EXISTS = {
    "kvlab bench lab": ["--quick", "--out", "{file}"],
    "kvlab bench docs": ["--results-dir", "{tmp}", "--out", "{file}"],
    "kvlab eval": ["--dry-run", "--quick", "--out-dir", "{tmp}", "--label", "existing"],
    "kvlab inspect": ["--json", "{file}"],
    "kvlab paging figure": ["--out", "{file}"],
    "kvlab report": [str(EXAMPLE_RESULT), "--html", "{file}"],
    "kvlab sensitivity sweep": ["--out", "{file}"],
}


# groups that, without a subcommand, print their help and an error line on stderr and return 2
HELP_ONLY = ("kvlab bench", "kvlab paging", "kvlab sensitivity")


def _runnable_commands() -> list[str]:
    """Every parser that runs something (has ``func``), e.g. ``kvlab paging static``."""
    found = []

    def walk(parser: argparse.ArgumentParser) -> None:
        if parser.get_default("func") is not None:
            found.append(parser.prog)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)

    walk(build_parser())
    return found


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def _argv(command: str, args: list[str], tmp_path: Path) -> list[str]:
    existing = tmp_path / "existing.json"
    existing.write_text("kept\n", encoding="utf-8")
    subs = {"{tmp}": str(tmp_path), "{file}": str(existing)}
    filled = []
    for arg in args:
        for key, value in subs.items():
            arg = arg.replace(key, value)
        filled.append(arg)
    return command.split()[1:] + filled


def _assert_one_error_line(command: str, code: int, err: str, expected_code: int) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == expected_code, (command, code, err)
    assert len(lines) == 1, (command, err)  # one line, no traceback, no usage block
    assert lines[0].startswith(f"{command}: error: "), (command, err)


def test_every_command_has_a_bad_input_case():
    commands = _runnable_commands()
    assert len(commands) >= 15, commands
    assert sorted(commands) == sorted([*BAD_INPUT, *HELP_ONLY]), set(commands) ^ {*BAD_INPUT, *HELP_ONLY}


@pytest.mark.parametrize("command", sorted(BAD_INPUT))
def test_bad_input_is_one_error_line_and_status_2(command, tmp_path):
    code, out, err = _run(_argv(command, BAD_INPUT[command], tmp_path))
    _assert_one_error_line(command, code, err, EXIT_USAGE)
    assert out == ""


@pytest.mark.parametrize("command", sorted(FILE_EXISTS))
def test_an_existing_output_file_is_kept_with_one_status(command, tmp_path):
    existing = tmp_path / "existing.json"
    code, _, err = _run(_argv(command, FILE_EXISTS[command], tmp_path))
    _assert_one_error_line(command, code, err, EXIT_FILE_EXISTS)
    assert "exists" in err and "--force" in err
    assert existing.read_text(encoding="utf-8") == "kept\n"


def test_argparse_usage_errors_share_the_prefix_and_status():
    code, _, err = _run(["plan", "llama-3-8b", "--batch", "many"])
    assert code == EXIT_USAGE
    assert err.strip().splitlines()[-1].startswith("kvlab plan: error: ")


@pytest.mark.parametrize("command", ["kvlab", *HELP_ONLY])
def test_a_group_without_its_subcommand_prints_help_and_returns_2(command):
    """The README's rule: a problem is one line on stderr, ``<command>: error: <message>``, last (the help printed on
    stdout with nothing on stderr, exit 2)."""
    code, out, err = _run(command.split()[1:])
    assert code == EXIT_USAGE and out == "" and f"usage: {command}" in err
    assert err.strip().splitlines()[-1].startswith(f"{command}: error: choose a subcommand: "), err
