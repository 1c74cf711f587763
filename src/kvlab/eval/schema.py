"""The ``kvlab eval`` result file: schema version, required fields, and a validator.

A result is one JSON object::

    schema_version  "kvlab.eval/1"
    label, status   status in {"planned", "dry_run", "running", "complete", "partial", "failed"}
    created_utc, command, settings (EvalConfig), gates {max_nll_delta, min_topk_overlap, max_latency_ratio,
                    max_recall_drop, max_passkey_drop, max_kl_mean}  (the last three absent in older files)
    candidates      [{name, family, nbits?, group_size?, residual_length?, available, skip_reason}]
    plan            [{matrix, candidate, context_length, new_tokens, residual_length, group_size}]
    provenance      {software, hardware, model {id_or_path, fingerprint, dtype, device, ...}, prompts, seed,
                     long_context {protected_tail_tokens, passkey_contexts, not_measured [{probe, context_length,
                     reason}]}}; prompts holds one entry per capacity/window prompt and per probe
                     (mode "recall" / "passkey": context_length, placement, seed, ids_sha256, sequence_sha256)
    rows            [{matrix in {"capacity", "window"}, candidate, context_length, residual_length, group_size,
                      median_ms, min_ms, timings_ms, timing_spread (max/min of the timed calls), ms_per_token,
                      incremental_peak_bytes, cache_bytes, mean_nll,
                      and for non-baseline rows: cache_bytes_ratio, cache_bytes_saved, nll_delta, nll_ratio,
                      topk_overlap, latency_ratio, greedy_exact_match, token_agreement_rate,
                      first_divergence_index, gates {...: bool}, eligible,
                      kl_mean, kl_p99, kl_max (nats; KL(float || candidate) per continuation position),
                      and where the probes ran (kvlab.eval.longctx):
                      recall {accuracy, mean_nll, scored_tokens, distances [{distance_tokens, rows, scored_tokens,
                      accuracy, mean_nll, accuracy_drop?}]}, recall_accuracy, recall_nll, recall_drop,
                      recall_nll_delta, passkey {accuracy, correct, trials, ci95, depths [{depth, trials, correct,
                      accuracy, ci95 [low, high], accuracy_drop?}]}, passkey_accuracy, passkey_drop,
                      long_context_ms}]
    failures        [{candidate, context_length, residual_length, stage, type, message}]
    summary         {memory_reduction_onset_context, eligible_crossover_context, selected_candidate, decision,
                      latency_warning (None, or why the timings are not to be trusted), long_context_warning (None,
                      or where the float cache itself does not recall/retrieve), long_context_not_measured
                      (None, or which probes did not fit which context: their gates do not apply there), ...}
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


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _long_context_problems(i: int, row: dict) -> list[str]:
    """Accuracies must be fractions, KL values non-negative numbers, the per-point lists lists of objects."""
    problems = []
    for key in ("recall_accuracy", "passkey_accuracy"):
        value = row.get(key)
        if value is not None and not (_is_number(value) and 0 <= value <= 1):
            problems.append(f"rows[{i}].{key} {value!r} is not a fraction in [0, 1]")
    for key in ("kl_mean", "kl_p99", "kl_max"):
        value = row.get(key)
        if value is not None and not (_is_number(value) and value >= 0):
            problems.append(f"rows[{i}].{key} {value!r} is not a number >= 0")
    for key, points in (("recall", "distances"), ("passkey", "depths")):
        block = row.get(key)
        if block is None:
            continue
        if not isinstance(block, dict) or not isinstance(block.get(points), list):
            problems.append(f"rows[{i}].{key} must be an object with a {points!r} list")
        elif not all(isinstance(p, dict) and "accuracy" in p for p in block[points]):
            problems.append(f"rows[{i}].{key}.{points} must hold objects with 'accuracy'")
    return problems


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
        problems += _long_context_problems(i, row)
    if result["status"] in ("complete", "partial") and not isinstance(result.get("summary"), dict):
        problems.append("a finished result needs a summary object")
    for i, f in enumerate(result["failures"]):
        problems += [
            f"failures[{i}] lacks {k!r}" for k in ("candidate", "stage", "type", "message") if k not in f
        ]
    return problems
