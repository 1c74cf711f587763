"""Haystacks and needle values of the long-context tasks: the filler a prompt's context is cut from, and the
random keys, numbers, UUIDs and words written into it.

Two haystacks, after RULER (Hsieh et al. 2024, arXiv:2404.06654, section 3; ``NVIDIA/RULER/scripts/synthetic.yaml`` of
github.com/NVIDIA/RULER, Apache-2.0):

* ``noise``: RULER's ``repeat`` haystack, the sentence :data:`NOISE` repeated (its ``niah_single_1``, the passkey
  setting of Mohtashami & Jaggi 2023, and the filler of variable tracking);
* ``text``: natural text standing in for RULER's Paul Graham essays, here a held-out text the caller passes (kvlab's
  bundled model ships one, ``kvlab.models.heldout_text()``: text that model never saw).

Keys and words are synthetic consonant-vowel words (RULER draws English words from ``wonderwords``; a generated
vocabulary needs no word list and no download), numbers are 7 digits and UUIDs version-4 strings, as in RULER.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

from kvlab.tasks.tokens import Tokenizer, encode_checked

NOISE = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
HAYSTACKS = ("noise", "text")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


@dataclass(frozen=True)
class Haystack:
    """Token ids a context's filler is cut from.

    Attributes:
        kind: ``"noise"`` or ``"text"``.
        ids: the source's token ids (``[tokens]``): the noise sentence's ids once (repeated as needed) or a whole
            text's.
        repeat: the filler is ``ids`` repeated from its start (noise) rather than a window at a random offset (text).
    """

    kind: str
    ids: tuple[int, ...]
    repeat: bool

    def __post_init__(self) -> None:
        if self.kind not in HAYSTACKS:
            raise ValueError(f"`kind` must be one of {list(HAYSTACKS)}, got {self.kind!r}")
        if not self.ids:
            raise ValueError(f"the {self.kind} haystack has no tokens")

    def filler(self, rng: random.Random, n: int) -> list[int]:
        """``n`` filler ids: the noise repeated from its first token, or ``n`` consecutive text ids from a random
        offset.

        Raises:
            ValueError: a text haystack shorter than ``n`` tokens (both numbers named).
        """
        if n <= 0:
            return []
        if self.repeat:
            reps = -(-n // len(self.ids))
            return list(self.ids * reps)[:n]
        if len(self.ids) < n:
            raise ValueError(
                f"the text haystack has {len(self.ids)} tokens, fewer than the {n} a context needs"
            )
        start = rng.randrange(0, len(self.ids) - n + 1)
        return list(self.ids[start : start + n])


def noise_haystack(tokenizer: Tokenizer) -> Haystack:
    """RULER's repeated-sentence haystack (:data:`NOISE`) in ``tokenizer``'s ids."""
    return Haystack("noise", tuple(encode_checked(tokenizer, NOISE)), repeat=True)


def text_haystack(tokenizer: Tokenizer, text: str) -> Haystack:
    """A natural-text haystack: ``text``'s ids, cut at a random offset per context.

    Raises:
        ValueError: an empty text.
    """
    if not text:
        raise ValueError("the text haystack needs a non-empty text")
    return Haystack("text", tuple(encode_checked(tokenizer, text)), repeat=False)


def word(rng: random.Random, syllables: int = 3) -> str:
    """A synthetic lower-case word of ``syllables`` consonant-vowel syllables (14 x 5 = 70 per syllable)."""
    return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))


def distinct_words(
    rng: random.Random, n: int, syllables: int = 3, avoid: set[str] | None = None
) -> list[str]:
    """``n`` different :func:`word` s, none in ``avoid``."""
    seen = set(avoid or ())
    out: list[str] = []
    while len(out) < n:
        w = word(rng, syllables)
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def key(rng: random.Random) -> str:
    """A needle key: two synthetic words joined by a hyphen (RULER's keys are ``adjective-noun`` pairs)."""
    return f"{word(rng, 2)}-{word(rng, 3)}"


def number(rng: random.Random) -> str:
    """A 7-digit number, as RULER's ``numbers`` needles."""
    return str(rng.randint(1_000_000, 9_999_999))


def uuid_value(rng: random.Random) -> str:
    """A version-4 UUID drawn from ``rng`` (seeded, unlike ``uuid.uuid4``)."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def variable_name(rng: random.Random) -> str:
    """A variable of variable tracking: 5 upper-case letters, as RULER's ``VAR XXXXX``."""
    return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
