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


def test_bench_kernel_names_a_bad_setting_before_measuring(tmp_path, monkeypatch, capsys):
    """A zero head count divided by zero, a negative copy size crashed inside torch, and an impossible nbits or
    backend ran every cell to a failed row, exited 0 and saved the record: each is refused up front now."""
    import pytest

    from kvlab.bench import kernel

    monkeypatch.setattr(kernel, "copy_bandwidth", lambda *a, **k: pytest.fail("measured before checking"))
    base = ["bench", "kernel", "--contexts", "256", "--reps", "1", "--results-dir", str(tmp_path)]
    names = {"--nbits": "nbits", "--group-size": "group_size", "--residual-length": "residual_length"}
    for flag, value in [
        ("--kv-heads", "0"),
        ("--q-heads", "0"),
        ("--head-dim", "48"),
        ("--copy-mib", "-1"),
        ("--copy-mib", "0"),
        ("--nbits", "3"),
        ("--group-size", "0"),
        ("--residual-length", "100"),
        ("--backend", "foo"),
    ]:
        assert main([*base, flag, value]) == 2, flag
        err = capsys.readouterr().err
        assert "error:" in err and names.get(flag, flag) in err, (flag, err)
    assert list(tmp_path.iterdir()) == []  # nothing saved
