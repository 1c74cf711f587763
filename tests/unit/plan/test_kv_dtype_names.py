"""The --kv-dtype names of kvlab plan and kvlab paging come from the planner's ledger, and the planner reads each."""

from __future__ import annotations

import pytest

from kvlab.cli import build_parser
from kvlab.plan.kv_formats import FP8_CACHES, KIVI_NBITS, KV_DTYPE_NAMES, kv_dtype


@pytest.mark.parametrize("name", KV_DTYPE_NAMES)
def test_every_listed_name_is_read_by_the_planner(name):
    kvd = kv_dtype(name, "bfloat16")
    assert kvd.bytes_per_element > 0


def test_the_list_covers_every_fp8_cache_and_kivi_bit_pair():
    assert set(FP8_CACHES) <= set(KV_DTYPE_NAMES)
    for k in KIVI_NBITS:
        assert f"kivi-{k}" in KV_DTYPE_NAMES and f"kivi{k}" in KV_DTYPE_NAMES
        for v in KIVI_NBITS:
            if k != v:
                assert f"kivi-k{k}v{v}" in KV_DTYPE_NAMES
    assert len(set(KV_DTYPE_NAMES)) == len(KV_DTYPE_NAMES)


def _option(argv_prefix: list[str], dest: str):
    parser = build_parser()
    sub = parser
    for word in argv_prefix:
        action = next(a for a in sub._actions if a.choices and word in a.choices)
        sub = action.choices[word]
    return next(a for a in sub._actions if a.dest == dest)


@pytest.mark.parametrize("command", [["plan"], ["roofline"], ["video"]])
def test_planner_commands_offer_exactly_the_ledger_names(command):
    """Each planner command offers the ledger's names; ``kvlab plan`` also the pattern of its per-layer plans."""
    extra = ("mixed-<plan>",) if command == ["plan"] else ()
    assert tuple(_option(command, "kv_dtype").choices) == (*KV_DTYPE_NAMES, *extra)


@pytest.mark.parametrize(
    ("command", "dest"), [(["paging", "static"], "kv_dtype"), (["paging", "simulate"], "quant_kv_dtype")]
)
def test_paging_help_lists_the_ledger_names(command, dest):
    help_text = _option(command, dest).help
    assert all(name in help_text for name in KV_DTYPE_NAMES)
