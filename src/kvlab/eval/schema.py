"""The ``kvlab eval`` result file: schema version, required fields, and a validator.

A result is one JSON object::

    schema_version  "kvlab.eval/1"
    label, status   status in {"planned", "dry_run", "running", "complete", "partial", "failed"}
    created_utc, command, settings (EvalConfig), gates {max_nll_delta, min_topk_overlap, max_latency_ratio}
    candidates      [{name, family, nbits?, group_size?, residual_length?, available, skip_reason}]
    plan            [{matrix, candidate, context_length, new_tokens, residual_length, group_size}]
    provenance      {software, hardware, model {id_or_path, fingerprint, dtype, device, ...}, prompts, seed}
    rows            [{matrix in {"capacity", "window"}, candidate, context_length, residual_length, group_size,
                      median_ms, min_ms, timings_ms, timing_spread (max/min of the timed calls), ms_per_token,
                      incremental_peak_bytes, cache_bytes, mean_nll,
                      and for non-baseline rows: cache_bytes_ratio, cache_bytes_saved, nll_delta, nll_ratio,
                      topk_overlap, latency_ratio, greedy_exact_match, token_agreement_rate,
                      first_divergence_index, gates {...: bool}, eligible}]
    failures        [{candidate, context_length, residual_length, stage, type, message}]
    summary         {memory_reduction_onset_context, eligible_crossover_context, selected_candidate, decision,
                      latency_warning (None, or why the timings are not to be trusted), ...}
"""

from __future__ import annotations

SCHEMA_VERSION = "kvlab.eval/1"
STATUSES = ("planned", "dry_run", "running", "complete", "partial", "failed")
MATRICES = ("capacity", "window")
_TOP = (
    "schema_version",
    "label",
    "status",
    "settings",
    "gates",
    "candidates",
    "plan",
    "provenance",
    "rows",
    "failures",
    "summary",
)
_ROW = ("matrix", "candidate", "context_length", "median_ms", "ms_per_token", "cache_bytes")
_PAIRED = ("cache_bytes_ratio", "latency_ratio", "nll_delta", "topk_overlap", "eligible")


def validate_result(result: object) -> list[str]:
    """Problems found in a result object (empty list = valid). Never raises on bad content."""
    if not isinstance(result, dict):
        return [f"result must be a JSON object, got {type(result).__name__}"]
    problems = [f"missing field {k!r}" for k in _TOP if k not in result]
    if problems:
        return problems
    if result["schema_version"] != SCHEMA_VERSION:
        problems.append(f"schema_version {result['schema_version']!r} is not {SCHEMA_VERSION!r}")
    if result["status"] not in STATUSES:
        problems.append(f"status {result['status']!r} not in {list(STATUSES)}")
    if not isinstance(result["rows"], list):
        return problems + ["rows must be a list"]
    for i, row in enumerate(result["rows"]):
        if not isinstance(row, dict):
            problems.append(f"rows[{i}] is not an object")
            continue
        problems += [f"rows[{i}] lacks {k!r}" for k in _ROW if k not in row]
        if row.get("matrix") not in MATRICES:
            problems.append(f"rows[{i}].matrix {row.get('matrix')!r} not in {list(MATRICES)}")
        if row.get("candidate") != "dynamic":
            problems += [f"rows[{i}] ({row.get('candidate')}) lacks {k!r}" for k in _PAIRED if k not in row]
    if result["status"] in ("complete", "partial") and not isinstance(result.get("summary"), dict):
        problems.append("a finished result needs a summary object")
    for i, f in enumerate(result["failures"]):
        problems += [
            f"failures[{i}] lacks {k!r}" for k in ("candidate", "stage", "type", "message") if k not in f
        ]
    return problems
