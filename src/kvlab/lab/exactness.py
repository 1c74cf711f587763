"""Real-model check: incremental decoding with each cache that should be exact gives the full forward's logits.

The mechanics chapter (§3.1) proves on a toy that cached K/V equal recomputed ones; this check asks the same of a real
transformers model and of every cache the registry (:mod:`kvlab.caches.registry`) marks exact: ``DynamicCache`` (the
reference), ``kvlab.caches.PagedCache`` (K/V in physical blocks) and ``kvlab.caches.KIVICache`` at 8 bits with a
residual window longer than the sequence (nothing is ever quantized, so it must be exact too).

For a token sequence ``[batch, tokens]``, the reference is one forward without cache; the candidate prefills
``prefill_tokens`` tokens into the cache, then feeds one token per step. The logits of every position are
compared: max absolute error and relative error (max abs error / max |reference logit|).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from kvlab.caches.registry import cache_names, make_cache, resolve
from kvlab.runtime.hf_api import cache_kwarg

# Relative-error tolerance by model dtype: the two paths differ only in matmul shapes (accumulation order).
TOLERANCE_BY_DTYPE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}

CacheFactory = Callable[[Any, int], Any]  # (model, total tokens) -> a transformers Cache


def _registered(name: str) -> CacheFactory:
    """A factory for the cache registry's ``name`` (:mod:`kvlab.caches.registry`)."""

    def factory(model: Any, total_tokens: int) -> Any:
        return make_cache(name, model.config)

    return factory


def _kivi8(model: Any, total_tokens: int) -> Any:
    group = 32
    residual = group * (total_tokens // group + 1)  # a multiple of G, longer than the sequence: never flushes
    return make_cache(f"kivi-8:group_size={group}:residual_length={residual}", model.config)


# Every exact cache of the registry (DynamicCache first: the others are also compared with it; PagedCache's
# 16-token blocks make the sequence span several), and KIVI with nothing ever quantized.
EXACT_CACHES: dict[str, CacheFactory] = {
    name: _registered(name) for name in cache_names() if resolve(name).exact
} | {"kivi-8-full-residual": _kivi8}


@torch.no_grad()
def incremental_logits(model: Any, input_ids: torch.Tensor, cache: Any, prefill_tokens: int) -> torch.Tensor:
    """Logits ``[batch, tokens, vocab]`` of ``input_ids: [batch, tokens]`` decoded through ``cache``: one prefill
    of ``prefill_tokens`` tokens, then one token per forward.

    Raises:
        ValueError: ``prefill_tokens`` outside ``[1, tokens]``.
    """
    tokens = input_ids.shape[1]
    if not 1 <= prefill_tokens <= tokens:
        raise ValueError(f"`prefill_tokens` must be in [1, {tokens}], got {prefill_tokens!r}")
    kw = {cache_kwarg(model): cache, "use_cache": True}
    out = [model(input_ids[:, :prefill_tokens], **kw).logits]
    for t in range(prefill_tokens, tokens):
        out.append(model(input_ids[:, t : t + 1], **kw).logits)
    return torch.cat(out, dim=1)  # [batch, tokens, vocab]


@torch.no_grad()
def check_exact_caches(
    model: Any,
    input_ids: torch.Tensor,
    *,
    prefill_tokens: int | None = None,
    caches: dict[str, CacheFactory] | None = None,
    rel_tolerance: float | None = None,
) -> dict:
    """Compare incremental decoding through each cache with one full forward of ``model`` on ``input_ids``.

    Args:
        model: a transformers causal LM in eval mode.
        input_ids: ``[batch, tokens]`` token ids, no padding.
        prefill_tokens: tokens of the first cached forward; default ``tokens // 4`` (at least 1).
        caches: name -> factory ``(model, tokens) -> Cache``; default :data:`EXACT_CACHES`.
        rel_tolerance: pass threshold on the relative error; default from :data:`TOLERANCE_BY_DTYPE`.

    Returns:
        ``{"tokens", "prefill_tokens", "batch", "dtype", "rel_tolerance", "ref_scale", "rows": [...],
        "all_passed"}``; each row has ``cache``, ``status`` (``ok``/``failed``/``skipped``), ``max_abs_err``,
        ``rel_err``, ``argmax_agreement`` (fraction of positions whose top token matches), ``passed``,
        ``max_abs_diff_vs_dynamic`` (for caches after ``"dynamic"``: distance to DynamicCache's incremental
        logits) and, when not ok, ``error`` (an unavailable cache class is ``skipped`` with the import error).
    """
    batch, tokens = input_ids.shape
    prefill_tokens = max(1, tokens // 4) if prefill_tokens is None else prefill_tokens
    caches = EXACT_CACHES if caches is None else caches
    dtype = next(model.parameters()).dtype
    tol = TOLERANCE_BY_DTYPE.get(dtype, 5e-2) if rel_tolerance is None else rel_tolerance
    reference = model(input_ids, use_cache=False).logits.float()  # [batch, tokens, vocab]
    ref_scale = float(reference.abs().max())
    rows, dynamic_logits = [], None
    for name, factory in caches.items():
        try:
            cache = factory(model, tokens)
        except ImportError as exc:
            rows.append(
                {"cache": name, "status": "skipped", "passed": None, "error": f"not importable: {exc}"}
            )
            continue
        try:
            logits = incremental_logits(model, input_ids, cache, prefill_tokens).float()
        except Exception as exc:  # recorded, the other caches still run
            rows.append(
                {"cache": name, "status": "failed", "passed": False, "error": f"{type(exc).__name__}: {exc}"}
            )
            continue
        max_abs = float((logits - reference).abs().max())
        rel = max_abs / ref_scale if ref_scale > 0 else math.inf
        agree = float((logits.argmax(-1) == reference.argmax(-1)).float().mean())
        row = {
            "cache": name,
            "status": "ok",
            "max_abs_err": max_abs,
            "rel_err": rel,
            "argmax_agreement": agree,
            "passed": bool(rel <= tol),
        }
        if name == "dynamic":
            dynamic_logits = logits
        elif dynamic_logits is not None:  # the same incremental path as DynamicCache: expect identical logits
            row["max_abs_diff_vs_dynamic"] = float((logits - dynamic_logits).abs().max())
        rows.append(row)
    return {
        "tokens": tokens,
        "prefill_tokens": prefill_tokens,
        "batch": batch,
        "dtype": str(dtype).removeprefix("torch."),
        "rel_tolerance": tol,
        "ref_scale": ref_scale,
        "rows": rows,
        "all_passed": all(r["passed"] for r in rows if r["status"] != "skipped"),
    }


def run_real_check(
    model: str | None = None, *, dtype: str = "float32", tokens: int = 96, batch: int = 1, device: str = "cpu"
) -> dict:
    """:func:`check_exact_caches` on a real model (``None``: the bundled reference model) loaded with
    ``kvlab.models.load_model``, over ``batch`` consecutive cuts of ``tokens`` tokens of the bundled held-out text
    (``kvlab.models.heldout_token_ids``). fp32 by default: the check is about the cache, not bf16 rounding.

    Raises:
        ValueError: ``tokens`` or ``batch`` < 1, or the held-out text is shorter than ``batch * tokens`` tokens.
    """
    from kvlab.models import heldout_token_ids, load_model

    if tokens < 1 or batch < 1:
        raise ValueError(f"`tokens` and `batch` must be >= 1, got {tokens!r} and {batch!r}")
    lm, tokenizer = load_model(model, dtype=dtype, device=device)
    lm.eval()
    rows = [heldout_token_ids(tokenizer, tokens, offset=b * tokens) for b in range(batch)]
    input_ids = torch.tensor(rows, dtype=torch.long, device=device)  # [batch, tokens]
    result = check_exact_caches(lm, input_ids)
    result["model"] = "bundled reference model" if model is None else str(model)
    return result
