"""``kvlab inspect``: per layer and KV head, the K/V ranges, per-channel key outliers and FP8 saturation/underflow
of a model on one prompt (logic in :mod:`kvlab.eval.inspect`; the figure in :mod:`kvlab.figures`)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from kvlab.commands import (
    EXIT_FILE_EXISTS,
    device_problem,
    dtype_problem,
    fail,
    file_exists_message,
    flag_values,
    force_without_output,
    progress,
    suffix_problem,
    table,
)
from kvlab.runtime import provenance
from kvlab.runtime.atomic import output_problem
from kvlab.runtime.checks import int_flag


def register(subparsers) -> None:
    """Add ``kvlab inspect`` (model, prompt, outlier and FP8 calibration flags, ``--json`` / ``--figure``; run by
    :func:`run`) to ``subparsers``."""
    p = subparsers.add_parser(
        "inspect",
        help="K/V ranges, per-channel key outliers, FP8 saturation/underflow and FP8 keys' attention KL per layer "
        "and head",
        description="Prefill a prompt (default: the bundled model on its held-out text) and report, per layer and "
        "KV head, the key/value abs-max and percentiles, per-channel outliers (largest channel magnitude over the "
        "median; channels above --outlier-factor x median) and the fraction of K/V elements FP8 e4m3 / e5m2 "
        "would saturate or flush to zero with scale 1.0, a per-tensor and per-head scales calibrated on the first "
        "--calibrate-tokens tokens, and how far FP8-rounded keys (per-head scales, plain or Hadamard-rotated as "
        "fp8-*-hadamard) move each KV head's attention: the mean KL of the prompt's last 64 queries over the keys "
        "before them, exact vs rounded. The tables show each layer's worst head; --json has every head. Every number "
        "is computed in this run.",
    )
    p.add_argument(
        "--model",
        default=None,
        help="local directory, GGUF file, named model (kvlab models) or HF hub id (default: the bundled model)",
    )
    p.add_argument("--dtype", default="bfloat16", help="model dtype: bfloat16 (default), float16 or float32")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    # None = not given (2048 / 0): given together with --prompt they are refused, not ignored
    p.add_argument("--tokens", type=int_flag(), default=None, help="prompt tokens cut from the held-out text (2048)")
    p.add_argument("--offset", type=int_flag(), default=None, help="first held-out token of the prompt (default 0)")
    p.add_argument("--prompt", default=None, help="prompt text instead of the held-out text")
    p.add_argument(
        "--outlier-factor", type=float, default=4.0, help="outlier channel: above this x the median (4)"
    )
    p.add_argument(
        "--calibrate-tokens",
        type=int_flag(),
        default=None,
        help="prompt tokens the calibrated FP8 scales see (default: the first half)",
    )
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write the report as JSON to PATH (atomically; --force to replace), or print it with no PATH",
    )
    p.add_argument("--figure", default=None, metavar="PATH", help="draw the per-layer figure to PATH (PNG)")
    p.add_argument("--force", action="store_true", help="replace an existing --json / --figure file")
    p.set_defaults(func=run)


def _check_outputs(args: argparse.Namespace) -> str | None:
    """Why the output flags cannot be written (a shared or existing file, a missing folder, --force with no
    file to replace), else None."""
    forced = force_without_output(args, "--json", "--figure")  # --json alone prints: nothing to replace
    if forced:
        return forced
    json_path = args.json if args.json != "-" else None
    if json_path and args.figure and Path(json_path).resolve() == Path(args.figure).resolve():
        return f"--json and --figure name the same file {args.figure}; give each its own"
    for flag, path in (("--json", args.json if args.json != "-" else None), ("--figure", args.figure)):
        if path is None:
            continue
        path = Path(path)
        if path.is_dir():
            return f"{flag} {path} is a folder; pass a file"
        # the figure is PNG whatever the name says (k.pdf got PNG bytes), the report JSON
        kind = ((".png",), "the figure is a PNG") if flag == "--figure" else ((".json",), "the report is JSON")
        problem = suffix_problem(flag, path, *kind)
        if problem:
            return problem
        problem = output_problem(path, flag, folder_must_exist=True)  # no new folders, as every command
        if problem:
            return problem
        if path.exists() and not args.force:
            return file_exists_message(path)
    return None


# kvlab.eval.inspect / kvlab.models argument -> its `kvlab inspect` flag
_FLAGS = {
    "calibrate_tokens": "--calibrate-tokens",
    "dtype": "--dtype",
    "device": "--device",
    "offset": "--offset",
    "n_tokens": "--tokens",
}


def _flag_problem(args: argparse.Namespace) -> str | None:
    """Why the flags cannot run (exit 2), found before the model loads (``args.tokens`` / ``args.offset`` get their
    defaults here): --tokens/--offset with --prompt, --tokens < 2, --offset < 0, --outlier-factor not a finite
    number > 1, a --device or --dtype torch does not take, --calibrate-tokens < 1 or above the held-out --tokens
    (--dtype and --calibrate-tokens were refused after the load and a 2,048-token prefill); None when they can."""
    if args.prompt is not None:
        given = [
            flag
            for flag, value in (("--tokens", args.tokens), ("--offset", args.offset))
            if value is not None
        ]
        if given:
            return f"{' and '.join(given)} only apply to the held-out text, not to --prompt"
    args.tokens = 2048 if args.tokens is None else args.tokens
    args.offset = 0 if args.offset is None else args.offset
    if args.tokens < 2:
        return f"--tokens must be >= 2, got {args.tokens}"
    if args.offset < 0:
        return f"--offset must be >= 0, got {args.offset}"
    if not math.isfinite(args.outlier_factor) or args.outlier_factor <= 1:
        return f"--outlier-factor must be a finite number > 1, got {args.outlier_factor}"
    calibrate = args.calibrate_tokens
    if calibrate is not None and calibrate < 1:
        return f"--calibrate-tokens must be >= 1, got {calibrate}"
    if calibrate is not None and args.prompt is None and calibrate > args.tokens:
        return f"--calibrate-tokens must be an int in [1, {args.tokens}] (--tokens), got {calibrate}"
    problem = device_problem(args.device)  # before the loading line: the rule and wording of eval, bench, tasks
    if problem:
        return problem
    return dtype_problem(args.dtype)  # the wording of every --dtype


def run(args: argparse.Namespace) -> int:
    """``kvlab inspect``: print (or write as ``--json``, draw as ``--figure``) the per-layer K/V statistics of
    :func:`kvlab.eval.inspect.inspect_model`. Exit 2 for an output file that exists or a bad flag, model or setting
    (named by its flag), 1 when a file the run reads is missing or unreadable (``OSError``)."""
    problem = _check_outputs(args)
    if problem:
        code = EXIT_FILE_EXISTS if "already exists" in problem else 2
        return fail(args, problem, code)
    problem = _flag_problem(args)
    if problem:
        return fail(args, problem)
    from kvlab.models import check_local_model

    try:  # a missing or invalid model directory is bad input (exit 2), as in kvlab lab / plan
        check_local_model(args.model)
    except (
        OSError,
        ValueError,
    ) as exc:  # ValueError: a file that is not GGUF, a named model failing its sha256
        return fail(args, exc)
    from rich.console import Console

    from kvlab.eval.inspect import inspect_model
    from kvlab.lab.longrun import model_label

    err = Console(stderr=True)
    warning = _position_warning(args)
    if warning:
        err.print(f"warning: {warning}", style="yellow", markup=False, highlight=False, soft_wrap=True)
    kwargs = flag_values(
        args, "tokens", "offset", "dtype", "device", "prompt", "outlier_factor", "calibrate_tokens"
    )
    check = _memory_check(args.prompt is not None)
    from kvlab.models import ModelLoadError

    try:
        # two steps: the load, then the prefill and every layer's statistics
        with progress(err, 2, "kvlab inspect") as bar:
            bar.start(f"loading {model_label(args.model)}")

            def before_forward(lm, tokens: int) -> None:  # the model is loaded and the prompt cut
                check(lm, tokens)
                layers = getattr(lm.config.get_text_config(), "num_hidden_layers", "?")
                bar.start(f"prefill of {tokens:,} tokens, K/V statistics of {layers} layers")

            report = inspect_model(args.model, before_forward=before_forward, **kwargs)
    except ModelLoadError as exc:  # a damaged model folder: fail() names --model
        return fail(args, exc)
    except ValueError as exc:
        msg = str(exc)
        for name, flag in _FLAGS.items():  # the library names its arguments; the user typed flags
            msg = msg.replace(f"`{name}`", flag)
        return fail(args, msg)
    except (FileNotFoundError, OSError) as exc:
        return fail(args, exc, 1)
    if args.figure:
        from kvlab.figures import plot_kv_inspect

        plot_kv_inspect(report, args.figure)
    if args.json == "-":
        print(json.dumps(report, indent=1))
        return 0
    if args.json:
        from kvlab.runtime.atomic import atomic_write_json

        atomic_write_json(args.json, report)
    _print_tables(report, args)
    return 0


def _memory_check(prompt_given: bool):
    """``before_forward`` of :func:`kvlab.eval.inspect.inspect_model`: refuses (ValueError) a prompt whose
    :func:`~kvlab.eval.inspect.peak_bytes` pass :func:`kvlab.runtime.provenance.available_memory_bytes`, saying what
    would fit: a size is refused with what it needs before any work starts."""

    def check(lm, tokens: int) -> None:
        from kvlab.eval.inspect import peak_bytes
        from kvlab.lab import longrun

        dtype = next(lm.parameters()).dtype
        available = provenance.available_memory_bytes()
        need = peak_bytes(lm.config, tokens=tokens, dtype=dtype)
        if available is None or need <= available:
            return
        low, high = 0, tokens  # the largest prompt that fits: peak_bytes grows with tokens
        while low < high:
            mid = (low + high + 1) // 2
            fits = peak_bytes(lm.config, tokens=mid, dtype=dtype) <= available
            low, high = (mid, high) if fits else (low, mid - 1)
        what = f"the --prompt text's {tokens:,} tokens" if prompt_given else f"--tokens {tokens:,}"
        raise ValueError(
            longrun.memory_refusal(
                f"{what} (the prefill's activations, every layer's K/V in {str(dtype).removeprefix('torch.')} "
                "and one layer's statistics)",
                need,
                available,
                f"at most about {low} tokens fit" if low else "not even 1 token fits",
            )
        )

    return check


def _position_warning(args: argparse.Namespace) -> str | None:
    """The warning for a held-out prompt (--tokens) past the model's max_position_embeddings, read from its files
    before it is loaded (inspected, not refused: as ``kvlab eval``, the statistics then include positions the
    model was never trained on); None within the limit, for --prompt, or when no file states a limit."""
    if args.prompt is not None:
        return None
    from kvlab.lab.longrun import configured_max_positions, position_warning

    try:
        limit = configured_max_positions(args.model)
    except (OSError, ValueError):  # the load reports it
        return None
    return position_warning(
        "--tokens", args.tokens, limit, "the K/V statistics include positions the model was not trained on"
    )


def _pct(x: float) -> str:
    return "0" if x == 0 else f"{100 * x:.3g} %"


def fp8_legend(report: dict) -> str:
    """What the per-layer table's ``sat / flush`` cells count (:func:`kvlab.eval.inspect._fp8_cell`, from
    :func:`kvlab.quant.fp8.encode`), with each format's largest value."""
    from kvlab.quant.fp8 import format_range

    maxima = " and ".join(f"{format_range(fmt)[0]:g} for {fmt}" for fmt in report["fp8"])
    calibrated = report["settings"]["calibrate_tokens"]
    return (
        f"sat / flush = share of the layer's K and V elements (all its KV heads) that FP8 stores saturated "
        f"(|x / s| above the format's largest value, {maxima}: clamped to it) / flushed to zero (non-zero, stored "
        f"as 0); s = the scale x is divided by before the cast: 1.0 = none (an uncalibrated engine), per-head = one "
        f"per KV head, calibrated on the first {calibrated} prompt tokens (a later token beyond that range "
        f"saturates)"
    )


def _print_tables(report: dict, args: argparse.Namespace) -> None:
    from rich.console import Console

    m, s = report["model"], report["settings"]
    console = Console()
    title = (
        f"K/V of {m['id_or_path']} ({m['dtype']}), {report['tokens']} prompt tokens; outlier channel > "
        f"{s['outlier_factor']:g} x median; FP8 scales calibrated on the first {s['calibrate_tokens']} tokens"
    )
    fp8 = [f"{fmt} s={scale}\nsat / flush" for fmt in report["fp8"] for scale in ("1.0", "per-head")]
    stats = ("layer", "|K| max", "|V| max", "K ch max/median", "K outlier ch", "V ch max/median")
    t = table(title, *stats, "V outlier ch", *fp8)
    for layer in report["layers"]:
        row = [
            str(layer["layer"]),
            f"{layer['key_absmax']:.4g}",
            f"{layer['value_absmax']:.4g}",
            f"{layer['key_channel_ratio_max']:.3g}",
            str(layer["key_outlier_channels"]),
            f"{layer['value_channel_ratio_max']:.3g}",
            str(layer["value_outlier_channels"]),
        ]
        for fmt in report["fp8"]:
            for scale in ("1.0", "per-head"):
                n = len(layer["heads"])
                sat = sum(h["fp8"][fmt][scale]["saturated_fraction"] for h in layer["heads"]) / n
                flush = sum(h["fp8"][fmt][scale]["underflow_fraction"] for h in layer["heads"]) / n
                row.append(f"{_pct(sat)} / {_pct(flush)}")
        t.add_row(*row)
    console.print(t)
    console.print(fp8_legend(report), markup=False)
    summary = table(
        "FP8 over the whole model: share of K/V elements", "format", "scale", "saturated", "flushed to zero"
    )
    for fmt, per in report["fp8"].items():
        for scale, cell in per.items():
            summary.add_row(fmt, scale, _pct(cell["saturated_fraction"]), _pct(cell["underflow_fraction"]))
    console.print(summary)
    _print_attention_kl(console, report)
    for flag, path in (("--json", args.json), ("--figure", args.figure)):
        if path:
            console.print(f"{flag}: wrote {path}")


def _print_attention_kl(console, report: dict) -> None:
    """The FP8 key-side attention KL per layer (worst KV head) and over the model, or why it was not measured."""
    kl = report.get("fp8_key_attention_kl") or {}
    if not kl.get("measured"):
        console.print(f"FP8 key-side attention KL: not measured ({kl.get('note', 'no queries observed')})")
        return
    n = report["settings"]["attention_queries"]
    cols = [(fmt, v) for fmt in ("e4m3", "e5m2") for v in ("per-head", "hadamard") if kl.get(fmt)]
    t = table(
        f"FP8 keys, attention KL: the last {n} queries over the keys before them, exact vs FP8-rounded keys "
        f"(per-head scales; hadamard: rotated first, as fp8-*-hadamard); per layer the worst KV head (hN), every "
        f"head in --json",
        "layer",
        *(f"{fmt} {v}" for fmt, v in cols),
    )

    def fmt_kl(x) -> str:
        return "-" if x is None else f"{x:.2e}"

    heads = 0
    for layer in report["layers"]:
        cells = [
            (h["head"], h["fp8_key_attention_kl"]) for h in layer["heads"] if "fp8_key_attention_kl" in h
        ]
        heads += len(cells)
        row = [str(layer["layer"])]
        for fmt, v in cols:
            values = [(c[fmt][v], head) for head, c in cells if c[fmt][v] is not None]
            worst = max(values, default=None)
            row.append("-" if worst is None else f"{fmt_kl(worst[0])} (h{worst[1]})")
        t.add_row(*row)
    t.add_row(
        f"mean of {heads} heads", *[fmt_kl(kl[fmt][v]["mean"] if kl[fmt][v] else None) for fmt, v in cols]
    )
    console.print(t)
