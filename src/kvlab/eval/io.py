"""Result files: atomic writes, no silent overwrite, reading with validation."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from kvlab.eval.config import check_label
from kvlab.eval.schema import validate_result


def result_path(out_dir: str | Path, label: str) -> Path:
    """``<out_dir>/<label>.json`` after checking the label is a safe file stem."""
    return Path(out_dir) / f"{check_label(label)}.json"


def ensure_writable(path: Path, force: bool) -> None:
    """Raise ``FileExistsError`` naming ``path`` if it exists and ``force`` is false, or if it is a directory."""
    if path.is_dir():
        raise FileExistsError(f"{path} is a directory; choose another --label or --out-dir")
    if path.exists() and not force:
        raise FileExistsError(
            f"{path} already exists; choose another --label or pass --force to overwrite it"
        )


def write_json_atomic(path: str | Path, obj: object) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically (temp file in the same directory + ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would make results private to their writer
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1, allow_nan=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_result(path: str | Path) -> dict:
    """Load and validate a result file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, or not a valid kvlab eval result (the problems are listed).
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a result file")
    if not path.is_file():
        raise FileNotFoundError(f"no result file at {path}")
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    problems = validate_result(result)
    if problems:
        raise ValueError(f"{path} is not a valid kvlab eval result: " + "; ".join(problems[:8]))
    return result
