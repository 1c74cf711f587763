"""Per-layer KV sensitivity: the damage of compressing one layer's keys (or values) in one format, all else float.

For each held-out prompt of ``context`` tokens followed by ``n`` continuation tokens:

1. one float prefill of the prompt (a ``DynamicCache``): its K/V per layer, ``[1, kv_heads, context, head_dim]``;
2. for every choice ``(layer, half, format)`` (``half`` is ``"k"`` or ``"v"``) a copy of those states in which only
   that layer's keys or values went through the format's round trip, exactly what the cache stores and reads back
   after the prefill: KIVI (arXiv:2402.02750, section 3) quantizes the ``Q(context)`` oldest tokens (keys per-channel in
   groups of ``G`` tokens, values per-token in groups of ``G`` channels) and keeps the newest in full precision;
   FP8 e4m3 scales per head, calibrated on the prefill (:mod:`kvlab.quant.fp8`);
3. the ``n`` continuation tokens teacher-forced in one forward over each copy (rows of one batch: row 0 the float
   states, the others one choice each), and ``KL(float || compressed)`` of the next-token distributions at every
   continuation position (:func:`kvlab.eval.divergence.kl_divergence`, llama.cpp's statistic), against row 0 of the
   same forward (so batch shape and kernel order cancel).

The continuation attends to itself in full precision (as a KIVI cache's residual window holds it); the result is
the damage of the compressed history. Cost: one prefill per prompt and ``ceil(choices / (rows - 1))`` forwards of
``n`` tokens over ``rows`` copies of the ``context``-token cache per prompt (the result states it).

Source: KVQuant (arXiv:2401.18079) and KVTuner for per-layer sensitivity; docs/MIXED.md for how the allocator uses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.eval.divergence import kl_divergence
from kvlab.plan.mixed import family, kivi_bits
from kvlab.quant.codec import dequantize, quantize_groups
from kvlab.quant.fp8 import calibrate, decode, encode
from kvlab.quant.kivi import KIVIConfig
from kvlab.runtime.hf_api import cache_kwarg

SWEEP_FORMATS = ("kivi-2", "kivi-4", "kivi-8", "fp8-e4m3")
HALVES = ("k", "v")


def roundtrip(
    x: torch.Tensor,
    fmt: str,
    half: str,
    group_size: int = KIVI_DEFAULTS.group_size,
    residual_length: int = KIVI_DEFAULTS.residual_length,
) -> torch.Tensor:
    """``x`` as a cache in ``fmt`` holds it after a prefill of ``x`` and reads it back.

    Args:
        x: keys or values of one layer, ``[batch, kv_heads, tokens, head_dim]``.
        fmt: ``kivi-2`` / ``kivi-4`` / ``kivi-8`` / ``fp8-e4m3`` / ``float`` (:data:`kvlab.plan.mixed.FORMATS`).
        half: ``"k"`` (KIVI: per-channel groups of ``group_size`` tokens) or ``"v"`` (per-token groups of
            ``group_size`` channels).
        group_size, residual_length: KIVI ``G`` and ``R``: the oldest ``Q = ((T - R) // G) * G`` tokens are
            quantized, the rest kept as given (KIVIState's flush rule).

    Returns:
        ``[batch, kv_heads, tokens, head_dim]`` in ``x``'s dtype; bit for bit what ``KIVICache`` / ``FP8Cache``
        return for those tokens in the next step.

    Raises:
        ValueError: an unknown ``fmt`` or ``half``; KIVI settings ``KIVIConfig`` refuses.
    """
    if half not in HALVES:
        raise ValueError(f"`half` must be 'k' or 'v', got {half!r}")
    kind = family(fmt)
    if kind == "float":
        return x
    if kind == "fp8":
        scale = calibrate(x, "e4m3", "per-head")  # [B, H, 1, 1]: what FP8Layer calibrates on its prefill
        return decode(encode(x, "e4m3", scale).codes, scale, x.dtype)
    cfg = KIVIConfig(nbits=kivi_bits(fmt), group_size=group_size, residual_length=residual_length)
    q = cfg.quantized_tokens(x.shape[-2])
    if q == 0:
        return x
    axis = -2 if half == "k" else -1  # keys per-channel (groups along tokens), values per-token
    prefix = dequantize(quantize_groups(x[..., :q, :], cfg.nbits, group_size, axis=axis), x.dtype)
    return torch.cat((prefix, x[..., q:, :]), dim=-2)  # [B, H, T, D]


def _float_states(model: Any, prompt: torch.Tensor) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], float]:
    """K/V per layer after a float prefill of ``prompt`` ``[1, context]`` and the prefill's seconds."""
    from transformers import DynamicCache

    cache = DynamicCache()
    start = time.perf_counter()
    model(input_ids=prompt, use_cache=True, logits_to_keep=1, **{cache_kwarg(model): cache})
    return [(layer.keys, layer.values) for layer in cache.layers], time.perf_counter() - start


def _batch_kl(model, states, continuation, choices, compressed) -> list[float]:
    """Mean KL over the continuation positions of each choice, against the float row 0 of the same forward."""
    from transformers import DynamicCache

    rows = len(choices) + 1
    cache = DynamicCache()
    for idx, (keys, values) in enumerate(states):
        k = keys.expand(rows, -1, -1, -1).clone()  # [rows, H, T, D]
        v = values.expand(rows, -1, -1, -1).clone()
        for row, (layer, half, fmt) in enumerate(choices, start=1):
            if layer == idx:
                (k if half == "k" else v)[row] = compressed[(layer, half, fmt)][0]
        cache.update(k, v, idx)
    ids = continuation.expand(rows, -1)  # [rows, n]
    logits = model(
        input_ids=ids, use_cache=True, **{cache_kwarg(model): cache}
    ).logits.float()  # [rows, n, V]
    kl = kl_divergence(logits[:1].expand(rows - 1, -1, -1), logits[1:])  # [rows - 1, n]
    return kl.mean(dim=1).tolist()


def sweep(
    model: Any,
    prompts: torch.Tensor,
    context: int,
    formats: Sequence[str] = SWEEP_FORMATS,
    *,
    group_size: int = KIVI_DEFAULTS.group_size,
    residual_length: int = KIVI_DEFAULTS.residual_length,
    rows: int = 8,
    on_step: Callable[[str], None] | None = None,
) -> dict:
    """Sensitivity of every layer's keys and values to every format (see the module docstring).

    Args:
        model: a transformers causal LM with full-attention layers.
        prompts: ``[prompts, context + n]`` token ids: the first ``context`` are the prompt, the rest the
            teacher-forced continuation (``n >= 1``).
        formats: formats to try (:data:`SWEEP_FORMATS` by default).
        rows: batch rows per continuation forward (one of them the float reference), ``>= 2``.
        on_step: called with a one-line description before each forward (progress).

    Returns:
        ``{"kl": {fmt: {"k": [layers], "v": [layers]}}`` (nats, mean over prompts and positions),
        ``"kl_per_prompt"`` (the same, one list per prompt), ``"layers"``, ``"formats"``, ``"cost"``
        (``prompts``, ``prefills``, ``forwards``, ``rows``, ``context``, ``continuation``, ``seconds``).

    Raises:
        ValueError: ``prompts`` not ``[P, context + n]`` with ``n >= 1``, ``rows < 2``, an unknown format.
    """
    if prompts.dim() != 2 or not 0 < context < prompts.shape[1]:
        raise ValueError(
            f"`prompts` must be [prompts, context + n] with n >= 1, got shape {tuple(prompts.shape)} for context "
            f"{context}"
        )
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 2:
        raise ValueError(f"`rows` must be an int >= 2 (the float row and one choice), got {rows!r}")
    for fmt in formats:
        family(fmt)
    start = time.perf_counter()
    layers = model.config.get_text_config().num_hidden_layers
    choices = [(layer, half, fmt) for fmt in formats for layer in range(layers) for half in HALVES]
    per_prompt, forwards = [], 0
    with torch.inference_mode():
        for p, row in enumerate(prompts):
            states, _ = _float_states(model, row[None, :context])
            compressed = {
                (layer, half, fmt): roundtrip(
                    states[layer][HALVES.index(half)], fmt, half, group_size, residual_length
                )
                for layer, half, fmt in choices
            }
            kl: dict[tuple, float] = {}
            for i in range(0, len(choices), rows - 1):
                batch = choices[i : i + rows - 1]
                if on_step is not None:
                    on_step(
                        f"prompt {p + 1}/{len(prompts)}: choices {i + 1}-{i + len(batch)} of {len(choices)}"
                    )
                kl.update(zip(batch, _batch_kl(model, states, row[None, context:], batch, compressed)))
                forwards += 1
            per_prompt.append(
                {f: {h: [kl[(layer, h, f)] for layer in range(layers)] for h in HALVES} for f in formats}
            )
    mean = {
        f: {
            h: [sum(pp[f][h][layer] for pp in per_prompt) / len(per_prompt) for layer in range(layers)]
            for h in HALVES
        }
        for f in formats
    }
    cost = {
        "prompts": len(prompts),
        "prefills": len(prompts),
        "forwards": forwards,
        "rows": rows,
        "context": context,
        "continuation": prompts.shape[1] - context,
        "seconds": round(time.perf_counter() - start, 2),
    }
    return {"layers": layers, "formats": list(formats), "kl": mean, "kl_per_prompt": per_prompt, "cost": cost}


def ranking(kl: dict, fmt: str) -> list[tuple[int, str, float]]:
    """``[(layer, half, KL)]`` for ``fmt``, most sensitive first (``kl`` is :func:`sweep`'s ``"kl"``)."""
    out = [(layer, half, value) for half in HALVES for layer, value in enumerate(kl[fmt][half])]
    return sorted(out, key=lambda item: -item[2])
