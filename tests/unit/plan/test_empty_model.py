"""An empty ``--model ""`` is refused by every command, naming the flag (breakit item 15): roofline planned the
default llama-3-8b and tasks ran the bundled model, exit 0."""

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
