"""``kvlab lab eviction``: a bad value names the flag the user typed (README: 'kvlab <command>: error: ...' with
the flag), as its --window/--tokens/--sinks errors do.
"""

from __future__ import annotations

from kvlab.cli import main


def test_bad_dtype_names_the_flag(capsys):
    assert main(["lab", "eviction", "--dtype", "float8"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "kvlab lab eviction: error: --dtype" in err and "'float8'" in err


def test_a_cut_past_the_held_out_text_names_the_flags(capsys):
    assert main(["lab", "eviction", "--offset", "99999999", "--tokens", "16", "--window", "4"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--offset 99999999" in err and "--tokens 16" in err and "n_tokens" not in err, err


def test_tokens_not_above_window_and_sinks_names_every_flag(capsys):
    assert main(["lab", "eviction", "--tokens", "64", "--window", "8", "--sinks", "100", "0"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--tokens (64)" in err and "--window" in err and "--sinks" in err and "8 + 100 = 108" in err, err
    assert "window_length" not in err, err
