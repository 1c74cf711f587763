"""Numbers of 10,000 and more in ``kvlab paging`` output and messages carry thousands separators, as kvlab writes
numbers (:func:`kvlab.plan.config_fields.number_text`): "KV budget: 61.04 GiB = 500059 tokens x 131072 B", the
simulation's "31253 x 16" and "132443" recomputed tokens, "--block-size 100000 is larger than --max-len 4096" did
not. A policy name (``paged+keep20000``, typed in --policies) keeps its plain number, and so does a value a refusal
suggests typing (``raise --max-len to at least 12390``): it pastes into any command."""

from __future__ import annotations

import re

import pytest

from kvlab.cli import main

RAW = re.compile(r"(?<![\d,.])\d{5,}(?![\d,])")  # five digits or more, not part of a separated number
SIM = ["simulate", "--requests", "30", "--max-len", "20000", "--prompt-tokens", "10000:12000", "--output-tokens", "10:20"]


def _raw_numbers(text: str) -> list[str]:
    return [line for line in text.splitlines() if RAW.search(line)]


def _run(capsys, argv: list[str], code: int = 0) -> tuple[str, str]:
    assert main(["paging", *argv]) == code
    return capsys.readouterr()


@pytest.mark.parametrize(
    "argv",
    [
        ["static"],
        ["static", "--workload", "heavy", "--kv-dtype", "kivi4", "--requests", "20000", "--max-len", "20000"],
        SIM,
        [*SIM, "--prefix-groups", "2", "--prefix-tokens", "20000", "--max-len", "40000"],
    ],
)
def test_tables_and_lines_have_no_raw_number_of_five_digits(capsys, argv):
    out, err = _run(capsys, argv)
    assert _raw_numbers(out) == [] and _raw_numbers(err) == []


@pytest.mark.parametrize(
    "argv, said",
    [
        (["static", "--block-size", "20000"], "--block-size 20,000 is larger than --max-len 4,096"),
        ([*SIM, "--max-len", "10000"], "exceeds --max-len 10,000 (the longest generated request: --prompt-tokens "
         "10,000:12,000 + --prefix-tokens 512 + --output-tokens 10:20); raise --max-len to at least 12390 or"),
        ([*SIM, "--keep-tokens", "20000"], "--keep-tokens 20,000 is not below the longest request"),
    ],
)
def test_refusals_separate_their_numbers(capsys, argv, said):
    _, err = _run(capsys, argv, code=2)
    err = " ".join(err.split())
    assert said in err, err
    err = re.sub(r"to at least \d+ or", "", err)  # a suggested value: plain
    assert [line for line in _raw_numbers(err) if "paged+keep" not in line] == [], err


def test_the_simulation_table_explains_its_two_fractions(capsys):
    """'memory in use' (59.8 %) beside 'slot utilization' (99.64 %) read as a contradiction to a new user: a legend
    under the table says what each row divides."""
    from kvlab.cli import main
    from kvlab.commands.paging import SIMULATION_LEGEND

    assert main(["paging", "simulate", "--requests", "20"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert " ".join(SIMULATION_LEGEND.split()) in out
    for row in ("slot utilization", "memory in use", "queue delay", "tokens / step", "events / s"):
        assert f"│ {row}" in out or f"{row} " in out
        assert f"{row.split(' (')[0]} =" in SIMULATION_LEGEND or f"{row} =" in SIMULATION_LEGEND
