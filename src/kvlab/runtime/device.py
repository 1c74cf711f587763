"""Devices: resolve a name to a ``torch.device``, and wait for queued work before reading a clock.

The name grammar (:func:`check_device_name`) is torch-free, so torch-free settings (``kvlab.eval.config``) check a
device with the same rule as the commands that run on it; torch is imported by the functions that need it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEVICE_CHOICES = "cpu, cuda, cuda:N or auto"
"""What every ``--device`` takes (eval, bench, tasks), in the words their errors use."""

_CUDA_INDEX = re.compile(r"cuda:(0|[1-9][0-9]*)")


def check_device_name(device: object) -> str:
    """``device`` if it is ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (N a plain decimal >= 0) or ``"auto"`` (torch-free).

    Other names torch parses (``mps``, ``meta``, ``xpu``, ``cpu:0``, ``cuda:01``) are refused: kvlab runs and
    measures on CPU and CUDA only.

    Raises:
        ValueError: any other value (named), e.g. ``""``, ``"cuda:"``, ``"cuda:-1"``, ``"cuda:0x1"``.
    """
    if isinstance(device, str) and (device in ("auto", "cpu", "cuda") or _CUDA_INDEX.fullmatch(device)):
        return device
    raise ValueError(f"`device` must be {DEVICE_CHOICES}, got {device!r}")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None``/``"auto"`` -> CUDA when available, else CPU; anything else is checked by :func:`check_device`.

    Raises:
        ValueError: a name outside :data:`DEVICE_CHOICES`, or CUDA (or a CUDA index) requested that this machine
            does not have (the value named).
    """
    import torch

    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return check_device(device)


def check_device(device: str | torch.device) -> torch.device:
    """``device`` (``cpu``, ``cuda`` or ``cuda:N``; no ``"auto"``: see :func:`resolve_device`) as a ``torch.device``,
    with CUDA checked present and ``N`` below ``torch.cuda.device_count()``.

    Raises:
        ValueError: a name outside ``cpu, cuda, cuda:N`` (see :func:`check_device_name`), CUDA requested but not
            available, or a CUDA index this machine does not have (the value named).
    """
    import torch

    name = str(device) if isinstance(device, torch.device) else device
    if name == "auto" or not isinstance(name, str):
        raise ValueError(f"`device` must be cpu, cuda or cuda:N, got {device!r}")
    check_device_name(name)
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"`device` is {device!r} but CUDA is not available")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(
            f"`device` is {device!r} but this machine has {torch.cuda.device_count()} CUDA device(s) "
            f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})"
        )
    return dev


def synchronize(device: torch.device) -> None:
    """Wait for queued CUDA work so wall-clock timings cover it (no-op on CPU)."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
