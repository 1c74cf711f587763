"""Accelerator table: dense 16-bit tensor FLOP/s and memory bandwidth from vendor datasheets, memory as the device
reports it.

Every row names its datasheet (FLOP/s, bandwidth) and, separately, where its memory size was read. Vendors print
sparse ("with sparsity") tensor throughput next to dense; this table keeps the *dense* figure (half the sparse
one). Bandwidth is the datasheet's decimal unit (1 TB/s = 1e12 B/s).

Memory is held as the device reports it, not as the datasheet's "GB": an "80GB" A100 reports 81,920 MiB in
``nvidia-smi`` (``memory.total``), exactly 80 GiB, not 80e9 B (74.5 GiB), and an "80GB" H100 81,559 MiB. The
mechanics chapter's 80 GiB budget is the A100's. The bytes a framework can allocate are somewhat less (the
driver and the CUDA context keep some; ``torch.cuda.mem_get_info`` tells). Names match case-insensitively,
ignoring spaces and underscores.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from kvlab.plan.config_fields import check_int_at_least

MIB = 1024**2
TERA = 1e12  # the table's TFLOP/s and TB/s in FLOP/s and B/s

_NVIDIA_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_NVIDIA_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_NVIDIA_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_NVIDIA_L4 = "https://www.nvidia.com/en-us/data-center/l4/"
_NVIDIA_L40S = "https://www.nvidia.com/en-us/data-center/l40s/"
_NVIDIA_A10 = "https://www.nvidia.com/en-us/data-center/products/a10-gpu/"
_NVIDIA_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
_AMD_MI300X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"

# Where each memory size was read: public nvidia-smi (memory.total) or rocminfo output of that device.
_SMI_CLOUD = (
    "nvidia-smi memory.total of a cloud provider's fleet, listed in "
    "https://github.com/modal-labs/modal-client/pull/2797"
)
_SMI_H200 = "nvidia-smi of an 8x H200 node in https://github.com/sgl-project/sglang/issues/3196"
_SMI_4090 = "nvidia-smi of two RTX 4090 in https://github.com/RLinf/RLinf/issues/255"
_SMI_A100_PCIE = (
    "81920 MiB, as the SXM4 part (the same 80 GB of HBM2e): hardware template 'ram/size' of "
    "https://github.com/quattor/template-library-standard/blob/0e43c176adea249da689d464661c749471fa24c6/hardware/card/gpu/nvidia/tesla_a100_80gb-pcie.pan"
)
_SMI_H100_PCIE = (
    "81559 MiB in public nvidia-smi listings of 'NVIDIA H100 PCIe' (no stable URL recorded), as the SXM part "
    "(https://github.com/modal-labs/modal-client/pull/2797)"
)
_ROCMINFO_MI300X = "rocminfo GPU pool of 201,310,208 KiB in https://github.com/ROCm/rocm-examples/issues/187"


def _per_second(value: float, scale: float) -> float:
    """``value`` (a rate in units of ``scale`` per second) as a whole number per second, as the table counts FLOP/s
    and B/s; inf when it does not fit in a float."""
    per_s = value * scale
    return float(round(per_s)) if math.isfinite(per_s) else math.inf


def check_rate(name: str, value: object, scale: float, unit: str) -> None:
    """Refuse a device rate ``value`` in ``unit`` (``scale`` FLOP/s or B/s per unit: 1e12 for TFLOP/s and TB/s,
    1e9 for GB/s) that is not a finite number > 0, or that is 0 or infinite once counted in whole FLOP/s or B/s
    as :class:`Hardware` counts them (a ridge point or a decode bound would divide by 0 or be inf).

    Raises:
        ValueError: naming ``name`` and ``value``, with the range of ``unit`` that is representable.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}")
    per_s = _per_second(value, scale)
    base = "FLOP/s" if "FLOP" in unit else "B/s"
    if per_s < 1:
        raise ValueError(
            f"`{name}` must be at least {1 / scale:g} {unit} (1 {base}: rates are counted in whole {base}), "
            f"got {value:g} {unit}"
        )
    if per_s == math.inf:
        raise ValueError(
            f"`{name}` must be below {sys.float_info.max / scale:.4g} {unit} (the largest float in {base}), "
            f"got {value:g} {unit}"
        )


@dataclass(frozen=True)
class Hardware:
    """One accelerator: datasheet compute and bandwidth, memory as the device reports it."""

    name: str  # canonical name, e.g. "A100-80GB"
    tflops_16bit: float | None  # dense BF16 (FP16 where noted) tensor TFLOP/s, datasheet; None: unknown
    bandwidth_tb_s: float  # memory bandwidth, TB/s (1e12 B/s), datasheet
    memory_mib: int | None  # memory.total as the device reports it, MiB (2^20 B); None: unknown
    source: str  # datasheet URL (FLOP/s, bandwidth, the product's "GB")
    memory_source: str = ""  # where memory_mib was read
    datasheet_memory_gb: float | None = None  # the datasheet's (and the name's) "80 GB"; not used for fitting
    note: str = ""  # form factor, dtype caveats

    def __post_init__(self) -> None:
        for name in ("tflops_16bit", "bandwidth_tb_s", "datasheet_memory_gb"):
            value = getattr(self, name)
            if (value is not None or name == "bandwidth_tb_s") and not (
                isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < float("inf")
            ):
                raise ValueError(f"`{name}` must be > 0, got {value!r}")
        for name, unit in (("tflops_16bit", "TFLOP/s"), ("bandwidth_tb_s", "TB/s")):
            value = getattr(self, name)
            if value is not None:
                check_rate(name, value, TERA, unit)
        if self.memory_mib is not None:
            check_int_at_least("memory_mib", self.memory_mib, 1)

    @property
    def peak_flops(self) -> float | None:
        """FLOP/s (None when unknown)."""
        return None if self.tflops_16bit is None else _per_second(self.tflops_16bit, TERA)

    @property
    def bandwidth_bytes_s(self) -> float:
        """Bytes/s."""
        return _per_second(self.bandwidth_tb_s, TERA)

    @property
    def memory_bytes(self) -> int | None:
        """Device memory in bytes: ``memory_mib * 2**20`` (A100-80GB: 85,899,345,920 B = 80 GiB)."""
        return None if self.memory_mib is None else self.memory_mib * MIB

    @property
    def memory_gib(self) -> float | None:
        """Device memory in GiB (2^30 B)."""
        return None if self.memory_mib is None else self.memory_mib / 1024

    @property
    def ridge_flop_per_byte(self) -> float | None:
        """Roofline ridge point: peak FLOP/s / bandwidth (docs/plan.md, Roofline: A100 312e12 / 2.039e12 = 153)."""
        return None if self.peak_flops is None else self.peak_flops / self.bandwidth_bytes_s

    def describe_memory(self) -> str:
        """``"A100-80GB: 81,920 MiB = 80.00 GiB as the device reports it"`` (or that it is unknown)."""
        if self.memory_mib is None:
            return f"{self.name}: memory unknown"
        return f"{self.name}: {self.memory_mib:,} MiB = {self.memory_gib:.2f} GiB as the device reports it"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "tflops_16bit": self.tflops_16bit,
            "bandwidth_tb_s": self.bandwidth_tb_s,
            "memory_mib": self.memory_mib,
            "memory_bytes": self.memory_bytes,
            "memory_gib": self.memory_gib,
            "datasheet_memory_gb": self.datasheet_memory_gb,
            "ridge_flop_per_byte": self.ridge_flop_per_byte,
            "source": self.source,
            "memory_source": self.memory_source,
            "note": self.note,
        }


def _row(name, tflops, tb_s, mib, source, memory_source, gb, note=""):
    return Hardware(name, tflops, tb_s, mib, source, memory_source, gb, note)


HARDWARE: tuple[Hardware, ...] = (
    _row("A100-40GB", 312, 1.555, 40_960, _NVIDIA_A100, _SMI_CLOUD, 40, "SXM; 624 TFLOP/s with sparsity"),
    _row(
        "A100-80GB",
        312,
        2.039,
        81_920,
        _NVIDIA_A100,
        _SMI_CLOUD,
        80,
        "SXM; the mechanics chapter's A100 (312 TFLOP/s, 2.039 TB/s, 80 GiB)",
    ),
    _row("A100-80GB-PCIe", 312, 1.935, 81_920, _NVIDIA_A100, _SMI_A100_PCIE, 80, "PCIe"),
    _row("H100-SXM", 989, 3.35, 81_559, _NVIDIA_H100, _SMI_CLOUD, 80, "SXM5; 1,979 TFLOP/s with sparsity"),
    _row(
        "H100-PCIe", 756, 2.0, 81_559, _NVIDIA_H100, _SMI_H100_PCIE, 80, "PCIe; 1,513 TFLOP/s with sparsity"
    ),
    _row("H200", 989, 4.8, 143_771, _NVIDIA_H200, _SMI_H200, 141, "SXM; 1,979 TFLOP/s with sparsity"),
    _row("L4", 121, 0.3, 23_034, _NVIDIA_L4, _SMI_CLOUD, 24, "242 TFLOP/s with sparsity"),
    _row("L40S", 362.05, 0.864, 46_068, _NVIDIA_L40S, _SMI_CLOUD, 48, "733 TFLOP/s with sparsity"),
    _row("A10", 125, 0.6, 23_028, _NVIDIA_A10, _SMI_CLOUD, 24, "250 TFLOP/s with sparsity"),
    _row(
        "RTX-4090",
        165.2,
        1.008,
        24_564,
        _NVIDIA_ADA,
        _SMI_4090,
        24,
        "BF16 with FP32 accumulate; Ada whitepaper",
    ),
    _row(
        "MI300X",
        1307.4,
        5.3,
        196_592,
        _AMD_MI300X,
        _ROCMINFO_MI300X,
        192,
        "AMD; 2,614.9 TFLOP/s with sparsity",
    ),
)

# Short names people type, mapped to a row.
ALIASES = {
    "a100": "A100-80GB",
    "h100": "H100-SXM",
    "h200-sxm": "H200",
    "4090": "RTX-4090",
    "rtx4090": "RTX-4090",
}


def _key(name: str) -> str:
    return str(name).strip().lower().replace("_", "-").replace(" ", "-")


_BY_KEY = {_key(h.name): h for h in HARDWARE}
_BY_KEY.update({_key(alias): _BY_KEY[_key(target)] for alias, target in ALIASES.items()})


def names() -> list[str]:
    """Canonical names of every row."""
    return [h.name for h in HARDWARE]


def get_hardware(name: str) -> Hardware:
    """The row called ``name`` (case-insensitive; ``_`` and spaces read as ``-``; aliases like ``a100``).

    Raises:
        ValueError: no row matches; the message lists the names.
    """
    hw = _BY_KEY.get(_key(name))
    if hw is None:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(names())} (aliases: {', '.join(ALIASES)})")
    return hw


def memory_override(gpu: str | None, memory_gib: float | None) -> str | None:
    """kvlab's one rule for ``--gpu`` and ``--gpu-mem-gib`` given together (``kvlab plan``, its ``--from-log``,
    ``kvlab paging``): the ``--gpu`` row names the device (its bandwidth and compute, where the command uses them),
    the explicit ``--gpu-mem-gib`` (GiB, 2**30 B) its memory, in place of the row's: a what-if such as an H100 given
    80 GiB. Returns the words that say so (``"--gpu-mem-gib 80 GiB in place of the H100-SXM's 81,559 MiB = 79.65
    GiB"``), for a note or a budget's source; None unless both are given and the row states a memory.

    Raises:
        ValueError: an unknown ``gpu`` (:func:`get_hardware`, the table's names listed).
    """
    if gpu is None or memory_gib is None:
        return None
    hw = get_hardware(gpu)
    if hw.memory_mib is None:  # a row without memory needs --gpu-mem-gib: nothing is replaced
        return None
    return f"--gpu-mem-gib {memory_gib:g} GiB in place of the {hw.name}'s {hw.memory_mib:,} MiB = {hw.memory_gib:.2f} GiB"


def memory_override_notes(gpu: str | None, memory_gib: float | None) -> list[str]:
    """The plan report's note of :func:`memory_override` (``[]`` when nothing is replaced)."""
    words = memory_override(gpu, memory_gib)
    return [] if words is None else [f"device memory: {words} (--gpu {gpu} gives the device: its bandwidth and compute)"]


def custom_hardware(
    bandwidth_gb_s: float, tflops: float | None = None, memory_mib: int | None = None
) -> Hardware:
    """A user-described accelerator (``--bandwidth-gb-s`` GB/s, ``--tflops``, memory in MiB); unknown values stay
    ``None`` and bound nothing.

    Raises:
        ValueError: a bandwidth or TFLOP/s that is not a finite number > 0, or that is below 1 B/s or 1 FLOP/s or
            too large for a float once counted in B/s or FLOP/s (:func:`check_rate`; named ``bandwidth_gb_s`` /
            ``tflops``), or an invalid memory.
    """
    check_rate("bandwidth_gb_s", bandwidth_gb_s, 1e9, "GB/s")
    if tflops is not None:
        check_rate("tflops", tflops, TERA, "TFLOP/s")
    return Hardware(
        name="custom",
        tflops_16bit=tflops,
        bandwidth_tb_s=bandwidth_gb_s / 1000,
        memory_mib=memory_mib,
        source="given on the command line",
        memory_source="given on the command line" if memory_mib is not None else "",
    )
