"""``--threads`` above the CPUs this process may use is refused by every command that has it (breakit item 23:
``kvlab lab --threads 999`` on a 2-CPU machine ran for minutes), before any work. kvlab eval's EvalConfig
already bounds it (tests/unit/eval/test_bad_input_eval_candidates.py)."""

from __future__ import annotations

import pytest

from kvlab.cli import main
from kvlab.runtime import timing


@pytest.mark.parametrize(
    "argv",
    [
        ["lab", "--threads", "3"],
        ["tasks", "--quick", "--threads", "3", "--dry-run"],
    ],
)
def test_threads_above_the_usable_cpus_is_refused(monkeypatch, tmp_path, capsys, argv):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(timing, "usable_cpus", lambda: 2)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--threads 3 is more than the 2 CPUs this process may use" in err, err
    assert list(tmp_path.iterdir()) == []


def test_check_threads():
    assert timing.check_threads(None) is None and timing.check_threads(2, cpus=2) == 2
    with pytest.raises(ValueError, match="--threads must be an int >= 1, got 0"):
        timing.check_threads(0)
    with pytest.raises(ValueError, match="--torch-threads 5 is more than the 4 CPUs"):
        timing.check_threads(5, "--torch-threads", cpus=4)
