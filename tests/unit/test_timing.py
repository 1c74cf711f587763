"""Interleaved timing, paired ratios and the contention reading (kvlab.runtime.timing), and how the eval's
summary and HTML report show a busy machine. Fake clocks only: no test here depends on real time."""

from __future__ import annotations

import statistics

import pytest

from kvlab.eval.config import Gates
from kvlab.eval.decision import decide, latency_warning, summarize
from kvlab.report_html import render_html
from kvlab.runtime import timing
from kvlab.runtime.timing import Snapshot, contention, default_threads, interleaved, paired_ratio


class VirtualMachine:
    """A fake clock; work costs ``cost`` virtual seconds, times ``slowdown`` while the clock is in ``slow``."""

    def __init__(self, slow: tuple[float, float], slowdown: float):
        self.t, self.slow, self.slowdown = 0.0, slow, slowdown

    def clock(self) -> float:
        return self.t

    def work(self, cost: float):
        def run():
            factor = self.slowdown if self.slow[0] <= self.t < self.slow[1] else 1.0
            self.t += cost * factor

        return run


TRUE_RATIO = 1.5  # candidate costs 1.5x the baseline


def test_paired_ratio_survives_a_slow_period_that_the_block_ratio_does_not():
    repeat = 7
    # a slow minute: 10x slower from t=2 to t=40 (a quiet round costs 2.5 virtual seconds, a slow one 25)
    vm = VirtualMachine(slow=(2.0, 40.0), slowdown=10.0)
    calls = {"base": vm.work(1.0), "cand": vm.work(TRUE_RATIO)}
    t, _ = interleaved(calls, repeat, clock=vm.clock)
    paired = paired_ratio(t["cand"], t["base"])["ratio"]
    assert abs(paired - TRUE_RATIO) / TRUE_RATIO <= 0.10
    # blocks (all of base, then all of cand) under the same burst, as the eval timed before: the burst lands on
    # one side only
    vm = VirtualMachine(slow=(2.0, 40.0), slowdown=10.0)
    base_ms, cand_ms = [], []
    for out, work in ((base_ms, vm.work(1.0)), (cand_ms, vm.work(TRUE_RATIO))):
        for _ in range(repeat):
            t0 = vm.clock()
            work()
            out.append(vm.clock() - t0)
    block = statistics.median(cand_ms) / statistics.median(base_ms)
    assert abs(block - TRUE_RATIO) / TRUE_RATIO > 0.10
    # and paired_ratio's own unpaired estimate on these block timings is the block ratio
    assert paired_ratio(cand_ms, base_ms)["unpaired"] == pytest.approx(block)


def test_interleaved_rotates_the_order_each_round():
    order = []
    calls = {name: (lambda n=name: order.append(n)) for name in "abc"}
    t, _ = interleaved(calls, 3, warmup=0)
    assert order == list("abcbcacab")
    assert all(len(v) == 3 for v in t.values())


def test_paired_ratio_uses_same_round_pairs():
    r = paired_ratio([2.0, 40.0, 3.0], [1.0, 20.0, 1.0])
    assert r["ratios"] == [2.0, 2.0, 3.0]
    assert r["ratio"] == 2.0 and r["min"] == 2.0 and r["max"] == 3.0
    assert r["unpaired"] == pytest.approx(3.0 / 1.0)


@pytest.mark.parametrize(
    "args, match",
    [
        (([1.0], [1.0, 2.0]), "equal, non-zero"),
        (([], []), "equal, non-zero"),
        (([0.0], [1.0]), "positive"),
    ],
)
def test_paired_ratio_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        paired_ratio(*args)


@pytest.mark.parametrize("repeat, warmup", [(0, 0), (2, -1), (True, 0)])
def test_interleaved_bad_counts(repeat, warmup):
    with pytest.raises(ValueError, match="repeat|warmup"):
        interleaved({"a": lambda: None}, repeat, warmup)


def test_interleaved_needs_calls():
    with pytest.raises(ValueError, match="empty"):
        interleaved({}, 1)


def _snap(wall, cpu, busy_ticks, own_ticks, steal=0):
    return Snapshot(wall, cpu, (busy_ticks, steal), own_ticks)


def test_contention_flags_a_busy_machine(monkeypatch):
    monkeypatch.setattr(timing, "_ticks_per_s", lambda: 100)
    # 2 s wall; we used 0.5 s of CPU (50 ticks); the machine was busy for 400 ticks: others took 1.75 cores
    busy = contention(_snap(0.0, 0.0, 0, 0), _snap(2.0, 0.5, 400, 50), cpus=2)
    assert busy["busy"] and busy["other_cores"] == pytest.approx(1.75)
    assert busy["cpu_share"] == pytest.approx(0.25)
    assert "other processes" in busy["reason"] and "25%" in busy["reason"]
    quiet = contention(_snap(0.0, 0.0, 0, 0), _snap(2.0, 1.9, 200, 190), cpus=2)
    assert not quiet["busy"] and quiet["reason"] is None
    assert quiet["other_cores"] == pytest.approx(0.05)


def test_contention_counts_the_cores_a_run_leaves_free(monkeypatch):
    monkeypatch.setattr(timing, "_ticks_per_s", lambda: 100)
    # 2 cores, another process busy on one of them (1.0 core) for 2 s; we ran at full speed on the other
    one_thread = contention(_snap(0.0, 0.0, 0, 0), _snap(2.0, 1.95, 395, 195), threads=1, cpus=2)
    assert one_thread["other_cores"] == pytest.approx(1.0) and not one_thread["busy"]
    # the same load against a 2-thread run: it wanted both cores
    two_threads = contention(_snap(0.0, 0.0, 0, 0), _snap(2.0, 2.6, 460, 260), threads=2, cpus=2)
    assert two_threads["busy"] and "0 core(s) of 2" in two_threads["reason"]
    # two other processes against a 1-thread run
    crowded = contention(_snap(0.0, 0.0, 0, 0), _snap(2.0, 1.5, 520, 150), threads=1, cpus=2)
    assert crowded["busy"] and crowded["other_cores"] == pytest.approx(1.85)


def test_contention_cpu_share_alone_flags_where_proc_is_missing():
    r = contention(Snapshot(0.0, 0.0, None, None), Snapshot(1.0, 0.2, None, None), threads=1)
    assert r["other_cores"] is None and r["busy"] and "20%" in r["reason"]
    r = contention(Snapshot(0.0, 0.0, None, None), Snapshot(1.0, 1.8, None, None), threads=2)
    assert not r["busy"] and r["cpu_share"] == pytest.approx(0.9)


def test_contention_bad_input():
    with pytest.raises(ValueError, match="threads"):
        contention(Snapshot.now(), Snapshot.now(), threads=0)
    with pytest.raises(ValueError, match="before"):
        contention(Snapshot(2.0, 0, None, None), Snapshot(1.0, 0, None, None))


def test_snapshot_reads_this_process_on_linux():
    s = Snapshot.now()
    assert s.wall_s > 0 and s.cpu_s >= 0
    if s.machine is not None:  # Linux
        assert s.own_ticks is not None and s.machine[0] >= s.own_ticks >= 0


def test_default_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert default_threads(2) == 1
    assert default_threads(1) == 1
    assert default_threads(16) == 15
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert default_threads(2) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "zero")
    with pytest.raises(ValueError, match="OMP_NUM_THREADS"):
        default_threads()


# ── the eval's summary and report on a busy machine ────────────────────────────────────────────────────────────
def _row(candidate, ctx, trusted, saved=100, latency=3.0):
    busy = {"busy": not trusted, "reason": None if trusted else "other processes used 1.20 cores on average"}
    row = {
        "matrix": "capacity",
        "candidate": candidate,
        "context_length": ctx,
        "median_ms": 10.0,
        "ms_per_token": 1.0,
        "cache_bytes": 1000 - saved,
        "cache_bytes_saved": saved,
        "cache_bytes_ratio": 0.5,
        "latency_ratio": latency,
        "nll_delta": 0.0,
        "topk_overlap": 1.0,
        "timing_contention": busy,
        "latency_trusted": trusted,
    }
    if candidate != "dynamic":
        from kvlab.eval.decision import apply_gates

        row["gates"] = apply_gates(row, Gates())
        if not trusted:
            row["gates"]["latency_ratio"] = None
        row["eligible"] = all(v for v in row["gates"].values() if v is not None)
    return row


def test_busy_cell_latency_gate_is_not_used_and_the_summary_says_so():
    rows = [_row("dynamic", 512, False), _row("kivi-4", 512, False, latency=3.0)]
    # a 3x latency ratio would fail the default gate; on a busy machine it is not used, and the reader is told
    assert rows[1]["eligible"]
    assert latency_warning(rows).startswith("the machine was busy while timing context(s) 512")
    result = {"rows": rows, "provenance": {}}
    s = summarize(result)
    assert s["latency_trusted"] is False
    assert "latency_ratio" not in s["decision_gates"] and "nll_delta" in s["decision_gates"]
    assert decide(rows[1:])[1] == "accept kivi-4 at context 512"
    quiet = [_row("dynamic", 512, True), _row("kivi-4", 512, True, latency=3.0)]
    assert not quiet[1]["eligible"] and latency_warning(quiet) is None
    assert summarize({"rows": quiet, "provenance": {}})["latency_trusted"] is True


def test_html_report_shows_the_busy_warning_next_to_the_decision():
    rows = [_row("dynamic", 512, False), _row("kivi-4", 512, False)]
    result = {"rows": rows, "provenance": {}, "summary": summarize({"rows": rows, "provenance": {}})}
    page = render_html(result)
    banner = page[page.index("<h2>Decision</h2>") : page.index("<h2>Gates</h2>")]
    assert 'class="decision caveat"' in banner  # amber, not the green "accept" banner
    assert 'class="warning"' in banner and "machine was busy" in banner
    assert "judged on:" in banner and "latency_ratio" not in banner.split("judged on:")[1].split(")")[0]
    assert 'class="untrusted"' in page  # the latency cell is neither pass nor fail


def test_before_hook_runs_outside_the_clock_in_call_order():
    from kvlab.runtime.timing import interleaved as _interleaved

    now, seen = [0.0], []
    calls = {"a": lambda: now.__setitem__(0, now[0] + 1.0), "b": lambda: now.__setitem__(0, now[0] + 2.0)}

    def before(name, r):
        seen.append((name, r))
        now[0] += 100.0  # progress output is slow; it must not be timed

    times, _ = _interleaved(calls, 2, clock=lambda: now[0], before=before)
    assert seen == [("a", 0), ("b", 0), ("b", 1), ("a", 1)]
    assert times == {"a": [1000.0, 1000.0], "b": [2000.0, 2000.0]}


def test_busy_warnings_name_the_reading_only_when_busy():
    from kvlab.runtime.timing import busy_warnings

    assert busy_warnings({"busy": False}, "x") == []
    (w,) = busy_warnings(
        {"busy": True, "reason": "other processes used 1.20 cores", "threads": 2}, "the ratio"
    )
    assert "1.20 cores" in w and "the ratio is not trusted" in w and "--threads" in w


def test_busy_reason_reads_the_contention_or_the_warning_sentence():
    """A record keeps either the contention reading (kvlab bench lab) or only the warning sentence (kvlab bench
    kernel); both say why the timings are not trusted, and a quiet or unread one says nothing."""
    from kvlab.runtime.timing import busy_reason, busy_warnings

    cont = {"busy": True, "reason": "this process got 40% of its 2 thread(s)' CPU time", "threads": 2}
    assert busy_reason({"contention": cont}) == cont["reason"]
    warnings = busy_warnings(cont, "every kernel time") + ["the copy bandwidth was measured once"]
    assert busy_reason({"warnings": warnings}) == cont["reason"]
    assert busy_reason({"contention": {"busy": False, "reason": None}, "warnings": ["other"]}) is None
    assert busy_reason({}) is None
