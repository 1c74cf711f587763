"""``kvlab bench docs`` prints each target verdict under the record it judges: the two documented decode records
(1 and 2 threads) judge the same targets, and their lines were printed one after the other with nothing telling
them apart, so the screen seemed to repeat itself."""

import json
from pathlib import Path

from kvlab.cli import main

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"


def test_verdicts_are_grouped_under_their_record(tmp_path, capsys):
    argv = ["bench", "docs", "--results-dir", str(RESULTS), "--out", str(tmp_path / "P.md")]
    assert main([*argv, "--json"]) == 0
    verdicts = json.loads(capsys.readouterr().out)["targets"]
    assert main([*argv[:-1], str(tmp_path / "Q.md")]) == 0
    lines = capsys.readouterr().out.splitlines()
    headers = [line for line in lines if not line.startswith(" ")]
    files = {t["file"] for t in verdicts}
    assert len(headers) == len(set(headers)) >= 2  # each record once
    assert {h.split(" (")[0] for h in headers} == {("no record" if f == "-" else f) for f in files}
    group: list[str] = []
    for line in [*lines, "end:"]:
        if not line.startswith(" "):
            descriptions = [g.split("  ")[1] for g in (x.strip() for x in group)]
            assert len(descriptions) == len(set(descriptions)), group  # no target twice under one record
            group = []
        else:
            group.append(line)
    assert sum(line.startswith("  ") for line in lines) == len(verdicts)
