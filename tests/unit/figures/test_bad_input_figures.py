"""Hostile input to ``kvlab figures``: a missing, malformed or foreign ``--result`` and an ``--out`` that is a
file get ``error: ...`` and exit status 2 before any figure is computed, not a traceback."""

from __future__ import annotations

import pytest

from kvlab.cli import main


@pytest.mark.parametrize(
    "content, fragment",
    [
        (None, "no result file"),
        ("{bad", "not valid JSON"),
        ('{"schema_version": "other/1"}', "not a valid kvlab eval result"),
    ],
)
def test_bad_result_files(tmp_path, capsys, content, fragment):
    result = tmp_path / "result.json"
    if content is not None:
        result.write_text(content)
    out = tmp_path / "figs"
    assert main(["figures", "--out", str(out), "--result", str(result), "--no-probe", "--no-append"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error:" in err and fragment in err
    assert not out.exists()


def test_out_that_is_a_file(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    assert main(["figures", "--out", str(afile), "--no-probe", "--no-append"]) == 2
    assert "error:" in capsys.readouterr().err
    assert afile.read_text() == "keep me"


def test_out_under_a_file_is_named_before_any_work(tmp_path, capsys, monkeypatch):
    import kvlab.figures

    def no_work(*args, **kwargs):
        raise AssertionError("figures computed before the folder was checked")

    monkeypatch.setattr(kvlab.figures, "write_figures", no_work)
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    out = afile / "sub"  # was a NotADirectoryError traceback after the first figure's numbers
    assert main(["figures", "--out", str(out), "--no-probe", "--no-append"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("kvlab figures: error: --out") and str(out) in err, err
    assert afile.read_text() == "keep me"


def test_an_empty_out_is_refused(capsys, monkeypatch):
    import kvlab.figures

    monkeypatch.setattr(kvlab.figures, "write_figures", lambda *a, **k: pytest.fail("ran"))
    assert main(["figures", "--out", "", "--no-probe", "--no-append"]) == 2
    assert "--out" in capsys.readouterr().err


def test_out_in_a_missing_folder_is_refused_and_a_new_one_made(tmp_path, capsys, monkeypatch):
    """One rule for output folders (as kvlab eval --out-dir, bench --results-dir): --out is made if new, but only
    in a folder that exists. A typo'd parent made every missing folder and drew the figures there; now it is
    refused before any work, exit 2, naming --out and the missing folder."""
    import kvlab.figures

    drawn = []
    monkeypatch.setattr(kvlab.figures, "write_figures", lambda out, **k: drawn.append(out) or {})
    out = tmp_path / "missing" / "f"
    assert main(["figures", "--out", str(out), "--no-probe", "--no-append"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"kvlab figures: error: --out {out}: folder {out.parent} does not exist" in err, err
    assert not drawn and list(tmp_path.iterdir()) == []
    assert main(["figures", "--out", str(tmp_path / "new"), "--no-probe", "--no-append", "--json"]) == 0
    assert (tmp_path / "new").is_dir() and len(drawn) == 1  # drawn in a staging folder beside it, then moved in
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]
    monkeypatch.chdir(tmp_path)
    assert main(["figures", "--no-probe", "--no-append", "--json"]) == 0  # the default ./figures, made on a first run
    assert (tmp_path / "figures").is_dir()


@pytest.mark.parametrize(
    "argv, said",
    [
        (["report", "/dev/null"], "kvlab report: error: /dev/null is a character device, not a regular file"),
        (
            ["figures", "--result", "/dev/null", "--no-probe", "--no-append"],
            "kvlab figures: error: --result /dev/null is a character device, not a regular file",
        ),
        (["figures", "--sweep", "/dev/zero", "--no-probe"], "--sweep /dev/zero is a character device"),
    ],
)
def test_a_device_given_as_an_input_file_is_named_as_such(tmp_path, monkeypatch, capsys, argv, said):
    """`kvlab report /dev/null` said "no result file at /dev/null": it is there, and not a regular file."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert said in err and "no result file" not in err, err
    assert list(tmp_path.iterdir()) == []  # figures made no folder
