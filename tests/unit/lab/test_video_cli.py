"""``kvlab lab video``: JSON with the numbers computed in the run, the exit status, the time budget, and bad
settings named with exit status 2."""

from __future__ import annotations

import contextlib
import io
import json
import time

import pytest

from kvlab.cli import main
from kvlab.lab.video_model import VideoConfig


def _run(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def default_run():
    start = time.perf_counter()
    code, out = _run(["lab", "video", "--json"])
    return code, json.loads(out), time.perf_counter() - start


def test_defaults_pass_within_the_time_budget(default_run):
    code, r, seconds = default_run
    assert code == 0 and r["all_passed"]
    assert seconds < 30 and r["wall_s"] < 30  # the budget on the 2-core CPU; ~1-2 s measured
    assert r["config"] == {**VideoConfig().__dict__}


def test_json_carries_flops_bytes_and_ledger_computed_in_the_run(default_run):
    _, r, _ = default_run
    f = r["flops"]
    assert f["ratio_full_over_cached"] == pytest.approx(f["full_recompute"] / f["cached"])
    assert (
        r["kv_bytes_per_frame"]
        == r["ledger"]["kv_bytes_first_latent_frame"]
        == VideoConfig().kv_bytes_per_frame
    )
    assert r["kv_bytes_after_frame"]["full_history"][-1] == r["ledger"]["kv_bytes"]
    assert max(r["kv_bytes_after_frame"]["evicting"]) == r["ledger"]["kv_bytes_window"]
    assert r["ledger"]["kvlab_video_args"][0] == "video"
    assert len(r["visible_frames"]) == VideoConfig().frames
    assert all(r["checks"].values())


def test_flags_reach_the_config_and_json_may_come_first():
    code, out = _run(
        ["lab", "--json", "video", "--frames", "5", "--window", "1", "--kv-heads", "1", "--steps", "2"]
    )
    r = json.loads(out)
    assert code == 0
    assert (r["config"]["frames"], r["config"]["window_frames"], r["config"]["kv_heads"]) == (5, 1, 1)
    assert r["config"]["steps"] == 2 and len(r["kv_bytes_after_frame"]["evicting"]) == 5


def test_human_output_names_the_checks(capsys):
    assert main(["lab", "video", "--frames", "5", "--window", "1"]) == 0
    out = capsys.readouterr().out
    assert "full recompute" in out and "all checks passed" in out
    assert "positions" in out and "sink + window" in out


def test_a_failed_check_gives_exit_status_1(monkeypatch):
    import kvlab.lab.video as video

    real = video.run_video_lab

    def broken(cfg):
        r = real(cfg)
        r["checks"]["cached_equals_full_recompute"] = False
        r["all_passed"] = False
        return r

    monkeypatch.setattr(video, "run_video_lab", broken)
    code, out = _run(["lab", "video", "--json", "--frames", "5", "--window", "1"])
    assert code == 1 and json.loads(out)["all_passed"] is False


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--frames", "0"], "frames"),
        (["--frames", "4"], "--frames (4) must be >= --window + 3 (6)"),
        (["--window", "0"], "--window must be an int >= 1, got 0"),
        (["--steps", "0"], "steps"),
        (["--height", "-1"], "height"),
        (["--head-dim", "5"], "--head-dim must be even and >= 6"),
        (["--head-dim", "4"], "got 4"),
        (["--kv-heads", "3"], "--kv-heads, got 3"),
        (["--seed", "-1"], "--seed must be an int >= 0"),
        (["--noise-seed", "-2"], "--noise-seed must be an int >= 0"),
    ],
)
def test_bad_values_are_named(capsys, argv, fragment):
    assert main(["lab", "video", "--json", *argv]) == 2
    captured = capsys.readouterr()
    assert "error:" in captured.err and fragment in captured.err, captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"rope_theta": float("nan")}, "rope_theta"),
        ({"rope_theta": 1}, "rope_theta"),
        ({"channels": 2.5}, "channels"),
        ({"frames": True}, "frames"),
        ({"q_heads": 6, "kv_heads": 4}, "q_heads"),
    ],
)
def test_config_refuses_bad_fields(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        VideoConfig(**kwargs)


def test_generators_refuse_bad_arguments():
    import numpy as np

    from kvlab.lab.video_cache import generate_cached, generate_full, visible_frames
    from kvlab.lab.video_model import make_noise, make_weights

    cfg = VideoConfig(frames=4, window_frames=1)
    weights, noise = make_weights(cfg), make_noise(cfg)
    with pytest.raises(ValueError, match=r"`noise` must have shape \[4, 4, 16, 8\].*got \[3, 4, 16, 8\]"):
        generate_full(weights, cfg, noise[:3])
    with pytest.raises(ValueError, match="`history` must be one of .*got 'stale'"):
        generate_cached(weights, cfg, noise, history="stale")
    with pytest.raises(ValueError, match="`positions`.*got 'cache'"):
        generate_cached(weights, cfg, noise, positions="cache")
    with pytest.raises(ValueError, match="`current_block`.*got 'keep'"):
        generate_cached(weights, cfg, noise, current_block="keep")
    with pytest.raises(ValueError, match="reencode"):
        generate_full(weights, cfg, noise, reencode=True)
    with pytest.raises(ValueError, match="window_frames.*got -1"):
        visible_frames(3, -1)
    with pytest.raises(ValueError, match="frames.*got 0"):
        visible_frames(0)
    assert np.isfinite(generate_full(weights, cfg, noise)).all()


def test_help_shows_the_config_defaults_without_numpy_at_start_up():
    import subprocess
    import sys

    from kvlab.cli import build_parser

    parser = build_parser()
    video = parser._subparsers._group_actions[0].choices["lab"]._subparsers._group_actions[0].choices["video"]
    text = " ".join(video.format_help().split())
    d = VideoConfig()
    assert f"latent frames generated (default {d.frames})" in text
    assert f"besides the sink frame when evicting (default {d.window_frames})" in text
    # building the parser (every kvlab command does) must not import numpy for these defaults
    code = "import sys; from kvlab.cli import build_parser; build_parser(); print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_long_lab_runs_say_what_runs_when_stderr_is_not_a_terminal(capsys):
    from kvlab.commands.lab.common import status

    with status("decoding through each cache ...", quiet=False):
        pass
    assert "decoding through each cache ..." in capsys.readouterr().err  # pytest's stderr is not a terminal
    with status("silent under --json", quiet=True):
        pass
    assert capsys.readouterr().err == ""
