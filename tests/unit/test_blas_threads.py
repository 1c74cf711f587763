"""numpy's OpenBLAS threads set at run time and restored (kvlab.runtime.blas)."""

import pytest

from kvlab.runtime.blas import blas_threads, get_blas_threads


def test_threads_are_set_inside_and_restored_after():
    before = get_blas_threads()
    if before is None:
        pytest.skip("no OpenBLAS loaded in this process (another BLAS): nothing to set")
    target = 2 if before == 1 else 1
    with blas_threads(target) as now:
        assert now == target and get_blas_threads() == target
    assert get_blas_threads() == before


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_counts_are_named(bad):
    with pytest.raises(ValueError, match="BLAS threads"), blas_threads(bad):
        pass
