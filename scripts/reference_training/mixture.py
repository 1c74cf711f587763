"""The training mixture: long-range tasks (in-context copies, i.e. induction, and passkeys) written over windows
of documentation text, so that the model learns to read its whole context, in the templates ``kvlab eval``
measures with (:mod:`kvlab.eval.longctx`); and the mixture's description for the model card."""

from __future__ import annotations

import torch

from kvlab.eval.longctx import PASSKEY_ANSWER, PASSKEY_NEEDLE, PASSKEY_QUERY

from .data import Corpus

IGNORE = -100  # label of a position that carries no loss


# --near-copy-p draws copy distances up to this (kvlab eval's near probes: 192-471 tokens at a 512-token context)
NEAR_COPY_TOKENS = 512
# --mid-copy-p draws copy distances in this share of the window (eval probes at 25 %-50 % of 4,352 and 2,048 tokens)
MID_COPY_RANGE = (0.2, 0.6)


class TaskMixer:
    """Overwrite parts of natural-text windows with long-range tasks; return ids and labels.

    Per task window (probability ``task_fraction``): ``max(min_copies, T // copies_per_tokens)`` copy tasks (a span
    of ``span_range`` tokens (default 8-48), random tokens with probability ``random_span_p``, else natural text from elsewhere in the
    stream, written twice at a distance drawn uniformly up to the window) and, with probability 0.5, a passkey (a random 5-digit
    key stated once at a random depth, queried at a random later point; with probability ``far_passkey_p`` stated in
    the window's first 10 % and asked in its last 10 %; with probability ``near_copy_p`` a copy's distance is drawn
    up to :data:`NEAR_COPY_TOKENS` only, with probability ``mid_copy_p`` from :data:`MID_COPY_RANGE` of the window). The unpredictable first copy of a random
    span and the key digits of the needle carry no loss; the text around them keeps its ordinary loss, so most
    tokens of every step stay natural text.
    """

    def __init__(
        self,
        tokenizer,
        stream: torch.Tensor,
        task_fraction: float,
        gen: torch.Generator,
        task_weight: float = 1.0,
        copies_per_tokens: int = 768,
        random_span_p: float = 0.5,
        min_copies: int = 1,
        span_range: tuple[int, int] = (8, 48),
        far_passkey_p: float = 0.0,
        near_copy_p: float = 0.0,
        mid_copy_p: float = 0.0,
    ):
        self.encode = lambda text: tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
        self.stream, self.task_fraction, self.gen = stream, task_fraction, gen
        self.min_copies = min_copies
        self.span_range, self.far_passkey_p, self.near_copy_p = span_range, far_passkey_p, near_copy_p
        self.mid_copy_p = mid_copy_p
        self.task_weight, self.copies_per_tokens, self.random_span_p = (
            task_weight,
            copies_per_tokens,
            random_span_p,
        )
        self.vocab = len(tokenizer)
        self.counts = {"windows": 0, "task_windows": 0, "copy": 0, "passkey": 0}

    def _randint(self, lo: int, hi: int) -> int:
        """Uniform integer in [lo, hi] (inclusive)."""
        return int(torch.randint(lo, hi + 1, (1,), generator=self.gen))

    def _place(self, free: torch.Tensor, length: int, lo: int, hi: int) -> int | None:
        """A start in [lo, hi] whose ``length`` positions are all free; None after 20 tries."""
        for _ in range(20):
            if hi < lo:
                return None
            a = self._randint(lo, hi)
            if bool(free[a : a + length].all()):
                free[a : a + length] = False
                return a
        return None

    def _place_pair(self, free: torch.Tensor, length: int, T: int) -> tuple[int, int] | None:
        """Two free spans of ``length`` whose distance ``b - a`` is uniform over [length, T - length - 1]
        (then ``a`` uniform where it fits): every distance up to the window is trained equally often, where
        two independent starts would make far copies rare. None after 20 tries."""
        u = float(torch.rand((), generator=self.gen)) if (self.near_copy_p or self.mid_copy_p) else 1.0
        shortest, longest = length, T - length - 1
        if u < self.near_copy_p:
            longest = min(longest, NEAR_COPY_TOKENS)
        elif u < self.near_copy_p + self.mid_copy_p:
            shortest = max(length, int(MID_COPY_RANGE[0] * T))
            longest = max(shortest, min(longest, int(MID_COPY_RANGE[1] * T)))
        for _ in range(20):
            d = self._randint(shortest, max(shortest, longest))
            a = self._randint(1, T - length - d)
            b = a + d
            if bool(free[a : a + length].all()) and bool(free[b : b + length].all()):
                free[a : a + length] = False
                free[b : b + length] = False
                return a, b
        return None

    def window(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``ids`` `[T]` natural text -> (ids, labels, loss weights), each `[T]`, with tasks written in."""
        ids = ids.clone()
        labels = ids.clone()
        weights = torch.ones(ids.shape, dtype=torch.float32)
        T = ids.numel()
        self.counts["windows"] += 1
        if float(torch.rand((), generator=self.gen)) >= self.task_fraction:
            return ids, labels, weights
        self.counts["task_windows"] += 1
        free = torch.ones(T, dtype=torch.bool)
        free[:1] = False
        if float(torch.rand((), generator=self.gen)) < 0.5:
            key = f"{self._randint(10000, 99999)}"
            needle = torch.tensor(self.encode(PASSKEY_NEEDLE.format(key=key)))
            ask = torch.tensor(self.encode(PASSKEY_QUERY + PASSKEY_ANSWER.format(key=key)))
            far = float(torch.rand((), generator=self.gen)) < self.far_passkey_p
            hi = T // 10 if far else T - needle.numel() - ask.numel() - 1
            a = self._place(free, needle.numel(), 1, hi)
            if a is not None:
                lo_b = max(a + needle.numel(), T - T // 10 - ask.numel()) if far else a + needle.numel()
                b = self._place(free, ask.numel(), lo_b, T - ask.numel())
                if b is None:
                    free[a : a + needle.numel()] = True
                else:
                    ids[a : a + needle.numel()] = needle
                    labels[a : a + needle.numel()] = needle
                    digits = torch.tensor([t for t in self.encode(" " + key)])[1:]  # the 5 digit tokens
                    for i in range(
                        a, a + needle.numel()
                    ):  # the first statement of the key is not predictable
                        if int(ids[i]) in digits.tolist() and i < a + needle.numel() // 2:
                            labels[i] = IGNORE
                    ids[b : b + ask.numel()] = ask
                    labels[b : b + ask.numel()] = ask
                    weights[b : b + ask.numel()] = self.task_weight
                    self.counts["passkey"] += 1
        for _ in range(max(self.min_copies, T // self.copies_per_tokens)):
            L = self._randint(*self.span_range)
            if float(torch.rand((), generator=self.gen)) < self.random_span_p:
                span, random_span = torch.randint(1, self.vocab, (L,), generator=self.gen), True
            else:
                s0 = self._randint(0, self.stream.numel() - L - 1)
                span, random_span = self.stream[s0 : s0 + L], False
            placed = self._place_pair(free, L, T)
            if placed is None:
                continue
            a, b = placed
            ids[a : a + L] = span
            labels[a : a + L] = IGNORE if random_span else span
            ids[b : b + L] = span
            labels[b : b + L] = span
            weights[b : b + L] = self.task_weight
            self.counts["copy"] += 1
        return ids, labels, weights

    def batch(self, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`[B, T]` natural windows -> (ids, labels, loss weights), each `[B, T]`."""
        rows = [self.window(w) for w in windows]
        return tuple(torch.stack([r[i] for r in rows]) for i in range(3))


def data_mixture(corpus: Corpus, license_text: str, run: dict) -> list[dict]:
    """What the last stage trained on, with licences."""
    mix = [
        {
            "component": "documentation text",
            "source": f"windows of the training files of Debian's {corpus.package} {corpus.version}.",
            "license": license_text + ".",
        }
    ]
    if run.get("task_fraction"):
        mix.append(
            {
                "component": f"long-range tasks in {run['task_fraction']:.0%} of windows",
                "source": "generated on the fly by the training script (TaskMixer): spans of random tokens or of "
                "the training text written twice at any distance up to the window (copy / induction), and "
                "passkeys (a random 5-digit number stated once and asked for later, in kvlab eval's templates) "
                "written over the documentation text.",
                "license": "generated data; the text spans are under the documentation's license above.",
            }
        )
    return mix
