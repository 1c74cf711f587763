"""Options of ``kvlab lab`` itself typed before ``video`` / ``eviction`` are refused (exit 2, each named), not
silently ignored: ``kvlab lab --model smollm2-135m --dtype bfloat16 eviction`` ran the bundled model in float32."""

from __future__ import annotations

import pytest

from kvlab.cli import main


@pytest.mark.parametrize(
    "argv, named",
    [
        (
            ["--model", "smollm2-135m", "--dtype", "bfloat16", "eviction", "--tokens", "300"],
            "--model, --dtype",
        ),
        (["--model", "nosuch", "eviction"], "--model"),
        (["--real", "video"], "--real"),
        (["--json", "--new-tokens", "5", "video"], "--new-tokens"),  # --json reaches video, --new-tokens does not
    ],
)
def test_lab_options_before_a_subcommand_are_refused(capsys, monkeypatch, argv, named):
    import kvlab.commands.lab.eviction
    import kvlab.commands.lab.video

    def never(args):
        raise AssertionError("the subcommand ran")

    monkeypatch.setattr(kvlab.commands.lab.eviction, "run", never, raising=False)
    monkeypatch.setattr(kvlab.commands.lab.video, "run", never, raising=False)
    assert main(["lab", *argv]) == 2
    err = capsys.readouterr().err.strip()
    sub = "eviction" if "eviction" in argv else "video"
    assert err.startswith(f"kvlab lab {sub}: error: {named} before '{sub}'"), err
    assert err.count("\n") == 0


def test_the_subcommands_own_options_still_pass(capsys):
    from kvlab.cli import build_parser

    args = build_parser().parse_args(["lab", "eviction", "--model", "m", "--dtype", "bfloat16"])
    assert (args.model, args.dtype) == ("m", "bfloat16") and not getattr(args, "lab_options_given", [])
    args = build_parser().parse_args(["lab", "--new-tokens", "8"])
    assert args.new_tokens == 8 and args.lab_command is None
