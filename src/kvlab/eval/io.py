"""Result files: atomic writes, no silent overwrite, reading with validation."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from kvlab.eval.config import check_label
from kvlab.eval.schema import validate_result
from kvlab.eval.tasks_schema import is_tasks_result, upgrade_tasks_result, validate_tasks_result
from kvlab.runtime.atomic import atomic_write_json, special_input_problem


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


# a result nests 7 levels deep; far deeper JSON is not one, and would overflow the recursion of the JSON parser
# (RecursionError near 1,000 levels) or of the encoders and the HTML report that walk it
MAX_NESTING = 64


def _nesting(obj: object) -> int:
    """How many lists/objects deep ``obj`` nests (0 for a scalar); iterative, so any depth is measured."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in value)
    return deepest


class _LongInteger(ValueError):
    """An integer literal too long to convert; ``args[0]`` its number of digits."""


def _load_json(path: Path, text: str) -> object:
    """``text`` parsed, or a ValueError naming ``path``: not JSON, nested deeper than :data:`MAX_NESTING`, or an
    integer longer than Python converts (``sys.get_int_max_str_digits()``, 4300 digits by default).

    Raises:
        ValueError: naming ``path`` and what is wrong with its JSON.
    """
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0

    def parse_int(digits: str) -> int:
        if limit and len(digits.lstrip("-")) > limit:
            raise _LongInteger(len(digits.lstrip("-")))
        return int(digits)

    try:
        obj = json.loads(text, parse_int=parse_int)
    except _LongInteger as exc:
        raise ValueError(
            f"{path} is not a kvlab eval result: it holds an integer of {exc.args[0]:,} digits (more than "
            f"{limit:,}; no field of a result is that long)"
        ) from None
    except RecursionError:
        raise ValueError(
            f"{path} is not a kvlab eval result: its JSON nests too deeply to read (a result nests "
            f"{MAX_NESTING} levels at most)"
        ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    depth = _nesting(obj)
    if depth > MAX_NESTING:
        raise ValueError(
            f"{path} is not a kvlab eval result: its JSON nests {depth:,} levels deep (a result nests "
            f"{MAX_NESTING} at most)"
        )
    return obj


def read_result(path: str | Path, *, tasks: bool = False) -> dict:
    """Load and validate a result file: a ``kvlab eval`` result, or with ``tasks`` also a ``kvlab tasks`` result
    (told apart by its ``kind``, :func:`kvlab.eval.tasks_schema.is_tasks_result`; validated by
    :func:`kvlab.eval.tasks_schema.validate_tasks_result` as written, then read into the current version's form by
    :func:`kvlab.eval.tasks_schema.upgrade_tasks_result`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not UTF-8 JSON, JSON nested deeper than :data:`MAX_NESTING` or holding an integer too long
            to convert, or not a valid kvlab eval result (the problems are listed), or a tasks result where
            ``tasks`` is false; each names the file; an empty path (``Path("")`` would be the current folder); a
            path that is a device, a FIFO or a socket (``/dev/null``: :func:`kvlab.runtime.atomic.special_input_problem`).
    """
    if not str(path).strip():
        raise ValueError(f"a result file path is needed, got {str(path)!r}")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a result file")
    what = "a kvlab eval or tasks result JSON" if tasks else "a kvlab eval result JSON"
    odd = special_input_problem(path, what)  # /dev/null was "no result file at /dev/null"
    if odd:
        raise ValueError(odd)
    if not path.is_file():
        raise FileNotFoundError(f"no result file at {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    result = _load_json(path, text)
    if is_tasks_result(result):
        if not tasks:
            raise ValueError(f"{path} is a kvlab tasks result, not a kvlab eval result")
        problems, what = validate_tasks_result(result), "kvlab tasks result"
    else:  # with ``tasks`` a file of neither kind is named as such: either would have been taken
        problems, what = (
            validate_result(result),
            "kvlab eval result" + (" (nor a kvlab tasks result)" if tasks else ""),
        )
    if problems:
        raise ValueError(f"{path} is not a valid {what}: " + "; ".join(problems[:8]))
    return upgrade_tasks_result(result) if is_tasks_result(result) else result


def read_results(
    paths: Sequence[str | Path] | None, *, flag: str | None = "the result"
) -> tuple[dict | None, dict | None]:
    """``(eval result, tasks result)`` of ``paths`` (at most one of each kind), each validated by its own schema
    (:func:`read_result` with ``tasks``); None where not given. ``flag`` names the argument in the message (None:
    a positional argument, the files alone are named).

    Raises:
        ValueError: a file that is not a valid result of either kind, or two files of one kind (both named).
        FileNotFoundError: a file that does not exist.
    """
    found: dict[str, tuple[str | Path, dict]] = {}
    for path in paths or []:
        result = read_result(path, tasks=True)
        kind = "tasks" if is_tasks_result(result) else "eval"
        if kind in found:
            first, where = found[kind][0], f"{flag}: " if flag else ""
            if Path(first).resolve() == Path(path).resolve():
                raise ValueError(f"{where}{path} is given twice; give one eval result and/or one tasks result")
            raise ValueError(f"{where}{first} and {path} are both kvlab {kind} results; give one of each kind")
        found[kind] = (path, result)
    return found.get("eval", (None, None))[1], found.get("tasks", (None, None))[1]


# a value a kept result's recorded command holds that the CLI now refuses -> the spelling it takes now
# (``--window-residuals ''`` turned the residual-window matrix off until ``none`` became the word for it)
RESPELLED = {("--window-residuals", ""): "none"}


def current_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(command, notes)``: a result's recorded ``command`` (argv) with each value of :data:`RESPELLED` in the
    spelling the CLI takes now, so a page's command (docs/PERFORMANCE.md, the HTML report's header) runs as
    printed, and one note per value respelled (``the result records `--window-residuals ''`; `none` is the current
    spelling``). The measurements are not touched; the result file keeps its command as it ran."""
    out, notes = [str(a) for a in argv], []
    for i, arg in enumerate(out):
        flag, eq, value = arg.partition("=")  # --flag=value, or --flag value
        if not eq and i + 1 < len(out):
            value = out[i + 1]
        new = RESPELLED.get((flag, value)) if eq or i + 1 < len(out) else None
        if new is None:
            continue
        notes.append(f"the result records `{flag} {shlex.quote(value)}`; `{new}` is the current spelling")
        if eq:
            out[i] = f"{flag}={new}"
        else:
            out[i + 1] = new
    return out, notes
