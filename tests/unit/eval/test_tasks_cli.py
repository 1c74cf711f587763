"""``kvlab tasks``: bad input refused with exit 2 before a model loads; a small run on the bundled model writes a
result with intervals, gates and a decision, and the score-vs-bytes figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.eval.tasks_schema import validate_tasks_result
from kvlab.task_figures import task_figure_data


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tasks", "niah_single_9"], "unknown task 'niah_single_9'"),
        (["--candidates", "kivi-3"], "`kivi` needs bits in [2, 4, 8], got 3"),
        (["--contexts", "512,x"], "'x' in '512,x' is not an integer >= 128"),
        (["--contexts", "64"], "'64' in '64' is not an integer >= 128"),
        (["--n", "0"], "`n` (--n) must be an int >= 1, got 0"),
        (["--seed", "-1"], "`seed` (--seed) must be an int >= 0, got -1"),  # ran; paging's --seed refuses it
        (["--threads", "0"], "--threads must be an int >= 1, got 0"),
        (["--max-drop", "1.5"], "`max_drop` must be in [0, 1], got 1.5"),
        (["--tasks", "vt,vt"], "'vt' is given twice in 'vt,vt'"),
        (["--tasks", "vt,,cwe"], "empty item in 'vt,,cwe'"),
        (["--protected-tail", "100000"], "--protected-tail 100000 must be below the longest context (512"),
        (["--candidates", "kivi-4,kivi4"], "cache 'kivi4' is 'kivi-4' again"),
        (["--resume", ""], "--resume must name a file, got ''"),
        (
            ["--candidates", "dynamic,sink:window_length=512"],
            "cache candidate 'sink:window_length=512' keeps 516 tokens, not fewer than the longest context (512",
        ),
        (["--candidates", "sweep"], "'sink:window_length=512' keeps 516 tokens"),
        (
            ["--candidates", "tova:token_budget=600", "--contexts", "256,512"],
            "'tova:token_budget=600' keeps 600",
        ),
    ],
)
def test_bad_input_exit_2(argv, message, capsys, tmp_path):
    assert main(["tasks", *argv, "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err and err.startswith("kvlab tasks: error:")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    "argv, field, expected",
    [
        ([], "candidates", "DEFAULT_CANDIDATES"),
        (["--quick"], "tasks", "QUICK_TASKS"),
        (["--quick"], "candidates", "QUICK_CANDIDATES"),
    ],
)
def test_presets_of_the_command_line(argv, field, expected):
    from kvlab.cli import build_parser
    from kvlab.commands.tasks import _config
    from kvlab.eval import tasks_suite as ts

    cfg = _config(build_parser().parse_args(["tasks", *argv]))
    assert getattr(cfg, field) == getattr(ts, expected)
    assert cfg.contexts == (512,) and cfg.n == 5  # --quick and the default: 512 tokens, 5 samples


def test_flags_given_with_quick_replace_its_choice_of_each():
    """``--quick`` presets tasks, caches, contexts and n; a flag given with it replaces that one choice (--help says
    so), the others stay quick's."""
    from kvlab.cli import build_parser
    from kvlab.commands.tasks import _config
    from kvlab.eval import tasks_suite as ts

    cfg = _config(build_parser().parse_args(["tasks", "--quick", "--tasks", "vt", "--n", "2"]))
    assert cfg.tasks == ("vt",) and cfg.n == 2
    assert cfg.candidates == ts.QUICK_CANDIDATES and cfg.contexts == (512,)
    cfg = _config(build_parser().parse_args(["tasks", "--quick", "--candidates", "dynamic,fp8-e4m3"]))
    assert cfg.candidates == ("dynamic", "fp8-e4m3") and cfg.tasks == ts.QUICK_TASKS


def _no_model(*args, **kwargs):
    raise AssertionError("a dry run loads no model")


def test_a_dry_run_prints_the_cells_and_caches_and_writes_nothing(tmp_path, capsys, monkeypatch):
    import kvlab.models

    monkeypatch.setattr(kvlab.models, "load_model", _no_model)
    out = tmp_path / "r.json"
    argv = [
        "tasks",
        "--dry-run",
        "--tasks",
        "vt,cwe",
        "--contexts",
        "256,512",
        "--candidates",
        "kivi-4,dynamic",
    ]
    assert main([*argv, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert said.startswith("dry run: 4 cells (vt@256, cwe@256, vt@512, cwe@512) x 2 caches (dynamic, kivi-4)")
    assert f"would write {out}" in said and not list(tmp_path.iterdir())
    assert main([*argv, "--n", "3", "--json", "--out", str(out)]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["cells"][1] == {"task": "cwe", "context": 256} and len(plan["cells"]) == 4
    assert plan["caches"] == ["dynamic", "kivi-4"] and plan["n"] == 3 and plan["model"] == "bundled"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--candidates", "kivi-3"],
            "`kivi` needs bits in [2, 4, 8], got 3",
        ),  # the run's checks, all of them
        (["--figure", "f.jpg"], "must end in .png"),
        (["--merge", "a.json"], "--merge measures nothing; drop --dry-run"),
        # both were checked only by the run, after the dry run had said all was well (exit 0)
        (["--device", "bogus"], "`device` (--device) must be cpu, cuda, cuda:N or auto, got 'bogus'"),
        (
            ["--dtype", "int8"],
            "--dtype must be one of ['bfloat16', 'float16', 'float32'] (or bf16, fp16, fp32; any case), got 'int8'",
        ),
        # '' ran in bfloat16, the default (kvlab eval --dtype '' refuses it)
        (["--dtype", ""], "--dtype must be one of ['bfloat16', 'float16', 'float32'] (or bf16, fp16, fp32; any case), got ''"),
    ],
)
def test_a_dry_run_refuses_what_the_run_refuses(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["tasks", "--dry-run", *argv, "--out", "r.json"]) == 2
    err = capsys.readouterr().err
    assert message in err and not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["tasks", "eval"])
def test_a_dry_run_refuses_a_device_this_machine_lacks(command, tmp_path, capsys, monkeypatch):
    # both exited 0: a dry run must refuse what the run refuses before loading
    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main([command, "--dry-run", "--quick", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "is 'cuda' but CUDA is not available" in err and f"kvlab {command}: error:" in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("dry", [["--dry-run"], []])
def test_a_model_that_is_not_there_is_bad_input(dry, tmp_path, capsys, monkeypatch):
    # kvlab tasks --model nope exited 1 (inspect, lab, bench, eval: 2) and --dry-run accepted it
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "no-such-model"
    assert main(["tasks", "--quick", *dry, "--model", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvlab tasks: error:") and str(missing) in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_a_run_on_a_machine_without_cuda_refuses_the_cuda_device_before_loading(
    device, tmp_path, capsys, monkeypatch
):
    # it ended in a ValueError traceback from _model_block (exit 1); eval, inspect and bench said it cleanly
    import torch

    import kvlab.models

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(kvlab.models, "load_model", never)
    assert main(["tasks", "--quick", "--device", device, "--out", "tk2.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"kvlab tasks: error: `device` (--device) is {device!r} but CUDA is not available", err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "argv", [["--candidates", "sweep"], ["--candidates", " sweep "], ["--quick", "--candidates", "sweep"]]
)
def test_the_sweep_preset_at_contexts_its_sink_windows_compress(argv):
    from kvlab.cli import build_parser
    from kvlab.commands.tasks import _config
    from kvlab.eval import tasks_suite as ts

    cfg = _config(build_parser().parse_args(["tasks", *argv, "--contexts", "2048"]))
    assert cfg.candidates == ts.SWEEP_CANDIDATES and cfg.contexts == (2048,)


def test_the_default_takes_every_family_and_the_sweep_each_default():
    from kvlab.eval import tasks_suite as ts

    assert set(ts.DEFAULT_CANDIDATES) <= set(ts.SWEEP_CANDIDATES)
    assert {ts.family(c) for c in ts.DEFAULT_CANDIDATES} == {ts.family(c) for c in ts.SWEEP_CANDIDATES}
    assert "vt" not in ts.QUICK_TASKS  # not informative at 512 tokens on either model


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--out", ""], "--out must name a file, got ''"),
        (["--out", "/proc/x.json"], "--out /proc/x.json: folder /proc takes no files"),
        (["--figure", "/proc/c1.png"], "--figure /proc/c1.png: folder /proc takes no files"),
    ],
)
def test_bad_output_path_exit_2_before_work(argv, message, capsys, tmp_path, monkeypatch):
    if "/proc" in message and not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    monkeypatch.chdir(tmp_path)
    assert main(["tasks", *argv] + ([] if argv[0] == "--out" else ["--out", "r.json"])) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
    assert list(tmp_path.iterdir()) == []  # no kvlab-tasks.json, no result


def test_a_run_that_measures_nothing_fails(tmp_path, capsys):
    out, fig = tmp_path / "r.json", tmp_path / "f.png"
    argv = ["tasks", "--tasks", "cwe", "--contexts", "256", "--candidates", "dynamic", "--n", "1"]
    assert main([*argv, "--out", str(out), "--figure", str(fig), "--dtype", "float32"]) == 1
    err = capsys.readouterr().err
    assert "no cell measured (cwe@256: context 256 is too short" in err and "no figure drawn" in err
    result = json.loads(out.read_text())
    assert result["status"] == "failed" and result["failures"][-1]["type"] == "NothingMeasured"
    assert not fig.exists() and validate_tasks_result(result) == []


def test_existing_result_is_kept(tmp_path, capsys):
    out = tmp_path / "r.json"
    out.write_text("{}")
    assert main(["tasks", "--out", str(out)]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert out.read_text() == "{}"
    assert main(["tasks", "--out", str(tmp_path / "s.json"), "--figure", str(tmp_path / "f.svg")]) == 2


def test_small_run_on_the_bundled_model(tmp_path, capsys):
    out, fig = tmp_path / "r.json", tmp_path / "f.png"
    argv = [
        "tasks",
        "--tasks",
        "niah_single_2,cwe",
        "--contexts",
        "256",
        "--candidates",
        "dynamic,kivi-2,snapkv",
    ]
    import torch

    threads = torch.get_num_threads()
    assert main([*argv, "--n", "3", "--out", str(out), "--figure", str(fig), "--dtype", "float32"]) == 0
    result = json.loads(out.read_text())
    assert result["provenance"]["torch_threads"] == 1  # --threads defaults to 1
    assert torch.get_num_threads() == threads  # and the caller's count is restored
    assert result["kind"] == "kvlab-tasks" and fig.stat().st_size > 0
    assert result["status"] == "complete" and result["failures"] == [] and validate_tasks_result(result) == []
    assert [c["task"] for c in result["cells"]] == ["niah_single_2"]  # cwe does not fit in 256 tokens
    assert result["not_measured"][0]["task"] == "cwe" and "too short" in result["not_measured"][0]["reason"]
    rows = result["cells"][0]["caches"]
    assert list(rows) == ["dynamic", "kivi-2", "snapkv"]
    for row in rows.values():
        assert row["trials"] == 3
        lo, hi = row["ci95"]
        assert 0 <= lo <= row["correct"] / 3 <= hi <= 1
    assert rows["snapkv"]["cache_bytes_ratio"] == pytest.approx(0.5, rel=0.02)
    gates = {g["cache"]: g["status"] for g in result["gates"]}
    assert set(gates) == {"kivi-2", "snapkv"}
    informative = rows["dynamic"]["score"] >= 0.5
    assert all((s == "not informative") != informative for s in gates.values())
    assert set(result["decision"]) == {"kivi-2", "snapkv"}
    printed = capsys.readouterr()
    assert "kvlab tasks" in printed.out and "loading model" not in printed.out
    # progress on stderr: the model load, then [step/cells] lines as each cell, its prefill and each cache start
    err = printed.err.splitlines()
    assert err[0].startswith("loading model (bundled reference model) in float32 on cpu")
    steps = [line for line in err if line.startswith("[")]
    assert [line.split("]")[0] for line in steps] == ["[1/2"] * 6 + ["[2/2"] * 2
    assert "niah_single_2 @ 256: float prefill, 3 samples x 256 tokens" in steps[1]
    assert steps[2].endswith("niah_single_2 @ 256: cache 1/3 dynamic") and "cache 3/3 snapkv" in steps[4]
    assert "done, float" in steps[5] and "cwe @ 256: not measured" in steps[7]


def test_figure_data_marks_uninformative_cells():
    result = {
        "min_float_score": 0.5,
        "candidates": {"kivi-4": {"line": "kivi"}, "kivi-2": {"line": "kivi"}},
        "cells": [
            {"task": "vt", "context": 512, "caches": {
                "dynamic": {"score": 0.2, "cache_bytes_ratio": 1.0},
                "kivi-2": {"score": 0.0, "cache_bytes_ratio": 0.17},
                "kivi-4": {"score": 0.1, "cache_bytes_ratio": 0.29}}},
        ],
    }  # fmt: skip
    data = task_figure_data(result)
    cell = data["vt"]["contexts"][512]
    assert not cell["informative"] and cell["float"] == 0.2
    assert cell["lines"]["kivi"] == [(0.17, 0.0, "kivi-2"), (0.29, 0.1, "kivi-4")]
    with pytest.raises(ValueError, match="no measured cells"):
        task_figure_data({"cells": []})


def test_a_candidate_the_loaded_model_refutes_is_refused_before_any_file(tmp_path, capsys, monkeypatch):
    # a plan for 2 layers; the bundled model has 4
    plan = {
        "kvlab_plan": 1,
        "layers": {"0": {"k": "kivi-4", "v": "kivi-4"}, "1": {"k": "kivi-2", "v": "kivi-2"}},
    }
    import kvlab.plan.mixed

    # the registry lists plan names at import: mixed-demo is read as this plan instead
    monkeypatch.setattr(kvlab.plan.mixed, "find_plan", lambda name: (plan, "test"))
    out = tmp_path / "r.json"
    argv = ["tasks", "--candidates", "dynamic,mixed-demo", "--contexts", "9000", "--out", str(out)]
    assert main([*argv, "--dtype", "float32", "--allow-past-limit"]) == 2
    err = capsys.readouterr().err
    assert "--candidates mixed-demo does not fit this model: plan gives no formats for layer 2" in err
    assert "warning: --contexts 9000 passes the model's max_position_embeddings (8,192)" in err  # allowed: warned
    assert not out.exists()


def test_contexts_past_the_model_positions_are_refused_before_loading(tmp_path, capsys, monkeypatch):
    """As kvlab eval: --contexts past max_position_embeddings (the bundled model's 8,192, read from its files) is
    refused before the model loads, --dry-run too, naming the longest context as the list flag takes it (no
    separator), the longest that fits and --allow-past-limit; with that flag the dry run goes on, and the run
    warns and measures (the load is stubbed here: only the order of the checks is tested)."""
    import kvlab.models

    monkeypatch.setattr(kvlab.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    out = tmp_path / "r.json"
    argv = ["tasks", "--tasks", "niah_single_1", "--contexts", "512,16384", "--out", str(out)]
    for extra in ([], ["--dry-run"]):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err
        assert (
            "kvlab tasks: error: --contexts 16384 passes the model's max_position_embeddings (8,192): its cells "
            "measure positions the model was not trained on"
        ) in err, err
        assert "pass --contexts 8192 or less, or --allow-past-limit to run past it" in err
        assert not out.exists()
    assert main([*argv, "--dry-run", "--allow-past-limit"]) == 0
    assert "niah_single_1@16384" in capsys.readouterr().out
    assert main(["tasks", "--tasks", "niah_single_1", "--contexts", "8192", "--out", str(out), "--dry-run"]) == 0


@pytest.mark.parametrize(
    "extra, flag", [(["--n", "3"], "--n"), (["--quick"], "--quick"), (["--json"], "--json"), (["--out", "x.json"], "--out")]
)
def test_list_refuses_a_flag_it_would_ignore(capsys, extra, flag):
    """``kvlab tasks --list --n 3`` printed the task list and ignored --n (``--json`` too: the list is text), where
    ``kvlab roofline --list-gpus`` refuses a flag it does not use."""
    assert main(["tasks", "--list", *extra]) == 2
    out, err = capsys.readouterr()
    assert not out and f"--list prints the tasks and exits; it takes no {flag}" in err, err
    assert main(["tasks", "--list"]) == 0 and "niah_single_1" in capsys.readouterr().out
