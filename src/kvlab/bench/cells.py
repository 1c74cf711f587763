"""What every benchmark's ``run()`` does the same way: its context list, and the record of a cell that failed."""

from __future__ import annotations

from collections.abc import Iterable


def bench_contexts(
    contexts: Iterable[int] | None,
    quick: bool,
    device_type: str,
    defaults: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...] | None],
    *,
    sort: bool = False,
) -> tuple[int, ...]:
    """The contexts (tokens) a benchmark runs: ``contexts`` as ints (sorted with ``sort``), or a default.

    ``defaults``: ``(quick, cpu, cuda)``: the ``quick`` one with ``quick``, the ``cuda`` one on
    ``device_type == "cuda"`` when it is not None, else the ``cpu`` one.

    Raises:
        ValueError: an empty list or a context < 1 (the list named).
    """
    quick_default, cpu_default, cuda_default = defaults
    if contexts is None:
        if quick:
            contexts = quick_default
        elif device_type == "cuda" and cuda_default is not None:
            contexts = cuda_default
        else:
            contexts = cpu_default
    out = tuple(int(c) for c in contexts)
    if sort:
        out = tuple(sorted(out))
    if not out or any(c < 1 for c in out):
        raise ValueError(f"`contexts` must be positive token counts, got {out!r}")
    return out


def failed_cell(e: BaseException) -> dict:
    """The record of a cell that raised: ``{"status": "failed", "error": "<type>: <message>"}`` (500 chars)."""
    return {"status": "failed", "error": f"{type(e).__name__}: {e}"[:500]}
