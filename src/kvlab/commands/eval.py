"""``kvlab eval``: the paired float vs quantized KV-cache experiment (docs/EVAL.md)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from datetime import datetime, timezone

from kvlab.commands import (
    EXIT_FAILED,
    EXIT_FILE_EXISTS,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    fail,
    progress,
)
from kvlab.runtime.checks import float_list, int_list, parse_list


def _ints(text: str) -> tuple[int, ...]:
    """Comma-separated token counts (:func:`kvlab.runtime.checks.int_list`; the settings check their range and
    refuse a value given twice, naming the setting)."""
    return tuple(int_list(text, minimum=0, unique=False))


def _residuals(text: str) -> tuple[int, ...]:
    """``--window-residuals``: comma-separated residual windows, or ``""``: no residual-window matrix."""
    return () if not text.strip() else _ints(text)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float_list(text, unique=False))


def _contexts_or_word(text: str) -> tuple[int, ...] | str:
    """``all`` / ``none`` or comma-separated integers (``--retrieval-contexts``)."""
    if text.strip().lower() in ("all", "none"):
        return text.strip().lower()
    if not text.replace(",", " ").strip():  # "" or "," is not 'none': say which the user meant
        raise argparse.ArgumentTypeError(f"expected 'all', 'none' or comma-separated contexts, got {text!r}")
    return _ints(text)


def _names(text: str) -> tuple[str, ...]:
    return tuple(parse_list(text, what="a cache name", unique=False))


def register(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="paired experiment: DynamicCache vs quantized caches (KIVI, HF HQQ) on one model",
        description="Run the paired experiment: a capacity matrix (contexts) and a residual-window matrix, "
        "each cache candidate against DynamicCache on the same prompts, judged by quality and latency gates; "
        "write results/<label>.json.",
    )
    _add_model_flags(p)
    _add_matrix_flags(p)
    _add_gate_flags(p)
    _add_long_context_flags(p)
    _add_prompt_and_output_flags(p)
    p.set_defaults(func=run)
    RESUME_IGNORES.update(
        {
            dest: default
            for dest, default in vars(p.parse_args([])).items()
            if dest not in ("func", "resume", "json")
        }
    )


# the `kvlab eval` parser's defaults of every flag that --resume refuses (dest -> default), filled at registration:
# a resumed run takes its settings, label and folder from its result file
RESUME_IGNORES: dict = {}


def _registered() -> list[str]:
    from kvlab.caches.registry import cache_names  # torch-free

    return cache_names()


def _add_model_flags(p) -> None:
    """Model, dtype, device and the candidate caches."""
    p.add_argument(
        "--model",
        default=None,
        help="local directory, GGUF file, named model (smollm2-135m; see kvlab models) or HF hub id "
        "(default: the bundled reference model, a small test model)",
    )
    p.add_argument("--dtype", default="bfloat16", help="model dtype: bfloat16 (default), float16 or float32")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda")


def _add_matrix_flags(p) -> None:
    """Capacity and residual-window matrices, KIVI settings, timing."""
    p.add_argument(
        "--candidates",
        type=_names,
        default=None,
        help="comma list of registered cache names, family[-bits][-variant][:setting=value] (see CONTRIBUTING.md), "
        f"e.g. kivi-4,kivi-k8v4,fp8-e4m3,hqq-4,sink:window_length=256; every name: {', '.join(_registered())} "
        "(default: dynamic,kivi-4,kivi-2,hqq-4); kivi-N-fused / kivi-N-dequant choose their own attention path, "
        "kivi-k8v4 and kivi-k4v2 always run dequantized; settings other than an evicting cache's are the run's "
        "flags (--group-size, --residual, --hqq-group-size)",
    )
    p.add_argument(
        "--contexts", type=_ints, default=None, help="capacity matrix contexts (default 512,2048,4096)"
    )
    p.add_argument(
        "--new-tokens", type=int, default=None, help="tokens generated per capacity run (default 64)"
    )
    p.add_argument(
        "--residual", type=int, default=None, help="residual window R of the capacity matrix (default 128)"
    )
    p.add_argument("--group-size", type=int, default=None, help="KIVI group size G (default 32)")
    p.add_argument("--hqq-group-size", type=int, default=None, help="HQQ/quanto group size (default 64)")
    p.add_argument(
        "--kivi-attention",
        choices=("fused", "dequantize"),
        default=None,
        help="fused (default): kvlab attention reads packed codes; dequantize: float K/V to the model's attention "
        "(for each KIVI candidate that names no path of its own)",
    )
    p.add_argument(
        "--cpu-matmul",
        choices=("auto", "native", "float32"),
        default=None,
        help="CPU only: how a bf16/fp16 model's Linear layers and attention compute: float32 GEMMs and SDPA on "
        "its values (outputs rounded back), torch's native kernels, or auto (default): float32 where the CPU "
        "emulates the dtype",
    )
    p.add_argument(
        "--window-context", type=int, default=None, help="residual-window matrix context (default 512)"
    )
    p.add_argument(
        "--window-new-tokens", type=int, default=None, help="tokens generated per window run (default 128)"
    )
    p.add_argument(
        "--window-residuals", type=_residuals, default=None, help="window residuals (default 16,32,64)"
    )
    p.add_argument(
        "--window-group-size", type=int, default=None, help="KIVI G in the window matrix (default 16)"
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed generate() calls per cache before the timed rounds, counting the one that records its "
        "outputs and bytes, which always runs (default 1)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="timed generate() rounds per cell, every cache of the cell interleaved (default 3)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: OMP_NUM_THREADS, else usable CPUs minus one; recorded in the result)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes for the untimed long-context probes: this one plus forked helpers on spare CPUs, all done "
        "before any timed round; 1 = no helper (default: 2 on a Linux CPU run with a spare CPU, else 1; the probe "
        "results do not depend on it, only the run time)",
    )
    p.add_argument("--quality-tokens", type=int, default=None, help="fixed-continuation length (default 16)")
    p.add_argument("--top-k", type=int, default=None, help="k of the top-k overlap (default 5)")


def _add_gate_flags(p) -> None:
    """Acceptance gates (docs/EVAL.md: quality, latency, memory and the long-context gates)."""
    p.add_argument("--max-nll-delta", type=float, default=None, help="gate (default 0.50)")
    p.add_argument("--min-topk-overlap", type=float, default=None, help="gate (default 0.60)")
    p.add_argument("--max-latency-ratio", type=float, default=None, help="gate (default 2.00)")
    p.add_argument(
        "--max-recall-drop",
        type=float,
        default=None,
        help="gate: copy accuracy lost vs DynamicCache at the worst distance (default 0.05)",
    )
    p.add_argument(
        "--max-passkey-drop",
        type=float,
        default=None,
        help="gate: passkey accuracy lost vs DynamicCache, mean over depths (default 0.05)",
    )
    p.add_argument(
        "--max-kl-mean",
        type=float,
        default=None,
        help="gate: mean KL(DynamicCache || candidate) on the continuation, nats (default 0.10)",
    )


def _add_long_context_flags(p) -> None:
    """Recall and passkey probes (kvlab.eval.longctx)."""
    p.add_argument(
        "--no-long-context",
        action="store_true",
        help="skip the recall and passkey probes (the KL divergence is still measured)",
    )
    p.add_argument(
        "--retrieval-contexts",
        type=_contexts_or_word,
        default=None,
        help="capacity contexts that get the passkey grid: comma list, 'all' or 'none' (default: the smallest; "
        "each context adds depths x trials prompts that every candidate must hold)",
    )
    p.add_argument(
        "--passkey-trials",
        type=int,
        default=None,
        help="passkey trials per (depth, context) point (default 20)",
    )
    p.add_argument(
        "--passkey-depths",
        type=_floats,
        default=None,
        help="needle depths as fractions (default 0,0.25,0.5,0.75,1)",
    )
    p.add_argument("--recall-rows", type=int, default=None, help="recall prompts per distance (default 2)")
    p.add_argument(
        "--recall-fractions",
        type=_floats,
        default=None,
        help="copy distances as fractions of the context (default 0.25,0.5,0.9)",
    )
    p.add_argument("--recall-span", type=int, default=None, help="copy span length L in tokens (default 32)")


def _add_prompt_and_output_flags(p) -> None:
    """Prompts, seed, --quick, and where the result goes."""
    p.add_argument(
        "--prompt-mode",
        choices=("heldout", "repeat"),
        default=None,
        help="heldout: held-out text cut to exact lengths (default); repeat: one short prompt (--prompt) "
        "tiled to each length",
    )
    p.add_argument("--prompt", default=None, help="prompt text for --prompt-mode repeat")
    p.add_argument("--batch", type=int, default=None, help="prompts per generate() call (default 1)")
    p.add_argument(
        "--seed", type=int, default=None, help="random seed: torch and the held-out text offsets (default 42)"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small matrix: contexts 256,1024, 16 new tokens, residual windows 16,32, 8 scored continuation tokens "
        "(NLL delta and KL), one timed round (--repeat 1), 8 passkey trials a depth; about half a minute on the bundled "
        "model and about 3.5 minutes on smollm2-135m on a busy 2-core CPU. A smoke test: decide with the defaults",
    )
    p.add_argument("--label", default=None, help="result name (default eval-<UTC timestamp>)")
    p.add_argument("--out-dir", default="results", help="directory for <label>.json (default results/)")
    p.add_argument("--force", action="store_true", help="overwrite an existing result with the same label")
    p.add_argument("--dry-run", action="store_true", help="write the plan only; load no model")
    p.add_argument(
        "--resume",
        metavar="RESULT",
        default=None,
        help="continue the interrupted run whose result file is RESULT (status running or failed: Ctrl-C, a kill, "
        "an error) and rewrite that file: its settings come from the file (no other flag but --json; same model, "
        "device, software and thread count), the cells it finished (timed, rows written) are kept, so are the cells "
        "and probes it measured but did not time yet (they are only timed), every other cell is measured and timed "
        "from the start, and the summary covers all rows. Stop a run still running before resuming it",
    )
    p.add_argument("--json", action="store_true", help="print the result JSON instead of tables")


_FIELDS = {
    "model": "model",
    "dtype": "dtype",
    "device": "device",
    "candidates": "candidates",
    "contexts": "contexts",
    "new_tokens": "new_tokens",
    "residual": "residual_length",
    "group_size": "group_size",
    "hqq_group_size": "hqq_group_size",
    "kivi_attention": "kivi_attention",
    "cpu_matmul": "cpu_matmul",
    "window_context": "window_context",
    "window_new_tokens": "window_new_tokens",
    "window_residuals": "window_residuals",
    "window_group_size": "window_group_size",
    "warmup": "warmup",
    "repeat": "repeat",
    "quality_tokens": "quality_tokens",
    "top_k": "top_k",
    "prompt_mode": "prompt_mode",
    "prompt": "prompt",
    "batch": "batch",
    "seed": "seed",
    "threads": "threads",
    "workers": "workers",
    "passkey_trials": "passkey_trials",
    "passkey_depths": "passkey_depths",
    "recall_rows": "recall_rows",
    "recall_fractions": "recall_fractions",
    "recall_span": "recall_span_tokens",
}


def _gate_flags() -> tuple[str, ...]:
    """The gate settings, each also the name of its flag (``max_kl_mean`` is ``--max-kl-mean``)."""
    from dataclasses import fields

    from kvlab.eval.config import Gates

    return tuple(f.name for f in fields(Gates))


def _with_flags(message: str) -> str:
    """A config error names the flag beside the field: "`threads` must ..." -> "`threads` (--threads) must ..."."""
    flags = {field: flag.replace("_", "-") for flag, field in _FIELDS.items()}
    flags["retrieval_contexts"] = "retrieval-contexts"  # set outside _FIELDS ('all' / 'none')
    flags.update({gate: gate.replace("_", "-") for gate in _gate_flags()})  # Gates' fields are their flags
    for field, flag in flags.items():
        message = message.replace(f"`{field}`", f"`{field}` (--{flag})", 1)
    return message


# flag -> the cache setting it sets (the families that read each are the registry's: CacheEntry.reads)
_CACHE_FLAGS = {
    "group_size": "group_size",
    "residual": "residual_length",
    "hqq_group_size": "hqq_group_size",
    "kivi_attention": "kivi_attention",
    "window_residuals": "residual_length",  # the residual-window matrix runs caches with a residual window only
    "window_group_size": "group_size",
    "window_context": "residual_length",
    "window_new_tokens": "residual_length",
}


def _check_settings_apply(args: argparse.Namespace, candidates: tuple[str, ...]) -> None:
    """Refuse a cache flag that no candidate takes (``--group-size 64`` with ``--candidates dynamic,hqq-4``): the
    run would ignore it silently and record a setting that measured nothing.

    Raises:
        ValueError: naming the flag, its value and the candidates.
    """
    from kvlab.caches.registry import resolve, takers

    taken = set()
    for name in candidates:
        taken |= set(resolve(name).entry.reads)
    for flag, setting in _CACHE_FLAGS.items():
        value = getattr(args, flag, None)
        if value in (None, ()) or setting in taken:  # unset, or --window-residuals "" (no window matrix)
            continue
        if isinstance(value, tuple):
            value = ",".join(str(v) for v in value)
        families = takers(setting)
        listed = ", ".join(families[:-1]) + " or " + families[-1] if len(families) > 1 else families[0]
        raise ValueError(
            f"--{flag.replace('_', '-')} {value} applies to no candidate of {list(candidates)} (it needs a "
            f"cache that takes `{setting}`: {listed}" + "); drop the flag or add such a candidate"
        )


# the flags of the recall and passkey probes, which --no-long-context skips
_LONG_CONTEXT_FLAGS = (
    "retrieval_contexts",
    "passkey_trials",
    "passkey_depths",
    "recall_rows",
    "recall_fractions",
    "recall_span",
    "max_recall_drop",
    "max_passkey_drop",
)


def _check_long_context_flags(args: argparse.Namespace, cfg) -> None:
    """Refuse a recall/passkey flag (or ``--workers`` above 1) given with ``--no-long-context`` (it would be silently
    ignored), and a ``--recall-span`` no capacity context can hold (the recall probe would measure nothing in every
    cell).

    Raises:
        ValueError: naming the flag and its value.
    """
    for flag in _LONG_CONTEXT_FLAGS:
        value = getattr(args, flag, None)
        if not args.no_long_context or value is None or value == "none":
            continue
        if isinstance(value, tuple):
            value = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
        raise ValueError(
            f"--{flag.replace('_', '-')} {value} sets a recall/passkey probe, which --no-long-context skips; "
            f"drop one of them"
        )
    workers = getattr(args, "workers", None)
    if args.no_long_context and isinstance(workers, int) and workers > 1:
        raise ValueError(
            f"--workers {workers} shares the long-context probes with helper processes, which --no-long-context "
            f"skips (nothing else is untimed work to share); drop one of them"
        )
    if cfg.long_context and cfg.recall_span_tokens > max(cfg.contexts) - 1:
        raise ValueError(
            f"--recall-span {cfg.recall_span_tokens} does not fit the largest capacity context "
            f"({max(cfg.contexts)} tokens, the span starting at token >= 1): the recall probe would measure "
            f"nothing; use a shorter span or a longer --contexts"
        )


def _check_candidates_evict(cfg) -> None:
    """Refuse an evicting candidate whose cap is at least every cell's tokens (``sink:window_length=4096`` with
    contexts up to 1024): it keeps every token, is measured as DynamicCache and judged a pass.

    Raises:
        ValueError: naming the candidate, what it keeps and the longest cell.
    """
    from kvlab.caches.registry import resolve

    longest = max(cfg.contexts)
    decoded = max(cfg.new_tokens, cfg.recall_span_tokens if cfg.long_context else 0)
    for name in cfg.candidates:
        keeps = resolve(name).keeps()  # the registry's: what the cache keeps at most, over what
        if keeps is None:
            continue
        kept, seen = keeps.tokens, longest + decoded if keeps.while_decoding else longest
        if kept >= seen:
            raise ValueError(
                f"cache candidate {name!r} keeps {kept:,} tokens, not fewer than the {seen:,} of the longest cell "
                f"(--contexts up to {longest:,}): it would evict nothing and measure DynamicCache; give it a "
                f"smaller budget or window, or longer --contexts"
            )


def config_from_args(args: argparse.Namespace):
    """Build the EvalConfig (``--quick`` base, then every explicit flag)."""
    from kvlab.eval.config import EvalConfig, Gates, quick_config

    overrides = {
        field: getattr(args, flag) for flag, field in _FIELDS.items() if getattr(args, flag) is not None
    }
    gates = {k: getattr(args, k) for k in _gate_flags() if getattr(args, k) is not None}
    if gates:
        overrides["gates"] = Gates(**gates)
    if args.no_long_context:
        overrides["long_context"] = False
    if args.prompt is not None and args.prompt_mode != "repeat":  # held-out prompts never read it
        raise ValueError(
            f"--prompt {args.prompt!r} applies to --prompt-mode repeat only (the held-out text is the prompt)"
        )
    if args.retrieval_contexts == "none":
        overrides["retrieval_contexts"] = ()
    elif args.retrieval_contexts is not None and args.retrieval_contexts != "all":
        overrides["retrieval_contexts"] = args.retrieval_contexts
    cfg = quick_config(**overrides) if args.quick else EvalConfig(**overrides)
    _check_settings_apply(args, cfg.candidates)
    _check_long_context_flags(args, cfg)
    _check_candidates_evict(cfg)
    if args.retrieval_contexts == "all":  # every capacity context, whatever --quick or --contexts chose
        cfg = replace(cfg, retrieval_contexts=tuple(cfg.contexts))
    return cfg


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    err = Console(stderr=True)
    if args.resume is not None:
        return _resume(args, err)
    from kvlab.eval.io import ensure_writable, result_path, write_json_atomic
    from kvlab.eval.records import set_status
    from kvlab.eval.runner import new_result

    label = args.label
    if label is None:
        label = "eval-" + datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    if not args.out_dir.strip():  # '' would be the current folder
        return fail(args, f"--out-dir must name a folder, got {args.out_dir!r}")
    try:
        cfg = config_from_args(args)
        path = result_path(args.out_dir, label)
        try:
            ensure_writable(path, args.force)
        except FileExistsError as exc:
            raise FileExistsError(_exists_message(path, exc)) from None
        problem = None if args.dry_run else (_device_problem(cfg.device) or _model_problem(cfg.model))
        if problem:  # a path that is not there is bad input (exit 2), as in kvlab lab / inspect / bench
            return fail(args, problem)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)  # fail now, not after loading the model
        except OSError as exc:  # a file where the folder (or a parent of it) should be, no permission, ...
            reason = exc.strerror or exc
            if isinstance(exc, (FileExistsError, NotADirectoryError)):
                reason = "a file is in the way of the folder"
            return fail(args, f"--out-dir {args.out_dir}: cannot create the folder ({reason})")
    except FileExistsError as exc:
        return fail(args, exc, EXIT_FILE_EXISTS)
    except ValueError as exc:
        return fail(args, _with_flags(str(exc)))
    except OSError as exc:
        return fail(args, exc)
    for note in _attention_notes(cfg):
        err.print(f"[yellow]note:[/] {note}")
    result = new_result(cfg, label, _argv())
    if args.dry_run:
        set_status(result, "dry_run")
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


def _device_problem(device: str) -> str | None:
    """Why ``--device`` cannot run here (CUDA asked on a machine without it, a name torch does not parse), or None:
    bad input, refused before a result file is written."""
    from kvlab.runtime.device import resolve_device

    try:
        resolve_device(device)
    except ValueError as exc:
        return f"--device {device}: {exc}"
    return None


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
    """The refusal of an existing result file; it says when that file is a run that failed or never finished
    (status ``failed``, or ``planned``/``running`` left by a run that died), the usual reason to retry a label,
    and names ``--resume`` when the file records its finished cells (``cells_done``)."""
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        status = earlier.get("status")
    except (OSError, ValueError, AttributeError):  # a directory, not JSON, not an object: the plain message
        return str(exc)
    if status == "failed":
        why = "the earlier run with this label failed (status failed)"
    elif status in ("planned", "running"):
        why = f"the earlier run with this label did not finish (status {status}: stopped, or still running)"
    else:
        return str(exc)
    if isinstance(earlier.get("cells_done"), list):
        return f"{path} already exists: {why}; pass --resume {path} to continue it, --force to replace it"
    return f"{path} already exists: {why}; pass --force to replace it or choose another --label"


def _attention_notes(cfg) -> list[str]:
    """A note when a KIVI candidate runs another attention path than the run's (``kivi-k8v4`` in a fused run)."""
    from kvlab.eval.candidates import run_attention

    if cfg.kivi_attention != "fused":
        return []
    own = [n for n in cfg.candidates if n.startswith("kivi") and run_attention(n, "fused") == "dequantize"]
    if not own:
        return []
    return [
        f"{', '.join(own)} run(s) the dequantize attention path: fused KIVI attention (--kivi-attention fused) reads "
        f"keys and values at one width"
    ]


class _Terminated(BaseException):  # not an Exception: cells must not swallow it
    """SIGTERM during a run: recorded like an interrupt."""


def _on_sigterm(signum, frame):
    raise _Terminated(f"terminated by signal {signum}")


def _load(args, cfg, result, path, err, resumed: bool):
    """``(model, tokenizer, model_info)`` loaded and checked against the settings, or the exit code of a failure:
    a load failure and a setting the model refutes are recorded in ``path``; a resumed run (``resumed``) onto
    another model or device is refused, the file left as it was. A resumed ``result`` is then made ready to
    continue (:func:`kvlab.eval.resume.prepare_resume`)."""
    from kvlab.eval.io import write_json_atomic
    from kvlab.eval.model_info import check_against_model, context_limit_warnings, describe_model
    from kvlab.eval.records import fail_run
    from kvlab.models import load_model
    from kvlab.runtime.device import resolve_device

    try:
        device = resolve_device(cfg.device)
        err.print(f"loading model {cfg.model or '(bundled reference model)'} in {cfg.dtype} on {device} ...")
        model, tokenizer = load_model(cfg.model, dtype=cfg.dtype, device=str(device))
        model_info = describe_model(model, cfg.model, cfg.dtype, str(device))
    except (Exception, KeyboardInterrupt) as exc:  # recorded, not lost (nor left as "planned")
        fail_run(
            result,
            "load_model",
            exc,
            "interrupted by the user" if isinstance(exc, KeyboardInterrupt) else None,
        )
        write_json_atomic(path, result)
        return fail(
            args,
            f"could not load the model: {type(exc).__name__}: {exc} (recorded in {path})",
            EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else EXIT_FAILED,
        )
    if resumed:
        from kvlab.eval.resume import check_same_model

        try:
            check_same_model(path, result, model_info)
        except ValueError as exc:
            return fail(args, f"cannot resume: {exc}")
    for warning in context_limit_warnings(cfg, model):
        err.print(f"[yellow]warning: {warning}[/]")
    try:
        check_against_model(cfg, model)
    except (
        ValueError
    ) as exc:  # a setting only the loaded model can refute: recorded, exit 2 as for the others
        fail_run(result, "settings", exc)
        write_json_atomic(path, result)
        return fail(args, f"{exc} (recorded in {path})")
    if resumed:
        _prepare_resume(result, cfg, err)
    return model, tokenizer, model_info


def _prepare_resume(result, cfg, err) -> None:
    """Keep the finished cells of a resumed ``result`` and say what is kept and what is measured again."""
    from kvlab.eval.resume import prepare_resume

    argv = _argv()
    record = prepare_resume(result, cfg, None if argv is None else ["kvlab", *argv])
    total = record["cells_kept"] + record["cells_measured_kept"] + record["cells_to_measure"]
    untimed, rest = record["cells_measured_kept"], record["cells_to_measure"]
    parts = [f"{record['cells_kept']} of {total} cells finished and kept ({record['rows_kept']} rows)"]
    if untimed:
        parts.append(f"{untimed} measured and kept, to be timed")
    if rest or not untimed:
        parts.append(f"measuring the other {rest} from the start")
    err.print(f"resuming {result['label']}: {'; '.join(parts)}")


def _argv() -> list[str] | None:
    """The command line, without the program, when kvlab runs as the ``kvlab`` script (None in-process)."""
    return sys.argv[1:] if sys.argv and sys.argv[0].endswith("kvlab") else None


def _run_real(args, cfg, result, path, err, resumed: bool = False) -> int:
    import signal

    from kvlab.eval.cells import count_steps
    from kvlab.eval.io import write_json_atomic
    from kvlab.eval.records import fail_run, set_status
    from kvlab.eval.resume import running_in
    from kvlab.eval.runner import run_eval

    loaded = _load(args, cfg, result, path, err, resumed)
    if isinstance(loaded, int):
        return loaded
    model, tokenizer, model_info = loaded
    set_status(result, "running")
    result["provenance"]["running_in"] = running_in()  # a second --resume of this file refuses while it lives
    write_json_atomic(path, result)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    stopped = 0
    try:
        with progress(err, count_steps(cfg), "kvlab eval") as bar:

            def step() -> None:
                bar.advance()
                write_json_atomic(path, result)  # every finished cell is on disk, even if the run dies later

            run_eval(
                cfg,
                model,
                tokenizer,
                result,
                model_info,
                progress=bar.describe,
                advance=step,
                notify=lambda msg: err.print(f"[yellow]warning: {msg}[/]"),
            )
    except (KeyboardInterrupt, _Terminated) as exc:
        fail_run(
            result, "run", exc, "interrupted by the user" if isinstance(exc, KeyboardInterrupt) else None
        )
        stopped = EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else EXIT_TERMINATED
    except Exception as exc:
        fail_run(result, "run", exc)
    finally:
        signal.signal(signal.SIGTERM, previous)
    write_json_atomic(path, result)
    code = _finish(args, result, path, err)
    if stopped:  # the shell's status for a process a signal ended: 130 for Ctrl-C, 143 for SIGTERM
        return stopped
    failed_everywhere = (result.get("summary") or {}).get("failed_candidates")
    return 1 if result["status"] == "failed" or failed_everywhere else code


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
