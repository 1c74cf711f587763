"""``kvlab sensitivity sweep`` / ``kvlab sensitivity allocate``: per-layer KV precision chosen by measurement.

``sweep`` measures, for a model and held-out prompts, the KL of a teacher-forced continuation when one layer's keys
(or values) are compressed in one format, all else float (:mod:`kvlab.bench.sensitivity`), with the bytes each
choice saves; ``allocate`` turns a sweep file into a plan file for a byte budget (:mod:`kvlab.plan.allocate`), which
``kvlab eval --candidates mixed-<name>`` runs (``$KVLAB_PLAN_DIR``; docs/MIXED.md).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.commands import (
    EXIT_FILE_EXISTS,
    add_command_group,
    dtype_problem,
    empty_path_flag,
    fail,
    file_exists_message,
    output_folder_problem,
    progress,
    suffix_problem,
    table,
)
from kvlab.runtime.checks import check_int, int_flag

SWEEP_KIND = "kvlab-sensitivity"


def register(sub) -> None:
    """Add ``kvlab sensitivity`` and its subcommands ``sweep``, ``allocate`` and ``verify`` to ``sub``."""
    modes = add_command_group(
        sub,
        "sensitivity",
        help="per-layer KV sensitivity sweep and bit allocation (docs/MIXED.md)",
        dest="mode",
        metavar="{sweep,allocate,verify}",
    )
    s = modes.add_parser("sweep", help="KL of a continuation with one layer's K or V compressed, per format")
    s.add_argument(
        "--model", default=None, help="as kvlab eval --model (default: the bundled reference model)"
    )
    s.add_argument("--dtype", default="bfloat16", help="model dtype (default bfloat16)")
    s.add_argument("--context", type=int_flag(), default=1024, help="prompt tokens (default 1024)")
    s.add_argument("--continuation", type=int_flag(), default=16, help="teacher-forced tokens scored (default 16)")
    s.add_argument("--prompts", type=int_flag(), default=2, help="held-out prompts (default 2)")
    s.add_argument(
        "--offset", type=int_flag(), default=0, help="held-out token offset of the first prompt (default 0)"
    )
    s.add_argument(
        "--formats",
        default="kivi-2,kivi-4,kivi-8,fp8-e4m3",
        help="comma list (default kivi-2,kivi-4,kivi-8,fp8-e4m3)",
    )
    G, R = KIVI_DEFAULTS.group_size, KIVI_DEFAULTS.residual_length
    s.add_argument("--group-size", type=int_flag(), default=G, help=f"KIVI G (default {G})")
    s.add_argument("--residual", type=int_flag(), default=R, help=f"KIVI residual window R (default {R})")
    s.add_argument(
        "--rows", type=int_flag(), default=8, help="batch rows per forward, one of them float (default 8)"
    )
    s.add_argument("--out", required=True, help="sweep result file (JSON)")
    s.add_argument("--force", action="store_true", help="overwrite an existing --out")
    s.add_argument("--json", action="store_true", help="print the result JSON")
    s.set_defaults(func=run_sweep)
    a = modes.add_parser("allocate", help="a plan file of least predicted KL within a byte budget")
    a.add_argument("sweep", help="a file written by kvlab sensitivity sweep")
    a.add_argument(
        "--budget",
        required=True,
        help="a fraction of the float cache (0.3) or a uniform cache whose bytes to match: kivi-4, kivi-k4v2 "
        "(3 code bits on average), fp8-e4m3",
    )
    a.add_argument(
        "--tokens", type=int_flag(), default=None, help="context the budget holds at (default: the sweep's)"
    )
    a.add_argument(
        "--formats",
        default=None,
        help="comma list of the sweep's formats the plan may use besides float (default: all it measured); "
        "fp8-e4m3 alone gives what vLLM can run: --kv-cache-dtype fp8 with --kv-cache-dtype-skip-layers",
    )
    a.add_argument(
        "--floor",
        default=None,
        help="a swept format (kivi-8) whose KL is subtracted from every format's, per layer half (clipped at 0): "
        "the part of a single-layer KL that any perturbation of that layer causes and that does not add up "
        "across layers (docs/MIXED.md)",
    )
    a.add_argument("--name", required=True, help="plan name: kvlab eval runs it as mixed-<name>")
    a.add_argument(
        "--out-dir",
        default=None,
        help="folder of the plan file (default $KVLAB_PLAN_DIR); a new folder is made only in a folder that exists",
    )
    a.add_argument("--force", action="store_true", help="overwrite an existing plan file")
    a.add_argument("--json", action="store_true", help="print the plan JSON")
    a.set_defaults(func=run_allocate)
    v = modes.add_parser(
        "verify",
        help="did each mixed-<plan> cache of a kvlab eval result beat the uniform caches of no more bytes",
    )
    v.add_argument("result", help="a kvlab eval result file whose candidates include mixed-<plan> caches")
    v.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    v.set_defaults(func=run_verify)


def _check_sweep_args(args) -> str | None:
    for flag, value, low in (
        ("--context", args.context, 1),
        ("--continuation", args.continuation, 1),
        ("--prompts", args.prompts, 1),
        ("--offset", args.offset, 0),
        ("--rows", args.rows, 2),
        ("--group-size", args.group_size, 1),
    ):
        if value < low:
            return f"{flag} must be >= {low}, got {value}"
    from kvlab.plan.mixed import FORMATS
    problem = dtype_problem(args.dtype)  # the wording of every --dtype, before the model loads
    if problem:
        return problem

    formats = [f.strip() for f in args.formats.split(",")]
    bad = [f for f in formats if f not in FORMATS or f == "float"]
    if bad or len(set(formats)) != len(formats):
        return f"--formats {args.formats!r}: each of kivi-2, kivi-4, kivi-8, fp8-e4m3 at most once, got {bad or formats}"
    if args.residual % args.group_size or args.residual < 0:
        return f"--residual ({args.residual}) must be a non-negative multiple of --group-size ({args.group_size})"
    if any(f.startswith("kivi") for f in formats) and args.context < args.residual + args.group_size:
        return (  # the oldest ((context - R) // G) * G tokens are quantized (kvlab.bench.sensitivity)
            f"--context {args.context} must be at least --residual {args.residual} + --group-size "
            f"{args.group_size}: KIVI keeps the newest {args.residual} tokens in float and quantizes whole "
            f"groups of {args.group_size} before them, so it would quantize nothing (KL 0)"
        )
    return None


def run_sweep(args: argparse.Namespace) -> int:
    """``kvlab sensitivity sweep``: measure and write ``--out``. Exit 2 for a bad flag, an existing (without
    ``--force``) or non-.json ``--out``, or a model or held-out text that cannot be read (named)."""
    from rich.console import Console

    from kvlab.runtime.atomic import atomic_write_json, output_problem

    problem = (  # '' is no file ("--out . is a folder")
        empty_path_flag(args, "--out")
        or _check_sweep_args(args)
        or output_problem(args.out, "--out", folder_must_exist=True)
    )
    if problem:
        return fail(args, problem)
    if Path(args.out).exists() and not args.force:
        return fail(args, file_exists_message(args.out), EXIT_FILE_EXISTS)
    problem = suffix_problem("--out", args.out, (".json",), "the sweep result is JSON")
    if problem:
        return fail(args, problem)
    err = Console(stderr=True)
    try:
        result = _measure(args, err)
    except (ValueError, FileNotFoundError, OSError) as exc:
        return fail(args, exc)
    atomic_write_json(args.out, result)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print_sweep(result)
    err.print(f"sweep written to {args.out}")
    return 0


def _measure(args, err) -> dict:
    """Load the model, cut the prompts, run the sweep; the result file's object."""
    import torch

    from kvlab.bench.sensitivity import sweep
    from kvlab.models import heldout_token_ids, load_model
    from kvlab.runtime.dtypes import cpu_matmul_policy

    model, tokenizer = load_model(args.model, dtype=args.dtype)
    n = args.context + args.continuation
    need = args.prompts * n  # consecutive, non-overlapping held-out windows: one cut of them all
    try:
        ids = heldout_token_ids(tokenizer, need, offset=args.offset)
    except ValueError as exc:  # the library names `offset` and `n_tokens`; the user typed these flags
        sizes = f"--prompts {args.prompts} x (--context {args.context} + --continuation {args.continuation})"
        raise ValueError(
            str(exc).replace("`offset`", "--offset").replace(f"`n_tokens` {need}", f"{sizes} {need}")
        ) from exc
    prompts = torch.tensor(ids).reshape(args.prompts, n)
    offsets = [args.offset + i * n for i in range(args.prompts)]  # each prompt's first held-out token
    formats = [f.strip() for f in args.formats.split(",")]
    layers = model.config.get_text_config().num_hidden_layers
    total = args.prompts * -(-(layers * 2 * len(formats)) // (args.rows - 1))
    matmul, gemms = cpu_matmul_policy(model, "auto", torch.device("cpu"))
    with progress(err, total, "sensitivity") as bar, gemms:
        out = sweep(
            model,
            prompts,
            args.context,
            formats,
            group_size=args.group_size,
            residual_length=args.residual,
            rows=args.rows,
            on_step=bar.start,
        )
    config = {**model.config.to_dict(), "torch_dtype": args.dtype}
    return {
        "kind": SWEEP_KIND,
        "model": args.model,
        "model_config": config,
        "dtype": args.dtype,
        "prompts": {"source": "kvlab.models.heldout_text()", "offsets": offsets, "tokens": n},
        "group_size": args.group_size,
        "residual_length": args.residual,
        "cpu": matmul,
        **out,
        "bytes": _half_bytes(config, formats, args.context, args.group_size, args.residual),
    }


def _half_bytes(config: dict, formats: list[str], tokens: int, group_size: int, residual: int) -> dict:
    """Bytes one layer's keys (= its values) hold at ``tokens`` in each format and float, and what each saves."""
    from kvlab.plan.load import load_spec
    from kvlab.plan.mixed import plan_layer_bytes

    spec = load_spec(config)
    n = len(spec.layer_kinds)
    half = {
        f: plan_layer_bytes(spec, [(f, f)] * n, tokens, group_size=group_size, residual_length=residual)[0]
        // 2
        for f in [*formats, "float"]
    }
    return {
        "tokens": tokens,
        "per_half": half,
        "saved_per_half": {f: half["float"] - half[f] for f in formats},
    }


def _print_sweep(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from kvlab.bench.sensitivity import ranking

    table = Table(
        title=f"most sensitive layer halves (KL nats, {result['cost']['continuation']} tokens scored)"
    )
    table.add_column("format")
    table.add_column("top 5: layer.half KL", overflow="fold")
    table.add_column("bytes saved per half")
    for fmt in result["formats"]:
        top = ", ".join(f"{layer}.{half} {kl:.2e}" for layer, half, kl in ranking(result["kl"], fmt)[:5])
        table.add_row(fmt, top, f"{result['bytes']['saved_per_half'][fmt]:,}")
    console = Console()
    console.print(table)
    c = result["cost"]
    prefills, forwards = c["prefills"], c["forwards"]
    console.print(
        f"cost: {prefills} float prefill{'' if prefills == 1 else 's'} of {c['context']} tokens, {forwards} "
        f"forward{'' if forwards == 1 else 's'} of {c['continuation']} tokens x {c['rows']} rows, {c['seconds']:.0f} s"
    )


def run_allocate(args: argparse.Namespace) -> int:
    """``kvlab sensitivity allocate``: write the plan file ``<--out-dir>/<--name>.json``. Exit 2 for a bad name,
    sweep file, budget (named as ``--budget``), formats or floor, no ``--out-dir`` or ``$KVLAB_PLAN_DIR``, or a plan
    file that exists (without ``--force``)."""
    from kvlab.plan.allocate import allocate, budget_bytes
    from kvlab.plan.load import load_spec
    from kvlab.plan.mixed import PLAN_DIR_ENV, PLAN_VERSION, check_plan_name
    from kvlab.runtime.atomic import atomic_write_json, output_problem

    try:
        check_plan_name(args.name, new=True)
        sweep = read_sweep(args.sweep)
        spec = load_spec(sweep["model_config"])
        tokens = sweep["cost"]["context"] if args.tokens is None else args.tokens
        if tokens < 1:
            raise ValueError(f"--tokens must be >= 1, got {tokens}")
        kivi = {"group_size": sweep["group_size"], "residual_length": sweep["residual_length"]}
        budget = budget_bytes(spec, args.budget, tokens, **kivi)
        kl = _above_floor(sweep["kl"], args.floor)
        out = allocate(spec, _chosen_formats(kl, args.formats), budget, tokens, **kivi)
    except ValueError as exc:  # the planner names its `budget`: the user typed --budget
        return fail(args, str(exc).replace("`budget`", "--budget"))
    folder = args.out_dir or os.environ.get(PLAN_DIR_ENV)
    if not folder:
        return fail(args, f"give --out-dir or set ${PLAN_DIR_ENV} (the folder kvlab eval reads plans from)")
    path = Path(folder) / f"{args.name}.json"
    # a new folder is made, but only in a folder that exists (docs/MIXED.md's `--out-dir plans`; the one rule of
    # kvlab.commands.output_folder_problem); a file in its way is refused, not a traceback
    flag = "--out-dir" if args.out_dir else f"${PLAN_DIR_ENV}"
    problem = output_problem(path, flag) or output_folder_problem(folder, flag)
    if problem:
        return fail(args, problem)
    if path.exists() and not args.force:
        return fail(args, file_exists_message(path), EXIT_FILE_EXISTS)
    plan = {
        "kvlab_plan": PLAN_VERSION,
        "layers": out.pop("layers"),
        "allocation": {
            "budget": args.budget,
            "floor": args.floor,
            "sweep": str(args.sweep),
            "model": sweep.get("model"),
            **out,
        },
    }
    Path(folder).mkdir(exist_ok=True)  # its parent exists: output_folder_problem
    atomic_write_json(path, plan)
    if args.json:
        print(json.dumps(plan, indent=1))
    else:
        _print_allocation(plan, path)
    return 0


def read_sweep(path: str) -> dict:
    """The object of the sweep file ``path`` (what ``kvlab sensitivity sweep`` writes), with the fields
    ``allocate`` reads checked.

    Raises:
        ValueError: a file that cannot be read, is not JSON, is not a sweep (``kind``), or lacks a field or holds
            a bad one (:func:`kvlab.sensitivity_figure.sensitivity_figure_data` checks its KL lists); each names
            the sweep file.
    """
    from kvlab.sensitivity_figure import sensitivity_figure_data

    try:
        sweep = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"sweep file {path!r} cannot be read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"sweep file {path!r} is not JSON: {exc}") from None
    if not isinstance(sweep, dict):
        raise ValueError(f"sweep file {path!r} must hold a JSON object, got {type(sweep).__name__}")
    if sweep.get("kind") != SWEEP_KIND:
        held = (
            f"its 'kind' is {sweep['kind']!r}, not {SWEEP_KIND!r}"
            if "kind" in sweep
            else "it has no 'kind' field"
        )
        raise ValueError(f"{path} is not a kvlab sensitivity sweep ({held}; kvlab sensitivity sweep writes one)")
    try:
        sensitivity_figure_data(sweep)  # layers, formats and their KL lists
        if not isinstance(sweep.get("model_config"), dict):
            raise ValueError(_field_problem(sweep, "model_config", "an object"))
        cost = sweep.get("cost") if isinstance(sweep.get("cost"), dict) else {}
        for where, name, minimum in ((cost, "context", 1), (sweep, "group_size", 1), (sweep, "residual_length", 0)):
            if name not in where:  # check_int would say "got None" of a field the file lacks
                raise ValueError(f"it has no `{'cost.' if where is cost else ''}{name}`")
            check_int(f"{'cost.' if where is cost else ''}{name}", where[name], minimum)
    except ValueError as exc:
        raise ValueError(f"sweep file {path!r}: {exc}") from None
    return sweep


def _field_problem(sweep: dict, key: str, kind: str) -> str:
    """What is wrong with a sweep file's field ``key`` that is not ``kind``: "it has no `key`" when absent (not "got
    None"), else "its `key` must be <kind>, got <the JSON type>"."""
    if key not in sweep:
        return f"it has no `{key}`"
    value = sweep[key]
    return f"its `{key}` must be {kind}, got {'null' if value is None else type(value).__name__}"


def _chosen_formats(kl: dict, formats: str | None) -> dict:
    """The sweep's ``kl`` restricted to ``--formats`` (all of it when None).

    Raises:
        ValueError: a format the sweep did not measure (named, with those it did), or one given twice.
    """
    if formats is None:
        return kl
    names = [f.strip() for f in formats.split(",")]
    bad = [f for f in names if f not in kl]
    if bad or not names:
        raise ValueError(f"--formats {formats!r}: the sweep measured {', '.join(kl)}, got {bad or names}")
    twice = sorted({f for f in names if names.count(f) > 1})
    if twice:  # as sweep refuses: one format, one choice per layer
        raise ValueError(f"--formats {formats!r}: {', '.join(twice)} given twice; give each format once")
    return {f: kl[f] for f in names}


def _above_floor(kl: dict, floor: str | None) -> dict:
    """``kl`` with ``kl[floor]`` subtracted per layer half, clipped at 0 (unchanged when ``floor`` is None).

    Raises:
        ValueError: a ``floor`` the sweep did not measure.
    """
    if floor is None:
        return kl
    if floor not in kl:
        raise ValueError(f"--floor {floor!r}: the sweep measured {', '.join(kl)}")
    return {f: {h: [max(0.0, a - b) for a, b in zip(kl[f][h], kl[floor][h])] for h in ("k", "v")} for f in kl}


def vllm_flags(layers: dict) -> str | None:
    """``--kv-cache-dtype fp8 [--kv-cache-dtype-skip-layers i j]`` for a plan of FP8 and float layers only (vLLM's
    skipped layers keep the model dtype; the flag takes its layers space-separated, ``nargs="+"``: a comma-joined
    ``1,2`` would be one name that matches no layer), else None (vLLM has no per-layer KIVI)."""
    kinds = {(e["k"], e["v"]) for e in layers.values()}
    if not kinds <= {("fp8-e4m3", "fp8-e4m3"), ("float", "float")} or ("fp8-e4m3", "fp8-e4m3") not in kinds:
        return None
    skip = sorted(int(i) for i, e in layers.items() if e["k"] == "float")
    return "--kv-cache-dtype fp8" + (
        f" --kv-cache-dtype-skip-layers {' '.join(map(str, skip))}" if skip else ""
    )


def _print_allocation(plan: dict, path: Path) -> None:
    from rich.console import Console

    from kvlab.plan.mixed import plan_summary

    a = plan["allocation"]
    formats = [(e["k"], e["v"]) for _, e in sorted(plan["layers"].items(), key=lambda kv: int(kv[0]))]
    console = Console()
    console.print(
        f"plan {path.stem}: {a['plan_bytes']:,} B of a {a['budget_bytes']:,} B budget ({a['budget']}) at "
        f"{a['tokens']:,} tokens; predicted KL {a['predicted_kl']:.4g} (sum of single-layer KLs)"
    )
    console.print(f"layers holding each format: {plan_summary(formats)}")
    fits = {n: u for n, u in a["uniform"].items() if u["bytes"] <= a["budget_bytes"]}
    for name, u in sorted(fits.items(), key=lambda kv: kv[1]["bytes"]):
        console.print(f"  uniform {name}: {u['bytes']:,} B, predicted KL {u['predicted_kl']:.4g}")
    flags = vllm_flags(plan["layers"])
    if flags:
        console.print(
            f"vLLM runs this plan as: vllm serve MODEL {flags} (per-tensor scales, 1.0 unless calibrated)"
        )
    console.print(f"plan written to {path}; run it as mixed-{path.stem} (with $KVLAB_PLAN_DIR={path.parent})")


def run_verify(args: argparse.Namespace) -> int:
    """Status 0 when every mixed cache won at every context, 1 when one did not, 2 for a bad file."""
    from rich.console import Console

    from kvlab.eval.io import read_result
    from kvlab.plan.allocate import mixed_verdict

    try:
        result = read_result(args.result)
    except (FileNotFoundError, ValueError) as exc:
        return fail(args, exc)
    verdicts = mixed_verdict(result.get("rows", []))
    if not verdicts:
        return fail(
            args, f"{args.result} has no capacity cell of a mixed-<plan> candidate with a measured KL"
        )
    if args.json:
        print(json.dumps(verdicts, indent=1))
        return 0 if all(v["wins"] for v in verdicts) else 1
    t = table(
        f"mixed caches against uniform caches of no more bytes ({args.result})",
        labels=("cache", "context", "bytes", "KL mean", "recall drop", "passkey drop", "beats it"),
    )
    for v in verdicts:
        rows = [(v, "")] + [(a, "yes" if a["beaten"] else "NO") for a in v["against"]]
        for i, (r, beaten) in enumerate(rows):
            t.add_row(
                r["candidate"] if i == 0 else f"  {r['candidate']}",
                f"{v['context_length']:,}",
                f"{r['cache_bytes']:,}",
                f"{r['kl_mean']:.4g}",
                f"{r['recall_drop']:+.3f}" if r["recall_drop"] is not None else "-",
                f"{r['passkey_drop']:+.3f}" if r["passkey_drop"] is not None else "-",
                beaten or ("WINS" if v["wins"] else "does not win"),
            )
    Console().print(t)
    return 0 if all(v["wins"] for v in verdicts) else 1
