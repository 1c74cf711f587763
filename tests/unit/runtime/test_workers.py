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


@pytest.mark.parametrize(("kw", "match"), [({"workers": 0}, "workers"), ({"workers": True}, "workers")])
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


@needs_fork
def test_a_helper_computes_with_one_thread_after_a_parent_that_used_two():
    import subprocess
    import sys

    # a parent with a 2-thread OpenMP team: a helper starting a 2-thread team would hang in libgomp's barrier, so
    # the scenario runs in a subprocess with a timeout (a hang fails this test instead of the suite)
    script = (
        "import os, time, torch\n"
        "from kvlab.runtime.workers import SplitJobs\n"
        "torch.set_num_threads(2)\n"
        "a = torch.randn(256, 256)\n"
        "[a @ a for _ in range(5)]\n"
        "job = lambda: (float((a @ a).sum()), torch.get_num_threads(), os.getpid())\n"
        "with SplitJobs([job] * 4, workers=2) as s:\n"
        "    time.sleep(1.0)\n"
        "    out = s.finish()\n"
        "print(sorted({(o[1][1], o[1][2] == os.getpid()) for o in out}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(1, False)" in proc.stdout, "the helper ran jobs, with one thread"


@needs_fork
def test_tensors_come_back_by_value_and_unpicklable_values_are_computed_here():
    import torch

    parent = os.getpid()
    jobs = [lambda i=i: torch.full((3, 4), float(i)) for i in range(6)]
    jobs.append(lambda: (lambda: "made here") if os.getpid() != parent else "computed here")
    with SplitJobs(jobs, workers=2) as split:
        import time

        time.sleep(1.0)  # the helper takes every job from the front
        outcomes = split.finish()
    for i in range(6):
        assert outcomes[i][0] == "ok" and torch.equal(outcomes[i][1], torch.full((3, 4), float(i)))
    assert outcomes[6] == ("ok", "computed here")
    assert split.reran == [6] and split.helper_failures == []


@needs_fork
def test_a_nested_split_inside_a_helper_runs_its_jobs_there():
    def nested():
        with SplitJobs(_jobs(3), workers=2) as inner:
            return [o[1]["pid"] for o in inner.finish()]

    with SplitJobs([nested], workers=2) as split:
        import time

        time.sleep(0.3)
        ((kind, pids),) = split.finish()
    assert kind == "ok" and len(set(pids)) == 1


@needs_fork
def test_a_helper_dies_with_its_parent():
    import subprocess
    import sys
    import time

    script = (
        "import os, time\n"
        "from kvlab.runtime.workers import SplitJobs\n"
        "jobs = [lambda: time.sleep(30)] * 4\n"
        "with SplitJobs(jobs, workers=2) as s:\n"
        "    print(s._helpers[0].pid, flush=True)\n"
        "    os.kill(os.getpid(), 9)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    helper = int(proc.stdout.split()[0])

    def gone() -> bool:  # no such process, or a zombie waiting to be reaped
        try:
            with open(f"/proc/{helper}/status") as f:
                return any(line.startswith("State:") and "Z" in line for line in f)
        except FileNotFoundError:
            return True

    for _ in range(50):
        if gone():
            break
        time.sleep(0.1)
    else:
        os.kill(helper, 9)
        pytest.fail("the helper outlived its SIGKILLed parent")
