"""``kvlab tasks``: the long-context tasks (:mod:`kvlab.tasks`) over tasks x contexts x candidate caches, as one
result dict with per-task gates and a decision (:func:`kvlab.eval.tasks_judge.judge`). docs/TASKS.md describes the
measurement: question-agnostic compression, one float prefill per context and sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import Any

from kvlab.caches.registry import resolve
from kvlab.eval.records import fail_run, set_status, stop_run
from kvlab.eval.resume import running_in
from kvlab.eval.tasks_judge import FLOAT, MIN_FLOAT_SCORE, judge
from kvlab.eval.tasks_run import run_task_cell
from kvlab.eval.tasks_schema import RESULT_KIND, RESULT_VERSION
from kvlab.runtime.checks import check_int
from kvlab.tasks import TASKS, NotPlaceable, as_tokenizer, generate, noise_haystack, text_haystack

# every family over its settings (docs/TASKS.md's 2,048- and 4,096-token tables take one or two of each):
# ``kvlab tasks --candidates sweep``
SWEEP_CANDIDATES = (
    "dynamic",
    "kivi-8",
    "kivi-4",
    "kivi-2",
    "fp8-e4m3",
    "snapkv:compression_ratio=0.5",
    "snapkv:compression_ratio=0.75",
    "tova:compression_ratio=0.5",
    "tova:compression_ratio=0.75",
    "sink:window_length=512",
    "sink:window_length=256",
    "kivi-4:compression_ratio=0.5",
)
# the default: every family once, sized with the default contexts and n so the real model's default run stays under
# 15 minutes on a 2-core CPU (docs/TASKS.md); the sink window is half the 512-token context
DEFAULT_CANDIDATES = (
    "dynamic",
    "kivi-4",
    "fp8-e4m3",
    "snapkv:compression_ratio=0.5",
    "tova:compression_ratio=0.5",
    "sink:window_length=256",
    "kivi-4:compression_ratio=0.5",
)
# the three 12-token-answer needle tasks: the UUID task (48 tokens) took 64 % of a quick run's time, and vt is not
# informative at 512 tokens on the bundled model or SmolLM2-135M (float score < 0.5)
QUICK_TASKS = ("niah_single_1", "niah_single_2", "niah_multikey_1")
QUICK_CANDIDATES = ("dynamic", "kivi-4", "kivi-2", "snapkv:compression_ratio=0.5")
MIN_CONTEXT = 128
TASKS_ALL = tuple(TASKS)


def family(name: str) -> str:
    """The figure's line a candidate belongs to: its registry family, ``kivi+snapkv`` for SnapKV under KIVI (a
    family that does not evict, given SnapKV's settings)."""
    cache = resolve(name)
    evicting = {k for k, _ in cache.name.settings} & {"compression_ratio", "token_budget"}
    return f"{cache.family}+snapkv" if evicting and not cache.entry.evicts else cache.family


class NothingMeasured(ValueError):
    """A ``kvlab tasks`` run that measured no cell: every task was too long for its contexts (docs/TASKS.md)."""


@dataclass(frozen=True)
class TaskSuiteConfig:
    """What one ``kvlab tasks`` run measures.

    Raises:
        ValueError: an unknown task or cache name, a repeated one, contexts below :data:`MIN_CONTEXT`, ``n`` below
            1, a negative ``protected_tail`` or one not below every context, two spellings of one cache
            (``kivi-4``, ``kivi4``), ``max_drop`` / ``min_float_score`` outside [0, 1] (each value named).
    """

    tasks: tuple[str, ...] = tuple(TASKS)  # task names of kvlab.tasks.TASKS
    contexts: tuple[int, ...] = (512,)  # context tokens (instruction + haystack + needles)
    candidates: tuple[str, ...] = (
        DEFAULT_CANDIDATES  # cache registry names; "dynamic" is always measured first
    )
    n: int = 5  # samples per task and context
    seed: int = 0  # generator seed
    protected_tail: int = (
        160  # newest context tokens holding filler only (KIVI's residual window + one group)
    )
    max_drop: float = 0.1  # a gate fails when a cache loses more than this of the float cache's score
    min_float_score: float = MIN_FLOAT_SCORE  # below it a task at a context is "not informative"

    def __post_init__(self) -> None:
        for what, names, known in (("task", self.tasks, TASKS), ("cache", self.candidates, None)):
            if not names:
                raise ValueError(f"give at least one {what}")
            repeated = sorted({x for x in names if names.count(x) > 1})
            if repeated:
                raise ValueError(f"{what} names repeated: {repeated}")
            for x in names:
                if known is not None and x not in known:
                    raise ValueError(f"unknown task {x!r}; known: {', '.join(known)}")
                if known is None:
                    resolve(x)  # ValueError naming the cache
        canonical = {}
        for x in self.candidates:  # two spellings of one cache would measure it twice under two names
            first = canonical.setdefault(resolve(x).name.canonical, x)
            if first != x:
                raise ValueError(
                    f"cache {x!r} is {first!r} again (both are {resolve(x).name.canonical!r}); give it once"
                )
        for c in self.contexts:
            check_int("contexts", c, MIN_CONTEXT, flag="--contexts")
        if not self.contexts:
            raise ValueError("give at least one context")
        check_int("n", self.n, 1, flag="--n")
        check_int("seed", self.seed, 0, flag="--seed")  # as paging's --seed (numpy seeds are >= 0)
        check_int("protected_tail", self.protected_tail, 0, flag="--protected-tail")
        if self.protected_tail >= max(self.contexts):  # no context would have room for a needle
            raise ValueError(
                f"--protected-tail {self.protected_tail} must be below the longest context "
                f"({max(self.contexts)} tokens): no cell could place its needles"
            )
        for name in ("max_drop", "min_float_score"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"`{name}` must be in [0, 1], got {v!r}")

    @property
    def caches(self) -> tuple[str, ...]:
        """The candidates with the float baseline first."""
        return (FLOAT, *(c for c in self.candidates if c != FLOAT))


def _factories(model: Any, names: Sequence[str]) -> tuple[dict[str, Callable[[], Any]], dict[str, str]]:
    """Fresh-cache factories of the names that can run here, and the skipped ones with their reason."""
    makers, skipped = {}, {}
    for name in names:
        cache = resolve(name)
        reason = cache.unavailable_reason()
        if reason:
            skipped[name] = reason
        else:
            makers[name] = lambda cache=cache: cache.make(model.config)
    return makers, skipped


def new_tasks_result(cfg: TaskSuiteConfig, model: dict, command: list[str] | None = None) -> dict:
    """The skeleton of a ``kvlab tasks`` result (:mod:`kvlab.eval.tasks_schema`), status ``running``, no cell yet.

    Args:
        model: ``{"name", "dtype", "device"}`` as the run loads it (``name`` "bundled" for the bundled model).
        command: the command line that started the run (None in-process).
    """
    from kvlab.runtime.provenance import machine_info

    result = {"kind": RESULT_KIND, "version": RESULT_VERSION, "status": "running"}
    result.update(created_utc=datetime.now(UTC).isoformat(timespec="seconds"), command=command)
    result.update(model=dict(model), settings=_settings(cfg), cells=[], not_measured=[], skipped={})
    result.update(candidates={}, failures=[], gates=[], decision={})
    result.update(max_drop=cfg.max_drop, min_float_score=cfg.min_float_score)
    result["provenance"] = {**machine_info(), "started_unix": time.time(), "wall_s": 0.0}
    result["provenance"]["running_in"] = running_in()  # a --resume of this file refuses while this run lives
    return result


def _settings(cfg: TaskSuiteConfig) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()}


def config_of(result: dict) -> TaskSuiteConfig:
    """The :class:`TaskSuiteConfig` a result was measured with (its ``settings``).

    Raises:
        ValueError: settings that are not a :class:`TaskSuiteConfig`'s (a field missing or unknown, a value
            it refuses; named).
    """
    settings = dict(result.get("settings") or {})
    known = {f.name for f in fields(TaskSuiteConfig)}
    if set(settings) != known:
        odd = sorted(set(settings) ^ known)
        raise ValueError(f"settings of the result do not match kvlab tasks' own: {odd} missing or unknown")
    return TaskSuiteConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()})


def prepare_resume(result: dict) -> TaskSuiteConfig:
    """Make a stopped result (status ``stopped``, ``failed``, or ``running`` left by a killed run) ready to continue: its finished cells are kept,
    its failures move to ``provenance.resumed`` (one entry per resumed session), its status is ``running`` again.
    The cells not yet measured are generated from the same seed (:func:`kvlab.tasks.generate`), so the prompts
    are those the first session would have asked. Returns the result's settings.

    Raises:
        ValueError: a complete result (nothing to continue; a version-1 file is complete), a run that measured
            no cell (a :class:`NothingMeasured` failure: it would measure none again), or settings
            :func:`config_of` refuses.
    """
    status = result.get("status", "complete")
    if status == "complete":
        raise ValueError("the result is complete: nothing to resume (run again with --out to measure anew)")
    if any(f.get("type") == NothingMeasured.__name__ for f in result.get("failures") or []):
        raise ValueError(
            "the run measured no cell with these settings (its failure says why); resuming would measure none "
            "again: run with other settings and --out"
        )
    cfg = config_of(result)
    entry = {"resumed_unix": time.time(), "status_before": status, "cells_kept": len(result["cells"])}
    entry["failures_before"] = result["failures"]
    result["provenance"].setdefault("resumed", []).append(entry)
    result["failures"] = []
    result["provenance"]["running_in"] = running_in()
    set_status(result, "running")
    return cfg


def cells_to_measure(result: dict, cfg: TaskSuiteConfig) -> list[tuple[str, int]]:
    """The (task, context) cells of ``cfg`` the result has neither measured nor found not to fit."""
    done = {(c["task"], c["context"]) for c in (*result["cells"], *result["not_measured"])}
    return [(t, c) for c in cfg.contexts for t in cfg.tasks if (t, c) not in done]


def _one_cell(model, tokenizer, cfg, hay, makers, stop, task, context, say, result) -> dict | None:
    """One (task, context) cell measured (:func:`kvlab.eval.tasks_run.run_task_cell`, with ``task``, ``context``,
    ``seconds``), or None when its samples do not fit (the reason appended to ``result["not_measured"]``)."""
    start, where = time.perf_counter(), f"{task} @ {context}"
    say(f"{where}: generating {cfg.n} samples")
    try:
        samples = generate(
            task, tokenizer, hay, context, cfg.n, seed=cfg.seed, protected_tail=cfg.protected_tail
        )
    except NotPlaceable as e:
        result["not_measured"].append({"task": task, "context": context, "reason": str(e)})
        say(f"{where}: not measured ({e})")
        return None
    cell = run_task_cell(
        model,
        tokenizer,
        samples,
        makers,
        stop_id=stop,
        keep_outputs=True,
        progress=lambda x: say(f"{where}: {x}"),
    )
    cell.update({"task": task, "context": context, "seconds": time.perf_counter() - start})
    return cell


def run_suite(
    model: Any,
    tokenizer: Any,
    cfg: TaskSuiteConfig,
    heldout_text: str,
    progress: Callable[[str], None] | None = None,
    *,
    result: dict | None = None,
    save: Callable[[dict], None] | None = None,
    advance: Callable[[], None] | None = None,
) -> dict:
    """Every task at every context through every candidate (one float prefill per context and sample), into
    ``result`` (:func:`new_tasks_result` when None; a resumed one keeps its finished cells).

    Args:
        heldout_text: text the model never saw, the natural-text haystack (``kvlab.models.heldout_text()`` for the
            bundled model).
        progress: called with one line as each cell starts (``task @ context``), as its float prefill and each
            cache start (:func:`kvlab.eval.tasks_run.run_task_cell`), and as it finishes (float score, seconds).
        advance: called once per cell of :func:`cells_to_measure` when it is done (measured or found not to fit).
        save: called with ``result`` after every finished cell (gates and decision judged over the cells so far),
            so a long run keeps what it measured; the caller writes it.

    Returns:
        ``result``, status ``complete``; status ``failed`` with a failure (type ``NothingMeasured``, the first
        cells' reasons) when no cell fit its context. A complete one holds: ``cells`` (:func:`kvlab.eval.tasks_run.run_task_cell` outputs with
        ``task``, ``context``, ``seconds``), ``not_measured`` (cells that do not fit, with the reason),
        ``candidates`` (each name's settings and family), ``skipped`` (caches unavailable here), and
        :func:`judge`'s ``gates`` / ``decision``.

    Raises:
        Whatever stopped the run, after recording it in ``result`` with the cell running (``cell``): an exception
        as a failure (status ``failed``, stage ``run``, its type and message, :func:`kvlab.eval.records.fail_run`);
        ``KeyboardInterrupt`` or another non-``Exception`` (``kvlab.commands.Terminated``: SIGTERM) as a stop
        (status ``stopped``, message ``interrupted during the run (<the last progress line>)``,
        :func:`kvlab.eval.records.stop_run`).
    """
    from kvlab.attention import enable

    result = new_tasks_result(cfg, {"name": "?"}) if result is None else result
    makers, skipped = _factories(model, cfg.caches)
    if any(resolve(n).uses_kvlab_attention for n in makers):
        enable(model)  # fused KIVI, FP8 and the query-scored caches read through kvlab attention
    result["skipped"] = skipped
    result["candidates"] = {n: {**resolve(n).describe(), "line": family(n)} for n in makers}
    tok = as_tokenizer(tokenizer)
    hay = {"noise": noise_haystack(tok), "text": text_haystack(tok, heldout_text)}
    stop, cell_now, step = getattr(tokenizer, "eos_token_id", None), None, ["its start"]
    shown, done = progress or (lambda line: None), advance or (lambda: None)

    def say(line: str) -> None:  # the progress line, also the words of a stop's record
        step[0] = line
        shown(line)

    try:
        for task, context in cells_to_measure(result, cfg):
            cell_now = {"task": task, "context": context}
            cell = _one_cell(model, tokenizer, cfg, hay, makers, stop, task, context, say, result)
            if cell is not None:
                result["cells"].append(cell)
                result.update(judge(result["cells"], cfg.max_drop, cfg.min_float_score))
                if save is not None:
                    save(result)
                base = cell["caches"][FLOAT]["score"]
                say(f"{task} @ {context}: done, float {base:.2f}, {cell['seconds']:.1f} s")
            done()
    except BaseException as exc:  # recorded, then raised again
        if isinstance(exc, Exception):
            fail_run(result, "run", exc)
        else:  # Ctrl-C, a signal's exception (kvlab.commands.Terminated): a stop, resumable
            stop_run(result, "run", exc, f"the run ({step[0]})")
        result["failures"][-1]["cell"] = cell_now
        raise
    result.update(judge(result["cells"], cfg.max_drop, cfg.min_float_score))
    if not result["cells"]:  # nothing measured is not a complete run
        why = "; ".join(f"{c['task']}@{c['context']}: {c['reason']}" for c in result["not_measured"][:2])
        fail_run(result, "run", NothingMeasured(f"no cell measured ({why or 'nothing to measure'})"))
        return result
    return set_status(result, "complete")
