"""Prefill once, ask many: the long-context tasks of :mod:`kvlab.tasks` through every candidate KV cache.

For one task cell (a task at a context length, ``n`` samples) the contexts are prefilled **once**, with a float
``DynamicCache`` (:func:`prefill_with_queries`); every candidate cache is then filled from that prefill
(:func:`fill_from_prefill`) without running the model over the context again:

* a cache whose prefill stores what it is given (``DynamicCache``, KIVI, FP8, HQQ, the sink cache, the test-only
  damaged caches) gets the float K/V as :func:`kvlab.eval.longctx.fill_cache` gives them (KIVI quantizes on
  load, a sink cache evicts);
* a cache that scores the prompt with the model's queries (SnapKV, TOVA, SnapKV under KIVI: ``needs_own_prefill``)
  gets each layer's K/V by its own ``update`` and then the prefill's last queries, captured from kvlab attention
  during the float prefill (the forward context's observers, :mod:`kvlab.attention.context`), as its own prefill
  would hand them: it compresses the prefilled context exactly as after a real prefill (a test checks it).

The question is then appended (one forward through the cache, never compressed by it: SnapKV compresses only its
prefill) and the answer greedy-decoded. So this measures **question-agnostic compression**: the cache decides what
to keep before the question exists, as kvpress evaluates presses (NVIDIA kvpress, ``evaluation/``: compress the
context, then append the question). TOVA keeps evicting while the question and answer go through it (its method
evicts at every step). The cost of a cell is one prefill per context and sample, not one per cache.

Scores are RULER's (:mod:`kvlab.tasks.scoring`, arXiv:2404.06654): the mean ``string_match_all`` over samples, and
the share of samples with every reference found, with a Wilson interval (:func:`kvlab.eval.stats.wilson_interval`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvlab.caches.measure import cache_nbytes
from kvlab.eval.longctx import PREFILL_TOKENS_PER_CHUNK, fill_cache
from kvlab.eval.stats import wilson_interval
from kvlab.runtime.hf_api import cache_kwarg
from kvlab.tasks import Sample, sample_score
from kvlab.tasks.tokens import as_tokenizer

QUERY_WINDOW = (
    64  # prefill queries kept per layer for the query-scored caches (SnapKV's window is 32 by default)
)


def _window_needed(caches: Sequence[Any]) -> int:
    """Queries the query-scored caches among ``caches`` read from the prefill (SnapKV: its window; TOVA: 1)."""
    need = 1
    for c in caches:
        cfg = getattr(c, "snapkv_config", None)
        if cfg is not None:
            need = max(need, cfg.window_size)
    return need


def prefill_with_queries(
    model: Any, context_ids: torch.Tensor, query_window: int = 0
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[torch.Tensor, float]] | None]:
    """One float prefill of ``context_ids`` (``DynamicCache``), in chunks of rows as
    :func:`kvlab.eval.longctx.prefill_states`, keeping each layer's last ``query_window`` queries when > 0.

    Args:
        context_ids: ``[batch, context]`` on the model's device.
        query_window: queries to keep per layer (0: none); needs :func:`kvlab.attention.enable` on the model.

    Returns:
        ``(states, queries)``: ``[(keys, values)]`` per layer, ``[batch, kv_heads, context, head_dim]``; and
        ``[(query, scale)]`` per layer, ``query [batch, q_heads, min(window, context), head_dim]`` (None when
        ``query_window`` is 0).

    Raises:
        RuntimeError: ``query_window > 0`` on a model without kvlab attention (no query reached the prefill).
    """
    from transformers import DynamicCache

    from kvlab.attention.context import forward_context

    kw, layers = cache_kwarg(model), model.config.num_hidden_layers
    rows = max(1, PREFILL_TOKENS_PER_CHUNK // context_ids.shape[1])
    chunks, queries = [], []
    with torch.inference_mode():
        for i in range(0, context_ids.shape[0], rows):
            got: dict[int, tuple[torch.Tensor, float]] = {}
            cache = DynamicCache()
            with (
                forward_context() as ctx
            ):  # the model's forward joins it: the observers are set before it runs
                for idx in range(layers if query_window else 0):

                    def keep(query, key, scale, idx=idx, got=got):
                        got[idx] = (query[..., -query_window:, :].clone(), scale or query.shape[-1] ** -0.5)

                    ctx.observers[idx] = keep
                model(input_ids=context_ids[i : i + rows], use_cache=True, logits_to_keep=1, **{kw: cache})
            if query_window and len(got) < layers:
                raise RuntimeError(
                    "the prefill's queries never reached kvlab (run kvlab.attention.enable(model) first)"
                )
            chunks.append([(layer.keys, layer.values) for layer in cache.layers])
            queries.append([got[idx] for idx in range(layers)] if query_window else None)
    states = [
        (torch.cat([c[i][0] for c in chunks]), torch.cat([c[i][1] for c in chunks]))
        for i in range(len(chunks[0]))
    ]
    if not query_window:
        return states, None
    return states, [(torch.cat([q[i][0] for q in queries]), queries[0][i][1]) for i in range(layers)]


def fill_from_prefill(
    cache: Any,
    states: Sequence[tuple[torch.Tensor, torch.Tensor]],
    queries: Sequence[tuple[torch.Tensor, float]] | None = None,
) -> Any:
    """Fill an empty ``cache`` from a float prefill as its own prefill would; returns ``cache``.

    A query-scored cache (``needs_own_prefill``) gets one ``update`` per layer and then, for the request that
    update leaves in the forward context's observers (:mod:`kvlab.attention.context`), the prefill's queries of that
    layer, so it compresses as after a real prefill. Any other cache goes through :func:`kvlab.eval.longctx.fill_cache`.

    Args:
        states: ``[(keys, values)]`` per layer, ``[batch, kv_heads, tokens, head_dim]``.
        queries: ``[(query [batch, q_heads, w, head_dim], scale)]`` per layer (:func:`prefill_with_queries`).

    Raises:
        ValueError: a query-scored cache without ``queries``, or queries of another batch; as ``fill_cache``.
    """
    if not getattr(cache, "needs_own_prefill", False):
        return fill_cache(cache, states)
    from kvlab.attention.context import forward_context

    if queries is None or len(queries) != len(states):
        raise ValueError(
            f"{type(cache).__name__} scores the prompt with its queries: pass the prefill's queries"
        )
    with torch.inference_mode(), forward_context() as ctx:  # as a prefill's forward would hold the requests
        for idx, ((keys, values), (query, scale)) in enumerate(zip(states, queries)):
            if query.shape[0] != keys.shape[0]:
                raise ValueError(f"queries of batch {query.shape[0]} for K/V of batch {keys.shape[0]}")
            out_k, _ = cache.update(keys, values, idx)
            request = ctx.observers.pop(idx, None)
            if request is not None:
                request(query, out_k, scale)
    return cache


def greedy_answer(
    model: Any, cache: Any, question_ids: torch.Tensor, max_new_tokens: int, stop_id: int | None
):
    """Append ``question_ids`` ``[batch, q]`` to a filled ``cache`` in one forward and greedy-decode
    ``max_new_tokens`` tokens (all rows stop early once each has produced ``stop_id``).

    Returns:
        ``[batch, new]`` int64 token ids (``new <= max_new_tokens``) on the CPU.
    """
    kw = cache_kwarg(model)
    out = []
    with torch.inference_mode():
        logits = model(input_ids=question_ids, use_cache=True, logits_to_keep=1, **{kw: cache}).logits
        for step in range(max_new_tokens):
            nxt = logits[:, -1, :].argmax(dim=-1, keepdim=True)  # [batch, 1]
            out.append(nxt)
            done = stop_id is not None and bool((torch.cat(out, dim=1) == stop_id).any(dim=1).all())
            if done or step == max_new_tokens - 1:
                break
            logits = model(input_ids=nxt, use_cache=True, **{kw: cache}).logits
    return torch.cat(out, dim=1).cpu()


def _groups(samples: Sequence[Sample], q: int) -> dict[int, list[int]]:
    """Rows asking a question ``q`` grouped by its token length (one batched decode per group)."""
    out: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        if q < len(s.questions):
            out.setdefault(len(s.questions[q].ids), []).append(i)
    return out


def _answer_rows(model, tok, make, samples, rows, q, states, queries, stop_id) -> tuple[list[dict], int, int]:
    """One candidate on ``rows`` of a cell: fill, measure its bytes, ask question ``q``, score each row."""
    device = next(model.parameters()).device
    index = torch.tensor(rows, device=states[0][0].device)
    part = [(k.index_select(0, index), v.index_select(0, index)) for k, v in states]
    mine = None if queries is None else [(x.index_select(0, index), s) for x, s in queries]
    cache = fill_from_prefill(make(), part, mine)
    nbytes = cache_nbytes(cache)
    float_bytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in part)
    question = [samples[r].questions[q] for r in rows]
    ids = torch.tensor([list(x.ids) for x in question], dtype=torch.long, device=device)
    answers = greedy_answer(model, cache, ids, max(x.max_new_tokens for x in question), stop_id)
    out = []
    for r, x, a in zip(rows, question, answers.tolist()):
        if stop_id is not None and stop_id in a:
            a = a[: a.index(stop_id)]
        text = tok.decode(a[: x.max_new_tokens])
        score, correct = sample_score(text, x.references, x.metric)
        out.append({"sample": r, "question": q, "score": score, "correct": correct, "output": text})
    return out, nbytes, float_bytes


def summarize(trials: Sequence[dict], confidence: float = 0.95) -> dict:
    """A cache's scores on one cell: ``score`` (RULER's mean), ``correct`` / ``trials`` (every reference found)
    with a Wilson ``ci95`` interval.

    Raises:
        ValueError: no trials.
    """
    if not trials:
        raise ValueError("no trials to summarize")
    k, n = sum(bool(t["correct"]) for t in trials), len(trials)
    return {
        "score": sum(t["score"] for t in trials) / n,
        "correct": k,
        "trials": n,
        "ci95": list(wilson_interval(k, n, confidence)),
    }


def run_task_cell(
    model: Any,
    tokenizer: Any,
    samples: Sequence[Sample],
    caches: dict[str, Callable[[], Any]],
    *,
    stop_id: int | None = None,
    keep_outputs: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Every cache of ``caches`` (name -> factory of a fresh, empty cache) on one cell: the samples' contexts
    prefilled once (float), each cache filled from that prefill, every question asked through it.

    Args:
        samples: one task at one context length (:func:`kvlab.tasks.generate`): contexts of one token length.
        stop_id: a token that ends an answer (the model's EOS), or None.
        keep_outputs: keep each answer (text, score) in ``answers``.
        progress: called with one line as the float prefill starts and one as each cache starts (``k/K``), so a
            long cell says what it is doing.

    Returns:
        ``{"prefill_ms", "context_tokens", "samples", "caches": {name: {**summarize(...), "bytes",
        "float_bytes", "cache_bytes_ratio", "ms", "answers"?}}}``: bytes are those each cache holds after its fill
        (the compressed context), ``cache_bytes_ratio`` = cache bytes / float bytes (< 1: smaller than the float
        cache), as ``kvlab eval``'s ``cache_bytes_ratio``.

    Raises:
        ValueError: no samples, contexts of different lengths, or no caches.
    """
    if not samples or not caches:
        raise ValueError(f"need samples and caches, got {len(samples)} samples and {len(caches)} caches")
    lengths = {len(s.context_ids) for s in samples}
    if len(lengths) != 1:
        raise ValueError(f"the samples of one cell must share a context length, got {sorted(lengths)}")
    tok, device = as_tokenizer(tokenizer), next(model.parameters()).device
    window = _window_needed([make() for make in caches.values()])
    from kvlab.attention.interface import is_enabled

    say = progress or (lambda line: None)
    start = time.perf_counter()
    ids = torch.tensor([list(s.context_ids) for s in samples], dtype=torch.long, device=device)
    say(f"float prefill, {ids.shape[0]} samples x {ids.shape[1]} tokens")
    states, queries = prefill_with_queries(model, ids, max(QUERY_WINDOW, window) if is_enabled(model) else 0)
    assert queries is None or queries[0][0].shape[-2] >= min(window, ids.shape[1])
    out = {"prefill_ms": (time.perf_counter() - start) * 1000.0, "context_tokens": ids.shape[1]}
    out["samples"], out["caches"] = len(samples), {}
    questions = max(len(s.questions) for s in samples)
    for k, (name, make) in enumerate(caches.items(), 1):
        say(f"cache {k}/{len(caches)} {name}")
        t0, trials, nbytes, float_bytes = time.perf_counter(), [], 0, 0
        for q in range(questions):
            for rows in _groups(samples, q).values():
                got, b, fb = _answer_rows(model, tok, make, samples, rows, q, states, queries, stop_id)
                trials += got
                nbytes, float_bytes = (nbytes + b, float_bytes + fb) if q == 0 else (nbytes, float_bytes)
        row = summarize(trials)
        ratio = nbytes / max(float_bytes, 1)
        row.update({"bytes": nbytes, "float_bytes": float_bytes, "cache_bytes_ratio": ratio})
        row["ms"] = (time.perf_counter() - t0) * 1000.0
        if keep_outputs:
            row["answers"] = trials
        out["caches"][name] = row
    return out


