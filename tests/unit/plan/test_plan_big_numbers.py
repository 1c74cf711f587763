"""Numbers at the edge of what the planner can say: a clip too long to count its frames exactly, a weight size of
0 bytes, a decode bound far below 0.1 tokens/s (breakit item 18)."""

from __future__ import annotations

import pytest

from kvlab.cli import main
from kvlab.plan.video import VideoClip


def test_a_clip_past_2_53_frames_is_refused_not_printed_as_float_noise(capsys):
    # was: "24,000,000,000,000,002,729,030,809,812,992" frames, exit 0
    assert main(["video", "--seconds", "5", "1e30"]) == 2
    err = capsys.readouterr().err
    assert "--seconds 1e+30 x --fps 24" in err and "2**53" in err and "`" not in err, err
    with pytest.raises(ValueError, match="2\\*\\*53"):
        VideoClip(seconds=2**53 / 24)
    assert VideoClip(seconds=3600 * 24 * 365).frames == 24 * 3600 * 24 * 365


def test_weight_bytes_0_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "llama-3-8b", "--weight-bytes", "0"])
    assert exit_.value.code == 2
    assert "--weight-bytes: a whole number of bytes >= 1, got '0'" in capsys.readouterr().err
    assert main(["plan", "llama-3-8b", "--weight-bytes", "1e9", "--json"]) == 0


@pytest.mark.parametrize("command", [["plan", "llama-3-8b"], ["roofline"]])
def test_a_tiny_tokens_per_second_bound_is_not_printed_as_0(capsys, command):
    assert main([*command, "--context", "99999999999999999999"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "tokens/s upper bound" in line)
    assert "1.56e-13" in row and " 0.0 " not in row, row
