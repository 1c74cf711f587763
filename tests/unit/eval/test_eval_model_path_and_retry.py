"""A model path that is not there is bad input (exit 2, nothing written), as in ``kvlab lab``, ``inspect`` and
``bench``; a later load failure stays a recorded exit 1; an existing result of a failed or unfinished run says so
when it blocks a retry of its label."""

from __future__ import annotations

import json

import pytest

from kvlab.cli import main
from kvlab.eval.config import EvalConfig
from kvlab.eval.runner import new_result


def err_of(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())  # rich wraps long lines


@pytest.mark.parametrize("kind", ["missing", "file", "not-gguf"])
def test_a_bad_model_path_is_exit_2_before_any_file_is_written(tmp_path, capsys, kind):
    """--model /no/such/dir was exit 1 (a result file recording a load failure); lab/inspect/bench say 2."""
    model = {
        "missing": tmp_path / "no" / "such",
        "file": tmp_path / "afile",
        "not-gguf": tmp_path / "m.gguf",
    }[kind]
    if kind != "missing":
        model.write_text("not a model")
    out = tmp_path / "res"
    assert main(["eval", "--quick", "--model", str(model), "--out-dir", str(out), "--label", "m"]) == 2
    assert str(model.name) in err_of(capsys)
    assert not out.exists()


def test_a_load_failure_after_the_path_check_is_recorded_as_exit_1(tmp_path, capsys, monkeypatch):
    def unreachable(*a, **k):
        raise OSError("the hub cannot be reached")

    monkeypatch.setattr("kvlab.models.load_model", unreachable)
    assert main(["eval", "--quick", "--out-dir", str(tmp_path), "--label", "h"]) == 1
    assert "could not load the model: OSError: the hub cannot be reached" in err_of(capsys)
    result = json.loads((tmp_path / "h.json").read_text())
    assert result["status"] == "failed" and result["failures"][0]["stage"] == "load_model"


# ── a result file of a failed run ─────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "status, words",
    [
        ("failed", "the earlier run with this label failed (status failed); pass --resume "),
        ("stopped", "the earlier run with this label was stopped (status stopped: Ctrl-C or SIGTERM); pass --resume "),
        (
            "running",
            "the earlier run with this label did not finish (status running: stopped, or still running)",
        ),
        ("complete", "already exists; choose another --label or pass --force to overwrite it"),
    ],
)
def test_an_existing_result_says_whether_its_run_failed(tmp_path, capsys, status, words):
    result = new_result(EvalConfig(), "again", None)
    result["status"] = status
    (tmp_path / "again.json").write_text(json.dumps(result))
    assert main(["eval", "--dry-run", "--quick", "--out-dir", str(tmp_path), "--label", "again"]) == 2
    assert words in err_of(capsys)
    assert json.loads((tmp_path / "again.json").read_text())["status"] == status  # kept
    assert (
        main(["eval", "--dry-run", "--quick", "--out-dir", str(tmp_path), "--label", "again", "--force"]) == 0
    )


def test_an_existing_result_names_resume_only_when_it_records_its_finished_cells(tmp_path, capsys):
    """A file of a failed run names ``--resume <file>``, unless it is older than --resume (no ``cells_done``)."""
    result = new_result(EvalConfig(), "again", None)
    result["status"] = "failed"
    path = tmp_path / "again.json"
    path.write_text(json.dumps(result))
    argv = ["eval", "--dry-run", "--quick", "--out-dir", str(tmp_path), "--label", "again"]
    assert main(argv) == 2
    assert f"pass --resume {path} to continue it, --force to replace it" in err_of(capsys)
    del result["cells_done"]
    path.write_text(json.dumps(result))
    assert main(argv) == 2
    err = err_of(capsys)
    assert "failed (status failed); pass --force to replace it or choose another --label" in err
    assert "--resume" not in err


def test_a_device_this_machine_lacks_is_bad_input_before_any_result_file(tmp_path, capsys):
    import torch

    from kvlab.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --device cuda is valid here")
    assert (
        main(["eval", "--device", "cuda", "--quick", "--out-dir", str(tmp_path / "r"), "--label", "x"]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "`device` (--device) is 'cuda' but CUDA is not available" in err[0]
    assert not (tmp_path / "r").exists()


def test_a_gguf_of_another_version_is_refused_in_words_that_fit_eval(tmp_path, capsys):
    """The GGUF reader is shared with kvlab plan: its refusal names kvlab, not the planner, when eval calls it."""
    import struct

    model = tmp_path / "fake.gguf"
    model.write_bytes(b"GGUF" + struct.pack("<I", 9) + bytes(64))
    out = tmp_path / "res"
    assert main(["eval", "--quick", "--model", str(model), "--out-dir", str(out), "--label", "g"]) == 2
    err = err_of(capsys)
    assert f"{model} is GGUF version 9; kvlab reads GGUF versions 2 and 3" in err and "planner" not in err
    assert not out.exists()
