"""``kvlab bench`` writes its record only where --results-dir / --out say; by default into ./kvlab-results of the
current directory, never into the checkout's tracked benchmarks/results."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from kvlab.cli import build_parser, main
from kvlab.commands.bench import DEFAULT_RESULTS_DIR

CHECKOUT_RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"


def _run(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    return code, out.getvalue()


def test_default_record_goes_to_kvlab_results_in_the_current_directory(tmp_path, monkeypatch):
    before = sorted(p.name for p in CHECKOUT_RESULTS.iterdir())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("kvlab.commands.bench.unmet_targets", lambda record: [])  # where, not how fast
    code, out = _run(["bench", "paging", "--quick", "--json", "--threads", "1"])
    assert code == 0, out
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json"))
    assert written == [f"{DEFAULT_RESULTS_DIR}/paging-cpu-1thread-quick.json"]  # --threads 1 names the run
    assert json.loads((tmp_path / written[0]).read_text())["benchmark"] == "paging"
    assert sorted(p.name for p in CHECKOUT_RESULTS.iterdir()) == before  # the checkout is untouched


def test_every_run_defaults_outside_the_package_and_docs_reads_the_tracked_records():
    parser = build_parser()
    for bench in ("decode", "memory", "flush", "kernel", "paging", "lab"):
        args = parser.parse_args(["bench", bench])
        assert args.results_dir == DEFAULT_RESULTS_DIR and not Path(args.results_dir).is_absolute()
    assert parser.parse_args(["bench", "docs"]).results_dir == "benchmarks/results"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "paging", "--results-dir", ""], "--results-dir must name a folder, got ''"),
        (["bench", "paging", "--out", ""], "--out must name a file, got ''"),
        (["bench", "docs", "--results-dir", ""], "--results-dir must name a folder, got ''"),
        (["bench", "docs", "--out", " "], "--out must name a file, got ' '"),
    ],
)
def test_an_empty_results_dir_or_out_is_refused_before_anything_runs(argv, message, tmp_path, monkeypatch, capsys):
    """``--results-dir ""`` wrote the record into the current folder (``bench docs`` read its records from there);
    ``--out ""`` was taken for "not given". Both are refused, naming the flag, before the benchmark runs."""
    from kvlab.bench import paging

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(paging, "run", lambda **kw: pytest.fail("the benchmark ran with an empty path"))
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written into the current folder


def test_an_explicit_output_path_in_a_missing_folder_is_refused(tmp_path, monkeypatch, capsys):
    """One rule for output folders (as kvlab report --html, tasks, paging, inspect): an explicit --out is written
    only in a folder that exists, and an explicit --results-dir is made only in a folder that exists. A typo'd
    path made every missing folder of it and ran; now it is refused before any work (exit 2), naming the flag and
    the missing folder, and no folder is made. A new --results-dir in a folder that exists is still made."""
    from kvlab.bench import paging

    ran = []
    monkeypatch.setattr(paging, "run", lambda **kw: ran.append(1))
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "missing"
    small = ["bench", "paging", "--quick"]
    for argv, said in [
        ([*small, "--out", str(missing / "x.json")], f"--out {missing / 'x.json'}: folder {missing} does not exist"),
        (
            [*small, "--results-dir", str(missing / "deep")],
            f"--results-dir {missing / 'deep'}: folder {missing} does not exist",
        ),
        (
            ["bench", "docs", "--results-dir", str(tmp_path), "--out", str(missing / "P.md")],
            f"--out {missing / 'P.md'}: folder {missing} does not exist",
        ),
    ]:
        assert main(argv) == 2, argv
        assert said in capsys.readouterr().err
    assert not ran and list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setattr("kvlab.commands.bench.unmet_targets", lambda record: [])  # where, not how fast
    assert main([*small, "--json", "--results-dir", str(tmp_path / "new")]) == 0
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["paging-cpu-quick.json"]
