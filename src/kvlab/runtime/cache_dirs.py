"""Where kvlab keeps what it builds once and reuses: ``$XDG_CACHE_HOME/kvlab/<part>`` (default ``~/.cache/kvlab``),
each part overridable by its own environment variable. Pure Python; no torch."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(part: str, env: str) -> Path:
    """The folder of one part of kvlab's cache: ``$<env>`` when set, else ``$XDG_CACHE_HOME/kvlab/<part>``, else
    ``~/.cache/kvlab/<part>``. The folder is not created here.

    Args:
        part: the sub-folder name (``"kernels"``, ``"models"``).
        env: the environment variable that overrides the whole path (``"KVLAB_KERNEL_DIR"``).
    """
    override = os.environ.get(env)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "kvlab" / part
