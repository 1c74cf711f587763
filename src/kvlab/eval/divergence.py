"""KL divergence of a candidate cache's next-token distributions from the float cache's.

The statistic llama.cpp's ``llama-perplexity --kl-divergence`` reports for a quantized model against its base
(llama.cpp PRs #5076/#5081): per scored position ``KL(P_base || P_cand) = sum_v P_base(v) (log P_base(v) -
log P_cand(v))`` in nats, then the mean and the 99th percentile over all positions. A mean NLL can hide a cache
that moves probability mass around without changing the scored token's probability much; the KL cannot.
"""

from __future__ import annotations

import math

import torch


def kl_divergence(base_logits: torch.Tensor, cand_logits: torch.Tensor) -> torch.Tensor:
    """Per-position ``KL(softmax(base) || softmax(cand))`` in nats.

    Args:
        base_logits: ``[batch, steps, vocab]`` logits (or log-probabilities: any per-position shift cancels) of the
            float cache; each position is one next-token distribution.
        cand_logits: ``[batch, steps, vocab]`` of the candidate on the same positions.

    Returns:
        ``[batch, steps]`` float64, each ``>= 0`` up to rounding (a value below 0 from rounding is clamped to 0).

    Raises:
        ValueError: the shapes differ or are not 3-D, or either input holds inf/NaN (a logit of -inf would make
            the divergence undefined where the other distribution has mass).
    """
    if base_logits.dim() != 3 or base_logits.shape != cand_logits.shape:
        raise ValueError(
            f"`base_logits` and `cand_logits` must be [batch, steps, vocab] of one shape, got "
            f"{tuple(base_logits.shape)} and {tuple(cand_logits.shape)}"
        )
    for name, t in (("base_logits", base_logits), ("cand_logits", cand_logits)):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(
                f"`{name}` holds inf or NaN at {tuple(torch.nonzero(~torch.isfinite(t))[0].tolist())}"
            )
    log_p = torch.log_softmax(base_logits.double(), dim=-1)  # [B, S, V]
    log_q = torch.log_softmax(cand_logits.double(), dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(dim=-1)  # [B, S]
    return kl.clamp_min(0.0)


def percentile(values: torch.Tensor, fraction: float) -> float:
    """The ``fraction`` quantile of all entries of ``values``, linear between order statistics (llama.cpp's
    ``percentile`` in tools/perplexity, numpy's default): ``sorted[(n-1)*fraction]`` interpolated.

    Raises:
        ValueError: ``values`` empty, or ``fraction`` outside [0, 1].
    """
    if values.numel() == 0:
        raise ValueError("`values` is empty")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"`fraction` must be in [0, 1], got {fraction!r}")
    flat = values.detach().double().flatten().sort().values
    pos = fraction * (flat.numel() - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, flat.numel() - 1)
    return float(flat[lo] + (pos - lo) * (flat[hi] - flat[lo]))


def kl_summary(kl: torch.Tensor) -> dict:
    """Mean, 99th percentile and maximum of per-position KL values (llama.cpp's "Mean KLD", "99.0% KLD",
    "Maximum KLD"), over every ``(batch, step)`` position alike.

    Args:
        kl: ``[batch, steps]`` nats, e.g. from :func:`kl_divergence`.

    Returns:
        ``{"kl_mean": float, "kl_p99": float, "kl_max": float, "kl_positions": int}`` (nats; positions counted).

    Raises:
        ValueError: ``kl`` is not 2-D, is empty, or holds a negative or non-finite value.
    """
    if kl.dim() != 2 or kl.numel() == 0:
        raise ValueError(f"`kl` must be a non-empty [batch, steps] tensor, got shape {tuple(kl.shape)}")
    if not bool(torch.isfinite(kl).all()) or bool((kl < 0).any()):
        raise ValueError(
            f"`kl` must hold finite values >= 0, got min {float(kl.min())} and max {float(kl.max())}"
        )
    return {
        "kl_mean": float(kl.double().mean()),
        "kl_p99": percentile(kl, 0.99),
        "kl_max": float(kl.max()),
        "kl_positions": int(kl.numel()),
    }
