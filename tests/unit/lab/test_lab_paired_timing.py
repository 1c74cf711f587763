"""``kvlab lab``'s timings: the two generators alternate per round, the speed-up comes from same-round pairs, a
busy machine is recorded and warned about, and ``--threads`` reaches the result."""

from __future__ import annotations

import contextlib
import functools
import io
import json

import numpy as np
import pytest

from kvlab.cli import main
from kvlab.lab import ToyConfig, equivalence
from kvlab.lab.append import measure_append_cost
from kvlab.runtime import timing

TRUE_SPEEDUP = 10.0  # the fake naive generator costs 10 clock units, the cached one 1


@pytest.fixture
def fake_generators(monkeypatch):
    """Real generators (tiny config) on a fake clock: cached advances it 1 unit, naive 10; calls 1-3 of the run
    (a busy period) cost 4x. Records the order of the calls."""
    clock = {"now": 0.0, "calls": []}

    def slowed(name, real, cost):
        def generate(weights, cfg, prompt):
            clock["calls"].append(name)
            factor = 4.0 if 1 <= len(clock["calls"]) - 1 <= 3 else 1.0  # call 0 is the untimed warm-up
            clock["now"] += cost * factor
            return real(weights, cfg, prompt)

        return generate

    monkeypatch.setattr(equivalence, "generate_cached", slowed("cached", equivalence.generate_cached, 1.0))
    monkeypatch.setattr(
        equivalence, "generate_naive", slowed("naive", equivalence.generate_naive, TRUE_SPEEDUP)
    )
    monkeypatch.setattr(
        equivalence, "interleaved", functools.partial(timing.interleaved, clock=lambda: clock["now"])
    )
    return clock


def test_generators_alternate_and_the_speedup_is_paired(fake_generators):
    steps = []
    r = equivalence.run_toy_lab(ToyConfig(new_tokens=3), repeat=3, threads=1, progress=steps.append)
    # warm-up, then rounds (cached, naive), (naive, cached), (cached, naive): not all of one block first
    assert fake_generators["calls"] == ["cached", "cached", "naive", "naive", "cached", "cached", "naive"]
    assert abs(r["speedup"] / TRUE_SPEEDUP - 1) <= 0.10, r["speedup_paired"]
    ms = r["timings_ms"]
    block = np.median(ms["naive"]) / np.median(ms["cached"])  # the unpaired estimate the busy period skews
    assert abs(block / TRUE_SPEEDUP - 1) > 0.10, block
    assert r["speedup_paired"]["min"] <= r["speedup"] <= r["speedup_paired"]["max"]
    assert len(steps) == equivalence.toy_steps(3) and r["threads"] == 1 and r["all_passed"]


def test_a_busy_machine_is_recorded_and_warned(monkeypatch):
    busy = {"busy": True, "reason": "other processes used 1.80 cores on average", "threads": 1}
    monkeypatch.setattr(equivalence, "interleaved", lambda calls, repeat, **kw: _run_once(calls, busy))
    r = equivalence.run_toy_lab(ToyConfig(new_tokens=3), threads=1)
    assert r["contention"]["busy"] and "1.80 cores" in r["warnings"][0] and "not trusted" in r["warnings"][0]
    quiet = dict(busy, busy=False, reason=None)
    monkeypatch.setattr(equivalence, "interleaved", lambda calls, repeat, **kw: _run_once(calls, quiet))
    assert equivalence.run_toy_lab(ToyConfig(new_tokens=3), threads=1)["warnings"] == []


def _run_once(calls, cont):
    for call in calls.values():
        call()
    return {name: [1.0 + (name == "naive")] for name in calls}, cont


def test_append_steps_alternate_and_record_threads_and_contention():
    r = measure_append_cost((16, 64), kv_heads=1, head_dim=8, steps=4, threads=1)
    assert r["threads"] == 1 and len(r["cat_over_inplace"]) == 2
    assert set(r["contention"]) >= {"busy", "cpu_share", "wall_s"}
    assert isinstance(r["warnings"], list) and (r["warnings"] != []) == r["contention"]["busy"]
    with pytest.raises(ValueError, match="`threads`"):
        measure_append_cost((16,), threads=0)


def test_cli_records_threads_in_the_json(capsys):
    code = main(["lab", "--json", "--new-tokens", "4", "--append-contexts", "16", "--threads", "1"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["threads"] == 1 and r["append"]["threads"] == 1
    assert "contention" in r and "speedup_paired" in r


def test_cli_progress_is_one_line_per_step_off_a_terminal():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["lab", "--new-tokens", "4", "--append-contexts", "16", "32", "--threads", "1"])
    lines = [line for line in err.getvalue().splitlines() if line.startswith("[")]
    assert code == 0 and len(lines) == 2 + equivalence.toy_steps(1)
    assert "append cost at 16 tokens" in lines[0] and "reference" in lines[-1]
