"""kvlab.bench.cells: the context list and failed-cell record every benchmark's run() shares."""

from __future__ import annotations

import pytest

from kvlab.bench.cells import bench_contexts, failed_cell

DEFAULTS = ((8, 16), (100, 200), (1000, 2000))


@pytest.mark.parametrize(
    ("quick", "device_type", "expected"),
    [(True, "cuda", (8, 16)), (False, "cpu", (100, 200)), (False, "cuda", (1000, 2000))],
)
def test_defaults_by_quick_and_device(quick, device_type, expected):
    assert bench_contexts(None, quick, device_type, DEFAULTS) == expected


def test_cpu_default_on_cuda_without_a_cuda_default():
    assert bench_contexts(None, False, "cuda", ((1,), (5, 6), None)) == (5, 6)


def test_given_contexts_as_ints_sorted_on_request():
    assert bench_contexts([64.0, 32], False, "cpu", DEFAULTS) == (64, 32)
    assert bench_contexts([64, 32], False, "cpu", DEFAULTS, sort=True) == (32, 64)


@pytest.mark.parametrize("bad", [(), (0,), (16, -1)])
def test_empty_or_non_positive_contexts_are_named(bad):
    with pytest.raises(ValueError, match=r"`contexts` must be positive token counts, got \("):
        bench_contexts(bad, False, "cpu", DEFAULTS)


def test_failed_cell_names_the_exception_and_caps_the_message():
    assert failed_cell(KeyError("x")) == {"status": "failed", "error": "KeyError: 'x'"}
    assert len(failed_cell(RuntimeError("y" * 1000))["error"]) == 500
