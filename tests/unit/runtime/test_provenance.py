"""Provenance: one set of helpers behind eval's ``provenance.hardware/software`` and bench's ``machine`` record."""

from __future__ import annotations

import platform

import torch

from kvlab.runtime import provenance

# The keys result files already carry (eval result files, bench records); readers and reports depend on them.
EVAL_HARDWARE_KEYS = {
    "device",
    "cpu_capability",
    "platform",
    "machine",
    "processor",
    "cpu_count",
    "torch_threads",
    "cuda_available",
}
EVAL_SOFTWARE_KEYS = {"python", "kvlab", "torch", "transformers", "tokenizers", "hqq", "optimum-quanto"}
BENCH_MACHINE_KEYS = {
    "cpu", "cpu_count", "torch_threads", "memory_gib", "platform", "python", "torch", "transformers", "kvlab",
    "hqq", "optimum-quanto", "git_commit", "gpu",
}  # fmt: skip


def test_eval_layout_keys_and_values():
    hw = provenance.hardware_info(torch.device("cpu"))
    sw = provenance.software_info()
    assert set(hw) == EVAL_HARDWARE_KEYS
    assert set(sw) == EVAL_SOFTWARE_KEYS
    assert hw["device"] == "cpu" and hw["torch_threads"] == torch.get_num_threads()
    assert sw["torch"] == torch.__version__ and sw["python"] == platform.python_version()


def test_bench_layout_shares_the_facts_of_the_eval_layout():
    machine = provenance.machine_info()
    assert set(machine) - {"cuda"} == BENCH_MACHINE_KEYS
    sw = provenance.software_info()
    for key in ("python", "torch", "transformers", "kvlab", "hqq", "optimum-quanto"):
        assert machine[key] == sw[key], key
    assert machine["cpu_count"] == provenance.hardware_info(torch.device("cpu"))["cpu_count"]


def test_callers_use_the_runtime_helpers():
    from kvlab.bench import results
    from kvlab.eval import runner

    assert runner.hardware_info is provenance.hardware_info  # the driver records the machine with these
    assert runner.software_info is provenance.software_info
    assert results.make_record("decode", {}, "kvlab bench decode", True)["machine"].keys() == (
        provenance.machine_info().keys()
    )


def test_package_version_of_a_missing_package_is_none():
    assert provenance.package_version("kvlab-no-such-distribution") is None
    assert provenance.package_version("torch") is not None
