"""kvlab.runtime.checks: the one count check, the one one-integer flag type and the one comma-list parser every part
of kvlab uses."""

from __future__ import annotations

import argparse
import re

import numpy as np
import pytest

from kvlab.runtime.checks import (
    ListError,
    check_int,
    float_list,
    int_flag,
    int_list,
    is_int,
    parse_list,
    read_int,
)


@pytest.mark.parametrize("value", [True, False, 1.0, "4", None, np.bool_(True), 0, -3])
def test_check_int_refuses_bools_non_integers_and_values_below_the_minimum(value):
    with pytest.raises(ValueError, match=r"`block_size` must be an int >= 1, got "):
        check_int("block_size", value, 1)


def test_check_int_returns_a_python_int_for_python_and_numpy_integers():
    assert check_int("n", 0) == 0
    got = check_int("n", np.int64(7), 7)
    assert got == 7 and type(got) is int
    assert is_int(3) and is_int(np.int32(3)) and not is_int(True) and not is_int(3.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("256,,512", "empty item in '256,,512'"),
        ("256,", "empty item in '256,'"),
        ("", "expected a comma-separated list, got ''"),
        ("  ", "expected a comma-separated list"),
        ("1,x", "'x' in '1,x' is not an integer >= 1"),
        ("0,4", "'0' in '0,4' is not an integer >= 1"),
        ("4,4", "'4' is given twice in '4,4'"),
    ],
)
def test_int_list_refuses_with_a_message_naming_the_value(text, message):
    with pytest.raises(ListError, match=message):
        int_list(text)


def test_lists_read_commas_and_spaces():
    assert int_list("256, 512 ,1024 2048") == [256, 512, 1024, 2048]
    assert int_list("0,3", minimum=0) == [0, 3]
    assert int_list("4,4", unique=False) == [4, 4]
    assert float_list("0, 0.5,1") == [0.0, 0.5, 1.0]
    assert parse_list("dynamic,kivi-4") == ["dynamic", "kivi-4"]
    with pytest.raises(ListError, match="'nan' in '0,nan' is not a finite number"):
        float_list("0,nan")


def test_a_list_error_is_a_value_error_and_argparse_prints_its_message(capsys):
    assert issubclass(ListError, ValueError) and issubclass(ListError, argparse.ArgumentTypeError)
    parser = argparse.ArgumentParser(prog="kvlab")
    parser.add_argument("--contexts", type=int_list)
    assert parser.parse_args(["--contexts", "256,512"]).contexts == [256, 512]
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--contexts", "256,,512"])
    assert exc.value.code == 2
    assert "kvlab: error: argument --contexts: empty item in '256,,512'" in capsys.readouterr().err


# ── one integer typed on the command line ────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("text", "value"),
    [("6000", 6000), ("6_000", 6000), ("6,000", 6000), ("1,048,576", 1048576), (" 42 ", 42), ("-1,000", -1000),
     ("999", 999), ("0", 0)],
)
def test_read_int_reads_plain_underscored_and_comma_grouped_digits(text, value):
    got = read_int(text)
    assert got == value and type(got) is int


@pytest.mark.parametrize("text", ["6,00", "60,00", "6,0000", "1,000_000", ",000", "6,", "1,,000", "1, 000"])
def test_read_int_refuses_commas_that_do_not_group_by_threes_naming_the_value(text):
    with pytest.raises(ValueError) as info:
        read_int(text)
    assert f"got {text!r}: commas must group its digits by threes" in str(info.value)


@pytest.mark.parametrize("text", ["x", "", "6.5", "1e3", "0x10"])
def test_read_int_refuses_what_is_not_an_integer_naming_the_value(text):
    with pytest.raises(ValueError, match=f"^expected a whole number, got {re.escape(repr(text))}$"):
        read_int(text)


def _parse_error(capsys, kind, value: str) -> str:
    parser = argparse.ArgumentParser(prog="kvlab plan")
    parser.add_argument("--context", type=kind)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--context", value])
    assert exc.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


def test_int_flag_is_an_argparse_type_naming_the_flag_and_the_value(capsys):
    parser = argparse.ArgumentParser(prog="kvlab plan")
    parser.add_argument("--context", type=int_flag())
    assert parser.parse_args(["--context", "6,000"]).context == 6000
    assert parser.parse_args(["--context", "6_000"]).context == 6000
    err = _parse_error(capsys, int_flag(), "6,00")
    assert err == (
        "kvlab plan: error: argument --context: expected a whole number, got '6,00': commas must group its digits "
        "by threes (6,000; 1,048,576)"
    )
    assert _parse_error(capsys, int_flag(1), "0") == (
        "kvlab plan: error: argument --context: expected a whole number >= 1, got '0'"
    )
    assert _parse_error(capsys, int_flag(1), "x") == (
        "kvlab plan: error: argument --context: expected a whole number >= 1, got 'x'"
    )
    assert _parse_error(capsys, int_flag(below=2**62), str(2**62)) == (
        f"kvlab plan: error: argument --context: must be below 2**62 in magnitude, got '{2**62}'"
    )
    assert int_flag(below=2**62)(str(2**62 - 1)) == 2**62 - 1 and int_flag(1)("1") == 1
