"""Result files: atomic writes, no silent overwrite, reading with validation."""

from __future__ import annotations

import json
from pathlib import Path

from kvlab.eval.config import check_label
from kvlab.eval.schema import validate_result
from kvlab.runtime.atomic import atomic_write_json


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
    """Write ``obj`` as JSON to ``path`` atomically (:func:`kvlab.runtime.atomic.atomic_write_json`), creating its
    folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_json(path, obj, indent=1)


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
