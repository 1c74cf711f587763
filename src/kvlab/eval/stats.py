"""Confidence intervals for the accuracies ``kvlab eval`` reports (pure Python, no torch)."""

from __future__ import annotations

import math
from statistics import NormalDist


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``successes / trials``.

    Wilson (1927), "Probable inference, the law of succession, and statistical inference", JASA 22: with
    ``p = successes / trials`` and ``z`` the two-sided normal quantile of ``confidence`` (1.95996... at 0.95)::

        center = (p + z²/2n) / (1 + z²/n)
        half   = z / (1 + z²/n) * sqrt(p(1-p)/n + z²/4n²)

    Unlike the normal (Wald) interval it stays inside [0, 1] and is not empty at 0 or n successes (0 of 20
    gives [0, 0.161]), which matters for the 20-trial passkey points.

    Args:
        successes: correct trials, ``0 <= successes <= trials``.
        trials: trials, ``>= 1``.
        confidence: two-sided coverage in (0, 1).

    Returns:
        ``(low, high)``: fractions in [0, 1].

    Raises:
        ValueError: ``trials`` < 1, ``successes`` outside ``[0, trials]`` or not integers (bools refused), or
            ``confidence`` outside (0, 1).
    """
    for name, value in (("successes", successes), ("trials", trials)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"`{name}` must be an integer, got {value!r}")
    if trials < 1:
        raise ValueError(f"`trials` must be >= 1, got {trials}")
    if not 0 <= successes <= trials:
        raise ValueError(f"`successes` must be in [0, trials={trials}], got {successes}")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"`confidence` must be in (0, 1), got {confidence!r}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    n, p = trials, successes / trials
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = 0.0 if successes == 0 else max(0.0, center - half)  # exact at the ends, whatever the rounding
    high = 1.0 if successes == trials else min(1.0, center + half)
    return low, high
