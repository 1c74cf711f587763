"""Fixtures for the tests of scripts/train_reference.py (a script, not a package module: loaded from its path)."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "train_reference.py"


@pytest.fixture(scope="session")
def tr():
    """scripts/train_reference.py as a module (registered in sys.modules so its dataclasses resolve)."""
    spec = importlib.util.spec_from_file_location("train_reference_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
