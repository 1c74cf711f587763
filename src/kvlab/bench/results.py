"""Result files of ``kvlab bench``: a JSON record per run, written atomically, never silently overwritten.

A record is ``{"format", "benchmark", "command", "quick", "created_utc", "machine", "note", "result"}``;
``result`` is the benchmark's ``run()`` dict. The default file is ``<results_dir>/<benchmark>-<device>.json``,
``<device>`` being ``cpu`` or the CUDA device name as a slug (``nvidia-h200``), with what sets a run apart from the
default one before ``.json``: the caches asked for (``-dynamic+fp8-e4m3``), the torch threads asked for
(``-1thread``, ``-2threads``) and ``-quick`` (:func:`run_tags`). An existing file is replaced only with ``force``.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from pathlib import Path

from kvlab.bench.record_check import check_record
from kvlab.runtime.atomic import atomic_write_json

FORMAT = "kvlab-bench/1"
# records of kvlab's other benchmark scripts that live in the same folder (benchmarks/busy_eval.py, benchmarks/int8_kl.py): not rendered
OTHER_FORMATS = ("kvlab-busy-eval/1", "kvlab-int8-kl/1")
BENCHMARKS = ("decode", "memory", "flush", "kernel", "paging", "lab")


def display_name(name: str) -> str:
    """A cache name a record keeps as its key (``kivi4-fused``, ``hqq4``: the spelling ``kvlab bench`` wrote first,
    which old records hold and the targets match on) as a user reads it elsewhere in kvlab: the cache registry's
    spelling (``kivi-4-fused``, ``hqq-4``; :func:`kvlab.cache_names.shown_name`). Records are not rewritten."""
    from kvlab.cache_names import shown_name
    from kvlab.caches.registry import REGISTRY

    return shown_name(name, {entry.family for entry in REGISTRY.values()})


def device_label(device: str | None) -> str:
    """File-name label of a device: ``cpu``, or the CUDA device's name as a slug (``nvidia-h200``).

    ``None``/``"auto"`` resolve, and other names are checked, by :func:`kvlab.runtime.device.resolve_device`.

    Raises:
        ValueError: a device outside ``cpu, cuda, cuda:N or auto``, or CUDA asked without CUDA (the value named).
    """
    import torch

    from kvlab.runtime.device import resolve_device

    dev = resolve_device(device)
    if dev.type != "cuda":
        return dev.type
    name = torch.cuda.get_device_name(dev) if torch.cuda.is_available() else "cuda"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "cuda"


# a tag longer than this is shortened to its head and a hash (file names stay well under 255 bytes)
MAX_TAG = 64


def run_tags(candidates: list[str] | tuple[str, ...] | None = None, threads: int | None = None) -> list[str]:
    """The parts of a default record name that tell runs of one benchmark apart: the caches asked for, joined by
    ``+`` (``dynamic+fp8-e4m3``; a ``:`` of a setting becomes ``_``), and the torch threads asked for
    (``1thread``, ``2threads``); none for what was left at its default."""
    import hashlib

    tags = []
    if candidates:
        tag = re.sub(r"[^A-Za-z0-9.+=_-]+", "_", "+".join(candidates))
        if len(tag) > MAX_TAG:
            digest = hashlib.sha1(tag.encode()).hexdigest()[:8]
            tag = f"{tag[: MAX_TAG - 9]}-{digest}"
        tags.append(tag)
    if threads is not None:
        tags.append(f"{threads}thread{'s' if threads != 1 else ''}")
    return tags


def default_path(
    results_dir: str | Path, benchmark: str, device: str, quick: bool, tags: list[str] | tuple[str, ...] = ()
) -> Path:
    """``<results_dir>/<benchmark>-<device label>[-<tag>...][-quick].json`` (``tags`` from :func:`run_tags`).

    Raises:
        ValueError: an unknown benchmark name.
    """
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; expected one of {list(BENCHMARKS)}")
    parts = [benchmark, device_label(device), *tags] + (["quick"] if quick else [])
    return Path(results_dir) / f"{'-'.join(parts)}.json"


def make_record(benchmark: str, result: dict, command: str, quick: bool, note: str | None = None) -> dict:
    """A result record (see the module docstring) stamped with the UTC time and
    :func:`kvlab.runtime.provenance.machine_info`."""
    from kvlab.runtime.provenance import machine_info  # imports torch: only when a record is made

    return {
        "format": FORMAT,
        "benchmark": benchmark,
        "command": command,
        "quick": bool(quick),
        "created_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
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
    quick runs only with ``include_quick``; records of :data:`OTHER_FORMATS` are skipped.

    Raises:
        ValueError: a ``*.json`` entry that is not a regular file (a folder, a broken link, a FIFO) or cannot be
            read, a file that is not UTF-8 JSON, not a kvlab bench record, or a record without a field
            the page reads or with a wrong value there (:func:`kvlab.bench.record_check.check_record`); the file is
            named in the message.
    """
    out = []
    for path in sorted(Path(results_dir).glob("*.json")):
        if not path.is_file():  # a folder named x.json, a broken link, a FIFO (which reading would wait on)
            what = "a folder" if path.is_dir() else "a broken link" if path.is_symlink() else "not a regular file"
            raise ValueError(f"{path} is {what}, not a kvlab bench record: move it out of {results_dir}")
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:  # unreadable (permissions): name the file, not only errno
            raise ValueError(f"{path} could not be read: {e.strerror or e}") from e
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
        except UnicodeDecodeError as e:  # a binary file: say which, not only the codec's complaint
            raise ValueError(f"{path} is not a JSON text file (not UTF-8: {e.reason} at byte {e.start})") from e
        if isinstance(record, dict) and record.get("format") in OTHER_FORMATS:
            continue
        if (
            not isinstance(record, dict)
            or record.get("format") != FORMAT
            or record.get("benchmark") not in BENCHMARKS
        ):
            raise ValueError(f"{path} is not a kvlab bench record (expected format {FORMAT!r})")
        missing = [key for key in ("result", "command") if key not in record]
        if missing or not isinstance(record.get("result"), dict):
            raise ValueError(
                f"{path} is a kvlab bench record without {', '.join(missing) or 'a result object'} (truncated or "
                "edited by hand?): re-run the command that wrote it"
            )
        check_record(path, record)  # every field the page reads, before a quick record is skipped
        if record["quick"] and not include_quick:
            continue
        out.append((path, record))
    return out


def judged_unless_busy(verdict: dict, busy: str | None) -> dict:
    """``verdict`` (``{"description", "status", "detail", ...}``) as it stands, or, where its record's timings are
    not trusted (``busy``: the reason, :func:`kvlab.runtime.timing.busy_reason`), a ``met`` / ``not met`` turned
    into ``not judged`` with the detail ``busy: <reason>; measured <detail>``: a number the same output calls
    untrusted neither meets nor misses a target (``kvlab bench`` exits 0 on it, as on a ``--quick`` run)."""
    if busy is None or verdict.get("status") not in ("met", "not met"):
        return verdict
    return verdict | {"status": "not judged", "detail": f"busy: {busy}; measured {verdict['detail']}"}
