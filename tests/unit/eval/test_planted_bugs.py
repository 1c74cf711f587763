"""Every bug planted by ``scripts/check_planted_bugs.py`` must make a test of the eval fail (about 2 minutes)."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "check_planted_bugs.py"


@pytest.mark.slow
def test_every_planted_bug_is_caught(capsys):
    spec = importlib.util.spec_from_file_location("check_planted_bugs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    code = module.main([])
    assert code == 0, capsys.readouterr().out
