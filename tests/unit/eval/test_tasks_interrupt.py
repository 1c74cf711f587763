"""A long ``kvlab tasks`` run keeps what it measured: the result file is written after every finished cell
(status ``running``); an interrupt after the first cell records a stop (status ``stopped``, "interrupted during
the run (...)", the cell; exit 130 / 143), as ``kvlab eval`` does, an exception a failure (exit 1), with the
finished cell kept; ``--resume FILE`` continues it, keeping the
finished cell and asking the same prompts (same seed). On the bundled model, two cells of n=2."""

from __future__ import annotations

import json

import pytest

import kvlab.eval.tasks_suite as suite
from kvlab.cli import main
from kvlab.eval.tasks_schema import validate_tasks_result

ARGV = ["tasks", "--tasks", "niah_single_1,niah_single_2", "--contexts", "256", "--n", "2",
        "--candidates", "dynamic,kivi-4", "--dtype", "float32", "--threads", "1"]  # fmt: skip


def _stop_at_second_cell(monkeypatch, out, exc):
    """Let the first cell run, then check the file on disk holds it and raise ``exc`` at the second."""
    real, seen = suite.run_task_cell, []

    def cell(model, tokenizer, samples, *args, **kw):
        seen.append([s.context_ids for s in samples])
        if len(seen) == 2:
            on_disk = json.loads(out.read_text())
            assert on_disk["status"] == "running" and len(on_disk["cells"]) == 1
            assert validate_tasks_result(on_disk) == []
            raise exc
        return real(model, tokenizer, samples, *args, **kw)

    monkeypatch.setattr(suite, "run_task_cell", cell)
    return seen


def test_interrupt_after_the_first_cell_keeps_it_and_resume_finishes(monkeypatch, tmp_path, capsys):
    out = tmp_path / "r.json"
    first = _stop_at_second_cell(monkeypatch, out, KeyboardInterrupt())
    assert main([*ARGV, "--out", str(out)]) == 130
    result = json.loads(out.read_text())
    assert validate_tasks_result(result) == []
    assert result["status"] == "stopped" and [c["task"] for c in result["cells"]] == ["niah_single_1"]
    failure = result["failures"][0]
    assert (failure["stage"], failure["type"]) == ("run", "KeyboardInterrupt")
    assert failure["message"].startswith("interrupted during the run (niah_single_2 @ 256: ")
    assert failure["cell"] == {"task": "niah_single_2", "context": 256}
    captured = capsys.readouterr()
    assert "stopped: interrupted during the run (niah_single_2 @ 256: " in captured.err
    assert f"continue with: kvlab tasks --resume {out}" in captured.err
    assert "status: stopped" in captured.out and "stopped in niah_single_2 @ 256: KeyboardInterrupt" in captured.out
    kept = result["cells"][0]

    monkeypatch.undo()
    real, again = suite.run_task_cell, []
    monkeypatch.setattr(
        suite,
        "run_task_cell",
        lambda m, t, s, *a, **k: again.append([x.context_ids for x in s]) or real(m, t, s, *a, **k),
    )
    assert main(["tasks", "--resume", str(out), "--threads", "1"]) == 0
    done = json.loads(out.read_text())
    assert validate_tasks_result(done) == [] and done["status"] == "complete" and done["failures"] == []
    assert [c["task"] for c in done["cells"]] == ["niah_single_1", "niah_single_2"]
    assert done["cells"][0] == kept  # kept, not measured again
    assert again == [first[1]]  # only the unfinished cell ran, on the prompts the first session generated
    assert done["provenance"]["resumed"][0]["failures_before"][0]["type"] == "KeyboardInterrupt"
    assert done["provenance"]["resumed"][0]["status_before"] == "stopped"
    assert {g["task"] for g in done["gates"]} == {"niah_single_1", "niah_single_2"}
    assert main(["tasks", "--resume", str(out)]) == 2  # complete: nothing to resume
    assert "nothing to resume" in capsys.readouterr().err


def test_an_exception_is_recorded_and_exits_1(monkeypatch, tmp_path, capsys):
    out = tmp_path / "r.json"
    _stop_at_second_cell(monkeypatch, out, RuntimeError("out of memory in a cache"))
    assert main([*ARGV, "--out", str(out)]) == 1
    result = json.loads(out.read_text())
    assert result["status"] == "failed" and len(result["cells"]) == 1
    assert result["failures"][0]["type"] == "RuntimeError"
    assert result["failures"][0]["message"] == "out of memory in a cache"
    assert set(result["decision"]) == {"kivi-4"}  # judged over the finished cell
    assert "RuntimeError: out of memory in a cache" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--n", "3"], ["--model", "x"], ["--quick"], ["--out", "other.json"]])
def test_resume_refuses_settings(flag, tmp_path, capsys):
    out = tmp_path / "r.json"
    out.write_text("{}")
    assert main(["tasks", "--resume", str(out), *flag]) == 2
    assert f"drop {flag[0]}" in capsys.readouterr().err


def test_sigterm_is_recorded_and_exits_143(monkeypatch, tmp_path, capsys):
    import os
    import signal

    out = tmp_path / "r.json"
    real, calls = suite.run_task_cell, []

    def cell(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal: the handler of kvlab tasks raises
        return real(*args, **kw)

    monkeypatch.setattr(suite, "run_task_cell", cell)
    before = signal.getsignal(signal.SIGTERM)
    assert main([*ARGV, "--out", str(out)]) == 143
    assert signal.getsignal(signal.SIGTERM) is before  # restored
    result = json.loads(out.read_text())
    assert result["status"] == "stopped" and len(result["cells"]) == 1
    assert result["failures"][0]["type"] == "Terminated"
    assert result["failures"][0]["message"].startswith("terminated by signal 15 during the run (niah_single_2 @ 256")
    assert "terminated by signal 15" in capsys.readouterr().err


def _stopped_file(tmp_path, **changes):
    """A tasks result as a stopped run leaves it (no model run): the skeleton of ``ARGV``'s settings."""
    result = suite.new_tasks_result(
        suite.TaskSuiteConfig(tasks=("niah_single_1",), contexts=(256,), candidates=("dynamic",), n=2),
        {"name": "bundled", "dtype": "float32", "device": "cpu"},
    )
    result.update(changes)
    path = tmp_path / "stopped.json"
    path.write_text(json.dumps(result))
    return path, result


def test_resume_refuses_a_file_a_live_kvlab_tasks_is_writing(tmp_path, capsys):
    """A running file whose writer (provenance.running_in) is a live process here is refused, the file untouched;
    once that process is gone the same file resumes past this check."""
    import subprocess
    import sys

    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path, result = _stopped_file(tmp_path)
        result["provenance"]["running_in"]["pid"] = writer.pid
        path.write_text(json.dumps(result))
        before = path.read_text()
        assert main(["tasks", "--resume", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"being written by a running kvlab tasks (pid {writer.pid})" in err
        assert path.read_text() == before
    finally:
        writer.kill()
        writer.wait()
    from kvlab.eval.resume import refuse_live_run

    refuse_live_run(path, json.loads(path.read_text()), "kvlab tasks")  # its writer is gone: no refusal


def test_resume_refuses_a_run_that_measured_no_cell(tmp_path, capsys):
    failure = {
        "stage": "run",
        "type": "NothingMeasured",
        "message": "no cell measured (x)",
        "candidate": None,
    }
    path, _ = _stopped_file(tmp_path, status="failed", failures=[failure])
    assert main(["tasks", "--resume", str(path)]) == 2
    assert "measured no cell with these settings" in capsys.readouterr().err


def test_interrupt_while_loading_a_new_run_writes_nothing(monkeypatch, tmp_path, capsys):
    """Ctrl-C before the file exists (the model loading): a stop, exit 130, no file, no traceback."""
    import kvlab.models

    def load(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(kvlab.models, "load_model", load)
    out = tmp_path / "r.json"
    assert main([*ARGV, "--out", str(out)]) == 130
    assert not out.exists()
    err = capsys.readouterr().err
    assert "stopped: interrupted during loading the model; nothing measured, no file written" in err, err


def test_sigterm_while_loading_a_resumed_run_records_a_stop_it_resumes_from(monkeypatch, tmp_path, capsys):
    """A --resume stopped while its model loads: the file says stopped (stage load_model, "terminated by signal
    15 during loading the model"), exit 143, and a later --resume takes it."""
    import kvlab.models
    from kvlab.commands import Terminated

    path, _ = _stopped_file(tmp_path, status="failed", failures=[
        {"stage": "run", "type": "RuntimeError", "message": "boom", "candidate": None}])  # fmt: skip

    def load(*a, **k):
        raise Terminated("terminated by signal 15")

    monkeypatch.setattr(kvlab.models, "load_model", load)
    assert main(["tasks", "--resume", str(path)]) == 143
    result = json.loads(path.read_text())
    assert validate_tasks_result(result) == [] and result["status"] == "stopped"
    stop = result["failures"][-1]
    assert (stop["stage"], stop["type"], stop["message"]) == (
        "load_model", "Terminated", "terminated by signal 15 during loading the model")  # fmt: skip
    assert f"continue with: kvlab tasks --resume {path}" in capsys.readouterr().err
    suite.prepare_resume(result)  # resumable: no refusal
    assert result["status"] == "running" and result["provenance"]["resumed"][-1]["status_before"] == "stopped"


def test_the_schema_takes_stopped_with_its_record_only(tmp_path):
    stop = {"stage": "run", "type": "KeyboardInterrupt", "message": "interrupted during the run (x)"}
    _, result = _stopped_file(tmp_path, status="stopped", failures=[stop])
    assert validate_tasks_result(result) == []
    result["failures"] = []
    assert validate_tasks_result(result) == ["failures: a stopped result names its stop, got []"]
    result["status"] = "halted"
    assert "status: \"halted\" not in ['running', 'complete', 'failed', 'stopped']" in validate_tasks_result(result)


def test_report_prints_a_stopped_tasks_result_as_stopped(tmp_path, capsys):
    stop = {"stage": "run", "type": "Terminated", "message": "terminated by signal 15 during the run (x)",
            "cell": {"task": "niah_single_1", "context": 256}}  # fmt: skip
    path, _ = _stopped_file(tmp_path, status="stopped", failures=[stop])
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "status: stopped (0 cells measured)" in out
    assert "stopped in niah_single_1 @ 256: Terminated: terminated by signal 15 during the run (x)" in out
    assert "failed in" not in out
