"""Scoring a long-context :class:`~kvlab.eval.longctx.prompts.Probe` through a KV cache: one float prefill shared by
every cache (:func:`prefill_states`, :func:`fill_cache`), then the continuation decoded one token at a time through
the cache and scored teacher-forced (:func:`run_probe`), and the result-row fields (:func:`long_context_fields`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from kvlab.eval.longctx.prompts import Probe
from kvlab.eval.stats import wilson_interval
from kvlab.runtime.device import synchronize
from kvlab.runtime.hf_api import cache_kwarg

# rows x context of one prefill forward: bounds the attention's working memory on a CPU
PREFILL_TOKENS_PER_CHUNK = 16384
# rows x context held by one candidate cache at a time (see run_probe: HQQ's quantizer is superlinear in size)
# 4,096 vs 8,192 on the AVX2 VM: HQQ-4's passkey fill at 512 / 256 tokens 12.3 / 5.6 s against 13.2 / 6.5 s, but the
# other caches' batched decode is slower in smaller chunks: a whole --quick run's probes cost the same either way
FILL_TOKENS_PER_CHUNK = 4096


# ── scoring through a cache ────────────────────────────────────────────────────────────────────────────────────
def token_scores(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position NLL and greedy hit of ``targets`` under ``logits``.

    Args:
        logits: ``[batch, steps, vocab]``; position ``(b, s)`` is the next-token distribution that scores
            ``targets[b, s]``.
        targets: ``[batch, steps]`` token ids.

    Returns:
        ``(nll, hit)``: ``[batch, steps]`` float32 NLL in nats (``-log softmax(logits)[target]``) and bool
        ``argmax(logits) == target`` (the first maximal id on ties, as ``torch.argmax``).

    Raises:
        ValueError: shapes that do not match, or a target outside the vocabulary.
    """
    if logits.dim() != 3 or targets.dim() != 2 or tuple(logits.shape[:2]) != tuple(targets.shape):
        raise ValueError(
            f"`logits` must be [batch, steps, vocab] and `targets` [batch, steps], got {tuple(logits.shape)} "
            f"and {tuple(targets.shape)}"
        )
    vocab = logits.shape[-1]
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        raise ValueError(f"`targets` must be token ids in [0, {vocab}), got {targets.min()}..{targets.max()}")
    flat = logits.float().reshape(-1, vocab)  # [B*S, V]
    nll = F.cross_entropy(flat, targets.reshape(-1), reduction="none").reshape(targets.shape)
    hit = logits.argmax(dim=-1) == targets
    return nll, hit


def prefill_states(model: Any, prompt_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Prefill ``prompt_ids`` with a float ``DynamicCache`` and return its K/V per layer.

    Rows are prefilled in chunks of at most :data:`PREFILL_TOKENS_PER_CHUNK` rows x tokens (one forward each) and
    concatenated along the batch.

    Args:
        prompt_ids: ``[batch, context]`` on the model's device.

    Returns:
        ``[(keys, values)]`` per layer, each ``[batch, kv_heads, context, head_dim]`` in the model dtype.
    """
    from transformers import DynamicCache

    kw = cache_kwarg(model)
    rows = max(1, PREFILL_TOKENS_PER_CHUNK // prompt_ids.shape[1])
    chunks = []
    with torch.inference_mode():
        for i in range(0, prompt_ids.shape[0], rows):
            cache = DynamicCache()
            model(input_ids=prompt_ids[i : i + rows], use_cache=True, logits_to_keep=1, **{kw: cache})
            chunks.append([(layer.keys, layer.values) for layer in cache.layers])
    if len(chunks) == 1:
        return chunks[0]
    return [
        (torch.cat([c[i][0] for c in chunks]), torch.cat([c[i][1] for c in chunks]))
        for i in range(len(chunks[0]))
    ]


def fill_cache(cache: Any, states: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """Write a float prefill's K/V into an empty ``cache`` as its own prefill would; returns ``cache``.

    A cache with ``load`` (``KIVICache``) loads them; any other transformers ``Cache`` gets one ``update`` per
    layer, which must return its input unchanged: that is what makes the shared prefill equal to the cache's own
    (the prefill attends with float K/V; ``DynamicCache``, transformers' ``QuantizedCache`` and sliding-window
    layers all do this).

    Args:
        states: ``[(keys, values)]`` per layer, ``[batch, kv_heads, tokens, head_dim]`` (from :func:`prefill_states`).

    Raises:
        ValueError: the cache's first update returns something other than its input (its own prefill would attend
            to different K/V; run a real prefill for it instead).
    """
    if hasattr(cache, "load"):
        cache.load(states)
        return cache
    with torch.inference_mode():
        for idx, (keys, values) in enumerate(states):
            out_k, out_v = cache.update(keys, values, idx)
            if out_k.shape != keys.shape or not torch.equal(out_k, keys) or not torch.equal(out_v, values):
                raise ValueError(
                    f"{type(cache).__name__}.update on an empty layer {idx} returned K/V of shape "
                    f"{tuple(out_k.shape)} that differ from its input {tuple(keys.shape)}: its prefill cannot be "
                    f"shared with the float cache's"
                )
    return cache


def decode_scores(model: Any, cache: Any, sequence: torch.Tensor, first_chunk: int = 1) -> dict:
    """Feed ``sequence`` through ``cache`` (already holding the prompt) and score each next token teacher-forced:
    the first ``first_chunk`` tokens in one forward (a chunk attending to the cache's stored history and, causally,
    to itself, as the prefill of a chat turn would), then one token at a time.

    Args:
        sequence: ``[batch, m]`` ids, ``m >= 2``: the logits after feeding ``sequence[:, i]`` score
            ``sequence[:, i + 1]``.
        first_chunk: tokens fed in the first forward, in ``[1, m - 1]`` (1: every token decoded alone).

    Returns:
        ``nll`` ``[batch, m - 1]`` float32 (nats), ``hit`` ``[batch, m - 1]`` bool (greedy argmax equals the
        target), ``decode_ms`` (total wall time of the ``m - first_chunk`` forwards).

    Raises:
        ValueError: ``sequence`` not ``[batch, m]`` with ``m >= 2``, or ``first_chunk`` outside ``[1, m - 1]``.
    """
    if sequence.dim() != 2 or sequence.shape[1] < 2:
        raise ValueError(f"`sequence` must be [batch, m] with m >= 2, got {tuple(sequence.shape)}")
    m = sequence.shape[1]
    if isinstance(first_chunk, bool) or not isinstance(first_chunk, int) or not 1 <= first_chunk <= m - 1:
        raise ValueError(f"`first_chunk` must be an integer in [1, {m - 1}], got {first_chunk!r}")
    kw = cache_kwarg(model)
    device = next(model.parameters()).device
    sequence = sequence.to(device)
    nll, hit = [], []
    with torch.inference_mode():
        synchronize(device)
        start = time.perf_counter()
        i = 0
        while i < m - 1:
            n = first_chunk if i == 0 else 1
            out = model(input_ids=sequence[:, i : i + n], use_cache=True, **{kw: cache})
            # score now, keep no [batch, vocab] logits around (a 150k vocabulary at batch 100 is 60 MB a step)
            step_nll, step_hit = token_scores(
                out.logits[:, -n:, :], sequence[:, i + 1 : i + 1 + n]
            )  # [batch, n]
            nll.append(step_nll)
            hit.append(step_hit)
            i += n
        synchronize(device)
        decode_ms = (time.perf_counter() - start) * 1000.0
    return {"nll": torch.cat(nll, dim=1).cpu(), "hit": torch.cat(hit, dim=1).cpu(), "decode_ms": decode_ms}


# ── summaries ──────────────────────────────────────────────────────────────────────────────────────────────────
def recall_metrics(nll: torch.Tensor, hit: torch.Tensor, scored: torch.Tensor, groups: Sequence) -> dict:
    """Copy accuracy and mean NLL per distance and over all scored predictions.

    Args:
        nll: ``[batch, n]`` nats; ``hit``: ``[batch, n]`` bool; ``scored``: ``[batch, n]`` bool.
        groups: per row, its distance (tokens).

    Returns:
        ``{"accuracy", "mean_nll", "scored_tokens", "distances": [{"distance_tokens", "rows", "scored_tokens",
        "accuracy", "mean_nll"}, ...]}``: accuracy is the fraction of scored predictions whose argmax is the
        target; every scored token of every row weighs the same.

    Raises:
        ValueError: shapes differ, ``len(groups)`` is not the batch, or nothing is scored.
    """
    _check_scores(nll, hit, scored, groups)
    per = []
    for g in sorted(set(groups)):
        rows = torch.tensor([x == g for x in groups])
        mask = scored & rows[:, None]
        per.append(
            {
                "distance_tokens": g,
                "rows": int(rows.sum()),
                "scored_tokens": int(mask.sum()),
                "accuracy": float(hit[mask].double().mean()),
                "mean_nll": float(nll[mask].double().mean()),
            }
        )
    return {
        "accuracy": float(hit[scored].double().mean()),
        "mean_nll": float(nll[scored].double().mean()),
        "scored_tokens": int(scored.sum()),
        "distances": per,
    }


def passkey_metrics(
    hit: torch.Tensor, scored: torch.Tensor, groups: Sequence, confidence: float = 0.95
) -> dict:
    """Passkey accuracy per depth with a Wilson interval, and over all trials.

    Args:
        hit: ``[batch, n]`` bool; ``scored``: ``[batch, n]`` bool, the answer's predictions of each row.
        groups: per row (trial), its depth (fraction).

    Returns:
        ``{"accuracy", "correct", "trials", "ci95", "depths": [{"depth", "trials", "correct", "accuracy",
        "ci95": [low, high]}, ...]}``: a trial is correct when every scored prediction of its row is a hit
        (Mohtashami & Jaggi 2023); the overall accuracy is the mean over depths (each depth weighs the same).

    Raises:
        ValueError: shapes differ, ``len(groups)`` is not the batch, or a row has no scored prediction.
    """
    _check_scores(hit.float(), hit, scored, groups)
    if not bool(scored.any(dim=1).all()):
        raise ValueError(
            f"every passkey row needs a scored answer; rows {torch.nonzero(~scored.any(1)).flatten().tolist()} have none"
        )
    correct = (hit | ~scored).all(dim=1)  # [batch]: every answer token is the argmax
    per = []
    for g in sorted(set(groups)):
        rows = torch.tensor([x == g for x in groups])
        k, n = int(correct[rows].sum()), int(rows.sum())
        per.append(
            {
                "depth": g,
                "trials": n,
                "correct": k,
                "accuracy": k / n,
                "ci95": list(wilson_interval(k, n, confidence)),
            }
        )
    k, n = int(correct.sum()), len(groups)
    return {
        "accuracy": sum(p["accuracy"] for p in per) / len(per),
        "correct": k,
        "trials": n,
        "ci95": list(wilson_interval(k, n, confidence)),
        "depths": per,
    }


def _check_scores(nll, hit, scored, groups) -> None:
    if nll.dim() != 2 or nll.shape != hit.shape or nll.shape != scored.shape:
        raise ValueError(
            f"`nll`, `hit` and `scored` must be [batch, n] of one shape, got {tuple(nll.shape)}, "
            f"{tuple(hit.shape)} and {tuple(scored.shape)}"
        )
    if len(groups) != nll.shape[0]:
        raise ValueError(f"`groups` has {len(groups)} labels for a batch of {nll.shape[0]}")
    if not bool(scored.any()):
        raise ValueError("nothing is scored")


# ── one call per cache ─────────────────────────────────────────────────────────────────────────────────────────
def run_probe(
    model: Any,
    probe: Probe,
    make_cache: Callable[[], Any],
    states: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> dict:
    """Score one probe through fresh caches from ``make_cache``: fill each with the prompt's float prefill
    (``states`` from :func:`prefill_states`, computed here when None), decode the sequence, summarize.

    Rows go through the cache in chunks of at most :data:`FILL_TOKENS_PER_CHUNK` rows x context tokens, a fresh
    cache per chunk (every row is independent, so the scores do not depend on the chunking): HQQ's quantizer
    slows down more than linearly with the tensor it quantizes (100 passkey prompts of 512 tokens: 47 s in one
    piece, 9 s in chunks of 10 on a busy 2-core CPU), while batched decoding favours large chunks.

    Returns:
        :func:`recall_metrics` or :func:`passkey_metrics` of the probe, plus ``fill_ms`` and ``decode_ms`` (summed
        over chunks).

    Raises:
        ValueError: from :func:`fill_cache` (a cache whose prefill cannot be shared).
    """
    device = next(model.parameters()).device
    if states is None:
        states = prefill_states(model, probe.prompt_ids.to(device))
    rows = max(1, FILL_TOKENS_PER_CHUNK // probe.prompt_ids.shape[1])
    nll, hit, fill_ms, decode_ms = [], [], 0.0, 0.0
    for i in range(0, probe.prompt_ids.shape[0], rows):
        start = time.perf_counter()
        cache = make_cache()
        if getattr(
            cache, "needs_own_prefill", False
        ):  # scores the prompt with its queries (SnapKV): a real prefill
            with torch.inference_mode():
                model(
                    input_ids=probe.prompt_ids[i : i + rows].to(device),
                    use_cache=True,
                    **{cache_kwarg(model): cache},
                )
        else:
            cache = fill_cache(cache, [(k[i : i + rows], v[i : i + rows]) for k, v in states])
        fill_ms += (time.perf_counter() - start) * 1000.0
        scores = decode_scores(model, cache, probe.sequence[i : i + rows], probe.first_chunk)
        del cache
        nll.append(scores["nll"])
        hit.append(scores["hit"])
        decode_ms += scores["decode_ms"]
    nll, hit = torch.cat(nll), torch.cat(hit)  # [batch, m - 1]
    if probe.kind == "recall":
        out = recall_metrics(nll, hit, probe.scored, probe.groups)
    else:
        out = passkey_metrics(hit, probe.scored, probe.groups)
    out.update({"fill_ms": fill_ms, "decode_ms": decode_ms})
    return out


def measure_long_context(
    model: Any,
    make_cache: Callable[[], Any],
    probes: dict[str, Probe],
    states: dict[str, Sequence[tuple[torch.Tensor, torch.Tensor]]] | None = None,
) -> dict:
    """Recall and passkey of one cache, e.g. ``measure_long_context(model, DynamicCache, probes)``.

    Args:
        make_cache: returns a fresh, empty cache (``DynamicCache``, ``KIVICache(...)``, a test-only damaged cache).
            A ``KIVICache(attention="fused")`` needs :func:`kvlab.attention.enable` on the model first.
        probes: ``{"recall": Probe, "passkey": Probe}`` (either may be missing), from :func:`build_recall_probe` /
            :func:`build_passkey_probe`.
        states: the float prefill per probe name (:func:`prefill_states`), shared between caches; computed when
            missing.

    Returns:
        ``{name: run_probe(...)}`` per probe: :func:`recall_metrics` / :func:`passkey_metrics` plus ``fill_ms`` and
        ``decode_ms`` (milliseconds).

    Raises:
        ValueError: from :func:`fill_cache`, a cache whose own prefill would attend to other K/V than the float
            cache's (its prefill cannot be shared).
        RuntimeError: a ``KIVICache(attention="fused")`` on a model without kvlab attention.
    """
    states = states or {}
    return {name: run_probe(model, probe, make_cache, states.get(name)) for name, probe in probes.items()}


# ── row fields ─────────────────────────────────────────────────────────────────────────────────────────────────
def long_context_fields(cand: dict, base: dict | None = None) -> dict:
    """The result-row fields of one cache's :func:`measure_long_context` output, paired with the float cache's.

    Args:
        cand: ``{"recall": ..., "passkey": ...}`` of the cache (either key may be missing).
        base: the same for the float ``DynamicCache`` on the same probes; None for the baseline's own row.

    Returns:
        ``recall`` / ``passkey`` (the full per-distance / per-depth dicts, without timings), ``recall_accuracy``,
        ``recall_nll`` (nats), ``passkey_accuracy``, ``long_context_ms`` (fill + decode, all probes), and when
        ``base`` is given: ``recall_drop`` (base minus candidate copy accuracy at the worst distance; each
        distance's drop is also in ``recall["distances"][i]["accuracy_drop"]``), ``recall_nll_delta`` (nats,
        candidate minus base), ``passkey_drop`` (base minus candidate passkey accuracy, mean over depths; each
        depth's in ``passkey["depths"][i]["accuracy_drop"]``). Positive drops are losses.

    Raises:
        ValueError: ``cand`` and ``base`` were measured on different distances or depths (not paired).
    """
    out: dict = {
        "long_context_ms": sum(v.get("fill_ms", 0.0) + v.get("decode_ms", 0.0) for v in cand.values())
    }
    if "recall" in cand:
        rec = _probe_record(cand, base, "recall", "distances", "distance_tokens")
        out.update({"recall": rec, "recall_accuracy": rec["accuracy"], "recall_nll": rec["mean_nll"]})
        if base is not None and "recall" in base:
            out["recall_drop"] = max(d["accuracy_drop"] for d in rec["distances"])
            out["recall_nll_delta"] = rec["mean_nll"] - base["recall"]["mean_nll"]
    if "passkey" in cand:
        pk = _probe_record(cand, base, "passkey", "depths", "depth")
        out.update({"passkey": pk, "passkey_accuracy": pk["accuracy"]})
        if base is not None and "passkey" in base:
            out["passkey_drop"] = base["passkey"]["accuracy"] - pk["accuracy"]
    return out


def _probe_record(cand: dict, base: dict | None, probe: str, points: str, key: str) -> dict:
    """``cand[probe]`` without its timings and with its ``points`` (per-distance / per-depth dicts) copied; when
    ``base`` holds the same probe, each point gains ``accuracy_drop`` (base minus candidate accuracy at the base
    point of the same ``key``).

    Raises:
        ValueError: the two records hold different ``key`` values (``recall distances differ: ...``).
    """
    rec = {k: v for k, v in cand[probe].items() if k not in ("fill_ms", "decode_ms")}
    rec[points] = [dict(p) for p in rec[points]]
    if base is not None and probe in base:
        b = {p[key]: p for p in base[probe][points]}
        if set(b) != {p[key] for p in rec[points]}:
            raise ValueError(f"{probe} {points} differ: base {sorted(b)}, candidate {rec[points]}")
        for p in rec[points]:
            p["accuracy_drop"] = b[p[key]]["accuracy"] - p["accuracy"]
    return rec
