"""Long-context quality of a KV cache: in-context recall (copy) and passkey retrieval, scored through the cache.

Both probes put information far back in a prompt, prefill the prompt, then decode a continuation **one token at a
time through the cache** and score it teacher-forced: only tokens decoded after the prefill attend over what the
cache stored (a KIVI or HQQ cache attends with float K/V during its own prefill forward), so only decoded tokens
can show what a cache lost.

* **Recall (copy)**: a span of held-out text (``span_tokens`` = L) is written into held-out filler so that it
  starts ``d`` tokens before the first decoded token; the continuation is the same span. Its first token is the
  cue (decoded, not scored); tokens 2..L are scored: greedy (argmax) accuracy and mean NLL per distance. This is
  the induction / in-context copying test of Olsson et al. 2022 ("In-context learning and induction heads").
* **Passkey retrieval** (Mohtashami & Jaggi 2023, arXiv:2305.16300): a needle stating a random 5-digit key in
  held-out filler at depth p of the prompt; after the prefill, :data:`PASSKEY_QUERY` goes through the cache in one
  forward (as a chat turn's prefill would: it attends to the cache's stored history) and the answer is decoded
  one token at a time; a trial is correct when every answer token is the argmax. Accuracy per depth with a
  Wilson 95 % interval.

Placement keeps what is probed out of the newest ``residual_length + group_size`` tokens (a KIVI cache holds up
to ``R + G - 1`` newest tokens in the model dtype), so a quantized cache is judged on its quantized part.

The prefill is the same for every cache (it attends with float K/V), so :func:`prefill_states` runs it once with a
``DynamicCache`` and :func:`fill_cache` copies its K/V into each candidate: ``KIVICache.load`` for KIVI, a
replayed first ``update`` per layer otherwise (checked to return its input unchanged, as in a real prefill).
"""

from __future__ import annotations

import hashlib
import numbers
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from kvlab.eval.metrics import synchronize
from kvlab.eval.stats import wilson_interval
from kvlab.runtime.hf_api import cache_kwarg

# The templates the bundled reference model is trained on (scripts/train_reference.py writes the same strings):
# keep them byte-identical. Query and answer are tokenized together, as in training.
PASSKEY_NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUERY = " What is the pass key? The pass key is"
PASSKEY_ANSWER = " {key}"
PASSKEY_KEY_RANGE = (10000, 99999)  # random 5-digit keys, inclusive
PASSKEY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)  # needle depth: fraction of the placeable part of the prompt
RECALL_FRACTIONS = (0.25, 0.5, 0.9)  # copy distance near / mid / far, as fractions of the context
RECALL_SPAN_TOKENS = 32
# rows x context of one prefill forward: bounds the attention's working memory on a CPU
PREFILL_TOKENS_PER_CHUNK = 16384
# rows x context held by one candidate cache at a time (see run_probe: HQQ's quantizer is superlinear in size)
# 4,096 vs 8,192 on the AVX2 VM: HQQ-4's passkey fill at 512 / 256 tokens 12.3 / 5.6 s against 13.2 / 6.5 s, but the
# other caches' batched decode is slower in smaller chunks: a whole --quick run's probes cost the same either way
FILL_TOKENS_PER_CHUNK = 4096


class NotMeasurable(ValueError):
    """A probe cannot be placed in this context (too short for the span or needle outside the residual window)."""


@dataclass(frozen=True)
class Probe:
    """A batch of teacher-forced trials that share one prompt length.

    Attributes:
        kind: ``"recall"`` or ``"passkey"``.
        prompt_ids: ``[batch, context]`` ids prefilled in one forward (per chunk of rows).
        sequence: ``[batch, m]`` ids decoded one at a time after the prompt (``m >= 2``): input ``sequence[:, i]``
            predicts ``sequence[:, i + 1]``.
        scored: ``[batch, m - 1]`` bool: which predictions of ``sequence[:, 1:]`` count.
        groups: per row, the point it measures: the distance in tokens (recall) or the depth fraction (passkey).
        info: JSON-ready description: placement per group, seed, sha256 of the ids (for provenance).
        first_chunk: how many leading tokens of ``sequence`` are fed in one forward (none of them scored except
            the last's prediction); 1 = every token decoded alone.
    """

    kind: str
    prompt_ids: torch.Tensor
    sequence: torch.Tensor
    scored: torch.Tensor
    groups: tuple
    info: dict = field(default_factory=dict)
    first_chunk: int = 1  # leading sequence tokens fed in one forward (the passkey query), see decode_scores

    def __post_init__(self) -> None:
        b, m = self.sequence.shape
        assert self.prompt_ids.dim() == 2 and self.prompt_ids.shape[0] == b, "prompt/sequence batch mismatch"
        assert m >= 2 and tuple(self.scored.shape) == (b, m - 1), "scored must be [batch, m - 1]"
        assert len(self.groups) == b, "one group label per row"
        assert 1 <= self.first_chunk <= m - 1, "first_chunk must leave a prediction to decode"
        assert not bool(self.scored[:, : self.first_chunk - 1].any()), (
            "predictions inside the chunk are unscored"
        )


def _sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(t.to(torch.int64).cpu().numpy().tobytes()).hexdigest()


def _check_positive(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an ``int`` (any integer: Python, NumPy) when it is at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"`{name}` must be {what}, got {value!r}")
    return int(value)


def _check_fractions(name: str, values: Any, *, distinct: bool = False) -> tuple[float, ...]:
    """``values`` (any iterable of real numbers, read once) as a tuple of floats in [0, 1]; ``distinct`` refuses
    repeats (each depth is one group of rows)."""
    if isinstance(values, (numbers.Number, str, bytes)) or getattr(values, "ndim", None) == 0:
        raise ValueError(
            f"`{name}` must be a sequence of fractions in [0, 1], got the single value {values!r}"
        )
    try:
        values = tuple(values)
    except TypeError:
        raise ValueError(f"`{name}` must be a sequence of fractions in [0, 1], got {values!r}") from None
    if not values:
        raise ValueError(f"`{name}` must not be empty")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v <= 1:
            raise ValueError(f"`{name}` must hold fractions in [0, 1], got {v!r}")
    values = tuple(float(v) for v in values)
    if distinct and len(set(values)) != len(values):
        repeated = sorted({v for v in values if values.count(v) > 1})
        raise ValueError(
            f"`{name}` must not repeat a value (each is one group of rows), got {repeated} twice"
        )
    return values


def _check_ids(heldout_ids: Any) -> list[int]:
    """Held-out token ids as a list of ints (a float id is refused, never truncated)."""
    ids = heldout_ids.tolist() if hasattr(heldout_ids, "tolist") else list(heldout_ids)
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise ValueError(f"`heldout_ids` must hold integer token ids, got {t!r} at index {i}")
    return [int(t) for t in ids]


# ── placement ──────────────────────────────────────────────────────────────────────────────────────────────────
def recall_distances(
    context: int, span_tokens: int, protected_tail: int, fractions: Sequence[float] = RECALL_FRACTIONS
) -> list[int]:
    """Copy distances in tokens for a prompt of ``context`` tokens: ``round(f * context)`` per fraction, raised to
    at least ``span_tokens + protected_tail`` (the first copy then ends before the newest ``protected_tail``
    tokens, outside any residual window) and lowered to at most ``context - 1`` (the span starts at token >= 1);
    duplicates after clipping are dropped, ascending.

    The distance ``d`` is counted from the first copy's first token to the cue (the first decoded token, at
    position ``context``): the first copy occupies prompt positions ``[context - d, context - d + span_tokens)``.

    Raises:
        NotMeasurable: ``context - 1 < span_tokens + protected_tail`` (no distance fits).
        ValueError: a non-positive length, a negative ``protected_tail``, or a fraction outside [0, 1].
    """
    context = _check_positive("context", context)
    span_tokens = _check_positive("span_tokens", span_tokens, 2)  # the cue and at least one predicted token
    if (
        isinstance(protected_tail, bool)
        or not isinstance(protected_tail, numbers.Integral)
        or protected_tail < 0
    ):
        raise ValueError(f"`protected_tail` must be a non-negative integer, got {protected_tail!r}")
    protected_tail = int(protected_tail)
    fractions = _check_fractions("fractions", fractions)
    low, high = span_tokens + protected_tail, context - 1
    if high < low:
        raise NotMeasurable(
            f"context {context} is too short for recall: a {span_tokens}-token span outside the newest "
            f"{protected_tail} tokens needs a context of at least {low + 1}"
        )
    return sorted({min(high, max(low, round(f * context))) for f in fractions})


def needle_starts(
    context: int, needle_tokens: int, protected_tail: int, depths: Sequence[float] = PASSKEY_DEPTHS
) -> list[int]:
    """Needle start positions for depths ``p``: ``1 + round(p * (context - protected_tail - needle_tokens - 1))``.

    Depth 0 puts the needle right after the prompt's first token; depth 1 ("100 %") puts its end exactly
    ``protected_tail`` tokens before the prompt's end, i.e. as late as possible while still outside the newest
    ``protected_tail`` tokens (pass ``residual_length + group_size``: a KIVI cache keeps up to ``R + G - 1`` newest
    tokens in full precision). Depth is thus measured over the part of the prompt a compressed cache may compress.

    Raises:
        NotMeasurable: ``context - protected_tail - needle_tokens - 1 < 0`` (the needle does not fit).
        ValueError: a non-positive length, a negative ``protected_tail``, or a depth outside [0, 1].
    """
    context = _check_positive("context", context)
    needle_tokens = _check_positive("needle_tokens", needle_tokens)
    if (
        isinstance(protected_tail, bool)
        or not isinstance(protected_tail, numbers.Integral)
        or protected_tail < 0
    ):
        raise ValueError(f"`protected_tail` must be a non-negative integer, got {protected_tail!r}")
    protected_tail = int(protected_tail)
    depths = _check_fractions("depths", depths, distinct=True)
    room = context - protected_tail - needle_tokens - 1
    if room < 0:
        raise NotMeasurable(
            f"context {context} is too short for the passkey: a {needle_tokens}-token needle outside the newest "
            f"{protected_tail} tokens needs a context of at least {protected_tail + needle_tokens + 1}"
        )
    return [1 + round(p * room) for p in depths]


# ── probes ─────────────────────────────────────────────────────────────────────────────────────────────────────
def _offset(rng: random.Random, total: int, n: int, avoid: tuple[int, int] | None = None) -> int:
    """A random start of ``n`` tokens in ``[0, total)``, not overlapping ``avoid = (start, end)`` when it can."""
    if total < n:
        raise ValueError(f"the held-out text has {total} tokens, fewer than the {n} a prompt needs")
    for _ in range(100):
        start = rng.randrange(0, total - n + 1)
        if avoid is None or start + n <= avoid[0] or start >= avoid[1]:
            return start
    return start  # the text is too short to avoid it: accept an overlap


def _filler(rng: random.Random, heldout_ids: Sequence[int], n: int) -> list[int]:
    start = _offset(rng, len(heldout_ids), n)
    return list(heldout_ids[start : start + n])


def build_recall_probe(
    heldout_ids: Sequence[int],
    context: int,
    *,
    protected_tail: int,
    rows_per_distance: int = 2,
    span_tokens: int = RECALL_SPAN_TOKENS,
    fractions: Sequence[float] = RECALL_FRACTIONS,
    seed: int | str = 0,
) -> Probe:
    """Copy trials: per distance of :func:`recall_distances`, ``rows_per_distance`` prompts of ``context`` held-out
    tokens (each from a random offset) with a different held-out span of ``span_tokens`` written at that distance.

    Returns:
        A :class:`Probe` with ``prompt_ids`` ``[rows, context]``, ``sequence`` = the span ``[rows, span_tokens]``
        (the first token is the cue) and every prediction scored; rows grouped by distance (tokens).

    Raises:
        NotMeasurable: see :func:`recall_distances`.
        ValueError: bad lengths or fractions, or held-out text shorter than ``context``.
    """
    rows_per_distance = _check_positive("rows_per_distance", rows_per_distance)
    context = _check_positive("context", context)
    span_tokens = _check_positive("span_tokens", span_tokens, 2)
    fractions = _check_fractions("fractions", fractions)
    heldout_ids = _check_ids(heldout_ids)
    distances = recall_distances(context, span_tokens, protected_tail, fractions)
    rng = random.Random(f"recall-{seed}-{context}")
    prompts, spans, groups = [], [], []
    for d in distances:
        for _ in range(rows_per_distance):
            a = _offset(rng, len(heldout_ids), context)
            b = _offset(rng, len(heldout_ids), span_tokens, avoid=(a, a + context))  # a span the filler lacks
            prompt = list(heldout_ids[a : a + context])
            span = list(heldout_ids[b : b + span_tokens])
            start = context - d
            prompt[start : start + span_tokens] = span  # [context - d, context - d + L)
            prompts.append(prompt)
            spans.append(span)
            groups.append(d)
    prompt_ids = torch.tensor(prompts, dtype=torch.long)  # [rows, context]
    sequence = torch.tensor(spans, dtype=torch.long)  # [rows, L]
    info = {
        "kind": "recall",
        "context_length": context,
        "span_tokens": span_tokens,
        "distances_tokens": distances,
        "fractions": list(fractions),
        "rows_per_distance": rows_per_distance,
        "protected_tail_tokens": protected_tail,
        "seed": str(seed),
        "ids_sha256": _sha256(prompt_ids),
        "sequence_sha256": _sha256(sequence),
    }
    scored = torch.ones(len(spans), span_tokens - 1, dtype=torch.bool)
    return Probe("recall", prompt_ids, sequence, scored, tuple(groups), info)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_heldout(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a long text (no special tokens, no length warning from Hugging Face tokenizers)."""
    try:
        return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
    except TypeError:  # a minimal tokenizer without ``verbose``
        return _encode(tokenizer, text)


def passkey_tokens(tokenizer: Any, key: str) -> tuple[list[int], list[int], list[int]]:
    """``(needle, query, answer)`` token ids of one passkey trial, from the module's templates.

    Query and answer are tokenized together (as the reference model was trained); ``answer`` is what follows the
    query's own tokens (for the bundled tokenizer: ``' '`` then the 5 digit tokens).

    Raises:
        ValueError: the tokenizer merges the query's last token with the answer (the split is ambiguous), or
            gives an empty needle or answer.
    """
    needle = _encode(tokenizer, PASSKEY_NEEDLE.format(key=key))
    query = _encode(tokenizer, PASSKEY_QUERY)
    joint = _encode(tokenizer, PASSKEY_QUERY + PASSKEY_ANSWER.format(key=key))
    if joint[: len(query)] != query or len(joint) == len(query) or not needle:
        raise ValueError(
            f"this tokenizer does not split {PASSKEY_QUERY + PASSKEY_ANSWER.format(key=key)!r} after the query "
            f"({query} is not a proper prefix of {joint}): the passkey answer cannot be scored"
        )
    return needle, query, joint[len(query) :]


def build_passkey_probe(
    tokenizer: Any,
    heldout_ids: Sequence[int],
    context: int,
    *,
    protected_tail: int,
    trials: int = 20,
    depths: Sequence[float] = PASSKEY_DEPTHS,
    seed: int | str = 0,
) -> Probe:
    """Passkey trials (Mohtashami & Jaggi 2023, arXiv:2305.16300) on held-out filler: ``trials`` per depth, each
    with its own random 5-digit key and filler offset; the prompt is ``context`` tokens with the needle starting
    at :func:`needle_starts`; the decoded sequence is the query followed by the answer, of which only the answer
    tokens are scored.

    Returns:
        A :class:`Probe`: ``prompt_ids`` ``[len(depths) * trials, context]``, ``sequence`` ``[rows, q + a]``
        (answers of different token lengths are right-padded with their last token; padding is never scored),
        rows grouped by depth (fraction); ``info`` has each depth's needle start and end (tokens).

    Raises:
        NotMeasurable: the needle does not fit (see :func:`needle_starts`).
        ValueError: ``trials`` < 1, bad depths, held-out text shorter than ``context``, or a tokenizer that cannot
            separate the answer (see :func:`passkey_tokens`).
    """
    trials = _check_positive("trials", trials)
    context = _check_positive("context", context)
    depths = _check_fractions("depths", depths, distinct=True)
    heldout_ids = _check_ids(heldout_ids)
    rng = random.Random(f"passkey-{seed}-{context}")
    keys = [str(rng.randint(*PASSKEY_KEY_RANGE)) for _ in range(len(depths) * trials)]
    encoded = [passkey_tokens(tokenizer, k) for k in keys]
    needle_max = max(len(n) for n, _, _ in encoded)
    starts = needle_starts(context, needle_max, protected_tail, depths)
    prompts, sequences, scored_rows, groups = [], [], [], []
    m = max(len(q) + len(a) for _, q, a in encoded)
    for i, (needle, query, answer) in enumerate(encoded):
        depth_idx = i // trials
        start = starts[depth_idx]
        filler = _filler(rng, heldout_ids, context - len(needle))
        prompts.append(filler[:start] + needle + filler[start:])
        seq = query + answer
        seq = seq + [seq[-1]] * (m - len(seq))  # padding is fed but never scored
        sequences.append(seq)
        # prediction j scores seq[j + 1]: the answer's tokens are predictions len(query) - 1 ... len(query) + a - 2
        scored_rows.append([len(query) - 1 <= j < len(query) + len(answer) - 1 for j in range(m - 1)])
        groups.append(float(depths[depth_idx]))
    prompt_ids = torch.tensor(prompts, dtype=torch.long)  # [rows, context]
    sequence = torch.tensor(sequences, dtype=torch.long)  # [rows, m]
    info = {
        "kind": "passkey",
        "context_length": context,
        "trials_per_depth": trials,
        "depths": [float(p) for p in depths],
        "needle_start_tokens": starts,
        "needle_end_tokens": [s + needle_max for s in starts],
        "needle_tokens": needle_max,
        "protected_tail_tokens": protected_tail,
        "templates": {"needle": PASSKEY_NEEDLE, "query": PASSKEY_QUERY, "answer": PASSKEY_ANSWER},
        "seed": str(seed),
        "ids_sha256": _sha256(prompt_ids),
        "sequence_sha256": _sha256(sequence),
    }
    # the query (identical in every row) goes through the cache in one forward, the answer token by token
    query_tokens = min(len(q) for _, q, _ in encoded)
    info["query_tokens"] = query_tokens
    return Probe(
        "passkey",
        prompt_ids,
        sequence,
        torch.tensor(scored_rows, dtype=torch.bool),
        tuple(groups),
        info,
        first_chunk=query_tokens,
    )


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
        rec = {k: v for k, v in cand["recall"].items() if k not in ("fill_ms", "decode_ms")}
        rec["distances"] = [dict(d) for d in rec["distances"]]
        out.update({"recall": rec, "recall_accuracy": rec["accuracy"], "recall_nll": rec["mean_nll"]})
        if base is not None and "recall" in base:
            b = {d["distance_tokens"]: d for d in base["recall"]["distances"]}
            if set(b) != {d["distance_tokens"] for d in rec["distances"]}:
                raise ValueError(f"recall distances differ: base {sorted(b)}, candidate {rec['distances']}")
            for d in rec["distances"]:
                d["accuracy_drop"] = b[d["distance_tokens"]]["accuracy"] - d["accuracy"]
            out["recall_drop"] = max(d["accuracy_drop"] for d in rec["distances"])
            out["recall_nll_delta"] = rec["mean_nll"] - base["recall"]["mean_nll"]
    if "passkey" in cand:
        pk = {k: v for k, v in cand["passkey"].items() if k not in ("fill_ms", "decode_ms")}
        pk["depths"] = [dict(d) for d in pk["depths"]]
        out.update({"passkey": pk, "passkey_accuracy": pk["accuracy"]})
        if base is not None and "passkey" in base:
            b = {d["depth"]: d for d in base["passkey"]["depths"]}
            if set(b) != {d["depth"] for d in pk["depths"]}:
                raise ValueError(f"passkey depths differ: base {sorted(b)}, candidate {pk['depths']}")
            for d in pk["depths"]:
                d["accuracy_drop"] = b[d["depth"]]["accuracy"] - d["accuracy"]
            out["passkey_drop"] = base["passkey"]["accuracy"] - pk["accuracy"]
    return out


def heldout_probes(
    tokenizer: Any,
    context: int,
    *,
    protected_tail: int,
    passkey_trials: int = 20,
    recall_rows: int = 2,
    seed: int | str = 0,
) -> dict[str, Probe]:
    """Both probes at one context on the bundled model's held-out text (``kvlab.models.heldout_text``), e.g.
    ``measure_long_context(model, make_cache, heldout_probes(tokenizer, 512, protected_tail=160))``.

    Raises:
        NotMeasurable: the context is too short for either probe.
        FileNotFoundError: the bundled model's held-out text is missing.
    """
    from kvlab.models import heldout_text

    ids = encode_heldout(tokenizer, heldout_text())
    return {
        "recall": build_recall_probe(
            ids, context, protected_tail=protected_tail, rows_per_distance=recall_rows, seed=seed
        ),
        "passkey": build_passkey_probe(
            tokenizer, ids, context, protected_tail=protected_tail, trials=passkey_trials, seed=seed
        ),
    }
