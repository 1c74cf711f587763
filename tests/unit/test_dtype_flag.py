"""Every command with a model ``--dtype`` refuses one kvlab cannot run in with one message, built by
:func:`kvlab.commands.dtype_problem`, before any work: ``kvlab inspect``, ``lab`` and ``sensitivity sweep`` said "--dtype must be one of ...", each
from its own copy, ``kvlab tasks``, ``eval`` and ``bench`` "`dtype` (--dtype) must be one of ..."."""

from __future__ import annotations

import argparse

import pytest

from kvlab.cli import build_parser, main

SAID = "--dtype must be one of ['bfloat16', 'float16', 'float32'] (or bf16, fp16, fp32; any case), got "

# each command with --dtype -> the flags that let it reach its checks without doing or writing anything else
RUNS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("bench", "decode"): ("--quick", "--no-save"),
    ("bench", "flush"): ("--quick", "--no-save"),
    ("bench", "kernel"): ("--quick", "--no-save"),
    ("bench", "memory"): ("--quick", "--no-save"),
    ("eval",): ("--dry-run",),
    ("inspect",): (),
    ("lab",): ("--real",),
    ("lab", "eviction"): (),
    ("sensitivity", "sweep"): ("--out", "s.json"),
    ("tasks",): (),
}


def _with_dtype(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """The subcommands (as argv words) of ``parser`` that take ``--dtype``."""
    found = set()
    for action in parser._actions:
        if "--dtype" in action.option_strings:
            found.add(words)
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _with_dtype(sub, (*words, name))
    return found


def test_every_command_with_a_dtype_flag_is_checked_here():
    """A new command with --dtype joins RUNS (and so the one wording)."""
    assert _with_dtype(build_parser()) == set(RUNS)


@pytest.mark.parametrize("dtype", ["int8", "", "torch.float16"])
def test_the_helper_names_the_flag_and_the_value(dtype):
    from kvlab.commands import dtype_problem

    assert dtype_problem(dtype) == SAID + repr(dtype)
    assert dtype_problem("float16") is None


@pytest.mark.parametrize("words", sorted(RUNS))
def test_a_bad_dtype_is_refused_in_one_wording_by_every_command(words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # eval's results/, bench's records: nothing may be written
    assert main([*words, *RUNS[words], "--dtype", "int8"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"kvlab {' '.join(words)}: error: {SAID}'int8'\n"
    assert list(tmp_path.iterdir()) == []


def _parsed(words: tuple[str, ...], dtype: str) -> argparse.Namespace:
    """``kvlab <words> <its RUNS flags> --dtype <dtype>`` as the parser reads it (nothing runs)."""
    args, extra = build_parser().parse_known_args([*words, *RUNS[words], "--dtype", dtype])
    assert not extra
    return args


@pytest.mark.parametrize("words", sorted(RUNS))
@pytest.mark.parametrize(("short", "full"), [("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")])
def test_every_model_dtype_reads_the_short_spellings_as_the_full_name(words, short, full):
    """kvlab eval --dtype bf16 was refused while kvlab plan takes bf16: every command now reads it as bfloat16,
    so what it checks and records is the full name."""
    assert _parsed(words, short).dtype == full
    assert _parsed(words, full).dtype == full
    assert _parsed(words, "int8").dtype == "int8"  # refused by dtype_problem, in its one wording


@pytest.mark.parametrize("words", sorted(RUNS))
@pytest.mark.parametrize(
    ("typed", "full"), [("BF16", "bfloat16"), ("Fp16", "float16"), ("Float16", "float16"), ("FLOAT32", "float32")]
)
def test_every_model_dtype_reads_any_case_as_the_full_name(words, typed, full):
    """kvlab eval --dtype BF16 and --dtype Float16 were refused: any case now reads as the canonical name."""
    assert _parsed(words, typed).dtype == full


def test_a_dtype_in_another_case_is_recorded_by_its_full_name(tmp_path):
    import json

    assert main(["eval", "--dry-run", "--dtype", "BF16", "--out-dir", str(tmp_path), "--label", "d"]) == 0
    result = json.loads((tmp_path / "d.json").read_text())
    assert result["settings"]["dtype"] == "bfloat16"


def test_the_model_dtypes_are_one_list():
    """kvlab.eval.config kept its own copy of the names beside kvlab.runtime.dtypes.DTYPES."""
    import torch

    from kvlab.eval import config
    from kvlab.runtime.dtype_names import MODEL_DTYPES
    from kvlab.runtime.dtypes import DTYPES

    assert tuple(DTYPES) == MODEL_DTYPES
    assert DTYPES["bfloat16"] is torch.bfloat16 and DTYPES["float32"] is torch.float32
    assert not hasattr(config, "DTYPES")


def test_a_short_dtype_is_recorded_by_its_full_name(tmp_path):
    import json

    assert main(["eval", "--dry-run", "--dtype", "fp32", "--out-dir", str(tmp_path), "--label", "d"]) == 0
    result = json.loads((tmp_path / "d.json").read_text())
    assert result["settings"]["dtype"] == "float32"


def test_the_library_names_the_full_name_for_a_short_one():
    from kvlab.eval.config import EvalConfig
    from kvlab.runtime.dtypes import parse_dtype

    with pytest.raises(ValueError, match=r"got 'bf16' \(did you mean 'bfloat16'\?\)"):
        parse_dtype("bf16")
    with pytest.raises(ValueError, match=r"got 'fp16' \(did you mean 'float16'\?\)"):
        EvalConfig(dtype="fp16")
    with pytest.raises(ValueError, match=r"got 'int8'$"):
        parse_dtype("int8")
    with pytest.raises(ValueError, match=r"got 'BFloat16' \(did you mean 'bfloat16'\?\)"):
        EvalConfig(dtype="BFloat16")
