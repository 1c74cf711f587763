"""The long-context probes' prompts: recall (copy) spans and passkey needles placed in held-out filler, away from
the newest ``protected_tail`` tokens, as teacher-forced :class:`Probe` batches (:mod:`kvlab.eval.longctx`)."""

from __future__ import annotations

import hashlib
import numbers
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kvlab.runtime.checks import check_int

# The templates the bundled reference model is trained on (scripts/train_reference.py writes the same strings):
# keep them byte-identical. Query and answer are tokenized together, as in training.
PASSKEY_NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUERY = " What is the pass key? The pass key is"
PASSKEY_ANSWER = " {key}"
PASSKEY_KEY_RANGE = (10000, 99999)  # random 5-digit keys, inclusive
PASSKEY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)  # needle depth: fraction of the placeable part of the prompt
RECALL_FRACTIONS = (0.25, 0.5, 0.9)  # copy distance near / mid / far, as fractions of the context
RECALL_SPAN_TOKENS = 32


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


def _check_tail(protected_tail: Any) -> int:
    """``protected_tail`` (the newest tokens no probe may touch) as an int.

    Raises:
        ValueError: a bool, a non-integer or a negative count.
    """
    if (
        isinstance(protected_tail, bool)
        or not isinstance(protected_tail, numbers.Integral)
        or protected_tail < 0
    ):
        raise ValueError(f"`protected_tail` must be a non-negative integer, got {protected_tail!r}")
    return int(protected_tail)


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
    context = check_int("context", context)
    span_tokens = check_int("span_tokens", span_tokens, 2)  # the cue and at least one predicted token
    protected_tail = _check_tail(protected_tail)
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
    context = check_int("context", context)
    needle_tokens = check_int("needle_tokens", needle_tokens)
    protected_tail = _check_tail(protected_tail)
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
        raise ValueError(f"the held-out text has {total:,} tokens, fewer than the {n:,} a prompt needs")
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
    rows_per_distance = check_int("rows_per_distance", rows_per_distance)
    context = check_int("context", context)
    span_tokens = check_int("span_tokens", span_tokens, 2)
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
    own = {
        "span_tokens": span_tokens,
        "distances_tokens": distances,
        "fractions": list(fractions),
        "rows_per_distance": rows_per_distance,
        "protected_tail_tokens": protected_tail,
    }
    # sequence: the spans [rows, L]
    prompt_ids, sequence, info = _tensors_and_info("recall", context, prompts, spans, seed, own)
    scored = torch.ones(len(spans), span_tokens - 1, dtype=torch.bool)
    return Probe("recall", prompt_ids, sequence, scored, tuple(groups), info)


def _tensors_and_info(
    kind: str, context: int, prompts: list, sequences: list, seed: int | str, own: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """``prompt_ids`` ``[rows, context]`` and ``sequence`` ``[rows, m]`` (long) of a probe's token lists, and its
    ``info``: ``kind``, ``context_length``, the probe's ``own`` keys, ``seed`` and both tensors' SHA-256."""
    prompt_ids = torch.tensor(prompts, dtype=torch.long)
    sequence = torch.tensor(sequences, dtype=torch.long)
    info = {
        "kind": kind,
        "context_length": context,
        **own,
        "seed": str(seed),
        "ids_sha256": _sha256(prompt_ids),
        "sequence_sha256": _sha256(sequence),
    }
    return prompt_ids, sequence, info


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
    trials = check_int("trials", trials)
    context = check_int("context", context)
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
    own = {
        "trials_per_depth": trials,
        "depths": [float(p) for p in depths],
        "needle_start_tokens": starts,
        "needle_end_tokens": [s + needle_max for s in starts],
        "needle_tokens": needle_max,
        "protected_tail_tokens": protected_tail,
        "templates": {"needle": PASSKEY_NEEDLE, "query": PASSKEY_QUERY, "answer": PASSKEY_ANSWER},
    }
    prompt_ids, sequence, info = _tensors_and_info("passkey", context, prompts, sequences, seed, own)
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
