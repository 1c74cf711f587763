"""``python -m kvlab`` runs the same command line as the ``kvlab`` script (a venv whose bin is not on PATH)."""

import subprocess
import sys


def test_python_m_kvlab_is_the_kvlab_command():
    out = subprocess.run([sys.executable, "-m", "kvlab", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().startswith("kvlab ")
    bad = subprocess.run([sys.executable, "-m", "kvlab", "plan", "--batch", "0"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "kvlab plan: error:" in bad.stderr  # refusals named as the script names them
