"""``kvlab paging static`` as a new user found it: no ``--gpu`` ("unrecognized arguments") while plan and roofline
take one; a ``--kv-dtype`` error listing ``kivi2, kivi4`` but not the README's ``kivi-4``; a ``--workload`` file
whose ``-5`` was refused ">= 0" and whose ``0`` was then refused ">= 1" naming no file or line."""

import json

import pytest

from kvlab.cli import main
from kvlab.plan.hardware import get_hardware


def run(capsys, *argv: str) -> tuple[int, dict | None, str]:
    code = main(["paging", *argv])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 and "--json" in argv else None, captured.err


@pytest.mark.parametrize("gpu", ["L4", "h100-sxm"])
def test_gpu_gives_the_tables_device_memory(capsys, gpu):
    code, r, _ = run(capsys, "static", "--gpu", gpu, "--json")
    assert code == 0
    assert r["config"]["gpu_bytes"] == get_hardware(gpu).memory_bytes
    code, same, _ = run(capsys, "static", "--gpu-mem-gib", str(get_hardware(gpu).memory_gib), "--json")
    assert same["A"] == r["A"]  # the same memory as the flag in GiB


def test_gpu_mem_gib_beside_gpu_is_the_memory_as_in_plan_and_unknown_names_are_listed(capsys):
    """`kvlab plan llama-3-8b --gpu H100-sxm --gpu-mem-gib 80` ran while paging refused the same two flags ("both
    give the device memory; pass one"). One rule now (kvlab.plan.hardware.memory_override): --gpu names the device,
    an explicit --gpu-mem-gib its memory, in place of the row's, and the output says so."""
    code, r, err = run(capsys, "static", "--gpu", "L4", "--gpu-mem-gib", "20", "--json")
    assert code == 0, err
    assert r["config"]["gpu_bytes"] == 20 * 2**30 != get_hardware("L4").memory_bytes
    l4 = get_hardware("L4")
    assert f"--gpu-mem-gib 20 GiB in place of the L4's {l4.memory_mib:,} MiB" in r["config"]["source"]
    code, alone, _ = run(capsys, "static", "--gpu-mem-gib", "20", "--json")
    assert alone["A"] == r["A"] and "in place of" not in alone["config"]["source"]
    for argv in (("--gpu", "Z9"), ("--gpu", "Z9", "--gpu-mem-gib", "20")):  # a typo is refused either way
        code, _, err = run(capsys, "static", *argv)
        assert code == 2 and "'Z9'" in err and "L4" in err, err


def test_plan_states_the_same_rule_in_a_note(capsys):
    h100 = get_hardware("H100-sxm")
    assert main(["plan", "llama-3-8b", "--gpu", "H100-sxm", "--gpu-mem-gib", "80", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["budget"]["memory_bytes"] == 80 * 2**30 != h100.memory_bytes
    assert f"device memory: --gpu-mem-gib 80 GiB in place of the H100-SXM's {h100.memory_mib:,} MiB" in "".join(
        r["notes"]
    )
    assert main(["plan", "llama-3-8b", "--gpu-mem-gib", "80", "--json"]) == 0  # no --gpu: nothing replaced
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"] if n.startswith("device memory")]


def test_simulate_takes_gpu_too(capsys):
    argv = ["simulate", "--requests", "5", "--prompt-tokens", "16:32", "--output-tokens", "4:8", "--json"]
    code, r, _ = run(capsys, *argv, "--gpu", "L4")
    assert code == 0 and r["config"]["gpu_bytes"] == get_hardware("L4").memory_bytes


def test_a_bad_kv_dtype_lists_the_canonical_kivi_names(capsys):
    code, _, err = run(capsys, "static", "--kv-dtype", "int4")
    assert code == 2 and "'int4'" in err
    assert "kivi-2, kivi-4, kivi-8" in err, err
    code, _, _ = run(capsys, "static", "--kv-dtype", "kivi-4", "--json")  # the name listed works
    assert code == 0


@pytest.mark.parametrize(
    "name, text, where",
    [
        ("neg.txt", "512\n-5\n", "line 2"),
        ("zero.txt", "512\n0\n", "line 2"),
        ("zero.csv", "tokens\n512\n0\n", "line 3"),
        ("trace.csv", "arrival_step,prompt_tokens,output_tokens\n0,5,5\n1,0,0\n", "line 3"),
    ],
)
def test_workload_lengths_have_one_bound_named_with_file_and_line(tmp_path, capsys, name, text, where):
    path = tmp_path / name
    path.write_text(text)
    code, _, err = run(capsys, "static", "--workload", str(path))
    assert code == 2
    assert str(path) in err and where in err and ">= 1" in err, err
    assert ">= 0" not in err
