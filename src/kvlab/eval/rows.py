"""A timed cell's rows: each cache's :class:`~kvlab.eval.measure.Measurement` as a
:class:`~kvlab.eval.records.Row`, the candidates paired with the baseline and judged by the gates
(:func:`kvlab.eval.decision.apply_gates`)."""

from __future__ import annotations

from kvlab.eval.config import EvalConfig
from kvlab.eval.decision import apply_gates
from kvlab.eval.longctx import long_context_fields
from kvlab.eval.measure import CellMeasurement, Measurement
from kvlab.eval.records import Paired, Row


def timing_spread(timings: list[float]) -> float | None:
    """max / min of a cell's timed calls (None for fewer than two)."""
    if len(timings) < 2 or min(timings) <= 0:
        return None
    return max(timings) / min(timings)


def _group_size(meas: Measurement, group: int, cfg: EvalConfig) -> int | None:
    """The group size a candidate's cache quantizes with (its registry ``describe``), or None without groups."""
    cand = meas.candidate
    if cand.family == "dynamic":
        return None
    return cand.describe(meas.residual, group, cfg.hqq_group_size).get("group_size")


def build_row(cm: CellMeasurement, meas: Measurement, cfg: EvalConfig) -> Row:
    """The row of one timed cache of the cell ``cm`` (the baseline's when ``meas`` is ``cm.base``)."""
    cand, perf, cell = meas.candidate, meas.perf, cm.cell
    is_base = meas is cm.base
    contention = meas.contention
    row = Row(
        matrix=cell.matrix,
        candidate=cand.name,
        family=cand.family,
        nbits=cand.nbits,
        context_length=cell.context,
        new_tokens=cell.new_tokens,
        residual_length=meas.residual if not is_base and cand.uses_residual else None,
        group_size=None if is_base else _group_size(meas, cell.group, cfg),
        median_ms=perf["median_ms"],
        min_ms=perf["min_ms"],
        timings_ms=perf["timings_ms"],
        timing_spread=timing_spread(perf["timings_ms"]),
        ms_per_token=perf["ms_per_token"],
        incremental_peak_bytes=perf["incremental_peak_bytes"],
        peak_memory_method=perf.get("peak_memory_method"),
        cache_tokens=meas.cache_tokens,
        cache_bytes=meas.cache_bytes,
        cache_bytes_breakdown=meas.cache_bytes_breakdown,
        cache_counts=meas.cache_counts,
        timing_contention=contention,
        latency_trusted=not (contention or {}).get("busy", False),
        key_score_path="; ".join(meas.attention_paths) if meas.attention_paths else None,
    )
    q = meas.quality
    if q is not None:
        row.quality = {
            "mean_nll": q["mean_nll"],
            "prefill_ms": q["prefill_ms"],
            "prefill_shared": q.get("prefill_shared", False),
            "decode_ms": q["decode_ms"],
        }
    if meas.long_context:
        base_lc = None if is_base else cm.base.long_context
        row.long_context = long_context_fields(meas.long_context, base_lc)
    if not is_base:
        row.paired = _paired(cm.base, meas)
        gates = apply_gates(row.to_json(), cfg.gates)
        if not row.latency_trusted:  # the verdict would rest on a busy machine's timings: not used
            gates["latency_ratio"] = None
        row.paired.gates = gates
        row.paired.eligible = all(v for v in gates.values() if v is not None)
    return row


def _paired(base: Measurement, meas: Measurement) -> Paired:
    """The candidate's comparison with the baseline of its cell (gates not yet judged)."""
    bperf, perf = base.perf, meas.perf
    bp, cp = bperf["incremental_peak_bytes"], perf["incremental_peak_bytes"]
    compared = dict(meas.compared or {})
    paired = Paired(
        dynamic_cache_bytes=base.cache_bytes,
        cache_bytes_ratio=meas.cache_bytes / base.cache_bytes,
        cache_bytes_saved=base.cache_bytes - meas.cache_bytes,
        latency_ratio=perf["median_ms"] / bperf["median_ms"],
        incremental_peak_saved_bytes=None if bp is None or cp is None else bp - cp,
        incremental_peak_reduction_ratio=None if not bp or cp is None else 1.0 - cp / bp,
        outputs=compared.pop("outputs", {}),
        kl=compared.pop("kl", {}),
        **compared,
    )
    if meas.paired is not None:  # same-round pairs of the interleaved timing (kvlab.runtime.timing)
        paired.latency_ratio = meas.paired["ratio"]
        paired.latency_ratio_min, paired.latency_ratio_max = meas.paired["min"], meas.paired["max"]
        paired.latency_ratio_unpaired = meas.paired["unpaired"]
    return paired


def cell_rows(cm: CellMeasurement, cfg: EvalConfig) -> list[dict]:
    """The JSON rows of a timed cell: the baseline's, then each candidate's that did not fail while timed; none
    when the baseline failed while timed."""
    if cm.base.failed:
        return []
    return [build_row(cm, m, cfg).to_json() for m in [cm.base, *cm.measured] if not m.failed]


__all__ = ["build_row", "cell_rows", "timing_spread"]
