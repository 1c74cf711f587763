"""``kvlab roofline``: ridge point, decode/prefill intensity and decode step bound (the report from
:func:`kvlab.plan.report.roofline_report`; ``--probe`` measures this machine)."""

from __future__ import annotations

import argparse

from kvlab.commands import fail, flag_values
from kvlab.commands.plan import flags
from kvlab.commands.plan.render import print_lists, print_roofline
from kvlab.plan.scenario import DEFAULT_MODEL
from kvlab.runtime.checks import int_flag


def register(subparsers) -> None:
    """Add ``kvlab roofline`` (model, sequence, KV, weight and device flags, ``--probe``; run by
    :func:`run_roofline`) to ``subparsers``."""
    r = subparsers.add_parser(
        "roofline",
        help="ridge point, decode/prefill intensity and decode step bound; --probe measures this machine",
        description="Roofline of decode and prefill: the GPU's ridge point (peak FLOP/s over memory bandwidth, "
        "from its datasheet), the ideal decode attention intensity I = 2g/p (g query heads per KV head, p bytes "
        "per KV element), a rough prefill intensity (projection and causal attention FLOPs over the weights "
        "and an activation-traffic estimate), and the decode step lower bound (weights + batch x KV) / "
        "bandwidth, the floor under TPOT (time per output token). --probe measures fp32 matmul FLOP/s and "
        "streaming GB/s here with numpy.",
    )
    r.add_argument(
        "--model",
        default=None,
        help=f"preset, config.json, .gguf file, directory or hub id (default {DEFAULT_MODEL})",
    )
    flags.add_sequence_flags(r, unset_context=True)  # None: the model's limit where below 8192
    r.add_argument("--tp", type=int_flag(), default=1, help="tensor-parallel GPUs (default 1)")
    flags.add_kv_flags(r)
    flags.add_keep_flag(r)
    flags.add_weight_flags(r)
    flags.add_device_flags(r)
    r.add_argument("--probe", action="store_true", help="measure this machine's fp32 roofs (a few seconds)")
    r.add_argument("--json", action="store_true", help="print machine-readable JSON")
    r.set_defaults(func=run_roofline)
    flags.record_defaults(r)


def run_roofline(args: argparse.Namespace) -> int:
    """``kvlab roofline``: the GPU list, or the roofline report of ``--model`` (tables or ``--json``). Exit 2 for
    ``--list-gpus`` given ``--model`` or another flag, or a setting or model file the planner refuses (named by its
    flag)."""
    from kvlab.plan.report import roofline_report

    if args.list_gpus and args.model is not None:  # the table would silently ignore --model
        return fail(args, f"--list-gpus prints a table and exits; it takes no --model, got {args.model!r}")
    problem = args.list_gpus and flags.ignored_by_listing(args, "--list-gpus")
    if problem:  # --probe beside --list-gpus was silently ignored
        return fail(args, problem)
    if print_lists(args):
        return 0
    args.model = DEFAULT_MODEL if args.model is None else args.model  # '' is refused, not the default
    problem = flags.device_flag_problem(args)
    if problem:
        return fail(args, problem)

    def build() -> dict:  # the flags are read inside: a refused value is reported as the planner's errors are
        return roofline_report(
            **flag_values(args, "model", "context", "batch", "tp"),
            run_probe=args.probe,
            **flags.kv_kwargs(args),
            **flags.weight_kwargs(args),
            **flags.device_kwargs(args),
        )

    return flags.report(args, build, print_roofline)
