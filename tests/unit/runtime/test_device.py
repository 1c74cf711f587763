"""One device rule for eval, bench and tasks: cpu, cuda, cuda:N or auto; any other name torch parses (mps, meta,
cpu:0, cuda:01) is refused with the value named, and a CUDA index this machine lacks is refused before any run."""

from __future__ import annotations

import pytest
import torch

from kvlab.runtime import device as device_mod
from kvlab.runtime.device import check_device, check_device_name, resolve_device

BAD_NAMES = [
    "mps",
    "meta",
    "xpu",
    "cpu:0",
    "",
    "cuda:",
    "cuda:-1",
    "cuda:0x1",
    "cuda:01",
    " cpu",
    "CPU",
    None,
    0,
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_check_device_name_refuses_names_outside_the_rule(name):
    with pytest.raises(ValueError, match=r"must be cpu, cuda, cuda:N or auto, got " + repr(repr(name))[1:-1]):
        check_device_name(name)


@pytest.mark.parametrize("name", ["cpu", "cuda", "cuda:0", "cuda:12", "auto"])
def test_check_device_name_returns_the_names_of_the_rule(name):
    assert check_device_name(name) == name


@pytest.mark.parametrize("name", ["mps", "meta", "cpu:0"])
def test_resolve_and_check_device_refuse_names_torch_parses(name):
    torch.device(name)  # torch takes it: kvlab must not
    for fn in (resolve_device, check_device):
        with pytest.raises(ValueError, match=repr(name)):
            fn(name)


def test_check_device_refuses_a_cuda_index_past_the_device_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"'cuda:2' but this machine has 2 CUDA device"):
        check_device("cuda:2")


def test_check_device_says_cuda_is_missing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(ValueError, match=f"'{name}' but CUDA is not available"):
            check_device(name)
    assert resolve_device("auto") == torch.device("cpu")
    assert device_mod.resolve_device(None) == torch.device("cpu")


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "flush", "--device", "mps"],
        ["bench", "decode", "--device", "meta"],
        ["bench", "kernel", "--device", "cpu:0"],
        ["tasks", "--device", "", "--n", "1"],
        ["tasks", "--device", "xpu", "--n", "1"],
        ["eval", "--dry-run", "--device", "cuda:-1"],
        ["eval", "--dry-run", "--device", "cuda:01"],
        ["inspect", "--device", "tpu"],  # refused before its "loading the bundled model" line
    ],
)
def test_cli_refuses_a_bad_device_in_one_line_before_any_work(argv, tmp_path, capsys, monkeypatch):
    from kvlab.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    bad = argv[argv.index("--device") + 1]
    assert len(err) == 1 and "must be cpu, cuda, cuda:N or auto" in err[0] and repr(bad) in err[0]
    assert "loading" not in err[0]
    assert err[0].count("--device") == 1  # the flag named once: `device` (--device), or --device
    assert not list(tmp_path.iterdir())


def test_inspect_refuses_cuda_without_it_before_loading(capsys, monkeypatch):
    """``--device cuda`` on a machine without CUDA: one line, and no loading line printed before it."""
    from kvlab.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["inspect", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kvlab inspect: error: `device` (--device) is 'cuda' but CUDA is not available"]


def test_inspect_refuses_a_device_outside_the_rule(capsys):
    from kvlab.cli import main

    assert main(["inspect", "--device", "mps"]) == 2
    err = capsys.readouterr().err
    assert "`device` (--device) must be cpu, cuda, cuda:N or auto, got 'mps'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "--dry-run", "--quick"],
        ["tasks", "--dry-run", "--quick"],
        ["inspect"],
        ["bench", "decode", "--quick", "--no-save"],
    ],
)
def test_every_command_words_a_missing_cuda_the_same(argv, tmp_path, capsys, monkeypatch):
    """kvlab eval said "--device cuda: `device` is 'cuda' but CUDA is not available", kvlab inspect "--device is
    'cuda' but ...", kvlab tasks and bench "`device` (--device) is 'cuda' but ...": now one wording, from
    :func:`kvlab.commands.device_problem`, before any work."""
    from kvlab.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main([*argv, "--device", "cuda"]) == 2
    prog = " ".join(a for a in argv[:2] if not a.startswith("-"))
    said = f"kvlab {prog}: error: `device` (--device) is 'cuda' but CUDA is not available"
    assert capsys.readouterr().err.strip().splitlines() == [said]
    assert not list(tmp_path.iterdir())
