"""What a ``kvlab bench`` result record must hold before ``kvlab bench docs`` renders or judges it.

One description per benchmark (:data:`SPECS`) names every field the page and the target verdicts read
(:mod:`kvlab.bench.docs`, each benchmark's ``evaluate_target``); :func:`check_record` holds a record read from a
file against it, once, where records are read (:func:`kvlab.bench.results.read_records`). A record that lacks a
field, holds the wrong kind of value, a negative or non-finite time, byte count or rate, or a non-finite number
anywhere in its result is refused with the file and the field named, instead of a traceback or a wrong number in
the page. Pure Python; no torch.
"""

from __future__ import annotations

import math
from pathlib import Path

# leaf kinds: a count (int >= 0), a measured amount (finite number >= 0: a time, bytes, a rate, a ratio), a time
# or ratio the page divides by (finite number > 0), text
COUNT, AMOUNT, DIVISOR, TEXT = "count", "amount", "divisor", "text"


class Each:
    """A JSON object of any keys, each value matching ``spec``."""

    def __init__(self, spec: object):
        self.spec = spec


class Rows:
    """A list of row objects: each holds ``common``; a row whose ``status`` is ``ok`` also holds ``ok``."""

    def __init__(self, common: dict, ok: dict):
        self.common, self.ok = common, ok


class Maybe:
    """``null`` or a value matching ``spec``."""

    def __init__(self, spec: object):
        self.spec = spec


class OneOf:
    """A value matching one of ``specs`` (the first's wording when none matches)."""

    def __init__(self, *specs: object):
        self.specs = specs


_MODEL = Maybe({"parameters?": AMOUNT})
_KIND = {"candidate": TEXT, "context": COUNT, "status": TEXT}
_KERNEL = {"us": DIVISOR, "fraction_of_copy": AMOUNT, "bytes?": AMOUNT, "gb_s?": AMOUNT, "in_cache?": bool}
_SIDE = {f"{k}_{f}": AMOUNT for k in ("kivi", "sdpa") for f in ("bytes", "us", "gb_s", "fraction_of_copy")}
_SIDE |= {f"{k}_in_cache?": bool for k in ("kivi", "sdpa")}  # kvlab.bench.cache_resident
SPECS: dict[str, dict] = {
    "decode": {
        "device_type": TEXT,
        "model?": _MODEL,
        "settings": {"prefill_chunk_tokens": COUNT, "warmup": COUNT, "steps": COUNT},
        "contexts": [COUNT],
        "candidates": [{"name": TEXT}],
        "rows": Rows(_KIND, {"median_ms": DIVISOR, "ratio_to_dynamic?": DIVISOR, "cache_bytes?": AMOUNT}),
        "profile?": Maybe(Each(OneOf([{"op": TEXT, "self_cpu_ms": AMOUNT, "calls": AMOUNT}], {}))),
        "profile_context?": Maybe(COUNT),
    },
    "memory": {
        "method": TEXT,
        "model?": _MODEL,
        "rows": Rows(
            _KIND,
            {
                "cache_bytes": AMOUNT,
                "plain_step": {"transient_bytes": AMOUNT, "allocated_by_op?": Each(AMOUNT)},
                "flush_step?": Maybe({"transient_bytes": AMOUNT}),
                "bf16_cache_bytes": AMOUNT,
                "transient_ratio": AMOUNT,
            },
        ),
    },
    "flush": {
        "shape": {"batch": COUNT, "kv_heads": COUNT, "head_dim": COUNT, "dtype": TEXT},
        "settings": {
            "group_size": COUNT,
            "residual_length": COUNT,
            "hqq_group_size": COUNT,
            "reps": COUNT,
            "hf_reps": COUNT,
            "kivi_cycles?": COUNT,
        },
        "contexts": [COUNT],
        "rows": Rows({"cache": TEXT, "context": COUNT, "status": TEXT}, {"flush_us": DIVISOR, "plain_append_us": AMOUNT}),
        "ratios": Each({"ratio": AMOUNT}),
    },
    "kernel": {
        "device_type": TEXT,
        "device_name": TEXT,
        "copy": {"bytes": AMOUNT, "best_gb_s": AMOUNT, "median_gb_s": AMOUNT},
        "shape": {"batch": COUNT, "q_heads": COUNT, "kv_heads": COUNT, "head_dim": COUNT, "dtype": TEXT},
        "settings": {
            "nbits": OneOf([COUNT], COUNT),
            "group_size": COUNT,
            "residual_length": COUNT,
            "reps": COUNT,
            "int8_paths?": Maybe(Each(TEXT)),
        },
        "contexts": [COUNT],
        "rows": Rows(
            {"context": COUNT, "status": TEXT},
            _SIDE | {"kivi_time_over_sdpa": AMOUNT, "kernels?": Each(_KERNEL)},
        ),
        "int_roof?": Maybe({"threads": COUNT, "gmac_s": AMOUNT, "path": TEXT}),
        "last_level_cache?": Maybe({"bytes": DIVISOR, "level": COUNT, "source": TEXT}),
    },
    "paging": {
        "static": {"requests": COUNT, "generate_s": AMOUNT, "admit_s": AMOUNT, "target_s": AMOUNT},
        "dynamic": {
            "requests": COUNT,
            "events": COUNT,
            "min_policy_events_per_s": AMOUNT,
            "target_events_per_s": AMOUNT,
            "policies": Each({"events": COUNT, "wall_s": AMOUNT, "events_per_s": AMOUNT, "preemptions": COUNT}),
        },
    },
    "lab": {
        "config": {"n_layers": COUNT, "q_heads": COUNT, "kv_heads": COUNT, "head_dim": COUNT, "prompt_tokens": COUNT},
        "gen": COUNT,
        "same_tokens": COUNT,
        "repeat": COUNT,
        "flops_ratio": AMOUNT,
        "t_naive": AMOUNT,
        "t_cached": AMOUNT,
        "speedup": AMOUNT,
        "target_speedup": AMOUNT,
        "speedup_paired?": Maybe(
            {"ratios": [AMOUNT], "fastest_over_fastest?": AMOUNT, "min?": AMOUNT, "max?": AMOUNT}
        ),
        "contention?": Maybe({}),
        "append?": Maybe(
            {
                "contexts_tokens": [COUNT],
                "cat_us": [AMOUNT],
                "inplace_us": [AMOUNT],
                "cat_bytes_copied": [AMOUNT],
                "dtype": TEXT,
                "steps": COUNT,
            }
        ),
    },
}

# the record's own fields around ``result`` (:func:`kvlab.bench.results.make_record`)
RECORD = {"command": TEXT, "quick": bool, "machine?": Maybe({}), "note?": Maybe(TEXT), "created_utc?": Maybe(TEXT)}

_WANTS = {COUNT: "a whole number >= 0", AMOUNT: "a finite number >= 0", DIVISOR: "a finite number > 0", TEXT: "text", bool: "true or false"}


def _leaf(value: object, kind: object) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind == TEXT:
        return isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == COUNT:
        return isinstance(value, int) and value >= 0
    return math.isfinite(value) and (value > 0 if kind == DIVISOR else value >= 0)


def _wants(spec: object) -> str:
    """What ``spec`` asks for, in words."""
    if isinstance(spec, Maybe):
        return f"null or {_wants(spec.spec)}"
    if isinstance(spec, OneOf):
        return " or ".join(_wants(s) for s in spec.specs)
    if isinstance(spec, list):
        return f"a list of {_wants(spec[0])}"
    if isinstance(spec, (dict, Each)):
        return "an object"
    if isinstance(spec, Rows):
        return "a list of row objects"
    return _WANTS[spec]


def problem(value: object, spec: object, where: str) -> str | None:
    """Why ``value`` (found at ``where``, e.g. ``result.rows[2]``) does not match ``spec``: ``missing X``,
    ``X is V, expected ...``; None when it does."""
    if isinstance(spec, Maybe):
        return None if value is None else problem(value, spec.spec, where)
    if isinstance(spec, OneOf):
        if any(problem(value, s, where) is None for s in spec.specs):
            return None
        return f"{where} is {value!r:.60}, expected {_wants(spec)}"
    if isinstance(spec, (dict, Each, Rows)) or (isinstance(spec, list) and not isinstance(value, list)):
        want = list if isinstance(spec, (list, Rows)) else dict
        if not isinstance(value, want):
            return f"{where} is {value!r:.60}, expected {_wants(spec)}"
    if isinstance(spec, list):
        return _first(problem(v, spec[0], f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(spec, Each):
        return _first(problem(v, spec.spec, f"{where}.{k}") for k, v in value.items())
    if isinstance(spec, Rows):
        return _first(_row_problem(r, spec, f"{where}[{i}]") for i, r in enumerate(value))
    if isinstance(spec, dict):
        return _first(_field_problem(value, key, sub, where) for key, sub in spec.items())
    return None if _leaf(value, spec) else f"{where} is {value!r:.60}, expected {_wants(spec)}"


def _row_problem(row: object, rows: Rows, where: str) -> str | None:
    return problem(row, rows.common, where) or (
        problem(row, rows.ok, where) if row.get("status") == "ok" else None
    )


def _field_problem(obj: dict, key: str, spec: object, where: str) -> str | None:
    name = key.rstrip("?")
    at = f"{where}.{name}" if where else name
    if name not in obj:
        return None if key.endswith("?") else f"missing {at}"
    return problem(obj[name], spec, at)


def _first(problems) -> str | None:
    return next((p for p in problems if p), None)


def _non_finite(value: object, where: str) -> str | None:
    """The first NaN or infinite number anywhere in ``value`` (a time or ratio nobody measured)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} is {value}, expected a finite number"
    if isinstance(value, dict):
        return _first(_non_finite(v, f"{where}.{k}") for k, v in value.items())
    if isinstance(value, list):
        return _first(_non_finite(v, f"{where}[{i}]") for i, v in enumerate(value))
    return None


def check_record(path: str | Path, record: dict) -> None:
    """Refuse a ``kvlab bench`` record (``format`` and ``benchmark`` already checked) that
    :mod:`kvlab.bench.docs` cannot render or judge faithfully: see the module docstring.

    Raises:
        ValueError: ``<path> is not a complete <benchmark> record: missing result.rows`` or
            ``... : result.static.admit_s is -1.0, expected a finite number >= 0``.
    """
    kind = record["benchmark"]
    fields = RECORD | {"result": SPECS[kind]}
    found = _first(_field_problem(record, key, spec, "") for key, spec in fields.items())
    found = found or _non_finite(record["result"], "result")
    if not found and kind == "decode" and record["result"].get("profile"):  # the profile names its context
        found = None if "profile_context" in record["result"] else "missing result.profile_context"
    if found:
        adjective = "complete" if found.startswith("missing") else "valid"
        raise ValueError(f"{path} is not a {adjective} {kind} record: {found}")
