"""The ``kvlab eval`` result file: schema version, required fields, and a validator.

A result is one JSON object::

    schema_version  "kvlab.eval/1"
    label, status   status in {"planned", "dry_run", "running", "complete", "partial", "failed", "stopped"}
    created_utc, command, settings (EvalConfig), gates {max_nll_delta, min_topk_overlap, max_latency_ratio,
                    max_recall_drop, max_passkey_drop, max_kl_mean}  (the last three absent in older files)
                    settings.prefer: "memory" | "latency", the rule the decision selected by (absent in older
                    files: memory)
    candidates      [{name, family, nbits?, group_size?, residual_length?, available, skip_reason}]
    plan            [{matrix, candidate, context_length, new_tokens, residual_length, group_size}]
    provenance      {software, hardware {..., cpu_capability, matmul_time_ratio_vs_float32, cpu_matmul (float32 |
                     native | not applicable), cpu_matmul_note?}, model {id_or_path, fingerprint, dtype, device, ...},
                     prompts, seed,
                     long_context {protected_tail_tokens, passkey_contexts, not_measured [{probe, context_length,
                     reason}]}}; prompts holds one entry per capacity/window prompt and per probe
                     (mode "recall" / "passkey": context_length, placement, seed, ids_sha256, sequence_sha256);
                     provenance.resumed? [{resumed_utc, command, status_before, cells_kept, rows_kept,
                     cells_measured_kept, cells_to_measure, failures_dropped, stopped_by, earlier_elapsed_s? (the
                     earlier session's elapsed_s), earlier_hardware, earlier_torch_threads}], one
                     entry per session of kvlab eval --resume (kvlab.eval.resume.prepare_resume)
    cells_done?     [{matrix, context_length}] of each finished cell (timed and its rows written, or its baseline
                     failed), in the order they finished; absent in files older than kvlab eval --resume
    cells_measured? [kvlab.eval.measure.CellMeasurement.to_json(): {matrix, context_length, base, measured}] of each
                     cell measured but not yet timed, and probes_done? [{key, outcome}] of each finished probe job:
                     only in a run stopped before its summary (what kvlab eval --resume keeps), gone once it ends
    rows            [kvlab.eval.records.Row.to_json(): {matrix in {"capacity", "window"}, candidate, family, nbits,
                      context_length, new_tokens, residual_length, group_size, median_ms, min_ms, timings_ms (the
                      cell's caches timed interleaved, order rotated per round), timing_spread (max/min of the timed
                      calls), ms_per_token, timing_contention {wall_s, cpu_s, threads, cpu_share, other_cores,
                      steal_cores, load_avg_1m, busy, reason},
                      latency_trusted (false: the machine was busy; the latency gate is then null, not used),
                      incremental_peak_bytes, peak_memory_method, cache_tokens, cache_bytes, cache_bytes_breakdown,
                      cache_counts (FP8: elements saturated / flushed), key_score_path? (what the cache's kvlab
                      attention ran: KIVI fused "int8 (avx2)" / "exact" / "exact (torch: ...)", the float C kernel;
                      absent for other caches), mean_nll, prefill_ms, prefill_shared, decode_ms,
                      and for non-baseline rows: dynamic_cache_bytes, cache_bytes_ratio, cache_bytes_saved, nll_delta,
                      nll_ratio, topk_overlap, latency_ratio (median of same-round ratios), latency_ratio_min,
                      latency_ratio_max, latency_ratio_unpaired (median / median, for comparison),
                      incremental_peak_saved_bytes, incremental_peak_reduction_ratio, decode_latency_ratio,
                      greedy_exact_match, token_agreement_rate, first_divergence_index, gates {...: bool}, eligible,
                      kl_mean, kl_p99, kl_max, kl_positions (nats; KL(float || candidate) per continuation position),
                      exact_twin? (an int8 twin beside its exact twin, kvlab.eval.twins.twin_entry: {twin, kl_mean,
                      kl_p99, kl_max, kl_positions (KL(twin || int8)), key_score_path, exact_key_score_path,
                      own_kl_mean, int8_kl_mean, share_of_own_kl, target_share, met, note?}),
                      and where the probes ran (kvlab.eval.longctx):
                      recall {accuracy, mean_nll, scored_tokens, distances [{distance_tokens, rows, scored_tokens,
                      accuracy, mean_nll, accuracy_drop?}]}, recall_accuracy, recall_nll, recall_drop,
                      recall_nll_delta, passkey {accuracy, correct, trials, ci95, depths [{depth, trials, correct,
                      accuracy, ci95 [low, high], accuracy_drop?}]}, passkey_accuracy, passkey_drop,
                      long_context_ms}]
    failures        [kvlab.eval.records.Failure.to_json(): {matrix?, candidate, context_length, residual_length, stage,
                     type, message, traceback_tail?}]; a failure of the run
                     itself (the model load, an interrupt) has candidate, context and matrix null or absent; an
                     interrupt (status stopped) says "interrupted during <what>" / "terminated by signal 15 during ..."
    elapsed_s       seconds of measurement of the last session (also of a stopped one); a resumed run's whole time
                     adds provenance.resumed[].earlier_elapsed_s
    summary         {memory_reduction_onset_context, eligible_crossover_context, selected_candidate, decision,
                      decision_gates (the gates the selected row was judged on), latency_trusted,
                      latency_warning (None, or why the timings are not to be trusted), long_context_warning (None,
                      or where the float cache itself does not recall/retrieve), long_context_not_measured
                      (None, or which probes did not fit which context: their gates do not apply there), eviction_warning
                      (None, or why the selected evicting cache was not tested: its budget held the prompt),
                      dtype_warning (None, or the model dtype was emulated on this CPU: provenance.hardware.
                      matmul_time_ratio_vs_float32 above 2), positions_warning (None, or which capacity contexts
                      passed provenance.model.max_position_embeddings: the decision judged untrained positions), ...}
"""

from __future__ import annotations

import json
import math

SCHEMA_VERSION = "kvlab.eval/1"
# stopped: Ctrl-C or SIGTERM (kvlab.eval.records.stop_run); resumable, as failed and a killed run's running are
STATUSES = ("planned", "dry_run", "running", "complete", "partial", "failed", "stopped")
MATRICES = ("capacity", "window")
# the top-level fields every kvlab eval result holds (a missing one is a problem of the file)
REQUIRED_FIELDS = (
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
# every number checked is finite (NaN and Infinity read as numbers, then print as "nan ✓" / "inf ✓"):
# the kind of each one the renderers read, required first, then those that may be null (not measured)
_PAIRED = ("cache_bytes_ratio", "latency_ratio", "nll_delta", "topk_overlap", "eligible")
_GATES = ("max_nll_delta", "min_topk_overlap", "max_latency_ratio")  # every result has these three
_LONG_GATES = ("max_recall_drop", "max_passkey_drop", "max_kl_mean")  # absent in files older than the probes
_ROW_NUMBERS = {
    "context_length": "int >= 1",
    "median_ms": "number >= 0",
    "ms_per_token": "number >= 0",
    "cache_bytes": "number >= 0",
}
_ROW_OPTIONAL_NUMBERS = {
    "new_tokens": "int >= 1",
    "residual_length": "int >= 0",
    "group_size": "int >= 1",
    "first_divergence_index": "int >= 0",
    "min_ms": "number >= 0",
    "mean_nll": "number",
    "cache_bytes_ratio": "number >= 0",
    "cache_bytes_saved": "number",  # negative when the candidate's cache is the larger
    "latency_ratio": "number >= 0",
    "nll_delta": "number",
    "nll_ratio": "number >= 0",
    "topk_overlap": "fraction",
    "token_agreement_rate": "fraction",
    "incremental_peak_bytes": "number >= 0",
    "recall_accuracy": "fraction",
    "passkey_accuracy": "fraction",
    "recall_nll": "number",
    "recall_nll_delta": "number",
    "recall_drop": "number",  # gated: NaN would pass no gate and fail none
    "passkey_drop": "number",
    "kl_mean": "number >= 0",
    "kl_p99": "number >= 0",
    "kl_max": "number >= 0",
    "long_context_ms": "number >= 0",
    "latency_ratio_min": "number >= 0",
    "latency_ratio_max": "number >= 0",
    "latency_ratio_unpaired": "number >= 0",
    "timing_spread": "number >= 0",  # the report compares it with UNSTABLE_TIMING_SPREAD
}
_FP8_COUNTS = ("key_saturated", "value_saturated", "key_underflow", "value_underflow", "elements")
_GATE_KINDS = {
    "max_nll_delta": "number >= 0",
    "min_topk_overlap": "fraction",
    "max_latency_ratio": "number > 0",
    "max_recall_drop": "fraction",
    "max_passkey_drop": "fraction",
    "max_kl_mean": "number >= 0",
}


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: object) -> str:
    """``value`` as it reads in the JSON file (``null``, ``"x"``, ``NaN``), shortened."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_finite(value: object) -> bool:
    return _is_number(value) and math.isfinite(value)


# kind -> (test, what the problem says it must be). Every number kind is finite: NaN and Infinity are numbers
# to Python's json module, and a NaN passes no `<=` gate and fails none.
_KINDS = {
    "object": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "string": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "a bool"),
    "int": (_is_int, "an int"),
    "int >= 0": (lambda v: _is_int(v) and v >= 0, "an int >= 0"),
    "int >= 1": (lambda v: _is_int(v) and v >= 1, "an int >= 1"),
    "number": (_is_finite, "a finite number"),
    "number >= 0": (lambda v: _is_finite(v) and v >= 0, "a finite number >= 0"),
    "number > 0": (lambda v: _is_finite(v) and v > 0, "a finite number > 0"),
    "fraction": (lambda v: _is_finite(v) and 0 <= v <= 1, "a fraction in [0, 1]"),
}


def _type_problem(where: str, value: object, kind: str) -> str | None:
    """``"<where>: must be <what>, got <value>"`` when ``value`` is not of ``kind``, else None. Kinds: the keys
    of :data:`_KINDS` (every number kind finite; ``fraction`` a number in [0, 1]), each also with
    ``" or null"``."""
    if kind.endswith(" or null"):
        if value is None:
            return None
        kind = kind[: -len(" or null")]
    test, what = _KINDS[kind]
    if test(value):
        return None
    return f"{where}: must be {what}, got {_show(value)}"


def _check(problems: list[str], where: str, value: object, kind: str) -> bool:
    """Append the problem (if any) to ``problems``; True when ``value`` is of ``kind``."""
    problem = _type_problem(where, value, kind)
    if problem:
        problems.append(problem)
    return problem is None


def _ci_problems(problems: list[str], where: str, ci: object) -> None:
    """A Wilson interval: null, or ``[low, high]`` with ``0 <= low <= high <= 1``."""
    if ci is None:
        return
    if not (isinstance(ci, list) and len(ci) == 2):
        problems.append(f"{where}: must be a [low, high] pair of fractions, got {_show(ci)}")
    elif _check(problems, f"{where}[0]", ci[0], "fraction") & _check(
        problems, f"{where}[1]", ci[1], "fraction"
    ):
        if ci[0] > ci[1]:
            problems.append(f"{where}: low {_show(ci[0])} is above high {_show(ci[1])}")


def _counts_problems(problems: list[str], where: str, block: dict) -> None:
    """``correct`` and ``trials`` of a passkey block or depth, where present: ``0 <= correct <= trials``,
    ``trials >= 1`` (the report prints ``correct/trials``)."""
    ok = True
    for key, kind in (("trials", "int >= 1"), ("correct", "int >= 0")):
        if key in block:
            ok &= _check(problems, f"{where}.{key}", block[key], kind)
    if ok and "trials" in block and "correct" in block and block["correct"] > block["trials"]:
        problems.append(
            f"{where}.correct: {_show(block['correct'])} is more than {where}.trials {_show(block['trials'])}"
        )


def _points_problems(where: str, block: object, points: str) -> list[str]:
    """The recall/passkey block of a row: an object whose ``points`` list holds one object per distance/depth
    (at least one depth: the passkey heatmap cannot draw none)."""
    problems: list[str] = []
    if not isinstance(block, dict) or not isinstance(block.get(points), list):
        return [f"{where}: must be an object with a {points!r} list"]
    if points == "depths":
        if not block["depths"]:
            problems.append(f"{where}.depths: must hold at least one depth, got []")
        _check(problems, f"{where}.accuracy", block.get("accuracy"), "fraction or null")
        _counts_problems(problems, where, block)
        _ci_problems(problems, f"{where}.ci95", block.get("ci95"))
    else:  # the derived checks subtract the float cache's mean NLL and pair distances by their tokens
        _check(problems, f"{where}.accuracy", block.get("accuracy"), "fraction or null")
        _check(problems, f"{where}.mean_nll", block.get("mean_nll"), "number or null")
    for j, p in enumerate(block[points]):
        at = f"{where}.{points}[{j}]"
        if not isinstance(p, dict) or "accuracy" not in p:
            problems.append(f"{at}: must be an object with 'accuracy'")
            continue
        _check(problems, f"{at}.accuracy", p["accuracy"], "fraction or null")
        if points == "distances":
            for key, kind in (("distance_tokens", "int >= 1"), ("accuracy_drop", "number"), ("mean_nll", "number")):
                _check(problems, f"{at}.{key}", p.get(key), f"{kind} or null")
        if points == "depths":  # the passkey tables and heatmap read depth, trials and correct of every depth
            problems += [f"{at}: lacks {key!r}" for key in ("depth", "trials", "correct") if key not in p]
            if "depth" in p:
                _check(problems, f"{at}.depth", p["depth"], "fraction")
            _counts_problems(problems, at, p)
            _ci_problems(problems, f"{at}.ci95", p.get("ci95"))
    return problems


def _row_problems(i: int, row: object) -> list[str]:
    """One row: the fields every row has, the paired fields of a candidate row, and the type of each field the
    text and HTML reports read."""
    if not isinstance(row, dict):
        return [f"rows[{i}]: must be an object, got {_show(row)}"]
    problems = [f"rows[{i}]: lacks {k!r}" for k in _ROW if k not in row]
    if row.get("matrix") not in MATRICES:
        problems.append(f"rows[{i}].matrix: {_show(row.get('matrix'))} not in {list(MATRICES)}")
    if not _check(problems, f"rows[{i}].candidate", row.get("candidate"), "string"):
        return problems
    if row["candidate"] != "dynamic":
        problems += [f"rows[{i}] ({row['candidate']}): lacks {k!r}" for k in _PAIRED if k not in row]
    for key, kind in _ROW_NUMBERS.items():
        if key in row:
            _check(problems, f"rows[{i}].{key}", row[key], kind)
    for key, kind in _ROW_OPTIONAL_NUMBERS.items():
        _check(problems, f"rows[{i}].{key}", row.get(key), f"{kind} or null")
    _check(problems, f"rows[{i}].eligible", row.get("eligible"), "bool or null")
    _check(problems, f"rows[{i}].latency_trusted", row.get("latency_trusted"), "bool or null")
    _check(problems, f"rows[{i}].timing_contention", row.get("timing_contention"), "object or null")
    counts = row.get("cache_counts")
    if _check(problems, f"rows[{i}].cache_counts", counts, "object or null") and counts:
        for key in _FP8_COUNTS:  # the report's FP8 range line sums them
            if key in counts:
                _check(problems, f"rows[{i}].cache_counts.{key}", counts[key], "int >= 0")
    if "gates" in row and _check(problems, f"rows[{i}].gates", row["gates"], "object"):
        for name, verdict in row["gates"].items():
            _check(problems, f"rows[{i}].gates.{name}", verdict, "bool or null")
    for key, points in (("recall", "distances"), ("passkey", "depths")):
        if row.get(key) is not None:
            problems += _points_problems(f"rows[{i}].{key}", row[key], points)
    return problems


def _summary_problems(summary: dict) -> list[str]:
    """The summary fields ``kvlab report`` prints."""
    problems = [
        f"summary: lacks {k!r}"
        for k in (
            "memory_reduction_onset_context",
            "eligible_crossover_context",
            "eligible_candidate_count",
            "decision",
        )
        if k not in summary
    ]
    for key, kind in (
        ("memory_reduction_onset_context", "int >= 1 or null"),
        ("eligible_crossover_context", "int >= 1 or null"),
        ("eligible_candidate_count", "int >= 0"),
        ("decision", "string"),
        ("latency_warning", "string or null"),
        ("latency_trusted", "bool or null"),
        ("decision_gates", "list or null"),
        ("long_context_warning", "string or null"),
        ("long_context_not_measured", "string or null"),
        ("eviction_warning", "string or null"),
        ("dtype_warning", "string or null"),
        ("positions_warning", "string or null"),
        ("failed_candidates", "list or null"),
    ):
        if key in summary:
            _check(problems, f"summary.{key}", summary[key], kind)
    failed = summary.get("failed_candidates")
    for j, f in enumerate(failed if isinstance(failed, list) else []):
        if _check(problems, f"summary.failed_candidates[{j}]", f, "object"):  # the report prints each field
            lacks = [k for k in ("candidate", "stage", "type", "message") if k not in f]
            problems += [f"summary.failed_candidates[{j}]: lacks {k!r}" for k in lacks]
    sel = summary.get("selected_candidate")
    if _check(problems, "summary.selected_candidate", sel, "object or null") and sel is not None:
        for key, kind in (("candidate", "string"), ("context_length", "int >= 1")):
            if key not in sel:
                problems.append(f"summary.selected_candidate: lacks {key!r}")
            else:
                _check(problems, f"summary.selected_candidate.{key}", sel[key], kind)
        for key in ("cache_bytes_ratio", "nll_delta", "topk_overlap", "latency_ratio"):
            kind = _ROW_OPTIONAL_NUMBERS[key]
            _check(problems, f"summary.selected_candidate.{key}", sel.get(key), f"{kind} or null")
    return problems


def _decision_problems(result: dict) -> list[str]:
    """The summary's decision against the capacity rows it was made from (:func:`kvlab.eval.decision.decide`): one
    of the decisions it can make (``tune_cache_policy``, ``accept <candidate> at context <n>``), an accepted row
    that is in ``rows``, eligible, and the ``selected_candidate``; no eligible row left unchosen by
    ``tune_cache_policy`` (which a run with no capacity row at all writes too)."""
    import re

    from kvlab.eval.decision_words import NO_CANDIDATE

    summary, decision = result["summary"], result["summary"]["decision"]
    rows = [r for r in result["rows"] if r.get("matrix") == "capacity"]
    eligible = [r for r in rows if r.get("candidate") != "dynamic" and r.get("eligible") is True]
    sel = summary.get("selected_candidate") or {}
    accept = re.fullmatch(r"accept (.+) at context (\d+)", decision)
    if decision != NO_CANDIDATE and not accept:
        return [f"summary.decision: {_show(decision)} is not a decision kvlab eval makes ('{NO_CANDIDATE}' or "
                "'accept <candidate> at context <n>')"]
    if not accept:  # with no rows at all too: a run whose every cell failed writes tune_cache_policy itself
        if eligible or sel:
            return [f"summary.decision: {_show(decision)}, but a capacity row passed every gate"
                    f" ({_show(eligible[0]['candidate']) if eligible else 'summary.selected_candidate'})"]
        return []
    name, context = accept.group(1), int(accept.group(2))
    if not any(r["candidate"] == name and r["context_length"] == context for r in eligible):
        return [f"summary.decision: {_show(decision)}, but rows holds no eligible capacity row of {_show(name)} "
                f"at context {context}"]
    if (sel.get("candidate"), sel.get("context_length")) != (name, context):
        return [f"summary.selected_candidate: {_show(sel.get('candidate'))} at context "
                f"{_show(sel.get('context_length'))} is not the accepted {_show(name)} at context {context}"]
    return []


def _show_mark(value: object) -> str:
    return {True: "true", False: "false", None: "null"}.get(value, _show(value))  # as the file writes it


# a row's gate mark -> the threshold of the result's gates it is judged at (saves_memory: cache_bytes_saved > 0)
_THRESHOLD = {
    "nll_delta": "max_nll_delta",
    "topk_overlap": "min_topk_overlap",
    "latency_ratio": "max_latency_ratio",
    "recall_drop": "max_recall_drop",
    "passkey_drop": "max_passkey_drop",
    "kl_mean": "max_kl_mean",
}


def _judged_from(name: str, row: dict, gates: object) -> str:
    """The numbers the mark ``name`` of ``row`` is judged from, as a refusal names them (floats at 6 significant
    digits, more where the number and its threshold would read alike: :func:`kvlab.eval.schema_derived.shown_apart`)."""
    from kvlab.eval.schema_derived import shown_apart

    if name == "saves_memory":
        return f"cache_bytes_saved {_show(row.get('cache_bytes_saved'))} (saves memory when > 0)"
    value, threshold = row.get(name), getattr(gates, _THRESHOLD[name])
    if _is_number(value) and _is_number(threshold):
        value, threshold = shown_apart(value, threshold)
    else:
        value, threshold = _show(value), _show(threshold)
    words = f"{name} {value} and gates.{_THRESHOLD[name]} {threshold}"
    if name == "latency_ratio" and row.get("latency_trusted") is False:
        words += " (latency_trusted false: the gate is not used)"
    return words


def _row_mark_problems(i: int, row: dict, gates: object, stored: set[str]) -> list[str]:
    """One candidate row's stored marks (``gates.<name>``, ``eligible``) against the row's own numbers judged again
    at the result's ``gates`` (:func:`kvlab.eval.decision.apply_gates`, as :func:`kvlab.eval.rows.build_row`
    judged them: the latency gate null where ``latency_trusted`` is false); a mark whose threshold the file does
    not store (``stored``: an older file without the long-context gates) is not judged; ``eligible`` is judged from
    every gate the numbers give, stored or not. The first disagreement, naming the row, the field, its number and
    the threshold; none when every mark follows."""
    from kvlab.eval.decision import apply_gates

    at = f"rows[{i}] ({_show(row['candidate'])} at context {row.get('context_length')})"
    try:
        judged = apply_gates(row, gates)
    except ValueError:  # no latency_ratio / cache_bytes_saved: marks with no numbers behind them
        return [f"{at}.gates: marks with no latency_ratio and cache_bytes_saved to judge them again"]
    if row.get("latency_trusted") is False:  # a busy machine's timings: the gate was not used
        judged["latency_ratio"] = None
    judged = {n: v for n, v in judged.items() if n not in _THRESHOLD or _THRESHOLD[n] in stored}
    for name, mark in (row.get("gates") or {}).items():
        if name in _THRESHOLD and _THRESHOLD[name] not in stored:
            continue
        if name not in judged:
            return [f"{at}.gates.{name}: {_show_mark(mark)}, but the row has no {name} to judge"]
        if mark is not judged[name]:
            return [
                f"{at}.gates.{name}: {_show_mark(mark)} does not follow from the row's "
                f"{_judged_from(name, row, gates)} (judged again: {_show_mark(judged[name])})"
            ]
    eligible = all(v for v in judged.values() if v is not None)
    if row.get("eligible") is not eligible:
        failed = ", ".join(n for n, v in judged.items() if v is False)
        source = "its gates" if "gates" in row else "its numbers (the row has no gates object)"
        return [
            f"{at}.eligible: {_show_mark(row.get('eligible'))} does not follow from {source} (judged again: "
            f"{_show_mark(eligible)}{'; failed: ' + failed if failed else ''})"
        ]
    return []


def _marks_problems(result: dict) -> list[str]:
    """Each candidate row's stored pass/fail marks (``gates``, ``eligible``) judged again from its numbers at the
    result's ``gates`` (:func:`_row_mark_problems`): a hand-edited or stale mark is refused, not printed as a ✓, as
    a stored decision its rows do not support is (:func:`_decision_problems`). A row whose ``gates`` object is
    missing has its ``eligible`` judged from its numbers all the same (kvlab.eval.rows.build_row writes both)."""
    from kvlab.eval.config import Gates

    stored = {k for k in (*_GATES, *_LONG_GATES) if k in result["gates"]}
    gates = Gates(**{k: result["gates"][k] for k in stored})
    problems: list[str] = []
    for i, row in enumerate(result["rows"]):
        # a row without a gates object is judged too: its eligible mark follows from its numbers or is refused
        if row["candidate"] != "dynamic" and (isinstance(row.get("gates"), dict) or row.get("eligible") is not None):
            problems += _row_mark_problems(i, row, gates, stored)
    return problems


def _gates_problems(gates: dict) -> list[str]:
    problems = [f"gates: lacks {k!r}" for k in _GATES if k not in gates]
    if any(k in gates for k in _LONG_GATES):
        problems += [
            f"gates: lacks {k!r} (the long-context gates come together)"
            for k in _LONG_GATES
            if k not in gates
        ]
    for key in (*_GATES, *_LONG_GATES):
        if key in gates:
            _check(problems, f"gates.{key}", gates[key], _GATE_KINDS[key])
    return problems


def _prefer_problems(settings: object) -> list[str]:
    """``settings.prefer``, the rule the decision selected by (``kvlab eval --prefer``): one of
    :data:`kvlab.eval.config.PREFERENCES`, or absent (a file written before it: the memory rule)."""
    from kvlab.eval.config import PREFERENCES

    if not isinstance(settings, dict) or "prefer" not in settings or settings["prefer"] in PREFERENCES:
        return []
    return [f"settings.prefer: {_show(settings['prefer'])} not in {json.dumps(list(PREFERENCES))}"]


def validate_result(result: object) -> list[str]:
    """Problems found in a result object (empty list = valid), each ``"<where>: <what>"`` naming the field's
    path and its value. Never raises on bad content: every field ``kvlab report`` (text or HTML) and ``kvlab
    figures --result`` read is type-checked here first; every number must be finite (no NaN, no Infinity), and
    fractions, counts, byte counts, times and context lengths must be in range."""
    if not isinstance(result, dict):
        return [f"result must be a JSON object, got {type(result).__name__}"]
    version = result.get("schema_version")
    # another kind of file (kvlab bench's, kvlab inspect --json): say so, not its missing fields
    if version is not None and version != SCHEMA_VERSION:
        return [f"schema_version {version!r} is not {SCHEMA_VERSION!r} (not a kvlab eval result)"]
    problems = [f"missing field {k!r}" for k in REQUIRED_FIELDS if k not in result]
    if version is None and len(problems) > len(REQUIRED_FIELDS) // 2:
        keys = ", ".join(sorted(map(str, result))[:6]) or "none"
        return [
            f"no schema_version and {len(problems)} of the {len(REQUIRED_FIELDS)} fields of a {SCHEMA_VERSION!r} result "
            f"missing (not a kvlab eval result; its keys: {keys})"
        ]
    if problems:
        return problems
    if result["status"] not in STATUSES:
        problems.append(f"status: {_show(result['status'])} not in {list(STATUSES)}")
    for key, kind in (
        ("settings", "object"),
        ("provenance", "object"),
        ("plan", "list"),
        ("summary", "object or null"),
    ):
        _check(problems, key, result[key], kind)
    _check(problems, "elapsed_s", result.get("elapsed_s"), "number >= 0 or null")
    problems += _prefer_problems(result["settings"])
    _check(problems, "command", result.get("command"), "list or null")  # the report looks for --quick in it
    if isinstance(result["provenance"], dict):
        for key in ("model", "software", "hardware"):
            if key in result["provenance"]:
                _check(problems, f"provenance.{key}", result["provenance"][key], "object")
    if _check(problems, "gates", result["gates"], "object"):
        problems += _gates_problems(result["gates"])
    if _check(problems, "candidates", result["candidates"], "list"):
        for i, c in enumerate(result["candidates"]):
            if not _check(problems, f"candidates[{i}]", c, "object"):
                continue
            if "name" not in c:
                problems.append(f"candidates[{i}]: lacks 'name'")
            _check(problems, f"candidates[{i}].available", c.get("available", True), "bool")
            if c.get("available", True) is False and "skip_reason" not in c:
                problems.append(f"candidates[{i}]: unavailable but lacks 'skip_reason'")
    if not _check(problems, "rows", result["rows"], "list"):
        return problems
    row_problems = [p for i, row in enumerate(result["rows"]) for p in _row_problems(i, row)]
    problems += row_problems
    if result["status"] in ("complete", "partial") and not isinstance(result.get("summary"), dict):
        problems.append("summary: a finished result needs a summary object")
    if isinstance(result["summary"], dict):
        # the decision is checked against the rows once they are sound (a row that is not an object: AttributeError)
        problems += _summary_problems(result["summary"]) or ([] if row_problems else _decision_problems(result))
    if _check(problems, "failures", result["failures"], "list"):
        for i, f in enumerate(result["failures"]):
            if not _check(problems, f"failures[{i}]", f, "object"):
                continue
            problems += [
                f"failures[{i}]: lacks {k!r}" for k in ("candidate", "stage", "type", "message") if k not in f
            ]
    if problems:
        return problems
    from kvlab.eval.schema_derived import derived_problems, summary_derived_problems

    # the rows' derived fields, their marks, then the summary's counts, once every field they need is sound
    return derived_problems(result) or _marks_problems(result) or summary_derived_problems(result)
