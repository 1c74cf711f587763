"""A result path that is a device (``/dev/null``) was "no result file at /dev/null" from every reader of
:func:`kvlab.eval.io.read_result` (``kvlab tasks --resume`` / ``--merge``, ``kvlab sensitivity verify RESULT``):
it is there, and not a regular file; the shared check (:func:`kvlab.runtime.atomic.special_input_problem`) says so."""

from __future__ import annotations

import os

import pytest

from kvlab.cli import main
from kvlab.eval.io import read_result

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")


@pytest.mark.parametrize(
    ("tasks", "what"), [(False, "a kvlab eval result JSON"), (True, "a kvlab eval or tasks result JSON")]
)
def test_read_result_names_a_device(tasks, what):
    with pytest.raises(ValueError) as info:
        read_result("/dev/null", tasks=tasks)
    assert str(info.value) == f"/dev/null is a character device, not a regular file; pass {what}"


@pytest.mark.parametrize(
    "argv",
    [
        ["tasks", "--resume", "/dev/null"],
        ["tasks", "--merge", "/dev/null", "other.json", "--out", "merged.json"],
        ["sensitivity", "verify", "/dev/null"],
    ],
)
def test_commands_reading_a_result_name_a_device(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "/dev/null is a character device, not a regular file" in err and "no result file" not in err, err
