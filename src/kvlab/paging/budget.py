"""How many KV bytes a serving GPU can hold: the budget both paging simulators share.

Every number comes from the planner (:mod:`kvlab.plan`): KV bytes per token and weight bytes of the model at
the KV dtype, the device's memory from the hardware table. The default is the planner's default scenario
(:mod:`kvlab.plan.scenario`): Llama-3-8B in BF16 on an A100-80GB (81,920 MiB = 80 GiB as the device reports
it), 8,030,261,248 parameters x 2 bytes of weights, a 4 GiB reserve and 131,072 KV bytes per token, which leaves
500,059 tokens (61.04 GiB): the account of docs/paging.md ("Static capacity").
``--gpu-mem-gib`` (or ``--gpu``, a row of the planner's hardware table) sets another device, ``model`` and ``kv_dtype`` another model and cache. A KIVI cache's budget
carries its residual window (:class:`kvlab.paging.residual.ResidualWindow`): each request's newest tokens in the
model dtype, which the simulators charge on top of the long-context bytes per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlab.paging.residual import ResidualWindow, check_residual
from kvlab.plan.scenario import DEFAULT_GPU, DEFAULT_KV_DTYPE, DEFAULT_MODEL, DEFAULT_RESERVE_GIB

GIB = 1024**3


@dataclass(frozen=True)
class KVBudget:
    """Memory left for the KV cache once weights and a reserve are set aside.

    Args:
        gpu_bytes: assumed device memory.
        weight_bytes: model weights resident on the device.
        overhead_bytes: reserve for activations, framework and fragmentation.
        kv_bytes_per_token: KV bytes one token costs across all layers (may be fractional for quantized caches); for
            KIVI the long-context figure, codes and scale/zero pairs only.
        source: where the numbers come from, shown to the user.
        kv_dtype: the KV format's name, for the output.
        residual: a KIVI cache's full-precision residual window, charged per request on top of
            ``kv_bytes_per_token`` (None: every token costs ``kv_bytes_per_token``).

    Raises:
        ValueError: a non-finite or non-positive number (named), nothing left for the KV cache, or a residual
            window cheaper per token than ``kv_bytes_per_token`` (:func:`kvlab.paging.residual.check_residual`).
    """

    gpu_bytes: float
    weight_bytes: float
    overhead_bytes: float
    kv_bytes_per_token: float
    source: str = "mechanics chapter example: Llama-3-8B, BF16 KV, 80 GiB - weights - 4 GiB"
    kv_dtype: str = DEFAULT_KV_DTYPE
    residual: ResidualWindow | None = None

    def __post_init__(self) -> None:
        for name in ("gpu_bytes", "weight_bytes", "overhead_bytes", "kv_bytes_per_token"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"`{name}` must be finite, got {value!r}")
        if not self.kv_bytes_per_token > 0:
            raise ValueError(f"`kv_bytes_per_token` must be > 0, got {self.kv_bytes_per_token!r}")
        if self.weight_bytes < 0 or self.overhead_bytes < 0:
            raise ValueError(
                f"weights and reserve must be >= 0, got weight_bytes={self.weight_bytes!r}, "
                f"overhead_bytes={self.overhead_bytes!r}"
            )
        if self.free_bytes <= 0:
            raise ValueError(
                f"nothing left for the KV cache: {self.gpu_bytes / GIB:.2f} GiB device - "
                f"{self.weight_bytes / GIB:.2f} GiB weights - {self.overhead_bytes / GIB:.2f} GiB reserve"
            )
        check_residual(self.kv_bytes_per_token, self.residual)

    @property
    def free_bytes(self) -> float:
        """Device bytes minus weights minus reserve."""
        return self.gpu_bytes - self.weight_bytes - self.overhead_bytes

    @property
    def capacity_tokens(self) -> int:
        """Whole tokens of KV that fit in :attr:`free_bytes` (the mechanics chapter's ``int(free // bytes_per_token)``)."""
        return int(self.free_bytes // self.kv_bytes_per_token)

    @property
    def budget_bytes(self) -> float:
        """KV bytes of :attr:`capacity_tokens` tokens: the budget every policy is admitted against."""
        bpt = self.kv_bytes_per_token
        return self.capacity_tokens * (int(bpt) if float(bpt).is_integer() else bpt)

    def num_blocks(self, block_size_tokens: int) -> int:
        """Physical blocks of ``block_size_tokens`` tokens that fit in the budget."""
        if block_size_tokens < 1:
            raise ValueError(f"`block_size_tokens` must be >= 1, got {block_size_tokens!r}")
        return self.capacity_tokens // block_size_tokens

    def as_dict(self) -> dict:
        return {
            "gpu_bytes": self.gpu_bytes,
            "weight_bytes": self.weight_bytes,
            "overhead_bytes": self.overhead_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "capacity_tokens": self.capacity_tokens,
            "budget_bytes": self.budget_bytes,
            "source": self.source,
            "kv_dtype": self.kv_dtype,
            "residual_window": None if self.residual is None else self.residual.as_dict(),
        }


def default_budget(kv_dtype: str = DEFAULT_KV_DTYPE) -> KVBudget:
    """The default scenario's budget (:mod:`kvlab.plan.scenario`) at ``kv_dtype``: 61.04 GiB for BF16.

    Raises:
        ValueError: when the planner does not know ``kv_dtype``.
    """
    return planner_budget(DEFAULT_MODEL, kv_dtype)


def default_kv_bytes_per_token(kv_dtype: str) -> float:
    """KV bytes one token of the default scenario's model costs at ``kv_dtype`` (KIVI-4: 40,960 B; BF16: 131,072).

    Raises:
        ValueError: when the planner does not know ``kv_dtype``.
    """
    from kvlab.plan import kv_bytes_per_token, load_spec

    return kv_bytes_per_token(load_spec(DEFAULT_MODEL), kv_dtype)


def gpu_memory(gpu_gib: float | None = None, gpu: str | None = None) -> tuple[float, str]:
    """Device bytes and how to describe them: ``gpu_gib`` GiB (2**30 B), or the memory of the hardware table's row
    ``gpu`` (:func:`kvlab.plan.hardware.get_hardware`, as ``kvlab plan --gpu``) as the device reports it, by default
    the planner's default GPU (:data:`kvlab.plan.scenario.DEFAULT_GPU`: A100-80GB, 81,920 MiB = 80 GiB, the
    mechanics chapter's budget).

    Both given: ``gpu_gib`` is the memory, in place of the row's, and the description says so (the rule of
    ``kvlab plan``: :func:`kvlab.plan.hardware.memory_override`).

    Raises:
        ValueError: an unknown ``gpu`` (the table's names listed), or a row whose memory the table does not state
            (without ``gpu_gib``).
    """
    from kvlab.plan.hardware import get_hardware, memory_override

    if gpu_gib is not None:  # an unknown --gpu is refused by memory_override too
        return gpu_gib * GIB, memory_override(gpu, gpu_gib) or f"{gpu_gib:g} GiB"

    hw = get_hardware(DEFAULT_GPU if gpu is None else gpu)
    if hw.memory_bytes is None:
        raise ValueError(f"--gpu {gpu}: the hardware table states no memory for {hw.name}; pass --gpu-mem-gib")
    return float(hw.memory_bytes), f"{hw.name} {hw.memory_mib:,} MiB ({hw.memory_gib:.2f} GiB)"


def planner_budget(
    model: str | None = None,
    kv_dtype: str = DEFAULT_KV_DTYPE,
    gpu_gib: float | None = None,
    overhead_gib: float = DEFAULT_RESERVE_GIB,
    gpu: str | None = None,
) -> KVBudget:
    """The single adapter to :mod:`kvlab.plan`: KV bytes per token and weight bytes of ``model`` at ``kv_dtype``.

    ``model`` is anything :func:`kvlab.plan.load_spec` takes (a preset name such as ``llama-3-8b``, a
    config.json, a model directory; ``None``: the default scenario's model). Bytes per token are the planner's long-context figure
    (:func:`kvlab.plan.kv_bytes_per_token`; for KIVI codes and scale/zero pairs, the residual window amortized away,
    so a KIVI budget also carries its window, :func:`residual_window`, which the simulators charge); weights are
    :func:`kvlab.plan.weight_bytes` (the checkpoint when it sits next to the config, else parameters x dtype).
    The device has ``gpu_gib`` GiB, or the memory of the hardware table's ``gpu``, by default the planner's
    default GPU (:func:`gpu_memory`); the reserve is ``overhead_gib`` GiB.

    Raises:
        ValueError: when the planner does not know the model or the KV dtype, or cannot size the weights.
    """
    from kvlab.plan import kv_bytes_per_token, load_spec, weight_bytes

    model = DEFAULT_MODEL if model is None else model
    spec = load_spec(model)
    bpt = kv_bytes_per_token(spec, kv_dtype)
    residual = residual_window(spec, kv_dtype)
    weights = weight_bytes(spec)
    gpu_bytes, gpu_text = gpu_memory(gpu_gib, gpu)
    return KVBudget(
        gpu_bytes=gpu_bytes,
        weight_bytes=weights.total_bytes,
        overhead_bytes=overhead_gib * GIB,
        kv_bytes_per_token=bpt,
        source=f"kvlab.plan: {model}, KV {kv_dtype}, {gpu_text} - weights ({weights.source}) - "
        f"{overhead_gib:g} GiB",
        kv_dtype=kv_dtype,
        residual=residual,
    )


def residual_window(spec, kv_dtype: str) -> ResidualWindow | None:
    """The residual window of ``spec``'s KV cache at ``kv_dtype``: for a KIVI name its ``R`` and ``G`` (the name's
    ``:residual_length`` / ``:group_size``, else :data:`kvlab.cache_names.KIVI_DEFAULTS`: 128 and 32) and the bytes
    one token costs at the model dtype (:func:`kvlab.plan.kv_bytes_per_token` of the plain dtype KIVI keeps the
    window in; Llama-3-8B in bf16: 131,072 B); None for any other format.

    Raises:
        ValueError: when the planner does not know ``kv_dtype``.
    """
    from kvlab.plan import KVDtype, kv_bytes_per_token
    from kvlab.plan import kv_dtype as parse_kv_dtype

    kvd = parse_kv_dtype(kv_dtype, spec.dtype)
    if not kvd.is_kivi:
        return None
    model_dtype = parse_kv_dtype("auto", spec.dtype).name  # KIVI keeps the window in the model dtype
    full = KVDtype(model_dtype, kvd.element_bytes)
    return ResidualWindow(kvd.residual_length, kvd.group_size, kv_bytes_per_token(spec, full), model_dtype)
