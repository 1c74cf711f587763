"""The long-context probes of a ``kvlab eval`` run: which probe jobs it has, where they run (this process and
forked helpers, :class:`kvlab.runtime.workers.SplitJobs`) and how their results reach each cache's measurement.

Each cell gets a recall probe and, at the passkey contexts of the capacity matrix, a passkey probe
(:func:`kvlab.eval.cells.probe_kinds`); every cache of the cell is scored on it (:mod:`kvlab.eval.longctx`). A probe
job is one cache on one probe; identical jobs of both matrices (the float cache at a context both use) run once.
The probed text is kept out of the newest ``protected_tail`` tokens, the largest residual window plus group size of
either matrix (a KIVI cache holds up to ``R + G - 1`` newest tokens in the model dtype), so the same probe serves
both matrices at a shared context.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvlab.eval.candidates import Candidate
from kvlab.eval.cells import Cell, cell_caches, probe_kinds
from kvlab.eval.config import EvalConfig
from kvlab.eval.longctx import (
    NotMeasurable,
    build_passkey_probe,
    build_recall_probe,
    encode_heldout,
    measure_long_context,
    prefill_states,
)
from kvlab.eval.measure import CellMeasurement
from kvlab.eval.records import Failure, record_failure
from kvlab.runtime.workers import SplitJobs


@dataclass(frozen=True)
class ProbeJob:
    """One cache's probe of one kind at one context; ``key`` is shared by identical jobs of both matrices."""

    kind: str  # recall | passkey
    ctx: int  # context tokens
    cand: Candidate
    residual: int  # R (0 for the baseline)
    group: int  # KIVI G of the cell
    key: tuple


def probe_key(kind: str, ctx: int, cand: Candidate, residual: int, group: int, cfg: EvalConfig) -> tuple:
    """What makes two probe jobs the same: the probe, the cache and the settings it quantizes with."""
    if cand.name == "dynamic":  # the baseline (dynamic-ckernel is a candidate)
        return (kind, ctx, "dynamic")
    group_size = cand.describe(residual, group, cfg.hqq_group_size).get("group_size")
    return (kind, ctx, cand.name, residual if cand.uses_residual else None, group_size)


class LongContextProbes:
    """The recall / passkey probes of each context (built once, cheaply), their shared float prefill (computed
    where a probe job first needs it: this process or a helper), the jobs, and their results."""

    def __init__(self, cfg: EvalConfig, model: Any, tokenizer: Any, result: dict, runnable: list[Candidate]):
        self.cfg, self.model, self.tokenizer, self.result = cfg, model, tokenizer, result
        self.runnable = runnable
        self.base_cand = Candidate.parse("dynamic")
        tails = [cfg.residual_length + cfg.group_size]
        if cfg.window_residuals:
            tails.append(max(cfg.window_residuals) + cfg.window_group_size)
        self.protected_tail = max(tails)
        self._heldout: list[int] | None = None
        self._probes: dict[tuple[str, int], Any] = {}  # (kind, context) -> Probe, or None when not measurable
        self._states: tuple[tuple[str, int], Any] | None = (
            None  # the latest prefill only (its memory is large)
        )
        self._prompt_info: dict[tuple[str, int], dict] = {}
        self.info = {
            "protected_tail_tokens": self.protected_tail,
            "passkey_contexts": list(cfg.passkey_contexts()),
            "not_measured": [],
        }
        result["provenance"]["long_context"] = self.info
        # the jobs that ran to the end, kept in the file until the run's summary: a resumed run does not run them again
        self.saved = result.setdefault("probes_done", [])
        self.done = {tuple(d["key"]): tuple(d["outcome"]) for d in self.saved}

    def _heldout_ids(self) -> list[int]:
        if self._heldout is None:
            from kvlab.models import heldout_text

            self._heldout = encode_heldout(self.tokenizer, heldout_text())
        return self._heldout

    def probe(self, kind: str, ctx: int):
        """The probe of ``kind`` at ``ctx`` (built on first use), or None when the context is too short for it (then
        recorded in ``provenance.long_context.not_measured``, not a failure)."""
        if (kind, ctx) in self._probes:
            return self._probes[(kind, ctx)]
        cfg = self.cfg
        common = {"protected_tail": self.protected_tail, "seed": cfg.seed}
        try:
            if kind == "recall":
                probe = build_recall_probe(
                    self._heldout_ids(),
                    ctx,
                    rows_per_distance=cfg.recall_rows,
                    span_tokens=cfg.recall_span_tokens,
                    fractions=cfg.recall_fractions,
                    **common,
                )
            else:
                probe = build_passkey_probe(
                    self.tokenizer,
                    self._heldout_ids(),
                    ctx,
                    trials=cfg.passkey_trials,
                    depths=cfg.passkey_depths,
                    **common,
                )
        except NotMeasurable as exc:
            self.info["not_measured"].append({"probe": kind, "context_length": ctx, "reason": str(exc)})
            probe = None
        else:
            self._prompt_info[(kind, ctx)] = {"mode": kind, **probe.info, "prefill_ms": None}
            self.result["provenance"]["prompts"].append(self._prompt_info[(kind, ctx)])
        self._probes[(kind, ctx)] = probe
        return probe

    def built(self) -> dict[tuple[str, int], Any]:
        """``{(kind, context): Probe}`` of the probes built so far (the measurable ones)."""
        return {k: p for k, p in self._probes.items() if p is not None}

    def states(self, kind: str, ctx: int) -> tuple[Any, float | None]:
        """``(states, prefill_ms)``: the float prefill of the probe's prompts (:func:`prefill_states`); computed
        here unless it is the one this process computed last (then ``prefill_ms`` is None)."""
        if self._states is not None and self._states[0] == (kind, ctx):
            return self._states[1], None
        self._states = None  # free the previous prefill before computing the next one
        probe = self._probes[(kind, ctx)]
        start = time.perf_counter()
        states = prefill_states(self.model, probe.prompt_ids.to(next(self.model.parameters()).device))
        self._states = ((kind, ctx), states)
        return states, (time.perf_counter() - start) * 1000.0

    def drop_states(self) -> None:
        """Free the float prefill this process computed last."""
        self._states = None

    def plan(self, cells: list[Cell], kept: frozenset, progress, advance) -> list[ProbeJob]:
        """Every cache's probe jobs over ``cells`` (identical ones once), those sharing a prefill adjacent, the
        largest prefill first (a helper starts there; this process takes the last, cheapest ones). A probe too long
        for its context is recorded and its steps counted done. The cells in ``kept`` (``(matrix, context)``,
        finished in an earlier session of a resumed run) get no job, their steps counted done; their probes are
        still built, so that the provenance (prompts, ``not_measured``) is the same as an uninterrupted run's."""
        progress("planning the long-context probes")
        jobs: dict[tuple, ProbeJob] = {}
        for cell in cells:
            caches = [(self.base_cand, 0)] + cell_caches(self.runnable, cell)
            for kind in probe_kinds(self.cfg, cell):
                measurable = self.probe(kind, cell.context) is not None
                for cand, r in caches:
                    key = probe_key(kind, cell.context, cand, r, cell.group, self.cfg)
                    if not measurable or cell.key in kept:
                        advance()  # its step (count_steps) is done: nothing to run
                    elif key in self.done and key not in jobs:  # ran in an earlier session of a resumed run
                        jobs[key] = None
                        self._first_prefill(kind, cell.context, self.done[key])
                        advance()
                    elif key not in jobs:
                        jobs[key] = ProbeJob(kind, cell.context, cand, r, cell.group, key)
                    else:
                        advance()  # the same job in the other matrix: one run serves both
        # groups by their prefill's prompt tokens, largest first: a helper starts there, and where the two ends meet
        # (the one group both sides may prefill) the prefill is the cheapest; within a group the float cache first
        size = {k: p.prompt_ids.numel() for k, p in self.built().items()}
        todo = [j for j in jobs.values() if j is not None]
        return sorted(todo, key=lambda j: (-size[(j.kind, j.ctx)], j.kind, j.ctx))

    def _first_prefill(self, kind: str, ctx: int, outcome: tuple) -> None:
        """The first prefill time of a probe goes into its prompt entry."""
        entry = self._prompt_info[(kind, ctx)]
        if outcome[0] == "ok" and outcome[1]["prefill_ms"] is not None and entry["prefill_ms"] is None:
            entry["prefill_ms"] = outcome[1]["prefill_ms"]

    def job(self, job: ProbeJob) -> Callable[[], dict]:
        """The probe job as a zero-argument callable (it runs in this process or a forked helper)."""

        def run() -> dict:
            states, prefill_ms = self.states(job.kind, job.ctx)
            config, cfg = self.model.config, self.cfg
            if job.cand.name == "dynamic":
                make = lambda: self.base_cand.make(config, 0, job.group)  # noqa: E731
            else:
                make = lambda: job.cand.make(  # noqa: E731
                    config, job.residual, job.group, cfg.hqq_group_size, cfg.kivi_attention
                )
            probe = self.probe(job.kind, job.ctx)
            out = measure_long_context(self.model, make, {job.kind: probe}, {job.kind: states})[job.kind]
            return {"probe": out, "prefill_ms": prefill_ms}

        return run

    def on_done(self, jobs: list[ProbeJob], progress, advance) -> Callable[[int, tuple], None]:
        """The progress step of each finished probe job (whichever process ran it); the first prefill time of a
        probe goes into its prompt entry."""

        def done(i: int, outcome: tuple) -> None:
            j = jobs[i]
            where = f"{j.kind}, context {j.ctx}, {j.cand.name}" + (
                f", R={j.residual}" if j.cand.uses_residual else ""
            )
            if outcome[0] == "ok":
                self._first_prefill(j.kind, j.ctx, outcome)
                self.done[j.key] = outcome
                self.saved.append({"key": list(j.key), "outcome": list(outcome)})
                progress(f"long context: {where}")
            else:
                progress(f"[red]long context failed: {where}: {outcome[1]['type']}: {outcome[1]['message']}")
            advance()

        return done

    def attach(
        self, measured: list[CellMeasurement | None], jobs: list[ProbeJob], outcomes: list[tuple]
    ) -> None:
        """Put each cache's probe results into its measurement; a failed float-cache probe drops the cell's
        probes (recorded once per cell), a failed candidate probe fails that candidate (recorded, not timed)."""
        by_key = {**self.done, **{j.key: o for j, o in zip(jobs, outcomes)}}
        for cm in measured:
            if cm is None:
                continue
            ctx, group, matrix = cm.cell.context, cm.cell.group, cm.cell.matrix
            kinds = [k for k in probe_kinds(self.cfg, cm.cell) if self.probe(k, ctx) is not None]
            base_out = {k: by_key[probe_key(k, ctx, self.base_cand, 0, group, self.cfg)] for k in kinds}
            bad = next((o[1] for o in base_out.values() if o[0] != "ok"), None)
            if bad is not None:
                record_failure(
                    self.result,
                    Failure(
                        candidate="dynamic", matrix=matrix, context_length=ctx, **bad, stage="long_context"
                    ),
                )
                continue
            if kinds:
                cm.base.long_context = {k: o[1]["probe"] for k, o in base_out.items()}
            kept = []
            for meas in cm.measured:
                keys = {k: probe_key(k, ctx, meas.candidate, meas.residual, group, self.cfg) for k in kinds}
                outs = {k: by_key[key] for k, key in keys.items()}
                bad = next((o[1] for o in outs.values() if o[0] != "ok"), None)
                if bad is not None:
                    where = {"candidate": meas.candidate.name, "matrix": matrix, "context_length": ctx}
                    record_failure(
                        self.result,
                        Failure(**where, residual_length=meas.residual, **bad, stage="long_context"),
                    )
                    continue
                if kinds:
                    meas.long_context = {k: o[1]["probe"] for k, o in outs.items()}
                kept.append(meas)
            cm.measured = kept

    def record_workers(self, split: SplitJobs, workers: int, memory_note: str | None, progress) -> None:
        """How the probes were shared out, in ``provenance.long_context``."""
        info = self.info
        info["workers"] = workers  # each helper computes with one torch thread
        if memory_note:
            info["workers_note"] = memory_note
        if split.helper_failures:
            info["helper_failures"] = split.helper_failures
            progress(
                f"[yellow]a helper process exited early (exit codes {split.helper_failures}); "
                "its probes ran in this process"
            )
        if split.reran:
            info["probes_rerun_here"] = len(split.reran)


def carry_prefill_ms(earlier: list[dict], prompts: list[dict]) -> None:
    """A resumed run computes no probe prefill for the cells it kept: their prompt entries take ``prefill_ms``
    from the same entry of the earlier session (``earlier``), where there is one."""

    def key(entry: dict) -> str:  # the entry but its time, as JSON (the earlier one was read back from JSON)
        return json.dumps({k: v for k, v in entry.items() if k != "prefill_ms"}, sort_keys=True, default=str)

    times = {
        key(e): e["prefill_ms"] for e in earlier if isinstance(e, dict) and e.get("prefill_ms") is not None
    }
    for entry in prompts:
        if "prefill_ms" in entry and entry["prefill_ms"] is None:
            entry["prefill_ms"] = times.get(key(entry))


def fit_workers(
    cfg: EvalConfig, model: Any, probes: LongContextProbes | None, workers: int
) -> tuple[int, str | None]:
    """``(workers, note)``: with helpers, every process may hold one probe prefill at once (each group's float K/V,
    ``rows x context`` tokens); auto mode keeps to one process when ``workers`` times the largest would take more
    than half the available memory (a 7B model's 100-prompt passkey prefill at 512 tokens is ~6.7 GB), and says so
    in ``note``. An explicit ``cfg.workers`` is kept as asked."""
    if workers == 1 or cfg.workers is not None or probes is None or not probes.built():
        return workers, None
    try:
        from kvlab.plan.spec import spec_from_config

        spec = spec_from_config(model.config.to_dict())
        per_token = (
            spec.kv_elements_per_token_per_layer * spec.kv_layers * next(model.parameters()).element_size()
        )
    except ValueError:  # an architecture the planner cannot read: no estimate, no limit
        return workers, None
    largest = max(p.prompt_ids.numel() for p in probes.built().values()) * per_token
    from kvlab.runtime.provenance import available_memory_bytes

    available = available_memory_bytes()
    if available is None or workers * largest <= available / 2:
        return workers, None
    return 1, (
        f"one process: {workers} probe prefills of up to {largest / 2**30:.2f} GiB at once would take more than half "
        f"the available memory ({available / 2**30:.2f} GiB)"
    )


__all__ = ["LongContextProbes", "ProbeJob", "carry_prefill_ms", "fit_workers", "probe_key"]
