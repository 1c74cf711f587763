"""kvlab bench docs --results-dir R, where R held a folder named dir.json, ended in an IsADirectoryError
traceback; a broken link x.json in a FileNotFoundError traceback (and a FIFO would have waited forever). Now each is
refused naming its path and what it is."""

import os

import pytest

from kvlab.cli import main


def _make(kind, path):
    if kind == "folder":
        path.mkdir()
    elif kind == "broken link":
        path.symlink_to(path.parent / "gone.json")
    else:
        os.mkfifo(path)


@pytest.mark.parametrize(
    "name, kind, said",
    [("dir.json", "folder", "a folder"), ("x.json", "broken link", "a broken link"),
     ("p.json", "fifo", "not a regular file")],
)
def test_a_results_entry_that_is_not_a_regular_file_is_refused(tmp_path, capsys, name, kind, said):
    results = tmp_path / "R"
    results.mkdir()
    _make(kind, results / name)
    assert main(["bench", "docs", "--results-dir", str(results), "--out", str(tmp_path / "P.md")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{results / name} is {said}" in err, err
    assert not (tmp_path / "P.md").exists()
