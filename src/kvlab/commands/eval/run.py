"""One ``kvlab eval`` run, from the parsed flags to the exit code: the result file (new, or ``--resume``d), the
model loaded and checked, the run with every finished cell written, and the report. Ctrl-C or SIGTERM at any stage
after the plan is written (the model's load included) is recorded as a stop (status ``stopped``), not a failure."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

from kvlab.commands import (
    EXIT_FAILED,
    EXIT_FILE_EXISTS,
    EXIT_USAGE,
    Terminated,
    configured_limit,
    device_problem,
    dtype_problem,
    empty_path_flag,
    fail,
    output_folder_problem,
    progress,
    sigterm_raises,
    stop_exit_code,
)
from kvlab.commands.eval.settings import config_from_args, with_flags
from kvlab.eval.records import RunStage  # torch-free

# the `kvlab eval` parser's defaults of every flag that --resume refuses (dest -> default), filled at registration:
# a resumed run takes its settings, label and folder from its result file
RESUME_IGNORES: dict = {}


def run(args: argparse.Namespace) -> int:
    """``kvlab eval``: refuse bad input before any work (exit 2), write the plan to ``<--out-dir>/<label>.json``,
    then run it (or stop there with ``--dry-run``). ``--out-dir`` is made if it is new, but only in a folder that
    exists (:func:`kvlab.commands.output_folder_problem`): the default ``results/`` is made on a first run, a
    typo'd ``/tmp/reslts/run1`` is refused."""
    from rich.console import Console

    err = Console(stderr=True)
    if args.resume is not None:
        return _resume(args, err)
    from kvlab.eval.io import ensure_writable, result_path, write_json_atomic
    from kvlab.eval.model_info import context_limit_problem, context_limit_warnings
    from kvlab.eval.records import set_status
    from kvlab.eval.runner import new_result

    label = args.label
    if label is None:
        label = "eval-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    # '' would be the current folder; a new --out-dir is made in a folder that exists (results/ on a first run)
    problem = empty_path_flag(args, "--out-dir", kind="folder") or output_folder_problem(args.out_dir, "--out-dir")
    problem = problem or dtype_problem(args.dtype)  # the wording of every --dtype (the config's check words it alike)
    if problem:
        return fail(args, problem)
    try:
        cfg = config_from_args(args)
        path = result_path(args.out_dir, label)
        try:
            ensure_writable(path, args.force)
        except FileExistsError as exc:
            raise FileExistsError(_exists_message(path, exc)) from None
        # --dry-run too: it refuses what the run refuses before loading (a device this machine lacks, a model
        # that is not there); a path that is not there is bad input (exit 2), as in kvlab lab / inspect / bench
        problem = device_problem(cfg.device) or _model_problem(cfg.model)
        limit = None if problem else configured_limit(cfg.model)
        problem = problem or context_limit_problem(cfg, limit)  # past the model's positions: --allow-past-limit
        if problem:
            return fail(args, problem)
        try:
            path.parent.mkdir(exist_ok=True)  # fail now, not after loading the model (its parent exists: checked)
        except OSError as exc:  # a file where the folder (or a parent of it) should be, no permission, ...
            reason = exc.strerror or exc
            if isinstance(exc, (FileExistsError, NotADirectoryError)):
                reason = "a file is in the way of the folder"
            return fail(args, f"--out-dir {args.out_dir}: cannot create the folder ({reason})")
    except FileExistsError as exc:
        return fail(args, exc, EXIT_FILE_EXISTS)
    except ValueError as exc:
        return fail(args, with_flags(str(exc)))
    except OSError as exc:
        return fail(args, exc)
    from kvlab.eval.candidates import baseline_note

    for note in [baseline_note(args.candidates or ("dynamic",)), *_attention_notes(cfg)]:
        if note:
            err.print(f"[yellow]note:[/] {note}")
    result = new_result(cfg, label, _argv())
    if args.dry_run:
        set_status(result, "dry_run")
        for warning in context_limit_warnings(cfg, limit):  # allowed (--allow-past-limit): said before the run
            err.print(f"[yellow]warning: {warning}[/]")
    try:  # the plan (a dry run's whole result): a folder that takes no file fails now, not after the model loads
        write_json_atomic(path, result)
    except OSError as exc:  # names `path`, not the hidden temporary file (kvlab.runtime.atomic)
        return fail(args, f"--out-dir {args.out_dir}: cannot write {path} ({exc.strerror or exc})")
    if args.dry_run:
        return _finish(args, result, path, err)
    try:
        return _run_real(args, cfg, result, path, err)
    except OSError as exc:
        if exc.filename != str(path):  # not the result file: not an output-path problem
            raise
        return fail(args, f"could not write the result {path} ({exc.strerror or exc})", EXIT_FAILED)


def _resume(args: argparse.Namespace, err) -> int:
    """``kvlab eval --resume RESULT``: continue the run RESULT records (:mod:`kvlab.eval.resume`), in place.

    Refused (exit 2, the file unchanged): another setting flag beside it, a file that is not an interrupted kvlab
    eval run (:func:`kvlab.eval.resume.load_resumable`), a model that is not there, or (after loading it) another
    model or device than the file's."""
    from pathlib import Path

    from kvlab.eval.resume import load_resumable

    given = [
        "--" + dest.replace("_", "-")
        for dest, default in RESUME_IGNORES.items()
        if getattr(args, dest) != default
    ]
    if given:
        return fail(
            args,
            f"--resume {args.resume} takes its settings, label and folder from the file; drop {', '.join(given)}",
        )
    path = Path(args.resume)
    try:
        result, cfg = load_resumable(path)
    except (OSError, ValueError) as exc:
        return fail(args, f"cannot resume: {exc}")
    problem = _model_problem(cfg.model)
    if problem:
        return fail(args, f"cannot resume {path}: {problem}")
    for note in _attention_notes(cfg):
        err.print(f"[yellow]note:[/] {note}")
    try:
        original = path.read_bytes()
        _claim(path, result)  # at once: a second --resume started while this one loads the model refuses
        code = _run_real(args, cfg, result, path, err, resumed=True)
        if code == EXIT_USAGE:  # refused after loading (another model): the file is left as it was
            from kvlab.runtime.atomic import atomic_write

            atomic_write(path, lambda f: f.write(original), binary=True)
        return code
    except OSError as exc:
        if exc.filename != str(path):
            raise
        return fail(args, f"could not write the result {path} ({exc.strerror or exc})", EXIT_FAILED)


def _claim(path, result: dict) -> None:
    """Mark ``path`` as being written by this process (``provenance.running_in``), status ``running``."""
    from kvlab.eval.io import write_json_atomic
    from kvlab.eval.records import set_status
    from kvlab.eval.resume import running_in

    claimed = set_status(
        {**result, "provenance": {**result["provenance"], "running_in": running_in()}}, "running"
    )
    write_json_atomic(path, claimed)  # the result in memory keeps its status: the resume records it


def _model_problem(model: str | None) -> str | None:
    """Why ``--model`` cannot be loaded, found without loading it (:func:`kvlab.models.check_local_model`: a path
    that does not exist, a file where a folder should be, a folder without its files, a file that is not GGUF, a
    named model not installed), or None; a hub id passes (its failure to load is recorded in the result, exit 1)."""
    from kvlab.models import check_local_model

    try:
        check_local_model(model)
    except (OSError, ValueError) as exc:
        return str(exc)
    return None


def _exists_message(path, exc: FileExistsError) -> str:
    """The refusal of an existing result file; it says when that file is a run that failed, was stopped or never
    finished (status ``failed``, ``stopped``, or ``planned``/``running`` left by a run that died), the usual reason
    to retry a label,
    and names ``--resume`` when the file records its finished cells (``cells_done``)."""
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        status = earlier.get("status")
    except (OSError, ValueError, AttributeError):  # a directory, not JSON, not an object: the plain message
        return str(exc)
    if status == "failed":
        why = "the earlier run with this label failed (status failed)"
    elif status == "stopped":
        why = "the earlier run with this label was stopped (status stopped: Ctrl-C or SIGTERM)"
    elif status in ("planned", "running"):
        why = f"the earlier run with this label did not finish (status {status}: stopped, or still running)"
    else:
        return str(exc)
    if isinstance(earlier.get("cells_done"), list):
        return f"{path} already exists: {why}; pass --resume {path} to continue it, --force to replace it"
    return f"{path} already exists: {why}; pass --force to replace it or choose another --label"


def _attention_notes(cfg) -> list[str]:
    """A note when a candidate runs another attention path than the run's (``kivi-k8v4`` in a fused run: its
    registry entry's :attr:`~kvlab.caches.entry.CacheEntry.attention_path` says so)."""
    from kvlab.eval.candidates import run_attention

    if cfg.kivi_attention != "fused":
        return []
    own = [n for n in cfg.candidates if run_attention(n, "fused") == "dequantize"]
    if not own:
        return []
    return [
        f"{', '.join(own)} run(s) the dequantize attention path: fused KIVI attention (--kivi-attention fused) reads "
        f"keys and values at one width"
    ]


def _load(args, cfg, result, path, err, resumed: bool, where: RunStage):
    """``(model, tokenizer, model_info)`` loaded and checked against the settings, or the exit code of a failure:
    a load failure and a setting the model refutes are recorded in ``path``; a resumed run (``resumed``) onto
    another model or device is refused, the file left as it was. A resumed ``result`` is then made ready to
    continue (:func:`kvlab.eval.resume.prepare_resume`). ``where`` follows the stages (an interrupt is recorded by
    the caller, :func:`_run_real`)."""
    from kvlab.eval.io import write_json_atomic
    from kvlab.eval.model_info import (
        check_against_model,
        check_heldout_length,
        context_limit_problem,
        context_limit_warnings,
        describe_model,
        model_max_positions,
    )
    from kvlab.eval.records import fail_run
    from kvlab.models import load_model
    from kvlab.runtime.device import resolve_device

    try:
        device = resolve_device(cfg.device)
        err.print(f"loading model {cfg.model or '(bundled reference model)'} in {cfg.dtype} on {device} ...")
        model, tokenizer = load_model(cfg.model, dtype=cfg.dtype, device=str(device))
        model_info = describe_model(model, cfg.model, cfg.dtype, str(device))
    except Exception as exc:  # recorded, not lost (nor left as "planned"); an interrupt: _run_real records it
        fail_run(result, "load_model", exc)
        write_json_atomic(path, result)
        return fail(args, f"could not load the model: {type(exc).__name__}: {exc} (recorded in {path})", EXIT_FAILED)
    where.set("settings", "checking the settings against the loaded model")
    if resumed:
        from kvlab.eval.resume import check_same_model

        try:
            check_same_model(path, result, model_info)
        except ValueError as exc:
            return fail(args, f"cannot resume: {exc}")
    for warning in context_limit_warnings(cfg, model_max_positions(model)) if cfg.allow_past_limit else ():
        err.print(f"[yellow]warning: {warning}[/]")
    try:
        problem = context_limit_problem(cfg, model_max_positions(model))  # the loaded model's own limit
        if problem:
            raise ValueError(problem)
        check_against_model(cfg, model)
        check_heldout_length(cfg, tokenizer)
        problem = memory_problem(cfg, model, device)
        if problem:
            raise ValueError(problem)
    except ValueError as exc:  # a setting only the loaded model (or its tokenizer) can refute: recorded, exit 2
        fail_run(result, "settings", exc)
        write_json_atomic(path, result)
        return fail(args, f"{exc} (recorded in {path})")
    if resumed:
        _prepare_resume(result, cfg, err)
    where.set("run", "the run's start (warm-up)")
    return model, tokenizer, model_info


# the named parts of a cell's estimate (memory_problem): what its "needs about" counts
_CELL_PARTS = (
    "one prefill's activations, the K/V of two float caches, the baseline's kept beside each candidate's, and the "
    "token ids"
)


def cell_peak_bytes(model_config, context: int, new_tokens: int, batch: int, itemsize: int) -> int:
    """Bytes one ``kvlab eval`` cell holds above the loaded model at least, from ``model_config``'s shapes: the
    prefill's activations over ``batch x context`` tokens (:func:`kvlab.lab.longrun.activation_bytes`), the K/V of
    ``batch x (context + new_tokens)`` tokens in ``itemsize`` bytes twice (the baseline's float prefill, kept to
    fill each candidate, and the cache being measured; :func:`kvlab.lab.longrun.kv_bytes`) and three int64 id
    tensors of that size (the prompt, the attention mask, generate's output)."""
    from kvlab.lab.longrun import activation_bytes, kv_bytes

    rows = batch * (context + new_tokens)
    return activation_bytes(model_config, batch * context) + 2 * kv_bytes(model_config, rows, itemsize) + 24 * rows


def memory_problem(cfg, model, device, available: int | None = -1) -> str | None:
    """Why a cell of ``cfg`` cannot fit beside the loaded ``model`` on ``device`` (:func:`cell_peak_bytes` of its
    largest capacity context and of the window cell against ``available``: by default the free memory of a CUDA
    ``device``, else :func:`kvlab.runtime.provenance.available_memory_bytes`), worded by
    :func:`kvlab.lab.longrun.memory_refusal` naming the flag and the longest context that would fit; None when
    every cell fits or the memory is unknown. A lower bound: a refused run could not have run, a passed one may
    still run short (the long-context probes are not counted)."""
    import torch

    from kvlab.eval.cells import run_cells
    from kvlab.lab.longrun import memory_refusal
    from kvlab.runtime.checks import echoed_value
    from kvlab.runtime.provenance import available_memory_bytes

    if available == -1:
        available = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else available_memory_bytes()
    if available is None:
        return None
    itemsize = next(model.parameters()).element_size()

    def need(context: int, new_tokens: int) -> int:
        return cell_peak_bytes(model.config, context, new_tokens, cfg.batch, itemsize)

    cell = max(run_cells(cfg), key=lambda c: need(c.context, c.new_tokens))
    if need(cell.context, cell.new_tokens) <= available:
        return None
    low, high = 0, cell.context  # the longest context that fits: need() grows with it
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if need(mid, cell.new_tokens) <= available else (low, mid - 1)
    flag = "--contexts" if cell.matrix == "capacity" else "--window-context"
    per = f" at --batch {cfg.batch}" if cfg.batch > 1 else ""
    hint = f"at most about {low} tokens fit{per}" if low else f"not even 1 token fits{per}"
    shown = echoed_value(cell.context, list_flag=flag == "--contexts")  # pastes back as one item
    what = f"{flag} {shown} with {cell.new_tokens:,} new tokens{per} ({_CELL_PARTS})"
    return memory_refusal(what, need(cell.context, cell.new_tokens), available, hint)


def kept_parts(cells_done: int, rows: int, cells_measured: int, cells: int) -> list[str]:
    """What a stopped run keeps, in the words of both the stop line and the ``--resume`` line: ``["1 of 3 cells
    finished and kept (4 rows)", "2 measured and kept, to be timed"]`` (the second only when some cell was measured
    and not timed)."""
    parts = [f"{cells_done} of {cells} cells finished and kept ({rows} rows)"]
    if cells_measured:
        parts.append(f"{cells_measured} measured and kept, to be timed")
    return parts


def _prepare_resume(result, cfg, err) -> None:
    """Keep the finished cells of a resumed ``result`` and say what is kept and what is measured again."""
    from kvlab.eval.resume import prepare_resume

    argv = _argv()
    record = prepare_resume(result, cfg, None if argv is None else ["kvlab", *argv])
    total = record["cells_kept"] + record["cells_measured_kept"] + record["cells_to_measure"]
    untimed, rest = record["cells_measured_kept"], record["cells_to_measure"]
    parts = kept_parts(record["cells_kept"], record["rows_kept"], untimed, total)
    if rest or not untimed:
        parts.append(f"measuring the other {rest} from the start")
    err.print(f"resuming {result['label']}: {'; '.join(parts)}")


def _argv() -> list[str] | None:
    """The command line, without the program, when kvlab runs as the ``kvlab`` script (None in-process)."""
    return sys.argv[1:] if sys.argv and sys.argv[0].endswith("kvlab") else None


def _run_real(args, cfg, result, path, err, resumed: bool = False) -> int:
    """Load the model, run, write and report; Ctrl-C or SIGTERM at any stage (loading the model included) is
    recorded as a stop (status ``stopped``, :func:`_stopped`), not as a failure; ``where`` follows the stages
    (:class:`kvlab.eval.records.RunStage`)."""
    where = RunStage()
    try:
        with sigterm_raises():
            loaded = _load(args, cfg, result, path, err, resumed, where)
            if isinstance(loaded, int):
                return loaded
            return _measure(args, cfg, result, path, err, loaded, where)
    except (KeyboardInterrupt, Terminated) as exc:
        return _stopped(args, cfg, result, path, err, exc, where, resumed)


def _measure(args, cfg, result, path, err, loaded, where: RunStage) -> int:
    """Run the loaded model's cells (:func:`kvlab.eval.runner.run_eval`), saving the file after every step, and
    report; an interrupt propagates to :func:`_run_real`."""
    from kvlab.eval.cells import count_steps
    from kvlab.eval.io import write_json_atomic
    from kvlab.eval.records import fail_run, set_status
    from kvlab.eval.resume import running_in
    from kvlab.eval.runner import run_eval

    model, tokenizer, model_info = loaded
    set_status(result, "running")
    result["provenance"]["running_in"] = running_in()  # a second --resume of this file refuses while it lives
    write_json_atomic(path, result)
    with progress(err, count_steps(cfg), "kvlab eval") as bar:

        def step() -> None:
            bar.advance()
            write_json_atomic(path, result)  # every finished cell is on disk, even if the run dies later

        def describe(words: str) -> None:
            where.step(words)
            bar.describe(words)

        try:
            run_eval(
                cfg,
                model,
                tokenizer,
                result,
                model_info,
                progress=describe,
                advance=step,
                notify=lambda msg: err.print(f"[yellow]warning: {msg}[/]"),
            )
        except Exception as exc:
            fail_run(result, "run", exc)
    write_json_atomic(path, result)
    code = _finish(args, result, path, err)
    failed_everywhere = (result.get("summary") or {}).get("failed_candidates")
    return 1 if result["status"] == "failed" or failed_everywhere else code


def _stopped(args, cfg, result, path, err, exc: BaseException, where: RunStage, resumed: bool) -> int:
    """Record an interrupt at ``where`` (:func:`kvlab.eval.records.stop_run`), write the file, print the rows so far
    (when the run had started) and one line saying where it stopped, what is kept and how to continue; returns the
    shell's status for the signal (130 for Ctrl-C, 143 for SIGTERM)."""
    from kvlab.eval.cells import run_cells
    from kvlab.eval.io import write_json_atomic
    from kvlab.eval.records import stop_run

    stop_run(result, where.stage, exc, where.words)
    # the session's measuring time (run_eval records it when stopped); none yet: 0 s, unless a resumed file was
    # stopped before its resume was prepared (it keeps the earlier session's time, which the next resume adds up)
    if result.get("elapsed_s") is None and (not resumed or where.stage == "run"):
        result["elapsed_s"] = 0.0
    write_json_atomic(path, result)
    if where.measuring:
        _finish(args, result, path, err)
    parts = kept_parts(
        len(result.get("cells_done") or []),
        len(result.get("rows") or []),
        len(result.get("cells_measured") or []),
        len(run_cells(cfg)),
    )
    err.print(
        f"stopped: {result['failures'][-1]['message']}; in {path}: {'; '.join(parts)}; continue with: "
        f"kvlab eval --resume {path}",
        markup=False,
    )
    return stop_exit_code(exc)


def _finish(args, result, path, err) -> int:
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        from kvlab.eval.render import print_summary

        if result["status"] == "dry_run":
            err.print(f"dry run: {len(result['plan'])} cells planned")
        else:
            print_summary(result)
    err.print(f"result written to {path}")
    return 0
