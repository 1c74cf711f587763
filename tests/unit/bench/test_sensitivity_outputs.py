"""Where ``kvlab sensitivity`` writes: a folder that cannot take the file is refused before any work (exit 2,
the flag named), not after the sweep as a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.cli import main

SWEEP = Path(__file__).resolve().parents[3] / "docs" / "examples" / "mixed" / "sensitivity-smollm2-1024.json"


def test_sweep_refuses_a_missing_out_folder_before_loading_the_model(tmp_path, capsys, monkeypatch):
    # it ran the whole sweep, then ended in FileNotFoundError (exit 1) and the result was lost
    import kvlab.models

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(kvlab.models, "load_model", never)
    out = tmp_path / "nonexistent" / "x.json"
    argv = [
        "sensitivity",
        "sweep",
        "--out",
        str(out),
        "--context",
        "256",
        "--prompts",
        "1",
        "--formats",
        "kivi-4",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--out {out}: folder {out.parent} does not exist" in err, err


@pytest.mark.parametrize("out", ["", "  "])
def test_sweep_refuses_an_empty_out(out, capsys):
    # it said "--out . is a folder"
    assert main(["sensitivity", "sweep", "--out", out, "--context", "256", "--formats", "kivi-4"]) == 2
    assert capsys.readouterr().err.strip() == f"kvlab sensitivity sweep: error: --out must name a file, got {out!r}"


@pytest.mark.parametrize("via_env", [False, True])
def test_allocate_refuses_a_file_where_the_plan_folder_should_be(tmp_path, capsys, monkeypatch, via_env):
    # --out-dir p.png with p.png a file: FileExistsError traceback from mkdir, exit 1
    blocker = tmp_path / "p.png"
    blocker.write_text("not a folder")
    argv = ["sensitivity", "allocate", str(SWEEP), "--budget", "0.3", "--name", "t3"]
    if via_env:
        monkeypatch.setenv("KVLAB_PLAN_DIR", str(blocker))
    else:
        argv += ["--out-dir", str(blocker)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    flag = "$KVLAB_PLAN_DIR" if via_env else "--out-dir"
    assert (
        err.count("\n") == 0 and f"{flag} {blocker / 't3.json'}: {blocker} is a file, not a folder" in err
    ), err


def test_allocate_still_makes_a_missing_plan_folder(tmp_path, capsys):
    # docs/MIXED.md's `--out-dir plans` relies on it
    plans = tmp_path / "plans"
    argv = ["sensitivity", "allocate", str(SWEEP), "--budget", "0.3", "--name", "t3", "--out-dir", str(plans)]
    assert main(argv) == 0
    assert (plans / "t3.json").is_file()


@pytest.mark.parametrize("via_env", [False, True])
def test_allocate_makes_no_folders_of_a_typo(tmp_path, capsys, monkeypatch, via_env):
    """A new plan folder is made only in a folder that exists (the one rule of kvlab eval --out-dir, bench
    --results-dir, figures --out): a typo'd parent made every missing folder; now exit 2, naming the flag."""
    plans = tmp_path / "missing" / "plans"
    argv = ["sensitivity", "allocate", str(SWEEP), "--budget", "0.3", "--name", "t3"]
    if via_env:
        monkeypatch.setenv("KVLAB_PLAN_DIR", str(plans))
    else:
        argv += ["--out-dir", str(plans)]
    assert main(argv) == 2
    flag = "$KVLAB_PLAN_DIR" if via_env else "--out-dir"
    assert f"error: {flag} {plans}: folder {plans.parent} does not exist" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", [float("nan"), -0.845])
def test_allocate_refuses_a_sweep_with_a_nan_or_negative_kl(tmp_path, capsys, bad):
    # the breakit pass saw "predicted KL nan" / "-0.845" and a plan file holding NaN (kvlab figures refused it)
    import json

    sweep = json.loads(SWEEP.read_text(encoding="utf-8"))
    sweep["kl"]["kivi-2"]["k"][0] = bad
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(sweep))
    plans = tmp_path / "plans"
    argv = ["sensitivity", "allocate", str(path), "--budget", "0.3", "--name", "t3", "--out-dir", str(plans)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"holds {bad!r}, not a KL >= 0" in err, err
    assert not plans.exists()


@pytest.mark.parametrize(
    "budget, said",
    [("0", "--budget '0': a fraction of the float cache must be in (0, 1]"), ("kivi-3", "--budget 'kivi-3' is neither")],
)
def test_allocate_names_a_bad_budget_by_its_flag(tmp_path, capsys, budget, said):
    # was: "budget '0': ..." (the planner's argument, not the flag typed)
    argv = ["sensitivity", "allocate", str(SWEEP), "--budget", budget, "--name", "t3", "--out-dir", str(tmp_path)]
    assert main(argv) == 2
    assert said in capsys.readouterr().err
