"""A number copied from kvlab's output pastes back into a command: every one-integer flag reads ``6,000`` (as kvlab
prints numbers), ``6_000`` and ``6000`` alike (``kvlab plan llama-3-8b --context 6,000`` was "invalid int value"),
and a value a refusal suggests typing is printed plain (``pass --context 8192 or less``), so it also pastes into a
comma-separated list flag and into vLLM. Each suggestion below comes from a real refusal and is pasted back."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from kvlab.cli import build_parser, main
from kvlab.runtime.checks import int_flag

ONE_INT = int_flag().__qualname__  # every type int_flag makes: 'int_flag.<locals>.one_int'


def _flags(parser: argparse.ArgumentParser, name: str = "kvlab"):
    """(command, action) of every flag of ``parser`` and its subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _flags(sub, f"{name} {sub_name}")
        elif action.option_strings:
            yield name, action


def test_every_one_integer_flag_reads_comma_grouped_digits():
    flags = list(_flags(build_parser()))
    plain_int = [f"{name} {a.option_strings[0]}" for name, a in flags if a.type is int and a.nargs is None]
    assert plain_int == [], f"type=int refuses '6,000': use kvlab.runtime.checks.int_flag() for {plain_int}"
    ints = [(name, a) for name, a in flags if getattr(a.type, "__qualname__", "") == ONE_INT]
    assert len(ints) > 100  # plan, paging, bench, eval, lab, tasks, sensitivity, inspect, video
    for name, action in ints:
        assert action.type("1,024") == action.type("1_024") == action.type("1024") == 1024, (name, action.dest)


def _refusal(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    return " ".join(capsys.readouterr().err.split())


def test_plan_suggests_a_context_that_pastes_back(capsys):
    err = _refusal(capsys, ["plan", "llama-3-8b", "--context", "100,000", "--emit", "vllm"])
    assert "--context 100,000 is beyond llama-3-8b's limit of 8,192 tokens" in err, err  # 100,000 read as 100000
    suggested = re.search(r"pass --context (\S+) or less", err).group(1)
    assert suggested == "8192", err
    assert main(["plan", "llama-3-8b", "--context", suggested, "--emit", "vllm", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["vllm"]["max_model_len"] == 8192
    assert main(["plan", "llama-3-8b", "--context", "8,192", "--emit", "vllm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == plain  # the grouped value is the same plan


def test_paging_simulate_suggests_a_max_len_that_pastes_back(capsys):
    argv = ["paging", "simulate", "--requests", "30", "--prompt-tokens", "10,000:12,000", "--output-tokens", "10:20"]
    err = _refusal(capsys, [*argv, "--max-len", "10,000"])
    assert "exceeds --max-len 10,000" in err, err
    suggested = re.search(r"raise --max-len to at least (\S+) or", err).group(1)
    assert suggested.isdigit(), err
    assert main([*argv, "--max-len", suggested, "--json"]) == 0
    assert main([*argv, "--max-len", str(int(suggested) - 1)]) == 2  # the least value that holds the trace
    capsys.readouterr()


def test_lab_suggests_new_tokens_that_paste_back(monkeypatch, capsys):
    from kvlab.lab import append, equivalence
    from kvlab.lab.toy import ToyConfig
    from kvlab.runtime import provenance

    def never(*args, **kwargs):
        raise AssertionError("work started before --new-tokens was checked")

    available = 8 * 2**30
    monkeypatch.setattr(provenance, "available_memory_bytes", lambda: available)
    monkeypatch.setattr(append, "measure_append_cost", never)
    err = _refusal(capsys, ["lab", "--new-tokens", "999,999,999"])
    assert "--new-tokens 999,999,999 needs about" in err, err
    suggested = re.search(r"at most about (\S+) new tokens fit", err).group(1)
    assert suggested.isdigit(), err
    for typed in (suggested, f"{int(suggested):,}"):
        args = build_parser().parse_args(["lab", "--new-tokens", typed])
        assert args.new_tokens == int(suggested)
        equivalence.check_toy_memory(ToyConfig(new_tokens=args.new_tokens), available=available)  # fits


def test_a_bad_grouping_is_refused_naming_the_flag_and_the_value(capsys):
    for argv, flag, value in (
        (["plan", "llama-3-8b", "--context", "6,00"], "--context", "6,00"),
        (["paging", "simulate", "--max-len", "60,00"], "--max-len", "60,00"),
        (["eval", "--new-tokens", "1,0000"], "--new-tokens", "1,0000"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        last = capsys.readouterr().err.splitlines()[-1]
        assert f"error: argument {flag}: expected a whole number, got '{value}': commas must group" in last, last
