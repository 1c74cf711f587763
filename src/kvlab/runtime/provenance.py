"""Provenance: the versions and machine facts written next to every result, collected in one place.

Two layouts, both read by existing result files and reports, so their keys stay as they are:

- :func:`hardware_info` + :func:`software_info`: ``kvlab eval``'s ``provenance.hardware`` / ``provenance.software``;
- :func:`machine_info`: ``kvlab bench``'s ``machine`` record (hardware and versions in one flat dict, plus the git
  commit of the checkout).

Each fact is read by one helper below (CPU model, memory, package versions, GPU, git commit), so the two layouts
cannot report the same fact two ways.
"""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvlab import __version__

if TYPE_CHECKING:
    import torch

# Optional back-ends whose versions change a result; None in a record when not installed.
_BACKENDS = ("hqq", "optimum-quanto")


def package_version(pkg: str) -> str | None:
    """The installed version of distribution ``pkg``, or None when it is not installed."""
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else :func:`platform.processor`, else ``"unknown"``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# The vector and matrix extensions a kernel's speed depends on, as /proc/cpuinfo names them (x86 ``flags``, Arm
# ``Features``); a record lists those its CPU has, so two records from CPUs with one model name can be told apart.
CPU_ISA_FLAGS = (
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512vbmi",
    "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "i8mm", "bf16", "sve", "sve2",
)  # fmt: skip


def cpu_identity(cpuinfo: str | None = None) -> dict[str, Any]:
    """Which CPU this is, beyond its model name: ``cpu_id`` (x86: ``"<vendor_id> family F model M"``, Arm:
    ``"implementer 0x.. part 0x.."``; None where ``/proc/cpuinfo`` does not say) and ``cpu_isa`` (the entries of
    :data:`CPU_ISA_FLAGS` the first processor lists, in that order; ``[]`` when none or no ``/proc/cpuinfo``).

    ``cpuinfo``: the text of ``/proc/cpuinfo`` (read when None). Virtual machines often hide the model name
    ("AMD EPYC" for every generation); family/model and the flags still tell a Zen 4 with AVX512-VNNI from a Zen 2
    with AVX2 only, or an Intel Xeon with AMX from one without, which is what a kernel timing depends on."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return {"cpu_id": None, "cpu_isa": []}
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor only
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    cpu_id = None
    if "cpu family" in fields and "model" in fields:
        cpu_id = f"{fields.get('vendor_id', 'x86')} family {fields['cpu family']} model {fields['model']}"
    elif "CPU implementer" in fields and "CPU part" in fields:
        cpu_id = f"implementer {fields['CPU implementer']} part {fields['CPU part']}"
    return {"cpu_id": cpu_id, "cpu_isa": [f for f in CPU_ISA_FLAGS if f in flags]}


def memory_gib() -> float | None:
    """Physical memory in GiB (one decimal), or None where the OS does not say."""
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1) or None
    except (ValueError, OSError, AttributeError):
        return None


def available_memory_bytes(meminfo: str | os.PathLike = "/proc/meminfo") -> int | None:
    """Memory the machine can give a new allocation without swapping, in bytes: ``MemAvailable`` of ``meminfo``
    (Linux), else the OS's free physical pages (``os.sysconf``), else None (unknown: callers make no check)."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    value, unit = line.split()[1:3]
                    return int(value) * (1024 if unit.lower() == "kb" else 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") or None
    except (ValueError, OSError, AttributeError):
        return None


def git_commit() -> str | None:
    """Short commit of the checkout kvlab is imported from (``+dirty`` if its ``src/`` has changes), or None
    (not a git checkout, no git, or git did not answer within 5 s)."""
    src = Path(__file__).resolve().parents[2]  # src/ of a checkout (kvlab/runtime/provenance.py)
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
            cwd=src,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "."],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
            cwd=src,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def software_info() -> dict[str, str | None]:
    """Versions: Python, kvlab, torch, transformers, tokenizers and the optional quantization back-ends."""
    import torch  # in the functions that need it: the host facts above serve torch-free commands (kvlab paging)

    return {
        "python": platform.python_version(),
        "kvlab": __version__,
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "tokenizers": package_version("tokenizers"),
        **{pkg: package_version(pkg) for pkg in _BACKENDS},
    }


def hardware_info(device: torch.device) -> dict[str, Any]:
    """Machine facts for a run on ``device``: platform, the CPU's model name and identity (:func:`cpu_identity`:
    family/model and vector extensions), CPU count, torch threads, torch's CPU capability (the
    widest vector instruction set its kernels use: ``"AVX2"``, ``"AVX512"``, ...), CUDA, and for a CUDA ``device``
    its name, total memory (bytes), compute capability and the CUDA version."""
    import torch

    info: dict[str, Any] = {
        "device": str(device),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_model": cpu_model(),
        **cpu_identity(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda_available": torch.cuda.is_available(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            {
                "gpu": props.name,
                "gpu_total_memory_bytes": props.total_memory,
                "compute_capability": list(torch.cuda.get_device_capability(device)),
                "cuda": torch.version.cuda,
            }
        )
    return info


def machine_info() -> dict[str, Any]:
    """Machine and versions in one flat dict: CPU model, identity and vector extensions (:func:`cpu_identity`),
    cores, torch threads, memory (GiB), platform, the versions of :func:`software_info` but tokenizers, the git
    commit of the checkout, the first GPU (None without CUDA) and the CUDA version."""
    import torch

    software = software_info()
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        **cpu_identity(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": memory_gib(),
        "platform": platform.platform(),
        **{k: software[k] for k in ("python", "torch", "transformers", "kvlab", *_BACKENDS)},
        "git_commit": git_commit(),
        "gpu": None,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info
