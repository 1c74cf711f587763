"""A synthetic eval result in the ``kvlab.eval.schema`` layout, built by code (not a copied real file)."""

import math

import pytest

GATES = {"max_nll_delta": 0.5, "min_topk_overlap": 0.6, "max_latency_ratio": 2.0}


def _paired_row(matrix, name, bits, context, residual, group, base_bytes, base_ms, base_nll):
    """A candidate row with made-up but self-consistent numbers; gates judged like the runner judges them."""
    ratio = (bits / 16 + 0.0625) * (1 - residual / context) + residual / context
    nll_delta = 0.9 / bits * math.log2(context) / 9 + (0.4 - residual / 160 if matrix == "window" else 0.0)
    overlap = 1 - 0.7 / bits + (residual / 512 if matrix == "window" else 0.0)
    latency_ratio = 1.2 + context / 4096
    row = {
        "matrix": matrix,
        "candidate": name,
        "family": "kivi",
        "nbits": bits,
        "context_length": context,
        "new_tokens": 64,
        "residual_length": residual,
        "group_size": group,
        "median_ms": base_ms * latency_ratio,
        "min_ms": base_ms * latency_ratio * 0.97,
        "timings_ms": [base_ms * latency_ratio] * 3,
        "ms_per_token": base_ms * latency_ratio / 64,
        "incremental_peak_bytes": int(base_bytes * ratio * 1.1),
        "cache_bytes": int(base_bytes * ratio),
        "mean_nll": base_nll + nll_delta,
        "dynamic_cache_bytes": base_bytes,
        "cache_bytes_ratio": ratio,
        "cache_bytes_saved": base_bytes - int(base_bytes * ratio),
        "latency_ratio": latency_ratio,
        "nll_delta": nll_delta,
        "nll_ratio": (base_nll + nll_delta) / base_nll,
        "topk_overlap": overlap,
        "greedy_exact_match": bits >= 4,
        "token_agreement_rate": 1.0 if bits >= 4 else 0.8,
        "first_divergence_index": None if bits >= 4 else 12,
    }
    row["gates"] = {
        "nll_delta": nll_delta <= GATES["max_nll_delta"],
        "topk_overlap": overlap >= GATES["min_topk_overlap"],
        "latency_ratio": latency_ratio <= GATES["max_latency_ratio"],
        "saves_memory": row["cache_bytes_saved"] > 0,
    }
    row["eligible"] = all(row["gates"].values())
    return row


def _baseline_row(matrix, context, base_bytes, base_ms, base_nll):
    return {
        "matrix": matrix,
        "candidate": "dynamic",
        "family": "dynamic",
        "nbits": None,
        "context_length": context,
        "new_tokens": 64,
        "residual_length": None,
        "group_size": None,
        "median_ms": base_ms,
        "min_ms": base_ms * 0.98,
        "timings_ms": [base_ms] * 3,
        "ms_per_token": base_ms / 64,
        "incremental_peak_bytes": int(base_bytes * 1.1),
        "cache_bytes": base_bytes,
        "mean_nll": base_nll,
    }


def synthetic_eval_result(label: str = "synthetic") -> dict:
    """Both matrices, the baseline and two KIVI candidates, an HQQ candidate recorded as failed."""
    rows, failures = [], []
    for context in (512, 2048, 4096):
        base_bytes, base_ms = (context + 63) * 24576, 20.0 + context / 100
        rows.append(_baseline_row("capacity", context, base_bytes, base_ms, 3.0))
        for name, bits in (("kivi-4", 4), ("kivi-2", 2)):
            rows.append(_paired_row("capacity", name, bits, context, 128, 32, base_bytes, base_ms, 3.0))
        failures.append(
            {
                "candidate": "hqq-4",
                "context_length": context,
                "residual_length": 128,
                "stage": "construct",
                "type": "ImportError",
                "message": "optional extra 'hf' not installed",
            }
        )
    rows.append(_baseline_row("window", 512, 640 * 24576, 25.0, 3.0))
    for residual in (16, 32, 64):
        rows.append(_paired_row("window", "kivi-2", 2, 512, residual, 16, 640 * 24576, 25.0, 3.0))
    eligible = [r for r in rows if r.get("eligible") and r["matrix"] == "capacity"]
    selected = max(eligible, key=lambda r: r["cache_bytes_saved"], default=None)
    return {
        "schema_version": "kvlab.eval/1",
        "label": label,
        "status": "partial",
        "created_utc": "2026-11-30T00:00:00+00:00",
        "command": ["kvlab", "eval", "--label", label],
        "settings": {"contexts": [512, 2048, 4096], "top_k": 5, "residual_length": 128, "group_size": 32},
        "gates": dict(GATES),
        "candidates": [
            {"name": "dynamic", "family": "dynamic", "available": True, "skip_reason": None},
            {"name": "kivi-4", "family": "kivi", "nbits": 4, "available": True, "skip_reason": None},
            {"name": "kivi-2", "family": "kivi", "nbits": 2, "available": True, "skip_reason": None},
            {
                "name": "hqq-4",
                "family": "hqq",
                "nbits": 4,
                "available": False,
                "skip_reason": "optional extra 'hf' not installed",
            },
        ],
        "plan": [
            {"matrix": r["matrix"], "candidate": r["candidate"], "context_length": r["context_length"]}
            for r in rows
        ],
        "provenance": {
            "software": {"python": "3.11", "torch": "2.13.0"},
            "model": {"id_or_path": "synthetic-model", "fingerprint": "ab" * 8, "dtype": "bfloat16"},
            "hardware": {"cpu": "test cpu", "cuda": None},
            "seed": 42,
        },
        "rows": rows,
        "failures": failures,
        "summary": {
            "memory_reduction_onset_context": 512,
            "eligible_crossover_context": min(r["context_length"] for r in eligible) if eligible else None,
            "eligible_candidate_count": len(eligible),
            "selected_candidate": {
                "candidate": selected["candidate"],
                "context_length": selected["context_length"],
            }
            if selected
            else None,
            "decision": f"accept {selected['candidate']} at context {selected['context_length']}"
            if selected
            else "tune_cache_policy",
        },
        "elapsed_s": 12.5,
    }


@pytest.fixture
def eval_result():
    return synthetic_eval_result()


# (name, family line, × dyn (cache bytes / float bytes), samples with every reference found out of 4) per cell of a tasks result
_TASK_CACHES = {
    "niah_single_1": (("dynamic", "dynamic", 1.0, 4), ("kivi-4", "kivi", 0.36, 4), ("kivi-2", "kivi", 0.24, 1),
                      ("snapkv:compression_ratio=0.5", "snapkv", 0.5, 0)),
    "vt": (("dynamic", "dynamic", 1.0, 1), ("kivi-4", "kivi", 0.36, 1), ("kivi-2", "kivi", 0.24, 0),
           ("snapkv:compression_ratio=0.5", "snapkv", 0.5, 0)),
}  # fmt: skip


def synthetic_tasks_result(status: str = "complete") -> dict:
    """A ``kvlab tasks`` result in the :mod:`kvlab.eval.tasks_schema` layout, built by code: two tasks at one
    context, four caches, judged by the real :func:`kvlab.eval.tasks_judge.judge`."""
    from kvlab.eval.tasks_judge import judge
    from kvlab.eval.tasks_run import summarize

    cells, candidates = [], {}
    for task, caches in _TASK_CACHES.items():
        rows = {}
        for name, line, ratio, found in caches:
            trials = [{"sample": i, "question": 0, "score": float(i < found), "correct": i < found,
                       "output": f" {1234567 + i}" if i < found else " no"} for i in range(4)]  # fmt: skip
            float_bytes = 4 * 512 * 24576
            rows[name] = summarize(trials) | {"bytes": int(float_bytes * ratio), "float_bytes": float_bytes}
            rows[name].update(cache_bytes_ratio=ratio, ms=100.0 / ratio, answers=trials)
            candidates[name] = {"name": name, "family": line.split("+")[0], "line": line}
        cells.append({"task": task, "context": 512, "context_tokens": 512, "samples": 4, "prefill_ms": 80.0,
                      "seconds": 2.5, "caches": rows})  # fmt: skip
    result = {"kind": "kvlab-tasks", "version": 3, "status": status, "created_utc": "2026-12-03T00:00:00+00:00",
              "command": ["kvlab", "tasks"], "model": {"name": "synthetic", "dtype": "float32", "device": "cpu"},
              "settings": {"tasks": list(_TASK_CACHES), "contexts": [512], "candidates": list(candidates), "n": 4,
                           "seed": 0, "protected_tail": 160, "max_drop": 0.1, "min_float_score": 0.5},
              "cells": cells, "not_measured": [{"task": "cwe", "context": 512, "reason": "context too short"}],
              "skipped": {}, "candidates": candidates, "failures": [],
              "provenance": {"cpu": "test cpu", "started_unix": 0.0, "wall_s": 5.0}}  # fmt: skip
    result.update(judge(cells, 0.1, 0.5))
    return result


@pytest.fixture
def tasks_result():
    return synthetic_tasks_result()
