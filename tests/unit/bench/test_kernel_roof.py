"""The integer compute roof in `kvlab bench kernel` records: each integer kernel's least time at the measured rate of
its byte products, the CPU target naming a kernel the roof keeps below it, the page's line."""

import pytest

from kvlab.bench import docs
from kvlab.bench.cpu_targets import CPU_FRACTION, evaluate_cpu_targets
from kvlab.bench.kernel import _roofed

COPY = 20.0  # GB/s (read + write)
RATE = 100e9  # byte products per second


def _kernel(nbytes, us, products=None):
    k = {"bytes": nbytes, "us": us, "gb_s": nbytes / us / 1e3, "fraction_of_copy": nbytes / us / 1e3 / COPY}
    if products is not None:
        k["products"] = products
        _roofed(k, RATE, COPY)
    return k


def _result(k2_products):
    # 16k tokens: kivi4-int8 reads 20 MB in 4,000 us, kivi2-int8 12 MB in 3,000 us; 1e8 products take 1,000 us
    kernels = {
        "kivi4-int8": _kernel(20e6, 4000.0, 10**8),
        "kivi2-int8": _kernel(12e6, 3000.0, k2_products),
        "float-bfloat16": _kernel(64e6, 9000.0),
    }
    row = {"context": 16384, "status": "ok", "kernels": kernels}
    roof = {"path": "avx512", "threads": 1, "products_per_s": RATE, "gmac_s": RATE / 1e9}
    return {"device_type": "cpu", "settings": {"isa": "avx512"}, "rows": [row], "int_roof": roof}


def test_the_roof_is_the_products_at_the_measured_rate():
    k = _result(10**8)["rows"][0]["kernels"]["kivi4-int8"]
    assert k["roof_us"] == pytest.approx(1000.0)  # 1e8 / 1e11 s
    assert k["fraction_of_roof"] == pytest.approx(0.25)  # 1,000 of 4,000 us
    assert k["roof_fraction_of_copy"] == pytest.approx(1.0)  # 20 MB in 1 ms = 20 GB/s = the copy rate
    assert "roof_us" not in _result(10**8)["rows"][0]["kernels"]["float-bfloat16"]


def test_the_cpu_target_names_a_kernel_its_roof_keeps_below_the_target():
    # 12 MB over 1e8 products (1 ms) = 12 GB/s = 60 % of copy: the roof allows the target
    detail = evaluate_cpu_targets(_result(10**8))[0]["detail"]
    assert "above this design's integer compute roof" not in detail
    # the roof allows it: how close to its roof each kernel must run, and how close it ran
    assert "kivi4-int8 needs 50% of its roof at 16384 (ran at 25%)" in detail  # roof = copy; 1,000 of 4,000 us
    assert "kivi2-int8 needs 83% of its roof at 16384 (ran at 33%)" in detail  # roof = 60 % of copy; 1,000 of 3,000
    # 12 MB over 2e8 products (2 ms) = 6 GB/s = 30 % of copy: no kernel of this design reaches 50 % here
    v = evaluate_cpu_targets(_result(2 * 10**8))[0]
    assert v["status"] == "not met" and CPU_FRACTION > 0.30
    assert "integer compute roof for kivi2-int8 at most 30% at 16384" in v["detail"]


def test_the_page_states_the_roof_and_each_kernels_least_time():
    text = "\n".join(docs._kernel_columns(_result(2 * 10**8)))
    assert "Integer compute roof, measured in this run: 100 G byte products/s (avx512, 1 thread)" in text
    assert "`kivi4-int8` 1,000 µs (100% of copy; it ran at 25% of this roof)" in text
    assert "`kivi2-int8` 2,000 µs (30% of copy; it ran at 67% of this roof)" in text
    old = _result(10**8)
    del old["int_roof"]  # records written before the roof: no line
    assert "roof" not in "\n".join(docs._kernel_columns(old))


def test_a_busy_run_says_so_and_a_float16_layer_names_no_integer_kernel(monkeypatch):
    """bench kernel gave a roof of 458 then 128 G byte products/s on a shared machine with no word (roofline --probe
    warns); a float16 layer (no integer kernel runs) still listed kivi4-int8 / kivi2-int8 and printed an empty
    'least time at it, 2048 tokens: .'."""
    from kvlab.attention import cpu_kernel
    from kvlab.bench import kernel

    if cpu_kernel.unavailable_reason() is not None:
        pytest.skip(cpu_kernel.unavailable_reason())
    busy = {"busy": True, "reason": "other processes used 1.50 cores", "threads": 1}
    monkeypatch.setattr(kernel, "contention", lambda *a, **k: busy)
    steady = {"bytes": 2**20, "best_gb_s": 20.0, "median_gb_s": 19.0}  # a 1 MiB probe is noisy: no drift warning
    monkeypatch.setattr(kernel, "copy_bandwidth", lambda *a, **k: dict(steady))
    result = kernel.run(contexts=(512,), reps=1, copy_bytes=2**20, quick=True)
    assert result["warnings"] and "other processes used 1.50 cores" in result["warnings"][0]
    assert "**Warning:** the machine was busy" in "\n".join(docs._kernel_columns(result))
    monkeypatch.setattr(kernel, "contention", lambda *a, **k: {"busy": False})
    f16 = kernel.run(contexts=(512,), reps=1, copy_bytes=2**20, quick=True, dtype="float16")
    assert f16["warnings"] == [] and f16["int_roof"] is None and f16["settings"]["int8_paths"] == {}
    assert "roof" not in "\n".join(docs._kernel_columns(f16))


def test_the_two_over_four_target_states_the_ratio_at_the_roof():
    """KIVI-2's integer kernel does 2/3 of KIVI-4's byte products (one query digit for 2-bit keys, two for 4-bit):
    where both are bound by compute the time ratio tends to that, above the 0.65x target; the record says so."""
    from kvlab.bench.cpu_targets import CPU_TWO_OVER_FOUR

    same = evaluate_cpu_targets(_result(10**8))[1]  # equal products: 1.00x at the roof
    assert same["status"] == "not met" and "0.75x at 16384" in same["detail"]  # 3,000 / 4,000 us
    assert "at the integer compute roof 1.00x at 16384 (the byte products' ratio): above the target" in same["detail"]
    fewer = evaluate_cpu_targets(_result(6 * 10**7))[1]  # 0.60x at the roof: below the target
    assert 0.60 < CPU_TWO_OVER_FOUR and "at the integer compute roof 0.60x at 16384" in fewer["detail"]
    assert "above the target" not in fewer["detail"]
    old = _result(10**8)
    for k in old["rows"][0]["kernels"].values():
        k.pop("roof_us", None)  # records written before the roof: no roof clause
    assert "roof" not in evaluate_cpu_targets(old)[1]["detail"]


def test_the_copy_bandwidth_is_the_higher_of_the_probes_before_and_after_the_kernels(monkeypatch):
    """On a shared 2-core VM one 2-thread copy probe read 31.9 GB/s and the next 42.6: the fractions of copy use the
    higher of a probe before and one after the kernels, and a record whose probes differ by more than 15 % warns."""
    from kvlab.attention import cpu_kernel
    from kvlab.bench import kernel

    both = kernel._copy_both_ends(
        {"bytes": 8, "best_gb_s": 32.0, "median_gb_s": 30.0}, {"bytes": 8, "best_gb_s": 40.0, "median_gb_s": 39.0}
    )
    assert both["best_gb_s"] == 40.0 and both["median_gb_s"] == 39.0 and both["drift"] == pytest.approx(0.25)
    assert (both["before_best_gb_s"], both["after_best_gb_s"]) == (32.0, 40.0)
    warning = kernel._copy_warning(both)
    assert warning and "32.0 GB/s before the kernels, 40.0 after (+25%)" in warning[0]
    assert kernel._copy_warning(kernel._copy_both_ends({**both, "best_gb_s": 38.0}, both)) == []  # 5 %: quiet

    if cpu_kernel.unavailable_reason() is not None:
        pytest.skip(cpu_kernel.unavailable_reason())
    probes = iter([10.0, 20.0])  # before, after
    monkeypatch.setattr(
        kernel, "copy_bandwidth", lambda *a, **k: {"bytes": 2**20, "best_gb_s": (b := next(probes)), "median_gb_s": b}
    )
    monkeypatch.setattr(kernel, "contention", lambda *a, **k: {"busy": False})
    result = kernel.run(contexts=(512,), reps=1, copy_bytes=2**20, quick=True)
    row = result["rows"][0]
    assert result["copy"]["best_gb_s"] == 20.0
    for k in row["kernels"].values():
        assert k["fraction_of_copy"] == pytest.approx(k["gb_s"] / 20.0)  # against the higher probe, not the first
    assert row["kivi_fraction_of_copy"] == pytest.approx(row["kivi_gb_s"] / 20.0)
    assert any("10.0 GB/s before the kernels, 20.0 after (+100%)" in w for w in result["warnings"])
    assert "the higher of the probes before (10.00) and after (20.00)" in docs.render_kernel(result)
