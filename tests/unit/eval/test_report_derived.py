"""kvlab report printed derived numbers that were not the ones judged: a cache_bytes_ratio edited to 1.5 printed
"1.500 ✓" (the memory gate is judged on cache_bytes_saved), a recall_accuracy edited to 0.1 printed "0.100 ✓"
(the gate is on recall_drop), summary.eligible_candidate_count 0 above four eligible rows. Now each derived field
is checked against the fields it derives from (kvlab.eval.schema_derived) and the file is refused, naming the
file, the row, the field and both numbers."""

import json
import math
import re
from pathlib import Path

import pytest

from kvlab.cli import main

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "eval-smollm2-default-cpu-2026-12-02.json"


def _result() -> dict:
    return json.loads(EXAMPLE.read_text(encoding="utf-8"))


def _set(path, value):
    def change(r):
        *head, last = path
        target = r
        for key in head:
            target = target[key]
        target[last] = value

    return change


def _derived(path):
    """What the edited field derives from, computed from the example itself (not a stored answer)."""
    r = _result()
    rows = r["rows"]
    if path[-1] == "eligible_candidate_count":
        return sum(1 for x in rows if x["matrix"] == "capacity" and x["candidate"] != "dynamic" and x["eligible"])
    row = rows[path[1]]
    base = next(x for x in rows if x["candidate"] == "dynamic" and x["matrix"] == row["matrix"]
                and x["context_length"] == row["context_length"])
    return {
        "cache_bytes_ratio": row["cache_bytes"] / base["cache_bytes"],
        "cache_bytes_saved": base["cache_bytes"] - row["cache_bytes"],
        "recall_accuracy": row["recall"]["accuracy"],
        "recall_drop": max(b["accuracy"] - d["accuracy"]
                           for b, d in zip(base["recall"]["distances"], row["recall"]["distances"])),
        "nll_delta": row["mean_nll"] - base["mean_nll"],
        "dynamic_cache_bytes": base["cache_bytes"],
    }[path[-1]]


@pytest.mark.parametrize(
    "path, value, where",
    [
        (("rows", 1, "cache_bytes_ratio"), 1.5, 'rows[1] ("kivi-4" at context 512).cache_bytes_ratio: 1.5'),
        (("rows", 1, "recall_accuracy"), 0.1, 'rows[1] ("kivi-4" at context 512).recall_accuracy: 0.1'),
        (("rows", 1, "recall_drop"), 0.0, 'rows[1] ("kivi-4" at context 512).recall_drop: 0.0'),
        (("rows", 1, "cache_bytes_saved"), 1, 'rows[1] ("kivi-4" at context 512).cache_bytes_saved: 1'),
        (("rows", 16, "nll_delta"), 0.9, 'rows[16] ("kivi-4" at context 512).nll_delta: 0.9'),  # a window row
        (("rows", 1, "nll_delta"), 0.0, 'rows[1] ("kivi-4" at context 512).nll_delta: 0.0'),
        (("rows", 1, "dynamic_cache_bytes"), 1, 'rows[1] ("kivi-4" at context 512).dynamic_cache_bytes: 1'),
        (("summary", "eligible_candidate_count"), 0, "summary.eligible_candidate_count: 0"),
    ],
)
def test_a_derived_field_that_does_not_follow_is_refused(tmp_path, capsys, path, value, where):
    result = _result()
    stored = result["summary"][path[1]] if path[0] == "summary" else result["rows"][path[1]][path[2]]
    assert stored != value  # an edit, not the number the file holds
    _set(path, value)(result)
    file = tmp_path / "m.json"
    file.write_text(json.dumps(result))
    assert main(["report", str(file)]) == 2
    out, err = capsys.readouterr()
    err = " ".join(err.split())
    assert out == ""
    assert str(file) in err
    assert where in err, err
    derived = _derived(path)
    if isinstance(derived, int):
        assert f"(derived: {derived!r})" in err, err
    else:  # a float at 6 significant digits (0.0322581, not 0.032258064516129004), close to the derivation
        shown = re.search(r"\(derived: ([^)]*)\)", err).group(1)
        assert len(shown.lstrip("-0.").replace(".", "")) <= 6, err
        assert math.isclose(float(shown), derived, rel_tol=1e-5), err


def test_the_unedited_example_reports(capsys):
    assert main(["report", str(EXAMPLE)]) == 0, capsys.readouterr().err


def _refused(tmp_path, capsys, result) -> str:
    file = tmp_path / "m.json"
    file.write_text(json.dumps(result))
    assert main(["report", str(file)]) == 2
    return " ".join(capsys.readouterr().err.split())


def test_both_numbers_are_readable_and_still_differ(tmp_path, capsys):
    """The refusal printed 0.032258064516129004 and the operands at 17 digits: now 6 significant digits, more only
    where 6 would print the stored and the derived number alike."""
    result = _result()
    row = result["rows"][1]
    base = next(x for x in result["rows"] if x["candidate"] == "dynamic" and x["context_length"] == 512
                and x["matrix"] == row["matrix"])
    drop = _derived(("rows", 1, "recall_drop"))
    assert repr(drop) == "0.032258064516129004"  # the example's own derivation (1 / 31 less float rounding)
    row["recall_drop"] = 0.03225806  # off in the 8th digit: 0.0322581 both at 6 digits
    row["nll_delta"] = 0.0
    err = _refused(tmp_path, capsys, result)
    assert "recall_drop: 0.03225806 does not follow" in err and "(derived: 0.032258065)" in err, err
    assert "nll_delta: 0.0 does not follow from mean_nll 0.926682 - the float cache's 0.940702 " \
        "(derived: -0.0140207)" in err, err
    assert f"{row['mean_nll']!r}" not in err and f"{base['mean_nll']!r}" not in err


def test_a_mark_names_its_number_at_a_readable_precision(tmp_path, capsys):
    result = _result()
    result["rows"][1]["gates"]["nll_delta"] = False  # judged again: true (-0.014020709961187094 <= 0.5)
    err = _refused(tmp_path, capsys, result)
    assert "gates.nll_delta: false does not follow from the row's nll_delta -0.0140207 and gates.max_nll_delta " \
        "0.5 (judged again: true)" in err, err


def test_two_numbers_are_shown_at_the_fewest_digits_that_tell_them_apart():
    from kvlab.eval.schema_derived import shown_apart

    assert shown_apart(0.5, 0.5026086956521739) == ("0.5", "0.502609")
    assert shown_apart(0.03225806, 0.032258064516129004) == ("0.03225806", "0.032258065")
    assert shown_apart(1.0, 1.0 + 2**-52) == ("1.0", "1.0000000000000002")  # 17 digits where nothing less differs
    assert shown_apart(0.0, 2e-12) == ("0.0", "2e-12")
    assert shown_apart(3, 4) == ("3", "4")  # ints as they are
    assert shown_apart(None, 0.25) == ("None", "0.25")
