"""The sweep's cost line counts in words that fit the number: "1 float prefill", "2 float prefills"."""

from __future__ import annotations

import pytest

from kvlab.bench.sensitivity import HALVES
from kvlab.commands.sensitivity import _print_sweep


@pytest.mark.parametrize("n, prefills, forwards", [(1, "1 float prefill of", "1 forward of"), (3, "3 float prefills of", "3 forwards of")])
def test_the_cost_line_says_prefill_for_one_and_prefills_for_more(capsys, n, prefills, forwards):
    result = {
        "formats": ["kivi-4"],
        "kl": {"kivi-4": {h: [0.1, 0.2] for h in HALVES}},
        "bytes": {"saved_per_half": {"kivi-4": 1000}},
        "cost": {"prefills": n, "forwards": n, "context": 512, "continuation": 16, "rows": 2, "seconds": 3.0},
    }
    _print_sweep(result)
    out = " ".join(capsys.readouterr().out.split())
    assert f"cost: {prefills} 512 tokens, {forwards} 16 tokens x 2 rows" in out
