"""``kvlab video``'s messages: numbers written as kvlab writes them, and sizes the compression does not divide.

A user ran ``kvlab video --seconds 0.1``: refused with "... got 2.4000000000000004" (a float's repr); and
``kvlab video --width 1281``: 160 tokens per row, as for 1280, with nothing said about the dropped pixel.
"""

from __future__ import annotations

import json

import pytest

from kvlab.cli import main
from kvlab.plan.config_fields import count_text, number_text
from kvlab.plan.video import VideoClip


def _err(capsys, *argv: str, code: int) -> str:
    assert main(["video", *argv]) == code
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "value, text",
    [(8192, "8,192"), (2.4000000000000004, "2.4"), (5.0, "5"), (1e30, "1e+30"), (0.125, "0.125"), (-1.0, "-1")],
)
def test_number_text_writes_ints_with_separators_and_floats_short(value, text):
    assert number_text(value) == text


@pytest.mark.parametrize("value", [float("nan"), "abc", None, True])
def test_number_text_names_what_is_not_a_number_as_given(value):
    assert number_text(value) == repr(value)


def test_a_clip_of_a_fractional_frame_count_is_refused_without_float_noise(capsys):
    seconds, fps = 0.1, 24
    err = _err(capsys, "--seconds", str(seconds), "--fps", str(fps), code=2)
    assert repr(seconds * fps) not in err, err  # was "got 2.4000000000000004"
    assert f"--seconds {seconds:g} x --fps {fps} = {seconds * fps:.12g} frames" in err, err


def test_a_negative_or_repeated_length_is_named_as_typed(capsys):
    assert "got -1\n" in _err(capsys, "--seconds", "-1", code=2)  # was "got -1.0"
    err = _err(capsys, "--seconds", "5", "5", code=2)
    assert "5.0" not in err and "--seconds lists 5 more than once" in err, err


@pytest.mark.parametrize("flag, other", [("--width", "--height"), ("--height", "--width")])
@pytest.mark.parametrize("patch", [1, 2])
def test_a_side_the_token_stride_does_not_divide_is_rounded_down_with_a_warning(capsys, flag, other, patch):
    stride = VideoClip.spatial_compression * patch
    pixels = getattr(VideoClip, flag[2:]) + 1  # the default side plus one pixel
    argv = ["--seconds", "5", flag, str(pixels), "--patch-size", str(patch), "--json"]
    err = _err(capsys, *argv, code=0)
    assert f"{flag} {pixels:,} is not a multiple of a token's {stride} px" in err, err
    assert f"--spatial-compression {VideoClip.spatial_compression} x --patch-size {patch}" in err, err
    assert f"{pixels - 1:,} px used" in err and f"{(pixels - 1) // stride:,} tokens" in err, err
    assert f"warning: {other}" not in err, err


def test_a_side_the_stride_divides_is_not_warned_about(capsys):
    err = _err(capsys, "--seconds", "5", "--width", "1288", "--json", code=0)  # 161 latents of 8 px
    assert "not a multiple" not in err, err


@pytest.mark.parametrize("causal, fps", [(False, 25), (True, 24)])  # 125 frames; 120 (not 1 + 4k)
def test_frames_past_the_last_latent_frame_are_dropped_with_a_warning(capsys, causal, fps):
    tc = VideoClip.temporal_compression
    clip = VideoClip(5, fps, causal_first_frame=causal)
    argv = ["--seconds", "5", "--fps", str(fps), "--json"] + (["--causal-first-frame"] if causal else [])
    err = _err(capsys, *argv, code=0)
    used = (1 if causal else 0) + (clip.latent_frames - (1 if causal else 0)) * tc
    assert used < clip.frames
    assert f"{clip.frames} frames are not {'1 + ' if causal else ''}a multiple of --temporal-compression {tc}" in err
    assert f"{used} frames used ({clip.latent_frames} latent frames)" in err, err


def test_the_default_clip_is_used_whole(capsys):
    assert "not a multiple" not in _err(capsys, "--json", code=0)
    assert VideoClip(5).rounding_warnings() == []


def test_help_states_the_rounding_rule(capsys):
    with pytest.raises(SystemExit):
        main(["video", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "a multiple of --spatial-compression x --patch-size (else rounded down to one, with a warning)" in out
    assert "whole number of frames (else refused)" in out


@pytest.mark.parametrize(
    "count, noun, text",
    [(1, "frame", "1 frame"), (2, "frame", "2 frames"), (0, "token", "0 tokens"), (8192, "token", "8,192 tokens")],
)
def test_count_text_is_singular_for_one(count, noun, text):
    assert count_text(count, noun) == text


def test_counts_of_one_are_singular_in_video_messages(capsys):
    """"a clip of 1 frames", "1 frames used (1 latent frames)" and "(2 latents, 1 tokens across)" read as
    written by a machine: a count of 1 takes the singular."""
    err = _err(capsys, "--seconds", "0.04", "--fps", "25", code=2)
    assert "a clip of 1 frame has no latent frame" in err
    err = _err(capsys, "--seconds", "0.08", "--fps", "25", "--causal-first-frame", code=0)
    assert "clip's 2 frames are not" in err and ": 1 frame used (1 latent frame), the last 1 dropped" in err
    err = _err(capsys, "--seconds", "1", "--fps", "4", "--width", "31", "--height", "16", "--patch-size", "2", code=0)
    assert "16 px used (2 latents, 1 token across)" in err
    assert not any(f" 1 {word}s" in err for word in ("frame", "token", "latent", "latent frame"))


@pytest.mark.parametrize("patch", [1, 2])
def test_the_reported_size_is_the_one_the_tokens_cover(capsys, patch):
    """``kvlab video --width 1281``: the title and the JSON said 1281x720 while 1280 px were used (the warning said
    so): the reported width and height are now those used, the given ones kept as width_given / height_given."""
    stride = VideoClip.spatial_compression * patch
    width, height = VideoClip.width + 1, VideoClip.height + stride - 1  # both past a multiple of the stride
    used_w, used_h = width - width % stride, height - height % stride
    argv = ["video", "--seconds", "5", "--width", str(width), "--height", str(height), "--patch-size", str(patch)]
    assert main([*argv, "--json"]) == 0
    out, err = capsys.readouterr()
    clip = json.loads(out)["clips"][0]
    assert (clip["width"], clip["height"]) == (used_w, used_h)
    assert (clip["width_given"], clip["height_given"]) == (width, height)
    assert clip["tokens_per_frame"] == (used_w // stride) * (used_h // stride)
    assert f"{number_text(used_w)} px used" in err and f"{number_text(used_h)} px used" in err, err
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"{used_w}x{used_h}," in out and f"{width}x" not in out, out


def test_the_frames_column_says_how_many_frames_the_latents_cover(capsys):
    """A causal VAE at stride 4 takes 1 + 4k frames: a 5 s clip at 24 fps (120 frames) uses 117; the table's frames
    column said 120 while the warning said 117 (as the width said 1281 while 1280 px were used)."""
    from kvlab.cli import main
    from kvlab.plan.video import VideoClip

    clip = VideoClip(seconds=5, fps=24, causal_first_frame=True)
    assert clip.frames == 120 and clip.used_frames == 1 + (clip.latent_frames - 1) * 4 == 117
    assert clip.to_dict()["frames_used"] == 117
    assert VideoClip(seconds=5, fps=24).used_frames == 120  # 120 = 30 x 4: every frame used
    assert main(["video", "--seconds", "5", "--causal-first-frame"]) == 0
    assert "120 (117 used)" in capsys.readouterr().out
    assert main(["video", "--seconds", "5"]) == 0
    assert "used)" not in capsys.readouterr().out
