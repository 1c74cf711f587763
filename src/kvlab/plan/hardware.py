"""Accelerator table from vendor datasheets: dense 16-bit tensor FLOP/s, memory bandwidth, memory size.

Every row names the datasheet it was read from. Vendors print sparse ("with sparsity") tensor throughput next to
dense; this table keeps the *dense* figure (half the sparse one). Bandwidth and memory are the datasheet's
decimal units (1 TB/s = 1e12 B/s, 80 GB = 80e9 B); the usable bytes of a real device are less and should be
queried on it (``torch.cuda.mem_get_info``). Names match case-insensitively, ignoring spaces and underscores.
"""

from __future__ import annotations

from dataclasses import dataclass

_NVIDIA_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_NVIDIA_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_NVIDIA_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_NVIDIA_L4 = "https://www.nvidia.com/en-us/data-center/l4/"
_NVIDIA_L40S = "https://www.nvidia.com/en-us/data-center/l40s/"
_NVIDIA_A10 = "https://www.nvidia.com/en-us/data-center/products/a10-gpu/"
_NVIDIA_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
_AMD_MI300X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"


@dataclass(frozen=True)
class Hardware:
    """One accelerator's datasheet numbers."""

    name: str  # canonical name, e.g. "A100-80GB"
    tflops_16bit: float | None  # dense BF16 (FP16 where noted) tensor TFLOP/s, datasheet; None: unknown
    bandwidth_tb_s: float  # memory bandwidth, TB/s (1e12 B/s), datasheet
    memory_gb: float | None  # memory, GB (1e9 B) as printed on the datasheet; None: unknown
    source: str  # datasheet URL
    note: str = ""  # form factor, dtype caveats

    def __post_init__(self) -> None:
        for name in ("tflops_16bit", "bandwidth_tb_s", "memory_gb"):
            value = getattr(self, name)
            if (value is not None or name == "bandwidth_tb_s") and not (
                isinstance(value, int | float) and 0 < value < float("inf")
            ):
                raise ValueError(f"`{name}` must be > 0, got {value!r}")

    @property
    def peak_flops(self) -> float | None:
        """FLOP/s (None when unknown)."""
        return None if self.tflops_16bit is None else float(round(self.tflops_16bit * 1e12))

    @property
    def bandwidth_bytes_s(self) -> float:
        """Bytes/s."""
        return float(round(self.bandwidth_tb_s * 1e12))

    @property
    def memory_bytes(self) -> int | None:
        """Datasheet memory in bytes, decimal GB (conservative: an "80GB" part holds up to 80 GiB)."""
        return None if self.memory_gb is None else int(round(self.memory_gb * 1e9))

    @property
    def ridge_flop_per_byte(self) -> float | None:
        """Roofline ridge point: peak FLOP/s / bandwidth (seed 003 §3.4: A100 312e12 / 2.039e12 = 153)."""
        return None if self.peak_flops is None else self.peak_flops / self.bandwidth_bytes_s

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "tflops_16bit": self.tflops_16bit,
            "bandwidth_tb_s": self.bandwidth_tb_s,
            "memory_gb": self.memory_gb,
            "ridge_flop_per_byte": self.ridge_flop_per_byte,
            "source": self.source,
            "note": self.note,
        }


HARDWARE: tuple[Hardware, ...] = (
    Hardware("A100-40GB", 312, 1.555, 40, _NVIDIA_A100, "SXM; 624 TFLOP/s with sparsity"),
    Hardware("A100-80GB", 312, 2.039, 80, _NVIDIA_A100, "SXM; the seed's A100 (312 TFLOP/s, 2.039 TB/s)"),
    Hardware("A100-80GB-PCIe", 312, 1.935, 80, _NVIDIA_A100, "PCIe"),
    Hardware("H100-SXM", 989, 3.35, 80, _NVIDIA_H100, "SXM5; 1,979 TFLOP/s with sparsity"),
    Hardware("H100-PCIe", 756, 2.0, 80, _NVIDIA_H100, "PCIe; 1,513 TFLOP/s with sparsity"),
    Hardware("H200", 989, 4.8, 141, _NVIDIA_H200, "SXM; 1,979 TFLOP/s with sparsity"),
    Hardware("L4", 121, 0.3, 24, _NVIDIA_L4, "242 TFLOP/s with sparsity"),
    Hardware("L40S", 362.05, 0.864, 48, _NVIDIA_L40S, "733 TFLOP/s with sparsity"),
    Hardware("A10", 125, 0.6, 24, _NVIDIA_A10, "250 TFLOP/s with sparsity"),
    Hardware("RTX-4090", 165.2, 1.008, 24, _NVIDIA_ADA, "BF16 with FP32 accumulate; Ada whitepaper table"),
    Hardware("MI300X", 1307.4, 5.3, 192, _AMD_MI300X, "AMD; 2,614.9 TFLOP/s with sparsity"),
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


def custom_hardware(
    bandwidth_gb_s: float, tflops: float | None = None, memory_gb: float | None = None
) -> Hardware:
    """A user-described accelerator (``--bandwidth-gb-s``, ``--tflops``); unknown values stay ``None`` and
    bound nothing."""
    if not isinstance(bandwidth_gb_s, int | float) or not bandwidth_gb_s > 0:
        raise ValueError(f"`bandwidth_gb_s` must be > 0, got {bandwidth_gb_s!r}")
    return Hardware(
        name="custom",
        tflops_16bit=tflops,
        bandwidth_tb_s=bandwidth_gb_s / 1000,
        memory_gb=memory_gb,
        source="given on the command line",
    )
