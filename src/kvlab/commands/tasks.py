"""``kvlab tasks``: RULER-style long-context tasks through candidate KV caches; logic in
:mod:`kvlab.eval.tasks_suite` and :mod:`kvlab.eval.tasks_run`, the figure in :mod:`kvlab.task_figures`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kvlab.commands import EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail, file_exists_message


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tasks",
        help="RULER-style long-context tasks (needles, multi-key/value/query, variable tracking, common words, "
        "JSON key-value) through candidate caches: score vs measured bytes",
        description="Generate each task at each context (seeded, exact token lengths), prefill every context once "
        "with the float cache, fill every candidate from that prefill (evicting caches compress it), append the "
        "question uncompressed and greedy-decode the answer; score as RULER does (every reference in the answer) "
        "with Wilson intervals. A task where the float cache scores below --min-float-score at a context is "
        "'not informative' there and judges no cache. Measures question-agnostic compression (docs/TASKS.md).",
    )
    p.add_argument(
        "--model", default=None, help="local directory, GGUF file, named model or hub id (default: bundled)"
    )
    p.add_argument("--dtype", default="bfloat16", help="model dtype: bfloat16 (default), float16 or float32")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--tasks", default=None, help="comma-separated task names (default: all; see --list)")
    p.add_argument("--contexts", default=None, help="comma-separated context lengths in tokens (512,1024)")
    p.add_argument(
        "--candidates", default=None, help="comma-separated cache names (default: the family sweep)"
    )
    p.add_argument("--n", type=int, default=None, help="samples per task and context (10; --quick 5)")
    p.add_argument("--seed", type=int, default=0, help="generator seed (0)")
    p.add_argument(
        "--protected-tail", type=int, default=160, help="newest context tokens without needles (160)"
    )
    p.add_argument("--max-drop", type=float, default=0.1, help="a gate fails above this score drop (0.1)")
    p.add_argument("--min-float-score", type=float, default=0.5, help="float score below it: not informative")
    p.add_argument("--quick", action="store_true", help="4 tasks, 4 caches, 5 samples, the first context")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--out", default="kvlab-tasks.json", help="result JSON, written atomically (kvlab-tasks.json)"
    )
    p.add_argument(
        "--figure", default=None, metavar="PATH", help="also draw score vs bytes ratio to PATH (PNG)"
    )
    p.add_argument("--force", action="store_true", help="replace an existing --out / --figure file")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    p.add_argument("--list", action="store_true", help="list the tasks and exit")
    p.set_defaults(func=run)


def _config(args: argparse.Namespace):
    from kvlab.eval import tasks_suite as ts

    kw = {}
    if args.quick:
        kw.update(tasks=ts.QUICK_TASKS, candidates=ts.QUICK_CANDIDATES, n=5)
    if args.tasks is not None:
        kw["tasks"] = ts.TASKS_ALL if args.tasks.strip() == "all" else _csv(args.tasks)
    if args.contexts is not None:
        try:
            kw["contexts"] = tuple(int(x) for x in _csv(args.contexts))
        except ValueError:
            raise ValueError(f"--contexts must be comma-separated integers, got {args.contexts!r}") from None
    elif args.quick:
        kw["contexts"] = ts.TaskSuiteConfig.contexts[:1]
    if args.candidates is not None:
        kw["candidates"] = _csv(args.candidates)
    if args.n is not None:
        kw["n"] = args.n
    return ts.TaskSuiteConfig(
        **kw, seed=args.seed, protected_tail=args.protected_tail, max_drop=args.max_drop,
        min_float_score=args.min_float_score,
    )  # fmt: skip


def _check_outputs(args: argparse.Namespace) -> str | None:
    for flag, path in (("--out", args.out), ("--figure", args.figure)):
        if path is None:
            continue
        path = Path(path)
        if path.is_dir():
            return f"{flag} {path} is a folder; pass a file"
        if not path.parent.is_dir():
            return f"{flag} {path}: folder {path.parent} does not exist"
        if path.exists() and not args.force:
            return file_exists_message(path)
    if args.figure and Path(args.figure).suffix.lower() != ".png":
        return f"--figure {args.figure} must end in .png (the figure is a PNG)"
    if args.figure and Path(args.figure).resolve() == Path(args.out).resolve():
        return "--out and --figure name the same file; give each its own"
    return None


def run(args: argparse.Namespace) -> int:
    from kvlab.tasks import TASKS

    if args.list:
        for name, spec in TASKS.items():
            print(f"{name:16s} {spec.haystack:6s} {spec.summary}")
        return EXIT_OK
    try:
        cfg = _config(args)
    except ValueError as e:
        return fail(args, e)
    problem = _check_outputs(args)
    if problem:
        return fail(args, problem, EXIT_USAGE)
    if args.threads is not None and args.threads < 1:
        return fail(args, f"--threads must be >= 1, got {args.threads}")
    return _measure(args, cfg)


def _measure(args: argparse.Namespace, cfg) -> int:
    import torch

    from kvlab.eval.tasks_suite import RESULT_KIND, RESULT_VERSION, run_suite
    from kvlab.models import heldout_text, load_model
    from kvlab.runtime.atomic import atomic_write_json
    from kvlab.runtime.provenance import machine_info

    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.time()
    try:
        model, tokenizer = load_model(args.model, dtype=args.dtype, device=args.device)
    except (ValueError, FileNotFoundError) as e:
        return fail(args, e)
    except OSError as e:
        return fail(args, e, EXIT_FAILED)

    def progress(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    measured = run_suite(model, tokenizer, cfg, heldout_text(), progress)
    result = {
        "kind": RESULT_KIND,
        "version": RESULT_VERSION,
        "model": {"name": args.model or "bundled", "dtype": args.dtype, "device": args.device},
        **measured,
        "provenance": {**machine_info(), "started_unix": started, "wall_s": time.time() - started},
    }
    atomic_write_json(Path(args.out), result, indent=1)
    if args.figure:
        from kvlab.task_figures import plot_task_scores

        plot_task_scores(result, args.figure)
    _print(args, result)
    return EXIT_OK


def _print(args: argparse.Namespace, result: dict) -> None:
    import json

    if args.json:
        print(json.dumps(result, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kvlab tasks: {result['model']['name']} ({result['provenance']['wall_s']:.0f} s)")
    for col in ("task", "context", "cache", "bytes ratio", "score", "all found (95% CI)", "gate"):
        table.add_column(col)
    status = {(g["task"], g["context"], g["cache"]): g["status"] for g in result["gates"]}
    for cell in result["cells"]:
        for name, row in cell["caches"].items():
            lo, hi = row["ci95"]
            gate = status.get((cell["task"], cell["context"], name), "baseline")
            table.add_row(cell["task"], str(cell["context"]), name, f"{row['bytes_ratio']:.2f}",
                          f"{row['score']:.2f}", f"{row['correct']}/{row['trials']} ({lo:.2f}-{hi:.2f})", gate)  # fmt: skip
    console = Console()
    console.print(table)
    for name, d in result["decision"].items():
        failed = f" (failed: {', '.join(d['failed'])})" if d["failed"] else ""
        console.print(f"{name}: {d['verdict']}{failed}")
    for m in result["not_measured"]:
        console.print(f"not measured: {m['task']} @ {m['context']}: {m['reason']}")
    console.print(f"result: {args.out}" + (f", figure: {args.figure}" if args.figure else ""))
