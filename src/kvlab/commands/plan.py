"""``kvlab plan``, ``kvlab roofline``, ``kvlab video``: the torch-free planner (logic in :mod:`kvlab.plan`)."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys

from kvlab.commands import fail
from kvlab.plan.ledger import KV_DTYPE_NAMES
from kvlab.plan.scenario import DEFAULT_RESERVE_GIB

GIB = 1024**3


def _byte_count(text: str) -> int:
    """An integer byte count; accepts ``1e9`` (a plain integer is read exactly, not through a float)."""
    refused = argparse.ArgumentTypeError(f"a non-negative whole number of bytes, got {text!r}")
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise refused from None
        if not math.isfinite(number) or number != int(number):
            raise refused from None
        value = int(number)
    if value < 0:
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


def flag_message(args: argparse.Namespace, exc: Exception) -> str:
    """``exc``'s message with each planner argument it names (`group_size`) replaced by its flag (--group-size)
    when this command has that flag; config fields and other names are kept. Errors that already give the flag
    (`` `reserve_gib` (--reserve-gib)``) name it once."""

    def flag(m: re.Match) -> str:
        if m.group(2):
            return m.group(2)
        dest = _FLAG_OF.get(m.group(1), m.group(1))
        if dest == "model" or dest not in vars(args):  # plan's MODEL is positional; a config field stays
            return m.group(0)
        return "--" + dest.replace("_", "-")

    message = str(exc)
    if getattr(args, "kv_heads", None) is not None and not message.startswith("config field"):
        message = message.replace("`num_key_value_heads` (", "--kv-heads (")  # the override, not the config
    return _NAMED.sub(flag, message)


def _add_kv_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kv-dtype",
        default="auto",
        choices=KV_DTYPE_NAMES,  # every name the planner reads
        help="KV cache dtype (default auto: the config's dtype); kivi-N (= kiviN): kvlab's KIVI cache, kivi-kKvV "
        "with its own key/value bits; fp8-e4m3/fp8-e5m2[-tensor|-unscaled|-hadamard] (fp8_e4m3 = fp8-e4m3): "
        "kvlab's FP8 cache, "
        "1 B/element plus fp32 scales (fp8: 1 B/element, no scales)",
    )
    # None = not given: KIVI's 32 / 128; given with a --kv-dtype that is not KIVI it is refused, not ignored
    p.add_argument("--group-size", type=int, default=None, help="KIVI group size G (default 32)")
    p.add_argument(
        "--residual", type=int, default=None, help="KIVI residual window R in tokens (default 128)"
    )


def keep_tokens_type(text: str) -> int:
    """``--keep-tokens``: a whole number of tokens >= 1 (argparse names the flag in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of tokens >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number of tokens >= 1, got {text!r}")
    return value


def _add_keep_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--keep-tokens",
        type=keep_tokens_type,
        default=None,
        metavar="N",
        help="an evicting cache that keeps at most N tokens per layer and sequence (sink: sink_tokens + "
        "window_length; tova: its token_budget): KV bytes, fit and decode bound are those of min(context, N) "
        "tokens in --kv-dtype's format (docs/EVICTION.md, Planning a capped cache)",
    )


def _kv_kwargs(args: argparse.Namespace) -> dict:
    """The planner's KV arguments from the flags of :func:`_add_kv_flags` (and :func:`_add_keep_flag`).

    Raises:
        ValueError: ``--group-size`` / ``--residual`` given with a ``--kv-dtype`` that is not KIVI's.
    """
    for flag, value in (("--group-size", args.group_size), ("--residual", args.residual)):
        if value is not None and not args.kv_dtype.startswith("kivi"):
            raise ValueError(f"{flag} {value} sizes a kivi --kv-dtype only; --kv-dtype is {args.kv_dtype}")
    group_size = 32 if args.group_size is None else args.group_size
    residual = 128 if args.residual is None else args.residual
    kwargs = {"kv": args.kv_dtype, "group_size": group_size, "residual_length": residual}
    if getattr(args, "keep_tokens", None) is not None:
        kwargs["keep_tokens"] = args.keep_tokens
    return kwargs


def _add_weight_flags(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--weight-bytes", type=_byte_count, default=None, metavar="N", help="weight bytes, given")


def _weight_kwargs(args: argparse.Namespace) -> dict:
    """The planner's weight arguments from the flags of :func:`_add_weight_flags`.

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


def _add_device_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpu", default=None, help="GPU from the datasheet table (default A100-80GB); see --list-gpus"
    )
    p.add_argument("--bandwidth-gb-s", type=float, default=None, help="custom device: memory bandwidth, GB/s")
    p.add_argument("--tflops", type=float, default=None, help="custom device: dense 16-bit TFLOP/s")
    p.add_argument("--measured-step-ms", type=float, default=None, help="a measured decode step to compare")
    p.add_argument("--list-gpus", action="store_true", help="print the hardware table and exit")


def _device_kwargs(args: argparse.Namespace) -> dict:
    """The planner's device arguments from the flags of :func:`_add_device_flags` (``--list-gpus`` aside)."""
    return {
        "gpu": args.gpu,
        "bandwidth_gb_s": args.bandwidth_gb_s,
        "tflops": args.tflops,
        "measured_step_ms": args.measured_step_ms,
    }


def _device_flag_problem(args: argparse.Namespace) -> str | None:
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


def _warn(args: argparse.Namespace, r: dict) -> None:
    """The report's warnings on stderr, one line each (also in --json): ``--measured-step-ms`` faster than the
    decode step lower bound (``measured.warning``: it cannot be), and a context beyond the model's
    max_position_embeddings (``warnings``)."""
    prog = getattr(args, "kvlab_prog", None) or "kvlab"
    for warning in [(r.get("measured") or {}).get("warning"), *r.get("warnings", [])]:
        if warning:
            print(f"{prog}: warning: {warning}", file=sys.stderr)


def register(subparsers) -> None:
    _register_plan(subparsers)
    _register_roofline(subparsers)
    _register_video(subparsers)


def _register_plan(subparsers) -> None:
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
    p.add_argument("--context", type=int, default=8192, help="tokens per sequence (default 8192)")
    p.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    _add_kv_flags(p)
    _add_keep_flag(p)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs (default 1)")
    p.add_argument(
        "--gpu-mem-gib",
        type=float,
        default=None,
        help="GPU memory budget in GiB (2^30 B); default: the --gpu row's memory as the device reports it "
        "(A100-80GB: 81,920 MiB = 80 GiB)",
    )
    p.add_argument(
        "--reserve-gib",
        type=float,
        default=DEFAULT_RESERVE_GIB,
        help="GiB per GPU kept free for activations, workspace and framework "
        f"(default {DEFAULT_RESERVE_GIB:g}, as kvlab paging)",
    )
    p.add_argument("--kv-heads", type=int, default=None, help="what-if: override the KV heads (e.g. MHA)")
    _add_weight_flags(p)
    _add_device_flags(p)
    p.add_argument(
        "--emit",
        choices=("vllm",),
        default=None,
        help="print a runnable `vllm serve` command for the plan (flags, then the KV cache vLLM would report as "
        "# comments); with --json, under the key 'vllm'",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per KV block for --emit vllm (1, 8, 16, 32, 64 or 128; default 16, vLLM's CUDA default)",
    )
    p.add_argument("--list-presets", action="store_true", help="print the built-in models and exit")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=run_plan)


def _register_roofline(subparsers) -> None:
    r = subparsers.add_parser(
        "roofline",
        help="ridge point, decode/prefill intensity and decode step bound; --probe measures this machine",
        description="Roofline of decode and prefill: the GPU's ridge point (peak FLOP/s over memory bandwidth, "
        "from its datasheet), the ideal decode attention intensity I = 2g/p (g query heads per KV head, p bytes "
        "per KV element), a rough prefill intensity (projection and causal attention FLOPs over the weights "
        "and an activation-traffic estimate), and the decode step lower bound (weights + batch x KV) / "
        "bandwidth. --probe measures fp32 matmul FLOP/s and streaming GB/s here with numpy.",
    )
    r.add_argument(
        "--model",
        default=None,
        help="preset, config.json, .gguf file, directory or hub id (default llama-3-8b)",
    )
    r.add_argument("--context", type=int, default=8192, help="tokens per sequence (default 8192)")
    r.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    r.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs (default 1)")
    _add_kv_flags(r)
    _add_keep_flag(r)
    _add_weight_flags(r)
    _add_device_flags(r)
    r.add_argument("--probe", action="store_true", help="measure this machine's fp32 roofs (a few seconds)")
    r.add_argument("--json", action="store_true", help="print machine-readable JSON")
    r.set_defaults(func=run_roofline)


def _register_video(subparsers) -> None:
    v = subparsers.add_parser(
        "video",
        help="tokens and KV bytes of autoregressive video clips (every frame kept in the cache)",
        description="Turn clips (seconds, fps, resolution) into tokens through temporal and spatial "
        "compression and a patch size, and size their KV cache on a model (whole history kept).",
    )
    v.add_argument(
        "--model",
        default="llama-3-8b",
        help="preset, config.json, .gguf file, directory or hub id (default llama-3-8b)",
    )
    v.add_argument(
        "--seconds", type=float, nargs="+", default=[5, 10, 30], help="clip lengths (default 5 10 30)"
    )
    v.add_argument("--fps", type=int, default=24, help="frames per second (default 24)")
    v.add_argument("--width", type=int, default=1280, help="pixels (default 1280)")
    v.add_argument("--height", type=int, default=720, help="pixels (default 720)")
    v.add_argument("--temporal-compression", type=int, default=4, help="frames per latent frame (default 4)")
    v.add_argument(
        "--spatial-compression", type=int, default=8, help="pixels per latent, per side (default 8)"
    )
    v.add_argument("--patch-size", type=int, default=1, help="latents per token, per side (default 1)")
    v.add_argument(
        "--causal-first-frame",
        action="store_true",
        help="causal VAE: latent frames = 1 + (frames - 1) // temporal (default frames // temporal)",
    )
    v.add_argument("--batch", type=int, default=1, help="clips (default 1)")
    _add_kv_flags(v)
    v.add_argument("--json", action="store_true", help="print machine-readable JSON")
    v.set_defaults(func=run_video)


def _gib(n: float | int | None) -> str:
    """Binary units (KiB/MiB/GiB = 2^10/2^20/2^30 B), GiB from 1 GiB up."""
    if n is None:
        return "-"
    if n == 0:
        return "0 B"
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size or unit == "KiB":
            return f"{n / size:,.2f} {unit}"
    raise AssertionError("unreachable")


def _gb(n: float | int | None) -> str:
    return "-" if n is None else f"{n / 1e9:,.2f} GB"


def _bytes(n: float | int | None) -> str:
    if n is None:
        return "-"
    return f"{n:,} B" if float(n).is_integer() else f"{n:,.2f} B"


def _print_lists(args: argparse.Namespace) -> bool:
    """Print what ``--list-presets`` / ``--list-gpus`` ask for (both when both are given), as tables or, with
    ``--json``, as one JSON object (``presets``, ``gpus``); True when anything was listed."""
    from rich.console import Console
    from rich.table import Table

    want_presets, want_gpus = getattr(args, "list_presets", False), getattr(args, "list_gpus", False)
    if not (want_presets or want_gpus):
        return False
    from kvlab.plan import presets
    from kvlab.plan.hardware import HARDWARE

    if getattr(args, "json", False):
        listing = {}
        if want_presets:
            listing["presets"] = [
                {"name": p.name, "hub_id": p.hub_id, "exercises": p.why, "config_url": p.source_url}
                for p in presets.PRESETS.values()
            ]
        if want_gpus:
            listing["gpus"] = [h.to_dict() for h in HARDWARE]
        print(json.dumps(listing, indent=1))
        return True
    if want_presets:
        t = Table(title="Built-in presets (fields from each hub config.json)")
        for col in ("name", "hub id", "exercises"):
            t.add_column(col)
        for preset in presets.PRESETS.values():
            t.add_row(preset.name, preset.hub_id, preset.why)
        Console().print(t)
    if want_gpus:
        t = Table(
            title="Hardware table (datasheets: dense 16-bit tensor FLOP/s, TB/s = 1e12 B/s; memory as the device "
            "reports it, MiB = 2^20 B)"
        )
        numeric = ("TFLOP/s", "TB/s", "memory MiB", "GiB", "ridge FLOP/B")
        for col in ("name", *numeric, "note", "datasheet", "memory read from"):
            t.add_column(col, justify="right" if col in numeric else "left")
        for h in HARDWARE:
            t.add_row(
                h.name,
                f"{h.tflops_16bit:g}",
                f"{h.bandwidth_tb_s:g}",
                f"{h.memory_mib:,}",
                f"{h.memory_gib:.2f}",
                f"{h.ridge_flop_per_byte:.1f}",
                h.note,
                h.source,
                h.memory_source,
            )
        Console().print(t)
    return True


def run_plan(args: argparse.Namespace) -> int:
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
    if _print_lists(args):
        return 0
    if args.model is None:
        return fail(
            args,
            "plan needs MODEL (a preset, config.json, .gguf file, directory or hub id); see --list-presets",
        )
    if args.block_size is not None and args.emit != "vllm":
        return fail(args, f"--block-size {args.block_size} only applies with --emit vllm")
    problem = _device_flag_problem(args)
    if problem:
        return fail(args, problem)
    try:
        r = plan_report(
            args.model,
            context=args.context,
            batch=args.batch,
            **_kv_kwargs(args),
            **_weight_kwargs(args),
            **_device_kwargs(args),
            gpu_mem_gib=args.gpu_mem_gib,
            reserve_gib=args.reserve_gib,
            tp=args.tp,
            kv_heads=args.kv_heads,
            emit=args.emit,
            block_size=16 if args.block_size is None else args.block_size,
        )
    except (ValueError, OSError) as e:
        return fail(args, flag_message(args, e))
    _warn(args, r)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    if r["vllm"] is not None:
        _print_vllm(r)
        return 0
    _print_plan(r)
    return 0


def _print_vllm(r: dict) -> None:
    """The command on one line, then what it means as ``#`` comments: the output is a runnable shell script."""
    v = r["vllm"]
    print(v["command_line"])
    print(
        f"# KV cache vLLM would report per GPU: {v['kv_cache_tokens']:,} tokens ({v['num_gpu_blocks']:,} blocks of "
        f"{v['block_size']} tokens x {v['num_layers']} layers, {v['page_size_bytes']:,} B per block and layer)"
    )
    print(
        f"# from {_gib(v['kv_memory_bytes_per_gpu'])} of KV memory = {v['gpu_memory_utilization']:g} x "
        f"{_gib(v['memory_bytes'])} - {_gib(v['weight_bytes_per_gpu'])} weights per GPU [GiB = 2^30 B]"
    )
    print(
        f"# maximum concurrency for {v['max_model_len']:,} tokens per request: {v['max_concurrency']:.2f}x "
        f"(the plan: {r['kv_bytes_per_token_per_gpu']:,} KV B/token/GPU, max batch {r['max_batch']:,})"
    )
    for note in v["notes"]:
        print(f"# note: {note}")


def _print_plan(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    s = r["spec"]
    kinds = ", ".join(f"{n} {k}" for k, n in s["layer_kinds"].items())
    heads = (
        f"MLA latent {s['mla_latent_dim']}"
        if s["mla_latent_dim"]
        else (f"{s['num_attention_heads']} q / {s['num_kv_heads']} KV heads x {s['head_dim']}")
    )
    kvd = r["kv_dtype"]
    cap = "" if kvd["keep_tokens"] is None else f" keeping at most {kvd['keep_tokens']:,} tokens"
    t = Table(
        title=f"{r['model']}: {s['num_layers']} layers ({kinds}), {heads}; KV {kvd['name']}{cap}, "
        f"batch {r['batch']} x {r['context']:,} tokens, tp {r['tp']}  [GiB = 2^30 B, GB = 1e9 B]"
    )
    t.add_column("layer kind")
    t.add_column("layers", justify="right")
    t.add_column("tokens kept", justify="right")
    t.add_column("KV B/token/GPU", justify="right")
    t.add_column("KV theoretical/GPU", justify="right")
    t.add_column("KV allocated/GPU", justify="right")
    for row in r["by_layer_kind"]:
        t.add_row(
            row["kind"],
            str(row["layers"]),
            f"{row['tokens_stored']:,}",
            _bytes(row["kv_bytes_per_token_per_gpu"]),
            _gib(row["kv_bytes_theoretical_per_gpu"]),
            _gib(row["kv_bytes_allocated_per_gpu"]),
        )
    console.print(t)
    console.print(_ledger_table(r))
    for note in r["notes"]:
        console.print(f"  note: {note}")


def _ledger_table(r: dict):
    """The plan's second table: KV bytes (per GPU and summed with tp > 1), weights, fit, decode bound."""
    from rich.table import Table

    t = Table(title="Ledger, fit and decode bound")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("also", justify="right")
    tp = r["tp"]
    # with tp > 1 each KV quantity is shown for one GPU and summed over all tp GPUs (a replica counts on each)
    scopes = [("", "")] if tp == 1 else [(", per GPU", "_per_gpu"), (f", all {tp} GPUs", "")]
    for scope, suffix in scopes:
        per_token = r[f"kv_bytes_per_token{suffix}"]
        also = f"{per_token / 1024:,.2f} KiB" + (f" = {tp} x per GPU" if tp > 1 and not suffix else "")
        t.add_row(f"KV bytes per token{scope}", _bytes(per_token), also)
    for scope, suffix in scopes:
        total = r["kv_bytes_total" + suffix]
        t.add_row(f"KV total, theoretical{scope}", _gib(total), _gb(total))
    _add_metadata_row(t, r)
    for scope, suffix in scopes:
        allocated = r["kv_bytes_allocated_per_gpu" if suffix else "kv_bytes_total_allocated"]
        t.add_row(f"KV total, engine-allocated{scope}", _gib(allocated), _gb(allocated))
    t.add_row("weights", _gib(r["weight_bytes"]), r["weight_bytes_source"])
    if r["kv_to_weight_ratio"] is not None:
        t.add_row("KV / weights", f"{r['kv_to_weight_ratio']:.2f}x", "")
    _add_fit_rows(t, r)
    _add_bound_rows(t, r)
    return t


def _add_metadata_row(t, r: dict) -> None:
    """The quantization metadata inside the theoretical total: KIVI scale/zero pairs or FP8 scales (none for a
    plain dtype or unscaled FP8)."""
    kvd, meta = r["kv_dtype"], r["kv_metadata_bytes_total"]
    if kvd["nbits"] is not None:
        label = f"of which scales/zeros ({kvd['metadata_bytes']} B each)"
    elif kvd["fp8_scale"] not in (None, "none"):
        label = f"of which FP8 scales ({kvd['fp8_scale']}, fp32)"
    else:
        return
    pct = 100.0 * meta / r["kv_bytes_total"] if r["kv_bytes_total"] else 0.0
    share = f"{pct:.2f}%" if pct >= 0.01 or pct == 0 else f"{pct:.1e}%"
    scope = "" if r["tp"] == 1 else ", all GPUs"
    t.add_row(label, _bytes(meta), f"{_gib(meta)}; {share} of the KV total{scope}")


def _add_fit_rows(t, r: dict) -> None:
    """Rows of the GPU budget and what fits in it, or one row saying what the fit needs."""
    if r["fits"] is not None:
        b = r["budget"]
        t.add_row("GPU memory", _gib(b["memory_bytes"]), b["source"])
        t.add_row("reserve (--reserve-gib)", _gib(b["reserve_bytes"]), "")
        t.add_row(
            "left for KV per GPU", _gib(r["kv_budget_bytes_per_gpu"]), _gb(r["kv_budget_bytes_per_gpu"])
        )
        t.add_row(f"fits batch {r['batch']} x {r['context']:,}", "yes" if r["fits"] else "no", "")
        t.add_row(
            f"max batch at {r['context']:,} tokens",
            f"{r['max_batch']:,}",
            f"engine-allocated: {r['max_batch_allocated']:,}",
        )
        keep = r["kv_dtype"]["keep_tokens"]
        if r["max_context"] is not None:
            mc = f"{r['max_context']:,} tokens"
        elif keep is not None:
            mc = f"not limited by KV (the cache keeps at most {keep:,} tokens)"
        else:
            mc = "not limited by memory"
        mca = "not limited" if r["max_context_allocated"] is None else f"{r['max_context_allocated']:,}"
        limit = r["spec"]["max_position_embeddings"]
        also = f"engine-allocated: {mca}" + (
            f"; config limit {limit:,}" if r["max_context_above_model_limit"] else ""
        )
        t.add_row(f"max context at batch {r['batch']}", mc, also)
    else:
        t.add_row("fit", "-", "needs GPU memory (--gpu-mem-gib) and weight bytes")


def _add_bound_rows(t, r: dict) -> None:
    """Rows of the decode step lower bound, the decode attention intensity and a measured step."""
    gpu = r["gpu"]
    if r["decode_step_lower_bound_ms"] is not None:
        t.add_row(
            f"decode step lower bound ({gpu['name']})",
            f"{r['decode_step_lower_bound_ms']:.3f} ms",
            f"{r['limiter']}-bound; {r['bytes_per_step'] / GIB:,.2f} GiB per step",
        )
        t.add_row("tokens/s upper bound", f"{r['tokens_per_s_upper_bound']:,.1f}", f"batch {r['batch']}")
    t.add_row(
        "decode attention intensity",
        f"{r['decode_attention_intensity']:.2f} FLOP/B",
        "ridge "
        + ("-" if gpu["ridge_flop_per_byte"] is None else f"{gpu['ridge_flop_per_byte']:.1f} FLOP/B"),
    )
    if r["measured"]:
        m = r["measured"]
        t.add_row(
            "measured step",
            f"{m['measured_step_ms']:.3f} ms",
            f"{m['fraction_of_bound']:.1%} of bound; {m['achieved_bandwidth_gb_s']:,.1f} GB/s achieved"
            + ("; FASTER THAN THE BOUND: see the warning" if m["faster_than_bound"] else ""),
        )


def run_roofline(args: argparse.Namespace) -> int:
    from kvlab.plan.report import roofline_report

    if args.list_gpus and args.model is not None:  # the table would silently ignore --model
        return fail(args, f"--list-gpus prints a table and exits; it takes no --model, got {args.model!r}")
    if _print_lists(args):
        return 0
    args.model = args.model or "llama-3-8b"
    problem = _device_flag_problem(args)
    if problem:
        return fail(args, problem)
    try:
        r = roofline_report(
            model=args.model,
            context=args.context,
            batch=args.batch,
            tp=args.tp,
            run_probe=args.probe,
            **_kv_kwargs(args),
            **_weight_kwargs(args),
            **_device_kwargs(args),
        )
    except (ValueError, OSError) as e:
        return fail(args, flag_message(args, e))
    _warn(args, r)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    _print_roofline(r)
    return 0


def _bound_cell(bound: str | None) -> str:
    """``memory-bound`` / ``compute-bound``, or why there is no verdict: no ridge point without a compute peak
    (``--bandwidth-gb-s`` alone; the table printed ``--bound`` once)."""
    return f"{bound}-bound" if bound else "- (no peak FLOP/s: no ridge)"


def _print_roofline(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    g = r["gpu"]
    t = Table(title=f"Roofline: {g['name']}", caption=f"source: {g['source']}")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("note")
    t.add_row(
        "peak dense 16-bit", "-" if g["tflops_16bit"] is None else f"{g['tflops_16bit']:g} TFLOP/s", g["note"]
    )
    t.add_row("memory bandwidth", f"{g['bandwidth_tb_s']:g} TB/s", "1 TB = 1e12 B")
    t.add_row(
        "ridge point",
        "-" if r["ridge_flop_per_byte"] is None else f"{r['ridge_flop_per_byte']:.1f} FLOP/B",
        "peak / bandwidth",
    )
    t.add_row(
        f"decode attention intensity ({r['model']})",
        f"{r['decode_attention_intensity']:.2f} FLOP/B",
        f"I = 2g/p, KV {r['kv_dtype']['name']}",
    )
    if r["kv_dtype"]["keep_tokens"] is not None:
        kept = min(r["context"], r["kv_dtype"]["keep_tokens"])  # a cap above the context keeps every token
        t.add_row(
            "KV kept per layer",
            f"{kept:,} tokens",
            f"--keep-tokens {r['kv_dtype']['keep_tokens']:,}: a capped cache at --context {r['context']:,}",
        )
    if r["prefill"] is not None:
        p = r["prefill"]
        t.add_row(
            f"prefill intensity (S = {p['seq_len']:,})",
            f"{p['intensity_flop_per_byte']:.1f} FLOP/B",
            "rough model: (2NS + causal attention) FLOPs over weights + 10 S D p bytes per layer",
        )
    if r["decode_step_lower_bound_ms"] is not None:
        t.add_row(
            f"decode step lower bound (batch {r['batch']}, {r['context']:,} tokens)",
            f"{r['decode_step_lower_bound_ms']:.3f} ms",
            f"{r['bytes_per_step']:,} B per step ({r['bytes_per_step'] / GIB:,.2f} GiB), {r['limiter']}-bound",
        )
        t.add_row("tokens/s upper bound", f"{r['tokens_per_s_upper_bound']:,.1f}", "batch / step bound")
    if r["measured"]:
        m = r["measured"]
        t.add_row(
            "measured step",
            f"{m['measured_step_ms']:.3f} ms",
            f"{m['fraction_of_bound']:.1%} of bound; {m['achieved_bandwidth_gb_s']:,.1f} GB/s achieved"
            + ("; FASTER THAN THE BOUND: see the warning" if m["faster_than_bound"] else ""),
        )
    console.print(t)

    t = Table(
        title=f"Ideal decode attention intensity I = 2g/p (p = {r['kv_dtype']['bytes_per_element']:g} B)"
    )
    t.add_column("g = n_q / n_kv", justify="right")
    t.add_column("I (FLOP/B)", justify="right")
    t.add_column(f"{g['name']}", justify="right")
    probe = r["probe"]
    if probe:
        t.add_column("this machine, fp32", justify="right")
    for i, row in enumerate(r["decode_intensity_table"]):
        cells = [str(row["g"]), f"{row['intensity_flop_per_byte']:.1f}", _bound_cell(row["bound"])]
        if probe:
            local = probe["decode_intensity_table"][i]
            cells.append(f"I = {local['intensity_flop_per_byte']:.1f}: {local['bound']}-bound")
        t.add_row(*cells)
    console.print(t)
    if probe:
        console.print(
            f"  probe (numpy fp32, {probe['cpu_count']} CPUs, {probe['probe_seconds']:.1f} s): "
            f"{probe['peak_gflops']:.2f} GFLOP/s (matmul n={probe['matmul_n']}), "
            f"{probe['bandwidth_gb_s']:.2f} GB/s (streaming), ridge {probe['ridge_flop_per_byte']:.2f} FLOP/B"
        )
    for note in r["notes"]:
        console.print(f"  note: {note}")


def run_video(args: argparse.Namespace) -> int:
    from kvlab.plan.report import video_report

    try:
        r = video_report(
            model=args.model,
            seconds=args.seconds,
            fps=args.fps,
            width=args.width,
            height=args.height,
            temporal_compression=args.temporal_compression,
            spatial_compression=args.spatial_compression,
            patch_size=args.patch_size,
            causal_first_frame=args.causal_first_frame,
            batch=args.batch,
            **_kv_kwargs(args),
        )
    except (ValueError, OSError) as e:
        return fail(args, flag_message(args, e))
    _warn(args, r)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    c0 = r["clips"][0]
    t = Table(
        title=f"Video KV on {r['model']} ({r['kv_dtype']['name']}): {c0['width']}x{c0['height']}, "
        f"{c0['temporal_compression']}x time, {c0['spatial_compression']}x{c0['spatial_compression']} space, "
        f"patch {c0['patch_size']}, whole history kept  [GiB = 2^30 B]"
    )
    for col in (
        "seconds",
        "frames",
        "latent frames",
        "tokens/frame",
        "tokens",
        "KV",
        "KV first latent frame",
    ):
        t.add_column(col, justify="right")
    for c in r["clips"]:
        t.add_row(
            f"{c['seconds']:g}",
            f"{c['frames']:,}",
            f"{c['latent_frames']:,}",
            f"{c['tokens_per_frame']:,}",
            f"{c['tokens']:,}",
            _gib(c["kv_bytes"]),
            _gib(c["kv_bytes_first_latent_frame"]),
        )
    Console().print(t)
    for note in r["notes"]:
        Console().print(f"  note: {note}")
    return 0
