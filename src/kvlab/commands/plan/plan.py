"""``kvlab plan``: KV memory ledger, fit and decode bound of a model (the report from
:func:`kvlab.plan.report.plan_report`, printed by :mod:`kvlab.commands.plan.render`)."""

from __future__ import annotations

import argparse
import json

from kvlab.commands import fail, flag_values
from kvlab.commands.plan import flags
from kvlab.commands.plan.flags import flag_message
from kvlab.commands.plan.render import print_from_log, print_lists, print_mixed_plan, print_plan, print_vllm
from kvlab.plan.scenario import DEFAULT_RESERVE_GIB
from kvlab.runtime.checks import int_flag
from kvlab.runtime.text_files import read_text


def register(subparsers) -> None:
    """Add ``kvlab plan MODEL`` (sequence, KV, weight and device flags, ``--emit vllm``, ``--from-log``; run by
    :func:`run_plan`) to ``subparsers``."""
    p = subparsers.add_parser(
        "plan",
        help="KV memory ledger, fit and decode bound of a model from its config.json or GGUF header (no torch)",
        description="Read MODEL's config.json (a preset name, a config.json path, a model directory or a hub "
        "id) or a llama.cpp GGUF file's header (a .gguf path; needs the gguf package) and report KV bytes per "
        "token and in total, weight bytes, the largest batch and context that fit in a GPU, and the decode "
        "step lower bound: the bytes one step must read (weights, then every sequence's KV) over the memory "
        "bandwidth.",
    )
    p.add_argument(
        "model", nargs="?", metavar="MODEL", help="preset, config.json, .gguf file, directory or hub id"
    )
    flags.add_sequence_flags(p, unset_context=True, unset_batch=True)  # None: not given (the planner's defaults; --from-log reads --context)
    flags.add_kv_flags(p, plans=True)
    flags.add_keep_flag(p)
    # None: not given, for --from-log, where it stands in for a log without tensor_parallel_size (run_plan: 1)
    p.add_argument("--tp", type=int_flag(), default=None, help="tensor-parallel GPUs (default 1)")
    p.add_argument(
        "--gpu-mem-gib",
        type=float,
        default=None,
        help="GPU memory budget in GiB (2^30 B); default: the --gpu row's memory as the device reports it "
        "(A100-80GB: 81,920 MiB = 80 GiB); with --gpu, it replaces that row's memory (a note says so)",
    )
    p.add_argument(
        "--reserve-gib",
        type=float,
        default=DEFAULT_RESERVE_GIB,
        help="GiB per GPU kept free for activations, workspace and framework "
        f"(default {DEFAULT_RESERVE_GIB:g}, as kvlab paging)",
    )
    p.add_argument("--kv-heads", type=int_flag(), default=None, help="what-if: override the KV heads (e.g. MHA)")
    flags.add_weight_flags(p)
    flags.add_device_flags(p)
    p.add_argument(
        "--emit",
        choices=("vllm",),
        default=None,
        help="print a runnable `vllm serve` command for the plan (flags, then the KV cache vLLM would report as "
        "# comments); with --json, under the key 'vllm'",
    )
    p.add_argument(
        "--block-size",
        type=int_flag(),
        default=None,
        help="tokens per KV block for --emit vllm, or for --from-log where the log does not state it (1, 8, 16, 32, "
        "64 or 128; default 16, vLLM's CUDA default)",
    )
    p.add_argument(
        "--from-log",
        default=None,
        metavar="FILE",
        help="a pasted vLLM startup log: each KV line (memory, tokens, concurrency, weights, activation peak, "
        "non-torch) beside kvlab's prediction for MODEL, sized by the log's own settings; --gpu-mem-gib gives the "
        "device memory, --block-size the block size, --context the max_model_len and --tp the tensor-parallel size "
        "where the log does not, and so do --gpu (the hardware table's device memory) and --weight-bytes / "
        "--weight-dtype / --weights-index (the weights), the only planner flags it takes (docs/plan.md, vLLM's "
        "startup log)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="with --from-log: explain a log that names a model other than MODEL (refused otherwise: its figures "
        "would be set beside another model's)",
    )
    p.add_argument("--list-presets", action="store_true", help="print the built-in models and exit")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=run_plan)
    flags.record_defaults(p)


def run_plan(args: argparse.Namespace) -> int:
    """``kvlab plan``: the preset or GPU list, ``--from-log``'s explanation (:func:`run_from_log`), or the plan of
    MODEL (tables or ``--json``). Exit 2 for a listing given MODEL or another flag, no MODEL, a flag the mode
    ignores, or a setting or model file the planner refuses (named by its flag)."""
    from kvlab.plan.report import plan_report

    listing = [
        flag for flag, on in (("--list-presets", args.list_presets), ("--list-gpus", args.list_gpus)) if on
    ]
    if listing and args.model is not None:  # the table would silently ignore MODEL
        return fail(
            args,
            f"{listing[0]} prints a table and exits; it takes no MODEL, got {args.model!r} (drop {listing[0]} to "
            f"plan {args.model})",
        )
    problem = listing and flags.ignored_by_listing(args, listing[0])
    if problem:  # --context 5 beside --list-gpus was silently ignored
        return fail(args, problem)
    if print_lists(args):
        return 0
    if args.model is None:
        return fail(
            args,
            "plan needs MODEL (a preset, config.json, .gguf file, directory or hub id); see --list-presets",
        )
    if args.from_log is not None:
        return run_from_log(args)
    args.tp = 1 if args.tp is None else args.tp
    if args.block_size is not None and args.emit != "vllm":
        return fail(args, f"--block-size {args.block_size} only applies with --emit vllm")
    if args.force:
        return fail(args, "--force only applies with --from-log (a log naming a model other than MODEL)")
    problem = flags.device_flag_problem(args)
    if problem:
        return fail(args, problem)

    def build() -> dict:  # the flags are read inside: a refused value is reported as the planner's errors are
        return plan_report(
            args.model,
            **flag_values(args, "context", "batch", "gpu_mem_gib", "reserve_gib", "tp", "kv_heads", "emit"),
            **flags.kv_kwargs(args),
            **flags.weight_kwargs(args),
            **flags.device_kwargs(args),
            block_size=16 if args.block_size is None else args.block_size,
        )

    return flags.report(args, build, _print_report)


def _print_report(r: dict) -> None:
    """The plan's tables: the ``vllm serve`` command (``--emit vllm``), a per-layer plan's (``--kv-dtype
    mixed-<plan>``) or the ledger's."""
    if r["vllm"] is not None:
        print_vllm(r)
    elif "plan_layers" in r:  # --kv-dtype mixed-<plan>
        print_mixed_plan(r)
    else:
        print_plan(r)


# the flags --from-log reads beside MODEL and --json, each a fact the log may not state: the flag's dest -> the
# figure of kvlab.plan.vllm_log.read_vllm_log it stands in for (refused where the log states another value; for
# --context and --tp, where the log states one at all)
FROM_LOG_READS = {
    "gpu_mem_gib": "total_gib",
    "gpu": "total_gib",
    "block_size": "block_size",
    "context": "max_model_len",
    "tp": "tensor_parallel_size",
    "weight_bytes": "weights_gib",
    "weight_dtype": "weights_gib",
    "weights_index": "weights_gib",
    "force": "model",
}


def _stated_setting_problem(args: argparse.Namespace, log: dict, text: str) -> str | None:
    """Why ``--context`` / ``--tp`` cannot stand in for the log's max_model_len / tensor_parallel_size: ``log``
    (read from ``text``) states it, named with its line and value (:func:`kvlab.plan.vllm_log.stated_at`)."""
    from kvlab.plan.vllm_log import PER_START, stated_at

    for dest, key in (("context", "max_model_len"), ("tp", "tensor_parallel_size")):
        value = log.get(key, log.get(PER_START) if key == "max_model_len" else None)
        if getattr(args, dest) is not None and value is not None:
            flag = "--" + dest
            return (
                f"{flag} {getattr(args, dest)} gives {key} where the log does not; {args.from_log} states {value:,} "
                f"({stated_at(text, key)}) (drop {flag})"
            )
    return None


def from_log_problem(args: argparse.Namespace, log: dict | None = None, text: str = "") -> str | None:
    """Why ``--from-log`` would silently ignore a flag given with it, or None: every planner flag but those of
    :data:`FROM_LOG_READS` (``--batch``, ``--measured-step-ms``, ``--kv-dtype``, ...), since the log's own settings
    (KV dtype, ...) size what it printed; ``--context`` / ``--tp`` where ``log``
    (:func:`kvlab.plan.vllm_log.read_vllm_log` of ``text``) states max_model_len / tensor_parallel_size (named with
    its line); and ``--gpu-mem-gib`` / ``--block-size`` where it states the device memory / another block size."""
    given = flags.given_flags(args, kept=("from_log", *FROM_LOG_READS))
    if given:
        return (
            f"--from-log sets kvlab's model beside the log's KV lines, sized by the log's own settings "
            f"(max_model_len, tensor-parallel size, block size, KV dtype); it takes no {', '.join(given)} (drop "
            f"--from-log to plan with {flags.them(given)})"
        )
    problem = (
        _flag_value_problem(args)
        or (None if log is None else _stated_setting_problem(args, log, text))
        or _memory_flags_problem(args, log, text)
    )
    if problem:
        return problem
    if log is not None and args.block_size not in (None, log.get("block_size", args.block_size)):
        return (
            f"--block-size {args.block_size} gives the block size where the log does not; {args.from_log} states "
            f"{log['block_size']} (drop --block-size)"
        )
    return None


def _flag_value_problem(args: argparse.Namespace) -> str | None:
    """Why a value ``--from-log`` reads is refused as plain ``plan`` refuses it, before the log is read: ``--context``
    and ``--tp`` not whole numbers >= 1 (:func:`kvlab.plan.config_fields.check_int_at_least`), ``--block-size`` not
    one of vLLM's (:func:`kvlab.plan.vllm.check_block_size`), ``--gpu-mem-gib`` not a finite number of GiB > 0
    (:func:`kvlab.plan.fit.check_memory_gib`: inf was an OverflowError traceback, 0 and -3 a silent "no memory
    prediction"). ``--weight-bytes`` is checked by argparse (:func:`kvlab.commands.plan.flags.byte_count`)."""
    from kvlab.plan.config_fields import check_int_at_least
    from kvlab.plan.fit import check_memory_gib
    from kvlab.plan.vllm import check_block_size

    try:
        for dest in ("context", "tp"):
            if getattr(args, dest) is not None:
                check_int_at_least(dest, getattr(args, dest), 1, flag="--" + dest)
        if args.block_size is not None:
            check_block_size(args.block_size)
        if args.gpu_mem_gib is not None:
            check_memory_gib(args.gpu_mem_gib)
    except ValueError as e:
        return flag_message(args, e)
    return None


def _memory_flags_problem(args: argparse.Namespace, log: dict | None, text: str) -> str | None:
    """Why the device-memory flags (``--gpu-mem-gib``, ``--gpu``) or the weight flags (``--weight-bytes``,
    ``--weight-dtype``, ``--weights-index``) cannot stand in for the log's figure: two weight flags given, or
    ``log`` (read from ``text``) states that figure, named with its line (:func:`kvlab.plan.vllm_log.stated_at`).
    ``--gpu`` with ``--gpu-mem-gib`` is the device and its memory, as in plain ``plan`` and ``kvlab paging``
    (:func:`kvlab.plan.hardware.memory_override`)."""
    from kvlab.plan.vllm_log import stated_at

    memory = [f"{f} {v:g}" if isinstance(v, float) else f"{f} {v}" for f, v in (("--gpu-mem-gib", args.gpu_mem_gib), ("--gpu", args.gpu)) if v is not None]
    weights = [
        f"{flag} {value}"
        for flag, value in (
            ("--weight-bytes", args.weight_bytes),
            ("--weight-dtype", None if args.weight_dtype == "auto" else args.weight_dtype),
            ("--weights-index", args.weights_index),
        )
        if value is not None
    ]
    for given, key, what, unit in (
        (memory, "total_gib", "the device memory", " GiB"),
        (weights, "weights_gib", "the weights", " GiB per GPU"),
    ):
        if len(given) > 1 and given is weights:
            return f"{' and '.join(given)} both give {what} where the log does not; pass one"
        if given and log is not None and key in log:
            return (
                f"{given[0]} gives {what} where the log does not; {args.from_log} states {log[key]:g}{unit} "
                f"({stated_at(text, key)}) (drop {given[0].split()[0]})"
            )
    return None


def _log_model_problem(args: argparse.Namespace, log: dict, text: str, config: dict) -> tuple[str | None, list[str]]:
    """``(problem, notes)``: why the log is not MODEL's, where it names a model that is clearly another
    (:func:`kvlab.plan.model_names.same_model`) and ``--force`` was not given; with ``--force`` no problem but a note
    saying the model check was overridden (it was silent: the output read as a check of MODEL). ``(None, [])``
    where the log names no model or names MODEL."""
    from kvlab.plan.model_names import model_names, same_model
    from kvlab.plan.vllm_log import stated_at

    if "model" not in log or same_model(log["model"], model_names(args.model, config)):
        return None, []
    where = stated_at(text, "model")
    if args.force:
        return None, [
            f"--force: the model check was overridden: {args.from_log} is a log of {log['model']} ({where}), not of "
            f"MODEL {args.model}; its figures are set beside {args.model}'s KV geometry"
        ]
    return (
        f"{args.from_log} is a log of {log['model']} ({where}), not of MODEL {args.model}: its "
        f"figures would be set beside another model's KV geometry; pass that model's config as MODEL, or --force "
        f"if {args.model} has the same architecture"
    ), []


def _given_memory(args: argparse.Namespace, spec, log: dict) -> tuple[float | None, int | None, list[str]]:
    """``(device memory GiB, one GPU's weight bytes, notes)`` from the flags standing in where ``log`` is silent:
    ``--gpu-mem-gib`` or ``--gpu`` (the hardware table's memory; both: ``--gpu-mem-gib``, noted as
    :func:`kvlab.plan.hardware.memory_override` words it), ``--weight-bytes`` / ``--weight-dtype`` /
    ``--weights-index`` (:func:`kvlab.plan.weights.weight_bytes`, split over the log's or ``--tp``'s GPUs)."""
    from kvlab.plan.hardware import get_hardware, memory_override
    from kvlab.plan.weights import weight_bytes

    total, weights, notes = args.gpu_mem_gib, None, []
    if args.gpu is not None and args.gpu_mem_gib is not None:  # the one rule: --gpu-mem-gib is the memory
        notes.append(f"device memory not in the log: {memory_override(args.gpu, args.gpu_mem_gib) or total}")
    elif args.gpu is not None:
        hw = get_hardware(args.gpu)
        if hw.memory_gib is None:
            raise ValueError(f"--gpu {args.gpu}: the hardware table states no memory for {hw.name}; pass --gpu-mem-gib")
        total = hw.memory_gib
        notes.append(
            f"device memory not in the log: --gpu {args.gpu}, {hw.describe_memory()} (the hardware table; torch "
            "reports somewhat less)"
        )
    if args.weight_bytes is not None or args.weight_dtype != "auto" or args.weights_index is not None:
        w = weight_bytes(spec, args.weight_dtype, index_path=args.weights_index, override_bytes=args.weight_bytes)
        tp = int(log.get("tensor_parallel_size", args.tp or 1))
        weights = -(-w.total_bytes // tp)
        source = "" if w.source.startswith("given") else f" ({w.source})"
        notes.append(f"weights not in the log: {w.total_bytes:,} B{source}, {weights:,} B per GPU of {tp}")
    return total, weights, notes


def _json_hint(path: str, text: str) -> str:
    """A refusal's hint where the --from-log file holds JSON rather than a log's text (a case file such as a
    .jsonl of several quoted logs is read as one log: "more than one start of vLLM"); "" otherwise."""
    if not text.lstrip().startswith(("{", "[")):
        return ""
    return (
        f" ({path} holds JSON, not a vLLM log's text: a file of several quoted logs is read as one log; save one "
        "log's text, as vLLM printed it, to a file and pass that)"
    )


def run_from_log(args: argparse.Namespace) -> int:
    """``kvlab plan MODEL --from-log FILE``: the log's KV lines explained (:func:`kvlab.plan.vllm_log.explain_vllm_log`);
    a flag it would ignore is refused (:func:`from_log_problem`); a ``--context`` beyond the model's limit is warned
    about as plain ``plan`` warns (:func:`kvlab.plan.report_inputs.context_warnings`; ``warnings`` in ``--json``)."""
    from kvlab.plan.load import load_config
    from kvlab.plan.report_inputs import context_warnings
    from kvlab.plan.spec import spec_from_config
    from kvlab.plan.vllm_log import explain_vllm_log, read_vllm_log

    problem = from_log_problem(args)
    if problem:
        return fail(args, problem)
    try:
        text = read_text(args.from_log, errors="replace")  # by its byte-order mark: PowerShell's > writes UTF-16
    except OSError as e:
        return fail(args, f"--from-log {args.from_log}: {e.strerror or e}")
    try:
        log = read_vllm_log(text)
        problem = from_log_problem(args, log, text)
        if problem:
            return fail(args, problem)
        config = load_config(args.model)
        problem, forced = _log_model_problem(args, log, text, config)
        if problem:
            return fail(args, problem)
        spec = spec_from_config(config, name=str(args.model))
        total, weights, notes = _given_memory(args, spec, log)
        notes = forced + notes
        r = explain_vllm_log(
            log,
            spec,
            config,
            total_gib=total,
            block_size=args.block_size,
            max_model_len=args.context,
            tp=args.tp,
            weight_bytes=weights,
        )
    except (ValueError, OSError) as e:
        return fail(args, f"--from-log {args.from_log}: {flag_message(args, e)}{_json_hint(args.from_log, text)}")
    r = {"model": str(args.model), "log_file": args.from_log, "log": log, **r, "notes": notes + r["notes"]}
    # a --context beyond the model's limit was taken silently (kimi: 10,000,000 past 262,144); warned as plain plan
    r["warnings"] = [] if args.context is None else context_warnings(spec, {f"--context {args.context:,}": args.context})
    flags.warn(args, r)
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print_from_log(r)
    return 0
