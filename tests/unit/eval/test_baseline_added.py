"""``--candidates`` without the float baseline: ``kvlab eval`` and ``kvlab tasks`` both add ``dynamic`` first and say
so in one line, in the same words (eval refused it, tasks added it silently)."""

from __future__ import annotations

import json

from kvlab.cli import main
from kvlab.eval.candidates import baseline_note, with_baseline

NOTE = "note: added the float baseline dynamic to --candidates: every ratio and gate compares a cache with it"


def _err(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())


def test_eval_adds_the_baseline_and_says_so(tmp_path, capsys):
    argv = ["eval", "--candidates", "kivi-4", "--quick", "--dry-run", "--out-dir", str(tmp_path), "--label", "a"]
    assert main(argv) == 0
    assert NOTE in _err(capsys)
    result = json.loads((tmp_path / "a.json").read_text())
    assert result["settings"]["candidates"] == ["dynamic", "kivi-4"]
    assert main([*argv[:2], "dynamic,kivi-4", *argv[3:-1], "b"]) == 0
    assert "added the float baseline" not in _err(capsys)  # given: nothing added, nothing said


def test_tasks_adds_the_baseline_in_the_same_words(capsys):
    assert main(["tasks", "--candidates", "kivi-4", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert NOTE in " ".join(err.split()) and "caches (dynamic, kivi-4)" in out
    assert main(["tasks", "--candidates", "dynamic,kivi-4", "--dry-run"]) == 0
    assert "added the float baseline" not in capsys.readouterr().err


def test_the_baseline_alone_and_a_misspelt_one_are_still_refused(tmp_path, capsys):
    assert with_baseline(("kivi-4", "dynamic")) == ("kivi-4", "dynamic")
    assert with_baseline(("Dynamic", "kivi-4")) == ("Dynamic", "kivi-4")  # not added: its spelling is refused
    assert baseline_note(("dynamic",)) is None
    argv = ["eval", "--candidates", "Dynamic,kivi-4", "--dry-run", "--out-dir", str(tmp_path), "--label", "c"]
    assert main(argv) == 2
    assert "write cache candidate 'Dynamic' as 'dynamic'" in _err(capsys)
