"""Result files of ``kvlab bench``: a JSON record per run, written atomically, never silently overwritten.

A record is ``{"format", "benchmark", "command", "quick", "created_utc", "machine", "note", "result"}``;
``result`` is the benchmark's ``run()`` dict. The default file is ``<results_dir>/<benchmark>-<device>.json``
(``-quick`` appended for ``--quick`` runs), ``<device>`` being ``cpu`` or the CUDA device name as a slug
(``nvidia-h200``). An existing file is replaced only with ``force``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

from kvlab.runtime.atomic import atomic_write_json

FORMAT = "kvlab-bench/1"
BENCHMARKS = ("decode", "memory", "flush", "kernel", "paging", "lab")


def device_label(device: str | None) -> str:
    """File-name label of a device: ``cpu``, or the CUDA device's name as a slug (``nvidia-h200``).

    ``None``/``"auto"`` resolve like :func:`kvlab.bench.decode.resolve_device`.
    """
    import torch

    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev.type
    name = torch.cuda.get_device_name(dev) if torch.cuda.is_available() else "cuda"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "cuda"


def default_path(results_dir: str | Path, benchmark: str, device: str, quick: bool) -> Path:
    """``<results_dir>/<benchmark>-<device label>[-quick].json``.

    Raises:
        ValueError: an unknown benchmark name.
    """
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; expected one of {list(BENCHMARKS)}")
    return Path(results_dir) / f"{benchmark}-{device_label(device)}{'-quick' if quick else ''}.json"


def _git_commit() -> str | None:
    """Short commit of the checkout kvlab is imported from (``+dirty`` if its ``src/`` has changes), or None."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
            cwd=here,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "."],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
            cwd=here.parent.parent,  # src/
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict:
    """Machine and versions: CPU model and cores, torch threads, memory, GPU, torch/transformers/kvlab and
    optional backend versions, Python, OS, git commit of the checkout (``+dirty`` if ``src/`` has changes)."""
    import importlib.metadata as md

    import torch

    def version(pkg: str) -> str | None:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    mem_gib = None
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        pass
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(mem_gib, 1) if mem_gib else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "kvlab": version("kvlab"),
        "hqq": version("hqq"),
        "optimum-quanto": version("optimum-quanto"),
        "git_commit": _git_commit(),
        "gpu": None,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def make_record(benchmark: str, result: dict, command: str, quick: bool, note: str | None = None) -> dict:
    """A result record (see the module docstring) stamped with the UTC time and :func:`machine_info`."""
    return {
        "format": FORMAT,
        "benchmark": benchmark,
        "command": command,
        "quick": bool(quick),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        "note": note,
        "result": result,
    }


def write_record(path: str | Path, record: dict, force: bool = False) -> Path:
    """Write ``record`` to ``path`` atomically (:func:`kvlab.runtime.atomic.atomic_write_json`).

    Raises:
        FileExistsError: ``path`` exists and ``force`` is false.
    """
    path = Path(path)
    if path.exists() and not force:
        raise FileExistsError(
            f"{path} already exists; pass --force to replace it or --out to choose another file"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_json(path, record, indent=1)


def read_records(results_dir: str | Path, include_quick: bool = False) -> list[tuple[Path, dict]]:
    """Every result record in ``results_dir`` (``*.json`` with this module's ``format``), sorted by file name;
    quick runs only with ``include_quick``.

    Raises:
        ValueError: a ``*.json`` file that is not valid JSON or not a kvlab bench record (named in the message).
    """
    out = []
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
        if (
            not isinstance(record, dict)
            or record.get("format") != FORMAT
            or record.get("benchmark") not in BENCHMARKS
        ):
            raise ValueError(f"{path} is not a kvlab bench record (expected format {FORMAT!r})")
        if record.get("quick") and not include_quick:
            continue
        out.append((path, record))
    return out
