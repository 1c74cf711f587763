"""``kvlab tasks``: the long-context tasks (:mod:`kvlab.tasks`) over tasks x contexts x candidate caches, as one
result dict with per-task gates and a decision (:func:`kvlab.eval.tasks_run.judge`). docs/TASKS.md describes the
measurement: question-agnostic compression, one float prefill per context and sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvlab.caches.registry import resolve
from kvlab.eval.tasks_run import FLOAT, MIN_FLOAT_SCORE, judge, run_task_cell
from kvlab.tasks import TASKS, NotPlaceable, as_tokenizer, generate, noise_haystack, text_haystack

RESULT_KIND = "kvlab-tasks"
RESULT_VERSION = 1
DEFAULT_CANDIDATES = (
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
QUICK_TASKS = ("niah_single_1", "niah_single_3", "niah_multikey_1", "vt")
QUICK_CANDIDATES = ("dynamic", "kivi-4", "kivi-2", "snapkv:compression_ratio=0.5")
MIN_CONTEXT = 128
TASKS_ALL = tuple(TASKS)


def family(name: str) -> str:
    """The figure's line a candidate belongs to: its registry family, ``kivi+snapkv`` for SnapKV under KIVI."""
    cache = resolve(name)
    evicting = {k for k, _ in cache.name.settings} & {"compression_ratio", "token_budget"}
    return "kivi+snapkv" if cache.family == "kivi" and evicting else cache.family


@dataclass(frozen=True)
class TaskSuiteConfig:
    """What one ``kvlab tasks`` run measures.

    Raises:
        ValueError: an unknown task or cache name, a repeated one, contexts below :data:`MIN_CONTEXT`, ``n`` below
            1, a negative ``protected_tail``, ``max_drop`` / ``min_float_score`` outside [0, 1] (each value named).
    """

    tasks: tuple[str, ...] = tuple(TASKS)  # task names of kvlab.tasks.TASKS
    contexts: tuple[int, ...] = (512, 1024)  # context tokens (instruction + haystack + needles)
    candidates: tuple[str, ...] = (
        DEFAULT_CANDIDATES  # cache registry names; "dynamic" is always measured first
    )
    n: int = 10  # samples per task and context
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
        for c in self.contexts:
            if isinstance(c, bool) or not isinstance(c, int) or c < MIN_CONTEXT:
                raise ValueError(f"contexts must be integers >= {MIN_CONTEXT}, got {c!r}")
        if not self.contexts:
            raise ValueError("give at least one context")
        for name, value, low in (("n", self.n, 1), ("protected_tail", self.protected_tail, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"`{name}` must be an integer >= {low}, got {value!r}")
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


def run_suite(
    model: Any,
    tokenizer: Any,
    cfg: TaskSuiteConfig,
    heldout_text: str,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Every task at every context through every candidate (one float prefill per context and sample).

    Args:
        heldout_text: text the model never saw, the natural-text haystack (``kvlab.models.heldout_text()`` for the
            bundled model).
        progress: called with one line per finished cell.

    Returns:
        The result's measured part: ``cells`` (:func:`kvlab.eval.tasks_run.run_task_cell` outputs with ``task``,
        ``context``, ``seconds``), ``not_measured`` (cells that do not fit, with the reason), ``candidates`` (each
        name's settings and family), ``skipped`` (caches unavailable here), and :func:`judge`'s ``gates`` /
        ``decision``.
    """
    from kvlab.attention import enable

    makers, skipped = _factories(model, cfg.caches)
    if any(resolve(n).uses_kvlab_attention for n in makers):
        enable(model)  # fused KIVI, FP8 and the query-scored caches read through kvlab attention
    tok = as_tokenizer(tokenizer)
    hay = {"noise": noise_haystack(tok), "text": text_haystack(tok, heldout_text)}
    stop = getattr(tokenizer, "eos_token_id", None)
    cells, not_measured = [], []
    for context in cfg.contexts:
        for task in cfg.tasks:
            start = time.perf_counter()
            try:
                samples = generate(
                    task, tokenizer, hay, context, cfg.n, seed=cfg.seed, protected_tail=cfg.protected_tail
                )
            except NotPlaceable as e:
                not_measured.append({"task": task, "context": context, "reason": str(e)})
                continue
            cell = run_task_cell(model, tokenizer, samples, makers, stop_id=stop, keep_outputs=True)
            cell.update({"task": task, "context": context, "seconds": time.perf_counter() - start})
            cells.append(cell)
            if progress is not None:
                base = cell["caches"][FLOAT]["score"]
                progress(f"{task} @ {context}: float {base:.2f}, {cell['seconds']:.1f} s")
    out = {
        "cells": cells,
        "not_measured": not_measured,
        "skipped": skipped,
        "candidates": {n: {**resolve(n).describe(), "line": family(n)} for n in makers},
        "settings": asdict(cfg),
    }
    out.update(judge(cells, cfg.max_drop, cfg.min_float_score))
    return out
