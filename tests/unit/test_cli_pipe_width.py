"""Tables printed into a pipe (CI logs, `| less`) are not cut at rich's default 80 columns."""

import os
import subprocess
import sys


def test_plan_table_in_a_pipe_is_not_truncated():
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run(
        [sys.executable, "-m", "kvlab.cli", "plan", "llama-3-8b", "--context", "8192", "--batch", "32"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert "KV total, theoretical" in out
    assert "…" not in out  # rich's ellipsis marks a cut cell
