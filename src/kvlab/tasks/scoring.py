"""Scoring of the long-context tasks as RULER scores them: is each reference string in the model's output?

RULER (Hsieh et al. 2024, arXiv:2404.06654; ``NVIDIA/RULER/scripts/eval/synthetic/constants.py`` of github.com/NVIDIA/RULER,
Apache-2.0) scores a prediction by case-insensitive substring match of its references:

* ``all`` (``string_match_all``, the retrieval, multi-hop and aggregation tasks): the fraction of the references
  found in the output;
* ``part`` (``string_match_part``, question answering): 1 when any reference is found.

A task score is the mean over predictions. :func:`sample_score` also says whether a prediction is *correct*
(score 1: every reference found for ``all``, one for ``part``), the binary outcome a Wilson interval is put on.
"""

from __future__ import annotations

from collections.abc import Sequence

METRICS = ("all", "part")


def _check(output: str, references: Sequence[str]) -> list[str]:
    if not isinstance(output, str):
        raise TypeError(f"`output` must be a str, got {type(output).__name__}")
    refs = list(references) if not isinstance(references, str) else None
    if not refs or any(not isinstance(r, str) or not r for r in refs):
        raise ValueError(
            f"`references` must be a non-empty sequence of non-empty strings, got {references!r}"
        )
    return refs


def string_match_all(output: str, references: Sequence[str]) -> float:
    """Fraction of ``references`` found in ``output`` (case-insensitive substrings), in [0, 1].

    Raises:
        ValueError: empty references (or an empty reference string). TypeError: ``output`` not a str.
    """
    refs = _check(output, references)
    low = output.lower()
    return sum(r.lower() in low for r in refs) / len(refs)


def string_match_part(output: str, references: Sequence[str]) -> float:
    """1.0 when any of ``references`` is in ``output`` (case-insensitive), else 0.0.

    Raises:
        ValueError: empty references (or an empty reference string). TypeError: ``output`` not a str.
    """
    refs = _check(output, references)
    low = output.lower()
    return float(any(r.lower() in low for r in refs))


def sample_score(output: str, references: Sequence[str], metric: str = "all") -> tuple[float, bool]:
    """``(score, correct)`` of one prediction: RULER's score under ``metric`` and whether it is 1.

    Raises:
        ValueError: ``metric`` not in :data:`METRICS`, or bad references.
    """
    if metric not in METRICS:
        raise ValueError(f"`metric` must be one of {list(METRICS)}, got {metric!r}")
    s = string_match_all(output, references) if metric == "all" else string_match_part(output, references)
    return s, s == 1.0
