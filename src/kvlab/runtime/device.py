"""Devices: resolve a name to a ``torch.device``, and wait for queued work before reading a clock."""

from __future__ import annotations

import torch


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None``/``"auto"`` -> CUDA when available, else CPU; anything else is parsed and checked.

    Raises:
        ValueError: an unparsable device, or CUDA requested but not available (the value named).
    """
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return check_device(device, accepted="cpu, cuda, cuda:N or auto")


def check_device(
    device: str | torch.device, accepted: str = "a torch device such as 'cpu' or 'cuda:0'"
) -> torch.device:
    """``device`` parsed as a ``torch.device`` (no ``"auto"``: see :func:`resolve_device`), CUDA checked present.

    Raises:
        ValueError: an unparsable device (``accepted`` says what the caller takes), or CUDA requested but not
            available (the value named).
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"`device` must be {accepted}, got {device!r}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"`device` is {device!r} but CUDA is not available")
    return dev


def synchronize(device: torch.device) -> None:
    """Wait for queued CUDA work so wall-clock timings cover it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
