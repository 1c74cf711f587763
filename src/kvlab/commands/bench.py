"""``kvlab bench``: run a benchmark and save its result record, or regenerate ``docs/PERFORMANCE.md``.

``kvlab bench {decode,memory,flush,kernel,paging,lab} [--json] [--quick] [--device D] [options]`` runs
``kvlab.bench.<name>.run`` and writes a record to ``<results-dir>/<name>-<device>.json`` atomically, the name
carrying what sets the run apart (``--candidates``, ``--threads``, ``--quick``:
``decode-cpu-dynamic+fp8-e4m3-1thread.json``, :func:`kvlab.bench.results.run_tags`); ``--results-dir`` defaults
to ``./kvlab-results`` in the current directory, never a checkout's tracked ``benchmarks/results`` unless asked
(``--results-dir benchmarks/results``, as ``benchmarks/run_all.sh`` does). An existing file is kept unless
``--force`` (or use ``--out``). A run whose target is not met exits 1 (the exit table of :mod:`kvlab.commands`),
after printing and saving its record. ``kvlab bench docs`` renders the records of ``benchmarks/results`` into
``docs/PERFORMANCE.md``. Logic lives in :mod:`kvlab.bench`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from kvlab.cache_names import KIVI_DEFAULTS
from kvlab.caches.settings import HQQ_GROUP_SIZE
from kvlab.commands import (
    EXIT_FILE_EXISTS,
    add_command_group,
    device_problem,
    dtype_problem,
    empty_path_flag,
    fail,
    file_exists_message,
    flag_values,
    output_folder_problem,
    suffix_problem,
)
from kvlab.runtime.atomic import output_problem
from kvlab.runtime.checks import int_flag, int_list, parse_list

# records of a run go here (relative to the current directory) unless --results-dir/--out say otherwise: never into
# the package source or a checkout's tracked benchmarks/results/ without being asked
DEFAULT_RESULTS_DIR = "kvlab-results"
DEFAULT_PAGE = "docs/PERFORMANCE.md"  # kvlab bench docs' page: its folder is made when missing (its own default)

# options that do not change the numbers: left out of the recorded command
_NOT_IN_COMMAND = {"json", "force", "no_save", "out", "results_dir", "note", "func", "bench_command"}


def _common(p: argparse.ArgumentParser, device: bool = True) -> None:
    p.add_argument("--json", action="store_true", help="print the result record as JSON")
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes: a smoke run (file gets -quick); targets are shown, not judged (exit 0 when every row "
        "ran)",
    )
    if device:
        p.add_argument(
            "--device", default="auto", help="cpu, cuda, cuda:N or auto (default: cuda if available)"
        )
    p.add_argument("--threads", type=int_flag(), default=None, help="torch.set_num_threads before running")
    p.add_argument(
        "--results-dir",
        default=DEFAULT_RESULTS_DIR,
        help=f"where records go (default ./{DEFAULT_RESULTS_DIR}, made on a first run; a checkout's tracked records: "
        "--results-dir benchmarks/results); a new folder is made only in a folder that exists",
    )
    p.add_argument(
        "--out",
        default=None,
        help="record path (default <results-dir>/<name>-<device>[-<candidates>][-<N>threads][-quick].json, each "
        "part only when its flag is given), in a folder that exists",
    )
    p.add_argument("--force", action="store_true", help="replace an existing record")
    p.add_argument("--no-save", action="store_true", help="print only, write no record")
    p.add_argument("--note", default=None, help="free text stored in the record (e.g. 'shared 2-core VM')")


def _cache_settings(p: argparse.ArgumentParser, hqq: bool = True) -> None:
    """The caches' settings: --hqq-group-size (with ``hqq``: benchmarks that run HQQ/quanto caches), the KIVI
    --group-size and --residual-length."""
    if hqq:
        p.add_argument(
            "--hqq-group-size",
            type=int_flag(),
            default=HQQ_GROUP_SIZE,
            help=f"HQQ/quanto group size (default {HQQ_GROUP_SIZE})",
        )
    G, R = KIVI_DEFAULTS.group_size, KIVI_DEFAULTS.residual_length
    p.add_argument("--group-size", type=int_flag(), default=G, help=f"KIVI group size G (default {G})")
    p.add_argument(
        "--residual-length", type=int_flag(), default=R, help=f"residual window R, all caches (default {R})"
    )


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="model directory, GGUF file, named model (kvlab models) or HF id (default: the bundled model)",
    )
    p.add_argument("--dtype", default="bfloat16", help="model dtype (default bfloat16)")
    p.add_argument(
        "--candidates", type=parse_list, default=None, help="caches, comma-separated (default: all)"
    )
    p.add_argument("--contexts", type=int_list, default=None, help="context lengths, comma-separated")
    p.add_argument("--prefill-chunk", type=int_flag(), default=1024, help="prefill chunk in tokens (default 1024)")
    _cache_settings(p)


def register(subparsers) -> None:
    """Add ``kvlab bench`` to ``subparsers``: the runs decode, memory, flush, kernel, paging and lab (each saves a
    record; its parser is its ``_parser`` default, which :func:`command_line` reads) and ``docs``."""
    sub = add_command_group(
        subparsers,
        "bench",
        help="benchmarks: decode speed, decode memory, flush cost, kernel bandwidth, paging, lab; PERFORMANCE.md",
        description="Run one benchmark and save its result record under ./kvlab-results/ (--results-dir, --out), "
        "or regenerate docs/PERFORMANCE.md from the records in benchmarks/results (`kvlab bench docs`).",
        dest="bench_command",
        metavar="{decode,memory,flush,kernel,paging,lab,docs}",
    )
    runs = (*_add_model_benchmarks(sub), *_add_layer_benchmarks(sub), *_add_simulator_benchmarks(sub))
    for parser in runs:
        parser.set_defaults(_parser=parser)
    _add_docs(sub)


def _add_model_benchmarks(sub) -> tuple[argparse.ArgumentParser, ...]:
    """``decode`` and ``memory``: benchmarks that run a model through every cache."""
    d = sub.add_parser("decode", help="ms/token against context for every cache (ratios to dynamic)")
    _model_args(d)
    d.add_argument("--steps", type=int_flag(), default=16, help="timed single-token forwards per cell (default 16)")
    d.add_argument("--warmup", type=int_flag(), default=3, help="untimed forwards per cell (default 3)")
    d.add_argument(
        "--profile-context", type=int_flag(), default=None, help="also profile one decode step at T tokens"
    )
    d.add_argument(
        "--cpu-matmul",
        choices=("auto", "native", "float32"),
        default="auto",
        help="CPU only: a bf16/fp16 model's Linear layers and SDPA in float32 on its values (float32), torch's own "
        "kernels (native), or float32 where the CPU emulates the dtype (auto, default; as kvlab eval)",
    )
    _common(d)
    d.set_defaults(func=_run, bench="decode")

    m = sub.add_parser(
        "memory", help="decode-phase transient bytes per cache (peak during a step - retained)"
    )
    _model_args(m)
    m.add_argument("--warmup", type=int_flag(), default=2, help="untimed decode steps before measuring (default 2)")
    m.add_argument("--no-flush-step", action="store_true", help="skip measuring the next flushing step")
    _common(m)
    m.set_defaults(func=_run, bench="memory")
    return d, m


def _add_layer_benchmarks(sub) -> tuple[argparse.ArgumentParser, ...]:
    """``flush`` and ``kernel``: benchmarks of one attention layer's cache or kernel on random tensors."""
    f = sub.add_parser("flush", help="time of a flushing append against history length (KIVI vs HF)")
    f.add_argument("--contexts", type=int_list, default=None, help="history lengths, comma-separated")
    f.add_argument("--caches", type=parse_list, default=None, help="kivi4,kivi2,hqq4,quanto4 (default)")
    f.add_argument("--kv-heads", type=int_flag(), default=8, help="KV heads of the layer (default 8)")
    f.add_argument("--head-dim", type=int_flag(), default=128, help="head_dim (default 128)")
    f.add_argument("--dtype", default="bfloat16", help="state dtype (default bfloat16)")
    f.add_argument("--reps", type=int_flag(), default=25, help="timed rounds for KIVI (default 25)")
    f.add_argument("--hf-reps", type=int_flag(), default=3, help="timed rounds for HQQ/quanto (default 3)")
    _cache_settings(f)
    _common(f)
    f.set_defaults(func=_run, bench="flush")

    k = sub.add_parser("kernel", help="GB/s of the KIVI decode attention and SDPA vs copy bandwidth")
    k.add_argument("--contexts", type=int_list, default=None, help="tokens of the layer, comma-separated")
    k.add_argument("--q-heads", type=int_flag(), default=32, help="query heads (default 32)")
    k.add_argument("--kv-heads", type=int_flag(), default=8, help="KV heads (default 8)")
    k.add_argument("--head-dim", type=int_flag(), default=128, help="head_dim (default 128)")
    k.add_argument("--dtype", default="bfloat16", help="dtype (default bfloat16)")
    k.add_argument(
        "--nbits", type=int_list, default=[4, 2], help="KIVI bit widths, comma-separated (default 4,2)"
    )
    k.add_argument("--reps", type=int_flag(), default=11, help="timed samples per kernel (default 11)")
    k.add_argument(
        "--backend",
        default="auto",
        help="kivi_attention backend: auto, torch, cpu-kernel or triton (default auto)",
    )
    k.add_argument(
        "--copy-mib", type=int_flag(), default=None, help="copy-probe size in MiB (default 256 CPU, 1024 CUDA)"
    )
    _cache_settings(k, hqq=False)  # the KIVI kernel alone
    _common(k)
    k.set_defaults(func=_run, bench="kernel")
    return f, k


def _add_simulator_benchmarks(sub) -> tuple[argparse.ArgumentParser, ...]:
    """``paging`` and ``lab``: the paging simulator's speed and the toy decoder's cached-decoding speedup."""
    g = sub.add_parser("paging", help="paging simulator speed: static admission time, simulated events/s")
    g.add_argument(
        "--static-requests", type=int_flag(), default=1_000_000, help="static admission requests (1,000,000)"
    )
    g.add_argument("--sim-requests", type=int_flag(), default=2000, help="simulated requests (default 2000)")
    g.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals per engine step (default 2.0)")
    _common(g, device=False)
    g.set_defaults(func=_run, bench="paging")

    lab = sub.add_parser("lab", help="toy decoder speedup of KV-cached decoding over full recompute")
    lab.add_argument("--kv-heads", type=int_flag(), default=2, help="KV heads of the toy decoder (default 2)")
    lab.add_argument("--new-tokens", type=int_flag(), default=192, help="tokens generated (default 192)")
    lab.add_argument("--repeat", type=int_flag(), default=3, help="timed runs of each generator (default 3)")
    lab.add_argument("--no-append", action="store_true", help="skip the append-cost measurement")
    _common(lab, device=False)
    lab.set_defaults(func=_run, bench="lab")
    return g, lab


def _add_docs(sub) -> None:
    doc = sub.add_parser("docs", help="regenerate docs/PERFORMANCE.md from benchmarks/results/*.json")
    doc.add_argument(
        "--results-dir", default="benchmarks/results", help="records to render (benchmarks/results)"
    )
    doc.add_argument(
        "--out", default=DEFAULT_PAGE, help=f"page to write ({DEFAULT_PAGE}; another page in a folder that exists)"
    )
    doc.add_argument("--include-quick", action="store_true", help="also render --quick records")
    doc.add_argument("--force", action="store_true", help="replace a page not generated by this command, or edited since (refused otherwise)")
    doc.add_argument("--json", action="store_true", help="print the target verdicts as JSON")
    doc.set_defaults(func=_docs)


def command_line(args: argparse.Namespace) -> str:
    """The canonical command that reproduces ``args``: ``kvlab bench <name>`` plus every option whose value
    differs from its default (output-only options left out)."""
    parser = args._parser
    words = ["kvlab", "bench", args.bench]
    for action in parser._actions:
        dest = action.dest
        if not action.option_strings or dest in _NOT_IN_COMMAND or dest == "help":
            continue
        value = getattr(args, dest, None)
        if value == action.default:
            continue
        flag = action.option_strings[-1]
        if isinstance(value, bool):
            words.append(flag)
        elif isinstance(value, list):
            words += [flag, ",".join(str(v) for v in value)]
        else:
            words += [flag, str(value)]
    return shlex.join(words)


def _kwargs(args: argparse.Namespace) -> dict:
    """``run()`` keyword arguments of benchmark ``args.bench``.

    Raises:
        ValueError: a cache setting (``--group-size`` ...) no family reading it takes."""
    from kvlab.caches.registry import CacheSettings

    b = args.bench
    kw: dict = {"quick": args.quick}
    if b in ("decode", "memory", "flush", "kernel"):
        kw["device"] = args.device
    if b in ("decode", "memory"):
        kw |= flag_values(args, "model", "dtype", "contexts", "warmup")
        settings = flag_values(args, "group_size", "residual_length", "hqq_group_size")
        kw["cache_settings"] = CacheSettings(**settings)
        kw["prefill_chunk_tokens"] = args.prefill_chunk
        if args.candidates:
            kw["candidates"] = tuple(args.candidates)
    if b == "decode":
        kw |= flag_values(args, "steps", "profile_context", "cpu_matmul")
    elif b == "memory":
        kw["flush_step"] = not args.no_flush_step
    elif b == "flush":
        kw |= flag_values(args, "contexts", "kv_heads", "head_dim", "dtype", "reps", "hf_reps")
        kw |= flag_values(args, "group_size", "residual_length", "hqq_group_size")
        if args.caches:
            kw["caches"] = tuple(args.caches)
    elif b == "kernel":
        kw |= flag_values(args, "contexts", "q_heads", "kv_heads", "head_dim", "dtype", "nbits", "reps")
        kw |= flag_values(args, "group_size", "residual_length", "backend")
        kw["copy_bytes"] = None if args.copy_mib is None else args.copy_mib * 2**20
    elif b == "paging":  # --quick sizes: kvlab.bench.paging.QUICK
        kw |= flag_values(args, "static_requests", "sim_requests") | {"rate_per_step": args.rate}
    elif b == "lab":  # --quick sizes: kvlab.bench.lab.QUICK
        kw |= flag_values(args, "kv_heads", "new_tokens", "repeat", "threads")
        kw["append"] = not args.no_append
    return kw


# the sizes each benchmark's run(quick=True) replaces with its smoke-run values (argparse dests)
QUICK_SIZES = {
    "decode": ("steps", "warmup"),
    "memory": ("warmup",),
    "flush": ("reps", "hf_reps"),
    "kernel": ("reps",),
    "paging": ("static_requests", "sim_requests"),
    "lab": ("new_tokens", "repeat", "no_append"),
}


def _quick_overrides(args: argparse.Namespace) -> list[str]:
    """The size flags given (changed from their defaults) that ``--quick`` would silently replace."""
    if not args.quick:
        return []
    parser = args._parser
    flags = {a.dest: a.option_strings[-1] for a in parser._actions if a.option_strings}
    return [flags[d] for d in QUICK_SIZES.get(args.bench, ()) if getattr(args, d) != parser.get_default(d)]


def _flag_problem(args: argparse.Namespace) -> str | None:
    """Why the flags cannot run (bad input, exit 2), found before any work: an empty --results-dir or --out
    (:func:`kvlab.commands.empty_path_flag`), --threads, --copy-mib or --prefill-chunk < 1 (--copy-mib named in
    MiB, as given, not in the bytes the benchmark takes), a size --quick would ignore, --out/--force with
    --no-save (--results-dir too), a --device this machine cannot run (:func:`kvlab.commands.device_problem`), a
    --dtype no model runs in (:func:`kvlab.commands.dtype_problem`), a
    --model that cannot be loaded (a path that is not there, a hub id offline and not cached:
    :func:`kvlab.models.check_local_model`); None when they can."""
    empty = empty_path_flag(args, "--results-dir", kind="folder") or empty_path_flag(args, "--out")
    if empty:  # '' was the current folder (--results-dir) or "not given" (--out)
        return empty
    if args.threads is not None and args.threads < 1:
        return f"--threads must be >= 1, got {args.threads}"
    device = device_problem(args.device) if hasattr(args, "device") else None  # the wording of eval, tasks
    device = device or (dtype_problem(args.dtype) if hasattr(args, "dtype") else None)  # of every --dtype
    if device:
        return device
    for flag in ("copy_mib", "prefill_chunk"):  # --prefill-chunk 0 failed every row in range(), exit 1
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            return f"--{flag.replace('_', '-')} must be >= 1, got {value}"
    overridden = _quick_overrides(args)
    if overridden:
        return (
            f"--quick sets its own sizes, so {', '.join(overridden)} would be ignored: drop --quick to choose "
            f"{'it' if len(overridden) == 1 else 'them'}"
        )
    given = [f for f, on in (("--out", args.out), ("--force", args.force)) if on]
    given += ["--results-dir"] if args.results_dir != DEFAULT_RESULTS_DIR else []
    if args.no_save and given:  # each only steers the record --no-save does not write
        return f"{given[0]} has no effect with --no-save, which writes no record"
    unused = _unused_hqq_group_size(args)
    if unused:
        return unused
    if getattr(args, "model", None) is not None:
        from kvlab.models import check_local_model

        try:
            check_local_model(args.model)
        except (OSError, ValueError) as exc:
            return str(exc)
    return None


def _unused_hqq_group_size(args: argparse.Namespace) -> str | None:
    """Why a --hqq-group-size given (changed from its default) would be ignored: no cache of --caches /
    --candidates takes it (as ``kvlab eval`` refuses a cache flag no candidate takes); None otherwise, and for names
    the registry does not know (the benchmark names those)."""
    from kvlab.caches.registry import resolve

    value = getattr(args, "hqq_group_size", HQQ_GROUP_SIZE)
    names = getattr(args, "caches", None) or getattr(args, "candidates", None)
    if value == HQQ_GROUP_SIZE or not names:
        return None
    try:
        takes = any("hqq_group_size" in resolve(name).entry.reads for name in names)
    except ValueError:
        return None
    flag = "--caches" if getattr(args, "caches", None) else "--candidates"
    return None if takes else (
        f"--hqq-group-size {value} applies to no cache of {flag} {','.join(names)} (only HQQ/quanto caches take "
        "it); drop the flag or add such a cache"
    )


def _with_flags(args: argparse.Namespace, exc: Exception) -> Exception | str:
    """A benchmark's error names the flag beside the setting, as eval's do: "`group_size` must ..." ->
    "`group_size` (--group-size) must ..." (each setting a flag of this benchmark's parser, named once); an error
    naming no setting is returned as it is (:func:`kvlab.commands.fail` words a damaged model folder's)."""
    message = str(exc)
    for action in args._parser._actions:
        if action.option_strings and f"`{action.dest}`" in message and f"`{action.dest}` (--" not in message:
            message = message.replace(f"`{action.dest}`", f"`{action.dest}` ({action.option_strings[-1]})", 1)
    return exc if message == str(exc) else message


def _record_path(args: argparse.Namespace):
    """``(path, problem)``: the record file this run writes (None with ``--no-save``) and why it cannot be
    written (None when it can), found before minutes of measuring: a record that exists (without ``--force``),
    or an output path :func:`kvlab.runtime.atomic.output_problem` refuses. One rule for output folders, as in
    kvlab report, tasks, paging, inspect, eval and figures: ``--out FILE`` is written only in a folder that
    exists, and ``--results-dir DIR`` is made if new but only in a folder that exists
    (:func:`kvlab.commands.output_folder_problem`), so a typo'd path makes no folders; the default
    ``./kvlab-results`` is made on a first run.

    Raises:
        ValueError, RuntimeError: from :func:`kvlab.bench.results.run_tags` / ``default_path``.
    """
    from pathlib import Path

    from kvlab.bench import results

    if args.no_save:
        return None, None
    tags = results.run_tags(getattr(args, "candidates", None), args.threads)
    device = getattr(args, "device", "cpu")
    path = results.default_path(args.results_dir, args.bench, device, args.quick, tags)
    if args.out:
        path = Path(args.out)
    if path.exists() and not path.is_dir() and not args.force:
        return path, file_exists_message(path, "--out to choose another file")
    if args.out:
        return path, output_problem(path, "--out", folder_must_exist=True) or suffix_problem(
            "--out", path, (".json",), "the record is JSON, and kvlab bench docs reads *.json"
        )
    return path, output_folder_problem(args.results_dir, "--results-dir") or output_problem(path, "--results-dir")


def _run(args: argparse.Namespace) -> int:
    import importlib

    import torch
    from rich.console import Console

    from kvlab.bench import results

    err = Console(stderr=True)
    problem = _flag_problem(args)
    if problem:
        return fail(args, problem)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        path, problem = _record_path(args)
    except (ValueError, RuntimeError) as e:
        return fail(args, _with_flags(args, e))
    if problem:
        return fail(args, problem)  # a record that exists is bad input like any other (EXIT_FILE_EXISTS)
    module = importlib.import_module(f"kvlab.bench.{args.bench}")
    try:
        kw = _kwargs(args)
        if args.bench in ("decode", "memory", "flush", "kernel"):
            kw["progress"] = lambda msg: err.print(f"[dim]{msg}[/dim]")
        result = module.run(**kw)
    except (ValueError, FileNotFoundError) as e:
        return fail(args, _with_flags(args, e))
    record = results.make_record(args.bench, result, command_line(args), args.quick, args.note)
    code = 0
    if path is not None:
        try:
            results.write_record(path, record, force=args.force)
            err.print(f"wrote {path}")
        except (
            OSError
        ) as exc:  # measured, then the folder refused the file: print the result, say what failed
            err.print(
                f"[red]error: could not write the record {path} ({exc.strerror or exc}); the result follows[/]"
            )
            path, code = None, 1
    if args.json:
        print(json.dumps(record, indent=1))
    else:
        _print(record, path)
    failed = every_row_failed(result)
    if failed:  # nothing measured: the record says why, and so does the exit status
        fail(args, f"every row failed ({failed})")
        code = 1
    for t in _verdicts(record, None):  # a busy machine: shown, not judged, as at --quick sizes
        if t["status"] == "not judged":
            print(f"note: target not judged, the machine was busy: {t['description']}", file=sys.stderr)
    unmet = unmet_targets(record)
    if args.quick:  # a smoke run: sizes and rounds too small to judge a target, which the record still shows
        for t in unmet:
            print(f"note: target not met at --quick sizes (not judged): {t['description']}", file=sys.stderr)
        return code
    for t in unmet:  # the exit table: 1 = the command ran and a target was not met
        fail(args, f"target not met: {t['description']} ({t['detail']})")
    return 1 if unmet else code


def every_row_failed(result: object) -> str | None:
    """The first row's error when a benchmark result has ``rows`` and every one has status ``failed``
    (:func:`kvlab.bench.cells.failed_cell`: e.g. ``--backend triton`` on a CPU), else None."""
    rows = result.get("rows") if isinstance(result, dict) else None
    if not isinstance(rows, list) or not rows:
        return None
    if not all(isinstance(r, dict) and r.get("status") == "failed" for r in rows):
        return None
    return str(rows[0].get("error") or "no error recorded")


def _verdicts(record: dict, path) -> list[dict]:
    """The target verdicts of this record (:func:`kvlab.bench.docs.targets`), without the GPU targets listed as not
    measured for want of a CUDA record elsewhere."""
    from pathlib import Path

    from kvlab.bench import docs

    name = Path(path).name if path else "(not saved)"
    return [t for t in docs.targets([(Path(name), record)]) if t["file"] != "-"]


def unmet_targets(record: dict) -> list[dict]:
    """The verdicts of ``record`` whose status is ``not met`` (each makes ``kvlab bench`` exit 1)."""
    return [t for t in _verdicts(record, None) if t["status"] == "not met"]


def _print(record: dict, path) -> None:
    from rich.markdown import Markdown

    from kvlab.bench import docs
    from kvlab.runtime.console import stdout_console

    console = stdout_console()
    console.print(Markdown(docs.RENDER[record["benchmark"]](record["result"])))
    for warning in record["result"].get("warnings") or ():  # a busy machine (kvlab.runtime.timing.busy_warnings)
        console.print(f"[yellow]warning: {warning}[/]")
    for t in _verdicts(record, path):
        console.print(f"target: {t['description']}: [bold]{t['status']}[/bold] ({t['detail']})")


def _docs(args: argparse.Namespace) -> int:
    """``kvlab bench docs``: render the records of ``--results-dir`` into the ``--out`` page. A page other than
    the default is written only in a folder that exists (the one rule of :func:`_record_path`); the default
    ``docs/PERFORMANCE.md`` gets its folder made."""
    from pathlib import Path

    from rich.console import Console

    from kvlab.bench import docs
    from kvlab.bench.results import read_records

    err = Console(stderr=True)
    problem = (
        empty_path_flag(args, "--results-dir", kind="folder")  # '' read the current folder's records
        or empty_path_flag(args, "--out")
        or output_problem(args.out, "--out", folder_must_exist=args.out != DEFAULT_PAGE)  # no folders by typo
        # an existing page without --force is judged first by write_page (refused unless this command wrote it),
        # as every writer refuses an existing file before its suffix
        or (None if Path(args.out).exists() and not args.force else suffix_problem("--out", args.out, (".md",), "the page is Markdown"))
    )
    if problem:
        return fail(args, problem)
    try:
        out = docs.write_page(args.results_dir, args.out, include_quick=args.include_quick, force=args.force)
        verdicts = docs.targets(read_records(args.results_dir, include_quick=args.include_quick))
    except FileExistsError as e:
        return fail(args, e, EXIT_FILE_EXISTS)
    except ValueError as e:
        return fail(args, e)
    if args.json:
        print(json.dumps({"out": str(out), "targets": verdicts}, indent=1))
    else:
        err.print(f"wrote {out}")
        _print_verdicts(verdicts)
    return 0


def _print_verdicts(verdicts: list[dict]) -> None:
    """The target verdicts under the record each comes from (two decode records, at 1 and 2 threads, judge the
    same targets: each line once under its file, not the same line twice with nothing telling them apart)."""
    import itertools

    for (name, device), group in itertools.groupby(verdicts, key=lambda t: (t["file"], t["device"])):
        print(f"{'no record' if name == '-' else name} ({device}):")
        for t in group:
            print(f"  {t['status']:>14}  {t['description']}  [{t['detail']}]")
