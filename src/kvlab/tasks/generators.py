"""Seeded generators of RULER-style long-context tasks with contexts of an exact token length.

The task definitions follow RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?", arXiv:2404.06654, section 3 and Table 2; ``NVIDIA/RULER/scripts/synthetic.yaml`` and
``NVIDIA/RULER/scripts/data/synthetic/*.py`` of github.com/NVIDIA/RULER, Apache-2.0) and InfiniteBench's ``kv_retrieval``
(Zhang et al. 2024, "InfiniteBench: Extending Long Context Evaluation Beyond 100K Tokens", arXiv:2402.13718); the
code is kvlab's own:

=================  ========  =======  =====================================================================
task               haystack  values   what is asked
=================  ========  =======  =====================================================================
niah_single_1      noise     number   one needle ``One of the special magic numbers for {key} is: {value}.``
niah_single_2      text      number   the same in natural text
niah_single_3      text      uuid     a UUID value (RULER's hardest single needle for compressed caches)
niah_multikey_1    text      number   the asked needle among 3 distractor needles with other keys
niah_multivalue    text      number   4 needles of one key, all 4 values asked
niah_multiquery    text      number   4 needles of 4 keys, all 4 values asked in one question
vt                 noise     number   variable tracking: ``VAR X = 12345`` then 4 hops ``VAR Y = VAR X``
cwe                noise     words    common-word extraction: the 10 words a numbered list repeats most
kv_retrieval       noise     uuid     a JSON object of UUID pairs, the value of one key asked
=================  ========  =======  =====================================================================

Each :class:`Sample` is a *context* (instruction, haystack and needles: exactly ``context`` token ids) and its
:class:`Question` s (question and answer prefix), kept apart so that a cache can compress the context before any
question is seen (question-agnostic compression, as kvpress evaluates presses). A question ends with an answer
prefix that repeats the needle's words up to its value (RULER's answer prefixes for base models), so a model that
can copy from its context can answer. Depth ``p`` places a needle's first token after a fraction ``p`` of the
context's filler (0: right after the instruction; 1: as late as possible before the newest ``protected_tail``
tokens, which hold filler only).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kvlab.tasks import haystack as hs
from kvlab.tasks.tokens import Tokenizer, as_tokenizer, encode_checked

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)  # evenly spaced needle depths (RULER spreads depths evenly over samples)
NIAH_HEADER = (
    "Some special magic {kind} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {kind} afterwards.\n"
)
NEEDLE = " One of the special magic {kind} for {key} is: {value}."
VT_HEADER = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
CWE_HEADER = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n"
)
KV_HEADER = "Extract the value corresponding to the specified key in the JSON object below.\n\nJSON data:\n"


class NotPlaceable(ValueError):
    """A task does not fit in the requested context (the instruction and needles leave no room)."""


@dataclass(frozen=True)
class Question:
    """One question about a context, appended after it uncompressed.

    Attributes:
        ids: ``[tokens]`` question and answer prefix; the answer is greedy-decoded after them.
        references: the strings a correct answer contains (RULER's ``outputs``).
        metric: ``"all"`` or ``"part"`` (:mod:`kvlab.tasks.scoring`).
        max_new_tokens: decoding budget of the answer.
    """

    ids: tuple[int, ...]
    references: tuple[str, ...]
    metric: str = "all"
    max_new_tokens: int = 16


@dataclass(frozen=True)
class Sample:
    """One context of a task and its questions.

    Attributes:
        task: the task's name (:data:`TASKS`).
        context_ids: ``[context]`` token ids: instruction, haystack, needles.
        questions: asked after the context (each from the same prefilled context).
        needle_spans: ``[start, end)`` token positions of each needle in ``context_ids``, in text order.
        depths: the depth of each needle, in text order.
        info: JSON-ready details (seed, haystack, values).
    """

    task: str
    context_ids: tuple[int, ...]
    questions: tuple[Question, ...]
    needle_spans: tuple[tuple[int, int], ...] = ()
    depths: tuple[float, ...] = ()
    info: dict = field(default_factory=dict)


def _check_depths(depths: Sequence[float]) -> tuple[float, ...]:
    try:
        out = tuple(depths)
    except TypeError:
        raise ValueError(f"`depths` must be a sequence of fractions in [0, 1], got {depths!r}") from None
    if not out:
        raise ValueError("`depths` must not be empty")
    for d in out:
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= 1:
            raise ValueError(f"`depths` must hold fractions in [0, 1], got {d!r}")
    return tuple(float(d) for d in out)


def spread(depths: Sequence[float], k: int) -> list[float]:
    """``k`` depths evenly spaced from ``min(depths)`` to ``max(depths)`` (the needles of a multi-needle task)."""
    lo, hi = min(depths), max(depths)
    return [lo] * k if k == 1 else [lo + (hi - lo) * i / (k - 1) for i in range(k)]


def assemble(
    header: list[int],
    needles: Sequence[list[int]],
    depths: Sequence[float],
    filler: Callable[[int], list[int]],
    context: int,
    protected_tail: int,
) -> tuple[list[int], list[tuple[int, int]], list[float]]:
    """A context of exactly ``context`` ids: ``header``, then filler with each needle inserted at its depth.

    Needle ``i`` starts after ``round(depths[i] * room)`` filler tokens, ``room`` being the filler outside the newest
    ``protected_tail`` tokens; needles keep the order of their depths (ties: their given order).

    Returns:
        ``(ids, spans, depths)``: the context, each needle's ``[start, end)`` and depth, in text order.

    Raises:
        NotPlaceable: the header, needles and tail do not fit in ``context``.
    """
    fill = context - len(header) - sum(len(n) for n in needles)
    room = fill - protected_tail
    if room < 0:
        need = context - room
        raise NotPlaceable(f"context {context} is too short for this task: it needs at least {need} tokens")
    order = sorted(range(len(needles)), key=lambda i: depths[i])
    body, ids, spans = filler(fill), list(header), []
    done = 0
    for i in order:
        cut = round(depths[i] * room)
        ids += body[done:cut]
        done = cut
        spans.append((len(ids), len(ids) + len(needles[i])))
        ids += needles[i]
    ids += body[done:]
    assert len(ids) == context, (len(ids), context)
    return ids, spans, [depths[i] for i in order]


@dataclass(frozen=True)
class TaskSpec:
    """One registered task: ``build(ctx, rng, depth_or_depths) -> Sample``, its haystack and one-line summary."""

    name: str
    haystack: str  # "noise" or "text"
    summary: str
    build: Callable[..., Sample]
    uses_depths: bool = True  # False: no needles (cwe)


@dataclass(frozen=True)
class Ctx:
    """What every builder needs: tokenizer, haystack, length and tail, and the task name."""

    task: str
    tok: Tokenizer
    hay: hs.Haystack
    context: int
    protected_tail: int

    def enc(self, text: str) -> list[int]:
        return encode_checked(self.tok, text)


def _niah(
    c: Ctx, rng: random.Random, depths: Sequence[float], *, value: str, keys: int, values: int, asked: str
) -> Sample:
    """The needle tasks: ``keys`` keys with ``values`` needles each (distractor keys when ``asked == "one"``)."""
    kind = "uuids" if value == "uuid" else "numbers"
    draw = hs.uuid_value if value == "uuid" else hs.number
    names: list[str] = []
    while len(names) < keys:
        k = hs.key(rng)
        names += [k] if k not in names else []
    pairs = [(k, draw(rng)) for k in names for _ in range(values)]
    texts = [NEEDLE.format(kind=kind, key=k, value=v) for k, v in pairs]
    if asked == "one":  # the asked needle (the first) at the requested depth, distractors anywhere
        where = [depths[0]] + [rng.random() for _ in pairs[1:]]
    else:
        where = spread(depths, len(pairs))
    ids, spans, placed = assemble(
        c.enc(NIAH_HEADER.format(kind=kind)),
        [c.enc(t) for t in texts],
        where,
        lambda n: c.hay.filler(rng, n),
        c.context,
        c.protected_tail,
    )
    span_of = dict(zip(sorted(range(len(pairs)), key=lambda i: where[i]), spans))
    if asked == "one":
        q_keys, refs, mine = [names[0]], [pairs[0][1]], [0]
    else:
        q_keys, refs, mine = names, [v for _, v in pairs], list(range(len(pairs)))
    about = q_keys[0] if len(q_keys) == 1 else ", ".join(q_keys[:-1]) + " and " + q_keys[-1]
    if len(refs) == 1:
        text = f"\nWhat is the special magic {kind[:-1]} for {about} mentioned in the provided text?"
        text += f" One of the special magic {kind} for {about} is:"
    else:
        text = f"\nWhat are all the special magic {kind} for {about} mentioned in the provided text?"
        text += f" The special magic {kind} for {about} mentioned in the provided text are:"
    per_value = 48 if value == "uuid" else 12  # a UUID is 36 characters, 20-45 tokens
    q = Question(tuple(c.enc(text)), tuple(refs), "all", per_value * len(refs))
    return Sample(
        c.task,
        tuple(ids),
        (q,),
        tuple(span_of[i] for i in mine) if asked == "one" else tuple(spans),
        (depths[0],) if asked == "one" else tuple(placed),
        {"keys": names, "values": [v for _, v in pairs], "distractors": len(pairs) - len(mine)},
    )


def _vt(c: Ctx, rng: random.Random, depths: Sequence[float], *, hops: int = 4) -> Sample:
    """Variable tracking (RULER ``vt``: one chain, ``hops`` hops): ``VAR A = 12345``, ``VAR B = VAR A``, ... in
    noise; asked: every variable holding the value."""
    names: list[str] = []
    while len(names) < hops + 1:
        v = hs.variable_name(rng)
        names += [v] if v not in names else []
    value = str(rng.randint(10_000, 99_999))
    texts = [f" VAR {names[0]} = {value}."] + [f" VAR {names[i + 1]} = VAR {names[i]}." for i in range(hops)]
    ids, spans, placed = assemble(
        c.enc(VT_HEADER),
        [c.enc(t) for t in texts],
        spread(depths, len(texts)),
        lambda n: c.hay.filler(rng, n),
        c.context,
        c.protected_tail,
    )
    text = (
        f"\nQuestion: Find all variables that are assigned the value {value} in the text above. Answer: "
        f"According to the chain(s) of variable assignment in the text above, {hops + 1} variables are assigned "
        f"the value {value}, they are:"
    )
    q = Question(tuple(c.enc(text)), tuple(names), "all", 6 * (hops + 1))
    return Sample(c.task, tuple(ids), (q,), tuple(spans), tuple(placed), {"value": value, "chain": names})


def _pad_front(c: Ctx, rng: random.Random, header: list[int], body: list[int]) -> list[int]:
    """``header + filler + body`` of exactly ``c.context`` ids (the filler takes what the body leaves)."""
    return header + c.hay.filler(rng, c.context - len(header) - len(body)) + body


def _cwe(c: Ctx, rng: random.Random, depths: Sequence[float], *, common: int = 10, freq: int = 30) -> Sample:
    """Common-word extraction (RULER ``cwe``: 10 words 30 times each, the others 3 times, in a numbered list);
    in a context too short for that, fewer common words and repeats, the common words filling at most half the
    list and appearing at least 4 times (the others 3)."""
    header = c.enc(CWE_HEADER)
    budget = c.context - len(header) - c.protected_tail
    item_tokens = max(1, len(c.enc(" 100. bako")))
    items = budget // item_tokens
    common = min(common, (items // 2) // 4)  # the common words fill at most half the list, 4+ times each
    if common < 2:
        raise NotPlaceable(
            f"context {c.context} is too short for common-word extraction: it holds {items} items"
        )
    freq = min(freq, (items // 2) // common)
    words = hs.distinct_words(rng, common + items // 3 + 1, syllables=2)
    tops, rest = words[:common], words[common:]
    listed = tops * freq + [w for w in rest for _ in range(3)]
    while True:
        order = listed[:]
        rng.shuffle(order)
        body = [t for i, w in enumerate(order) for t in c.enc(f" {i + 1}. {w}")]
        if len(body) <= budget or len(listed) <= common * freq:
            break
        over = max(1, (len(body) - budget) // (3 * item_tokens))  # uncommon words (3 copies each) to remove
        drop = set(listed[common * freq :][-3 * over :])
        listed = [w for w in listed if w not in drop]  # renumbered on the next pass
    if len(body) > budget:
        raise NotPlaceable(f"context {c.context} is too short for {common} words repeated {freq} times")
    body += c.hay.filler(rng, c.protected_tail)
    ids = _pad_front(c, rng, header, body)
    text = (
        f"\nQuestion: What are the {common} most common words in the above list? Answer: The top {common} "
        f"words that appear most often in the list are:"
    )
    q = Question(tuple(c.enc(text)), tuple(tops), "all", 5 * common)
    return Sample(
        c.task, tuple(ids), (q,), info={"common_words": tops, "repeats": freq, "items": len(listed)}
    )


def _kv(c: Ctx, rng: random.Random, depths: Sequence[float]) -> Sample:
    """InfiniteBench ``kv_retrieval``: a JSON object of UUID keys and values; the asked pair at the depth."""
    header = c.enc(KV_HEADER)
    opening, comma, closing = c.enc("{"), c.enc(", "), c.enc("}")
    budget = c.context - len(header) - c.protected_tail - len(opening) - len(closing)
    pairs, pieces, used = [], [], 0
    while True:
        k, v = hs.uuid_value(rng), hs.uuid_value(rng)
        piece = (comma if pieces else []) + c.enc(f'"{k}": "{v}"')
        if used + len(piece) > budget:
            break
        pairs.append((k, v))
        pieces.append(piece)
        used += len(piece)
    if len(pairs) < 2:
        raise NotPlaceable(f"context {c.context} is too short for a JSON object of two UUID pairs")
    asked = round(depths[0] * (len(pairs) - 1))
    body, span = list(opening), (0, 0)
    for i, piece in enumerate(pieces):
        start = len(body) + (len(comma) if i else 0)  # the pair's own tokens, after its ", "
        body += piece
        if i == asked:
            span = (start, len(body))
    body += closing + c.hay.filler(rng, c.protected_tail)
    offset = c.context - len(body)
    ids = _pad_front(c, rng, header, body)
    key, value = pairs[asked]
    text = f'\n\nKey: "{key}"\nThe value associated with the specified key is: "'
    q = Question(tuple(c.enc(text)), (value,), "all", 48)
    spans = ((offset + span[0], offset + span[1]),)
    return Sample(c.task, tuple(ids), (q,), spans, (depths[0],), {"pairs": len(pairs), "asked_index": asked})


def _spec(name, haystack, summary, build, **kw) -> TaskSpec:
    def run(c: Ctx, rng: random.Random, depths: Sequence[float]) -> Sample:
        return build(c, rng, depths, **kw)

    return TaskSpec(name, haystack, summary, run, uses_depths=build is not _cwe)


TASKS: dict[str, TaskSpec] = {
    s.name: s
    for s in (
        _spec("niah_single_1", "noise", "one number needle in repeated noise", _niah,
              value="number", keys=1, values=1, asked="one"),
        _spec("niah_single_2", "text", "one number needle in natural text", _niah,
              value="number", keys=1, values=1, asked="one"),
        _spec("niah_single_3", "text", "one UUID needle in natural text", _niah,
              value="uuid", keys=1, values=1, asked="one"),
        _spec("niah_multikey_1", "text", "the asked number needle among 3 distractor keys", _niah,
              value="number", keys=4, values=1, asked="one"),
        _spec("niah_multivalue", "text", "4 numbers of one key, all asked", _niah,
              value="number", keys=1, values=4, asked="all"),
        _spec("niah_multiquery", "text", "4 keys' numbers asked in one question", _niah,
              value="number", keys=4, values=1, asked="all"),
        _spec("vt", "noise", "variable tracking: a 4-hop chain of VAR X = VAR Y", _vt),
        _spec("cwe", "noise", "the 10 most common words of a numbered list", _cwe),
        _spec("kv_retrieval", "noise", "the value of one UUID key in a JSON object (InfiniteBench)", _kv),
    )
}  # fmt: skip


def generate(
    task: str,
    tokenizer: object,
    haystacks: Mapping[str, hs.Haystack],
    context: int,
    n: int,
    *,
    seed: int | str = 0,
    depths: Sequence[float] = DEPTHS,
    protected_tail: int = 0,
) -> list[Sample]:
    """``n`` samples of ``task`` with contexts of exactly ``context`` tokens.

    Sample ``i`` of a single-answer task (niah_single_*, niah_multikey_1, kv_retrieval) puts its asked needle at
    ``depths[i % len(depths)]``; a multi-needle task spreads its needles evenly from ``min(depths)`` to
    ``max(depths)``. Samples differ by seed (``random.Random(f"{task}-{seed}-{context}-{i}")``): keys, values,
    filler offsets and distractor depths.

    Args:
        tokenizer: a :class:`~kvlab.tasks.tokens.Tokenizer` or a Hugging Face tokenizer.
        haystacks: ``{"noise": ..., "text": ...}`` (:mod:`kvlab.tasks.haystack`); the task's kind must be there.

    Raises:
        ValueError: an unknown task (the known ones listed), a missing haystack, ``n`` or ``context`` below 1,
            depths outside [0, 1], a negative ``protected_tail``.
        NotPlaceable: the task does not fit in ``context`` tokens.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    spec = TASKS[task]
    for name, value, low in (("context", context, 1), ("n", n, 1), ("protected_tail", protected_tail, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"`{name}` must be an integer >= {low}, got {value!r}")
    depths = _check_depths(depths)
    if spec.haystack not in haystacks:
        raise ValueError(f"task {task!r} needs the {spec.haystack!r} haystack; got {sorted(haystacks)}")
    c = Ctx(task, as_tokenizer(tokenizer), haystacks[spec.haystack], context, protected_tail)
    multi = task in ("niah_multivalue", "niah_multiquery", "vt")
    out = []
    for i in range(n):
        rng = random.Random(f"{task}-{seed}-{context}-{i}")
        mine = depths if multi else (depths[i % len(depths)],)
        sample = spec.build(c, rng, mine)
        sample.info.update({"seed": str(seed), "index": i, "haystack": spec.haystack})
        out.append(sample)
    return out
