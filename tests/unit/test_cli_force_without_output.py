"""Flags that only steer an output nothing writes are refused, not silently ignored."""

import pytest

from kvlab.cli import main

EVAL = "docs/examples/eval-quick-tova-2026-12-01.json"


@pytest.mark.parametrize(
    "argv, said",
    [
        (["bench", "decode", "--quick", "--no-save", "--results-dir", "elsewhere"], "--results-dir has no effect with --no-save"),
        (["report", EVAL, "--force"], "--force has no effect without --html: no file is written for it to replace"),
        (["inspect", "--force"], "--force has no effect without --json or --figure"),
        (["inspect", "--json", "--force"], "--force has no effect without --json or --figure"),
    ],
)
def test_a_flag_for_an_output_nothing_writes_is_refused(capsys, monkeypatch, argv, said):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[2])
    assert main(argv) == 2
    assert said in capsys.readouterr().err


def test_report_html_into_a_missing_folder_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[2])
    out = tmp_path / "missing" / "x.html"
    assert main(["report", EVAL, "--html", str(out)]) == 2
    assert f"--html {out}: folder {out.parent} does not exist" in capsys.readouterr().err
    assert not out.parent.exists()
