"""kvlab report refuses a result whose stored decision its own rows or cells do not support (file and field named)."""

import copy
import json
from pathlib import Path

import pytest

from kvlab.cli import main

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"


def _report(tmp_path, capsys, name, change):
    result = json.loads((EXAMPLES / name).read_text(encoding="utf-8"))
    change(result)
    path = tmp_path / name
    path.write_text(json.dumps(result))
    code = main(["report", str(path)])
    out, err = capsys.readouterr()
    return code, out, err, path


def _set_decision(value):
    return lambda r: r["summary"].__setitem__("decision", value)


def _drop_rows_of(candidate):
    return lambda r: r.__setitem__("rows", [x for x in r["rows"] if x["candidate"] != candidate])


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("eval-quick-tova-2026-12-01.json", _set_decision("bogus"), '"bogus" is not a decision kvlab eval makes'),
        (
            "eval-quick-kivi-snapkv-2026-12-01.json",
            _drop_rows_of("kivi-4"),
            'but rows holds no eligible capacity row of "kivi-4" at context 1024',
        ),
        (
            "eval-quick-kivi-snapkv-2026-12-01.json",
            _set_decision("tune_cache_policy"),
            '"tune_cache_policy", but a capacity row passed every gate',
        ),
        (
            "tasks-smollm2-2026-12-03.json",
            lambda r: r.__setitem__("cells", []),
            'decision["fp8-e4m3"].verdict: "accepted" does not follow from the cells (0 cell(s)',
        ),
    ],
)
def test_a_decision_the_rows_do_not_support_is_refused(tmp_path, capsys, name, change, message):
    code, out, err, path = _report(tmp_path, capsys, name, change)
    assert code == 2 and str(path) in err and message in err
    assert "decision:" not in out and "accepted" not in out


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("eval-*.json")) + ["tasks-smollm2-2026-12-03.json"])
def test_every_committed_example_still_reports(tmp_path, capsys, name):
    code, out, err, _ = _report(tmp_path, capsys, name, copy.deepcopy)
    assert code == 0, err
