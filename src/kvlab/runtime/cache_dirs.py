"""Where kvlab keeps what it builds once and reuses: ``$XDG_CACHE_HOME/kvlab/<part>`` (default ``~/.cache/kvlab``),
each part overridable by its own environment variable. Pure Python; no torch."""

from __future__ import annotations

import os
from collections.abc import Callable
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


def build_once(target: Path, build: Callable[[Path], None]) -> bool:
    """``build(target)`` unless ``target`` exists, holding an exclusive ``flock`` on its folder (created if needed)
    meanwhile: processes that need it at the same time (``kvlab eval`` and its forked probe helper, both on their
    first fused decode) build it once; the others wait, then find it built. The lock belongs to an open file
    descriptor, so a build that is killed leaves no lock behind (a lock file that outlives its build blocks every
    later one: torch's C++ extension builds wait forever on such a file). Without ``fcntl`` (not POSIX) it builds
    unlocked. Returns whether this call built ``target``.

    Raises:
        OSError: the folder cannot be created or opened; whatever ``build`` raises (the lock is released).
    """
    if target.exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        build(target)
        return True
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd is closed, by this process or its exit
        if target.exists():  # built by the process that held the lock
            return False
        build(target)
        return True
    finally:
        os.close(fd)
