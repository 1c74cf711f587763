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


def test_gpu_is_refused_beside_gpu_mem_gib_and_unknown_names_are_listed(capsys):
    code, _, err = run(capsys, "static", "--gpu", "L4", "--gpu-mem-gib", "20")
    assert code == 2 and "--gpu-mem-gib 20 and --gpu L4" in err and "pass one" in err, err
    code, _, err = run(capsys, "static", "--gpu", "Z9")
    assert code == 2 and "'Z9'" in err and "L4" in err, err


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
