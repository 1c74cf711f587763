"""What the reports (the text summary and the HTML page) say around the decision, in words: the gates' names and
flags, the selection rule, advice when no candidate passes, the FP8 range lines and the bundled-model note. Each
is built from the result dict alone; no torch, no rich."""

from __future__ import annotations

from kvlab.eval.decision import BYTE_TIE, preference

# why a low greedy agreement (token_agreement_rate, first_divergence_index) is expected: the text legend's agree part
# and the HTML tables' note
GREEDY_AGREEMENT_WHY = (
    "once one token differs the two greedy continuations go apart, so a low value beside good top-k and KL is "
    "expected: the gates use the teacher-forced NLL, top-k and KL"
)


def decision_rule(summary: dict, prefer: str = "memory") -> str | None:
    """How :func:`kvlab.eval.decision.decide` chose among several eligible rows under the rule ``prefer``
    (:func:`kvlab.eval.decision.preference` of the result), in words: None for one eligible row or none, and with
    ``"latency"`` for one eligible row at the selected context (its rows counted from the summary's
    ``per_candidate`` ``eligible_contexts``)."""
    n = summary.get("eligible_candidate_count", 0) if isinstance(summary, dict) else 0
    sel = summary.get("selected_candidate") if isinstance(summary, dict) else None
    if n <= 1 or not sel:
        return None
    if prefer == "latency":
        context = sel.get("context_length") if isinstance(sel, dict) else None
        here = sum(
            1 for c in (summary.get("per_candidate") or {}).values()
            if isinstance(c, dict) and context in (c.get("eligible_contexts") or ())
        )
        if here <= 1:
            return None
        return (
            f"the rule: of the {here} rows that pass every gate at context {context:,} (the context of the row "
            "saving the most cache bytes), the one with the lowest latency ratio (--prefer latency); a tie goes to "
            "the more bytes saved"
        )
    return (
        f"the rule: of the {n} rows that pass every gate, the one saving the most cache bytes (--prefer memory); "
        f"rows within {BYTE_TIE:.0%} of those bytes tie, and a tie goes to the lower KL mean, then to the lower "
        "latency ratio"
    )


def _rivals(result: dict) -> tuple[dict | None, list[dict]]:
    """The summary's selected row and the other eligible capacity rows at its context (each with a latency ratio
    and a cache-bytes ratio); ``(None, [])`` where nothing was selected or the selection lacks a latency ratio."""
    summary = result.get("summary") if isinstance(result, dict) else None
    sel = summary.get("selected_candidate") if isinstance(summary, dict) else None
    if not isinstance(sel, dict) or not isinstance(sel.get("latency_ratio"), (int, float)):
        return None, []
    rows = [
        r
        for r in result.get("rows", [])
        if isinstance(r, dict) and r.get("matrix") == "capacity" and r.get("eligible") is True
        and r.get("context_length") == sel.get("context_length") and r.get("candidate") != sel.get("candidate")
        and isinstance(r.get("latency_ratio"), (int, float)) and isinstance(r.get("cache_bytes_ratio"), (int, float))
    ]
    return sel, rows


def _versus(row: dict, sel: dict) -> str:
    """``<candidate>, cache 0.303x dynamic at 1.33x latency (selected <candidate>: 0.250x at 1.50x)``."""
    return (
        f"{row['candidate']}, cache {row['cache_bytes_ratio']:.3f}x dynamic at {row['latency_ratio']:.2f}x latency "
        f"(selected {sel['candidate']}: {sel.get('cache_bytes_ratio', float('nan')):.3f}x at "
        f"{sel['latency_ratio']:.2f}x)"
    )


# an eligible row at the selected context this much faster (latency ratio) than the selected one is worth naming
FASTER = 0.9
# ... and, under --prefer latency, one whose cache is this much smaller (cache-bytes ratio) than the selected one's
SMALLER = 0.9


def faster_alternative(result: dict) -> str | None:
    """Where the memory rule (``--prefer memory``) picked a row that is slower than another eligible row at the
    same context (latency ratio at most :data:`FASTER` x the selected one's), that row and the flags that would
    pick it or require it: the rule maximises bytes saved, and an engineer serving traffic may weigh the latency (a
    new user asked). None otherwise, and always under ``--prefer latency`` (its selection is the fastest)."""
    sel, rows = _rivals(result)
    if not rows or preference(result) != "memory":
        return None
    fast = min(rows, key=lambda r: r["latency_ratio"])
    if fast["latency_ratio"] >= sel["latency_ratio"] or fast["latency_ratio"] > FASTER * sel["latency_ratio"]:
        return None
    return (
        f"faster and eligible at {sel['context_length']:,}: {_versus(fast, sel)}; the rule maximises bytes saved "
        "(--prefer latency selects the fastest eligible row at this context); --max-latency-ratio N leaves out "
        "rows slower than N x dynamic (1.0: no slowdown)"
    )


def smaller_alternative(result: dict) -> str | None:
    """Where the latency rule (``--prefer latency``) picked a row whose cache is larger than another eligible
    row's at the same context (cache-bytes ratio at most :data:`SMALLER` x the selected one's), that row and the
    flag that would pick it. None otherwise, and always under ``--prefer memory`` (its selection saves the most)."""
    sel, rows = _rivals(result)
    if not rows or preference(result) != "latency" or not isinstance(sel.get("cache_bytes_ratio"), (int, float)):
        return None
    small = min(rows, key=lambda r: r["cache_bytes_ratio"])
    if small["cache_bytes_ratio"] > SMALLER * sel["cache_bytes_ratio"]:
        return None
    return (
        f"smaller and eligible at {sel['context_length']:,}: {_versus(small, sel)}; the rule (--prefer latency) "
        "selects the lowest latency ratio; --prefer memory selects the row saving the most cache bytes"
    )


def alternative_line(result: dict) -> str | None:
    """The eligible row the other rule would weigh, as the reports print it next to the decision:
    :func:`faster_alternative` under ``--prefer memory``, :func:`smaller_alternative` under ``--prefer latency``."""
    return faster_alternative(result) or smaller_alternative(result)


def fp8_range_lines(result: dict) -> list[str]:
    """One line per FP8 candidate of the capacity matrix: K/V elements clamped at the format's range and non-zero
    ones stored as zero (the rows' ``cache_counts``, :meth:`kvlab.caches.fp8.FP8Cache.counts`), summed over its
    contexts."""
    totals: dict[str, dict[str, int]] = {}
    for row in result.get("rows", []):
        counts = row.get("cache_counts") if row.get("matrix") == "capacity" else None
        if not counts or "elements" not in counts:
            continue
        t = totals.setdefault(row["candidate"], {})
        for key in ("key_saturated", "value_saturated", "key_underflow", "value_underflow", "elements"):
            t[key] = t.get(key, 0) + int(counts.get(key, 0))
    lines = []
    for name, t in totals.items():
        n = 2 * t["elements"]
        if not n:
            continue
        sat = t["key_saturated"] + t["value_saturated"]
        under = t["key_underflow"] + t["value_underflow"]
        lines.append(
            f"{name} range: {sat:,} of {n:,} K/V elements saturated ({sat / n:.4%}), {under:,} flushed to zero "
            f"({under / n:.4%}) as stored, all contexts"
        )
    return lines


# the gates by their names in the reports; the result file keeps the field names (summary.decision_gates)
GATE_NAMES = {
    "nll_delta": "ΔNLL",
    "topk_overlap": "top-k overlap",
    "latency_ratio": "latency ratio",
    "saves_memory": "memory saved",
    "recall_drop": "recall drop",
    "passkey_drop": "passkey drop",
    "kl_mean": "KL mean",
}


# the kvlab eval flag that sets each gate's threshold (saves_memory has none: a cache saves bytes or it does not)
GATE_FLAGS = {
    "nll_delta": "--max-nll-delta",
    "topk_overlap": "--min-topk-overlap",
    "latency_ratio": "--max-latency-ratio",
    "recall_drop": "--max-recall-drop",
    "passkey_drop": "--max-passkey-drop",
    "kl_mean": "--max-kl-mean",
}


def gate_names(gates) -> list[str]:
    """The reports' names of gate fields (``["nll_delta", "kl_mean"]`` -> ``["ΔNLL", "KL mean"]``); a field this
    module does not know is shown as it is."""
    return [GATE_NAMES.get(str(g), str(g)) for g in gates or ()]


# the decision of kvlab.eval.decision.decide when no capacity row passed every gate (the result file's token)
NO_CANDIDATE = "tune_cache_policy"

# how the reports word NO_CANDIDATE
NO_CANDIDATE_WORDS = "none: keep DynamicCache (no candidate passed every gate)"


def decision_text(summary: dict) -> str:
    """The summary's decision as the reports print it: ``accept <candidate> at context <n>`` as stored, the
    file's token ``tune_cache_policy`` as :data:`NO_CANDIDATE_WORDS` (a user read it as an internal name), none
    recorded as ``-``."""
    decision = summary.get("decision") if isinstance(summary, dict) else None
    if decision == NO_CANDIDATE:
        return NO_CANDIDATE_WORDS
    return "-" if decision is None else str(decision)


def first_context_text(value: object, none: str) -> str:
    """A summary context (``memory_reduction_onset_context``, ``eligible_crossover_context``: tokens, or None) in
    words: the number, or ``none`` (what None means there, e.g. "no context saved bytes") rather than ``None``."""
    return none if value is None else str(value)


def _where_to_look(result: dict) -> str:
    """" (see the failures)" / " (see the skipped candidates)" where the result holds them, else ""."""
    if result.get("failures"):
        return " (see the failures)"
    if any(not c.get("available", True) for c in result.get("candidates") or [] if isinstance(c, dict)):
        return " (see the skipped candidates)"
    return ""


def no_candidate_advice(result: dict) -> str | None:
    """For the decision ``tune_cache_policy`` (:func:`kvlab.eval.decision.decide`: no candidate row of the capacity
    matrix passed every gate): what it means, the gates the rows failed on with their counts, and what to try;
    None for any other decision. It points at the failures or skipped candidates only where the result has some."""
    summary = result.get("summary") if isinstance(result, dict) else None
    if not isinstance(summary, dict) or summary.get("decision") != NO_CANDIDATE:
        return None
    rows = [
        r
        for r in result.get("rows") or []
        if r.get("matrix") == "capacity" and r.get("candidate") != "dynamic"
    ]
    if not rows:
        return (
            f"no candidate cache was measured in the capacity matrix{_where_to_look(result)}, so kvlab recommends "
            "none: keep DynamicCache"
        )
    failed: dict[str, int] = {}
    for r in rows:
        for gate, passed in (r.get("gates") or {}).items():
            if passed is False:
                failed[gate] = failed.get(gate, 0) + 1
    order = sorted(failed, key=lambda g: -failed[g])
    counts = ", ".join(f"{GATE_NAMES.get(g, g)}: {failed[g]} of {len(rows)} rows" for g in order)
    tries = [
        "candidates that lose less (more bits, a larger --residual or a smaller --group-size / --hqq-group-size; "
        "for an evicting cache a larger token_budget or window_length, e.g. tova:token_budget=512)"
    ]
    if "saves_memory" in failed:
        tries.append(
            "longer --contexts (a cache with a residual window or a budget saves bytes only past it)"
        )
    flags = [GATE_FLAGS[g] for g in order if g in GATE_FLAGS]
    if flags:
        tries.append(f"a looser gate if your use tolerates the loss ({', '.join(flags)})")
    why = f"the rows failed on {counts}" if counts else f"no row failed a gate{_where_to_look(result)}"
    return (
        f"no candidate passed every gate at any context of the capacity matrix, so kvlab recommends none: keep "
        f"DynamicCache ({why}). To find a cache that passes, rerun kvlab eval with {'; or '.join(tries)}."
    )


BUNDLED_ID = "kvlab-reference (bundled)"


REAL_MODEL_COMMAND = "kvlab eval --model smollm2-135m"


def bundled_model_note(result: dict) -> str | None:
    """For a run on the bundled model: that its decision is a test result, not advice for a served model (its
    verdicts differ from a real LLM's, docs/EVAL.md), and the command that runs a real one; else None."""
    model = result.get("provenance", {}).get("model", {})
    if model.get("id_or_path") != BUNDLED_ID:
        return None
    return (
        "this ran on the bundled 5 M-parameter test model, whose verdicts differ from a real LLM's (docs/EVAL.md); "
        f"for a decision about a served model run a real one: {REAL_MODEL_COMMAND} (offline, after "
        "`kvlab models get smollm2-135m`), or --model with your own"
    )


def window_quality_note(result: dict) -> str | None:
    """Under the residual-window table: why a transformers ``QuantizedCache`` candidate (HQQ, quanto: the registry
    families that read ``hqq_group_size``) shows the same ΔNLL, top-k and KL at every R. Its first update quantizes
    the whole prompt whatever ``residual_length`` is (transformers ``QuantizedLayer.update``); R only bounds how many
    newly decoded tokens it holds in float before quantizing them too. The quality pass feeds ``quality_tokens`` - 1
    tokens after the prompt, one at a time, and the R-th of them re-quantizes, which the next forward would see: so R
    changes those numbers only where R < ``quality_tokens`` - 1. None without such a row in the window matrix, or
    without ``settings.quality_tokens``."""
    from kvlab.caches.registry import REGISTRY

    n = (result.get("settings") or {}).get("quality_tokens")
    rows = [
        r
        for r in result.get("rows") or []
        if isinstance(r, dict) and r.get("matrix") == "window" and r.get("candidate") != "dynamic"
        and "hqq_group_size" in getattr(REGISTRY.get(r.get("family", "")), "reads", ())
    ]
    if not rows or isinstance(n, bool) or not isinstance(n, int):
        return None
    names = list(dict.fromkeys(r["candidate"] for r in rows))
    moved = sorted({r["residual_length"] for r in rows if isinstance(r.get("residual_length"), int)
                    and r["residual_length"] < n - 1})
    one = len(names) == 1
    where = (
        f"cannot change with R here (they would at R below {n - 1})"
        if not moved
        else f"change with R only at R below {n - 1} (here R = {', '.join(map(str, moved))})"
    )
    return (
        f"{', '.join(names)} {'is' if one else 'are'} transformers' QuantizedCache, which quantizes the whole prompt "
        f"at the prefill whatever R is (R is how many newly decoded tokens it holds in float before quantizing them "
        f"too), so {'its' if one else 'their'} ΔNLL, top-k and KL over the {n} teacher-forced tokens {where}; R can "
        f"change {'its' if one else 'their'} bytes and latency (over the tokens generate() produces)"
    )
