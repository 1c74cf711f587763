"""The shared progress output of long commands and the third-party quieting of ``kvlab`` (``--verbose`` keeps it)."""

from __future__ import annotations

import io
import os
import warnings

import pytest
from rich.console import Console

from kvlab.cli import build_parser
from kvlab.commands import progress, quiet_third_party


def test_plain_output_is_one_line_per_step_as_it_starts():
    out = io.StringIO()
    with progress(Console(file=out, force_terminal=False, width=120), 3, "test") as bar:
        bar.start("first")
        bar.start("second")
        bar.advance()  # the step-callback and the describe/advance styles mix
        bar.describe("third")
        bar.advance()
    lines = out.getvalue().splitlines()
    assert [line.split("s  ", 1)[1] for line in lines] == ["first", "second", "third"]
    assert [line.split("]")[0] for line in lines] == ["[1/3", "[2/3", "[3/3"]


def test_the_last_started_step_is_finished_on_exit_but_not_after_an_error():
    out = io.StringIO()
    with progress(Console(file=out, force_terminal=False), 2) as bar:
        bar.start("a")
        bar.start("b")
    assert out.getvalue().count("\n") == 2
    out = io.StringIO()
    with pytest.raises(RuntimeError), progress(Console(file=out, force_terminal=False), 2) as bar:
        bar.start("a")
        assert out.getvalue().splitlines()[-1].endswith("s  a"), "the line names the step while it runs"
        raise RuntimeError("boom")
    assert out.getvalue().count("\n") == 1, "a failed step is not followed by another line"


def test_a_terminal_gets_a_bar_not_lines():
    out = io.StringIO()
    with progress(Console(file=out, force_terminal=True, width=100), 2, "bar title") as bar:
        bar.start("step one")
        bar.start("step two")
    assert "[1/2]" not in out.getvalue() and "2/2" in out.getvalue()


def test_total_must_be_positive():
    with pytest.raises(ValueError, match="`total`"):
        progress(Console(file=io.StringIO()), -1)


def test_third_party_warnings_are_quiet_unless_verbose():
    def emitted(verbose: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with quiet_third_party(verbose):
                for module in ("torch.nn.modules.module", "transformers.utils", "kvlab.eval.runner"):
                    warnings.warn_explicit(f"from {module}", FutureWarning, "x.py", 1, module=module)
        return [str(w.message) for w in caught]

    assert emitted(False) == ["from kvlab.eval.runner"]
    assert len(emitted(True)) == 3


def test_quieting_is_undone_after_the_command(monkeypatch):
    from transformers.utils import logging as hf_logging

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    hf_logging.enable_progress_bar()
    level = hf_logging.get_verbosity()
    with quiet_third_party(False):
        assert not hf_logging.is_progress_bar_enabled()
        assert hf_logging.get_verbosity() == hf_logging.ERROR
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert hf_logging.is_progress_bar_enabled() and hf_logging.get_verbosity() == level
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ


def test_a_users_environment_setting_wins(monkeypatch):
    from transformers.utils import logging as hf_logging

    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    level = hf_logging.get_verbosity()
    with quiet_third_party(False):
        assert hf_logging.get_verbosity() == level and os.environ["TRANSFORMERS_VERBOSITY"] == "info"


def test_verbose_is_a_top_level_flag():
    assert build_parser().parse_args(["--verbose", "plan", "llama-3-8b"]).verbose is True
    assert build_parser().parse_args(["plan", "llama-3-8b"]).verbose is False


PROFILE = """
from kvlab.commands import quiet_third_party
import torch
from torch.profiler import ProfilerActivity, profile
with quiet_third_party({verbose}):
    with profile(activities=[ProfilerActivity.CPU]):
        torch.ones(3) + 1
"""


def test_the_torch_profiler_native_log_lines_are_quiet_unless_verbose(monkeypatch):
    """kvlab bench decode --profile-context printed kineto's "USDT: ... profiler_start" / "profiler_stop" lines on
    stderr (native code: only a process of its own shows what reaches file descriptor 2)."""
    import subprocess
    import sys

    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    quiet = subprocess.run(
        [sys.executable, "-c", PROFILE.format(verbose=False)], capture_output=True, text=True
    )
    assert quiet.returncode == 0 and "profiler_start" not in quiet.stderr + quiet.stdout, quiet.stderr
    with quiet_third_party(False):
        assert os.environ["KINETO_LOG_LEVEL"] == "6"
    assert "KINETO_LOG_LEVEL" not in os.environ
    monkeypatch.setenv("KINETO_LOG_LEVEL", "3")  # the user's own setting wins
    with quiet_third_party(False):
        assert os.environ["KINETO_LOG_LEVEL"] == "3"
