"""Default record names tell the runs of one benchmark apart: the documented ``kvlab bench decode`` runs
wrote the same ``decode-cpu.json``, so the second failed "already exists"."""

from __future__ import annotations

import re

from kvlab.bench import results
from kvlab.cli import main


def test_default_record_names_tell_runs_apart():
    assert results.run_tags() == []
    assert results.run_tags(["dynamic", "fp8-e4m3", "fp8-e4m3-hadamard"], 1) == [
        "dynamic+fp8-e4m3+fp8-e4m3-hadamard",
        "1thread",
    ]
    assert results.run_tags(["dynamic", "sink:window_length=128"], 2) == [
        "dynamic+sink_window_length=128",
        "2threads",
    ]
    long = results.run_tags([f"kivi-4:token_budget={n}" for n in range(100, 120)])[0]
    assert len(long) == results.MAX_TAG and re.fullmatch(r"[A-Za-z0-9.+=_-]+-[0-9a-f]{8}", long)
    path = results.default_path("r", "decode", "cpu", True, ["dynamic+fp8-e4m3", "1thread"])
    assert path.as_posix() == "r/decode-cpu-dynamic+fp8-e4m3-1thread-quick.json"
    assert results.default_path("r", "decode", "cpu", False).as_posix() == "r/decode-cpu.json"


def test_the_documented_decode_runs_write_two_records(tmp_path, monkeypatch, capsys):
    """`kvlab bench decode` and `kvlab bench decode --candidates dynamic,fp8-e4m3,...` wrote the same default file:
    the second failed "already exists"."""
    monkeypatch.setattr("kvlab.bench.decode.run", lambda **kw: {"device_type": "cpu", "rows": []})
    base = ["bench", "decode", "--device", "cpu", "--json", "--results-dir", str(tmp_path)]
    assert main(base) == 0
    assert main([*base, "--candidates", "dynamic,fp8-e4m3,fp8-e4m3-hadamard"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "decode-cpu-dynamic+fp8-e4m3+fp8-e4m3-hadamard.json",
        "decode-cpu.json",
    ]
    assert main(base) == 2  # the same run again: kept, as before
    assert "decode-cpu.json already exists" in capsys.readouterr().err
