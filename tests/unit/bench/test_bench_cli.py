"""`kvlab bench`: records written atomically and never silently replaced, the recorded command, `docs`."""

import contextlib
import io
import json

from kvlab.cli import main
from kvlab.commands import EXIT_FILE_EXISTS


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue()


def test_bench_writes_refuses_and_forces(tmp_path):
    argv = [
        "bench",
        "kernel",
        "--quick",
        "--device",
        "cpu",
        "--contexts",
        "128",
        "--q-heads",
        "4",
        "--kv-heads",
        "2",
        "--head-dim",
        "64",
        "--copy-mib",
        "1",
        "--results-dir",
        str(tmp_path),
        "--json",
    ]
    code, out = _run(argv)
    assert code == 0
    record = json.loads(out)
    path = tmp_path / "kernel-cpu-quick.json"
    assert json.loads(path.read_text()) == record
    assert record["command"] == (
        "kvlab bench kernel --contexts 128 --q-heads 4 --kv-heads 2 --head-dim 64 --copy-mib 1 --quick --device cpu"
    )
    assert record["quick"] is True and record["machine"]["cpu_count"] >= 1
    assert record["result"]["rows"][0]["context"] == 128
    code, _ = _run(argv)
    assert code == EXIT_FILE_EXISTS and json.loads(path.read_text()) == record  # kept
    code, _ = _run(argv + ["--force"])
    assert code == 0 and json.loads(path.read_text())["created_utc"] >= record["created_utc"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_bench_docs_renders_the_records(tmp_path):
    res = tmp_path / "res"
    code, _ = _run(
        [
            "bench",
            "flush",
            "--quick",
            "--device",
            "cpu",
            "--caches",
            "kivi4",
            "--kv-heads",
            "2",
            "--head-dim",
            "64",
            "--results-dir",
            str(res),
            "--out",
            str(res / "flush-cpu.json"),
        ]
    )
    assert code == 0
    page = tmp_path / "PERFORMANCE.md"
    code, out = _run(
        ["bench", "docs", "--results-dir", str(res), "--out", str(page), "--json", "--include-quick"]
    )
    assert code == 0
    verdicts = json.loads(out)["targets"]
    assert any(v["file"] == "flush-cpu.json" for v in verdicts)
    text = page.read_text()
    assert "## `flush` on cpu (quick)" in text and "kvlab bench flush" in text
