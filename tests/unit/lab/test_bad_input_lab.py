"""Hostile input to ``kvlab lab``: every bad value gets ``error: ...`` naming it and exit status 2, not a
traceback from the toy decoder, the append benchmark or the model loader."""

from __future__ import annotations

import pytest

from kvlab.cli import main


@pytest.mark.parametrize(
    "argv, fragment",
    [
        # the toy decoder's errors name the flags typed, not the library's arguments (`kv_heads`)
        (["--kv-heads", "3", "--no-append"], "the toy decoder's query heads (8) must be a multiple of --kv-heads, got 3"),
        (["--kv-heads", "0", "--no-append"], "--kv-heads must be an int >= 1, got 0"),
        (["--kv-heads", "-2", "--no-append"], "--kv-heads must be an int >= 1, got -2"),
        (["--new-tokens", "0", "--no-append"], "--new-tokens must be an int >= 1, got 0"),
        (["--repeat", "0", "--no-append"], "--repeat must be >= 1, got 0"),
        (["--threads", "0", "--no-append"], "--threads"),
        (["--append-contexts", "0"], "--append-contexts must be positive token counts, got 0"),
        (["--append-contexts", "99999999999"], "99999999999"),  # ~400 TB: the allocation fails
        (["--append-contexts", "64", "64"], "--append-contexts gives 64 twice in 64 64"),  # was measured twice
        (["--real", "--tokens", "0"], "tokens"),
        (["--real", "--batch", "0"], "batch"),
        (["--real", "--dtype", "int8"], "dtype"),
        (["--real", "--model", "/no/such/model"], "/no/such/model"),
        # one mode's flags given to the other were silently ignored
        (["--real", "--new-tokens", "8"], "--new-tokens does not apply to --real"),
        (["--real", "--no-append", "--repeat", "3"], "--repeat, --no-append do not apply to --real"),
        (["--model", "x", "--tokens", "5"], "--model, --tokens do not apply to the toy decoder"),
        (["--no-append", "--append-contexts", "64"], "--append-contexts sets the append-cost measurement"),
    ],
)
def test_bad_values_are_named(capsys, argv, fragment):
    assert main(["lab", "--json", *argv]) == 2
    captured = capsys.readouterr()
    assert "error:" in captured.err and fragment in captured.err, captured.err
    assert "`" not in captured.err, captured.err  # no library argument named in place of a flag
    assert captured.out == ""


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--layers", "0"], "--layers must be an int >= 1, got 0"),
        (["--window", "0"], "--window must be an int >= 1, got 0"),
        (["--seed", "-1"], "--seed must be an int >= 0, got -1"),
        (["--noise-seed", "-1"], "--noise-seed must be an int >= 0, got -1"),
        (  # checked when the lab runs, not by the config: still named by its flags
            ["--frames", "4"],
            "--frames (4) must be >= --window + 3 (6) so that frames are denoised after an eviction",
        ),
        (  # one step: the first-step K/V control equals the right run (it exited 1, "every_control_fails")
            ["--frames", "6", "--window", "1", "--steps", "1"],
            "--steps (1) must be >= 2: with one denoising step the control that reuses the K/V of the first step "
            "equals the right run and could not fail",
        ),
        (  # checked before anything is allocated: a torch size error named nothing
            ["--frames", str(10**30)],
            f"--frames x --height x --width ({10**30} x 4 x 4 = {16 * 10**30:,} tokens) must be at most 16,384: "
            "the lab recomputes the whole video for every frame as its reference",
        ),
        (
            ["--frames", "1025"],
            "--frames x --height x --width (1025 x 4 x 4 = 16,400 tokens) must be at most 16,384: "
            "the lab recomputes the whole video for every frame as its reference",
        ),
    ],
)
def test_video_settings_are_named_by_their_flag(capsys, argv, message):
    assert main(["lab", "video", *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"kvlab lab video: error: {message}\n"
