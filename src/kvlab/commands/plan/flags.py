"""The flags ``kvlab plan``, ``kvlab roofline`` and ``kvlab video`` share, and the planner arguments they become.

Each ``add_*`` function adds one group of flags to a parser; the matching ``*_kwargs`` turns the parsed values into
keyword arguments of :mod:`kvlab.plan.report`; :func:`flag_message` names a planner error by the flag a user typed,
and :func:`report` prints a report (JSON or tables) with its warnings.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable

from kvlab.cache_names import KIVI_DEFAULTS, parse_cache_name
from kvlab.caches.entry import CacheEntry
from kvlab.caches.registry import REGISTRY, cache_names
from kvlab.commands import fail
from kvlab.plan.kv_formats import KV_DTYPE_NAMES, PLAIN_NAMES, VLLM_ALIASES, PlannedName
from kvlab.plan.mixed import MIXED_PREFIX
from kvlab.plan.scenario import DEFAULT_CONTEXT_TOKENS, DEFAULT_GPU
from kvlab.runtime.checks import int_flag, read_int


def byte_count(text: str) -> int:
    """An integer byte count >= 1 (``--weight-bytes``: no model has 0 weight bytes, and 0 made the decode bound
    infinite); accepts ``1e9`` and, as kvlab prints byte counts, ``16,060,522,496``
    (:func:`kvlab.runtime.checks.read_int`). Read exactly, as a decimal, never through a float (``1e30`` was
    1,000,000,000,000,000,019,884,624,838,656 bytes); beyond a float's range (``1e400``) it is refused."""
    from decimal import Decimal, InvalidOperation

    refused = argparse.ArgumentTypeError(f"a whole number of bytes >= 1, got {text!r}")
    try:
        value = read_int(text)
    except ValueError:
        try:
            number = Decimal(text.strip())
        except InvalidOperation:
            raise refused from None
        if not number.is_finite() or number.adjusted() > 308 or number != number.to_integral_value():
            raise refused from None
        value = int(number)
    if value < 1:
        raise refused
    return value


# the planner library's argument names in its errors, and the flag a CLI user typed for each: `name` -> --flag
_FLAG_OF = {
    "residual_length": "residual",
    "num_kv_heads": "kv_heads",
    "block_size_tokens": "block_size",
    "rate_per_step": "rate",
    "n_requests": "requests",
}


_NAMED = re.compile(r"`([a-z][a-z0-9_]*)`(?: \((--[a-z0-9-]+)\))?")


def flag_message(args: argparse.Namespace, exc: Exception | str) -> str:
    """``exc``'s message with each planner argument it names (`group_size`) replaced by its flag (--group-size)
    when this command has that flag; config fields and other names are kept. Errors that already give the flag
    (`` `reserve_gib` (--reserve-gib)``) name it once."""

    def flag(m: re.Match) -> str:
        if m.group(2):
            return m.group(2)
        dest = _FLAG_OF.get(m.group(1), m.group(1))
        if dest == "model" and dest in vars(args):  # plan's MODEL is positional; roofline's and video's a flag
            return "MODEL" if str(getattr(args, "kvlab_prog", "")).endswith(" plan") else "--model"
        if dest not in vars(args):  # a config field stays
            return m.group(0)
        return "--" + dest.replace("_", "-")

    message = str(exc)
    if getattr(args, "kv_heads", None) is not None and not message.startswith("config field"):
        message = message.replace("`num_key_value_heads` (", "--kv-heads (")  # the override, not the config
    return _NAMED.sub(flag, message)


def kv_dtype_names() -> tuple[str, ...]:
    """``--kv-dtype``'s names: the planner's (:data:`~kvlab.plan.kv_formats.KV_DTYPE_NAMES`: the plain dtypes, then
    the names of the FP8 and KIVI caches' planner bytes), then those of any other registry family that declares
    planner bytes (``CacheEntry.planner``: the spellings it lists, else its registry names)."""
    names = list(KV_DTYPE_NAMES)
    for entry in REGISTRY.values():
        if entry.planner is not None:
            names += [n for n in entry.planner.names or cache_names(entry.family) if n not in names]
    return tuple(names)


def _entry(kv: str) -> CacheEntry | None:
    """The registry entry of the family a ``--kv-dtype`` name belongs to (vLLM's ``fp8_e4m3`` is ``fp8-e4m3``);
    ``None`` for a plain dtype, ``auto`` or a name of no registered family."""
    if kv in PLAIN_NAMES and kv not in VLLM_ALIASES:
        return None
    try:
        return REGISTRY[parse_cache_name(VLLM_ALIASES.get(kv, kv), REGISTRY).family]
    except ValueError:
        return None


def planned_kv(kv: str) -> str | PlannedName:
    """What the planner sizes for ``--kv-dtype kv``: the registry entry's planner bytes for a cache family's name
    (a :class:`~kvlab.plan.kv_formats.PlannedName`; vLLM's ``fp8_e4m3`` read as ``fp8-e4m3``), else the text (a
    plain dtype, ``auto``, or a per-layer plan ``mixed-<plan>``, which :mod:`kvlab.plan.mixed_report` reads)."""
    entry = _entry(kv)
    if entry is None or entry.planner is None:
        return kv
    return PlannedName(VLLM_ALIASES.get(kv, kv), entry.planner)


class KVChoices(tuple):
    """``--kv-dtype``'s listed names (iterated: listed in help and argparse's "invalid choice" message) that also
    hold every other name of a cache family with planner bytes in the registry's grammar (``kivi-4:dot=int8``,
    ``kivi-4-fused:group_size=64``: a list cannot enumerate the settings), checked when planned
    (:func:`check_kv_name`); with ``plans``, every ``mixed-...`` name too: a plan is found and its name checked only
    when planned (:func:`kvlab.plan.mixed_report.resolve_plan`), so an unknown or misspelt plan gets the planner's
    one-line error (the known plans, or the name rule) rather than argparse's list."""

    plans = False

    def __contains__(self, value: object) -> bool:
        if value == PLAN_PATTERN or not isinstance(value, str):
            return False
        if self.plans and value.startswith(MIXED_PREFIX):
            return True
        if tuple.__contains__(self, value):
            return True
        entry = _entry(value) or _entry(value.partition(":")[0])  # a bad setting: check_kv_name names it
        return entry is not None and entry.planner is not None


class PlanChoices(KVChoices):
    """:class:`KVChoices` with the pattern ``mixed-<plan>``: the per-layer plans too."""

    plans = True


PLAN_PATTERN = f"{MIXED_PREFIX}<plan>"  # how --kv-dtype's choices name the per-layer plans


def check_kv_name(kv: str, group_size: int | None, residual: int | None) -> None:
    """Refuse a ``--kv-dtype`` cache name that is not listed (one with a variant or ``:settings``) when the cache
    registry refuses it, or when it sets KIVI's ``G`` / ``R`` that ``--group-size`` / ``--residual`` also set; the
    settings the planner cannot size it refuses itself (:func:`kvlab.plan.kv_formats.kv_dtype`).

    Raises:
        ValueError: naming ``--kv-dtype`` and the registry's reason, or both flags.
    """
    from kvlab.caches.registry import resolve

    if kv in kv_dtype_names() or kv.startswith(MIXED_PREFIX) or _entry(kv.partition(":")[0]) is None:
        return
    try:
        name = resolve(VLLM_ALIASES.get(kv, kv)).name
    except ValueError as exc:  # the name's settings, not the flags: "group_size=-1" as "group_size=0" is
        why = str(exc).removeprefix(f"cache {kv!r}: ").removeprefix(f"cache name {kv!r}: ").replace("`", "")
        raise ValueError(f"--kv-dtype {kv}: {why}") from None
    given = dict(name.settings)
    for setting, flag, value in (("group_size", "--group-size", group_size), ("residual_length", "--residual", residual)):
        if value is not None and setting in given:
            raise ValueError(f"{flag} {value} and --kv-dtype {kv} both set KIVI's {setting}; pass one")


def add_sequence_flags(p: argparse.ArgumentParser, unset_context: bool = False, unset_batch: bool = False) -> None:
    """``--context`` (tokens per sequence) and ``--batch`` (sequences): the workload a plan or roofline sizes. With
    ``unset_context`` / ``unset_batch`` an absent flag parses as None and the planner takes its default
    (:func:`kvlab.plan.report.plan_report`: the context follows the model's limit, ``--emit vllm``'s
    ``--max-num-seqs`` the KV memory), and a mode reading a flag only where it is missing elsewhere
    (``plan --from-log``) can tell ``--context 8192`` from none."""
    p.add_argument(
        "--context",
        type=int_flag(),
        default=None if unset_context else DEFAULT_CONTEXT_TOKENS,
        help=f"tokens per sequence (default {DEFAULT_CONTEXT_TOKENS}"
        + (", or the model's max_position_embeddings where lower)" if unset_context else ")"),
    )
    p.add_argument(
        "--batch",
        type=int_flag(),
        default=None if unset_batch else 1,
        help="sequences (default 1"
        + ("; --emit vllm's --max-num-seqs, default the requests the KV memory holds)" if unset_batch else ")"),
    )


def add_kv_flags(p: argparse.ArgumentParser, plans: bool = False) -> None:
    """``--kv-dtype`` (:func:`kv_dtype_names`, and with ``plans`` a per-layer plan ``mixed-<plan>``),
    ``--group-size``, ``--residual``."""
    names = kv_dtype_names()
    p.add_argument(
        "--kv-dtype",
        default="auto",
        choices=PlanChoices((*names, PLAN_PATTERN)) if plans else KVChoices(names),  # every name planned
        help="KV cache dtype (default auto: the config's dtype); kivi-N (= kiviN): kvlab's KIVI cache, kivi-kKvV "
        "with its own key/value bits; fp8-e4m3/fp8-e5m2[-tensor|-unscaled|-hadamard] (fp8_e4m3 = fp8-e4m3): "
        "kvlab's FP8 cache, "
        "1 B/element plus fp32 scales (fp8: 1 B/element, no scales); a cache name may carry the registry's "
        "settings: kivi-4:group_size=64 and :residual_length=R are sized, :dot=int8 changes no bytes"
        + (
            "; mixed-<plan>: a per-layer plan (built-in mixed-demo, or <plan>.json in $KVLAB_PLAN_DIR; "
            "docs/MIXED.md)"
            if plans
            else ""
        ),
    )
    # None = not given: KIVI_DEFAULTS; given with a --kv-dtype that is not KIVI it is refused, not ignored
    G, R = KIVI_DEFAULTS.group_size, KIVI_DEFAULTS.residual_length
    p.add_argument("--group-size", type=int_flag(), default=None, help=f"KIVI group size G (default {G})")
    p.add_argument(
        "--residual", type=int_flag(), default=None, help=f"KIVI residual window R in tokens (default {R})"
    )


def add_keep_flag(p: argparse.ArgumentParser) -> None:
    """Add ``--keep-tokens N`` (an evicting cache's cap per layer and sequence; None: no cap) to ``p``."""
    p.add_argument(
        "--keep-tokens",
        type=int_flag(1),
        default=None,
        metavar="N",
        help="an evicting cache that keeps at most N tokens per layer and sequence (sink: sink_tokens + "
        "window_length; tova: its token_budget): KV bytes, fit and decode bound are those of min(context, N) "
        "tokens in --kv-dtype's format (docs/EVICTION.md, Planning a capped cache)",
    )


def kv_kwargs(args: argparse.Namespace) -> dict:
    """The planner's KV arguments from the flags of :func:`add_kv_flags` (and :func:`add_keep_flag`).

    Raises:
        ValueError: ``--group-size`` / ``--residual`` given with a ``--kv-dtype`` that is not KIVI's, or a cache
            name :func:`check_kv_name` refuses.
    """
    check_kv_name(args.kv_dtype, args.group_size, args.residual)
    entry = _entry(args.kv_dtype)
    takes = entry is not None and {"group_size", "residual_length"} <= set(entry.reads)  # KIVI's G and R
    for flag, value in (("--group-size", args.group_size), ("--residual", args.residual)):
        if value is not None and not takes:
            raise ValueError(
                f"{flag} {value} sizes a kivi --kv-dtype (in kvlab plan, also a mixed plan's KIVI layers) only; --kv-dtype is "
                f"{args.kv_dtype}"
            )
    group_size = KIVI_DEFAULTS.group_size if args.group_size is None else args.group_size
    residual = KIVI_DEFAULTS.residual_length if args.residual is None else args.residual
    kwargs = {"kv": planned_kv(args.kv_dtype), "group_size": group_size, "residual_length": residual}
    if getattr(args, "keep_tokens", None) is not None:
        kwargs["keep_tokens"] = args.keep_tokens
    return kwargs


def add_weight_flags(p: argparse.ArgumentParser) -> None:
    """Add the weight flags ``--weight-dtype``, ``--weights-index`` and ``--weight-bytes`` to ``p``
    (:func:`weight_kwargs` reads them)."""
    p.add_argument(
        "--weight-dtype",
        default="auto",
        help="dtype of the weights for the parameter-count estimate (bf16, fp8, int4, ...; default: "
        "the checkpoint next to the config, else the config dtype)",
    )
    p.add_argument(
        "--weights-index",
        default=None,
        metavar="PATH",
        help="model.safetensors.index.json, a .safetensors file or a directory: exact weight bytes",
    )
    p.add_argument("--weight-bytes", type=byte_count, default=None, metavar="N", help="weight bytes, given")


def weight_kwargs(args: argparse.Namespace) -> dict:
    """The planner's weight arguments from the flags of :func:`add_weight_flags`.

    Raises:
        ValueError: both ``--weight-bytes`` and ``--weights-index`` (one would be silently ignored).
    """
    if args.weight_bytes is not None and args.weights_index is not None:
        raise ValueError(
            f"--weight-bytes {args.weight_bytes} and --weights-index {args.weights_index} both give the weight "
            f"bytes; pass one"
        )
    return {
        "weight_dtype": args.weight_dtype,
        "weights_index": args.weights_index,
        "weight_bytes_override": args.weight_bytes,
    }


def add_device_flags(p: argparse.ArgumentParser) -> None:
    """Add the device flags ``--gpu``, ``--bandwidth-gb-s``, ``--tflops``, ``--measured-step-ms`` and ``--list-gpus``
    to ``p`` (:func:`device_kwargs` reads them)."""
    p.add_argument(
        "--gpu", default=None, help=f"GPU from the datasheet table (default {DEFAULT_GPU}); see --list-gpus"
    )
    p.add_argument("--bandwidth-gb-s", type=float, default=None, help="custom device: memory bandwidth, GB/s")
    p.add_argument("--tflops", type=float, default=None, help="custom device: dense 16-bit TFLOP/s")
    p.add_argument("--measured-step-ms", type=float, default=None, help="a measured decode step to compare")
    p.add_argument("--list-gpus", action="store_true", help="print the hardware table and exit")


def device_kwargs(args: argparse.Namespace) -> dict:
    """The planner's device arguments from the flags of :func:`add_device_flags` (``--list-gpus`` aside)."""
    return {
        "gpu": args.gpu,
        "bandwidth_gb_s": args.bandwidth_gb_s,
        "tflops": args.tflops,
        "measured_step_ms": args.measured_step_ms,
    }


def device_flag_problem(args: argparse.Namespace) -> str | None:
    """The custom-device flags named as given (``--bandwidth-gb-s inf``), before the planner names its fields: not
    a finite number > 0, or 0 or inf once counted in whole B/s or FLOP/s (:func:`kvlab.plan.hardware.check_rate`)."""
    from kvlab.plan.hardware import TERA, check_rate

    for flag, value, scale, unit in (
        ("--bandwidth-gb-s", args.bandwidth_gb_s, 1e9, "GB/s"),
        ("--tflops", args.tflops, TERA, "TFLOP/s"),
    ):
        if value is None:
            continue
        if not 0 < value < math.inf:
            return f"{flag} must be a finite number > 0, got {value:g}"
        try:
            check_rate(flag, value, scale, unit)
        except ValueError as e:
            return str(e).replace(f"`{flag}`", flag)
    return None


def warn(args: argparse.Namespace, r: dict) -> None:
    """The report's warnings on stderr, one line each (also in --json): ``--measured-step-ms`` faster than the
    decode step lower bound (``measured.warning``: it cannot be), and a context beyond the model's
    max_position_embeddings or pixels and frames a video's tokens leave out (``warnings``), each planner argument
    named by its flag (:func:`flag_message`)."""
    prog = getattr(args, "kvlab_prog", None) or "kvlab"
    for warning in [(r.get("measured") or {}).get("warning"), *r.get("warnings", [])]:
        if warning:  # a planner argument it names (`width`) said as this command's flag (--width)
            print(f"{prog}: warning: {flag_message(args, warning)}", file=sys.stderr)


def report(args: argparse.Namespace, build: Callable[[], dict], print_tables: Callable[[dict], None]) -> int:
    """Build a planner report (``build()``), say its warnings (:func:`warn`) and print it: JSON with ``--json``,
    else ``print_tables``'s tables. Exit 0, or 2 for a bad setting (``ValueError``) or a model that cannot be read
    (``OSError``), the message naming the flag (:func:`flag_message`)."""
    try:
        r = build()
    except (ValueError, OSError) as e:
        return fail(args, flag_message(args, e))
    warn(args, r)
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print_tables(r)
    return 0


def record_defaults(p: argparse.ArgumentParser) -> None:
    """Keep ``p``'s defaults in its namespace (``flag_defaults``), for :func:`given_flags`; call it once every flag
    of ``p`` is added."""
    p.set_defaults(flag_defaults=None)
    p.set_defaults(flag_defaults=vars(p.parse_args([])))


def given_flags(args: argparse.Namespace, kept: tuple[str, ...] = ()) -> list[str]:
    """The flags given a value other than their default (``--context 5`` -> ``"--context"``), in the parser's
    order: what a mode that reads none of them (a listing, ``plan --from-log``) would silently ignore. MODEL and
    ``--model`` are the callers' to name, ``--json`` shapes any output; ``kept`` names more argparse dests the mode
    reads (``("gpu_mem_gib",)``). Needs :func:`record_defaults` on the parser (else none are found)."""
    defaults = getattr(args, "flag_defaults", None) or {}
    skip = {"list_gpus", "list_presets", "json", "model", "flag_defaults", "func", *kept}
    return [
        "--" + dest.replace("_", "-")
        for dest, default in defaults.items()
        if dest not in skip and getattr(args, dest, default) != default
    ]


def them(given: list[str]) -> str:
    """``"it"`` for one flag, ``"them"`` for more: the pronoun of a refusal naming ``given``."""
    return "it" if len(given) == 1 else "them"


def ignored_by_listing(args: argparse.Namespace, listing: str) -> str | None:
    """Why ``listing`` (``--list-gpus``: a table, then exit) would ignore flags given with it (``--context 5``), or
    None when none is (:func:`given_flags`)."""
    given = given_flags(args)
    if not given:
        return None
    flags = ", ".join(given)
    return f"{listing} prints a table and exits; it takes no {flags} (drop {listing} to use {them(given)})"
