"""A request longer than the contiguous reservation (``--max-len``) is refused naming the file, the line and the flag
that would fix it: ``kvlab paging static --workload FILE`` said only "a request of 5010 tokens exceeds the
contiguous reservation 4096", and ``kvlab paging simulate --trace FILE`` named the file but not the line. The value
it suggests is printed plain (``raise --max-len to at least 1500``, not ``1,500``) and, pasted back, is accepted."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab.cli import main
from kvlab.paging.budget import default_budget
from kvlab.paging.static import read_lengths, static_capacity

MAX_LEN = 1000


def _error(capsys, argv) -> str:
    assert main(["paging", *argv]) == 2
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(
    "name, rows",
    [
        ("list.txt", ["100", "", f"{MAX_LEN + 10}", f"{MAX_LEN + 500}", "7"]),
        ("lengths.csv", ["tokens", "100", "", f"{MAX_LEN + 10}", f"{MAX_LEN + 500}", "7"]),
        ("trace.csv", ["prompt_tokens,output_tokens", "90,10", "", f"{MAX_LEN},10", f"{MAX_LEN + 490},10", "5,2"]),
    ],
)
def test_a_workload_request_past_max_len_names_file_line_and_flag(tmp_path, capsys, name, rows):
    path = tmp_path / name
    path.write_text("\n".join(rows) + "\n")
    lengths, lines = read_lengths(path)
    first, longest = int(np.argmax(lengths > MAX_LEN)), int(lengths.argmax())
    assert rows[lines[first] - 1] and rows[lines[longest] - 1]  # lines of the file (1-based, blank line counted)
    err = _error(capsys, ["static", "--workload", str(path), "--max-len", str(MAX_LEN)])
    assert f"--workload {path}: line {lines[first]}: a request of {lengths[first]:,} tokens" in err, err
    assert f"--max-len {MAX_LEN:,}" in err, err
    assert f"raise --max-len to at least {lengths.max()} tokens (the longest request, line {lines[longest]})" in err
    assert main(["paging", "static", "--workload", str(path), "--max-len", str(lengths.max())]) == 0


def test_a_trace_request_past_max_len_names_its_line(tmp_path, capsys):
    path = tmp_path / "t.csv"
    path.write_text(f"arrival_step,prompt_tokens,output_tokens\n0,10,5\n\n1,{MAX_LEN},10\n2,20,5\n")
    err = _error(capsys, ["simulate", "--trace", str(path), "--max-len", str(MAX_LEN)])
    assert "exceeds --max-len" in err and f"the longest request: line 4 of --trace {path}" in err, err
    # 1,000 prompt + 10 output tokens hold 1,009 tokens of K/V at most: the last token's K/V is never stored
    assert f"raise --max-len to at least {MAX_LEN + 9} or shorten" in err, err
    assert main(["paging", "simulate", "--trace", str(path), "--max-len", str(MAX_LEN + 9)]) == 0


def test_the_library_names_the_request_and_max_len():
    lens = np.array([10, MAX_LEN + 1, MAX_LEN + 7])
    with pytest.raises(ValueError, match=f"request 1 .* `max_len` {MAX_LEN:,} .* {MAX_LEN + 7:,} tokens"):
        static_capacity(lens, default_budget(), max_len=MAX_LEN)
