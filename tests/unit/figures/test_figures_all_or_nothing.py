"""``kvlab figures`` writes its set all or nothing. A new user's ``timeout -s INT 3 kvlab figures --out fi3`` left 2 of
the 6 PNGs and no figures.json, and the rerun was refused: "fi3/fig_memory_ledger.png already exists; pass --force".
Now the figures are drawn in a staging folder beside --out and moved in at the end; an interrupt or an error
removes it and leaves --out as it was."""

from __future__ import annotations

import os

import pytest

import kvlab.figures
from kvlab.cli import main
from kvlab.runtime.atomic import staged_folder

ARGS = ["--no-probe", "--no-append", "--json"]


def _fail_after_the_first_figure(monkeypatch, exc: BaseException) -> list[str]:
    """The second figure's numbers raise ``exc``; returns the folders the first figure was drawn into."""
    drawn = []
    plot = kvlab.figures.plot_memory_ledger

    def first(data, path):
        drawn.append(path.parent)
        return plot(data, path)

    def second(**kwargs):
        assert (drawn[0] / "fig_memory_ledger.png").is_file()  # the first figure was written
        raise exc

    monkeypatch.setattr(kvlab.figures, "plot_memory_ledger", first)
    monkeypatch.setattr(kvlab.figures, "roofline_data", second)
    return drawn


@pytest.mark.parametrize("existing", [False, True])
def test_an_interrupt_after_the_first_figure_leaves_nothing(tmp_path, capsys, monkeypatch, existing):
    out = tmp_path / "fi3"
    if existing:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    drawn = _fail_after_the_first_figure(monkeypatch, KeyboardInterrupt())
    assert main(["figures", "--out", str(out), *ARGS]) == 130
    assert drawn and drawn[0] != out and not drawn[0].exists()  # drawn beside --out, then removed
    assert sorted(p.name for p in tmp_path.iterdir()) == (["fi3"] if existing else [])
    if existing:
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_an_error_after_the_first_figure_leaves_nothing_and_the_rerun_needs_no_force(tmp_path, monkeypatch, capsys):
    out = tmp_path / "fi3"
    _fail_after_the_first_figure(monkeypatch, RuntimeError("injected"))
    with pytest.raises(RuntimeError, match="injected"):
        main(["figures", "--out", str(out), *ARGS])
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["figures", "--out", str(out), *ARGS]) == 0
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(kvlab.figures.figure_files(append=False)), written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fi3"]  # no staging folder left beside it


def test_a_staged_set_replaces_files_only_at_the_end(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.png").write_text("old")
    with staged_folder(out) as folder:
        (folder / "a.png").write_text("new")
        (folder / "b.png").write_text("new")
        assert (out / "a.png").read_text() == "old" and not (out / "b.png").exists()
    assert {p.name: p.read_text() for p in out.iterdir()} == {"a.png": "new", "b.png": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_new_folder_gets_ordinary_permissions(tmp_path):
    mask = os.umask(0o022)
    try:
        with staged_folder(tmp_path / "new") as folder:
            (folder / "x").write_text("x")
    finally:
        os.umask(mask)
    assert (tmp_path / "new" / "x").read_text() == "x"
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o755
