"""``kvlab lab``: the mechanics chapter's toy decoder (cached vs full recompute, FLOPs, append cost) or ``--real``: a real
model decoded through every exact cache; ``kvlab lab video``: the autoregressive video KV cache lab (a toy
block-causal denoiser, cached vs full recompute, eviction, negative controls). Logic lives in :mod:`kvlab.lab`."""

from __future__ import annotations

import argparse
import json

from kvlab.commands import fail, progress


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "lab",
        help="toy decoder: KV-cached decoding vs full recompute; --real: exact caches on a model",
        description="Run a small random toy decoder twice (full recompute, KV cache), check the tokens and logits "
        "agree, count the FLOPs, time both, and time a growing torch.cat cache against a preallocated one. "
        "With --real, decode a real model through each cache that must be exact and compare with one full "
        "forward.",
    )
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument(
        "--kv-heads", type=int, default=2, help="KV heads of the toy decoder (8 = MHA; default 2, GQA)"
    )
    p.add_argument("--new-tokens", type=int, default=192, help="tokens generated (default 192)")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="timed rounds, both generators per round in a rotated order; the speed-up is the median of the "
        "rounds' paired ratios (default 1)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="BLAS/torch threads of the timed work (default: OMP_NUM_THREADS, else usable CPUs minus one; "
        "recorded in the result)",
    )
    p.add_argument("--no-append", action="store_true", help="skip the append-cost measurement")
    p.add_argument(
        "--append-contexts",
        type=int,
        nargs="+",
        default=[256, 512, 1024, 2048, 4096, 8192],
        metavar="T",
        help="context lengths of the append-cost measurement",
    )
    p.add_argument("--real", action="store_true", help="check exact caches on a real model instead")
    p.add_argument(
        "--model",
        default=None,
        help="--real: local dir, GGUF file, named model (kvlab models) or HF id (default: the bundled model)",
    )
    p.add_argument("--dtype", default="float32", help="--real: model dtype (default float32)")
    p.add_argument("--tokens", type=int, default=96, help="--real: sequence length (default 96)")
    p.add_argument("--batch", type=int, default=1, help="--real: batch rows (default 1)")
    p.set_defaults(func=run)
    LAB_DEFAULTS.update({dest: p.get_default(dest) for dest in (*TOY_FLAGS, *REAL_FLAGS)})
    sub = p.add_subparsers(dest="lab_command", metavar="{video,eviction}", parser_class=_VideoParser)
    _register_video(sub)
    _register_eviction(sub)


LAB_DEFAULTS: dict = {}  # the `kvlab lab` parser's defaults of TOY_FLAGS and REAL_FLAGS, filled at registration

VIDEO_FIELD_PREFIX = "video_"  # argparse dest of a `kvlab lab video` flag = prefix + VideoConfig field


class _VideoParser(argparse.ArgumentParser):
    """``kvlab lab video``'s parser: its help shows :class:`~kvlab.lab.video_model.VideoConfig`'s defaults, read
    only when the help is printed (that import brings numpy, which every kvlab command would pay at start-up)."""

    def format_help(self) -> str:
        from kvlab.lab.video_model import VideoConfig

        defaults = VideoConfig()
        for action in self._actions:
            field = action.dest.removeprefix(VIDEO_FIELD_PREFIX)
            if action.dest != field and action.help and "(default" not in action.help:
                action.help += f" (default {getattr(defaults, field)})"
        return super().format_help()


# `kvlab lab video` flag, VideoConfig field it sets, help text
VIDEO_FLAGS = (
    ("--frames", "frames", "latent frames generated"),
    ("--height", "height", "latent tokens per frame, vertically"),
    ("--width", "width", "latent tokens per frame, horizontally"),
    ("--channels", "channels", "latent values per token"),
    ("--steps", "steps", "denoising steps per frame"),
    ("--layers", "n_layers", "transformer layers"),
    ("--q-heads", "q_heads", "query heads"),
    ("--kv-heads", "kv_heads", "K/V heads"),
    ("--head-dim", "head_dim", "channels per head (split between the t, h, w rotary axes)"),
    ("--window", "window_frames", "recent frames kept besides the sink frame when evicting"),
    ("--seed", "weight_seed", "random seed of the weights"),
    ("--noise-seed", "noise_seed", "random seed of the noise"),
)


def _video_flags(exc: ValueError) -> str:
    """The error with each config field named by the flag the user gave (`n_layers` -> --layers)."""
    message = str(exc)
    for flag, field, _ in VIDEO_FLAGS:
        message = message.replace(f"`{field}`", flag)
    return message


def _register_video(subparsers) -> None:
    v = subparsers.add_parser(
        "video",
        help="autoregressive video: a frame KV cache across denoising steps vs full recompute",
        description="Generate a short latent video with a toy block-autoregressive denoiser (bidirectional "
        "inside a frame, causal across frames, 3D RoPE from (t, h, w) coordinates, a few denoising steps per "
        "frame) by full recompute and with a frame KV cache; check they agree to fp32 rounding, that a cache "
        "keeping a sink frame and a window of recent frames equals recompute under the same visibility, that "
        "three known mistakes do not, and account FLOPs and KV bytes (bytes tied to `kvlab video`).",
    )
    # --json may also come before `video` (`kvlab lab --json video`): SUPPRESS keeps the parent's value
    v.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print machine-readable JSON"
    )
    for flag, field, text in VIDEO_FLAGS:
        # not given: the field keeps VideoConfig's default
        v.add_argument(
            flag, dest=VIDEO_FIELD_PREFIX + field, type=int, default=argparse.SUPPRESS, metavar="N", help=text
        )
    v.set_defaults(func=run_video)


def run_video(args: argparse.Namespace) -> int:
    """``kvlab lab video``: exit 0 when every check passes, 1 when one fails, 2 on bad settings."""
    from dataclasses import fields

    from kvlab.lab.video import check_lab_config, run_video_lab
    from kvlab.lab.video_model import VideoConfig

    try:
        cfg = VideoConfig(
            **{
                f.name: getattr(args, VIDEO_FIELD_PREFIX + f.name)
                for f in fields(VideoConfig)
                if hasattr(args, VIDEO_FIELD_PREFIX + f.name)
            }
        )
        check_lab_config(cfg)
    except ValueError as exc:
        return fail(args, _video_flags(exc))
    try:
        with _status("toy video denoiser: full recompute, frame KV cache, eviction, controls ...", args.json):
            result = run_video_lab(cfg)
    except ValueError as exc:
        return fail(args, _video_flags(exc))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print_video(result)
    return 0 if result["all_passed"] else 1


def _status(message: str, quiet: bool):
    """A spinner on stderr while long work runs on a terminal; off a terminal (logs, CI) one plain line saying what
    runs, since a spinner there prints nothing; nothing with --json."""
    import contextlib

    if quiet:
        return contextlib.nullcontext()
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        console.print(message, markup=False, highlight=False)
        return contextlib.nullcontext()
    return console.status(message)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (ValueError, OSError) as exc:  # bad settings, a model that is not there
        return fail(args, exc)


# flags of one mode of `kvlab lab` (dest -> flag): given to the other mode they were silently ignored
TOY_FLAGS = {
    "kv_heads": "--kv-heads",
    "new_tokens": "--new-tokens",
    "repeat": "--repeat",
    "threads": "--threads",
    "no_append": "--no-append",
    "append_contexts": "--append-contexts",
}
REAL_FLAGS = {"model": "--model", "dtype": "--dtype", "tokens": "--tokens", "batch": "--batch"}


def _ignored_flags(args: argparse.Namespace, parser_defaults: dict) -> str | None:
    """Why a flag would be ignored (``None`` when none would): one of the other mode's flags changed from its
    default, or --append-contexts with --no-append."""
    other = TOY_FLAGS if args.real else REAL_FLAGS
    given = [flag for dest, flag in other.items() if getattr(args, dest) != parser_defaults.get(dest)]
    if given:
        mode = "--real (a real model's exact caches)" if args.real else "the toy decoder (no --real)"
        return f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to {mode}"
    if args.no_append and args.append_contexts != parser_defaults.get("append_contexts"):
        return "--append-contexts sets the append-cost measurement, which --no-append skips"
    return None


def _run(args: argparse.Namespace) -> int:
    problem = _ignored_flags(args, LAB_DEFAULTS)
    if problem:
        raise ValueError(problem)
    if args.real:
        return _run_real(args)

    from rich.console import Console

    from kvlab.lab import ToyConfig, run_toy_lab
    from kvlab.lab.append import measure_append_cost
    from kvlab.lab.equivalence import toy_steps
    from kvlab.runtime.timing import default_threads

    cfg = ToyConfig(kv_heads=args.kv_heads, new_tokens=args.new_tokens)
    if args.repeat < 1:  # checked before any long work starts
        raise ValueError(f"`repeat` must be >= 1, got {args.repeat!r}")
    threads = default_threads() if args.threads is None else args.threads
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads!r}")
    contexts = () if args.no_append else tuple(args.append_contexts)
    if contexts and any(t < 1 for t in contexts):  # fail in milliseconds, before the toy decoder's seconds
        raise ValueError(f"`contexts_tokens` must be positive token counts, got {contexts!r}")
    append = None
    total = len(contexts) + toy_steps(args.repeat)
    with progress(Console(stderr=True), total, "kvlab lab") as bar:
        if contexts:
            append = measure_append_cost(contexts, threads=threads, progress=bar.start)
        result = run_toy_lab(cfg, repeat=args.repeat, threads=threads, progress=bar.start)
    if append is not None:
        result["append"] = append
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print_toy(result)
    return 0 if result["all_passed"] else 1


def _flags(message: object, flags: dict[str, str]) -> str:
    """``message`` with each library argument (`` `tokens` ``) named by the flag the user typed (``--tokens``)."""
    text = str(message)
    for field, flag in flags.items():
        text = text.replace(f"`{field}`", flag)
    return text


def _warn(console, message: str) -> None:
    """One ``warning: ...`` line on ``console`` (stderr), printed as it comes, before the work it is about."""
    console.print(f"warning: {message}", style="yellow", markup=False, highlight=False, soft_wrap=True)


def _check_model_flags(args: argparse.Namespace) -> None:
    """Refuse a bad --dtype or --model before the first progress line (the library names them `dtype`, its path).

    Raises:
        ValueError / OSError: as :func:`kvlab.models.parse_dtype` and :func:`kvlab.models.check_local_model`.
    """
    from kvlab.models import check_local_model, parse_dtype

    parse_dtype(args.dtype)
    check_local_model(args.model)


def _run_real(args: argparse.Namespace) -> int:
    """``kvlab lab --real``: one progress step per load, reference forward and span of decoded tokens; a warning
    for --tokens past the model's positions and a refusal (exit 2) for a size the available memory cannot hold,
    both before any decoding."""
    from rich.console import Console

    from kvlab.lab.exactness import check_steps, run_real_check

    err = Console(stderr=True)
    try:
        if args.tokens < 1 or args.batch < 1:
            raise ValueError(f"`tokens` and `batch` must be >= 1, got {args.tokens!r} and {args.batch!r}")
        _check_model_flags(args)
        with progress(err, 1 + check_steps(args.tokens), "kvlab lab --real") as bar:
            result = run_real_check(
                args.model,
                dtype=args.dtype,
                tokens=args.tokens,
                batch=args.batch,
                progress=bar.start,
                notify=lambda msg: _warn(err, _flags(msg, REAL_FLAGS)),
            )
    except (ValueError, OSError) as exc:
        return fail(args, _flags(exc, REAL_FLAGS))
    result["warnings"] = [_flags(w, REAL_FLAGS) for w in result["warnings"]]
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print_real(result)
    return 0 if result["all_passed"] else 1


def _print_toy(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = r["config"]
    table = Table(
        title=f"Toy decoder: {cfg['n_layers']} layers, {cfg['q_heads']} q heads / {cfg['kv_heads']} KV "
        f"heads, head_dim {cfg['head_dim']}, {cfg['prompt_tokens']} prompt + {r['gen']} new tokens, fp32"
    )
    table.add_column("check")
    table.add_column("value", justify="right")
    table.add_row("[A1] identical tokens", f"{r['same_tokens']} / {r['gen']}")
    table.add_row("[A2] max |cached - full| of last logits", f"{r['max_diff']:.3e}")
    table.add_row("[A2] reference scale (max |logit|)", f"{r['ref_scale']:.6f}")
    table.add_row("[A2] relative error", f"{r['rel_err']:.3e}")
    table.add_row("[A3] FLOPs, full recompute", f"{r['flops_naive']:.4e}")
    table.add_row("[A3] FLOPs, KV cache", f"{r['flops_cached']:.4e}")
    table.add_row("[A3] FLOPs ratio", f"{r['flops_ratio']:.2f}x")
    table.add_row("[A4] wall clock, full recompute", f"{r['t_naive']:.3f} s")
    table.add_row("[A4] wall clock, KV cache", f"{r['t_cached']:.3f} s")
    sp = r.get("speedup_paired") or {}
    spread = (
        f" ({sp['min']:.2f}-{sp['max']:.2f}x over {r['repeat']} rounds)" if r.get("repeat", 1) > 1 else ""
    )
    table.add_row("[A4] speedup, paired median" if spread else "[A4] speedup", f"{r['speedup']:.2f}x{spread}")
    if "threads" in r:
        table.add_row("threads (BLAS)", str(r["threads"]))
    table.add_row("KV cache bytes (preallocated)", f"{r['kv_cache_bytes']:,} B")
    console = Console()
    console.print(table)
    if "append" in r:
        a = r["append"]
        shape = a["shape"]
        t2 = Table(
            title=f"Append one token's K and V to a cache of T tokens (batch {shape['batch']}, "
            f"{shape['kv_heads']} KV heads, head_dim {shape['head_dim']}, {a['dtype']}), "
            f"median of {a['steps']} steps"
        )
        for col in ("context T", "torch.cat (us)", "in place (us)", "cat / in place", "cat writes (MiB)"):
            t2.add_column(col, justify="right")
        # the paired median of same-step ratios where recorded (older results: ratio of the medians)
        ratios = a.get("cat_over_inplace") or [c / i for c, i in zip(a["cat_us"], a["inplace_us"])]
        rows = zip(a["contexts_tokens"], a["cat_us"], a["inplace_us"], ratios, a["cat_bytes_copied"])
        for t, c, i, q, b in rows:
            t2.add_row(str(t), f"{c:.1f}", f"{i:.1f}", f"{q:.1f}x", f"{b / 2**20:.2f}")
        console.print(t2)
    for warning in r.get("warnings", []) + r.get("append", {}).get("warnings", []):
        console.print(f"[bold yellow]warning:[/] {warning}", highlight=False)


def _print_real(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Exact caches on {r.get('model', 'model')}: {r['batch']} x {r['tokens']} tokens, "
        f"prefill {r['prefill_tokens']}, {r['dtype']}, pass if rel err <= {r['rel_tolerance']:.0e}"
    )
    for col in ("cache", "status", "max abs err", "rel err", "argmax agreement", "vs DynamicCache", "passed"):
        table.add_column(col)
    for row in r["rows"]:
        if row["status"] == "ok":
            vs = row.get("max_abs_diff_vs_dynamic")
            table.add_row(
                row["cache"],
                "ok",
                f"{row['max_abs_err']:.3e}",
                f"{row['rel_err']:.3e}",
                f"{row['argmax_agreement']:.3f}",
                "-" if vs is None else f"{vs:.3e}",
                str(row["passed"]),
            )
        else:
            table.add_row(row["cache"], row["status"], "-", "-", "-", "-", row.get("error", ""))
    console = Console()
    console.print(table)
    for warning in r.get("warnings", []):
        console.print(f"warning: {warning}", style="yellow", markup=False, highlight=False)


def _print_video(r: dict) -> None:
    from rich.console import Console

    console = Console()
    console.print(_video_checks_table(r))
    console.print(_video_cost_table(r))
    failed = [name for name, ok in r["checks"].items() if not ok]
    console.print("all checks passed" if not failed else f"FAILED: {', '.join(failed)}")


def _video_checks_table(r: dict):
    """The video lab's exactness checks and controls, each with its relative error and the bound it meets."""
    from rich.table import Table

    cfg, tol = r["config"], r["tolerance"]
    t1 = Table(
        title=f"Toy video denoiser: {cfg['frames']} frames of {cfg['height']}x{cfg['width']} tokens, "
        f"{cfg['steps']} denoising steps, {cfg['n_layers']} layers, {cfg['q_heads']} q / {cfg['kv_heads']} KV "
        f"heads, head_dim {cfg['head_dim']}, fp32; window = sink + {cfg['window_frames']} frames"
    )
    for col in ("run", "compared with", "rel err", "expected", "ok"):
        t1.add_column(col, justify="right" if col == "rel err" else "left")
    checks = r["checks"]
    t1.add_row(
        "frame KV cache",
        "full recompute",
        f"{r['cached_vs_full']['rel_err']:.2e}",
        f"<= {tol:.0e}",
        str(checks["cached_equals_full_recompute"]),
    )
    t1.add_row(
        "evicting cache (sink + window)",
        "recompute, sink + window mask",
        f"{r['evicting_vs_windowed']['rel_err']:.2e}",
        f"<= {tol:.0e}",
        str(checks["evicting_equals_windowed_recompute"]),
    )
    t1.add_row(
        "positions from cache length, no eviction",
        "full recompute",
        f"{r['positions_from_length_without_eviction']:.2e}",
        f"<= {tol:.0e}",
        str(checks["positions_from_length_harmless_without_eviction"]),
    )
    bound = r["control_factor"] * tol
    for c in r["controls"]:
        t1.add_row(
            f"control: {c['mistake']}",
            c["reference"].replace("_", " "),
            f"{c['rel_err']:.2e}",
            f">= {bound:.0e}",
            str(c["failed_as_expected"]),
        )
    ctx = r["context"]
    t1.add_row(
        "for scale: eviction itself", "full recompute", f"{ctx['windowed_vs_full_rel_diff']:.2e}", "-", "-"
    )
    t1.add_row(
        "for scale: kept frames re-encoded",
        "evicting cache",
        f"{ctx['reencode_vs_evicting_rel_diff']:.2e}",
        "-",
        "-",
    )
    return t1


def _video_cost_table(r: dict):
    """The video lab's counted matmul FLOPs (full recompute, cache, evicting cache) and KV bytes."""
    from rich.table import Table

    checks = r["checks"]
    f = r["flops"]
    t2 = Table(
        title="Matmul FLOPs, counted in the run (formula agrees: "
        f"{checks['flops_counted_equal_formula']}) and KV bytes (fp32)"
    )
    t2.add_column("quantity")
    t2.add_column("value", justify="right")
    t2.add_row("full recompute", f"{f['full_recompute']:.4e}")
    t2.add_row("frame KV cache", f"{f['cached']:.4e}")
    t2.add_row("full recompute / cache", f"{f['ratio_full_over_cached']:.2f}x")
    t2.add_row("evicting cache", f"{f['evicting']:.4e}")
    t2.add_row(
        "KV bytes per frame (lab / kvlab video)",
        f"{r['kv_bytes_per_frame']:,} / {r['ledger']['kv_bytes_first_latent_frame']:,} B",
    )
    full_b, evict_b = r["kv_bytes_after_frame"]["full_history"], r["kv_bytes_after_frame"]["evicting"]
    t2.add_row(
        f"KV bytes after {len(full_b)} frames, every frame kept (lab / kvlab video)",
        f"{full_b[-1]:,} / {r['ledger']['kv_bytes']:,} B",
    )
    t2.add_row(
        f"KV bytes after {len(evict_b)} frames, sink + window (peak)", f"{evict_b[-1]:,} B ({max(evict_b):,})"
    )
    t2.add_row(
        "frames held / logical time of the next frame", f"{r['cache_frame_t']} / {r['cache_next_frame_t']}"
    )
    t2.add_row("wall clock, whole lab", f"{r['wall_s']:.2f} s")
    return t2


def _register_eviction(subparsers) -> None:
    e = subparsers.add_parser(
        "eviction",
        help="attention sinks + window (StreamingLLM) vs recomputing the window, on held-out text",
        description="Score held-out text of the bundled model (or --model) three ways: every token predicted from "
        "the last W tokens recomputed from scratch (the baseline), a SinkCache keeping the first S tokens and "
        "the newest W (one run per --sinks value; 0 = window attention), and the full context for scale. "
        "Reports mean NLL, the ratio to the baseline, and each cache's bytes (flat once full). Logic in "
        "kvlab.lab.eviction.",
    )
    e.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print machine-readable JSON"
    )
    e.add_argument(
        "--model",
        default=None,
        help="local dir, GGUF file, named model (kvlab models) or HF id (default: the bundled model)",
    )
    e.add_argument("--dtype", default="float32", help="model dtype (default float32)")
    e.add_argument("--tokens", type=int, default=2048, help="held-out tokens scored (default 2048)")
    e.add_argument("--window", type=int, default=256, help="W: newest tokens kept (default 256)")
    e.add_argument(
        "--sinks", type=int, nargs="+", default=[4, 0], metavar="S", help="sink counts (default 4 0)"
    )
    e.add_argument("--offset", type=int, default=0, help="first held-out token (default 0)")
    e.set_defaults(func=run_eviction)


# EvictionConfig field -> its `kvlab lab eviction` flag
EVICTION_FLAGS = {
    "tokens": "--tokens",
    "window_length": "--window",
    "sink_tokens": "--sinks",
    "offset": "--offset",
    "n_tokens": "--tokens",  # kvlab.models.heldout_token_ids
    "dtype": "--dtype",
}


def run_eviction(args: argparse.Namespace) -> int:
    """``kvlab lab eviction``: exit 0 when runs with sinks are within 5 % of the baseline, 1 if not, 2 on bad input.

    One progress step per model load, full-context forward and span of scored windows or streamed tokens on
    stderr; --tokens past the model's max_position_embeddings is warned about there before the first forward."""
    from rich.console import Console

    from kvlab.lab.eviction import EvictionConfig, eviction_steps, measure_eviction
    from kvlab.lab.longrun import max_positions, model_label, position_warning
    from kvlab.models import load_model

    err = Console(stderr=True)
    try:
        cfg = EvictionConfig(
            tokens=args.tokens, window_length=args.window, sink_tokens=tuple(args.sinks), offset=args.offset
        )
        _check_model_flags(args)
        with progress(err, 1 + eviction_steps(cfg), "kvlab lab eviction") as bar:
            bar.start(f"loading {model_label(args.model)} in {args.dtype}")
            model, tokenizer = load_model(args.model, dtype=args.dtype)
            warning = position_warning(
                "--tokens",
                cfg.tokens,
                max_positions(model.config),
                "the full-context row scores positions the model was not trained on (the recompute baseline "
                "and the sink caches use at most --window + the largest --sinks positions)",
            )
            if warning:
                _warn(err, warning)
            result = measure_eviction(model, tokenizer, cfg, progress=bar.start)
    except (ValueError, OSError) as exc:
        return fail(args, _flags(exc, EVICTION_FLAGS))
    result["warnings"] = [warning] if warning else []
    if getattr(args, "json", False):
        print(json.dumps(result, indent=1))
    else:
        _print_eviction(result)
    return 0 if result["all_passed"] else 1


def _print_eviction(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = r["config"]
    table = Table(
        title=f"Eviction on {cfg['tokens']} held-out tokens, window W = {cfg['window_length']}, {r['dtype']}; "
        f"NLL (nats) over all predictions and over the {r['recompute_window']['predictions_after_window']} "
        f"from token {r['evict_from_token']} on"
    )
    for col in ("method", "NLL", "NLL after window", "ppl after window", "vs recompute", "cache bytes"):
        table.add_column(col, justify="left" if col == "method" else "right")
    base = r["recompute_window"]["nll_after_window"]
    full = r["full_context"]
    table.add_row(
        "full context (DynamicCache)",
        f"{full['nll']:.4f}",
        f"{full['nll_after_window']:.4f}",
        f"{full['perplexity_after_window']:.2f}",
        f"{full['nll_after_window'] / base:.3f}",
        f"{r['dynamic_nbytes']:,}",
    )
    rc = r["recompute_window"]
    row = (f"{rc['nll']:.4f}", f"{rc['nll_after_window']:.4f}", f"{rc['perplexity_after_window']:.2f}")
    table.add_row(f"recompute last {cfg['window_length']} (baseline)", *row, "1.000", "-")
    for s in r["sink"]:
        table.add_row(
            f"SinkCache {s['sink_tokens']} sinks + {cfg['window_length']}",
            f"{s['nll']:.4f}",
            f"{s['nll_after_window']:.4f}",
            f"{s['perplexity_after_window']:.2f}",
            f"{s['nll_ratio_vs_recompute']:.3f}",
            f"{s['nbytes']:,} (max {s['nbytes_max']:,})",
        )
    console = Console()
    console.print(table)
    failed = [name for name, ok in r["checks"].items() if not ok]
    console.print("all checks passed" if not failed else f"FAILED: {', '.join(failed)}")
    for warning in r.get("warnings", []):
        console.print(f"warning: {warning}", style="yellow", markup=False, highlight=False)
