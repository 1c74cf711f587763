"""An empty ``--model ""`` is refused by every command, naming the flag (breakit item 15): roofline planned the
default llama-3-8b and tasks ran the bundled model, exit 0. A ``--list-gpus`` / ``--list-presets`` call refuses the
flags its table would ignore (item 25)."""

from __future__ import annotations

import pytest

from kvlab.cli import main


@pytest.mark.parametrize(
    "argv, said",
    [
        (["roofline", "--model", ""], "--model must name a preset"),
        (["video", "--model", ""], "--model must name a preset"),  # was: `model` must name ...
        (["plan", ""], "MODEL must name a preset"),
        (["tasks", "--quick", "--model", "", "--dry-run"], "--model must name a model, got ''"),
        (["tasks", "--quick", "--model", " ", "--out", "tk.json"], "--model must name a model, got ' '"),
    ],
)
def test_an_empty_model_is_refused_naming_its_flag(capsys, tmp_path, monkeypatch, argv, said):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and "`" not in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, said",
    [
        (["plan", "--list-gpus", "--context", "5"], "--list-gpus prints a table and exits; it takes no --context"),
        (["roofline", "--list-gpus", "--probe"], "--list-gpus prints a table and exits; it takes no --probe"),
        (["plan", "--list-presets", "--tp", "2", "--kv-dtype", "fp8"], "it takes no --kv-dtype, --tp (drop"),
    ],
)
def test_a_listing_refuses_the_flags_it_would_ignore(capsys, argv, said):
    # breakit item 25: the extra flags were silently ignored, exit 0
    assert main(argv) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["plan", "--list-gpus", "--json"], ["roofline", "--list-gpus"], ["plan", "--list-presets"]])
def test_a_listing_alone_still_prints(capsys, argv):
    assert main(argv) == 0 and capsys.readouterr().out
