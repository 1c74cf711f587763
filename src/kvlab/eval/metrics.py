"""Measurements of one cache candidate: generate() latency and peak memory, fixed-continuation quality.

As in the quantization chapter, latency is the median of ``repeat`` synchronized ``generate()`` calls after ``warmup`` untimed ones;
quality is measured on a *fixed* continuation (the baseline's greedy tokens), so candidates are compared on the
same history instead of on diverging generations: mean NLL per token, mean top-k overlap with the baseline's
top-k, and the greedy agreement of the free-running outputs as a diagnostic.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from kvlab.runtime.checks import check_int
from kvlab.runtime.device import synchronize
from kvlab.runtime.hf_api import cache_kwarg
from kvlab.runtime.tensor_bytes import TensorBytesTracker


class PeakMemory:
    """Incremental peak memory of a code block, in bytes.

    CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus the allocated bytes at entry
    (the quantization chapter's measure). CPU: the exact peak of live tensor bytes created inside the block, counted operator
    by operator with :class:`kvlab.runtime.tensor_bytes.TensorBytesTracker` (weights and inputs that exist before the
    block are not counted; allocator caching is not counted either).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.base = 0
        self.incremental_peak_bytes: int | None = None
        self._tracker = None
        if device.type == "cuda":
            self.method = "cuda: torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus allocated at start"
        else:
            self.method = (
                "cpu: exact peak of live tensor bytes created during one generate() (TorchDispatchMode)"
            )

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            synchronize(self.device)
            torch.cuda.empty_cache()
            self.base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._tracker = TensorBytesTracker()
            self._tracker.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            synchronize(self.device)
            self.incremental_peak_bytes = int(
                max(0, torch.cuda.max_memory_allocated(self.device) - self.base)
            )
        else:
            self._tracker.__exit__(*exc)
            self.incremental_peak_bytes = int(self._tracker.peak_bytes)


def generate_once(
    model: Any, input_ids: torch.Tensor, make_cache: Callable[[], Any], new_tokens: int, pad_token_id: int
) -> tuple[Any, torch.Tensor]:
    """One greedy ``generate()`` of exactly ``new_tokens`` tokens through a fresh cache from ``make_cache``.

    Args:
        input_ids: ``[batch, context]`` prompt (no padding: the attention mask is all ones).

    Returns:
        ``(cache, output_ids)``: the cache after the call and ``[batch, context + new_tokens]`` ids.
    """
    cache = make_cache()
    out = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=pad_token_id,
        **{cache_kwarg(model): cache},
    )
    return cache, out


def run_generate(
    model: Any,
    input_ids: torch.Tensor,
    make_cache: Callable[[], Any],
    new_tokens: int,
    warmup: int,
    repeat: int,
    pad_token_id: int,
    measure_cpu_memory: bool = True,
) -> tuple[dict, Any, torch.Tensor]:
    """Time greedy ``generate()`` with a fresh cache per call.

    Args:
        input_ids: ``[batch, context]`` prompt.
        make_cache: returns a new cache object for each call.
        new_tokens: exact number of tokens to generate (min = max).
        warmup / repeat: untimed calls first, then timed ones (``repeat`` >= 0; with 0 nothing is timed: the call
            that yields the outputs is the memory call, or one plain call, and ``perf``'s timing fields are None;
            ``kvlab eval`` times its caches later, interleaved).
        measure_cpu_memory: on CPU, run one extra untimed call under exact tensor accounting (slow); when False the
            peak is None there. On CUDA the allocator's peak is always read over the timed calls (over one untimed
            call when ``repeat`` is 0).

    Returns:
        ``(perf, last_cache, generated)``: ``perf`` has ``median_ms``, ``min_ms``, ``timings_ms``,
        ``ms_per_token`` (milliseconds), ``generated_tokens``, ``incremental_peak_bytes`` and
        ``peak_memory_method``; ``last_cache`` is the cache of the last call (for byte counting); ``generated`` is
        ``[batch, new_tokens]``.

    Raises:
        ValueError: ``warmup`` or ``repeat`` not a non-negative integer.
    """
    check_int("warmup", warmup, 0)
    check_int("repeat", repeat, 0)
    device = input_ids.device

    def once():
        return generate_once(model, input_ids, make_cache, new_tokens, pad_token_id)

    with torch.inference_mode():
        for _ in range(warmup):
            once()
        if device.type == "cuda":  # the allocator's peak costs nothing: measure it over the timed calls
            with PeakMemory(device) as peak:
                timings, cache, out = _timed_calls(once, repeat, device)
                if not repeat:
                    cache, out = once()
        else:  # CPU accounting slows every operator: one extra, untimed call
            timings, cache, out = _timed_calls(once, repeat, device)
            peak = PeakMemory(device)
            if measure_cpu_memory:
                cache = out = None
                with peak:
                    cache, out = once()
            else:
                peak.method = (
                    "not measured for this matrix on CPU (exact accounting is slow); see the capacity matrix"
                )
                if not repeat:
                    cache, out = once()
    generated = out[:, input_ids.shape[1] :].detach().cpu()
    median = statistics.median(timings) if timings else None
    perf = {
        "median_ms": median,
        "min_ms": min(timings) if timings else None,
        "timings_ms": timings,
        "generated_tokens": int(generated.shape[1]),
        "ms_per_token": None if median is None else median / max(1, generated.shape[1]),
        "incremental_peak_bytes": peak.incremental_peak_bytes,
        "peak_memory_method": peak.method,
    }
    return perf, cache, generated


def _timed_calls(
    once: Callable[[], tuple], repeat: int, device: torch.device
) -> tuple[list[float], Any, Any]:
    """``repeat`` synchronized calls of ``once``: ``(timings_ms, cache, out)`` of the last (None, None if 0)."""
    timings, cache, out = [], None, None
    for _ in range(repeat):
        cache = out = None  # the previous call's cache is freed before the next one runs
        synchronize(device)
        start = time.perf_counter()
        cache, out = once()
        synchronize(device)
        timings.append((time.perf_counter() - start) * 1000.0)
    return timings, cache, out


def fixed_continuation(
    model: Any,
    input_ids: torch.Tensor,
    continuation: torch.Tensor,
    cache: Any,
    top_k: int,
    prefilled: dict | None = None,
) -> dict:
    """Mean NLL of ``continuation`` after ``input_ids``, decoding one token at a time through ``cache``.

    Teacher-forced scoring of a fixed continuation (docs/EVAL.md): the logits after the prompt score
    ``continuation[:, 0]``, and the logits after feeding ``continuation[:, step - 1]`` score
    ``continuation[:, step]``; so every candidate is judged on the same history.

    Args:
        input_ids: ``[batch, context]`` prompt ids.
        continuation: ``[batch, n]`` token ids (the baseline's greedy tokens), ``n >= 1``.
        cache: a fresh cache object, or one already holding the prompt's float prefill when ``prefilled`` is
            given (:func:`kvlab.eval.longctx.fill_cache`).
        top_k: how many of the highest logits to record per step (the k of :func:`topk_overlap`).
        prefilled: ``{"logits": [batch, vocab], "prefill_ms": float}`` of a float prefill of ``input_ids`` that
            ``cache`` was filled from: the prompt forward is skipped and those logits score ``continuation[:, 0]``
            (every cache whose prefill attends with float K/V computes the same prefill, so it runs once per prompt).

    Returns:
        ``mean_nll`` (nats per token, the mean over all ``batch * n`` scored tokens), ``topk_ids``
        (``[n][batch][k]`` lists), ``prefill_ms`` (the prompt forward), ``decode_ms`` (median single-token
        forward: a TPOT measure without generate's overhead; None when ``n == 1``) and ``logits``
        (``[batch, n, vocab]`` float32 on the CPU: the distributions that scored each token, for
        :func:`kvlab.eval.divergence.kl_divergence`; not JSON), ``prefill_shared`` (True when ``prefilled`` was
        used; ``prefill_ms`` is then the shared prefill's) and ``prefill_states`` (``[(keys, values)]`` per layer
        after the prompt, ``[batch, kv_heads, context, head_dim]``, for a ``DynamicCache`` only: what the other
        caches of the prompt are filled from; not JSON).

    Raises:
        ValueError: ``input_ids`` or ``continuation`` not 2-D, their batch sizes differ, ``n == 0``, or ``top_k``
            not a positive integer.
    """
    _check_continuation_args(input_ids, continuation, top_k)
    device = input_ids.device
    kw = cache_kwarg(model)
    n = continuation.shape[1]
    nll_sum = 0.0
    topk_ids = []
    step_logits = []  # n x [batch, vocab]: the KL against the float cache needs whole distributions
    decode_ms = []
    with torch.inference_mode():
        if prefilled is not None:
            first_logits, prefill_ms, states = prefilled["logits"], prefilled["prefill_ms"], None
        else:
            first_logits, prefill_ms, states = _prompt_forward(model, input_ids, cache)
        last = first_logits
        for step in range(n):
            logits = last.float()  # [batch, vocab]
            target = continuation[:, step]
            nll_sum += float(F.cross_entropy(logits, target, reduction="sum"))
            topk_ids.append(logits.topk(top_k, dim=-1).indices.tolist())
            step_logits.append(logits.cpu())
            if step + 1 < n:
                synchronize(device)
                start = time.perf_counter()
                last = model(input_ids=target[:, None], use_cache=True, **{kw: cache}).logits[:, -1, :]
                synchronize(device)
                decode_ms.append((time.perf_counter() - start) * 1000.0)
    return {
        "mean_nll": nll_sum / (n * continuation.shape[0]),
        "topk_ids": topk_ids,
        "prefill_ms": prefill_ms,
        "prefill_shared": prefilled is not None,
        "decode_ms": statistics.median(decode_ms) if decode_ms else None,
        "logits": torch.stack(step_logits, dim=1),  # [batch, n, vocab] float32, on the CPU
        "prefill_states": states,
        "prefill_logits": first_logits if states is not None else None,
    }


def _check_continuation_args(input_ids: torch.Tensor, continuation: torch.Tensor, top_k: int) -> None:
    """The ``ValueError`` cases of :func:`fixed_continuation`."""
    if input_ids.dim() != 2 or continuation.dim() != 2:
        raise ValueError(
            f"`input_ids` and `continuation` must be [batch, tokens], got shapes {tuple(input_ids.shape)} and "
            f"{tuple(continuation.shape)}"
        )
    if continuation.shape[0] != input_ids.shape[0]:
        raise ValueError(
            f"`continuation` batch ({continuation.shape[0]}) must equal `input_ids` batch ({input_ids.shape[0]})"
        )
    if continuation.shape[1] == 0:
        raise ValueError("`continuation` must hold at least one token per row, got shape (batch, 0)")
    check_int("top_k", top_k, 1)


def _prompt_forward(model: Any, input_ids: torch.Tensor, cache: Any) -> tuple:
    """``(last logits [batch, vocab], prefill ms, states)`` of the prompt forward through ``cache``; ``states`` are a
    ``DynamicCache``'s K/V per layer (its layers replace, never modify, their tensors), else None."""
    device = input_ids.device
    synchronize(device)
    start = time.perf_counter()
    out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **{cache_kwarg(model): cache})
    synchronize(device)
    prefill_ms = (time.perf_counter() - start) * 1000.0
    states = None
    if type(cache).__name__ == "DynamicCache":
        states = [(layer.keys, layer.values) for layer in cache.layers]
    return out.logits[:, -1, :], prefill_ms, states


def topk_overlap(base: list, cand: list, k: int) -> float:
    """Mean over steps and batch rows of ``|topk_base ∩ topk_cand| / k`` (docs/EVAL.md).

    Args:
        base, cand: ``[steps][batch][k]`` token ids (``topk_ids`` of :func:`fixed_continuation`) of the float cache
            and of the candidate, on the same continuation.
        k: ids per step and row.

    Returns:
        A fraction in [0, 1]; NaN when there are no steps.

    Raises:
        ValueError: ``k`` not a positive integer, or ``base`` and ``cand`` differing in steps, in batch rows at a
            step, or in a row that does not hold ``k`` ids.
    """
    check_int("k", k, 1)
    if len(base) != len(cand):
        raise ValueError(f"`base` has {len(base)} steps but `cand` has {len(cand)}")
    for step, (step_b, step_c) in enumerate(zip(base, cand)):
        if len(step_b) != len(step_c):
            raise ValueError(
                f"at step {step}, `base` has {len(step_b)} batch rows but `cand` has {len(step_c)}"
            )
        for row, (b, c) in enumerate(zip(step_b, step_c)):
            if len(b) != k or len(c) != k:
                raise ValueError(
                    f"at step {step}, row {row}: expected {k} ids each, got {len(b)} and {len(c)}"
                )
    scores = [len(set(b) & set(c)) / k for step_b, step_c in zip(base, cand) for b, c in zip(step_b, step_c)]
    return statistics.mean(scores) if scores else float("nan")


def compare_outputs(base: torch.Tensor, cand: torch.Tensor) -> dict:
    """Greedy-output diagnostics of two free-running generations (docs/EVAL.md).

    Args:
        base, cand: ``[batch, n]`` token ids generated with the float cache and with the candidate.

    Returns:
        ``greedy_exact_match`` (every token equal), ``token_agreement_rate`` (fraction of the ``batch * n``
        positions that agree) and ``first_divergence_index`` (the earliest step, over all rows, at which a row
        differs; None when none does).

    Raises:
        ValueError: ``base`` and ``cand`` are not 2-D or differ in shape.
    """
    if base.dim() != 2 or base.shape != cand.shape:
        raise ValueError(
            f"`base` and `cand` must be [batch, n] of one shape, got {tuple(base.shape)} and {tuple(cand.shape)}"
        )
    matches = base == cand
    rows = [int(row.logical_not().nonzero()[0]) if not bool(row.all()) else None for row in matches]
    diverged = [r for r in rows if r is not None]
    return {
        "greedy_exact_match": bool(matches.all()),
        "token_agreement_rate": float(matches.float().mean()),
        "first_divergence_index": min(diverged) if diverged else None,
    }
