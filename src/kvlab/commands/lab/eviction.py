"""``kvlab lab eviction``: attention sinks + a window (StreamingLLM) against recomputing the window, on held-out
text: its flags, its run and its table."""

from __future__ import annotations

import argparse

from kvlab.commands import fail, progress, table
from kvlab.commands.lab.common import (
    add_model_flags,
    check_model_flags,
    finish,
    flag_names,
    print_verdict,
    print_warnings,
    warn,
)
from kvlab.runtime.checks import int_flag


def register(subparsers) -> None:
    """Add ``kvlab lab eviction`` (model, tokens, window, sinks and offset; run by :func:`run_eviction`) to
    ``subparsers``."""
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
    add_model_flags(e)
    e.add_argument("--tokens", type=int_flag(), default=2048, help="held-out tokens scored (default 2048)")
    e.add_argument("--window", type=int_flag(), default=256, help="W: newest tokens kept (default 256)")
    e.add_argument(
        "--sinks", type=int, nargs="+", default=[4, 0], metavar="S", help="sink counts (default 4 0)"
    )
    e.add_argument("--offset", type=int_flag(), default=0, help="first held-out token (default 0)")
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
        check_model_flags(args)
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
                warn(err, warning)
            result = measure_eviction(model, tokenizer, cfg, progress=bar.start)
    except (ValueError, OSError) as exc:
        return fail(args, flag_names(exc, EVICTION_FLAGS))
    result["warnings"] = [warning] if warning else []
    return finish(args, result, _print_eviction)


def _print_eviction(r: dict) -> None:
    from kvlab.runtime.console import stdout_console

    cfg = r["config"]
    t = table(
        f"Eviction on {cfg['tokens']} held-out tokens, window W = {cfg['window_length']}, {r['dtype']}; "
        f"NLL (nats) over all predictions and over the {r['recompute_window']['predictions_after_window']} "
        f"from token {r['evict_from_token']} on",
        *("NLL", "NLL after window", "ppl after window", "vs recompute", "cache bytes"),
        labels=("method",),
    )
    base = r["recompute_window"]["nll_after_window"]
    full = r["full_context"]
    t.add_row(
        "full context (DynamicCache)",
        f"{full['nll']:.4f}",
        f"{full['nll_after_window']:.4f}",
        f"{full['perplexity_after_window']:.2f}",
        f"{full['nll_after_window'] / base:.3f}",
        f"{r['dynamic_nbytes']:,}",
    )
    rc = r["recompute_window"]
    row = (f"{rc['nll']:.4f}", f"{rc['nll_after_window']:.4f}", f"{rc['perplexity_after_window']:.2f}")
    t.add_row(f"recompute last {cfg['window_length']} (baseline)", *row, "1.000", "-")
    for s in r["sink"]:
        t.add_row(
            f"SinkCache {s['sink_tokens']} sinks + {cfg['window_length']}",
            f"{s['nll']:.4f}",
            f"{s['nll_after_window']:.4f}",
            f"{s['perplexity_after_window']:.2f}",
            f"{s['nll_ratio_vs_recompute']:.3f}",
            f"{s['nbytes']:,} (max {s['nbytes_max']:,})",
        )
    console = stdout_console()
    console.print(t)
    print_verdict(console, r["checks"])
    print_warnings(console, r.get("warnings", []))
