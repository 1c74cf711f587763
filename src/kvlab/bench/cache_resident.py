"""Which ``kvlab bench kernel`` figures may come from the CPU's caches rather than from DRAM.

A kernel's GB/s is its bytes read over its time, set against the machine's copy bandwidth (a DRAM figure: the copy
probe streams buffers far larger than the caches). A kernel whose bytes are fewer than the last-level cache can
read them from that cache on every timed call after the first (the calls repeat over the same K/V, and the KIVI
kernels of one bit width run back to back over the same packed codes), so its "% of copy" may pass 100 % or
mislead: ``--quick``'s 512 and 2048 tokens of a Llama layer are 1-8 MiB. Such a kernel is marked ``in_cache`` in
the record and its share is shown with :data:`IN_CACHE` beside it. The cache can only make a kernel look faster
than DRAM allows, so a target still counts such a kernel when it falls short, but never counts it as met.

The cache is the last-level (highest-level) data or unified cache of CPU 0, read from Linux's
``/sys/devices/system/cpu/cpu0/cache/index*/{level,type,size}``, else ``os.sysconf("SC_LEVEL3_CACHE_SIZE")``
(glibc); unknown (another OS, a container hiding both) -> nothing is marked. CPU runs only: a CUDA kernel reads
the GPU's memory, whose L2 this does not read. Torch-free: ``kvlab bench docs`` renders stored records with it, and
a record written before this check (no ``last_level_cache``) is rendered as before.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

IN_CACHE = "in cache"  # the table cell of a cache-resident kernel
IN_CACHE_NOTE = "in cache: not a DRAM figure"
SYS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def size_bytes(text: str) -> int | None:
    """Bytes of a sysfs cache size (``"32768K"``, ``"1M"``, ``"512"``); None for text that is not one."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, flags=re.IGNORECASE)
    if not m or int(m.group(1)) == 0:
        return None
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def _sysfs_cache(root: Path) -> dict | None:
    """The highest-level data or unified cache listed under ``root`` (``index*`` folders), or None."""
    best = None
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            nbytes = size_bytes((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and nbytes and (best is None or level > best["level"]):
            best = {"bytes": nbytes, "level": level, "source": str(index / "size")}
    return best


def last_level_cache(root: Path = SYS_CACHE) -> dict | None:
    """``{"bytes", "level", "source"}`` of this machine's last-level CPU cache (see the module docstring), or None
    where neither sysfs nor ``os.sysconf`` states it."""
    found = _sysfs_cache(root)
    if found:
        return found
    try:
        nbytes = os.sysconf("SC_LEVEL3_CACHE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a name this OS knows
        return None
    return {"bytes": nbytes, "level": 3, "source": "os.sysconf('SC_LEVEL3_CACHE_SIZE')"} if nbytes > 0 else None


def mark_in_cache(row: dict, cache: dict | None) -> None:
    """Add ``in_cache: true`` to each kernel of a measured kernel ``row`` whose bytes read are fewer than
    ``cache["bytes"]`` (:func:`last_level_cache`), and ``kivi_in_cache`` / ``sdpa_in_cache`` for the row's first
    KIVI kernel and SDPA; nothing for a failed row or an unknown cache."""
    if cache is None or row.get("status") == "failed":
        return
    for kernel in row["kernels"].values():
        if kernel["bytes"] < cache["bytes"]:
            kernel["in_cache"] = True
    for side in ("kivi", "sdpa"):
        if row[f"{side}_bytes"] < cache["bytes"]:
            row[f"{side}_in_cache"] = True


def share_text(fraction: float, in_cache: bool, fmt: str = ".0%") -> str:
    """A kernel's GB/s over the copy bandwidth as a table shows it: ``"37%"``, or ``"132% in cache"`` for a
    cache-resident kernel (its bytes fit the last-level cache: not a DRAM figure)."""
    return f"{fraction:{fmt}} {IN_CACHE}" if in_cache else format(fraction, fmt)


def cache_sentence(result: dict) -> str:
    """The sentence under a kernel record's tables that says what *in cache* means, naming the cache; empty when no
    kernel of the record is marked."""
    cache = result.get("last_level_cache")
    marked = any(k.get("in_cache") for r in result["rows"] for k in (r.get("kernels") or {}).values())
    marked = marked or any(r.get("kivi_in_cache") or r.get("sdpa_in_cache") for r in result["rows"])
    if not cache or not marked:
        return ""
    return (
        f" *{IN_CACHE}*: the kernel reads fewer bytes than this CPU's {cache['bytes'] / 2**20:,.0f} MiB level-"
        f"{cache['level']} cache, so its GB/s may come from that cache ({IN_CACHE_NOTE}); its share of the copy "
        "bandwidth can only be flattered by it, so a target counts it when it falls short and never as met."
    )
