"""The driver of ``kvlab eval``: the result skeleton (:func:`new_result`) and the run (:func:`run_eval`).

Two matrices: **capacity** (contexts x candidates at a fixed residual window) and **residual window** (one context,
longer generation, residuals R x candidates), each cell every cache candidate against ``DynamicCache`` on the same
prompt (:mod:`kvlab.eval.cells`). The run has two phases: every cell's untimed measurements (outputs, bytes, peak
memory, quality, :mod:`kvlab.eval.measure`; the long-context probes shared with forked helpers,
:mod:`kvlab.eval.probes`), then every cell's caches timed together, interleaved, with the helpers gone; each timed
cell's rows (:mod:`kvlab.eval.rows`) are written at once. The summary and decision come last
(:mod:`kvlab.eval.decision`). A candidate that fails is recorded with its stage, exception type and message, and the
rest still run.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import torch

from kvlab.eval.candidates import Candidate
from kvlab.eval.cells import Cell, cell_caches, kept_cells, plan_cells, run_cells, runnable
from kvlab.eval.config import EvalConfig
from kvlab.eval.decision import dtype_warning, summarize
from kvlab.eval.measure import CellMeasurement, CellMeasurer, build_prompts, pad_id
from kvlab.eval.metrics import run_generate
from kvlab.eval.model_info import enable_attention
from kvlab.eval.probes import LongContextProbes, carry_prefill_ms, fit_workers
from kvlab.eval.records import finish_status, set_status
from kvlab.eval.rows import cell_rows
from kvlab.eval.schema import SCHEMA_VERSION
from kvlab.runtime.dtypes import cpu_matmul_policy
from kvlab.runtime.provenance import hardware_info, software_info
from kvlab.runtime.timing import default_threads
from kvlab.runtime.workers import SplitJobs, resolve_workers

Progress = Callable[[str], None]


def new_result(cfg: EvalConfig, label: str, argv: list[str] | None) -> dict:
    """Result skeleton: schema, settings, gates, candidates, planned cells; status ``planned``."""
    cands = []
    for name in cfg.candidates:
        c = Candidate.parse(name)
        d = c.describe(cfg.residual_length, cfg.group_size, cfg.hqq_group_size, cfg.kivi_attention)
        reason = c.unavailable_reason()
        d.update({"available": reason is None, "skip_reason": reason})
        cands.append(d)
    result = {
        "schema_version": SCHEMA_VERSION,
        "label": label,
        "status": None,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": ["kvlab", *argv] if argv is not None else None,
        "settings": cfg.to_dict(),
        "gates": cfg.gates.__dict__.copy(),
        "candidates": cands,
        "plan": plan_cells(cfg),
        "provenance": {"software": software_info()},
        "cells_done": [],  # {matrix, context_length} of each finished cell, in the order they finished
        "rows": [],
        "failures": [],
        "summary": None,
        "elapsed_s": None,
    }
    return set_status(result, "planned")


@contextlib.contextmanager
def _torch_threads(threads: int) -> Iterator[int]:
    """Torch runs with ``threads`` threads inside; the caller's setting is restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(previous)


def run_eval(
    cfg: EvalConfig,
    model: Any,
    tokenizer: Any,
    result: dict,
    model_info: dict,
    progress: Progress = lambda msg: None,
    advance: Callable[[], None] = lambda: None,
    notify: Callable[[str], None] = lambda msg: None,
) -> dict:
    """Run both matrices and fill ``result`` (from :func:`new_result`) in place; returns it.

    ``model`` must already be on its device in ``cfg.dtype``. Rows hold JSON-ready numbers only. ``elapsed_s``: the
    seconds of this call, recorded also when it raises (a stopped run's session, which a resumed run adds up).
    Torch runs with ``cfg.threads`` threads (recorded as ``provenance.torch_threads``). A cell is finished once it is timed and its
    rows are in ``result["rows"]`` (or once its baseline failed): then it is listed in ``result["cells_done"]`` and
    ``advance`` is called, where ``kvlab eval`` saves the file. A cell already listed there when the run starts (a
    run resumed by :func:`kvlab.eval.resume.prepare_resume`) is kept as it is, rows and failures, and not measured
    again. Rows come out in cell order and the summary covers all of them, as in an uninterrupted run.

    ``progress`` names the step starting, ``advance`` marks it done, ``notify`` gets a warning the user should see
    before the run's minutes are spent (:func:`kvlab.eval.decision.dtype_warning`; it is in the summary too).

    Raises:
        ValueError: ``cfg.workers`` > 1 on a GPU run.
    """
    t0 = time.perf_counter()
    try:
        run = _run_phases(cfg, model, tokenizer, result, model_info, progress, advance, notify)
    except BaseException:  # stopped (Ctrl-C, SIGTERM) or failed: the session's time so far, which a resume adds up
        result["elapsed_s"] = time.perf_counter() - t0
        raise
    for key in ("cells_measured", "probes_done"):  # every cell is timed: nothing of the untimed phase to keep
        result.pop(key, None)
    # a resumed run's rows in an uninterrupted run's order (the kept cells' first, then the others')
    order = {cell.key: i for i, cell in enumerate(run.cells)}
    result["rows"].sort(key=lambda r: order.get((r["matrix"], r["context_length"]), len(order)))
    result["summary"] = summarize(result)
    finish_status(result)
    result["elapsed_s"] = time.perf_counter() - t0
    return result


def _run_phases(cfg, model, tokenizer, result, model_info, progress, advance, notify) -> _Run:
    """:func:`run_eval`'s two phases (every cell measured, then every cell timed) under the run's torch threads and
    CPU GEMM policy; returns the run (its cells)."""
    device = next(model.parameters()).device
    with _torch_threads(cfg.threads if cfg.threads is not None else default_threads()) as threads:
        provenance = result["provenance"]
        provenance["torch_threads"] = threads
        workers = resolve_workers(cfg.workers, threads, device.type)
        torch.manual_seed(cfg.seed)
        provenance.update(
            {"hardware": hardware_info(device), "model": model_info, "seed": cfg.seed, "argv": sys.argv}
        )
        # on a CPU without native bf16/fp16 matrix instructions the model dtype itself sets the run's pace: measure
        # it, multiply in float32 GEMMs there (--cpu-matmul auto), and say so before the first cell
        record, gemms = cpu_matmul_policy(model, cfg.cpu_matmul, device)
        provenance["hardware"].update(record)
        warning = dtype_warning(result)
        if warning:
            notify(warning)
        with gemms:
            earlier_prompts = provenance.get("prompts") or []  # a resumed run's, from its earlier session
            provenance["prompts"] = []
            result.setdefault("cells_done", [])
            enable_attention(cfg, model, result)
            set_status(result, "running")
            _warm_up(cfg, model, tokenizer, device)
            run = _Run(cfg, model, tokenizer, result, progress, advance)
            measured = run.untimed_phase(workers)
            if run.probes is not None:
                carry_prefill_ms(earlier_prompts, provenance["prompts"])
            for cm in measured:  # every timed round after the helpers are gone
                if cm is not None:
                    run.time(cm)
    return run


def _warm_up(cfg: EvalConfig, model: Any, tokenizer: Any, device: torch.device) -> None:
    """One untimed generate, so that one-time costs (kernels, allocator) do not land on the first timed cell."""
    warm_ids, _ = build_prompts(cfg, tokenizer, min(64, min(cfg.contexts)), device)
    dynamic = Candidate.parse("dynamic")
    run_generate(model, warm_ids, lambda: dynamic.make(model.config, 0, 1), 4, 0, 1, pad_id(tokenizer))


class _Run:
    """The cells of one run and the two phases over them: :meth:`untimed_phase`, then :meth:`time` per cell."""

    def __init__(self, cfg: EvalConfig, model: Any, tokenizer: Any, result: dict, progress, advance):
        self.cfg, self.tokenizer, self.result = cfg, tokenizer, result
        self.progress, self.advance = progress, advance
        self.device = next(model.parameters()).device
        self.measurer = CellMeasurer(cfg, model, pad_id(tokenizer), result, progress)
        self.runnable = runnable(cfg)
        self.probes = (
            LongContextProbes(cfg, model, tokenizer, result, self.runnable) if cfg.long_context else None
        )
        self.cells = run_cells(cfg)
        self.kept = kept_cells(result)
        # cells an earlier session measured but did not time (a resumed run): timed here, not measured again
        self.restored = {
            (c["matrix"], c["context_length"]): c for c in result.setdefault("cells_measured", [])
        }

    def untimed_phase(self, workers: int) -> list[CellMeasurement | None]:
        """Every cell's untimed measurements, the probe jobs shared with ``workers - 1`` forked helpers; None for
        a cell kept from an earlier session or whose baseline failed."""
        probes = self.probes
        jobs = [] if probes is None else probes.plan(self.cells, self.kept, self.progress, self.advance)
        workers, memory_note = fit_workers(self.cfg, self.measurer.model, probes, workers)
        on_done = probes.on_done(jobs, self.progress, self.advance) if jobs else (lambda i, o: None)
        with SplitJobs([probes.job(j) for j in jobs], workers, on_done) as split:
            measured = [self.measure(cell, split.poll) for cell in self.cells]
            if jobs:
                split.poll()
                helped = (
                    " (this process takes them from the back, the helper from the front)"
                    if workers > 1
                    else ""
                )
                self.progress(
                    f"long-context probes: {len(jobs) - len(split.outcomes)} of {len(jobs)} left{helped}"
                )
            outcomes = split.finish()
        if probes is not None:
            probes.drop_states()  # the last prefill computed here
            probes.record_workers(split, workers, memory_note, self.progress)
            probes.attach(measured, jobs, outcomes)
        return measured

    def measure(self, cell: Cell, poll) -> CellMeasurement | None:
        """One cell's untimed measurements; a kept cell's prompt is recorded again (the provenance lists every
        cell's) and its steps counted done."""
        ids, prompt_info = build_prompts(self.cfg, self.tokenizer, cell.context, self.device)
        self.result["provenance"]["prompts"].append(prompt_info)
        caches = cell_caches(self.runnable, cell)
        if cell.key in self.kept:  # finished in an earlier session: its rows and failures are in `result`
            for _ in range(2 + len(caches)):  # baseline, candidates, timing
                self.advance()
            return None
        if cell.key in self.restored:  # measured in an earlier session: its failures are in `result`
            for _ in range(1 + len(caches)):  # baseline, candidates
                self.advance()
            return self.measurer.restore(cell, ids, self.restored[cell.key])
        cm = self.measurer.measure_cell(cell, ids, caches, self.advance, poll)
        if cm is None:  # the baseline failed: nothing left to measure or time in the cell
            self.finished(cell)
            for _ in range(len(caches) + 1):  # each candidate's step and the cell's timing step, not run
                self.advance()
        else:  # kept in the file until the cell is timed: an interrupt before then loses none of it
            self.result["cells_measured"].append(cm.to_json())
        return cm

    def time(self, cm: CellMeasurement) -> None:
        """Time the cell's caches interleaved, add its rows and mark the cell finished."""
        cell = cm.cell
        self.progress(
            f"{cell.matrix}: context {cell.context}, timing {1 + len(cm.measured)} caches interleaved x {self.cfg.repeat}"
        )
        self.measurer.time_cell(cm.ids, cell.new_tokens, cell.matrix, [cm.base, *cm.measured])
        self.result["rows"].extend(cell_rows(cm, self.cfg))
        measured = self.result["cells_measured"]
        measured[:] = [c for c in measured if (c["matrix"], c["context_length"]) != cell.key]
        self.finished(cell)
        self.advance()  # the timing is a step of its own (in the window matrix the longest); the CLI saves here

    def finished(self, cell: Cell) -> None:
        """Record ``cell`` as finished in ``result["cells_done"]``: its rows and failures are all in ``result``."""
        self.result["cells_done"].append({"matrix": cell.matrix, "context_length": cell.context})


__all__ = ["new_result", "run_eval"]
