"""A synthetic eval result in the lead's schema (row keys of /work/prompts/interfaces.md), built by code."""

import math

import pytest


def synthetic_eval_result(label: str = "synthetic") -> dict:
    """Two matrices, three candidates plus the baseline; the numbers follow simple made-up trends so that some
    cells pass the gates and some fail."""
    rows = []
    for context in (512, 2048, 4096):
        for name, bits in (("dynamic", 16), ("kivi-4", 4), ("kivi-2", 2)):
            ratio = 1.0 if bits == 16 else (bits / 16 + 0.0625) * (1 - 128 / context) + 128 / context
            rows.append(
                {
                    "matrix": "capacity",
                    "candidate": name,
                    "context_length": context,
                    "residual_length": 128,
                    "cache_bytes": int(context * 24576 * ratio),
                    "cache_bytes_ratio": ratio,
                    "nll_delta": 0.0 if bits == 16 else 0.9 / bits * math.log2(context) / 9,
                    "topk_overlap": 1.0 if bits == 16 else 1 - 0.7 / bits,
                    "latency_ratio": 1.0 if bits == 16 else 1.2 + context / 4096,
                }
            )
        rows.append(
            {
                "matrix": "capacity",
                "candidate": "hqq-4",
                "context_length": context,
                "status": "skipped",
                "error": "optional extra 'hf' not installed",
                "cache_bytes": None,
                "nll_delta": None,
            }
        )
    for residual in (16, 32, 64):
        for name, bits in (("dynamic", 16), ("kivi-2", 2)):
            rows.append(
                {
                    "matrix": "window",
                    "candidate": name,
                    "context_length": 512,
                    "residual_length": residual,
                    "cache_bytes_ratio": 1.0 if bits == 16 else 0.2 + residual / 512,
                    "nll_delta": 0.0 if bits == 16 else 0.8 - residual / 128,
                    "topk_overlap": 1.0 if bits == 16 else 0.5 + residual / 256,
                    "latency_ratio": 1.0 if bits == 16 else 1.5,
                }
            )
    return {
        "schema_version": 1,
        "label": label,
        "provenance": {
            "python": "3.11",
            "torch": "2.13.0",
            "model": {"name": "synthetic-model", "sha256": "ab" * 8},
            "hardware": {"cpu": "test cpu", "cuda": None},
        },
        "gates": {"max_nll_delta": 0.5, "min_topk_overlap": 0.6, "max_latency_ratio": 2.0},
        "decision": {
            "decision": "accept_local_cache_candidate",
            "selected_candidate": "kivi-4",
            "eligible_crossover_context": 512,
        },
        "rows": rows,
    }


@pytest.fixture
def eval_result():
    return synthetic_eval_result()
