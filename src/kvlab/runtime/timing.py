"""Timings a user can trust on a shared machine: interleaved calls, paired ratios, and a contention reading.

A latency ratio "candidate / baseline" taken from two blocks of calls (all of A, then all of B) is wrong whenever
the machine is busier during one block than the other: the slow period lands on one side only. Here the calls
alternate in an order rotated per round (A B C, B C A, C A B, ...), and each ratio is computed from calls of the
*same round*, adjacent in time, so a slow period inflates both sides of a pair alike; the median over rounds then
drops the rounds a burst hit unevenly. This is the paired design of benchmarking practice (e.g. pyperf's
"interleaved" runs; Georges et al., "Statistically rigorous Java performance evaluation", OOPSLA 2007, section 4), and
what ``kvlab bench decode`` already does per token.

Contention is read, not guessed: on Linux, ``/proc/stat`` gives the busy CPU time of the whole machine and
``/proc/self/stat`` that of this process, so ``(machine busy - own) / wall`` is how many cores *other* processes
used while we timed (plus the hypervisor's ``steal``). Elsewhere only the process CPU time and the load average
are recorded, and the verdict is left to them.

Torch-free: the callables do the work (and any device synchronization).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvlab.runtime.checks import check_int, is_int

# other processes using more than the cores this run leaves free plus this many (on average over the timed
# window) make the timings suspect: then they compete with our threads. On a 2-core machine a 2-thread torch job is
# slowed several-fold by half a core taken by someone else; a 1-thread job keeps its core while another process
# uses the second one
BUSY_OTHER_CORES = 0.5
# the process received less than this share of one core per torch thread while timed: it was waiting for a CPU
MIN_CPU_SHARE = 0.6
BUSY_WARNING = "the machine was busy while timing"  # how every sentence of busy_warnings begins


def _proc_stat() -> tuple[int, int] | None:
    """``(busy_ticks, steal_ticks)`` of the whole machine from ``/proc/stat`` (None off Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    v = [int(x) for x in fields[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest time is already in user/nice
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
    return busy, (v[7] if len(v) > 7 else 0)


def _self_ticks() -> int | None:
    """CPU ticks (user + system) of this process, all threads, from ``/proc/self/stat`` (None off Linux)."""
    try:
        with open("/proc/self/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state is fields[0]
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))


def _ticks_per_s() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100


@dataclass
class Snapshot:
    """Clocks at one instant: wall (s), process CPU (s), machine busy/steal ticks and own ticks (None off Linux)."""

    wall_s: float
    cpu_s: float
    machine: tuple[int, int] | None
    own_ticks: int | None

    @classmethod
    def now(cls) -> Snapshot:
        return cls(time.perf_counter(), time.process_time(), _proc_stat(), _self_ticks())


def contention(start: Snapshot, end: Snapshot, threads: int = 1, cpus: int | None = None) -> dict:
    """What the machine did between two snapshots.

    Args:
        start, end: :meth:`Snapshot.now` before and after the timed work.
        threads: torch threads the work used (the CPU share is per thread).

    Returns:
        ``wall_s`` and ``cpu_s`` (seconds), ``cpu_share`` (process CPU / (wall x threads); ~1 when the process had
        its cores), ``other_cores`` (cores used by other processes on average, Linux only, else None),
        ``steal_cores`` (hypervisor steal, Linux only), ``load_avg_1m`` (None where the platform lacks it) and
        ``busy`` (True when ``other_cores + steal_cores > cpus - threads + BUSY_OTHER_CORES``, i.e. others took
        more than the cores this run left free, or ``cpu_share < MIN_CPU_SHARE``), with ``reason``; ``cpus``
        (default ``os.cpu_count()``, the machine's CPUs as ``/proc/stat`` counts them) is recorded too.

    Raises:
        ValueError: ``threads`` < 1 or ``end`` earlier than ``start``.
    """
    check_int("threads", threads, 1)
    wall = end.wall_s - start.wall_s
    if wall < 0:
        raise ValueError(f"`end` is {-wall:.3f} s before `start`")
    cpu = max(0.0, end.cpu_s - start.cpu_s)
    share = cpu / (wall * threads) if wall > 0 else None
    other = steal = None
    if (
        start.machine
        and end.machine
        and start.own_ticks is not None
        and end.own_ticks is not None
        and wall > 0
    ):
        hz = _ticks_per_s()
        busy = end.machine[0] - start.machine[0]
        own = end.own_ticks - start.own_ticks
        other = max(0.0, (busy - own) / hz / wall)
        steal = max(0.0, (end.machine[1] - start.machine[1]) / hz / wall)
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        load = None
    reasons = []
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    free = max(0, cpus - threads)
    if other is not None and other + (steal or 0.0) > free + BUSY_OTHER_CORES:
        reasons.append(
            f"other processes used {other + (steal or 0.0):.2f} cores on average, more than the {free} core(s) of "
            f"{cpus} that this run's {threads} thread(s) left free"
        )
    if share is not None and share < MIN_CPU_SHARE:
        reasons.append(f"this process got {share:.0%} of its {threads} thread(s)' CPU time")
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "threads": threads,
        "cpus": cpus,
        "cpu_share": share,
        "other_cores": other,
        "steal_cores": steal,
        "load_avg_1m": load,
        "busy": bool(reasons),
        "reason": "; ".join(reasons) or None,
    }


def interleaved(
    calls: Mapping[str, Callable[[], object]],
    repeat: int,
    warmup: int = 0,
    clock: Callable[[], float] = time.perf_counter,
    threads: int = 1,
    before: Callable[[str, int], None] | None = None,
) -> tuple[dict[str, list[float]], dict]:
    """Time every call ``repeat`` times, interleaved: round ``r`` runs the calls in the order rotated by ``r``.

    Args:
        calls: name -> a callable doing one complete unit of work (synchronizing its device before returning).
        repeat: timed rounds (>= 1); ``warmup`` untimed rounds run first, also rotated.
        clock: seconds (a test may pass a fake clock).
        threads: torch threads the calls use, for :func:`contention`.
        before: called as ``before(name, round)`` ahead of each timed call, outside its clock (progress
            output); rounds count from 0.

    Returns:
        ``(timings_ms, contention)``: name -> ``repeat`` wall times in ms (round order), and the reading of
        :func:`contention` over the timed rounds.

    Raises:
        ValueError: no calls, ``repeat`` < 1 or ``warmup`` < 0. Exceptions of a call propagate.
        TypeError: a value of ``calls`` that is not callable (named).
    """
    if not calls:
        raise ValueError("`calls` is empty: nothing to time")
    check_int("repeat", repeat, 1)
    check_int("warmup", warmup, 0)
    names = list(calls)
    for name in names:
        if not callable(calls[name]):
            raise TypeError(f"`calls[{name!r}]` must be callable, got {type(calls[name]).__name__}")
    for r in range(warmup):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            calls[name]()
    out: dict[str, list[float]] = {n: [] for n in names}
    start = Snapshot.now()
    for r in range(repeat):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:  # no call always runs first (or right after a slow one)
            if before is not None:
                before(name, r)
            t0 = clock()
            calls[name]()
            out[name].append((clock() - t0) * 1000.0)
    return out, contention(start, Snapshot.now(), threads)


def busy_warnings(cont: dict, what: str, threads_flag: str | None = "--threads") -> list[str]:
    """``[]`` on a quiet machine (``cont`` from :func:`contention`), else one sentence naming the reading and
    ``what`` it makes suspect (e.g. "the speed-up"), for a result's ``warnings`` and the printed output; it advises
    fewer ``threads_flag`` where the work ran several threads (None: the command has no such flag)."""
    if not cont.get("busy"):
        return []
    fewer = f" or with fewer {threads_flag}" if threads_flag and cont.get("threads", 1) > 1 else ""
    return [f"{BUSY_WARNING} ({cont['reason']}): {what} is not trusted; rerun on a quiet machine{fewer}"]



def busy_reason(result: dict) -> str | None:
    """Why a saved result's timings are not trusted, or None when it does not say so: the ``reason`` of its
    ``contention`` reading (:func:`contention`) where that reads ``busy``, else the reason in the first of its
    ``warnings`` that :func:`busy_warnings` wrote (a result that keeps the sentence, not the reading: ``kvlab
    bench kernel``). A result that recorded neither (no contention was read) gives None."""
    cont = result.get("contention") if isinstance(result.get("contention"), dict) else {}
    if cont.get("busy"):
        return str(cont.get("reason") or "busy")
    for w in result.get("warnings") or ():
        if isinstance(w, str) and w.startswith(BUSY_WARNING):
            return w[len(BUSY_WARNING) :].strip().removeprefix("(").split("):", 1)[0] or "busy"
    return None


def paired_ratio(candidate_ms: Sequence[float], baseline_ms: Sequence[float]) -> dict:
    """The latency ratio from same-round pairs: ``median_r(candidate[r] / baseline[r])`` with its spread.

    Args:
        candidate_ms, baseline_ms: per-round wall times (ms) from :func:`interleaved`, same length >= 1.

    Returns:
        ``ratio`` (median of the per-round ratios), ``min``/``max`` of them, ``ratios`` (the list) and
        ``unpaired`` (median(candidate) / median(baseline), the block estimate, for comparison).

    Raises:
        ValueError: lengths differ, are 0, or a time is not positive and finite (NaN, inf).
    """
    if len(candidate_ms) != len(baseline_ms) or not candidate_ms:
        raise ValueError(
            f"paired timings need equal, non-zero lengths, got {len(candidate_ms)} and {len(baseline_ms)}"
        )
    times = (*candidate_ms, *baseline_ms)
    if not all(math.isfinite(t) and t > 0 for t in times):  # NaN passes a `min(...) <= 0` check
        raise ValueError(f"times must be positive, finite ms, got {list(candidate_ms)}, {list(baseline_ms)}")
    ratios = [c / b for c, b in zip(candidate_ms, baseline_ms, strict=True)]
    return {
        "ratio": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
        "ratios": ratios,
        "unpaired": statistics.median(candidate_ms) / statistics.median(baseline_ms),
    }


def default_threads(cpus: int | None = None) -> int:
    """Torch threads for a measured run when the user gives none: ``OMP_NUM_THREADS`` if set, else all usable CPUs
    but one (at least 1).

    Why: on a shared 2-core machine, two torch threads spin-wait for each other whenever a third process takes a
    core, and runs slow down 10-150x (measured for issue "Timings a user can trust"); one thread loses ~1.3x on an
    idle machine and almost nothing on a busy one. Leaving one core free is the rule that degrades gracefully.

    Args:
        cpus: usable CPUs (default: this process's affinity mask, else ``os.cpu_count()``).

    Raises:
        ValueError: ``OMP_NUM_THREADS`` set to something other than a positive integer; ``cpus`` not an int >= 1.
    """
    env = os.environ.get("OMP_NUM_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"OMP_NUM_THREADS must be a positive integer, got {env!r}")
        return n
    cpus = usable_cpus() if cpus is None else check_int("cpus", cpus, 1)
    return max(1, cpus - 1)


def check_threads(threads: int | None, flag: str = "--threads", cpus: int | None = None) -> int | None:
    """``threads`` (``None``: not given) when it is an int from 1 to ``cpus`` (default :func:`usable_cpus`): more
    threads than CPUs only contend for them (``kvlab lab --threads 999`` on 2 CPUs ran for minutes).

    Raises:
        ValueError: not an int >= 1, or more than ``cpus``; naming ``flag``, the value and the CPUs.
    """
    if threads is None:
        return None
    if not is_int(threads) or threads < 1:
        raise ValueError(f"{flag} must be an int >= 1, got {threads!r}")
    cpus = usable_cpus() if cpus is None else cpus
    if threads > cpus:
        raise ValueError(
            f"{flag} {threads} is more than the {cpus} CPU{'s' if cpus > 1 else ''} this process may use; "
            f"give at most {cpus} (more threads than CPUs only contend for them)"
        )
    return int(threads)


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask where the OS has one, else ``os.cpu_count()`` (>= 1)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
