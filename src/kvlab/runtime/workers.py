"""Untimed work on a spare CPU core: a fixed list of jobs shared by this process and forked helper processes.

A measured run on a CPU leaves cores idle on purpose (:func:`kvlab.runtime.timing.default_threads` keeps one free
so that timings survive a busy machine). The run's untimed measurements (``kvlab eval``'s long-context probes)
do not need a quiet machine, so :class:`SplitJobs` hands them to helper processes forked from this one (they
inherit the loaded model, its GEMM policy and its attention: nothing is loaded twice or pickled in) while this
process does its own untimed work; when that is done, this process takes jobs from the other end of the list
until the two ends meet. Nothing timed may run while helpers are alive: leave the ``with`` block first.

Each job is a zero-argument callable returning a picklable value. Results do not depend on which process ran a
job (same model, same inputs; helpers compute with one torch thread); a helper that dies leaves its unfinished jobs to
this process, which runs them itself. Helpers exist only where ``fork`` is safe and useful: Linux, a CPU run
(CUDA state does not survive a fork) and a spare core.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from kvlab.runtime.checks import check_int

Outcome = tuple[str, Any]  # ("ok", value) or ("error", {"type", "message", "traceback_tail"})

# seconds between checks that the helpers are still alive while waiting for their results
_POLL_S = 0.5


def fork_available() -> bool:
    """Whether helper processes can be forked here: Linux with the ``fork`` start method (macOS forks unsafely
    with system frameworks loaded; Windows cannot fork)."""
    import multiprocessing

    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def spare_cpus(threads: int, cpus: int | None = None) -> int:
    """Usable CPUs beyond the ``threads`` the run's own process computes with (>= 0).

    Raises:
        ValueError: ``threads`` not an int >= 1, or ``cpus`` given and not an int >= 1.
    """
    check_int("threads", threads, 1)
    if cpus is None:
        from kvlab.runtime.timing import usable_cpus

        cpus = usable_cpus()
    check_int("cpus", cpus, 1)
    return max(0, cpus - threads)


def resolve_workers(requested: int | None, threads: int, device_type: str, cpus: int | None = None) -> int:
    """Processes for a run's untimed jobs: this one plus helpers.

    ``None`` (auto): 2 on a CPU run where a helper can be forked and a core is spare beside ``threads``, else 1.
    An explicit count is checked: helpers need ``fork`` and a CPU device, and one spare CPU each (more would make
    OpenMP threads spin against each other, the 10-150x slowdown :func:`kvlab.runtime.timing.default_threads`
    avoids).

    Raises:
        ValueError: ``requested`` not None or an int >= 1; more than 1 where helpers cannot run, or more helpers
            than spare CPUs (all values named).
    """
    spare = spare_cpus(threads, cpus)
    usable = device_type == "cpu" and fork_available()
    if requested is None:
        return 2 if usable and spare >= 1 else 1
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise ValueError(f"`workers` must be a positive integer (leave it unset for auto), got {requested!r}")
    if requested == 1:
        return 1
    if device_type != "cpu":
        raise ValueError(
            f"`workers` must be 1 on a {device_type} run (helpers are forked CPU processes), got {requested}"
        )
    if not usable:
        raise ValueError(
            f"`workers` must be 1 here: this platform ({sys.platform}) cannot fork helper processes"
        )
    if requested - 1 > spare:
        raise ValueError(
            f"`workers` {requested} needs {requested - 1} spare CPU{'s' if requested > 2 else ''} beside the run's "
            f"{threads} torch "
            f"thread{'s' if threads > 1 else ''}; this machine has {spare} spare"
        )
    return requested


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``), so that
    a parent killed by the OOM killer leaves no helper behind; exit now if the parent is already gone."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's exit handlers terminate the helper
        pass
    if os.getppid() != parent:
        os._exit(1)


def _error(exc: BaseException) -> dict:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback_tail": traceback.format_exc().splitlines()[-3:],
    }


def _run(job: Callable[[], Any]) -> Outcome:
    try:
        return "ok", job()
    except Exception as exc:  # a failed job is an outcome, recorded by the caller
        return "error", _error(exc)


class SplitJobs:
    """Run ``jobs`` on this process and ``workers - 1`` forked helpers: helpers take jobs from the front of the
    list, this process (after its own work) from the back.

    Usage::

        with SplitJobs(jobs, workers=2) as split:
            ...                            # this process's own untimed work; split.poll() delivers results
            outcomes = split.finish()      # takes jobs from the back, waits for the helpers
        # timed work only after the block: the helpers are gone

    Each helper computes with one torch thread: libgomp's thread pool does not survive a fork, and a helper that
    starts a team of 2+ OpenMP threads after its parent used 2+ hangs in a barrier for ever. A helper dies with its
    parent (``PR_SET_PDEATHSIG``), and inside a helper a nested ``SplitJobs`` runs its jobs in that process.

    Args:
        jobs: zero-argument callables; each returns a picklable value (a helper pickles it, tensors by value, and
            sends it through a pipe; a value that cannot be pickled is computed again here). Order them so that
            jobs sharing an expensive setup are adjacent: each end then meets the setup once.
        workers: processes in all (>= 1; 1 runs everything here, in :meth:`finish`).
        on_done: called in this process as ``on_done(index, outcome)`` once per job, in completion order.

    Outcomes are ``("ok", value)`` or ``("error", {"type", "message", "traceback_tail"})``; a job's exception
    never escapes. ``helper_failures`` lists helpers that exited without finishing their jobs (exit codes), whose
    jobs ran here instead; ``reran`` lists jobs run here again because a helper could not send their value.

    Raises:
        ValueError: ``workers`` not an int >= 1.
    """

    def __init__(
        self,
        jobs: Sequence[Callable[[], Any]],
        workers: int = 1,
        on_done: Callable[[int, Outcome], None] = lambda i, o: None,
    ) -> None:
        check_int("workers", workers, 1)
        import multiprocessing

        if multiprocessing.current_process().daemon:  # a helper cannot fork helpers of its own
            workers = 1
        self.jobs = list(jobs)
        self.workers, self.on_done = workers, on_done
        self.outcomes: dict[int, Outcome] = {}
        self.helper_failures: list[int | None] = []
        self.reran: list[int] = []
        self._helpers: list[Any] = []
        self._results: Any = None
        self._ends: Any = None  # shared [front, back): the next front index and the end of the untaken range
        self._lock: Any = None
        self._local_front = 0  # without helpers
        self._parent = os.getpid()

    # ── the shared ends ────────────────────────────────────────────────────────────────────────────────────────
    def _take(self, front: bool) -> int | None:
        if self._ends is None:
            return None
        with self._lock:
            lo, hi = self._ends[0], self._ends[1]
            if lo >= hi:
                return None
            if front:
                self._ends[0] = lo + 1
                return lo
            self._ends[1] = hi - 1
            return hi - 1

    def _helper_main(self) -> None:
        """A helper's life: take from the front until the ends meet, send each outcome, exit.

        Outcomes travel as plain pickles (``pickle.dumps``: tensors by value, not as shared memory that would
        vanish with this process). It leaves through ``os._exit`` once its outcomes are in the pipe: a normal exit
        would flush the standard streams, whose locks another thread of the parent (a progress display) may have
        held at the fork, and run the parent's exit handlers."""
        code = 1
        try:
            # Ctrl-C is the parent's to handle; leaving the `with` block ends the helpers
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            _die_with_parent(self._parent)
            try:
                import torch

                torch.set_num_threads(1)
            except ImportError:  # a torch-free job list
                pass
            while (i := self._take(front=True)) is not None:
                outcome = _run(self.jobs[i])
                try:
                    message = pickle.dumps((i, outcome))
                except Exception as exc:  # the parent computes this one itself
                    message = pickle.dumps((i, ("rerun", f"{type(exc).__name__}: {exc}")))
                self._results.put(message)
            self._results.close()
            self._results.join_thread()  # every outcome written to the pipe
            code = 0
        finally:
            os._exit(code)

    # ── lifecycle ──────────────────────────────────────────────────────────────────────────────────────────────
    def __enter__(self) -> SplitJobs:
        if self.workers > 1 and self.jobs:
            import multiprocessing

            ctx = multiprocessing.get_context("fork")
            self._lock = ctx.Lock()
            self._ends = ctx.RawArray("q", [0, len(self.jobs)])
            self._results = ctx.Queue()
            sys.stdout.flush()  # a forked child would flush the parent's buffered output a second time
            sys.stderr.flush()
            for _ in range(self.workers - 1):
                proc = ctx.Process(target=self._helper_main, daemon=True)
                proc.start()
                self._helpers.append(proc)
        return self

    def __exit__(self, *exc: Any) -> None:
        for proc in self._helpers:
            if proc.is_alive():
                proc.terminate()
            proc.join()
        self._helpers = []

    # ── results ────────────────────────────────────────────────────────────────────────────────────────────────
    def _deliver(self, i: int, outcome: Outcome) -> None:
        if i in self.outcomes:  # ran again here after its helper died while sending it
            return
        if outcome[0] == "rerun":  # the helper could not pickle the value: compute it here
            self.reran.append(i)
            outcome = _run(self.jobs[i])
        self.outcomes[i] = outcome
        self.on_done(i, outcome)

    def _receive(self, message: bytes) -> None:
        i, outcome = pickle.loads(message)
        self._deliver(i, outcome)

    def poll(self) -> int:
        """Deliver the helpers' finished outcomes without waiting; returns how many arrived."""
        n = 0
        while self._results is not None:
            try:
                message = self._results.get_nowait()
            except queue.Empty:
                break
            self._receive(message)
            n += 1
        return n

    def run_one_here(self) -> bool:
        """Run one job here, from the back of the list; False when none is left to take."""
        if self._ends is None:
            if self._local_front >= len(self.jobs):
                return False
            i = self._local_front
            self._local_front += 1
        else:
            i = self._take(front=False)
            if i is None:
                return False
        self._deliver(i, _run(self.jobs[i]))
        return True

    def finish(self) -> list[Outcome]:
        """Take jobs from the back until the ends meet, then wait for the helpers' outcomes; a helper that exits
        early leaves its missing jobs to this process. Returns the outcomes in job order."""
        while self.run_one_here():
            self.poll()
        while len(self.outcomes) < len(self.jobs):
            try:
                self._receive(self._results.get(timeout=_POLL_S))
                continue
            except queue.Empty:
                pass
            if any(p.is_alive() for p in self._helpers):
                continue
            self.poll()  # the last outcomes may still be in the pipe
            if len(self.outcomes) == len(self.jobs):
                break
            self.helper_failures = [p.exitcode for p in self._helpers if p.exitcode != 0]
            for i in range(len(self.jobs)):  # taken by a helper that died: run here
                if i not in self.outcomes:
                    self._deliver(i, _run(self.jobs[i]))
        for proc in self._helpers:
            proc.join()
        return [self.outcomes[i] for i in range(len(self.jobs))]


__all__ = ["Outcome", "SplitJobs", "fork_available", "resolve_workers", "spare_cpus"]
