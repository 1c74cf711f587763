"""Untimed jobs shared by this process and forked helpers (kvlab.runtime.workers)."""

import os

import pytest

from kvlab.runtime.workers import SplitJobs, fork_available, resolve_workers, spare_cpus

needs_fork = pytest.mark.skipif(not fork_available(), reason="helpers are forked: Linux only")


def _jobs(n):
    return [lambda i=i: {"i": i, "square": i * i, "pid": os.getpid()} for i in range(n)]


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=needs_fork), pytest.param(3, marks=needs_fork)])
def test_every_job_runs_once_and_outcomes_come_back_in_job_order(workers):
    done = []
    with SplitJobs(_jobs(9), workers=workers, on_done=lambda i, o: done.append(i)) as split:
        outcomes = split.finish()
    assert [o[0] for o in outcomes] == ["ok"] * 9
    assert [o[1]["square"] for o in outcomes] == [i * i for i in range(9)]
    assert sorted(done) == list(range(9)), "on_done once per job"
    assert split.helper_failures == []


@needs_fork
def test_a_helper_takes_the_front_and_this_process_the_back():
    import time

    def slow(i):
        def job():
            time.sleep(0.05)
            return os.getpid()

        return job

    with SplitJobs([slow(i) for i in range(12)], workers=2) as split:
        time.sleep(0.2)  # this process's own work: the helper starts alone, at the front
        split.poll()
        pids = [o[1] for o in split.finish()]
    here = os.getpid()
    assert pids[0] != here, "the helper starts at the front"
    assert pids[-1] == here, "this process takes from the back"
    # each side ran one contiguous run of jobs: the two ends met once
    switches = sum(1 for a, b in zip(pids, pids[1:]) if a != b)
    assert switches == 1


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=needs_fork)])
def test_a_failing_job_is_an_outcome_not_an_exception(workers):
    def boom():
        raise ValueError("bad probe 7")

    jobs = _jobs(3) + [boom] + _jobs(2)
    with SplitJobs(jobs, workers=workers) as split:
        outcomes = split.finish()
    kind, error = outcomes[3]
    assert kind == "error" and error["type"] == "ValueError" and error["message"] == "bad probe 7"
    assert error["traceback_tail"], "the tail of the traceback is kept for the failure record"
    assert [o[0] for i, o in enumerate(outcomes) if i != 3] == ["ok"] * 5


@needs_fork
def test_jobs_of_a_helper_that_dies_run_here():
    parent = os.getpid()

    def dies_in_helper():
        if os.getpid() != parent:
            os._exit(3)  # the helper process vanishes mid-job
        return "ran here"

    jobs = [dies_in_helper] + _jobs(3)
    with SplitJobs(jobs, workers=2) as split:
        import time

        time.sleep(0.3)  # let the helper take job 0 first
        outcomes = split.finish()
    assert outcomes[0] == ("ok", "ran here")
    assert [o[0] for o in outcomes] == ["ok"] * 4
    assert split.helper_failures == [3]


def test_without_helpers_the_jobs_run_in_finish_in_order():
    order = []
    jobs = [lambda i=i: order.append(i) for i in range(4)]
    with SplitJobs(jobs, workers=1) as split:
        assert order == [], "nothing runs before finish without helpers"
        assert split.poll() == 0
        split.finish()
    assert order == [0, 1, 2, 3]


@pytest.mark.parametrize(("kw", "match"), [({"workers": 0}, "workers"), ({"threads": True}, "threads")])
def test_bad_settings_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        SplitJobs([], **kw)


def test_how_many_workers_a_run_gets(monkeypatch):
    from kvlab.runtime import workers

    monkeypatch.setattr(workers, "fork_available", lambda: True)
    assert resolve_workers(None, threads=1, device_type="cpu", cpus=2) == 2
    assert resolve_workers(None, threads=2, device_type="cpu", cpus=2) == 1, "no spare CPU: no helper"
    assert resolve_workers(None, threads=1, device_type="cuda", cpus=8) == 1
    assert resolve_workers(1, threads=2, device_type="cuda", cpus=2) == 1
    assert resolve_workers(3, threads=1, device_type="cpu", cpus=4) == 3
    with pytest.raises(
        ValueError, match="needs 2 spare CPUs beside the run's 1 torch thread; this machine has 1 spare"
    ):
        resolve_workers(3, threads=1, device_type="cpu", cpus=2)
    with pytest.raises(ValueError, match="must be 1 on a cuda run"):
        resolve_workers(2, threads=1, device_type="cuda", cpus=8)
    with pytest.raises(ValueError, match="got 0"):
        resolve_workers(0, threads=1, device_type="cpu", cpus=2)
    monkeypatch.setattr(workers, "fork_available", lambda: False)
    assert resolve_workers(None, threads=1, device_type="cpu", cpus=8) == 1
    with pytest.raises(ValueError, match="cannot fork"):
        resolve_workers(2, threads=1, device_type="cpu", cpus=8)
    assert spare_cpus(3, cpus=2) == 0
    with pytest.raises(ValueError, match="`threads`"):
        spare_cpus(0)
