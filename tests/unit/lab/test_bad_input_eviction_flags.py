"""``kvlab lab eviction``: a bad value names the flag the user typed (README: 'kvlab <command>: error: ...' with
the flag), as its --window/--tokens/--sinks errors do.
"""

from __future__ import annotations

from kvlab.cli import main


def test_bad_dtype_names_the_flag(capsys):
    assert main(["lab", "eviction", "--dtype", "float8"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "kvlab lab eviction: error: --dtype" in err and "'float8'" in err
