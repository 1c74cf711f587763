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
    "cpu_model",
    "cpu_id",
    "cpu_isa",
    "cpu_count",
    "torch_threads",
    "cuda_available",
}
EVAL_SOFTWARE_KEYS = {"python", "kvlab", "torch", "transformers", "tokenizers", "hqq", "optimum-quanto"}
BENCH_MACHINE_KEYS = {
    "cpu", "cpu_id", "cpu_isa", "cpu_count", "torch_threads", "memory_gib", "platform", "python", "torch", "transformers", "kvlab",
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


ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse avx f16c avx2 avx512f avx512_bf16 avx512vbmi avx512_vnni fma

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
flags\t\t: avx2 amx_tile amx_int8
"""

GRAVITON = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes asimddp sve i8mm bf16
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


def test_cpu_identity_reads_the_first_processor_of_x86_cpuinfo():
    ident = provenance.cpu_identity(ZEN4)
    assert ident["cpu_id"] == "AuthenticAMD family 25 model 17"
    # in CPU_ISA_FLAGS order; the second processor's AMX flags are not this CPU's
    assert ident["cpu_isa"] == ["avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx512vbmi"]


def test_cpu_identity_reads_arm_features():
    ident = provenance.cpu_identity(GRAVITON)
    assert ident == {"cpu_id": "implementer 0x41 part 0xd40", "cpu_isa": ["asimd", "asimddp", "i8mm", "bf16", "sve"]}


def test_cpu_identity_without_fields_is_empty_not_an_error():
    assert provenance.cpu_identity("") == {"cpu_id": None, "cpu_isa": []}
    assert provenance.cpu_identity("model name\t: something\n") == {"cpu_id": None, "cpu_isa": []}


def test_machine_line_names_the_cpu_identity_when_the_record_has_it():
    from kvlab.bench.docs import _machine_line

    rec = {"machine": {"cpu": "AMD EPYC", **provenance.cpu_identity(ZEN4), "cpu_count": 2}}
    line = _machine_line(rec)
    assert line.startswith("Machine: AMD EPYC (AuthenticAMD family 25 model 17; avx2 fma f16c avx512f")
    old = _machine_line({"machine": {"cpu": "AMD EPYC", "cpu_count": 2}})  # a record from before: no identity
    assert old.startswith("Machine: AMD EPYC, 2 cores visible")
