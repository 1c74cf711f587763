"""The integer compute roof of the CPU kernel (kvlab.attention.cpu_roof): the probe does the byte products it says on
every vector path this CPU runs, none on the scalar path, and bad arguments are refused by name."""

import shutil

import pytest

from kvlab.attention import cpu_kernel, cpu_roof

needs_kernel = pytest.mark.skipif(
    shutil.which(cpu_kernel.COMPILER) is None or cpu_kernel.unavailable_reason() is not None,
    reason=f"the CPU kernel cannot be built here: {cpu_kernel.unavailable_reason()}",
)


def _vector_paths() -> list[str]:
    if cpu_kernel.unavailable_reason() is not None:
        return []
    return [p for p in cpu_kernel.ISAS[1 : cpu_kernel.ISAS.index(cpu_kernel.best_isa()) + 1]]


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_the_probe_counts_its_products_per_path_and_thread(threads):
    fn = cpu_kernel._loaded("test").kvlab_int_roof
    per_round = {"avx2": 8 * 128, "avx512": 8 * 64}  # 8 chains of dot4 (maddubs x4 + madd) / dpbusd
    for path in _vector_paths():
        assert fn(cpu_kernel.ISAS.index(path), 1000, threads) == 1000 * per_round[path] * threads
    assert fn(0, 1000, threads) == 0  # the scalar path has no roof
    assert fn(len(cpu_kernel.ISAS), 1000, threads) == 0  # nor a path this CPU lacks
    assert fn(cpu_kernel.ISAS.index(cpu_kernel.best_isa()), 0, threads) == 0


@needs_kernel
def test_the_roof_is_a_rate_on_vector_paths_and_none_on_the_scalar_one():
    for path in _vector_paths():
        rate = cpu_roof.int_roof(1, path, rounds=20_000, reps=1)
        assert rate is not None and rate > 1e8  # byte products per second: any vector unit does far more
    assert cpu_roof.int_roof(1, "scalar", rounds=1000, reps=1) is None


@needs_kernel
@pytest.mark.parametrize(
    "kwargs, named",
    [({"threads": 0}, "`threads`"), ({"threads": 1, "rounds": 0}, "`rounds`"), ({"threads": 1, "reps": True}, "`reps`"),
     ({"threads": 1, "path": "neon"}, "'neon'")],
)
def test_bad_arguments_are_refused_by_name(kwargs, named):
    with pytest.raises(ValueError, match=named):
        cpu_roof.int_roof(**kwargs)


def test_int8_products_count_the_query_digits_per_key_code_and_one_per_value_code():
    # 4 query rows over 10 tokens of 8 channels: 4-bit keys 2 x 320 (high and low query byte), values 320
    assert cpu_roof.int_products(4, 10, 8, nbits=4) == 2 * 320 + 320
    assert cpu_roof.int_products(4, 10, 8, nbits=2) == 320 + 320  # 2-bit keys: one query byte
    with pytest.raises(ValueError, match="`nbits` must be 2 or 4"):
        cpu_roof.int_products(4, 10, 8, nbits=8)
