"""``kvlab lab --real`` says how long a long check will run before it starts (``--tokens 100000`` ran for minutes
with no word of how long): the fit on hand-made timings (expected values worked out here), and the line of a real
run on the bundled model with the threshold lowered, its numbers those the run measured."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

from kvlab.cli import main
from kvlab.lab import exactness
from kvlab.lab.estimate import ProbeTimes, duration, estimate_line, fit_estimate, probe_sizes
from kvlab.models import reference_model_path

needs_model = pytest.mark.skipif(
    not (reference_model_path() / "model.safetensors").is_file(),
    reason="the bundled reference model is absent",
)


def test_the_fit_extrapolates_forwards_as_quadratic_and_steps_as_linear_in_context():
    # forwards: 1 s for 100 tokens, 3 s for 200 -> s/token 0.01, 0.015 -> a = 0.005, b = 5e-5 (per token²)
    # steps: 10 ms at 100, 20 ms at 200 -> c = 0, d = 1e-4 s per cached token
    probe = ProbeTimes(tokens=(100, 200), forward_s=(1.0, 3.0), step_s=(0.01, 0.02))
    est = fit_estimate(probe, tokens=1000, prefill_tokens=250, caches=3)
    assert est["forward_s_per_token"] == pytest.approx((0.005, 5e-5))
    assert est["step_s"] == pytest.approx((0.0, 1e-4), abs=1e-12)
    assert est["reference_s"] == pytest.approx(0.005 * 1000 + 5e-5 * 1000**2)  # 55 s
    # prefill 0.005*250 + 5e-5*250² = 4.375; steps at 250..999: 1e-4 * (250+999)*750/2 = 46.8375
    assert est["per_cache_s"] == pytest.approx(51.2125)
    assert est["total_s"] == pytest.approx(55 + 3 * 51.2125)


def test_a_timing_that_fell_is_read_flat_not_negative():
    probe = ProbeTimes(tokens=(100, 200), forward_s=(2.0, 3.0), step_s=(0.05, 0.02))  # per token 0.02 > 0.015
    est = fit_estimate(probe, tokens=400, prefill_tokens=100, caches=1)
    assert est["forward_s_per_token"] == pytest.approx((0.015, 0.0))
    assert est["step_s"] == pytest.approx((0.02, 0.0))
    assert est["per_cache_s"] == pytest.approx(0.015 * 100 + 0.02 * 300)
    with pytest.raises(ValueError, match=r"`prefill_tokens` must be in \[1, 400\], got 0"):
        fit_estimate(probe, tokens=400, prefill_tokens=0, caches=1)


def test_probe_sizes_and_durations():
    assert probe_sizes(100_000) == (256, 2048)
    assert probe_sizes(600) == (37, 300)
    assert probe_sizes(9) == (1, 4)  # 4 + 5 steps fit in 9 tokens
    assert probe_sizes(8) is None and probe_sizes(2) is None
    assert [duration(s) for s in (42, 17 * 60, 2.6 * 3600)] == ["42 s", "17 min", "2.6 h"]
    probe = ProbeTimes(tokens=(256, 2048), forward_s=(0.25, 2.5), step_s=(0.03, 0.05))
    est = fit_estimate(probe, tokens=100_000, prefill_tokens=25_000, caches=3)
    line = estimate_line(est, probe, tokens=100_000, caches=3)
    assert line.startswith(f"estimated wall time about {duration(est['total_s'])}: the reference forward of 100,000")
    assert "forwards of 256 and 2,048 tokens took 0.250 s and 2.500 s" in line
    assert "a decode step 30.0 ms at 256 tokens and 50.0 ms at 2,048" in line


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), [line for line in err.getvalue().splitlines() if line.strip()]


@needs_model
def test_a_long_check_says_its_estimated_wall_time_before_the_reference_forward(monkeypatch):
    monkeypatch.setattr(exactness, "ESTIMATE_TOKENS", 32)
    code, out, err = _run(["lab", "--real", "--json", "--tokens", "48"])
    assert code == 0, err
    notes = [line for line in err if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].startswith("note: estimated wall time about "), err
    assert err.index(notes[0]) < next(i for i, line in enumerate(err) if "reference: one forward" in line)
    est = json.loads(out)["estimate"]
    assert est["probe"]["tokens"] == [3, 24] and est["measured_s"] > 0
    (f1, f2), (s1, s2) = est["probe"]["forward_s"], est["probe"]["step_s"]
    assert f"forwards of 3 and 24 tokens took {f1:.3f} s and {f2:.3f} s" in notes[0]  # the run's own timings
    assert f"a decode step {s1 * 1000:.1f} ms at 3 tokens and {s2 * 1000:.1f} ms at 24" in notes[0]
    assert re.search(rf"about {re.escape(duration(est['total_s']))}: the reference forward of 48 tokens", notes[0])
    assert "each of 3 caches' decoding" in notes[0]
    monkeypatch.setattr(exactness, "ESTIMATE_TOKENS", 4096)  # a short check: no probe, no line
    code, out, err = _run(["lab", "--real", "--json", "--tokens", "48"])
    assert code == 0 and not [line for line in err if line.startswith("note:")]
    assert "estimate" not in json.loads(out) and not any("wall-time estimate" in line for line in err)
