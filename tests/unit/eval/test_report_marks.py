"""kvlab report judges each row's stored pass/fail marks again from the row's numbers at the stored gates, as it
judges the stored decision (test_report_decision.py): a hand-edited or stale mark was printed as it was (a ✓ beside
a recall drop of 0.58 over a 0.05 gate; "pass" beside a task score that fell from 0.88 to 0.25); now the file is
refused, naming the file, the row and the field."""

import json
from pathlib import Path

import pytest

from kvlab.cli import main

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"
SNAPKV = "eval-quick-kivi-snapkv-2026-12-01.json"
TASKS = "tasks-bundled-512-2026-12-02.json"


def _refused(tmp_path, capsys, name, change) -> str:
    result = json.loads((EXAMPLES / name).read_text(encoding="utf-8"))
    change(result)
    path = tmp_path / name
    path.write_text(json.dumps(result))
    assert main(["report", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no table with the mark
    assert str(path) in err
    return " ".join(err.split())


def _row(i, key, value):
    return lambda r: r["rows"][i].__setitem__(key, value)


def _mark(i, gate, value):
    return lambda r: r["rows"][i]["gates"].__setitem__(gate, value)


@pytest.mark.parametrize(
    "change, said",
    [
        (  # a failed gate marked as passed, eligible left false
            _mark(2, "recall_drop", True),
            'rows[2] ("kivi-4:compression_ratio=0.5" at context 256).gates.recall_drop: true does not follow from '
            "the row's recall_drop",
        ),
        (  # the gates edited after the run: the marks no longer follow from them
            lambda r: r["gates"].__setitem__("max_kl_mean", 0.0),
            'rows[1] ("kivi-4" at context 256).gates.kl_mean: true does not follow from the row\'s kl_mean',
        ),
        (  # a busy machine's latency is not judged: its gate is null
            _row(1, "latency_trusted", False),
            'rows[1] ("kivi-4" at context 256).gates.latency_ratio: true does not follow from the row\'s '
            "latency_ratio",
        ),
        (
            _row(1, "eligible", False),
            'rows[1] ("kivi-4" at context 256).eligible: false does not follow from its gates (judged again: true)',
        ),
        (
            _mark(1, "recall_drop", None),
            'rows[1] ("kivi-4" at context 256).gates.recall_drop: null does not follow',
        ),
    ],
)
def test_an_eval_row_mark_its_numbers_do_not_give_is_refused(tmp_path, capsys, change, said):
    err = _refused(tmp_path, capsys, SNAPKV, change)
    assert said in err, err
    assert "judged again" in err


def test_a_mark_of_a_number_the_row_lacks_is_refused(tmp_path, capsys):
    def drop_passkey(r):
        del r["rows"][2]["passkey_drop"]

    err = _refused(tmp_path, capsys, SNAPKV, drop_passkey)
    assert 'rows[2] ("kivi-4:compression_ratio=0.5" at context 256).gates.passkey_drop: false, but the row has no ' \
        "passkey_drop to judge" in err


def _gate(i, status):
    return lambda r: r["gates"][i].__setitem__("status", status)


@pytest.mark.parametrize(
    "change, said",
    [
        (
            _gate(1, "pass"),
            'gates[1] ("kivi-2" on niah_single_1@512).status: "pass" does not follow from the cell\'s scores (float '
            '0.875, kivi-2 0.25: a drop of 0.625 at max_drop 0.1, min_float_score 0.5; judged again: "fail")',
        ),
        (_gate(0, "not informative"), 'gates[0] ("kivi-4" on niah_single_1@512).status: "not informative" does not'),
        (lambda r: r["gates"].pop(1), 'gates: lacks the gate of "kivi-2" on niah_single_1@512 (1 measured row(s)'),
        (lambda r: r["gates"].append(dict(r["gates"][0])), 'gates[15] ("kivi-4" on niah_single_1@512): a second gate'),
        (
            lambda r: r["gates"][0].__setitem__("cache", "kivi-8"),
            'gates[0] ("kivi-8" on niah_single_1@512): no cell measured that cache there',
        ),
    ],
)
def test_a_tasks_gate_mark_its_scores_do_not_give_is_refused(tmp_path, capsys, change, said):
    assert said in _refused(tmp_path, capsys, TASKS, change)


SMOLLM2 = "eval-smollm2-default-cpu-2026-12-02.json"


def _gateless(i, eligible):
    def change(r):
        del r["rows"][i]["gates"]
        r["rows"][i]["eligible"] = eligible

    return change


def test_an_eligible_mark_without_its_gates_object_is_judged_from_the_numbers(tmp_path, capsys):
    # rows[2] (kivi-2 at 512) dropped 0.19 of the copy accuracy at a 0.05 gate: printed "eligible", exit 0, once
    # its gates object was deleted (the marks were judged again only where the row had one)
    err = _refused(tmp_path, capsys, SMOLLM2, _gateless(2, True))
    assert 'rows[2] ("kivi-2" at context 512).eligible: true does not follow from its numbers' in err, err
    assert "judged again: false; failed: recall_drop" in err


def test_a_gateless_row_whose_eligible_mark_follows_is_still_reported(tmp_path, capsys):
    result = json.loads((EXAMPLES / SMOLLM2).read_text(encoding="utf-8"))
    assert result["rows"][1]["eligible"] is True
    _gateless(1, True)(result)
    path = tmp_path / SMOLLM2
    path.write_text(json.dumps(result))
    assert main(["report", str(path)]) == 0, capsys.readouterr().err


def _committed_eval_results():
    root = EXAMPLES.parents[1]
    paths = sorted(EXAMPLES.rglob("*.json")) + sorted((root / "benchmarks" / "results").glob("*.json"))
    return [p for p in paths if json.loads(p.read_text(encoding="utf-8")).get("schema_version") == "kvlab.eval/1"]


@pytest.mark.parametrize("path", _committed_eval_results(), ids=lambda p: p.name)
def test_every_committed_eval_result_still_reports(path, capsys):
    assert main(["report", str(path)]) == 0, capsys.readouterr().err
