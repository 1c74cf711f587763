"""Fit: the largest batch at a context, or the longest context at a batch, under a per-GPU memory budget.

The budget is one GPU's memory (``--gpu-mem-gib``, binary GiB, or a hardware-table row's memory as the device
reports it: an "80GB" A100 holds 81,920 MiB = 80 GiB) minus an overhead reserve for activations, workspace and the framework, minus the weights' shard; the KV cache
gets the rest (docs/plan.md, Ledger and fit: 80 GiB - 14.96 GiB weights - 4 GiB reserve = 61.04 GiB for KV).
A sequence must fit at every length it passes while decoding (:func:`kvlab.plan.ledger.kv_bytes_peak`).
Pure Python; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvlab.plan.config_fields import check_int, check_int_at_least
from kvlab.plan.kv_formats import KVDtype
from kvlab.plan.ledger import kv_bytes_peak
from kvlab.plan.spec import ModelSpec
from kvlab.plan.weights import WeightBytes

GIB = 1024**3
MAX_SEARCH_TOKENS = 1 << 40  # contexts that still fit here count as "not limited by memory"


@dataclass(frozen=True)
class GpuBudget:
    """Memory of one GPU and what is kept back from it."""

    memory_bytes: int  # the GPU's memory
    reserve_bytes: int = 0  # overhead kept free: activations, workspace, framework, fragmentation
    source: str = ""  # where memory_bytes comes from, with its unit

    def __post_init__(self) -> None:
        check_int_at_least("memory_bytes", self.memory_bytes, 1)
        if not isinstance(self.reserve_bytes, int) or self.reserve_bytes < 0:
            raise ValueError(f"`reserve_bytes` must be a non-negative integer, got {self.reserve_bytes!r}")
        if self.reserve_bytes >= self.memory_bytes:
            raise ValueError(
                f"`reserve_bytes` ({self.reserve_bytes:,} B) must be less than the GPU memory "
                f"({self.memory_bytes:,} B): nothing would be left for weights and KV"
            )

    def kv_budget_bytes(self, weight_bytes_per_gpu: int | WeightBytes) -> int:
        """Bytes left for the KV cache after weights and reserve: ``memory_bytes - reserve_bytes - weights``.

        Args:
            weight_bytes_per_gpu: the weights one GPU holds, in bytes: an int, or a
                :class:`~kvlab.plan.weights.WeightBytes` (:func:`~kvlab.plan.weights.weight_bytes`), read as its
                ``total_bytes``, the whole model on this GPU. With tensor parallelism pass the shard as an int
                (``ceil(total_bytes / tp)``, as :attr:`kvlab.plan.ledger.Ledger.weight_bytes_per_gpu`).

        Returns:
            Bytes, to pass to :func:`max_batch` / :func:`max_context`; may be negative (weights and reserve exceed
            the memory: nothing fits, :meth:`shortfall_note` says by how much).

        Raises:
            ValueError: ``weight_bytes_per_gpu`` neither an int >= 0 nor a ``WeightBytes`` (the value named).
        """
        return self.memory_bytes - self.reserve_bytes - _weight_bytes(weight_bytes_per_gpu)

    def shortfall_note(self, weight_bytes_per_gpu: int | WeightBytes) -> str | None:
        """``does not fit: ...`` when the weights and the reserve exceed the memory (:func:`max_batch` and
        :func:`max_context` are then 0 for any sequence), naming by how much; None when they leave room for KV.

        Raises:
            ValueError: as :meth:`kv_budget_bytes`.
        """
        weight_bytes_per_gpu = _weight_bytes(weight_bytes_per_gpu)
        free = self.kv_budget_bytes(weight_bytes_per_gpu)
        if free >= 0:
            return None
        reserve = f" and the reserve ({self.reserve_bytes / GIB:,.2f} GiB)" if self.reserve_bytes else ""
        return (
            f"does not fit: the weights ({weight_bytes_per_gpu / GIB:,.2f} GiB per GPU){reserve} exceed the GPU "
            f"memory ({self.memory_bytes / GIB:,.2f} GiB) by {-free / GIB:,.2f} GiB, so no KV cache fits (max batch "
            "and max context 0); give more memory (--gpu-mem-gib, --gpu, --tp) or smaller weights (--weight-dtype)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"memory_bytes": self.memory_bytes, "reserve_bytes": self.reserve_bytes, "source": self.source}


def _weight_bytes(weights: int | WeightBytes) -> int:
    """``weights`` as bytes: an int >= 0 as given, a :class:`WeightBytes` as its ``total_bytes``."""
    if isinstance(weights, WeightBytes):
        return weights.total_bytes
    if not isinstance(weights, int) or isinstance(weights, bool) or weights < 0:
        raise ValueError(
            f"`weight_bytes_per_gpu` must be the weights' bytes on one GPU, an int >= 0 or a WeightBytes "
            f"(kvlab.plan.weight_bytes(spec)), got {weights!r}"
        )
    return weights


def _check_reserve(reserve_gib: float, memory_bytes: int, memory_text: str) -> None:
    """Raise when a reserve of ``reserve_gib`` GiB is not less than ``memory_bytes`` (described by ``memory_text``)."""
    if int(round(reserve_gib * GIB)) >= memory_bytes:
        raise ValueError(
            f"the reserve (`reserve_gib` {reserve_gib:g}) is not less than the GPU memory ({memory_text}): "
            "nothing would be left for weights and KV"
        )


def check_memory_gib(memory_gib: float, name: str = "gpu_mem_gib") -> None:
    """A device memory of ``memory_gib`` GiB must be a finite number > 0, also once counted in bytes (``inf``,
    ``nan``, 0 and -3 have no bytes to size; ``1e308`` overflows).

    Args:
        memory_gib: the memory, in GiB (2**30 B).
        name: the caller's parameter, named in the error (``"gpu_mem_gib"``: the CLI names its flag,
            ``--gpu-mem-gib``, through :func:`kvlab.commands.plan.flags.flag_message`).

    Raises:
        ValueError: ``"`name` must be a finite number of GiB > 0, got ..."``.
    """
    if not (memory_gib > 0 and math.isfinite(memory_gib * GIB)):
        raise ValueError(f"`{name}` must be a finite number of GiB > 0, got {memory_gib!r}")


def budget_from_gib(memory_gib: float, reserve_gib: float = 0.0) -> GpuBudget:
    """A budget of ``memory_gib`` GiB (2**30 B) with ``reserve_gib`` GiB kept back.

    Raises:
        ValueError: ``memory_gib`` not a finite number > 0 (:func:`check_memory_gib`), ``reserve_gib`` negative or
            not finite, or a reserve not below the memory; each names the parameter and the value.
    """
    return gib_budget(memory_gib, reserve_gib, "memory_gib")


def gib_budget(memory_gib: float, reserve_gib: float, memory_name: str) -> GpuBudget:
    """:func:`budget_from_gib` for a caller whose memory parameter is called ``memory_name`` (the planner
    report's ``gpu_mem_gib``), named in the errors."""
    check_memory_gib(memory_gib, memory_name)
    if not (reserve_gib >= 0 and math.isfinite(reserve_gib * GIB)):
        raise ValueError(f"`reserve_gib` must be a finite number of GiB >= 0, got {reserve_gib!r}")
    _check_reserve(reserve_gib, int(round(memory_gib * GIB)), f"`{memory_name}` {memory_gib:g} GiB")
    return GpuBudget(
        int(round(memory_gib * GIB)),
        int(round(reserve_gib * GIB)),
        f"--gpu-mem-gib {memory_gib:g} (GiB, 2^30 B)",
    )


def budget_from_hardware(hardware, reserve_gib: float = 0.0) -> GpuBudget:
    """A budget from a :class:`~kvlab.plan.hardware.Hardware` row's memory as the device reports it
    (``memory.total`` in MiB: A100-80GB 81,920 MiB = 80 GiB) with ``reserve_gib`` GiB kept back.

    Raises:
        ValueError: the row has no memory size, or the reserve is negative, not finite or not below the memory.
    """
    if hardware.memory_bytes is None:
        raise ValueError(f"{hardware.name} has no memory size; use budget_from_gib (the CLI: --gpu-mem-gib)")
    if not reserve_gib >= 0 or not math.isfinite(reserve_gib * GIB):
        raise ValueError(f"`reserve_gib` must be finite and >= 0, got {reserve_gib!r}")
    memory_text = f"{hardware.name}: {hardware.memory_mib:,} MiB = {hardware.memory_bytes / GIB:,.2f} GiB"
    _check_reserve(reserve_gib, hardware.memory_bytes, memory_text)
    return GpuBudget(
        hardware.memory_bytes,
        int(round(reserve_gib * GIB)),
        f"{hardware.describe_memory()} (nvidia-smi memory.total; allocatable bytes are somewhat less)",
    )


def max_batch(
    spec: ModelSpec,
    context: int,
    kv_budget_bytes: int,
    kv: str | KVDtype = "auto",
    *,
    tp: int = 1,
    mode: str = "theoretical",
) -> int:
    """Most sequences of ``context`` tokens whose KV fits in ``kv_budget_bytes`` on one GPU (0 if none; also 0 for a
    negative budget, weights and reserve past the memory, which :meth:`GpuBudget.shortfall_note` explains).

    A sequence is sized by :func:`~kvlab.plan.ledger.kv_bytes_peak`, the most bytes it holds at any length up to
    ``context`` (a decoding sequence passes every length): for a plain dtype the bytes at ``context``; for KIVI
    possibly more, at a length just before a flush (the residual window full, ``R + j*G - 1`` tokens), since each
    flush turns ``G`` full-precision tokens into codes and the bytes drop.

    Args:
        spec: the model. context: tokens per sequence. kv_budget_bytes: bytes for the KV cache on one GPU
            (:meth:`GpuBudget.kv_budget_bytes`). kv, tp, mode: as :func:`~kvlab.plan.ledger.kv_bytes`.

    Raises:
        ValueError: ``kv_budget_bytes`` not an int (a float, NaN or infinity), a context that stores no KV, or what
            :func:`~kvlab.plan.ledger.kv_bytes` refuses (``context`` not an int >= 0, an unknown ``kv``, a bad
            ``tp`` or ``mode``).
    """
    check_int("kv_budget_bytes", kv_budget_bytes)
    per_sequence = kv_bytes_peak(spec, context, 1, kv, tp=tp, mode=mode)
    if kv_budget_bytes < 0:
        return 0
    if per_sequence == 0:
        raise ValueError(
            f"a sequence of {context:,} tokens stores no KV: the batch is not limited by KV memory"
        )
    return kv_budget_bytes // per_sequence


def max_context(
    spec: ModelSpec,
    batch: int,
    kv_budget_bytes: int,
    kv: str | KVDtype = "auto",
    *,
    tp: int = 1,
    mode: str = "theoretical",
) -> int | None:
    """Longest context ``T`` such that ``batch`` sequences fit at every length ``<= T`` (0 if even one token
    does not fit; ``None`` if memory never limits it, e.g. every KV layer is window-capped).

    Raises:
        ValueError: ``batch`` not an int >= 1, or ``kv_budget_bytes`` not an int (a float, NaN or infinity).
    """
    check_int_at_least("batch", batch, 1)
    check_int("kv_budget_bytes", kv_budget_bytes)

    def fits(t: int) -> bool:
        return kv_bytes_peak(spec, t, batch, kv, tp=tp, mode=mode) <= kv_budget_bytes

    if not fits(0) or not fits(1):
        return 0
    if fits(MAX_SEARCH_TOKENS):
        return None
    return longest_fitting(fits)  # fits is monotone because kv_bytes_peak is


def longest_fitting(fits: Callable[[int], bool], lo: int = 1, hi: int = MAX_SEARCH_TOKENS) -> int:
    """The largest ``t`` in ``[lo, hi)`` with ``fits(t)``, by bisection: ``fits`` must be monotone (true up to some
    length, false beyond), ``fits(lo)`` hold and ``fits(hi)`` is taken as false (``hi`` is never asked)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
