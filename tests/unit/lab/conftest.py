import contextlib
import io
import json

import pytest

from kvlab.cli import main


@pytest.fixture(scope="session")
def seed_lab_result():
    """`kvlab lab --json` on the mechanics chapter's toy (GQA 8/2, 16 + 192 tokens), run once for every test that reads it."""
    return _run_cli(["lab", "--json", "--no-append"])


def _run_cli(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    result = json.loads(out.getvalue())
    result["_exit_code"] = code
    return result
