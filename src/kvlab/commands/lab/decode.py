"""``kvlab lab`` itself: decoding with a KV cache against full recompute, on the mechanics chapter's toy decoder
(tokens, logits, FLOPs, time, append cost) or, with ``--real``, a real model through every exact cache."""

from __future__ import annotations

import argparse

from kvlab.commands import fail, progress, table
from kvlab.commands.lab.common import (
    add_model_flags,
    check_model_flags,
    finish,
    flag_names,
    note,
    print_warnings,
    value_table,
    warn,
)
from kvlab.runtime.checks import int_flag


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``kvlab lab`` parser to ``subparsers`` and return it (its subcommands are added beside)."""
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
        "--kv-heads", type=int_flag(), default=2, help="KV heads of the toy decoder (8 = MHA; default 2, GQA)"
    )
    p.add_argument("--new-tokens", type=int_flag(), default=192, help="tokens generated (default 192)")
    p.add_argument(
        "--repeat",
        type=int_flag(),
        default=1,
        help="timed rounds, both generators per round in a rotated order; the speed-up is the median of the "
        "rounds' paired ratios (default 1)",
    )
    p.add_argument(
        "--threads",
        type=int_flag(),
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
    add_model_flags(p, "--real: ")
    p.add_argument("--tokens", type=int_flag(), default=96, help="--real: sequence length (default 96)")
    p.add_argument("--batch", type=int_flag(), default=1, help="--real: batch rows (default 1)")
    p.add_argument(
        "--allow-past-limit",
        action="store_true",
        help="--real: run a --tokens past the model's max_position_embeddings (refused without it: positions the "
        "model was not trained on, hours of decoding at sizes like 100,000); warned about then",
    )
    p.set_defaults(func=run)
    LAB_DEFAULTS.update({dest: p.get_default(dest) for dest in (*TOY_FLAGS, *REAL_FLAGS)})
    return p


LAB_DEFAULTS: dict = {}  # the `kvlab lab` parser's defaults of TOY_FLAGS and REAL_FLAGS, filled at registration


def run(args: argparse.Namespace) -> int:
    """``kvlab lab`` (the toy decoder, or ``--real``): its exit status; a bad setting or a model that is not there
    (``ValueError``, ``OSError``) exits 2, naming it."""
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
REAL_FLAGS = {
    "model": "--model",
    "dtype": "--dtype",
    "tokens": "--tokens",
    "batch": "--batch",
    "allow_past_limit": "--allow-past-limit",
}
# the toy decoder's library arguments (ToyConfig, measure_append_cost) named in its errors -> what the user typed
TOY_NAMES = {
    "kv_heads": "--kv-heads",
    "new_tokens": "--new-tokens",
    "contexts_tokens": "--append-contexts",
    "threads": "--threads",
    "q_heads": "the toy decoder's query heads",
}


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
    from kvlab.lab.equivalence import check_toy_memory, toy_steps
    from kvlab.runtime.timing import check_threads, default_threads

    try:  # the library names its arguments (`kv_heads`): the user typed flags
        cfg = ToyConfig(kv_heads=args.kv_heads, new_tokens=args.new_tokens)
        check_toy_memory(cfg)  # before the append measurement's seconds
    except ValueError as exc:
        raise ValueError(flag_names(exc, TOY_NAMES)) from None
    if args.repeat < 1:  # checked before any long work starts
        raise ValueError(f"--repeat must be >= 1, got {args.repeat!r}")
    threads = default_threads() if args.threads is None else check_threads(args.threads)
    contexts = () if args.no_append else tuple(args.append_contexts)
    if contexts and any(t < 1 for t in contexts):  # fail in milliseconds, before the toy decoder's seconds
        raise ValueError(f"--append-contexts must be positive token counts, got {' '.join(map(str, contexts))}")
    twice = next((t for i, t in enumerate(contexts) if t in contexts[:i]), None)
    if twice is not None:  # it would be measured twice, as other list flags refuse it
        raise ValueError(f"--append-contexts gives {twice} twice in {' '.join(map(str, contexts))}")
    append = None
    total = len(contexts) + toy_steps(args.repeat)
    with progress(Console(stderr=True), total, "kvlab lab") as bar:
        try:
            if contexts:
                append = measure_append_cost(contexts, threads=threads, progress=bar.start)
            result = run_toy_lab(cfg, repeat=args.repeat, threads=threads, progress=bar.start)
        except ValueError as exc:
            raise ValueError(flag_names(exc, TOY_NAMES)) from None
    if append is not None:
        result["append"] = append
    return finish(args, result, _print_toy)


def _run_real(args: argparse.Namespace) -> int:
    """``kvlab lab --real``: one progress step per load, reference forward and span of decoded tokens; a refusal
    (exit 2) for --tokens past the model's positions (before the load where its files state them; with
    --allow-past-limit a warning) and for a size the available memory cannot hold, both before any decoding; for a
    long check, a ``note:`` line with its wall time estimated from timings taken
    in the run (:func:`kvlab.lab.exactness.estimate_wall_time`)."""
    from rich.console import Console

    from kvlab.lab.exactness import real_check_steps, run_real_check
    from kvlab.models import ModelLoadError

    err = Console(stderr=True)
    try:
        if args.tokens < 1 or args.batch < 1:
            raise ValueError(f"`tokens` and `batch` must be >= 1, got {args.tokens!r} and {args.batch!r}")
        check_model_flags(args)
        _check_positions(args)
        with progress(err, 1 + real_check_steps(args.tokens), "kvlab lab --real") as bar:
            result = run_real_check(
                args.model,
                dtype=args.dtype,
                tokens=args.tokens,
                batch=args.batch,
                progress=bar.start,
                notify=lambda msg: warn(err, flag_names(msg, REAL_FLAGS)),
                note=lambda msg: note(err, msg),  # the wall-time estimate of a long check
                allow_past_limit=args.allow_past_limit,
            )
    except (ValueError, OSError) as exc:  # a damaged model folder as it is (fail() names --model)
        return fail(args, exc if isinstance(exc, ModelLoadError) else flag_names(exc, REAL_FLAGS))
    result["warnings"] = [flag_names(w, REAL_FLAGS) for w in result["warnings"]]
    return finish(args, result, _print_real)


def _check_positions(args: argparse.Namespace) -> None:
    """Refuse --tokens past the model's max_position_embeddings as read from its files, before the load (a large
    model loads for minutes); :func:`kvlab.lab.exactness.run_real_check` checks the loaded config again.

    Raises:
        ValueError: past the limit without --allow-past-limit (:func:`kvlab.lab.longrun.position_refusal`).
    """
    if args.allow_past_limit:
        return
    from kvlab.lab.exactness import PAST_LIMIT
    from kvlab.lab.longrun import configured_max_positions, position_refusal

    limit = configured_max_positions(args.model)
    refusal = position_refusal("--tokens", args.tokens, limit, PAST_LIMIT, "--allow-past-limit")
    if refusal:
        raise ValueError(refusal)


def _print_toy(r: dict) -> None:
    from kvlab.runtime.console import stdout_console

    cfg = r["config"]
    sp = r.get("speedup_paired") or {}
    spread = (
        f" ({sp['min']:.2f}-{sp['max']:.2f}x over {r['repeat']} rounds)" if r.get("repeat", 1) > 1 else ""
    )
    rows = [
        ("[A1] identical tokens", f"{r['same_tokens']} / {r['gen']}"),
        ("[A2] max |cached - full| of last logits", f"{r['max_diff']:.3e}"),
        ("[A2] reference scale (max |logit|)", f"{r['ref_scale']:.6f}"),
        ("[A2] relative error", f"{r['rel_err']:.3e}"),
        ("[A3] FLOPs, full recompute", f"{r['flops_naive']:.4e}"),
        ("[A3] FLOPs, KV cache", f"{r['flops_cached']:.4e}"),
        ("[A3] FLOPs ratio", f"{r['flops_ratio']:.2f}x"),
        ("[A4] wall clock, full recompute", f"{r['t_naive']:.3f} s"),
        ("[A4] wall clock, KV cache", f"{r['t_cached']:.3f} s"),
        ("[A4] speedup, paired median" if spread else "[A4] speedup", f"{r['speedup']:.2f}x{spread}"),
        *([("threads (BLAS)", str(r["threads"]))] if "threads" in r else []),
        ("KV cache bytes (preallocated)", f"{r['kv_cache_bytes']:,} B"),
    ]
    checks = value_table(
        f"Toy decoder: {cfg['n_layers']} layers, {cfg['q_heads']} q heads / {cfg['kv_heads']} KV "
        f"heads, head_dim {cfg['head_dim']}, {cfg['prompt_tokens']} prompt + {r['gen']} new tokens, fp32",
        "check",
        rows,
    )
    console = stdout_console()
    console.print(checks)
    if "append" in r:
        a = r["append"]
        shape = a["shape"]
        t2 = table(
            f"Append one token's K and V to a cache of T tokens (batch {shape['batch']}, "
            f"{shape['kv_heads']} KV heads, head_dim {shape['head_dim']}, {a['dtype']}), "
            f"median of {a['steps']} steps",
            *("context T", "torch.cat (us)", "in place (us)", "cat / in place", "cat writes (MiB)"),
        )
        # the paired median of same-step ratios where recorded (older results: ratio of the medians)
        ratios = a.get("cat_over_inplace") or [c / i for c, i in zip(a["cat_us"], a["inplace_us"])]
        rows = zip(a["contexts_tokens"], a["cat_us"], a["inplace_us"], ratios, a["cat_bytes_copied"])
        for t, c, i, q, b in rows:
            t2.add_row(str(t), f"{c:.1f}", f"{i:.1f}", f"{q:.1f}x", f"{b / 2**20:.2f}")
        console.print(t2)
    for warning in r.get("warnings", []) + r.get("append", {}).get("warnings", []):
        console.print(f"[bold yellow]warning:[/] {warning}", highlight=False)


def _print_real(r: dict) -> None:
    from kvlab.runtime.console import stdout_console

    t = table(
        f"Exact caches on {r.get('model', 'model')}: {r['batch']} x {r['tokens']} tokens, "
        f"prefill {r['prefill_tokens']}, {r['dtype']}, pass if rel err <= {r['rel_tolerance']:.0e}",
        labels=("cache", "status", "max abs err", "rel err", "argmax agreement", "vs DynamicCache", "passed"),
    )
    for row in r["rows"]:
        if row["status"] == "ok":
            vs = row.get("max_abs_diff_vs_dynamic")
            t.add_row(
                row["cache"],
                "ok",
                f"{row['max_abs_err']:.3e}",
                f"{row['rel_err']:.3e}",
                f"{row['argmax_agreement']:.3f}",
                "-" if vs is None else f"{vs:.3e}",
                str(row["passed"]),
            )
        else:
            t.add_row(row["cache"], row["status"], "-", "-", "-", "-", row.get("error", ""))
    console = stdout_console()
    console.print(t)
    print_warnings(console, r.get("warnings", []))
