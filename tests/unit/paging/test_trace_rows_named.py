"""A trace CSV row :class:`kvlab.paging.trace.Trace` refuses is named by its file and line: a prompt or output of 0
tokens, an arrival before step 0 or not finite, a prefix outside its prompt (these were refused as "prompt and
output must be >= 1 token, got min prompt 0" or "`arrival_step` must be >= 0 and sorted", no row named). Lines are
the file's, blank lines counted (they were rows of the CSV reader, which skips blank lines)."""

from __future__ import annotations

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
