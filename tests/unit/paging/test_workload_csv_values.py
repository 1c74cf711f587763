"""A workload CSV's missing values and numbers written with thousands separators (``kvlab paging static
--workload``). A short row was refused "`output_tokens` must be an integer, got None"; ``1,000`` was refused
"got columns []" (a file of one such line) or, under a ``tokens`` header, silently read as 1 (the rest of the number
an ignored extra field). Each is now refused naming the file and line and saying what is wrong."""

from __future__ import annotations

import pytest

from kvlab.cli import main
from kvlab.paging.static import load_lengths


@pytest.mark.parametrize(
    "text, said",
    [
        ("prompt_tokens,output_tokens\n10,20\n30\n", "line 3: the `output_tokens` value is missing"),
        ("prompt_tokens,output_tokens\n10,\n", "line 2: the `output_tokens` value is missing"),
    ],
)
def test_a_missing_value_is_named_with_its_line(tmp_path, text, said):
    path = tmp_path / "w.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{path}: {said}$"):
        load_lengths(path)


def test_lines_are_counted_in_the_file_past_blank_lines(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("\n\ntokens\n100\n\n  \n0\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{path}: line 7: `tokens` must be >= 1, got 0$"):
        load_lengths(path)
    path.write_text("\ntokens\n100\n\n 200\n  \n", encoding="utf-8")
    assert load_lengths(path).tolist() == [100, 200]


@pytest.mark.parametrize(
    "text, said",
    [
        ("1,000\n", r"line 1: expected a whole number of tokens \(one per line\), got '1,000'"),
        ("100\n2,048\n", r"line 2: expected a whole number of tokens \(one per line\), got '2,048'"),
        ("tokens\n1,000\n2000\n", r"line 2: 2 fields, the header has 1"),
        ('tokens\n"1,000"\n', r"line 2: `tokens` must be an integer, got '1,000'"),
        ("prompt_tokens,output_tokens\n1,200,300\n", r"line 2: 3 fields, the header has 2"),
    ],
)
def test_thousands_separators_are_said_not_to_be_read(tmp_path, text, said):
    path = tmp_path / "w.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{path}: {said}; thousands separators are not read \(write 1000"):
        load_lengths(path)


def test_the_command_names_the_file_and_line(tmp_path, capsys):
    path = tmp_path / "w.csv"
    path.write_text("prompt_tokens,output_tokens\n10,20\n30\n", encoding="utf-8")
    assert main(["paging", "static", "--workload", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: line 3: the `output_tokens` value is missing" in err and "None" not in err


def test_an_empty_extra_field_is_still_read(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("tokens\n100,\n200\n", encoding="utf-8")
    assert load_lengths(path).tolist() == [100, 200]
