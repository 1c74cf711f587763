"""``kvlab paging``: static capacity (docs/paging.md), dynamic serving simulation, and the paged-layout figure.

Logic lives in :mod:`kvlab.paging`; this module parses arguments and prints.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from kvlab.commands import (
    EXIT_FILE_EXISTS,
    add_command_group,
    empty_path_flag,
    fail,
    file_exists_message,
    progress,
    suffix_problem,
    table,
)
from kvlab.commands.paging.checks import (
    check_block_size,
    check_fits,
    check_keep_evicts,
    check_requests_memory,
    check_workload_max_len,
    paging_int,
    replaced_flags_problem,
)
from kvlab.commands.paging.poisson import add_poisson_flags, poisson_flags_given, poisson_trace_of
from kvlab.commands.plan.flags import flag_message
from kvlab.plan.config_fields import number_text
from kvlab.plan.kv_formats import KV_DTYPE_NAMES
from kvlab.runtime.atomic import output_problem
from kvlab.runtime.checks import int_flag, parse_list

GIB, MIB = 1024**3, 1024**2
# The KV dtype names the planner reads (kvlab.plan.ledger), for --kv-dtype's help; the planner checks the value.
KV_DTYPE_HELP = f"{', '.join(KV_DTYPE_NAMES)}; a KIVI name may add :group_size=G and :residual_length=R (kivi-4:group_size=64)"


# the built-in workload flags of `paging static` (dest: default); None in the parser means "not given"
STATIC_RNG_DEFAULTS = {"requests": 4000, "seed": 11}
def _add_budget_args(p: argparse.ArgumentParser) -> None:
    from kvlab.plan.hardware import get_hardware
    from kvlab.plan.scenario import DEFAULT_GPU, DEFAULT_MODEL, DEFAULT_RESERVE_GIB

    hw = get_hardware(DEFAULT_GPU)  # the planner's default GPU is paging's default device too
    g = p.add_argument_group(
        f"memory budget (default: {DEFAULT_MODEL} on an {hw.name}, {hw.memory_mib:,} MiB = {hw.memory_gib:g} GiB "
        f"as the device reports it - weights - {DEFAULT_RESERVE_GIB:g} GiB (2^30 B) reserve)"
    )
    g.add_argument(
        "--model",
        default=None,
        help=f"model for the planner (config.json path, dir, preset or HF id; default {DEFAULT_MODEL})",
    )
    g.add_argument("--kv-dtype", default="bf16", help=f"KV dtype (default bf16): {KV_DTYPE_HELP}")
    g.add_argument(
        "--gpu-mem-gib",
        type=float,
        default=None,
        help=f"device memory in GiB (2^30 B); default: the {hw.name}'s {hw.memory_mib:,} MiB = "
        f"{hw.memory_gib:.2f} GiB (nvidia-smi memory.total), as kvlab plan",
    )
    g.add_argument(
        "--gpu",
        default=None,
        help="GPU from the planner's hardware table, for its memory as the device reports it (as kvlab plan --gpu; "
        "names: kvlab plan --list-gpus); with --gpu-mem-gib, that flag is the memory (as in kvlab plan)",
    )
    g.add_argument(
        "--reserve-gib",
        type=float,
        default=DEFAULT_RESERVE_GIB,
        help=f"activation/framework reserve in GiB (default {DEFAULT_RESERVE_GIB:g})",
    )
    g.add_argument(
        "--max-len", type=paging_int, default=4096, help="contiguous reservation per request (default 4096)"
    )


def _budget(args: argparse.Namespace, kv_dtype: str | None = None, flag: str = "--kv-dtype"):
    """The KV budget of ``--model`` at ``kv_dtype`` (default ``--kv-dtype``) on the device flags.

    Raises:
        ValueError: a bad device flag, or a bad KV dtype named by ``flag`` and its value.
    """
    from kvlab.paging.budget import planner_budget
    from kvlab.plan.kv_formats import kv_dtype as parse_kv_dtype

    kv_dtype = kv_dtype or args.kv_dtype
    gpu, reserve = args.gpu_mem_gib, args.reserve_gib
    if gpu is not None and not (math.isfinite(gpu) and gpu > 0):
        raise ValueError(f"--gpu-mem-gib must be a positive number of GiB, got {gpu:g}")
    if not (math.isfinite(reserve) and reserve >= 0):
        raise ValueError(f"--reserve-gib must be a non-negative number of GiB, got {reserve:g}")
    try:
        parse_kv_dtype(kv_dtype)
        return planner_budget(args.model, kv_dtype, args.gpu_mem_gib, args.reserve_gib, gpu=args.gpu)
    except ValueError as e:  # the planner names `kv_dtype` / `group_size`: say which flag held them
        message = str(e)
        if not any(f"`{name}`" in message for name in ("kv_dtype", "group_size", "residual_length")):
            raise  # the model, not the KV dtype
        message = message.replace(f"`kv_dtype` {kv_dtype!r}: ", "").replace("`kv_dtype` ", "")
        raise ValueError(f"{flag} {kv_dtype!r}: {message}") from None


def register(subparsers) -> None:
    """Add ``kvlab paging`` and its subcommands ``static``, ``simulate`` and ``figure`` to ``subparsers``."""
    sub = add_command_group(
        subparsers,
        "paging",
        help="paged KV cache: static capacity, serving simulation, layout figure",
        description="How many requests fit with contiguous reservation vs paged blocks, what happens over time "
        "as requests arrive, grow, finish and get preempted, and the paged-layout figure.",
        dest="paging_command",
        metavar="{static,simulate,figure}",
    )
    _register_static(sub)
    _register_simulate(sub)
    _register_figure(sub)


def _register_static(sub) -> None:
    s = sub.add_parser(
        "static",
        help="concurrency and waste of contiguous reservation vs paging",
        description="Greedy admission under one KV budget: [A] requests admitted and utilization per policy, "
        "[B] reservation waste vs last-block waste, [C] block-size sweep. Default workloads: uniform (512 to "
        "--max-len tokens) and heavy tail (80% of 256-1024 tokens, 20% of 3072 to --max-len), --requests each.",
    )
    s.add_argument(
        "--workload",
        default=None,
        help="uniform, heavy, or a FILE of lengths (one per line, or CSV with tokens/length or "
        "prompt_tokens+output_tokens); default: uniform and heavy",
    )
    s.add_argument("--block-size", type=paging_int, default=16, help="paging block size in tokens (default 16)")
    s.add_argument(
        "--requests",
        type=paging_int,
        default=None,
        help=f"requests per built-in workload (default {STATIC_RNG_DEFAULTS['requests']}; not with a --workload FILE)",
    )
    s.add_argument(
        "--seed",
        type=paging_int,
        default=None,
        help=f"RNG seed of the built-in workloads (default {STATIC_RNG_DEFAULTS['seed']}; not with a --workload FILE)",
    )
    _add_budget_args(s)
    s.add_argument(
        "--json", action="store_true", help="print machine-readable JSON (sections A, B, C as above)"
    )
    s.set_defaults(func=run_static_cmd)


def _register_simulate(sub) -> None:
    m = sub.add_parser(
        "simulate",
        help="discrete-event serving simulation: contiguous, paged, paged+prefix sharing, paged+quantized KV",
        description="Requests arrive (Poisson or a trace CSV: arrival_step,prompt_tokens,output_tokens"
        "[,prefix_group,prefix_tokens]; times in engine steps), prefill, decode one token per step and "
        "finish; a request that cannot get a block preempts the last admitted one (recompute). Every policy "
        "runs on the same trace and budget.",
    )
    m.add_argument(
        "--trace",
        default=None,
        help="trace CSV (otherwise a Poisson trace is generated), replayed by arrival time: rows out of arrival "
        "order are sorted (equal arrivals keep their file order), with a note on stderr naming the first",
    )
    add_poisson_flags(m)
    m.add_argument("--block-size", type=paging_int, default=16, help="paging block size in tokens (default 16)")
    m.add_argument(
        "--policies",
        default=None,
        help="comma list among contiguous,paged,paged+prefix,paged+<quant dtype>, paged+keepN with --keep-tokens N "
        "(default: all of them)",
    )
    m.add_argument(
        "--quant-kv-dtype",
        default=None,
        help=f"KV dtype of the quantized policy (default kivi4): {KV_DTYPE_HELP}",
    )
    m.add_argument(
        "--keep-tokens",
        type=int_flag(1),
        default=None,
        metavar="N",
        help="also run paged+keepN: an evicting cache keeping at most N tokens per request (at most ceil(N / "
        "block size) blocks; the oldest block returns to the pool; docs/EVICTION.md)",
    )
    m.add_argument("--max-running", type=paging_int, default=None, help="cap on running requests (max_num_seqs)")
    m.add_argument(
        "--check-every",
        type=paging_int,
        default=0,
        help="full invariant check every K steps (0: at the end; 1 is slow: 20 s for 20 requests, under 1 s without)",
    )
    m.add_argument("--save-trace", default=None, help="also write the generated trace to this CSV")
    m.add_argument("--force", action="store_true", help="replace an existing --save-trace file")
    m.add_argument("--series", action="store_true", help="--json: include per-step and per-request series")
    _add_budget_args(m)
    m.add_argument("--json", action="store_true", help="print machine-readable JSON")
    m.set_defaults(func=run_simulate_cmd)


def _register_figure(sub) -> None:
    f = sub.add_parser(
        "figure",
        help="write the paged-layout figure (logical -> physical blocks, concurrency per policy)",
        description="Run the static simulation and draw the paged-layout figure (logical blocks of a few "
        "requests mapped to physical blocks, and requests admitted per policy) from its numbers.",
    )
    f.add_argument("--out", required=True, help="output image (.png, .svg, .pdf)")
    f.add_argument("--force", action="store_true", help="replace an existing file")
    f.add_argument("--block-size", type=paging_int, default=16, help="paging block size in tokens (default 16)")
    _add_budget_args(f)
    f.add_argument("--json", action="store_true", help="print the written path and numbers as JSON")
    f.set_defaults(func=run_figure_cmd)


def _static_result(args: argparse.Namespace, workload: str | None = None) -> dict:
    """``paging static``'s result for ``workload`` (None: every built-in one).

    Raises:
        ValueError: a bad flag, ``--block-size`` above ``--max-len`` (:func:`check_block_size`), or ``--requests`` /
            ``--seed`` with a ``--workload`` FILE, which fixes both (as ``paging simulate --trace`` refuses them).
    """
    from kvlab.paging.static import WORKLOADS, read_lengths, run_static, static_memory_bytes

    check_block_size(args)
    if workload is not None and workload not in WORKLOADS:
        given = [f"--{k} {getattr(args, k):,}" for k in STATIC_RNG_DEFAULTS if getattr(args, k) is not None]
        problem = replaced_flags_problem(given, "the built-in workloads", f"--workload {workload}")
        if problem:
            raise ValueError(problem)
    budget = _budget(args)
    kwargs = {"block_size_tokens": args.block_size, "budget": budget, "max_len": args.max_len}
    if workload is None or workload in WORKLOADS:
        workloads = WORKLOADS if workload is None else (workload,)
        rng = _rng_kwargs(args)
        check_requests_memory(
            "--requests", rng["n_requests"], static_memory_bytes(rng["n_requests"], len(workloads))
        )
        return run_static(workloads, **kwargs, **rng)
    path = Path(workload)
    if not path.is_file():
        raise ValueError(f"--workload must be one of {list(WORKLOADS)} or an existing file, got {workload!r}")
    lengths, lines = read_lengths(path)
    check_workload_max_len(workload, lengths, lines, args.max_len)
    return run_static(lengths={"file": lengths}, **kwargs)


def _rng_kwargs(args: argparse.Namespace) -> dict:
    """The built-in workloads' size and seed: the flags given, else :data:`STATIC_RNG_DEFAULTS`."""
    given = {k: getattr(args, k, None) for k in STATIC_RNG_DEFAULTS}
    n, seed = (STATIC_RNG_DEFAULTS[k] if v is None else v for k, v in given.items())
    return {"n_requests": n, "seed": seed}


def run_static_cmd(args: argparse.Namespace) -> int:
    """``kvlab paging static``: requests admitted at once, waste per request and block-size effects ([A], [B], [C]
    tables, or ``--json``). Exit 2 for a bad flag or workload file (``ValueError``, ``OSError``), named by its flag."""
    try:
        result = _static_result(args, args.workload)
    except (ValueError, OSError) as exc:
        return fail(args, flag_message(args, exc))
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    from kvlab.runtime.console import stdout_console

    cfg, a, b, c = result["config"], result["A"], result["B"], result["C"]
    console = stdout_console()
    console.print(
        f"KV budget: {cfg['budget_bytes'] / GIB:,.2f} GiB = {cfg['capacity_tokens']:,} tokens x "
        f"{number_text(cfg['kv_bytes_per_token'])} B ({cfg['source']}){_residual_note(cfg['residual_window'])}"
    )
    t = table(
        f"[A] requests admitted at once (block {cfg['block_size']:,}, reservation {cfg['max_len']:,})",
        *("requests", "held", "real KV", "utilization", "gain"),
        labels=("workload", "policy"),
    )
    for name, row in a.items():
        if not isinstance(row, dict):
            continue
        t.add_row(
            name,
            "contiguous",
            f"{row['k_cont']:,}",
            f"{row['bytes_cont'] / GIB:,.2f} GiB",
            f"{row['real_cont'] / GIB:,.2f} GiB",
            f"{row['util_cont']:.2%}",
            "",
        )
        t.add_row(
            "",
            f"paged ({cfg['block_size']:,})",
            f"{row['k_paged']:,}",
            f"{row['bytes_paged'] / GIB:,.2f} GiB",
            f"{row['real_paged'] / GIB:,.2f} GiB",
            f"{row['util_paged']:.2%}",
            f"{row['gain']:,.2f}x",
        )
    console.print(t)
    t = table(
        f"[B] waste per request ({cfg['workload_B_C']}, mean length {b['mean_len']:,.1f} tokens)",
        "MiB / request",
        labels=("source",),
    )
    t.add_row(f"contiguous reservation ({cfg['max_len']:,} tokens)", f"{b['reserve_waste'] / MIB:,.2f}")
    t.add_row(f"paged, last block ({b['block_size']:,} tokens)", f"{b['frag'] / MIB:,.2f}")
    t.add_row("ratio", "- (no last-block waste)" if b["ratio"] is None else f"{b['ratio']:,.1f}x")
    console.print(t)
    t = table(
        f"[C] block size ({cfg['workload_B_C']})",
        *("block", "empty slots / request", "utilization", "block-table entries / request"),
    )
    for row in c["rows"]:
        t.add_row(f"{row['bs']:,}", f"{row['frag']:,.1f}", f"{row['util']:.3%}", f"{row['nblk']:,.1f}")
    console.print(t)
    return 0


def _residual_note(window: dict | None) -> str:
    """What the output says of a KIVI cache's residual window (``residual_window`` of the JSON): that every request
    pays for it at the model dtype's bytes; empty without one."""
    if window is None:
        return ""
    return (
        f"; each request also holds its KIVI residual window, R={window['residual_length']:,} tokens (up to "
        f"{window['residual_length'] + window['group_size'] - 1:,} before a flush) at {window['dtype']}'s "
        f"{number_text(window['bytes_per_token'])} B/token"
    )


def _policies(args: argparse.Namespace):
    from kvlab.paging.policy import Policy, default_policies

    quant = args.quant_kv_dtype or "kivi4"
    # the quantized policy's bytes per token and (KIVI) residual window, from the planner as the budget's
    policies = default_policies(args.block_size, _budget(args, quant, "--quant-kv-dtype"))
    keep = None if args.keep_tokens is None else f"paged+keep{args.keep_tokens}"
    if keep:
        policies.append(Policy(keep, block_size_tokens=args.block_size, keep_tokens=args.keep_tokens))
    if args.policies is not None:
        known = {p.name: p for p in policies}
        try:
            wanted = parse_list(args.policies, what="a policy")
        except ValueError as exc:  # '' once ran every policy
            raise ValueError(f"--policies: {exc}; choose among {list(known)}") from None
        unknown = [w for w in wanted if w not in known]
        if unknown:
            hint = "".join(
                f"; {w} runs with --keep-tokens {w[len('paged+keep') :]}"
                for w in unknown
                if w.startswith("paged+keep") and w[len("paged+keep") :].isdigit()
            )
            raise ValueError(f"unknown policies {unknown}; choose among {list(known)}{hint}")
        if keep and keep not in wanted:  # --keep-tokens would be silently ignored
            raise ValueError(
                f"--keep-tokens {args.keep_tokens} runs as policy {keep}, which --policies {args.policies} leaves "
                f"out; add {keep} to --policies or drop --keep-tokens"
            )
        if args.quant_kv_dtype is not None and not any(known[w].kv_dtype == quant for w in wanted):
            raise ValueError(  # --quant-kv-dtype would be silently ignored
                f"--quant-kv-dtype {args.quant_kv_dtype} sets policy paged+{quant}, which --policies "
                f"{args.policies} leaves out; add paged+{quant} to --policies or drop --quant-kv-dtype"
            )
        policies = [known[w] for w in wanted]
    return policies


def run_simulate_cmd(args: argparse.Namespace) -> int:
    """``kvlab paging simulate``: replay a ``--trace`` file or a generated Poisson trace through each policy
    (table, or ``--json``). Exit 2 for a flag it would ignore, a bad trace file (named with ``--trace``) or a bad
    setting (``ValueError``, ``OSError``), named by its flag."""
    from rich.console import Console

    from kvlab.paging.simulate import check_run_settings, simulate
    from kvlab.paging.trace import read_trace, save_trace

    problem = empty_path_flag(args, "--trace", "--save-trace")
    if problem:
        return fail(args, problem)
    if args.series and not args.json:  # the series go into the JSON only: it would be silently ignored
        return fail(
            args, "--series adds per-step and per-request series to the --json output; pass --json too"
        )
    if args.force and not args.save_trace:  # it would be silently ignored
        return fail(args, "--force replaces an existing --save-trace file; pass --save-trace too")
    note = lines = None  # a trace file's rows sorted by arrival (TraceFile.order_note), each request's line
    if args.trace:
        problem = replaced_flags_problem(  # they would be silently ignored
            poisson_flags_given(args), "the generated Poisson trace", f"--trace {args.trace}"
        )
        if problem:
            return fail(args, problem)
        try:  # a trace file's errors name the file, its lines and CSV columns (`prompt_tokens`); say the flag
            read = read_trace(args.trace)
        except (ValueError, OSError) as exc:
            said = str(exc).removeprefix("trace ").removeprefix(f"{Path(args.trace)}: ")
            return fail(args, f"--trace {args.trace}: {said}")
        trace, lines, source, note = read.trace, read.lines, str(args.trace), read.order_note()
        if note:  # sorted, as a replay by arrival time: said, not silent
            print(f"{getattr(args, 'kvlab_prog', 'kvlab')}: note: --trace {args.trace}: {note}", file=sys.stderr)
    try:
        check_run_settings(
            args.max_len, args.max_running, args.check_every
        )  # before the trace is made or saved
        check_block_size(args)
        if not args.trace:
            trace, source = poisson_trace_of(args)
        policies, budget = _policies(args), _budget(args)
        check_keep_evicts(args, trace, policies)
        check_fits(args, trace, policies, budget, lines)
        if args.save_trace:  # the trace is saved once the run can use it
            save_trace(trace, args.save_trace, overwrite=args.force)
        with progress(Console(stderr=True), len(policies), "kvlab paging simulate") as bar:
            result = simulate(
                trace,
                policies,
                budget,
                max_len=args.max_len,
                max_running=args.max_running,
                check_every=args.check_every,
                keep_series=args.series,
                progress=bar.start,
            )
    except (ValueError, OSError) as exc:
        return fail(args, flag_message(args, exc))
    result["config"]["trace"] = source
    result["config"]["trace_order_note"] = note
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    _print_simulation(result, source)
    return 0


def _print_simulation(result: dict, source: str) -> None:
    """The table of ``kvlab paging simulate``: the trace's summary line, then one column per policy."""
    from kvlab.runtime.console import stdout_console

    cfg = result["config"]
    console = stdout_console()
    console.print(
        f"Trace {source}: {cfg['requests']:,} requests, mean prompt {cfg['prompt_tokens_mean']:,.0f}, mean output "
        f"{cfg['output_tokens_mean']:,.0f} tokens, {cfg['prefix_requests']:,} with a shared prefix. "
        f"KV memory {(cfg['gpu_bytes'] - cfg['weight_bytes'] - cfg['overhead_bytes']) / GIB:,.2f} GiB "
        f"({cfg['source']})."
    )
    policies = result["policies"]
    title = "Serving simulation (time in engine steps; blocks conserved at every step)"
    t = table(title, *policies, labels=("metric",))
    rows = [
        ("blocks x tokens", lambda r: f"{r['num_blocks']:,} x {r['block_size']:,}"),
        ("KV bytes / token", lambda r: number_text(r["kv_bytes_per_token"])),
        ("+ residual window", _window_cell),
        ("running, mean", lambda r: f"{r['concurrency']['mean']:,.1f}"),
        ("running, max", lambda r: f"{r['concurrency']['max']:,}"),
        ("slot utilization", lambda r: f"{r['utilization']:.2%}"),
        ("memory in use", lambda r: f"{r['memory_used_fraction']:.1%}"),
        ("waste, mean", lambda r: f"{r['waste']['mean_bytes'] / GIB:,.2f} GiB"),
        ("preemptions (requests)", lambda r: f"{r['preemptions']:,} ({r['preempted_requests']:,})"),
        ("recomputed tokens", lambda r: f"{r['recomputed_tokens']:,}"),
        ("prefix-hit blocks", lambda r: f"{r['prefix_hit_blocks']:,}"),
        ("blocks / request, max", lambda r: f"{r['max_blocks_per_request']:,}"),
        ("evicted blocks", lambda r: f"{r['evicted_blocks']:,}"),
        ("queue delay mean", lambda r: f"{r['queue_delay_steps']['mean']:,.1f}"),
        ("queue delay p99", lambda r: f"{r['queue_delay_steps']['p99']:,.0f}"),
        ("tokens / step", lambda r: f"{r['tokens_per_step']['mean']:,.1f}"),
        ("steps (makespan)", lambda r: f"{r['steps']:,} ({r['makespan_steps']:,})"),
        ("events / s", lambda r: f"{r['events_per_s']:,.0f}"),
    ]
    for label, fmt in rows:
        t.add_row(label, *(fmt(r) for r in policies.values()))
    console.print(t)
    console.print(f"[dim]{SIMULATION_LEGEND}[/]")


# what the simulation table's rows mean (the two fractions read alike without it: a new user asked)
SIMULATION_LEGEND = (
    "rows: running = requests holding KV after a step; slot utilization = written slots / slots of the allocated "
    "blocks, over busy steps (how full the blocks in use are); memory in use = allocated blocks / the pool's blocks, "
    "mean over steps (how much of the KV memory is taken); waste = empty slots of allocated blocks (reservation or "
    "last-block), mean; queue delay = first admission - arrival, steps; tokens / step = decode + prefill tokens "
    "computed (prefix hits are not); steps (makespan) = engine steps run (steps from 0 to the last completion); "
    "events / s = simulator speed on this machine (docs/paging.md)"
)


def _window_cell(result: dict) -> str:
    """A policy's residual window in the simulation table: ``R=128 at bf16`` (charged per request), or ``-``."""
    window = result["residual_window"]
    return "-" if window is None else f"R={window['residual_length']} at {window['dtype']}"


def run_figure_cmd(args: argparse.Namespace) -> int:
    """``kvlab paging figure``: draw the paged-layout figure to ``--out`` (.png, .svg or .pdf). Exit 2 for an empty,
    folder, existing (without ``--force``) or wrongly suffixed ``--out``, or a bad flag (``ValueError``,
    ``OSError``), named by its flag."""
    from kvlab.paging.figure import FIGURE_SUFFIXES, plot_paged_layout

    problem = empty_path_flag(args, "--out")
    if problem:
        return fail(args, problem)
    if Path(args.out).is_dir():  # --force would not replace a folder: say so, not "pass --force"
        return fail(args, f"--out {args.out} is a folder; pass a file name (.png, .svg or .pdf)")
    if Path(args.out).exists() and not args.force:
        return fail(args, file_exists_message(args.out), EXIT_FILE_EXISTS)
    problem = suffix_problem("--out", args.out, FIGURE_SUFFIXES, "the figure's format follows its suffix")
    if problem:
        return fail(args, problem)
    # a missing folder is refused, as --save-trace's
    problem = output_problem(args.out, "--out", folder_must_exist=True)
    if problem:
        return fail(args, problem)
    try:
        result = _static_result(args)
        path = plot_paged_layout(result, args.out, overwrite=args.force)
    except (ValueError, OSError) as exc:
        return fail(args, flag_message(args, exc))
    if args.json:
        a = result["A"]
        print(
            json.dumps(
                {
                    "path": str(path),
                    "A": {k: v for k, v in a.items() if not isinstance(v, dict)}
                    | {
                        k: {"k_cont": v["k_cont"], "k_paged": v["k_paged"]}
                        for k, v in a.items()
                        if isinstance(v, dict)
                    },
                    "demo": result["demo"],
                },
                indent=1,
            )
        )
    else:
        print(f"wrote {path}")
    return 0
