"""The tokenizer the task generators build prompts with: anything that encodes text to ids and decodes ids to text.

Prompts are assembled from separately encoded pieces (instruction, haystack tokens, needles, question), so a
context has an exact token length for any tokenizer, byte-level BPE or not: the model is fed the ids, never a
re-encoding of the decoded text.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """What the generators need: ``encode(text) -> list[int]`` (no special tokens) and ``decode(ids) -> str``."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class HFTokenizer:
    """A Hugging Face tokenizer (``transformers`` or ``tokenizers``) seen through :class:`Tokenizer`: no BOS/EOS
    added on encode, special tokens kept on decode (a prompt's text is then exactly what its ids say)."""

    inner: Any  # transformers.PreTrainedTokenizerBase or tokenizers.Tokenizer

    def encode(self, text: str) -> list[int]:
        try:  # transformers: a BatchEncoding-free call, no length warning
            return list(self.inner(text, add_special_tokens=False, verbose=False)["input_ids"])
        except TypeError:  # tokenizers.Tokenizer: encode(text, add_special_tokens=...) -> Encoding
            return list(self.inner.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(list(ids), skip_special_tokens=False)


def as_tokenizer(tokenizer: Any) -> Tokenizer:
    """``tokenizer`` as a :class:`Tokenizer`: a Hugging Face tokenizer is wrapped (:class:`HFTokenizer`), an object
    with plain ``encode``/``decode`` is used as it is.

    Raises:
        TypeError: an object without ``decode`` or without a way to encode text (named by its type).
    """
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer
    if callable(tokenizer) and hasattr(tokenizer, "decode"):  # transformers' PreTrainedTokenizerBase
        return HFTokenizer(tokenizer)
    if type(tokenizer).__module__.startswith("tokenizers") and hasattr(tokenizer, "decode"):
        return HFTokenizer(tokenizer)
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    raise TypeError(
        f"a task tokenizer needs encode(text) -> ids and decode(ids) -> text, got {type(tokenizer).__name__}"
    )


def encode_checked(tokenizer: Tokenizer, text: str) -> list[int]:
    """``tokenizer.encode(text)`` as a list of non-negative ints.

    Raises:
        ValueError: an empty encoding of a non-empty text, or an id that is not a non-negative integer.
    """
    ids = list(tokenizer.encode(text))
    if text and not ids:
        raise ValueError(f"the tokenizer encodes {text[:40]!r} to no tokens")
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral) or i < 0:
            raise ValueError(
                f"the tokenizer returned {i!r} for {text[:40]!r}: token ids must be integers >= 0"
            )
    return [int(i) for i in ids]
