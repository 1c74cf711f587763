"""The records of a ``kvlab eval`` result: a row, a failure, and the one writer of the result's ``status``.

A result file (:mod:`kvlab.eval.schema`) is a JSON object; its ``rows`` and ``failures`` are the ``to_json()`` of
:class:`Row` and :class:`Failure`, and every change of its ``status`` goes through :func:`set_status` (checked
against :data:`kvlab.eval.schema.STATUSES`). Torch-free: the rows' numbers are plain floats and ints by the time
they get here (:mod:`kvlab.eval.rows` builds them from a cell's measurements).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field, fields
from typing import Any

from kvlab.eval.schema import STATUSES

STOP_TYPES = ("KeyboardInterrupt", "Terminated")  # a run's failure entry of these types is a stop (Ctrl-C, SIGTERM)


def set_status(result: dict, status: str) -> dict:
    """Write ``result["status"]`` (the only place that does): ``planned`` (a new result), ``dry_run``, ``running``,
    ``complete`` / ``partial`` (:func:`finish_status`), ``failed`` or ``stopped`` (:func:`stop_run`). Returns
    ``result``.

    Raises:
        ValueError: ``status`` not one of :data:`kvlab.eval.schema.STATUSES`.
    """
    if status not in STATUSES:
        raise ValueError(f"`status` must be one of {list(STATUSES)}, got {status!r}")
    result["status"] = status
    return result


def finish_status(result: dict) -> dict:
    """The status of a run that reached its summary: ``complete`` without failures, else ``partial``."""
    return set_status(result, "complete" if not result["failures"] else "partial")


@dataclass(frozen=True)
class Failure:
    """One thing that failed: a cache in a cell (``matrix``, ``candidate``, ``context_length`` tokens,
    ``residual_length``) or the run itself (``candidate`` None: the model load, a setting, an interrupt; its JSON
    then has no matrix, context or residual)."""

    stage: str  # construct, generate, cache_bytes, quality, timing, long_context, baseline; load_model, settings, run
    type: str  # the exception's class name (BaselineFailed: the cell's float baseline failed first)
    message: str
    candidate: str | None = None  # None: the run itself failed
    matrix: str | None = None  # capacity | window
    context_length: int | None = None  # tokens
    residual_length: int | None = None  # tokens
    traceback_tail: list[str] | None = None  # the last 3 lines of the traceback, where one was kept

    @classmethod
    def of_run(cls, stage: str, exc: BaseException, message: str | None = None) -> Failure:
        """The run's own failure at ``stage`` (``message`` defaults to ``str(exc)``)."""
        return cls(stage, type(exc).__name__, str(exc) if message is None else message)

    @classmethod
    def of_cell(
        cls,
        stage: str,
        exc: BaseException,
        candidate: str,
        matrix: str | None,
        context: int,
        residual: int | None,
    ) -> Failure:
        """A cache's failure in a cell, raised just now (the traceback's tail is kept)."""
        tail = traceback.format_exc().splitlines()[-3:]
        return cls(stage, type(exc).__name__, str(exc), candidate, matrix, context, residual, tail)

    def to_json(self) -> dict:
        """The failure as its result entry: ``{matrix, candidate, context_length, residual_length, stage, type,
        message, traceback_tail?}`` for a cell, ``{candidate: null, stage, type, message}`` for the run."""
        out: dict[str, Any] = {}
        if self.candidate is not None or self.matrix is not None:
            out.update(matrix=self.matrix, candidate=self.candidate, context_length=self.context_length)
            out["residual_length"] = self.residual_length
        else:
            out["candidate"] = None
        out.update(stage=self.stage, type=self.type, message=self.message)
        if self.traceback_tail is not None:
            out["traceback_tail"] = list(self.traceback_tail)
        return out


def record_failure(result: dict, failure: Failure) -> None:
    """Append ``failure`` to ``result["failures"]``."""
    result["failures"].append(failure.to_json())


def fail_run(result: dict, stage: str, exc: BaseException, message: str | None = None) -> None:
    """Record the run's own failure at ``stage`` and mark the result ``failed``."""
    record_failure(result, Failure.of_run(stage, exc, message))
    set_status(result, "failed")


def stop_run(result: dict, stage: str, exc: BaseException, during: str) -> None:
    """Record that the run was stopped (Ctrl-C, SIGTERM) at ``stage`` while it was ``during`` something (words: "loading
    the model", "the run (capacity: context 512, kivi-4)"), and mark the result ``stopped``: not a failure of the run,
    and resumable (``kvlab eval --resume``). The entry's message says ``interrupted during ...`` (Ctrl-C) or
    ``terminated by signal 15 during ...``."""
    cause = "interrupted" if isinstance(exc, KeyboardInterrupt) else (str(exc) or type(exc).__name__)
    record_failure(result, Failure.of_run(stage, exc, f"{cause} during {during}"))
    set_status(result, "stopped")


class RunStage:
    """What a run is doing now, for the record of an interrupt (:func:`stop_run`), shared by ``kvlab eval`` and
    ``kvlab tasks``: the failure's ``stage`` (``load_model``, ``settings``, ``run``) and its words (``"loading the
    model"``); ``measuring``: whether the run itself has started (its progress line names the step)."""

    def __init__(self) -> None:
        self.stage, self.words, self.measuring = "load_model", "loading the model", False

    def set(self, stage: str, words: str) -> None:
        """A stage before the run itself (``settings``, ``"checking the settings against the loaded model"``)."""
        self.stage, self.words = stage, words

    def step(self, words: str) -> None:
        """The run's current step, as its progress line names it (``"the run (<words>)"``)."""
        self.stage, self.words, self.measuring = "run", f"the run ({words})", True


@dataclass
class Paired:
    """What a candidate row adds to the baseline's: its comparison with the float cache of the same cell and its
    verdicts. A field left None is absent from the JSON where the source says "where measured"."""

    dynamic_cache_bytes: int  # the float cache's bytes in the same cell
    cache_bytes_ratio: float  # candidate / float cache
    cache_bytes_saved: int  # float cache minus candidate (negative: the candidate is larger)
    latency_ratio: (
        float  # median of same-round ratios (kvlab.runtime.timing.paired_ratio), else median / median
    )
    incremental_peak_saved_bytes: int | None
    incremental_peak_reduction_ratio: float | None
    outputs: dict  # compare_outputs: greedy_exact_match, token_agreement_rate, first_divergence_index
    latency_ratio_min: float | None = None  # absent: no same-round pairs
    latency_ratio_max: float | None = None
    latency_ratio_unpaired: float | None = None
    nll_delta: float | None = None  # nats per token, candidate minus float cache; absent: no quality stage
    nll_ratio: float | None = None
    topk_overlap: float | None = None  # fraction
    decode_latency_ratio: float | None = None  # absent: a decode time of zero
    kl: dict = field(default_factory=dict)  # kl_summary: kl_mean, kl_p99, kl_max, kl_positions (nats)
    # an int8 twin's KL to its exact twin (kvlab.eval.twins.twin_entry); None (absent): not such a row
    exact_twin: dict | None = None
    gates: dict = field(
        default_factory=dict
    )  # gate -> True / False / None (not used: a busy machine's latency)
    eligible: bool = False  # every gate that applies passed

    # fields written only where measured (None means absent, not null)
    _WHERE_MEASURED = ("latency_ratio_min", "latency_ratio_max", "latency_ratio_unpaired")
    _QUALITY = ("nll_delta", "nll_ratio", "topk_overlap")

    def to_json(self) -> dict:
        """The paired fields in the order the result has always listed them."""
        out: dict[str, Any] = {
            "dynamic_cache_bytes": self.dynamic_cache_bytes,
            "cache_bytes_ratio": self.cache_bytes_ratio,
            "cache_bytes_saved": self.cache_bytes_saved,
            "latency_ratio": self.latency_ratio,
        }
        out.update({k: getattr(self, k) for k in self._WHERE_MEASURED if getattr(self, k) is not None})
        out["incremental_peak_saved_bytes"] = self.incremental_peak_saved_bytes
        out["incremental_peak_reduction_ratio"] = self.incremental_peak_reduction_ratio
        if self.nll_delta is not None:
            out.update({k: getattr(self, k) for k in self._QUALITY})
            if self.decode_latency_ratio is not None:
                out["decode_latency_ratio"] = self.decode_latency_ratio
            out.update(self.kl)
            if self.exact_twin is not None:
                out["exact_twin"] = self.exact_twin
        out.update(self.outputs)
        return out


@dataclass
class Row:
    """One cache in one cell, timed: the result's ``rows`` entry (:mod:`kvlab.eval.schema`). The baseline's row has
    no :class:`Paired` part; ``quality`` and ``long_context`` are absent where those stages did not run."""

    matrix: str  # capacity | window
    candidate: str  # the name as requested
    family: str  # registry family
    nbits: int | None
    context_length: int  # prompt tokens
    new_tokens: int
    residual_length: int | None  # R of a cache with a residual window, else None
    group_size: int | None  # the group size the cache quantizes with, None without groups (dynamic, fp8)
    median_ms: float  # generate() wall time of the timed rounds
    min_ms: float
    timings_ms: list[float]
    timing_spread: float | None  # max / min of the timed calls (None for fewer than two)
    ms_per_token: float
    incremental_peak_bytes: int | None
    peak_memory_method: str | None
    cache_tokens: int  # tokens the cache holds after generation
    cache_bytes: int  # exact bytes of the cache's tensors
    cache_bytes_breakdown: dict | None
    cache_counts: dict | None  # FP8: elements saturated / flushed to zero when stored
    timing_contention: dict | None
    latency_trusted: bool  # false: the machine was busy while this cell was timed
    # what the cache's kvlab attention ran, "; "-joined (KIVI fused: "int8 (avx2)", "exact", "exact (torch: ...)";
    # the float C kernel); None (absent from the JSON): a cache without such a choice, or nothing ran through it
    key_score_path: str | None = None
    quality: dict | None = None  # mean_nll, prefill_ms, prefill_shared, decode_ms
    long_context: dict = field(default_factory=dict)  # kvlab.eval.longctx.long_context_fields
    paired: Paired | None = None  # None for the baseline

    def to_json(self) -> dict:
        """The row as the result file holds it: the fixed fields, then quality, long-context and paired fields."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _ROW_PARTS}
        if self.key_score_path is None:  # written where measured
            del out["key_score_path"]
        if self.quality is not None:
            out.update(self.quality)
        out.update(self.long_context)
        if self.paired is not None:
            out.update(self.paired.to_json())
            out["gates"] = dict(self.paired.gates)
            out["eligible"] = self.paired.eligible
        return out


_ROW_PARTS = ("quality", "long_context", "paired")  # the groups of a Row that to_json flattens


def row_keys() -> set[str]:
    """Every key a :class:`Row` writes itself (the long-context keys come from
    :func:`kvlab.eval.longctx.long_context_fields`; the quality and KL keys are listed here): what the schema test
    checks :mod:`kvlab.eval.schema` against."""
    fixed = {f.name for f in fields(Row)} - set(_ROW_PARTS)
    paired = {f.name for f in fields(Paired)} - {"outputs", "kl"}
    quality = {"mean_nll", "prefill_ms", "prefill_shared", "decode_ms"}
    outputs = {"greedy_exact_match", "token_agreement_rate", "first_divergence_index"}
    kl = {"kl_mean", "kl_p99", "kl_max", "kl_positions"}
    return fixed | paired | quality | outputs | kl


__all__ = [
    "Failure",
    "Paired",
    "Row",
    "fail_run",
    "finish_status",
    "record_failure",
    "row_keys",
    "set_status",
    "stop_run",
]
