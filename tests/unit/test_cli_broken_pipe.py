"""``kvlab`` whose stdout reader goes away early (``kvlab plan MODEL --json | head -1``): a quiet exit, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvlab.cli import main


@pytest.mark.parametrize(
    "argv, status",
    [
        (["plan", "llama-3-8b", "--json"], 1),  # print() of one JSON document
        (["roofline"], 1),  # rich tables (rich redirects stdout and exits 1 itself)
        (["plan", "--help"], 0),  # argparse help: argparse ignores the write error, then exits 0
    ],
)
def test_closed_pipe_ends_quietly(argv, status):
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvlab.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader is gone before kvlab writes a byte: every write meets a closed pipe
    _, err = proc.communicate(timeout=120)
    text = err.decode(errors="replace")
    assert "BrokenPipeError" not in text and "Traceback" not in text, text
    assert proc.returncode == status, (proc.returncode, text)


class _ClosedPipe:
    """A stdout whose reader has gone: every write and flush raises ``BrokenPipeError``; no file descriptor."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self):
        import io

        raise io.UnsupportedOperation("fileno")


def test_main_returns_1_when_stdout_raises_broken_pipe(monkeypatch):
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["plan", "llama-3-8b", "--json"]) == 1
