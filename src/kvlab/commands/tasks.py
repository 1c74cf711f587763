"""``kvlab tasks``: RULER-style long-context tasks through candidate KV caches; logic in
:mod:`kvlab.eval.tasks_suite` and :mod:`kvlab.eval.tasks_run`, the figure in :mod:`kvlab.task_figures`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from kvlab.commands import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Terminated,
    configured_limit,
    device_problem,
    dtype_problem,
    empty_path_flag,
    fail,
    file_exists_message,
    progress,
    sigterm_raises,
    stop_exit_code,
    suffix_problem,
)
from kvlab.runtime.atomic import output_problem
from kvlab.runtime.checks import int_flag, int_list, parse_list
from kvlab.runtime.timing import check_threads

DEFAULT_OUT = "kvlab-tasks.json"
DEFAULT_THREADS = 1  # --threads when not given (docs/TASKS.md: --quick timed with 1 and 2)
# the settings a resumed run takes from its file: given with --resume, they are refused
_SETTING_FLAGS = ("model", "dtype", "device", "tasks", "contexts", "candidates", "n", "seed", "protected_tail",
                  "max_drop", "min_float_score")  # fmt: skip


def register(subparsers) -> None:
    """Add ``kvlab tasks`` (model, tasks, contexts, candidates, gates, ``--resume``, ``--merge``, ``--dry-run``; run
    by :func:`run`) to ``subparsers``."""
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
    p.add_argument("--model", default=None, help="local directory, GGUF file, named model or hub id (default: bundled)")
    p.add_argument("--dtype", default=None, help="model dtype: bfloat16 (default), float16 or float32")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or auto (default cpu)")
    p.add_argument("--tasks", default=None, help="comma-separated task names (default: all; see --list)")
    p.add_argument("--contexts", default=None, help="comma-separated context lengths in tokens (512)")
    p.add_argument(
        "--candidates",
        default=None,
        help="comma-separated cache names, or 'sweep' (every family over its settings; default: each family once)",
    )
    p.add_argument("--n", type=int_flag(), default=None, help="samples per task and context (5)")
    p.add_argument("--seed", type=int_flag(), default=None, help="generator seed (0)")
    p.add_argument(
        "--protected-tail", type=int_flag(), default=None, help="newest context tokens without needles (160)"
    )
    p.add_argument("--max-drop", type=float, default=None, help="a gate fails above this score drop (0.1)")
    p.add_argument("--min-float-score", type=float, default=None, help="float score below it: not informative (0.5)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="3 needle tasks (niah_single_1, niah_single_2, niah_multikey_1), 4 caches (dynamic, kivi-4, kivi-2, "
        "snapkv:compression_ratio=0.5), 5 samples, 512 tokens; --tasks, --candidates, --contexts and --n given "
        "with it replace its choice of each (its time on smollm2-135m: docs/TASKS.md)",
    )
    p.add_argument(
        "--allow-past-limit",
        action="store_true",
        help="measure --contexts past the model's max_position_embeddings (refused without it, as kvlab eval "
        "refuses it: scores there describe positions the model was not trained on); warned about then",
    )
    p.add_argument(
        "--threads",
        type=int_flag(),
        default=None,
        help=f"torch CPU threads ({DEFAULT_THREADS}: a second thread gained little on a quiet 2-core CPU and cost "
        "3x the time when another job ran; docs/TASKS.md)",
    )
    p.add_argument("--out", default=None, help=f"result JSON, written atomically ({DEFAULT_OUT}; not with --resume)")
    p.add_argument(
        "--figure", default=None, metavar="PATH", help="also draw score vs × dyn (cache bytes / dynamic's) to PATH (PNG)"
    )
    p.add_argument("--force", action="store_true", help="replace an existing --out / --figure file")
    p.add_argument(
        "--resume",
        default=None,
        metavar="FILE",
        help="continue a stopped run's result FILE in place (its settings and model; finished cells kept)",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="FILE",
        help="write one result (--out) from the results of runs split by task, context or candidates (one "
        "model, the same n and seed), and --figure of it; measures nothing",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the settings and output files and print the cells and caches the run would measure; load no "
        "model, write no file",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    p.add_argument("--list", action="store_true", help="list the tasks and exit")
    p.set_defaults(func=run)


def _config(args: argparse.Namespace):
    from kvlab.eval import tasks_suite as ts

    kw = {}
    if args.quick:
        kw.update(tasks=ts.QUICK_TASKS, candidates=ts.QUICK_CANDIDATES, n=5)
    if args.tasks is not None:
        names = ts.TASKS_ALL if args.tasks.strip() == "all" else parse_list(args.tasks, what="a task name")
        kw["tasks"] = tuple(names)
    if args.contexts is not None:
        kw["contexts"] = tuple(int_list(args.contexts, ts.MIN_CONTEXT))
    elif args.quick:
        kw["contexts"] = ts.TaskSuiteConfig.contexts[:1]
    if args.candidates is not None:
        sweep = args.candidates.strip() == "sweep"
        kw["candidates"] = (
            ts.SWEEP_CANDIDATES if sweep else tuple(parse_list(args.candidates, what="a cache name"))
        )
    if args.n is not None:
        kw["n"] = args.n
    for key in ("seed", "protected_tail", "max_drop", "min_float_score"):
        if getattr(args, key) is not None:
            kw[key] = getattr(args, key)
    cfg = ts.TaskSuiteConfig(**kw)
    _check_candidates_evict(cfg)
    return cfg


def _baseline_note(args: argparse.Namespace, cfg) -> None:
    """Say on stderr that the float baseline was added to ``--candidates`` (the run measures it first: every score
    is compared with it), in ``kvlab eval``'s words (:func:`kvlab.eval.candidates.baseline_note`)."""
    from kvlab.eval.candidates import baseline_note

    note = None if args.resume or args.candidates is None else baseline_note(cfg.candidates)
    if note:
        print(f"note: {note}", file=sys.stderr)


def _check_candidates_evict(cfg) -> None:
    """Refuse an evicting candidate that keeps at least the longest context (``sink:window_length=512`` at
    ``--contexts 512``): it compresses nothing before the question, is measured as DynamicCache and would pass.
    The same rule as ``kvlab eval``'s, on the context only: a task's cache is judged on what it keeps of the
    prefilled context (docs/TASKS.md).

    Raises:
        ValueError: naming the candidate, what it keeps and the longest context.
    """
    from kvlab.caches.registry import resolve

    longest = max(cfg.contexts)
    for name in cfg.candidates:
        keeps = resolve(name).keeps()  # the registry's: what the cache keeps at most, or None
        if keeps is not None and keeps.tokens >= longest:
            raise ValueError(
                f"cache candidate {name!r} keeps {keeps.tokens:,} tokens, not fewer than the longest context "
                f"({longest} tokens, --contexts): it would evict nothing of the context and measure "
                f"DynamicCache; give it a smaller budget or window, or longer --contexts"
            )


def _check_outputs(args: argparse.Namespace) -> str | None:
    for flag, path in (("--out", None if args.resume else _out(args)), ("--figure", args.figure)):
        if path is None:
            continue
        path = Path(path)
        # a folder, a missing folder (no new folders), or one that takes no files (/proc): before any work
        problem = output_problem(path, flag, folder_must_exist=True)
        if problem:
            return problem
        if path.exists() and not args.force:
            return file_exists_message(path)
        kind = ((".png",), "the figure is a PNG") if flag == "--figure" else ((".json",), "the result is JSON")
        problem = suffix_problem(flag, path, *kind)
        if problem:
            return problem
    if args.figure and Path(args.figure).resolve() == _out(args).resolve():
        return "--out and --figure name the same file; give each its own"
    return None


def _out(args: argparse.Namespace) -> Path:
    """The result file this run writes: ``--resume FILE`` in place, else ``--out`` (default :data:`DEFAULT_OUT`)."""
    return Path(args.resume or args.out or DEFAULT_OUT)


def _resumed(args: argparse.Namespace):
    """``(cfg, result)`` of ``--resume FILE``, made ready to continue (:func:`kvlab.eval.tasks_suite.prepare_resume`).

    Raises:
        ValueError: a setting flag given with it, a file that is not a stopped tasks result, or one a live
            ``kvlab tasks`` on this machine is writing (named).
    """
    from kvlab.eval.io import read_result
    from kvlab.eval.resume import refuse_live_run
    from kvlab.eval.tasks_schema import is_tasks_result
    from kvlab.eval.tasks_suite import prepare_resume

    if args.out is not None:
        raise ValueError(f"--resume writes {args.resume} in place; drop --out {args.out}")
    given = [k for k in _SETTING_FLAGS if getattr(args, k) is not None] + (["quick"] if args.quick else [])
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise ValueError(f"--resume continues {args.resume} with the settings it holds; drop {flag}")
    result = read_result(args.resume, tasks=True)
    if not is_tasks_result(result):
        raise ValueError(f"--resume {args.resume} is a kvlab eval result; resume it with kvlab eval --resume")
    try:
        refuse_live_run(args.resume, result, "kvlab tasks")
        cfg = prepare_resume(result)
    except ValueError as e:
        raise ValueError(f"cannot resume {args.resume}: {e}") from None
    return cfg, result


def run(args: argparse.Namespace) -> int:
    """``kvlab tasks``: list the tasks, merge results, print a ``--dry-run``, or measure. Exit 2 (nothing done) for a
    flag ``--list`` ignores, a bad setting, thread count, model or output file; the measurement's own status after."""
    from kvlab.tasks import TASKS

    if args.list:  # as roofline --list-gpus: a flag it would silently ignore is refused
        given = [k for k in (*_SETTING_FLAGS, "threads", "out", "figure", "resume", "merge") if getattr(args, k) is not None]
        given += [k for k in ("quick", "dry_run", "force", "json", "allow_past_limit") if getattr(args, k)]
        if given:
            flag = "--" + given[0].replace("_", "-")
            return fail(args, f"--list prints the tasks and exits; it takes no {flag} (drop --list to use it)")
        for name, spec in TASKS.items():
            print(f"{name:16s} {spec.haystack:6s} {spec.summary}")
        return EXIT_OK
    try:
        check_threads(args.threads)  # at most the CPUs this process may use
        if args.model is not None and not args.model.strip():  # '' is not "the bundled model"
            raise ValueError(f"--model must name a model, got {args.model!r}; leave it out for the bundled one")
        problem = empty_path_flag(args, "--out", "--resume", "--figure")  # '' is not "the default"
        if problem:
            raise ValueError(problem)
        if args.merge:
            return _merge(args)
        cfg, result = _resumed(args) if args.resume else (_config(args), None)
        _baseline_note(args, cfg)
        # before --dry-run too, which refuses what the run refuses before loading: a bad --dtype, a device this
        # machine lacks (CUDA), a model that is not there (as eval, inspect and bench: exit 2)
        block = _model_block(args, result)
        if block["name"] != "bundled":
            from kvlab.models import check_local_model

            check_local_model(block["name"])
        limit = configured_limit(None if block["name"] == "bundled" else block["name"])  # as its files state it
        problem = _past_limit(args, cfg, result, limit)
        if problem:
            raise ValueError(problem)
    except (ValueError, OSError) as e:  # OSError: FileNotFoundError, a hub id neither cached nor reachable
        return fail(args, e)
    problem = _check_outputs(args)
    if problem:
        return fail(args, problem, EXIT_USAGE)
    if args.dry_run:
        return _dry_run(args, cfg, result)
    return _with_threads(args.threads or DEFAULT_THREADS, lambda: _measure(args, cfg, result))


def _dry_run(args: argparse.Namespace, cfg, result: dict | None) -> int:
    """``--dry-run``: what the run (or the ``--resume`` of ``result``) would measure, on stdout (``--json``: one
    object); nothing loaded or written. What only the model can refute (a cache built for it, a task too long
    for a context) is checked by the run itself, after the load."""
    import json

    from kvlab.eval.tasks_suite import cells_to_measure

    cells = cells_to_measure(result or {"cells": [], "not_measured": []}, cfg)
    plan = {
        "model": result["model"]["name"] if result else args.model or "bundled",
        "cells": [{"task": t, "context": c} for t, c in cells],
        "caches": list(cfg.caches),
        "n": cfg.n,
        "out": str(_out(args)),
    }
    if args.json:
        print(json.dumps(plan, indent=1))
        return EXIT_OK
    print(
        f"dry run: {len(cells)} cells ({', '.join(f'{t}@{c}' for t, c in cells) or 'none left'}) x "
        f"{len(cfg.caches)} caches ({', '.join(cfg.caches)}), {cfg.n} samples each, model {plan['model']}; "
        f"would write {plan['out']} (checked after the model loads: each cache built for it, each task's fit)"
    )
    return EXIT_OK


def _with_threads(threads: int, work) -> int:
    """``work()`` with torch's CPU thread count set to ``threads``, the previous count restored after it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return work()
    finally:
        torch.set_num_threads(before)


def _merge(args: argparse.Namespace) -> int:
    """``--merge FILE ...``: one result of several (:func:`kvlab.eval.tasks_merge.merge_tasks_results`) to
    ``--out``, then its table. Raises ValueError / FileNotFoundError (bad or unreadable input, named)."""
    from kvlab.eval.io import read_result, write_json_atomic
    from kvlab.eval.tasks_merge import merge_tasks_results
    from kvlab.eval.tasks_schema import is_tasks_result, validate_tasks_result

    given = [k for k in _SETTING_FLAGS if getattr(args, k) is not None] + (["quick"] if args.quick else [])
    given += ["dry_run"] if args.dry_run else []
    for flag, on in (("--resume", args.resume), ("--out", args.out is None)):
        if on:
            raise ValueError(f"--merge {'needs' if flag == '--out' else 'takes no'} {flag}")
    if given:
        raise ValueError(f"--merge measures nothing; drop --{given[0].replace('_', '-')}")
    if len(args.merge) < 2:  # it said "got 1 and 1"
        raise ValueError(f"--merge needs two result files or more, got one: {args.merge[0]}")
    seen = [Path(f).resolve() for f in args.merge]
    for i, f in enumerate(args.merge):  # it said "niah_single_1 @ 512 is measured in both F and F"
        if seen[i] in seen[:i]:
            raise ValueError(f"--merge {f} is given twice; give each run's result once")
    if Path(args.out).resolve() in seen:  # --force replaced a part with the whole (kvlab report refuses it too)
        raise ValueError(f"--out {args.out} is one of the --merge files; the merge would replace its own input")
    results = [read_result(f, tasks=True) for f in args.merge]
    for f, r in zip(args.merge, results):
        if not is_tasks_result(r):
            raise ValueError(f"--merge {f} is a kvlab eval result, not a kvlab tasks result")
    problem = _check_outputs(args)
    if problem:
        return fail(args, problem, EXIT_USAGE)
    merged = merge_tasks_results(results, args.merge, _argv())
    problems = validate_tasks_result(merged)
    if problems:  # a bug of kvlab's, not of the input
        return fail(args, f"the merged result would not validate: {'; '.join(problems[:4])}", EXIT_FAILED)
    write_json_atomic(_out(args), merged)
    if args.figure and merged["cells"]:
        from kvlab.task_figures import plot_task_scores

        plot_task_scores(merged, args.figure)
    _print(args, merged, _out(args))
    return EXIT_OK


def _argv() -> list[str] | None:
    """The command line when kvlab runs as the ``kvlab`` script (None in-process)."""
    return ["kvlab", *sys.argv[1:]] if sys.argv and sys.argv[0].endswith("kvlab") else None


def _model_block(args: argparse.Namespace, result: dict | None) -> dict:
    """The run's ``model`` block (``--resume``: the result's, filled in place): ``name``, ``dtype`` and ``device``,
    the device resolved as eval and bench resolve it (cpu, cuda, cuda:N or auto; ``auto`` recorded as resolved;
    ``cuda`` refused on a machine without CUDA).

    Raises:
        ValueError: a device or dtype torch does not take, named ``device`` (--device) / --dtype
            (:func:`kvlab.commands.device_problem`, :func:`kvlab.commands.dtype_problem`).
    """
    from kvlab.runtime.device import resolve_device

    block = result["model"] if result else {"name": args.model or "bundled"}
    block.setdefault("dtype", "bfloat16" if args.dtype is None else args.dtype)  # '' is refused, not the default
    block.setdefault("device", "cpu" if args.device is None else args.device)
    problem = dtype_problem(block["dtype"]) or device_problem(block["device"])  # the one wording of every command
    if problem:
        raise ValueError(problem)
    block["device"] = str(resolve_device(block["device"]))
    return block


class _Saver:
    """Writes a run's result to ``path`` after every finished cell (and at its end or stop), validated first;
    ``provenance.wall_s`` is the earlier sessions' seconds (a resumed file's) plus this session's since its first
    save (just after the model loaded).

    Raises:
        RuntimeError: a result that would not validate (a bug of kvlab's, not of the input; the field named).
    """

    def __init__(self, path: Path, result: dict | None) -> None:
        self.path, self.started = path, None
        self.before = ((result or {}).get("provenance") or {}).get("wall_s") or 0.0

    def __call__(self, result: dict) -> None:
        from kvlab.eval.io import write_json_atomic
        from kvlab.eval.tasks_schema import validate_tasks_result

        self.started = self.started or time.time()
        result["provenance"]["wall_s"] = self.before + time.time() - self.started
        problems = validate_tasks_result(result)
        if problems:
            raise RuntimeError(f"the tasks result would not validate: {'; '.join(problems[:4])}")
        write_json_atomic(self.path, result)


def _measure(args: argparse.Namespace, cfg, result: dict | None) -> int:
    """Load the model, check it against the settings, run the cells (the file saved after each) and report. Ctrl-C
    or SIGTERM at any stage, the load included, is recorded as a stop (status ``stopped``, :func:`_stopped`), as
    ``kvlab eval`` records it; an exception in the run as a failure (status ``failed``, exit 1)."""
    from rich.console import Console

    from kvlab.eval.records import RunStage
    from kvlab.eval.tasks_suite import new_tasks_result

    model_block = _model_block(args, result)  # the names checked in run(), before --dry-run
    err, where, save = Console(stderr=True), RunStage(), _Saver(_out(args), result)
    try:
        with sigterm_raises():
            loaded = _load(args, cfg, result, model_block, err, where)
            if isinstance(loaded, int):
                return loaded
            # the file is written after the checks: a --resume of a file they refuse could never run either
            result = result or new_tasks_result(cfg, model_block, _argv())
            if args.allow_past_limit:  # a --resume of the file keeps it
                result["allow_past_limit"] = True
            where.set("run", "the run's start")
            return _run(args, cfg, result, loaded, err, save)
    except (KeyboardInterrupt, Terminated) as exc:
        return _stopped(args, result, exc, where, err, save)


def _load(args: argparse.Namespace, cfg, result: dict | None, model_block: dict, err, where) -> tuple[Any, Any] | int:
    """``(model, tokenizer)`` loaded and checked against ``cfg`` (:func:`_check_model`), or the exit code of a
    failure (2: a bad model name or a setting the model refutes; 1: it could not be read). ``where`` (a
    :class:`kvlab.eval.records.RunStage`) follows the stages for the record of an interrupt."""
    from kvlab.models import load_model

    name = None if model_block["name"] == "bundled" else model_block["name"]
    err.print(
        f"loading model {name or '(bundled reference model)'} in {model_block['dtype']} on "
        f"{model_block['device']} ...",
        highlight=False,
    )
    try:
        model, tokenizer = load_model(name, dtype=model_block["dtype"], device=model_block["device"])
    except (ValueError, FileNotFoundError) as e:
        return fail(args, e)
    except OSError as e:
        return fail(args, e, EXIT_FAILED)
    where.set("settings", "checking the settings against the loaded model")
    problem = _check_model(args, cfg, model, err, result)
    if problem:  # before the result file exists: a --resume of it could never run either
        return fail(args, problem, EXIT_USAGE)
    return model, tokenizer


def _run(args: argparse.Namespace, cfg, result: dict, loaded: tuple[Any, Any], err, save: _Saver) -> int:
    """Run the cells of ``result`` still to measure (:func:`kvlab.eval.tasks_suite.run_suite`), saving after each,
    and report; an exception is recorded by ``run_suite`` (status ``failed``, the cell) and exits 1, an interrupt
    (recorded by it as a stop) propagates to :func:`_measure`."""
    from kvlab.eval.tasks_suite import cells_to_measure, run_suite
    from kvlab.models import heldout_text

    model, tokenizer = loaded
    save(result)  # status "running" before the first cell
    try:
        with progress(err, len(cells_to_measure(result, cfg)), "kvlab tasks") as bar:
            run_suite(
                model, tokenizer, cfg, heldout_text(), bar.describe, result=result, save=save, advance=bar.advance
            )
    except Exception as exc:  # recorded by run_suite: failed, the cell, the error
        try:
            save(result)
        except RuntimeError as bug:
            return fail(args, f"{type(exc).__name__}: {exc}; not saved: {bug}", EXIT_FAILED)
        kept = f"{len(result['cells'])} finished cells kept in {save.path}; continue with --resume {save.path}"
        return fail(args, f"{type(exc).__name__}: {exc} ({kept})", EXIT_FAILED)
    save(result)
    return _finish(args, result, save.path)


def _stopped(args: argparse.Namespace, result: dict | None, exc: BaseException, where, err, save: _Saver) -> int:
    """Record a stop (Ctrl-C, SIGTERM) at ``where`` (:func:`kvlab.eval.records.stop_run`, "interrupted during
    <what>"; ``run_suite`` records one in the run itself, with its cell), write the file, print the table of the
    finished cells (when the run had started) and one line saying where it stopped, what is kept and how to
    continue; returns the shell's status for the signal (130 for Ctrl-C, 143 for SIGTERM). A new run stopped
    before its file exists (while loading the model) writes nothing and says so."""
    from kvlab.eval.records import stop_run

    record = result if result is not None else {"failures": []}
    if record.get("status") != "stopped":
        stop_run(record, where.stage, exc, where.words)
    message = record["failures"][-1]["message"]
    if result is None:
        err.print(f"stopped: {message}; nothing measured, no file written", markup=False)
        return stop_exit_code(exc)
    try:
        save(result)
    except RuntimeError as bug:
        return fail(args, f"stopped: {message}; not saved: {bug}", EXIT_FAILED)
    if where.stage == "run" and result["cells"]:
        _print(args, result, save.path)
    err.print(
        f"stopped: {message}; in {save.path}: {len(result['cells'])} finished cells kept; continue with: "
        f"kvlab tasks --resume {save.path}",
        markup=False,
    )
    return stop_exit_code(exc)


def _finish(args: argparse.Namespace, result: dict, path: Path) -> int:
    """The figure and the table of a finished run; exit 1 when it measured nothing (status failed)."""
    if result["status"] == "failed":  # nothing measured (run_suite says why): neither complete nor drawable
        failure = result["failures"][-1]["message"]
        return fail(
            args, f"{failure}; {path} records it" + (", no figure drawn" if args.figure else ""), EXIT_FAILED
        )
    if args.figure:
        from kvlab.task_figures import plot_task_scores

        plot_task_scores(result, args.figure)
    _print(args, result, path)
    return EXIT_OK


def _check_model(args: argparse.Namespace, cfg, model: Any, err, result: dict | None) -> str | None:
    """What only the loaded model can refute, before any file is written: contexts past its
    ``max_position_embeddings`` (:func:`_past_limit`) and the first candidate it refutes (one cache of each is built
    for its config: a mixed-<plan> for another layer count, ...), named with the reason."""
    from kvlab.caches.registry import resolve
    from kvlab.eval.model_info import model_max_positions

    problem = _past_limit(args, cfg, result, model_max_positions(model), err)
    if problem:
        return problem
    for name in cfg.caches:
        cache = resolve(name)
        if cache.unavailable_reason():
            continue  # skipped by the run, the reason in the result
        try:
            cache.make(model.config)
        except (ValueError, TypeError) as e:
            return f"--candidates {name} does not fit this model: {e}"
    return None


# what a context past the model's positions measures (kvlab.lab.longrun.position_refusal / position_warning)
PAST_LIMIT = "its cells measure positions the model was not trained on, which says little of a cache for it"


def _allows_past_limit(args: argparse.Namespace, result: dict | None) -> bool:
    """``--allow-past-limit`` given now, or recorded by the run a ``--resume`` continues (``allow_past_limit``)."""
    return bool(args.allow_past_limit or (result or {}).get("allow_past_limit"))


def _past_limit(args: argparse.Namespace, cfg, result: dict | None, limit: int | None, err=None) -> str | None:
    """The refusal of ``--contexts`` past the model's ``max_position_embeddings`` (``limit``, tokens; None: it
    states none), as ``kvlab eval`` and ``kvlab lab --real`` refuse it (:func:`kvlab.lab.longrun.position_refusal`:
    the longest context, echoed plain as a ``--contexts`` item, the longest that fits, ``--allow-past-limit``);
    None within the limit, or when the run allows it (:func:`_allows_past_limit`): then each context past it is
    warned about on ``err`` (when given). The context is what is checked: the question and the answer (tens of
    tokens) are appended after it."""
    from kvlab.lab.longrun import position_refusal, position_warning

    if not _allows_past_limit(args, result):
        return position_refusal(
            "--contexts", max(cfg.contexts), limit, PAST_LIMIT, "--allow-past-limit", list_flag=True
        )
    for context in cfg.contexts if err is not None else ():
        warning = position_warning("--contexts", context, limit, PAST_LIMIT, list_flag=True)
        if warning:
            err.print(f"warning: {warning}", highlight=False)
    return None


def _print(args: argparse.Namespace, result: dict, path: Path) -> None:
    import json

    if args.json:
        print(json.dumps(result, indent=1))
        return
    from rich.console import Console

    from kvlab.eval.tasks_render import print_tasks_table

    console = Console()
    print_tasks_table(result, console)
    console.print(f"result: {path}" + (f", figure: {args.figure}" if args.figure else ""))
