"""A trace CSV row :class:`kvlab.paging.trace.Trace` refuses is named by its file and line: a prompt or output of 0
tokens, an arrival before step 0 or not finite, a prefix outside its prompt (these were refused as "prompt and
output must be >= 1 token, got min prompt 0" or "`arrival_step` must be >= 0 and sorted", no row named). Lines are
the file's, blank lines counted (they were rows of the CSV reader, which skips blank lines)."""

from __future__ import annotations

import json

import pytest

from kvlab.cli import main
from kvlab.paging.trace import load_trace, read_trace

HEADER = "arrival_step,prompt_tokens,output_tokens,prefix_group,prefix_tokens\n"
GOOD = "0,100,10,-1,0\n"


def _write(tmp_path, bad_row: str) -> tuple[str, int]:
    """A trace whose third request is ``bad_row``, after a blank line: ``(path, the bad row's line)``."""
    rows = [HEADER, GOOD, "\n", GOOD, bad_row + "\n"]
    path = tmp_path / "t.csv"
    path.write_text("".join(rows))
    return str(path), len(rows)


@pytest.mark.parametrize(
    "bad_row, column, written",
    [
        ("1,0,10,-1,0", "prompt_tokens", "'0'"),
        ("1,100,0,-1,0", "output_tokens", "'0'"),
        ("-1,100,10,-1,0", "arrival_step", "'-1'"),
        ("-0.5,100,10,-1,0", "arrival_step", "'-0.5'"),
        ("inf,100,10,-1,0", "arrival_step", "'inf'"),
        ("1,100,10,3,101", "prefix_tokens", "'101'"),
        ("1,100,10,3,-2", "prefix_tokens", "'-2'"),
        ("1,100,10,-3,50", "prefix_group", "'-3'"),  # was read as no group: its 50-token prefix dropped silently
    ],
)
def test_a_refused_row_is_named_by_file_and_line(tmp_path, capsys, bad_row, column, written):
    path, line = _write(tmp_path, bad_row)
    with pytest.raises(ValueError) as info:
        load_trace(path)
    assert f"{path}: line {line}: `{column}`" in str(info.value)
    assert written in str(info.value)
    assert main(["paging", "simulate", "--trace", path]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--trace {path}: line {line}: `{column}`" in err and written in err, err


def test_lines_count_blank_lines(tmp_path):
    path, line = _write(tmp_path, "1,abc,10,-1,0")
    with pytest.raises(ValueError, match=f"line {line}: `prompt_tokens` must be a number"):
        load_trace(path)


def test_read_trace_gives_each_request_its_line(tmp_path):
    path = tmp_path / "t.csv"
    rows = [HEADER, "5,100,10,-1,0\n", "\n", "2,200,10,-1,0\n", "9,300,10,-1,0\n"]
    path.write_text("".join(rows))
    read = read_trace(path)
    # sorted by arrival: the request of line 4 (arrival 2) first; each prompt is its row's
    assert read.lines.tolist() == [4, 2, 5]
    assert read.trace.prompt_tokens.tolist() == [int(rows[i - 1].split(",")[1]) for i in read.lines.tolist()]


def test_an_unsorted_trace_is_replayed_by_arrival_and_said_so(tmp_path, capsys):
    """Rows out of arrival order were sorted silently: now a note names the first row arriving before the row
    above it, and the run is the run of the same rows in arrival order."""
    rows = ["0,100,10,-1,0\n", "5,60,10,-1,0\n", "\n", "2,80,10,-1,0\n", "7,40,10,-1,0\n"]
    unsorted, ordered = tmp_path / "unsorted.csv", tmp_path / "ordered.csv"
    unsorted.write_text(HEADER + "".join(rows))
    ordered.write_text(HEADER + "".join(sorted((r for r in rows if r.strip()), key=lambda r: float(r.split(",")[0]))))
    note = read_trace(unsorted).order_note()
    assert "line 5 arrives at step 2, before line 3 above it at step 5" in note, note  # blank line 4 counted
    assert read_trace(ordered).order_note() is None
    results = {}
    for path in (unsorted, ordered):
        assert main(["paging", "simulate", "--trace", str(path), "--json", "--policies", "paged"]) == 0
        out, err = capsys.readouterr()
        results[path] = json.loads(out)
        said = " ".join(err.split())
        assert (f"note: --trace {path}: {note}" in said) == (path == unsorted), err
    assert results[unsorted]["config"]["trace_order_note"] == note
    assert results[ordered]["config"]["trace_order_note"] is None
    timed = ("wall_s", "events_per_s")  # this machine's timing of the run
    same = [{k: v for k, v in r["policies"]["paged"].items() if k not in timed} for r in results.values()]
    assert same[0] == same[1]


def test_the_help_says_how_a_trace_is_replayed(capsys):
    with pytest.raises(SystemExit):
        main(["paging", "simulate", "--help"])
    assert "replayed by arrival time" in " ".join(capsys.readouterr().out.split())


def _trace(arrival, prompt=None, output=None):
    import numpy as np

    from kvlab.paging.trace import Trace

    n = len(arrival)
    return Trace(
        np.array(arrival, dtype=np.float64),
        np.array(prompt or [100] * n),
        np.array(output or [10] * n),
        np.full(n, -1),
        np.zeros(n, dtype=np.int64),
    )


@pytest.mark.parametrize(
    "arrival, prompt, output, message",
    [
        ([0, 1, 5, 2, 1], None, None, "request 3: `arrival_step` 2 is before request 2's 5: a trace is sorted by "
         "arrival"),
        ([0, 1.5, 1.25], None, None, "request 2: `arrival_step` 1.25 is before request 1's 1.5"),
        ([0, -1, -2], None, None, "request 1: `arrival_step` must be >= 0 (engine steps from the start of the "
         "trace), got -1"),
        ([-0.5, 1], None, None, "request 0: `arrival_step` must be >= 0"),
        ([0, 1, float("nan")], None, None, "request 2: `arrival_step` must be a finite number of engine steps, got "
         "nan"),
        ([0, float("inf")], None, None, "request 1: `arrival_step` must be a finite number of engine steps, got inf"),
        ([0, 1, 2], [100, 0, 5], None, "request 1: `prompt_tokens` must be >= 1 token, got 0"),
        ([0, 1, 2], None, [10, 10, -3], "request 2: `output_tokens` must be >= 1 token, got -3"),
    ],
)
def test_the_trace_class_names_the_request_it_refuses_and_its_value(arrival, prompt, output, message):
    """The library class refused "`arrival_step` must be >= 0 and sorted" and "got min prompt 0": which request
    of a million, and what value, was left to the caller. It names the request's index and value, as the CSV
    reader names a file's line."""
    with pytest.raises(ValueError) as info:
        _trace(arrival, prompt, output)
    assert str(info.value).startswith(message), str(info.value)


def test_a_sorted_trace_with_equal_arrivals_is_taken():
    assert len(_trace([0, 0, 1.5, 1.5, 7])) == 5
