"""A number copied from kvlab's output pastes back into a command: every one-integer flag reads ``6,000`` (as kvlab
prints numbers), ``6_000`` and ``6000`` alike (``kvlab plan llama-3-8b --context 6,000`` was "invalid int value"),
and a value a refusal suggests typing is printed plain (``pass --context 8192 or less``), so it also pastes into a
comma-separated list flag and into vLLM; a list flag's value a refusal echoes (``--contexts 99999999 with ...``)
is printed plain too, so it pastes back as one item. Each suggestion below comes from a real refusal and is
pasted back."""

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


# ── a value echoed beside a comma-list flag is one item ───────────────────────────────────────────────────────────


def _flag_type(command: str, flag: str):
    """The argparse ``type`` of ``flag`` of ``command`` (``"kvlab bench decode"``, ``"--contexts"``)."""
    types = [a.type for name, a in _flags(build_parser()) if name == command and flag in a.option_strings]
    assert len(types) == 1, (command, flag, types)
    return types[0]


def _pastes_back_as_one_item(command: str, flag: str, echoed: str, bad: int) -> None:
    """``echoed``, read by ``flag``'s own type (a comma list), is one item equal to ``bad``: ``99,999,999`` was
    read as the three contexts 99, 999 and 999 (or refused as 'given twice')."""
    assert list(_flag_type(command, flag)(echoed)) == [bad], (command, flag, echoed)


def _tiny_eval(monkeypatch, tmp_path, contexts: str, *more: str) -> list[str]:
    """A ``kvlab eval`` argv on a tiny Qwen2 (loaded by a monkeypatched ``load_model``; 512 positions)."""
    from tests.conftest import make_tiny_qwen2
    from tests.unit.eval.test_eval_unit import CharTokenizer

    model = make_tiny_qwen2(head_dim=16, max_positions=512)
    monkeypatch.setattr("kvlab.models.load_model", lambda *a, **k: (model, CharTokenizer()))
    return [
        "eval", "--candidates", "dynamic,kivi-2", "--contexts", contexts, "--new-tokens", "6", "--residual", "16",
        "--group-size", "16", "--window-residuals", "none", "--warmup", "0", "--repeat", "1", "--quality-tokens",
        "4", "--out-dir", str(tmp_path), *more,
    ]  # fmt: skip


BAD = 99_999_999


def test_eval_echoes_a_context_past_the_heldout_text_as_one_item(monkeypatch, tmp_path, capsys):
    argv = _tiny_eval(monkeypatch, tmp_path, f"40,{BAD}", "--label", "long", "--allow-past-limit")
    err = _refusal(capsys, argv)
    echoed = re.search(r"`contexts` \(--contexts\) (\S+) is longer than the held-out text", err)
    assert echoed, err
    _pastes_back_as_one_item("kvlab eval", "--contexts", echoed.group(1), BAD)


def test_eval_echoes_a_context_past_the_position_limit_as_one_item(monkeypatch, tmp_path, capsys):
    err = _refusal(capsys, _tiny_eval(monkeypatch, tmp_path, f"40,{BAD}", "--label", "past"))
    echoed = re.search(r"error: --contexts (\S+) \+ 6 new tokens = ", err)
    assert echoed, err
    _pastes_back_as_one_item("kvlab eval", "--contexts", echoed.group(1), BAD)
    fit = re.search(r"pass --contexts (\S+) or less", err)
    assert fit, err
    _pastes_back_as_one_item("kvlab eval", "--contexts", fit.group(1), 8192 - 6)  # the bundled config's limit


def test_eval_echoes_a_context_too_large_for_memory_as_one_item(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("kvlab.runtime.provenance.available_memory_bytes", lambda: 2**30)
    argv = _tiny_eval(monkeypatch, tmp_path, f"40,{BAD}", "--prompt-mode", "repeat", "--no-long-context")
    err = _refusal(capsys, [*argv, "--label", "huge", "--allow-past-limit"])
    echoed = re.search(r"error: --contexts (\S+) with 6 new tokens", err)
    assert echoed, err
    _pastes_back_as_one_item("kvlab eval", "--contexts", echoed.group(1), BAD)


@pytest.mark.parametrize("bench", ["decode", "memory"])
def test_bench_echoes_a_context_that_cannot_be_held_as_one_item(bench, monkeypatch, capsys):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("kvlab.models.load_model", no_load)
    monkeypatch.setattr("kvlab.runtime.provenance.available_memory_bytes", lambda *a: 8 * 2**30)
    err = _refusal(capsys, ["bench", bench, "--contexts", f"256,{BAD}", "--device", "cpu", "--no-save"])
    echoed = re.search(r"`contexts` \(--contexts\) (\S+) cannot be held", err)
    assert echoed, err
    _pastes_back_as_one_item(f"kvlab bench {bench}", "--contexts", echoed.group(1), BAD)
