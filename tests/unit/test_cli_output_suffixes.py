"""Every writer of a file of one format refuses a name with another suffix, before any work, naming the path and the
suffix it expects (:func:`kvlab.commands.suffix_problem`): ``kvlab report --html r.txt`` wrote an HTML page into
r.txt and ``kvlab tasks --out x.txt`` a JSON result that nothing reading ``*.json`` finds, while the figure writers
already insisted on .png/.svg/.pdf. The right suffix in any case passes; ``paging simulate --save-trace`` (a CSV
under any name) stays free."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.commands import suffix_problem

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_RESULT = ROOT / "docs" / "examples" / "eval-default-cpu-2026-12-01.json"
RECORDS = ROOT / "benchmarks" / "results"

# writer -> (command, its arguments (NAME: the output file), the flag, what the name must end in)
WRITERS = {
    "report --html": ("report", [str(EXAMPLE_RESULT), "--html", "NAME"], "--html", ".html or .htm"),
    "tasks --out": ("tasks", ["--dry-run", "--out", "NAME"], "--out", ".json"),
    "tasks --figure": ("tasks", ["--dry-run", "--figure", "NAME"], "--figure", ".png"),
    "sensitivity sweep --out": ("sensitivity sweep", ["--out", "NAME"], "--out", ".json"),
    "bench lab --out": ("bench lab", ["--quick", "--out", "NAME"], "--out", ".json"),
    "bench docs --out": ("bench docs", ["--results-dir", str(RECORDS), "--out", "NAME"], "--out", ".md"),
    "inspect --json": ("inspect", ["--json", "NAME"], "--json", ".json"),
    "inspect --figure": ("inspect", ["--figure", "NAME"], "--figure", ".png"),
    "paging figure --out": ("paging figure", ["--out", "NAME"], "--out", ".png, .svg or .pdf"),
}


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("name", ["out.txt", "out"])
def test_a_writer_refuses_a_name_with_another_suffix_naming_path_and_suffix(writer, name, tmp_path, monkeypatch):
    import kvlab.commands.sensitivity as sensitivity

    def never(*args, **kwargs):
        raise AssertionError("work started before the output name was checked")

    monkeypatch.setattr(sensitivity, "_measure", never)
    command, args, flag, expected = WRITERS[writer]
    path = tmp_path / name
    code, err = _run([*command.split(), *[str(path) if a == "NAME" else a for a in args]])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err  # one line, no traceback
    assert lines[0].startswith(f"kvlab {command}: error: {flag} {path} must end in {expected} ("), lines
    assert lines[0].endswith(f"), got {path.suffix or 'no suffix'}"), lines
    assert not path.exists()


def test_the_expected_suffix_in_any_case_passes_and_the_rest_is_named():
    assert suffix_problem("--html", "r.HTML", (".html", ".htm"), "the report is an HTML page") is None
    assert suffix_problem("--html", "r.htm", (".html", ".htm"), "the report is an HTML page") is None
    assert suffix_problem("--out", "x.json.txt", (".json",), "the result is JSON") == (
        "--out x.json.txt must end in .json (the result is JSON), got .txt"
    )


def test_the_right_suffix_writes(tmp_path):
    page = tmp_path / "r.html"
    assert _run(["report", str(EXAMPLE_RESULT), "--html", str(page)])[0] == 0
    assert page.read_text().lstrip().lower().startswith("<!doctype html")
    figure = tmp_path / "f.svg"
    assert _run(["paging", "figure", "--out", str(figure)])[0] == 0 and figure.is_file()


def test_an_existing_file_is_refused_as_existing_before_its_suffix(tmp_path):
    """One order for every writer: an existing file without --force is kept and said to exist (the status of an
    existing output, tests/unit/test_cli_errors.py); with --force the suffix is checked before anything is
    replaced."""
    existing = tmp_path / "existing.txt"
    existing.write_text("kept\n")
    code, err = _run(["report", str(EXAMPLE_RESULT), "--html", str(existing)])
    assert code == 2 and "already exists" in err, err
    code, err = _run(["report", str(EXAMPLE_RESULT), "--html", str(existing), "--force"])
    assert code == 2 and f"--html {existing} must end in .html or .htm" in err, err
    assert existing.read_text() == "kept\n"


def test_a_saved_trace_keeps_any_name(tmp_path):
    trace = tmp_path / "trace.txt"
    assert _run(["paging", "simulate", "--requests", "5", "--save-trace", str(trace)])[0] == 0
    assert trace.read_text().startswith("arrival_step,")
