"""Hostile input to kvlab.runtime.timing and kvlab.runtime.hub: a clear ValueError naming the value, never a NaN
ratio or a traceback from deep inside urllib / the call loop."""

from __future__ import annotations

import math

import pytest

from kvlab.runtime import hub
from kvlab.runtime.timing import interleaved, paired_ratio


@pytest.mark.parametrize(
    "candidate, baseline",
    [
        ([math.nan], [1.0]),
        ([1.0], [math.nan]),
        ([math.inf], [1.0]),
        ([1.0, 2.0], [math.inf, 2.0]),  # a ratio of 0.0 in the median, silently
    ],
)
def test_paired_ratio_refuses_non_finite_times(candidate, baseline):
    # min() of a list holding NaN is not <= 0, so NaN passed the positivity check and the ratio came out NaN
    with pytest.raises(ValueError, match="finite"):
        paired_ratio(candidate, baseline)


def test_interleaved_names_a_call_that_is_not_callable():
    with pytest.raises(TypeError, match=r"`calls\['b'\]` must be callable, got int"):
        interleaved({"a": lambda: None, "b": 3}, repeat=1)


@pytest.fixture
def _fresh_probe(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub._probe.cache_clear()
    yield
    hub._probe.cache_clear()


@pytest.mark.parametrize(
    "endpoint, fragment",
    [
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://127.0.0.1:abc", "abc"),
        ("http://[::1", "IPv6"),
    ],
)
def test_a_malformed_endpoint_is_a_reason_not_a_traceback(monkeypatch, _fresh_probe, endpoint, fragment):
    # urlparse(...).port raised ValueError out of hub_offline_reason: `kvlab plan owner/name` died with a traceback
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    reason = hub.hub_offline_reason()
    assert reason is not None and "HF_ENDPOINT" in reason and endpoint in reason and fragment in reason


def test_plan_with_a_malformed_endpoint_exits_2_naming_it(monkeypatch, _fresh_probe, capsys):
    from kvlab.cli import main

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:99999")
    monkeypatch.setenv("HF_HOME", "/nonexistent-kvlab-hf-home")  # nothing cached: the probe is asked
    assert main(["plan", "nobody-xyz/none"]) == 2
    err = capsys.readouterr().err
    assert "kvlab plan: error:" in err and "HF_ENDPOINT" in err and "Traceback" not in err


@pytest.mark.parametrize("cpus", [0, -3, 2.5, True, "2"])
def test_default_threads_names_a_bad_cpu_count(monkeypatch, cpus):
    from kvlab.runtime.timing import default_threads

    # 2.5 gave 1.5 threads, 0/-3/True gave 1 silently, '2' a TypeError from `cpus - 1`
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with pytest.raises(ValueError, match=rf"`cpus` must be an int >= 1, got {cpus!r}"):
        default_threads(cpus)
