"""A token count past int64 in a workload or trace file (a line 99999999999999999999) was an OverflowError
traceback from numpy; now it is refused naming the file, the line or row, and the value, at
kvlab.paging.static.REQUEST_TOKENS_LIMIT (2**40 tokens); at the limit the file still loads."""

from __future__ import annotations

import pytest

from kvlab.cli import main
from kvlab.paging.static import REQUEST_TOKENS_LIMIT, load_lengths
from kvlab.paging.trace import load_trace

HUGE = "99999999999999999999"


def _refused(capsys, argv, *fragments):
    assert main(["paging", *argv]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.parametrize("value", [HUGE, str(REQUEST_TOKENS_LIMIT + 1)])
def test_a_workload_line_past_the_limit_is_refused(tmp_path, capsys, value):
    path = tmp_path / "j.txt"
    path.write_text(f"100\n{value}\n")
    _refused(capsys, ["static", "--workload", str(path)], f"{path}: line 2:", value, f"{REQUEST_TOKENS_LIMIT:,}")


def test_a_workload_csv_value_past_the_limit_is_refused(tmp_path, capsys):
    path = tmp_path / "j.csv"
    path.write_text(f"prompt_tokens,output_tokens\n10,5\n{HUGE},5\n")
    _refused(capsys, ["static", "--workload", str(path)], f"{path}: line 3: `prompt_tokens`", HUGE)


@pytest.mark.parametrize("column", [1, 2])
def test_a_trace_token_count_past_the_limit_is_refused(tmp_path, capsys, column):
    cells = ["0", "16", "4"]
    cells[column] = HUGE
    path = tmp_path / "t.csv"
    path.write_text("arrival_step,prompt_tokens,output_tokens\n" + ",".join(cells) + "\n")
    name = ("prompt_tokens", "output_tokens")[column - 1]
    _refused(capsys, ["simulate", "--trace", str(path)], f"{path}: line 2: `{name}`", HUGE)


def test_a_length_at_the_limit_still_loads(tmp_path):
    path = tmp_path / "j.txt"
    path.write_text(f"{REQUEST_TOKENS_LIMIT}\n")
    assert load_lengths(path).tolist() == [REQUEST_TOKENS_LIMIT]
    trace = tmp_path / "t.csv"
    trace.write_text(f"arrival_step,prompt_tokens,output_tokens\n0,{REQUEST_TOKENS_LIMIT},1\n")
    assert load_trace(trace).prompt_tokens.tolist() == [REQUEST_TOKENS_LIMIT]
