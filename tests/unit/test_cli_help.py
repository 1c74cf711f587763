"""Every ``kvlab ... --help`` text is readable without the project's internal design notes and issue tracker."""

from __future__ import annotations

import argparse
import re

import pytest

from kvlab.cli import build_parser, main

# "seed 003 §3.3", "seed 000's", "the seed's prompt", "(issue 4)": references a user cannot look up
JARGON = re.compile(r"\bseed 0\d\d|\bthe seed's|\bseed's\b|\bseed model\b|\bissue \d|§")


def _parsers(parser: argparse.ArgumentParser, name: str = "kvlab"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_help_texts_cite_no_internal_jargon():
    found = {}
    seen = 0
    for name, parser in _parsers(build_parser()):
        seen += 1
        text = " ".join(parser.format_help().split())  # undo line wrapping
        hits = JARGON.findall(text)
        if hits:
            found[name] = hits
    assert seen > 15  # every command and subcommand was visited
    assert not found, found


# a bound on run time no test or record keeps true: "under a minute on a 2-core CPU" (kvlab bench --quick) took
# 70 s on a loaded 2-core machine; a help may say what one run took, where and when
TIME_BOUND = re.compile(r"\bunder (a|one|\d+) (minutes?|seconds?)\b", re.IGNORECASE)


def test_no_help_promises_a_run_time_bound():
    found = {}
    for name, parser in _parsers(build_parser()):
        hits = TIME_BOUND.findall(" ".join(parser.format_help().split()))
        if hits:
            found[name] = hits
    assert not found, found


def test_every_command_and_option_explains_itself():
    missing = []
    for name, parser in _parsers(build_parser()):
        if not (parser.description or "").strip():
            missing.append(f"{name}: no description")
        for action in parser._actions:
            if action.help is None and not isinstance(action, argparse._SubParsersAction):
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: no help")
    assert not missing, missing


@pytest.mark.parametrize("group", ["bench", "paging", "sensitivity"])
def test_a_command_group_without_a_subcommand_prints_its_help_and_exits_2(group, capsys):
    assert main([group]) == 2
    err = capsys.readouterr().err  # the help, then the error line (the README's rule), all on stderr
    usage = err.splitlines()[0]
    assert usage.startswith(f"usage: kvlab {group} [-h] {{")
    (sub,) = [a for a in _parser_named(group)._actions if isinstance(a, argparse._SubParsersAction)]
    assert usage.endswith("{" + ",".join(sub.choices) + "} ..."), usage  # the metavar names every subcommand


def _parser_named(name: str) -> argparse.ArgumentParser:
    return dict(_parsers(build_parser()))[f"kvlab {name}"]
