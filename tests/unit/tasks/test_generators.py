"""The task generators on tiny tokenizers: exact lengths, needles at their depths, answers recoverable from the
prompt text alone, distinct prompts per seed."""

from __future__ import annotations

import collections
import json
import re

import pytest

from kvlab.tasks import TASKS, NotPlaceable, generate, noise_haystack, text_haystack
from kvlab.tasks import generators as g
from kvlab.tasks.tokens import encode_checked

TEXT = (
    "The module reads a file and writes its lines to another file. Each line is checked for a marker, "
    "and lines with the marker are counted. A counter starts at zero and grows with every marked line. "
) * 60


class ByteTokenizer:
    """One token per UTF-8 byte (ids 0-255)."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


class WordTokenizer:
    """Words, runs of spaces and single punctuation marks as tokens, in a vocabulary grown as text is seen: a
    tokenizer whose tokens are not bytes (merges), unlike :class:`ByteTokenizer`."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.pieces: list[str] = []

    def encode(self, text: str) -> list[int]:
        out = []
        for piece in re.findall(r" ?[A-Za-z0-9]+| +|\n|[^A-Za-z0-9 \n]", text):
            if piece not in self.vocab:
                self.vocab[piece] = len(self.pieces)
                self.pieces.append(piece)
            out.append(self.vocab[piece])
        return out

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


class BundledBPE:
    """The bundled model's byte-level BPE (``tokenizers``, no torch) through kvlab's adapter."""

    def __init__(self) -> None:
        from tokenizers import Tokenizer

        from kvlab.models import reference_model_path
        from kvlab.tasks import as_tokenizer

        self.inner = as_tokenizer(Tokenizer.from_file(str(reference_model_path() / "tokenizer.json")))

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(ids)


def _tokenizers():
    return [ByteTokenizer(), WordTokenizer(), BundledBPE()]


def _hay(tok):
    return {"noise": noise_haystack(tok), "text": text_haystack(tok, TEXT)}


CONTEXT = {"ByteTokenizer": 3000, "WordTokenizer": 1200, "BundledBPE": 1024}


@pytest.mark.parametrize("tok", _tokenizers(), ids=lambda t: type(t).__name__)
@pytest.mark.parametrize("task", list(TASKS))
def test_exact_length_and_tail(task, tok):
    context = CONTEXT[type(tok).__name__]
    for tail in (0, 40):
        samples = generate(task, tok, _hay(tok), context, 5, protected_tail=tail)
        for s in samples:
            assert len(s.context_ids) == context
            assert all(end <= context - tail for _, end in s.needle_spans), (
                "a needle inside the protected tail"
            )
            assert s.questions and all(q.ids and q.references for q in s.questions)


def _header(task: str, tok) -> int:
    if task.startswith("niah"):
        kind = "uuids" if task == "niah_single_3" else "numbers"
        return len(encode_checked(tok, g.NIAH_HEADER.format(kind=kind)))
    return len(encode_checked(tok, {"vt": g.VT_HEADER, "kv_retrieval": g.KV_HEADER}[task]))


NEEDLE_TASKS = [t for t in TASKS if t != "cwe"]


@pytest.mark.parametrize("tok", _tokenizers(), ids=lambda t: type(t).__name__)
@pytest.mark.parametrize("task", NEEDLE_TASKS)
def test_needle_at_requested_depth(task, tok):
    """Single-answer tasks: sample i's asked needle at depths[i]; multi-needle tasks: needles spread evenly over
    [min, max] of the depths. The needle's start leaves round(depth * room) filler tokens before it."""
    context, tail, depths = CONTEXT[type(tok).__name__], 24, (0.0, 0.3, 0.6, 1.0)
    samples = generate(task, tok, _hay(tok), context, len(depths), depths=depths, protected_tail=tail)
    header = _header(task, tok)
    for i, s in enumerate(samples):
        if task in ("niah_multivalue", "niah_multiquery", "vt"):
            k = len(s.needle_spans)
            assert s.depths == pytest.approx([i / (k - 1) for i in range(k)])  # spread over [0, 1]
        else:
            assert s.depths == (depths[i],)
        if task == "kv_retrieval":  # the asked pair sits at index round(depth * (pairs - 1)) of the object
            assert s.info["asked_index"] == round(depths[i] * (s.info["pairs"] - 1))
            continue
        total_needles = _all_needle_tokens(s, tok)
        room = context - header - total_needles - tail
        for (start, _end), d in zip(s.needle_spans, s.depths):
            before = [sp for sp in _all_spans(s, tok) if sp[1] <= start]
            filler_before = start - header - sum(e - b for b, e in before)
            assert filler_before == round(d * room), (start, d, room)
        if max(s.depths) == 1.0 and task != "niah_multikey_1":
            assert s.needle_spans[-1][1] == context - tail  # depth 1: as late as the tail allows


def _all_spans(s, tok):
    """Every needle's span (distractors too), found by its text in the decoded context."""
    ids = list(s.context_ids)
    spans = []
    for pattern in (r" One of the special magic \w+ for [\w-]+ is: [\w-]+\.", r" VAR \w+ = (?:VAR )?\w+\."):
        for value in set(re.findall(pattern, tok.decode(ids))):
            needle = encode_checked(tok, value)
            for start in range(len(ids) - len(needle) + 1):
                if ids[start : start + len(needle)] == needle:
                    spans.append((start, start + len(needle)))
    return sorted(spans)


def _all_needle_tokens(s, tok):
    return sum(e - b for b, e in _all_spans(s, tok))


def _solve(s, tok) -> list[str]:
    """The answer to the sample's question from the decoded prompt text alone (an independent reader)."""
    text, question = tok.decode(list(s.context_ids)), tok.decode(list(s.questions[0].ids))
    if s.task.startswith("niah"):
        about = re.search(r"for (.+?) mentioned", question).group(1)
        keys = re.split(r", | and ", about)
        return [v for k in keys for v in re.findall(rf"magic \w+ for {re.escape(k)} is: ([\w-]+)\.", text)]
    if s.task == "vt":
        value = re.search(r"assigned the value (\d+) in", question).group(1)
        assign = dict(re.findall(r"VAR (\w+) = ((?:VAR )?\w+)\.", text))
        found = {v for v, rhs in assign.items() if rhs == value}
        while True:
            more = {v for v, rhs in assign.items() if rhs.startswith("VAR ") and rhs[4:] in found} - found
            if not more:
                return sorted(found)
            found |= more
    if s.task == "cwe":
        n = int(re.search(r"the (\d+) most common", question).group(1))
        counts = collections.Counter(re.findall(r"\d+\. (\w+)", text))
        ranked = counts.most_common()
        assert ranked[n - 1][1] > ranked[n][1], "the common words are not strictly more frequent"
        return sorted(w for w, _ in ranked[:n])
    obj = json.loads(text[text.index("{") : text.rindex("}") + 1])
    return [obj[re.search(r'Key: "([\w-]+)"', question).group(1)]]


@pytest.mark.parametrize("tok", _tokenizers(), ids=lambda t: type(t).__name__)
@pytest.mark.parametrize("task", list(TASKS))
def test_answer_recoverable_from_prompt_text(task, tok):
    for s in generate(task, tok, _hay(tok), CONTEXT[type(tok).__name__], 4, seed=3):
        refs = list(s.questions[0].references)
        got = _solve(s, tok)
        assert sorted(got) == sorted(refs), (got, refs)


@pytest.mark.parametrize("task", list(TASKS))
def test_distinct_prompts_per_seed(task):
    tok = ByteTokenizer()
    a = generate(task, tok, _hay(tok), 3000, 3, seed=0)
    b = generate(task, tok, _hay(tok), 3000, 3, seed=1)
    again = generate(task, tok, _hay(tok), 3000, 3, seed=0)
    assert [s.context_ids for s in a] == [s.context_ids for s in again], "not reproducible from its seed"
    contexts = {s.context_ids for s in a + b}
    assert len(contexts) == 6, "two samples share a context"
    assert {s.questions[0].references for s in a}.isdisjoint({s.questions[0].references for s in b})


def test_bad_input():
    tok = ByteTokenizer()
    with pytest.raises(ValueError, match="unknown task 'niah'"):
        generate("niah", tok, _hay(tok), 1000, 1)
    with pytest.raises(NotPlaceable, match="too short"):
        generate("niah_single_1", tok, _hay(tok), 100, 1)
    with pytest.raises(ValueError, match=r"fractions in \[0, 1\], got 1.5"):
        generate("niah_single_1", tok, _hay(tok), 1000, 1, depths=(0.5, 1.5))
    with pytest.raises(ValueError, match="needs the 'text' haystack"):
        generate("niah_single_2", tok, {"noise": noise_haystack(tok)}, 1000, 1)
    with pytest.raises(ValueError, match="`n` must be an integer >= 1, got 0"):
        generate("vt", tok, _hay(tok), 1000, 0)
    with pytest.raises(TypeError, match="needs encode"):
        generate("vt", object(), _hay(tok), 1000, 1)
