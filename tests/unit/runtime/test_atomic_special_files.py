"""kvlab bench docs --out <a character device> --force replaced the device with a regular file, and a FIFO as
--out hung (the old page was read to check its stamp). Now an existing output that is not a regular file is refused
before anything is read or written: by the commands' preflight (kvlab.runtime.atomic.output_problem) and by the
shared atomic writer itself (every --out written through it), naming the path and what it is."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.runtime.atomic import atomic_write_text, output_problem, special_file

SRC = Path(__file__).resolve().parents[3] / "src"


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "page.md"
    os.mkfifo(path)
    return path


@pytest.fixture
def device_link(tmp_path):
    """A link to the character device /dev/null: the writer would replace the link (never the device itself)."""
    path = tmp_path / "null.md"
    path.symlink_to(os.devnull)
    return path


def test_bench_docs_force_over_a_device_is_refused_and_the_device_stays(device_link, capsys):
    assert main(["bench", "docs", "--out", str(device_link), "--force"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--out {device_link} is a character device, not a regular file" in err, err
    assert device_link.is_symlink() and stat.S_ISCHR(os.stat(device_link).st_mode)


def test_bench_docs_force_over_a_fifo_is_refused_and_the_fifo_stays(fifo, capsys):
    assert main(["bench", "docs", "--out", str(fifo), "--force"]) == 2
    assert f"--out {fifo} is a FIFO, not a regular file" in " ".join(capsys.readouterr().err.split())
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_bench_docs_over_a_fifo_does_not_wait(fifo):
    # in a child with a timeout: before, it waited on the FIFO for ever
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-m", "kvlab", "bench", "docs", "--out", str(fifo)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"--out {fifo} is a FIFO" in " ".join(done.stderr.split())


def test_the_atomic_writer_refuses_a_special_file(fifo, device_link):
    for path, what in ((fifo, "a FIFO"), (device_link, "a character device")):
        assert special_file(path) == what
        with pytest.raises(OSError, match=f"is {what}, not a regular file") as caught:
            atomic_write_text(path, "x")
        assert caught.value.filename == str(path)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and device_link.is_symlink()


def test_regular_files_folders_and_absent_paths_are_not_special(tmp_path):
    page = tmp_path / "p.md"
    assert special_file(page) is None and output_problem(page, "--out") is None
    atomic_write_text(page, "x")
    assert special_file(page) is None and special_file(tmp_path) is None
    atomic_write_text(page, "y")
    assert page.read_text() == "y"
