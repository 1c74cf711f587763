"""The decision of ``kvlab eval``: gates, selection and the warnings shown beside it — pure functions on result
rows (the JSON form of :class:`kvlab.eval.records.Row`, as written or read back from a file), no torch.

A candidate row is judged against the acceptance gates (:func:`apply_gates`, :func:`long_context_gates`); among the
capacity rows that pass every gate and save memory, :func:`decide` selects the one saving the most cache bytes, or
with ``--prefer latency`` the one with the lowest latency ratio at that row's context (docs/EVAL.md);
:func:`summarize` adds the onset and crossover contexts and every warning a reader needs next to the decision (busy
machine, weak baseline, probes that did not fit, an evicting cache that dropped nothing, an
emulated dtype, candidates that failed everywhere).
"""

from __future__ import annotations

from kvlab.caches.registry import REGISTRY
from kvlab.eval.config import LATER_SETTINGS, PREFERENCES, Gates
from kvlab.eval.twins import integer_path_summary
from kvlab.runtime.dtype_speed import SLOW_DTYPE_RATIO

# bytes saved within this fraction of the most an eligible row saves count as a tie (decide)
BYTE_TIE = 0.01


def apply_gates(row: dict, gates: Gates) -> dict[str, bool]:
    """Judge one candidate row against the acceptance gates (docs/EVAL.md).

    A gate passes on its boundary: ``nll_delta <= max_nll_delta`` (nats per token, candidate minus float cache),
    ``topk_overlap >= min_topk_overlap`` (fraction in [0, 1]), ``latency_ratio <= max_latency_ratio`` (median
    ``generate()`` ms, candidate / float cache); ``saves_memory`` needs ``cache_bytes_saved > 0`` (bytes, float
    cache minus candidate). A quality metric that is missing or ``None`` (the quality stage did not run) or NaN
    fails its gate. A row is eligible for the decision when every gate passes.

    Args:
        row: a paired row of :func:`kvlab.eval.runner.run_eval` (or a hand-made dict with the same keys): ``latency_ratio`` and
            ``cache_bytes_saved`` required, ``nll_delta`` and ``topk_overlap`` optional.
        gates: the thresholds.

    Returns:
        ``{"nll_delta": bool, "topk_overlap": bool, "latency_ratio": bool, "saves_memory": bool}``, in that order,
        followed by the :func:`long_context_gates` that apply to the row.

    Raises:
        TypeError: ``gates`` is not a :class:`~kvlab.eval.config.Gates`.
        ValueError: ``row`` lacks ``latency_ratio`` or ``cache_bytes_saved`` (the baseline row has neither).
    """
    if not isinstance(gates, Gates):
        raise TypeError(f"`gates` must be a kvlab.eval.config.Gates, got {type(gates).__name__}")
    missing = [k for k in ("latency_ratio", "cache_bytes_saved") if row.get(k) is None]
    if missing:
        raise ValueError(
            f"row of candidate {row.get('candidate')!r} at context {row.get('context_length')!r} has no {missing}: "
            f"only a row paired with the float-cache baseline can be gated"
        )
    nll, topk = row.get("nll_delta"), row.get("topk_overlap")
    verdicts = {
        "nll_delta": nll is not None and nll <= gates.max_nll_delta,
        "topk_overlap": topk is not None and topk >= gates.min_topk_overlap,
        "latency_ratio": row["latency_ratio"] <= gates.max_latency_ratio,
        "saves_memory": row["cache_bytes_saved"] > 0,
    }
    verdicts.update(long_context_gates(row, gates))
    return verdicts


# long-context gates: (gate name = row key, threshold attribute of Gates); each is an upper bound
LONG_CONTEXT_GATES = (
    ("recall_drop", "max_recall_drop"),
    ("passkey_drop", "max_passkey_drop"),
    ("kl_mean", "max_kl_mean"),
)


def long_context_gates(row: dict, gates: Gates) -> dict[str, bool]:
    """The long-context gates of one paired row: ``recall_drop <= max_recall_drop`` (copy accuracy lost at the
    worst distance, fraction), ``passkey_drop <= max_passkey_drop`` (passkey accuracy lost, mean over depths,
    fraction) and ``kl_mean <= max_kl_mean`` (nats per position). A gate applies only when its key is in the row:
    a context too short for the recall span, one without the passkey grid, or a row whose quality stage did not
    run has no key and no verdict. A key that is present but None or NaN fails.

    Args:
        row: a paired row (or a hand-made dict) with any of ``recall_drop``, ``passkey_drop``, ``kl_mean``.
        gates: the thresholds.

    Returns:
        ``{gate: passed}`` for each gate that applies, in :data:`LONG_CONTEXT_GATES` order.

    Raises:
        TypeError: ``gates`` is not a :class:`~kvlab.eval.config.Gates`.
    """
    if not isinstance(gates, Gates):
        raise TypeError(f"`gates` must be a kvlab.eval.config.Gates, got {type(gates).__name__}")
    out = {}
    for key, attr in LONG_CONTEXT_GATES:
        if key in row:
            value = row[key]
            out[key] = value is not None and value <= getattr(gates, attr)
    return out


def decide(rows: list[dict], prefer: str = "memory") -> tuple[dict | None, str]:
    """The decision over gated candidate rows (docs/EVAL.md).

    ``prefer="memory"`` (``kvlab eval --prefer memory``, the default): among the rows with ``eligible`` true
    (every gate of :func:`apply_gates` passed), select the one that saves the most cache bytes. Rows saving within
    :data:`BYTE_TIE` (1 %) of the most are a tie (``fp8-e5m2-unscaled`` saves an FP8 cache's 64 B of scales more
    than ``fp8-e4m3`` and once won on them with 14x its KL); a tie goes to the lower mean KL to the float cache
    (``kl_mean``, nats: caches of the same size, e.g. ``fp8-e4m3`` and ``fp8-e4m3-hadamard``, differ in quality,
    and one timed round's latency noise once picked the one 4.6x further from the float model), then to the lower
    latency ratio, then to the more bytes saved, then to the earlier row.

    ``prefer="latency"`` (for a server that weighs time per output token over memory): the context is the one the
    memory rule selects (the selected row's ``context_length``); among the eligible rows at that context, the
    lowest latency ratio (median ``generate()`` time, candidate / float cache), a tie going to the more bytes
    saved, then to the earlier row.

    Args:
        rows: candidate rows (the baseline and window-matrix rows are the caller's to leave out), each with
            ``eligible``; eligible rows also need ``cache_bytes_saved`` (bytes), ``latency_ratio``, ``candidate``
            and ``context_length`` (tokens).
        prefer: one of :data:`kvlab.eval.config.PREFERENCES` (a result's :func:`preference`).

    Returns:
        ``(selected_row, decision)``: ``(row, "accept <candidate> at context <context_length>")``, or
        ``(None, "tune_cache_policy")`` when no row is eligible.

    Raises:
        ValueError: a row has no ``eligible`` field (it was never gated), or ``prefer`` is not a preference.
    """
    if prefer not in PREFERENCES:
        raise ValueError(f"`prefer` must be one of {list(PREFERENCES)}, got {prefer!r}")
    ungated = [i for i, r in enumerate(rows) if "eligible" not in r]
    if ungated:
        raise ValueError(
            f"rows at positions {ungated} have no 'eligible' field: gate them with apply_gates first"
        )
    eligible = [r for r in rows if r["eligible"]]
    if not eligible:
        return None, "tune_cache_policy"
    most = max(r["cache_bytes_saved"] for r in eligible)
    tied = [r for r in eligible if r["cache_bytes_saved"] >= most - BYTE_TIE * abs(most)]
    selected = max(tied, key=lambda r: (-_kl_or_inf(r), -r["latency_ratio"], r["cache_bytes_saved"]))
    if prefer == "latency":  # min keeps the earlier of rows equal in latency and bytes
        here = [r for r in eligible if r["context_length"] == selected["context_length"]]
        selected = min(here, key=lambda r: (r["latency_ratio"], -r["cache_bytes_saved"]))
    return selected, f"accept {selected['candidate']} at context {selected['context_length']}"


def preference(result: dict) -> str:
    """The selection rule a result was decided under: its ``settings.prefer`` (``kvlab eval --prefer``), or
    ``"memory"`` where the file has none (written before the setting: the rule it ran under).

    Raises:
        ValueError: ``settings.prefer`` is not one of :data:`kvlab.eval.config.PREFERENCES` (naming it).
    """
    settings = result.get("settings") if isinstance(result, dict) else None
    prefer = (settings if isinstance(settings, dict) else {}).get("prefer", LATER_SETTINGS["prefer"])
    if prefer not in PREFERENCES:
        raise ValueError(f"settings.prefer must be one of {list(PREFERENCES)}, got {prefer!r}")
    return prefer


def _kl_or_inf(row: dict) -> float:
    """``row["kl_mean"]``, or +inf where it was not measured (a row with a KL wins a byte tie over one without)."""
    kl = row.get("kl_mean")
    return kl if isinstance(kl, (int, float)) and kl == kl else float("inf")


# the fields of the selected row that the summary carries
SELECTED_KEYS = (
    "candidate",
    "context_length",
    "residual_length",
    "group_size",
    "cache_bytes",
    "cache_bytes_ratio",
    "cache_bytes_saved",
    "nll_delta",
    "nll_ratio",
    "topk_overlap",
    "latency_ratio",
    "incremental_peak_saved_bytes",
)


def summarize(result: dict) -> dict:
    """Onset, eligible crossover, selected candidate and decision (docs/EVAL.md), from capacity rows, under the
    result's selection rule (:func:`preference`: ``settings.prefer``, memory when absent).

    Only capacity-matrix rows of non-baseline candidates count; the residual-window matrix is a diagnostic.

    Args:
        result: a result dict with ``rows`` (each with ``matrix``, ``candidate``, ``context_length`` in tokens,
            ``cache_bytes_saved`` in bytes and, for candidates, ``eligible``, ``latency_ratio`` and the
            :data:`SELECTED_KEYS`).

    Returns:
        ``memory_reduction_onset_context`` (smallest context whose row saves bytes, or None),
        ``eligible_crossover_context`` (smallest context with an eligible row, or None),
        ``eligible_candidate_count`` (eligible capacity rows), ``per_candidate`` (the same per candidate, with
        ``eligible_contexts``), ``selected_candidate`` (the :data:`SELECTED_KEYS` of :func:`decide`'s row, or None),
        ``decision``, ``decision_gates`` (the gates the selected row was judged on: the latency gate is left out
        where the machine was busy while timing), ``latency_trusted`` (no capacity cell was timed on a busy
        machine) and the warnings shown next to the decision (``latency_warning``, ``long_context_warning``,
        ``long_context_not_measured``, ``eviction_warning``, ``dtype_warning``, ``positions_warning``; each None
        when it does not apply),
        and ``failed_candidates`` (:func:`failed_everywhere`: requested candidates the decision could not judge);
        in a run with an int8 twin (``kivi-4:dot=int8`` beside ``kivi-4``) also ``integer_path``
        (:func:`kvlab.eval.twins.integer_path_summary`), absent otherwise.

    Raises:
        ValueError: from :func:`decide`, a capacity candidate row that was never gated; from :func:`preference`, an
            unknown ``settings.prefer``.
    """
    rows = [r for r in result["rows"] if r["matrix"] == "capacity" and r["candidate"] != "dynamic"]
    rows.sort(key=lambda r: r["context_length"])
    selected, decision = decide(rows, preference(result))
    per_candidate = {}
    for name in sorted({r["candidate"] for r in rows}):
        mine = [r for r in rows if r["candidate"] == name]
        per_candidate[name] = {
            "memory_reduction_onset_context": next(
                (r["context_length"] for r in mine if r["cache_bytes_saved"] > 0), None
            ),
            "eligible_crossover_context": next((r["context_length"] for r in mine if r["eligible"]), None),
            "eligible_contexts": [r["context_length"] for r in mine if r["eligible"]],
        }
    out = {
        "memory_reduction_onset_context": next(
            (r["context_length"] for r in rows if r["cache_bytes_saved"] > 0), None
        ),
        "eligible_crossover_context": next((r["context_length"] for r in rows if r["eligible"]), None),
        "eligible_candidate_count": sum(1 for r in rows if r["eligible"]),
        "per_candidate": per_candidate,
        "selected_candidate": {k: selected.get(k) for k in SELECTED_KEYS} if selected else None,
        "decision": decision,
        "decision_gates": None
        if selected is None
        else [k for k, v in selected["gates"].items() if v is not None],
        "latency_trusted": all(r.get("latency_trusted", True) for r in rows),
        "latency_warning": latency_warning(
            result["rows"], (result.get("gates") or {}).get("max_latency_ratio")
        ),
        "long_context_warning": long_context_warning(result["rows"]),
        "long_context_not_measured": not_measured_warning(result),
        "eviction_warning": eviction_warning(selected),
        "dtype_warning": dtype_warning(result),
        "positions_warning": positions_warning(result),
        "failed_candidates": failed_everywhere(result),
    }
    integer = integer_path_summary(result["rows"])
    if integer is not None:  # a run with an int8 twin: its accuracy against the exact twin
        out["integer_path"] = integer
    return out


# timed calls of one cell differing by more than this (max / min) make its latency, and a decision resting on the
# latency gate, untrustworthy: the machine was busy with something else
UNSTABLE_TIMING_SPREAD = 1.5


NEAR_GATE = (
    0.10  # a latency ratio this close (relative) to its gate, timed once, can land on either side of it
)


def latency_warning(rows: list[dict], max_latency_ratio: float | None = None) -> str | None:
    """A warning when the machine was busy while capacity cells were timed (``latency_trusted`` false: their
    latency gate was not used), when a cell's timed calls disagree by more than :data:`UNSTABLE_TIMING_SPREAD` in
    either matrix (:func:`spread_warning`), or
    when a candidate cell timed only once (``--repeat 1``, ``--quick``'s default) has a latency ratio within
    :data:`NEAR_GATE` of ``max_latency_ratio`` (its verdict, and so the decision, can change between runs); else
    None."""
    cap = [r for r in rows if r["matrix"] == "capacity"]
    parts = []
    near = [
        r
        for r in cap
        if max_latency_ratio
        and r["candidate"] != "dynamic"
        and len(r.get("timings_ms") or ()) == 1
        and r.get("latency_ratio") is not None
        and (r.get("gates") or {}).get("latency_ratio") is not None
        and abs(r["latency_ratio"] / max_latency_ratio - 1) <= NEAR_GATE
    ]
    if near:
        cells = ", ".join(
            f"{r['candidate']} at {r['context_length']} ({r['latency_ratio']:.2f}x)" for r in near
        )
        parts.append(
            f"timed once (--repeat 1), {cells} {'is' if len(near) == 1 else 'are'} within {NEAR_GATE:.0%} of the "
            f"latency gate ({max_latency_ratio:g}x): that verdict, and the decision, can change from run to run; "
            f"use --repeat 3 or more to decide on latency"
        )
    busy = sorted({r["context_length"] for r in cap if r.get("latency_trusted") is False})
    if busy:
        reason = next(
            (r["timing_contention"] or {}).get("reason")
            for r in cap
            if r.get("latency_trusted") is False and r.get("timing_contention")
        )
        parts.append(
            f"the machine was busy while timing context(s) {', '.join(map(str, busy))} ({reason}): latency not "
            f"trusted there, the latency gate was not used and the decision rests on the memory and quality gates "
            f"(the ratios shown are paired per round, so still indicative)"
        )
    noisy = spread_warning(rows)
    if noisy:
        parts.append(noisy)
    return "; ".join(parts) or None


# the matrices whose timed cells the spread check covers, as the warning names them
SPREAD_MATRICES = {"capacity": "capacity", "window": "residual-window"}


def spread_warning(rows: list[dict]) -> str | None:
    """The cells of each matrix (capacity and residual-window) whose timed calls differ by more than
    :data:`UNSTABLE_TIMING_SPREAD` (``timing_spread``, max / min), counted per matrix with its worst cell, or None:
    ``2 of 12 capacity cells (worst: ...) and 3 of 4 residual-window cells (worst: kivi-4 at 1024, R=32, 2.31x) had
    timed calls differing by more than 1.5x: ...``. The tables mark those cells' ms/tok with ``~``."""
    clauses = []
    for matrix, words in SPREAD_MATRICES.items():
        timed = [r for r in rows if r["matrix"] == matrix and r.get("timing_spread") is not None]
        bad = [r for r in timed if r["timing_spread"] > UNSTABLE_TIMING_SPREAD]
        if bad:
            worst = max(bad, key=lambda r: r["timing_spread"])
            window = worst.get("residual_length") if matrix == "window" else None
            where = f"{worst['candidate']} at {worst['context_length']}" + (f", R={window}" if window else "")
            clauses.append(f"{len(bad)} of {len(timed)} {words} cells (worst: {where}, {worst['timing_spread']:.2f}x)")
    if not clauses:
        return None
    return (
        f"{' and '.join(clauses)} had timed calls differing by more than {UNSTABLE_TIMING_SPREAD}x (ms/tok marked "
        "~): their medians and latency ratios are noisy, ✓ or ✗ alike; rerun on a quiet machine or with a larger "
        "--repeat"
    )


def failed_everywhere(result: dict) -> list[dict]:
    """The candidates that ran (not skipped as unavailable) but failed in every capacity cell, so that the decision,
    which reads capacity rows only, left them out: ``[{"candidate", "stage", "type", "message"}]``, the first
    failure of each. A run with any is not a clean result (``kvlab eval`` exits 1)."""
    measured = {r["candidate"] for r in result.get("rows", []) if r.get("matrix") == "capacity"}
    out = []
    for cand in result.get("candidates", []):
        name = cand.get("name")
        if name in measured or not cand.get("available", True):
            continue
        first = next((f for f in result.get("failures", []) if f.get("candidate") == name), None)
        if first is not None:
            out.append({"candidate": name, **{k: first.get(k) for k in ("stage", "type", "message")}})
    return out


def dtype_warning(result: dict) -> str | None:
    """A warning when the run's model dtype was emulated on its CPU: ``provenance.hardware.
    matmul_time_ratio_vs_float32`` (measured at the start of the run by :func:`kvlab.runtime.dtypes.
    matmul_time_ratio`) above :data:`SLOW_DTYPE_RATIO`; else None (float32, a GPU, a native bf16 CPU, or an older
    result without the measurement).

    With ``provenance.hardware.cpu_matmul`` ``"float32"`` (``--cpu-matmul auto``'s choice there) it says the Linear
    layers ran as float32 GEMMs on the dtype's values; otherwise (``native``, or an older result) that prefill and
    the long-context probes set the run time and latencies describe torch's emulation of the dtype.
    """
    provenance = result.get("provenance") or {}
    hardware = provenance.get("hardware") or {}
    ratio = hardware.get("matmul_time_ratio_vs_float32")
    if ratio is None or ratio <= SLOW_DTYPE_RATIO:
        return None
    dtype = (
        (provenance.get("model") or {}).get("dtype") or (result.get("settings") or {}).get("dtype") or "model"
    )
    capability = hardware.get("cpu_capability")
    where = f" (torch's CPU capability: {capability})" if capability else ""
    head = (
        f"on this CPU a {dtype} matmul took {ratio:.1f}x the time of a float32 one{where}: it has no native {dtype} "
        f"matrix instructions"
    )
    if hardware.get("cpu_matmul") == "float32":
        attention = (
            " and ran its attention (SDPA) in float32"
            if hardware.get("float32_attention", True)
            else f" (its attention stayed {dtype}: {hardware.get('float32_attention_note')})"
        )
        return (
            f"{head}, so this run multiplied the model's Linear layers as float32 GEMMs on {dtype} values{attention}, "
            f"outputs rounded to {dtype} (--cpu-matmul native: torch's own {dtype} kernels); latencies describe that "
            f"path, not a CPU that serves {dtype} natively"
        )
    if hardware.get("cpu_matmul_note"):  # auto kept the native kernels: the float32 copies would not fit
        return (
            f"{head}, so prefill and the long-context probes set the run time, and latencies describe emulated "
            f"{dtype}; {hardware['cpu_matmul_note']}"
        )
    return (
        f"{head}, so prefill and the long-context probes set the run time, and latencies describe emulated "
        f"{dtype}; --cpu-matmul auto (float32 GEMMs on {dtype} values) or --dtype float32 runs faster here (a "
        f"float32 model's float cache holds 4-byte elements, so the quantized caches' byte savings read twice as "
        f"large)"
    )


def positions_warning(result: dict) -> str | None:
    """The caveat of a decision made on capacity rows past the model's trained positions: a row whose prompt + new
    tokens (``context_length + new_tokens``) exceed ``provenance.model.max_position_embeddings``
    (:func:`kvlab.eval.model_info.describe_model`) measured a RoPE model extrapolating, where its quality (and a
    quantized cache's effect on it) is not what a served model within its limit shows. The rows stay in the result
    and in the decision; this says which contexts they are. None when every capacity row is within the limit, or
    the result records no limit (a model whose config states none, a result written before the field)."""
    limit = ((result.get("provenance") or {}).get("model") or {}).get("max_position_embeddings")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        return None
    over = sorted(
        {
            r["context_length"]
            for r in result.get("rows") or []
            if r.get("matrix") == "capacity" and r["context_length"] + (r.get("new_tokens") or 0) > limit
        }
    )
    if not over:
        return None
    return (
        f"contexts {', '.join(f'{c:,}' for c in over)} (prompt + new tokens) pass the model's "
        f"max_position_embeddings ({limit:,}): the decision judged rows at positions the model was not trained on; "
        f"for a served model, judge contexts within {limit:,} tokens"
    )


def not_measured_warning(result: dict) -> str | None:
    """A warning naming the probes that did not fit a context (``provenance.long_context.not_measured``): their
    gates do not apply to that context's rows, so a decision there rests on the other gates only; else None."""
    missing = ((result.get("provenance") or {}).get("long_context") or {}).get("not_measured") or []
    if not missing:
        return None
    where = ", ".join(f"{m['probe']} at {m['context_length']}" for m in missing)
    return (
        f"long-context probes not measured ({where}): their gates do not apply to those rows; the first reason: "
        f"{missing[0]['reason']}"
    )


# an evicting cache holding at least this share of the float cache's bytes dropped (almost) nothing in that cell
EVICTION_UNTESTED_RATIO = 0.9


def eviction_warning(selected: dict | None) -> str | None:
    """A warning when the selected row is an evicting cache (registry ``evicts``: sink, SnapKV, TOVA) that kept at
    least :data:`EVICTION_UNTESTED_RATIO` of the float cache's bytes (``cache_bytes_ratio``) in its cell: its budget
    held (almost) the whole prompt there, so the gates saw nothing of what it drops at longer prompts; else None.

    Args:
        selected: the capacity row :func:`decide` selected (``candidate``, ``family``, ``context_length`` in
            tokens, ``cache_bytes_ratio``), or None.
    """
    if selected is None:
        return None
    entry = REGISTRY.get(selected.get("family", ""))
    ratio = selected.get("cache_bytes_ratio")
    if entry is None or not entry.evicts or ratio is None or ratio < EVICTION_UNTESTED_RATIO:
        return None
    return (
        f"the selected {selected['candidate']} is an evicting cache that kept {ratio:.2f}x the float cache's bytes "
        f"at {selected['context_length']} tokens: its budget held (almost) the whole prompt, so the gates did not "
        f"see what it drops; judge it at a context longer than its budget (--contexts)"
    )


# below this accuracy of the float cache itself, the recall / passkey gates cannot tell caches apart
MIN_BASELINE_ACCURACY = 0.5


def long_context_warning(rows: list[dict]) -> str | None:
    """A warning when the float cache's own recall or passkey accuracy is below :data:`MIN_BASELINE_ACCURACY` in
    a capacity cell (the model does not use its context there, so a cache that loses it costs nothing measurable
    and the recall/passkey gates pass vacuously), else None."""
    base = [r for r in rows if r["matrix"] == "capacity" and r["candidate"] == "dynamic"]
    weak = [
        f"{key.split('_')[0]} {r[key]:.2f} at {r['context_length']}"
        for r in base
        for key in ("recall_accuracy", "passkey_accuracy")
        if r.get(key) is not None and r[key] < MIN_BASELINE_ACCURACY
    ]
    if not weak:
        return None
    return (
        f"the float cache itself scores {', '.join(weak)} (below {MIN_BASELINE_ACCURACY}): this model does not use "
        f"its context there, so the recall/passkey gates cannot reject a cache that loses distant tokens"
    )
