"""``kvlab eval --resume RESULT`` on the command line: an interrupted run continued in place, and each refusal
(exit 2, one line naming the file and the reason, the file left as it was)."""

from __future__ import annotations

import json

import pytest

from kvlab.cli import main
from kvlab.eval import runner
from kvlab.eval.decision import summarize
from kvlab.eval.runner import new_result
from kvlab.eval.schema import validate_result
from tests.conftest import make_tiny_qwen2
from tests.unit.eval.test_eval_resume import interrupt_after, same_rows
from tests.unit.eval.test_eval_unit import CharTokenizer

# ── the interrupted run ──────────────────────────────────────────────────────────────────────────────────────

TINY = [
    "eval",
    "--candidates",
    "dynamic,kivi-8,kivi-2,fp8-e4m3",
    "--contexts",
    "96,160",
    "--new-tokens",
    "6",
    "--residual",
    "16",
    "--group-size",
    "16",
    "--window-context",
    "96",
    "--window-new-tokens",
    "8",
    "--window-residuals",
    "16",
    "--window-group-size",
    "16",
    "--warmup",
    "0",
    "--repeat",
    "1",
    "--quality-tokens",
    "4",
    "--prompt-mode",
    "repeat",
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--threads",
    "1",
    "--workers",
    "1",
    "--passkey-trials",
    "2",
    "--max-latency-ratio",
    "1000",  # a tiny model's latency ratios are noise: keep the decision on the other gates
]


def err_of(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())  # rich wraps long lines


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_qwen2(head_dim=16, max_positions=512)


@pytest.fixture
def loaded(tiny, monkeypatch):
    """``kvlab eval`` loads the tiny model (its bundled-model provenance, fingerprint included, stays)."""
    monkeypatch.setattr("kvlab.models.load_model", lambda *a, **k: (tiny, CharTokenizer()))


@pytest.mark.parametrize("killed", [False, True])
def test_eval_resume_continues_an_interrupted_run_in_place(tmp_path, capsys, monkeypatch, loaded, killed):
    """Ctrl-C after the first cell's rows: exit 130, the file keeps that cell; ``--resume`` (also of a run killed
    without a word, its file left ``running``) keeps it, measures the others and ends as an uninterrupted run."""
    assert main([*TINY, "--out-dir", str(tmp_path), "--label", "whole"]) == 0
    whole = json.loads((tmp_path / "whole.json").read_text())
    real_time = runner._Run.time
    interrupt_after(monkeypatch, "time", 1)
    path = tmp_path / "cut.json"
    assert main([*TINY, "--out-dir", str(tmp_path), "--label", "cut"]) == 130
    monkeypatch.setattr(runner._Run, "time", real_time)
    cut = json.loads(path.read_text())
    assert cut["status"] == "stopped" and cut["cells_done"] == [{"matrix": "capacity", "context_length": 96}]
    assert len(cut["rows"]) == 4 and cut["failures"][-1]["type"] == "KeyboardInterrupt"
    assert cut["failures"][-1]["message"].startswith("interrupted during the run (")
    assert isinstance(cut["elapsed_s"], float) and cut["elapsed_s"] > 0  # the stopped session's time
    # the stop line counts what the resume keeps, in the resume line's words
    kept = "1 of 3 cells finished and kept (4 rows); 2 measured and kept, to be timed"
    assert f"in {path}: {kept}; continue with: kvlab eval --resume {path}" in err_of(capsys)
    stopped = [{k: cut["failures"][-1][k] for k in ("stage", "type", "message")}]
    if killed:  # kill -9 right after the save: no failure or time recorded, status still running
        cut["status"], cut["failures"], cut["elapsed_s"] = "running", [], None
        path.write_text(json.dumps(cut))
    capsys.readouterr()
    assert main(["eval", "--resume", str(path)]) == 0
    out, said = capsys.readouterr()
    out, said = " ".join(out.split()), " ".join(said.split())
    assert "resuming cut: 1 of 3 cells finished and kept (4 rows); 2 measured and kept, to be timed" in said
    assert "measuring the other" not in said  # nothing left to measure: the interrupt came while timing
    result = json.loads(path.read_text())
    assert result["status"] == "complete" and result["failures"] == [] and validate_result(result) == []
    assert result["label"] == "cut" and result["settings"] == cut["settings"]
    same_rows(whole, result)
    assert result["rows"][:4] == cut["rows"]  # the kept rows, timings and all
    assert result["summary"]["decision"] == whole["summary"]["decision"]
    (record,) = result["provenance"]["resumed"]
    assert record["cells_kept"] == 1 and record["rows_kept"] == 4 and record["cells_measured_kept"] == 2
    assert record["cells_to_measure"] == 0  # the interrupt came in the timing phase: every cell was measured
    assert record["status_before"] == ("running" if killed else "stopped")
    assert record["stopped_by"] == ([] if killed else stopped)
    # the whole run's time: the stopped session's recorded, a killed one's not
    assert record["earlier_elapsed_s"] == (None if killed else cut["elapsed_s"])
    total = f"{result['elapsed_s'] + (cut['elapsed_s'] or 0):.1f} s over the run's 2 sessions"
    last = f"elapsed {result['elapsed_s']:.1f} s in the last session"
    assert last in out and ("only (an earlier session" in out if killed else total in out), out
    assert main(["eval", "--resume", str(path)]) == 2  # finished now: nothing to resume
    assert "is a finished run (status complete): nothing to resume" in err_of(capsys)


def test_a_resume_interrupted_again_can_be_resumed(tmp_path, capsys, monkeypatch, loaded):
    """Interrupted in the first session after one cell, in the resumed one after one more: the second resume keeps
    both and measures the last."""
    real_time = runner._Run.time
    interrupt_after(monkeypatch, "time", 1)
    path = tmp_path / "twice.json"
    assert main([*TINY, "--out-dir", str(tmp_path), "--label", "twice"]) == 130
    monkeypatch.setattr(runner._Run, "time", real_time)
    interrupt_after(monkeypatch, "time", 1)
    assert main(["eval", "--resume", str(path)]) == 130
    monkeypatch.setattr(runner._Run, "time", real_time)
    assert len(json.loads(path.read_text())["cells_done"]) == 2
    assert main(["eval", "--resume", str(path)]) == 0
    result = json.loads(path.read_text())
    assert [r["cells_kept"] for r in result["provenance"]["resumed"]] == [1, 2]
    assert result["status"] == "complete" and len(result["cells_done"]) == 3 and len(result["rows"]) == 12


def test_sigterm_is_recorded_and_exits_143(tmp_path, capsys, monkeypatch, loaded):
    """SIGTERM (a scheduler or ``kill``) after the first timed cell: the file keeps that cell and says what stopped
    the run, and the status is the shell's for SIGTERM (143), not 1 (a failed run) or 130 (Ctrl-C)."""
    real = runner._Run.time
    calls = []

    def terminated(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(runner._Run, "time", terminated)
    assert main([*TINY, "--out-dir", str(tmp_path), "--label", "term"]) == 143
    cut = json.loads((tmp_path / "term.json").read_text())
    assert cut["status"] == "stopped" and len(cut["cells_done"]) == 1
    failure = cut["failures"][-1]
    assert failure["stage"] == "run" and failure["type"] == "Terminated"
    assert failure["message"].startswith("terminated by signal 15 during the run (")
    path = tmp_path / "term.json"
    said = err_of(capsys)
    assert "stopped: terminated by signal 15 during the run (" in said
    assert f"in {path}: 1 of 3 cells finished and kept (4 rows); 2 measured and kept" in said


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_stop_while_the_model_loads_is_recorded_as_a_stop(tmp_path, capsys, monkeypatch, signal_name):
    """Ctrl-C or SIGTERM while the model loads: status stopped at stage load_model, "interrupted during loading the
    model" (not "could not load the model: KeyboardInterrupt"), the shell's status for the signal, and --resume
    continues the run from the start."""
    import os
    import signal

    def stop(*args, **kwargs):
        if signal_name == "SIGINT":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the load")

    monkeypatch.setattr("kvlab.models.load_model", stop)
    code = main([*TINY, "--out-dir", str(tmp_path), "--label", "load"])
    assert code == (130 if signal_name == "SIGINT" else 143)
    result = json.loads((tmp_path / "load.json").read_text())
    assert result["status"] == "stopped" and validate_result(result) == []
    (failure,) = result["failures"]
    assert failure["stage"] == "load_model"
    cause = "interrupted" if signal_name == "SIGINT" else "terminated by signal 15"
    assert failure["message"] == f"{cause} during loading the model"
    said = err_of(capsys)
    assert "could not load the model" not in said and "error" not in said
    path = tmp_path / "load.json"
    assert f"stopped: {cause} during loading the model; in {path}: 0 of 3 cells finished and kept (0 rows);" in said
    assert result["elapsed_s"] == 0.0  # nothing measured in that session
    assert main(["report", str(path)]) == 0  # the report calls it a stop too
    out = " ".join(capsys.readouterr().out.split())
    assert f"stopped at load_model: {failure['type']}: {cause} during loading the model" in out and "failed" not in out


# ── refusals: exit 2, one line naming the file and the reason, the file unchanged ────────────────────────────────


SUMMARY = summarize({"rows": [], "candidates": [], "failures": [], "gates": {}, "provenance": {}})


def interrupted_file(tmp_path, **changes) -> str:
    """A result file as an interrupted run of ``TINY``'s settings leaves it (no cell finished)."""
    from kvlab.cli import build_parser
    from kvlab.commands.eval.settings import config_from_args

    cfg = config_from_args(build_parser().parse_args(TINY))
    result = new_result(cfg, "r", None)
    result["status"] = "failed"
    result["failures"] = [{"candidate": None, "stage": "run", "type": "KeyboardInterrupt", "message": "x"}]
    result.update(changes)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    return str(path)


def refused(capsys, argv: list[str], path: str, words: str) -> None:
    before = open(path).read() if path else None
    assert main(argv) == 2
    err = err_of(capsys)
    assert "kvlab eval: error:" in err and words in err, err
    if path:
        assert path in err and open(path).read() == before


def test_resume_refuses_another_setting_flag(tmp_path, capsys):
    path = interrupted_file(tmp_path)
    refused(capsys, ["eval", "--resume", path, "--seed", "7", "--quick"], path, "drop --seed, --quick")
    refused(
        capsys, ["eval", "--resume", path, "--out-dir", "x"], path, "takes its settings, label and folder"
    )


@pytest.mark.parametrize(
    "content, words",
    [
        ({"hello": 1}, "not a kvlab eval result"),
        ("not json", "is not valid JSON"),
        (None, "no result file at"),
    ],
)
def test_resume_refuses_a_file_that_is_not_a_result(tmp_path, capsys, content, words):
    path = tmp_path / "x.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    assert main(["eval", "--resume", str(path)]) == 2
    err = err_of(capsys)
    assert "cannot resume: " in err and words in err and str(path) in err, err


@pytest.mark.parametrize(
    "changes, words",
    [
        (
            {"status": "complete", "summary": SUMMARY},
            "is a finished run (status complete): nothing to resume",
        ),
        ({"status": "partial", "summary": SUMMARY}, "is a finished run (status partial): nothing to resume"),
        ({"status": "dry_run"}, "is a dry run's plan (status dry_run), not an interrupted run"),
        ({"cells_done": None}, "records no finished cells"),
        ({"cells_done": [{"matrix": "capacity", "context_length": 512}]}, "not a cell of its settings"),
        ({"plan": []}, "its plan is not the one its settings give"),
    ],
)
def test_resume_refuses_a_result_it_cannot_continue(tmp_path, capsys, changes, words):
    path = interrupted_file(tmp_path, **changes)
    refused(capsys, ["eval", "--resume", path], path, words)


def test_resume_refuses_settings_this_kvlab_cannot_read(tmp_path, capsys):
    result = json.loads(open(interrupted_file(tmp_path)).read())
    result["settings"]["kv_magic"] = 1
    del result["settings"]["seed"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(result))
    words = "its settings lacks ['seed'] and has unknown ['kv_magic']: written by another kvlab version"
    refused(capsys, ["eval", "--resume", str(path)], str(path), words)


def test_resume_refuses_results_of_other_software(tmp_path, capsys):
    result = json.loads(open(interrupted_file(tmp_path)).read())
    result["provenance"]["software"]["torch"] = "0.0.1"
    path = tmp_path / "sw.json"
    path.write_text(json.dumps(result))
    refused(
        capsys,
        ["eval", "--resume", str(path)],
        str(path),
        "was measured with other software (torch 0.0.1 then",
    )


def test_resume_refuses_another_model(tmp_path, capsys, loaded):
    """The model is loaded, its fingerprint compared with the file's: another model's rows would be mixed in."""
    fingerprint = "sha256:" + "0" * 64
    provenance = json.loads(open(interrupted_file(tmp_path)).read())["provenance"]
    provenance["model"] = {"fingerprint": fingerprint, "device": "cpu"}
    path = interrupted_file(tmp_path, provenance=provenance)
    refused(capsys, ["eval", "--resume", path], path, f"measured a model with fingerprint {fingerprint}")


def test_resume_refuses_a_file_a_live_run_is_writing_and_takes_one_whose_writer_is_gone(tmp_path, capsys):
    """Two resumes of one file would measure it twice and the last writer would win: a file whose writer
    (provenance.running_in) is alive on this machine is refused; one whose writer died is resumable."""
    import socket
    import subprocess
    import sys

    from kvlab.eval.resume import load_resumable

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        result = json.loads(open(interrupted_file(tmp_path)).read())
        result["status"] = "running"
        result["provenance"]["running_in"] = {"pid": live.pid, "host": socket.gethostname()}
        path = tmp_path / "busy.json"
        path.write_text(json.dumps(result))
        refused(
            capsys,
            ["eval", "--resume", str(path)],
            str(path),
            f"being written by a running kvlab eval (pid {live.pid})",
        )
    finally:
        live.kill()
        live.wait()
    load_resumable(path)  # its writer is gone now: resumable
