"""Hostile input to ``kvlab inspect``: refused with exit status 2 and the flag named, before any work; never a
flag silently ignored or one result file written over another.

The xfail case is a finding of the bad-input pass reported to the lead (which exit status a model that cannot be
loaded gets is the lead's call); strict, so a fix turns it into a failure and the mark is removed.
"""

from __future__ import annotations

import pytest

from kvlab.cli import main


def err_of(capsys):
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("flag, value", [("--tokens", "4"), ("--offset", "3")])
def test_held_out_flags_with_a_prompt_are_refused(tmp_path, capsys, flag, value):
    prompt = "hello world this is a long prompt with many tokens in it"
    assert main(["inspect", "--prompt", prompt, flag, value, "--json", str(tmp_path / "r.json")]) == 2
    err = err_of(capsys)
    assert flag in err and "--prompt" in err
    assert list(tmp_path.iterdir()) == []


def test_json_and_figure_onto_one_path_are_refused(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["inspect", "--tokens", "16", "--json", str(out), "--figure", str(out)]) == 2
    assert "--figure" in err_of(capsys) and not out.exists()


@pytest.mark.xfail(
    strict=True,
    reason="kvlab inspect --model /nonexistent exits 1; kvlab lab eviction and kvlab plan exit 2 for the same "
    "missing input (README: 2 = an input file missing): reported to the lead",
)
def test_a_missing_model_directory_is_bad_input(tmp_path, capsys):
    assert main(["inspect", "--model", str(tmp_path / "none"), "--tokens", "16"]) == 2
    assert "has no config.json" in err_of(capsys)
