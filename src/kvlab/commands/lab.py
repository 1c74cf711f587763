"""``kvlab lab``: the seed's toy decoder (cached vs full recompute, FLOPs, append cost) or ``--real``: a real
model decoded through every exact cache. Logic lives in :mod:`kvlab.lab`."""

from __future__ import annotations

import argparse
import json
import sys


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
    p.add_argument("--repeat", type=int, default=1, help="timed runs of each generator; the fastest counts")
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
    p.add_argument("--model", default=None, help="--real: HF id or local dir (default: the bundled model)")
    p.add_argument("--dtype", default="float32", help="--real: model dtype (default float32)")
    p.add_argument("--tokens", type=int, default=96, help="--real: sequence length (default 96)")
    p.add_argument("--batch", type=int, default=1, help="--real: batch rows (default 1)")
    p.set_defaults(func=run)


def _status(message: str, quiet: bool):
    """A spinner on stderr while long work runs (none with --json)."""
    import contextlib

    if quiet:
        return contextlib.nullcontext()
    from rich.console import Console

    return Console(stderr=True).status(message)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (ValueError, OSError) as exc:  # bad settings, a model that is not there
        print(f"kvlab lab: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.real:
        from kvlab.lab.exactness import run_real_check

        with _status("decoding the model through each exact cache ...", args.json):
            result = run_real_check(args.model, dtype=args.dtype, tokens=args.tokens, batch=args.batch)
        if args.json:
            print(json.dumps(result, indent=1))
        else:
            _print_real(result)
        return 0 if result["all_passed"] else 1

    from kvlab.lab import ToyConfig, run_toy_lab

    cfg = ToyConfig(kv_heads=args.kv_heads, new_tokens=args.new_tokens)
    if args.repeat < 1:  # checked before any long work starts
        raise ValueError(f"`repeat` must be >= 1, got {args.repeat!r}")
    append = None
    if not args.no_append:  # first: its settings fail in milliseconds, the toy decoder takes seconds
        from kvlab.lab.append import measure_append_cost

        with _status("append cost: torch.cat vs preallocated ...", args.json):
            append = measure_append_cost(tuple(args.append_contexts))
    with _status("toy decoder: full recompute and KV cache ...", args.json):
        result = run_toy_lab(cfg, repeat=args.repeat)
    if append is not None:
        result["append"] = append
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print_toy(result)
    ok = result["same_tokens"] == result["gen"] and result["rel_err"] <= 1e-5
    return 0 if ok else 1


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
    table.add_row("[A4] speedup", f"{r['speedup']:.2f}x")
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
        for t, c, i, b in zip(a["contexts_tokens"], a["cat_us"], a["inplace_us"], a["cat_bytes_copied"]):
            t2.add_row(str(t), f"{c:.1f}", f"{i:.1f}", f"{c / i:.1f}x", f"{b / 2**20:.2f}")
        console.print(t2)


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
    Console().print(table)
