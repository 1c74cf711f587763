"""An unknown flag is reported by the subcommand it was given to (``kvlab bench decode: error: unrecognized
arguments: --bogus``, status 2), as every other error of that subcommand, not by the top-level parser with its
usage; Ctrl-C in a command that keeps nothing of its run is one line and status 130, not a traceback."""

import pytest

from kvlab.cli import main


@pytest.mark.parametrize(
    "argv, prog",
    [
        (["--bogus"], "kvlab"),
        (["plan", "llama-3-8b", "--bogus"], "kvlab plan"),
        (["bench", "decode", "--bogus"], "kvlab bench decode"),
        (["paging", "static", "--bogus", "x"], "kvlab paging static"),
        (["lab", "eviction", "--bogus"], "kvlab lab eviction"),
    ],
)
def test_an_unknown_flag_names_its_subcommand(argv, prog, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    extra = " ".join(argv[argv.index("--bogus") :])
    assert err[-1] == f"{prog}: error: unrecognized arguments: {extra}"
    assert err[0].startswith(f"usage: {prog}")  # its own usage, not the top-level one


def test_ctrl_c_is_one_line_and_status_130(monkeypatch, capsys):
    import kvlab.commands.models as models_command

    def interrupted(as_json):
        raise KeyboardInterrupt

    monkeypatch.setattr(models_command, "_list", interrupted)
    assert main(["models"]) == 130
    assert capsys.readouterr().err.strip() == "kvlab models: interrupted"


def test_a_flag_is_never_read_as_an_abbreviation_of_another(capsys):
    """'kvlab paging static --gpu H100-SXM' was read as --gpu-mem-gib ("invalid float value: 'H100-SXM'") when
    paging had no --gpu. Every parser now refuses abbreviations: an unknown flag is named as such."""
    from kvlab.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["paging", "static", "--gpu-mem", "80"])  # a prefix of --gpu-mem-gib
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --gpu-mem 80" in err
    with pytest.raises(SystemExit):
        main(["plan", "llama-3-8b", "--cont", "4096"])  # no prefix of --context either
    assert "unrecognized arguments: --cont" in capsys.readouterr().err
