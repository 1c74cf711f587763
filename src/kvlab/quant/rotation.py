"""Randomized Hadamard rotation of the head dimension before a K/V cache is rounded.

Why: a floating-point format (FP8) keeps a fixed *relative* error per element (e4m3: <= 2^-4, about 2.6 % RMS), so
the error of an attention score ``q . k = sum_c q_c k_c`` has variance ``eps^2 * sum_c (q_c k_c)^2``. When a few
channels carry the score (the per-channel key outliers KIVI quantizes around), that sum is close to ``score^2`` and
the score moves by ``eps`` of itself. An orthonormal rotation ``R`` leaves every score unchanged
(``(q R) . (k R) = q . k``) and spreads one channel's energy over all ``D`` of them, so the same relative rounding
of ``k R`` moves the score by about ``eps / sqrt(D)`` of it. The cache stores ``round(k R)`` and reads back
``round(k R) R^T``: no bytes added, one ``[D, D]`` product per read.

``R = H_D diag(s) / sqrt(D)``: Sylvester's Hadamard matrix of order ``D`` (a power of two) with its columns'
signs flipped by a fixed seeded draw ``s`` (a random sign keeps one input channel from landing on a structured
output pattern). Source: QuaRot (Ashkboos et al., 2024, arXiv:2404.00456, section 3 and section 4.2, rotating K/V before
quantizing the cache); QuIP# (Tseng et al., 2024, arXiv:2402.04396, section 3, the randomized Hadamard transform).
"""

from __future__ import annotations

import numbers

import torch

ROTATIONS: tuple[str, ...] = ("none", "hadamard")
HADAMARD_SEED = 0  # the sign draw: fixed, so every cache (and every run) rotates the same way


def check_rotation(rotation: str) -> str:
    """Return ``rotation`` if it is one of :data:`ROTATIONS`; raise ``ValueError`` naming it otherwise."""
    if not isinstance(rotation, str) or rotation not in ROTATIONS:
        raise ValueError(f"`rotation` must be one of {list(ROTATIONS)}, got {rotation!r}")
    return rotation


def hadamard(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The ``[n, n]`` float32 orthonormal randomized Hadamard matrix ``R`` (``R @ R.T == I`` to float32 rounding).

    ``x @ R`` rotates the last axis of ``x``; ``y @ R.T`` undoes it.

    Args:
        n: the head dimension, a power of two (Sylvester's construction).
        device: where the matrix is built.

    Raises:
        ValueError: ``n`` not a positive power of two (the message names it).
    """
    if isinstance(n, numbers.Integral) and not isinstance(n, bool):
        n = int(n)  # numpy and torch integers too
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0 or n & (n - 1):
        raise ValueError(
            f"a Hadamard rotation needs a power-of-two head_dim (Sylvester's construction), got {n!r}"
        )
    h = torch.ones(1, 1, dtype=torch.float32)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), dim=1), torch.cat((h, -h), dim=1)), dim=0)
    signs = torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(HADAMARD_SEED)) * 2 - 1
    return (h * signs.to(torch.float32) / n**0.5).to(device)
