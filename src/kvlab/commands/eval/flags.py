"""The ``kvlab eval`` flags and the parsers of their values (comma lists, ``all``/``none``); docs/EVAL.md."""

from __future__ import annotations

import argparse
from dataclasses import fields

from kvlab.eval.config import DTYPES, QUICK_SETTINGS, EvalConfig, Gates
from kvlab.runtime.checks import float_list, int_list, parse_list

_FIELD_DEFAULTS = {f.name: f.default for f in fields(EvalConfig)}
_GATE_DEFAULTS = {f.name: f.default for f in fields(Gates)}


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


def _shown(value: object) -> str:
    """A default as the help text shows it: a tuple as a comma list, a float in its shortest form (``0.25``)."""
    if isinstance(value, tuple):
        return ",".join(_shown(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _default(setting: str) -> str:
    """The help text's default of an :class:`~kvlab.eval.config.EvalConfig` field: its dataclass default, the one
    place it is written (the flags default to ``None``, "not given", so ``--quick`` and ``--resume`` can tell)."""
    return _shown(_FIELD_DEFAULTS[setting])


def _quick(setting: str) -> str:
    """A ``--quick`` setting as the help text shows it (:data:`~kvlab.eval.config.QUICK_SETTINGS`)."""
    return _shown(QUICK_SETTINGS[setting])


def _rounds(repeat: int) -> str:
    return "one timed round" if repeat == 1 else f"{repeat} timed rounds"


def _gate(name: str) -> str:
    """A :class:`~kvlab.eval.config.Gates` field's default, two decimals (``0.50``)."""
    return f"{_GATE_DEFAULTS[name]:.2f}"


def add_flags(p) -> None:
    """Every ``kvlab eval`` flag on the parser ``p``: model, matrices, gates, long-context probes, prompts, output."""
    _add_model_flags(p)
    _add_matrix_flags(p)
    _add_window_and_timing_flags(p)
    _add_gate_flags(p)
    _add_long_context_flags(p)
    _add_prompt_and_output_flags(p)


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
    dtype = _default("dtype")
    others = [d for d in DTYPES if d != dtype]
    p.add_argument(
        "--dtype",
        default=dtype,
        help=f"model dtype: {dtype} (default), {', '.join(others[:-1])} or {others[-1]}",
    )
    p.add_argument(
        "--device",
        default=_default("device"),
        help="cpu, cuda, cuda:N or auto (default auto; cuda when available)",
    )


def _add_matrix_flags(p) -> None:
    """The candidates, the capacity matrix, KIVI/HQQ settings and the attention and CPU matmul paths."""
    p.add_argument(
        "--candidates",
        type=_names,
        default=None,
        help="comma list of registered cache names, family[-bits][-variant][:setting=value], "
        f"e.g. kivi-4,kivi-k8v4,fp8-e4m3,hqq-4,sink:window_length=256; every name: {', '.join(_registered())} "
        f"(default: {_default('candidates')}); kivi-N-fused / kivi-N-dequant choose their own attention path, "
        "kivi-k8v4 and kivi-k4v2 always run dequantized; settings other than an evicting cache's are the run's "
        "flags (--group-size, --residual, --hqq-group-size)",
    )
    p.add_argument(
        "--contexts",
        type=_ints,
        default=None,
        help=f"capacity matrix contexts (default {_default('contexts')})",
    )
    p.add_argument(
        "--new-tokens",
        type=int,
        default=None,
        help=f"tokens generated per capacity run (default {_default('new_tokens')})",
    )
    p.add_argument(
        "--residual",
        type=int,
        default=None,
        help=f"residual window R of the capacity matrix (default {_default('residual_length')})",
    )
    p.add_argument(
        "--group-size", type=int, default=None, help=f"KIVI group size G (default {_default('group_size')})"
    )
    p.add_argument(
        "--hqq-group-size",
        type=int,
        default=None,
        help=f"HQQ/quanto group size (default {_default('hqq_group_size')})",
    )
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


def _add_window_and_timing_flags(p) -> None:
    """The residual-window matrix, warmup and timed rounds, threads, workers, and the quality measures."""
    p.add_argument(
        "--window-context",
        type=int,
        default=None,
        help=f"residual-window matrix context (default {_default('window_context')})",
    )
    p.add_argument(
        "--window-new-tokens",
        type=int,
        default=None,
        help=f"tokens generated per window run (default {_default('window_new_tokens')})",
    )
    p.add_argument(
        "--window-residuals",
        type=_residuals,
        default=None,
        help=f"window residuals (default {_default('window_residuals')})",
    )
    p.add_argument(
        "--window-group-size",
        type=int,
        default=None,
        help=f"KIVI G in the window matrix (default {_default('window_group_size')})",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed generate() calls per cache before the timed rounds, counting the one that records its "
        f"outputs and bytes, which always runs (default {_default('warmup')})",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help=f"timed generate() rounds per cell, every cache of the cell interleaved (default {_default('repeat')})",
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
    p.add_argument(
        "--quality-tokens",
        type=int,
        default=None,
        help=f"fixed-continuation length (default {_default('quality_tokens')})",
    )
    p.add_argument(
        "--top-k", type=int, default=None, help=f"k of the top-k overlap (default {_default('top_k')})"
    )


def _add_gate_flags(p) -> None:
    """Acceptance gates (docs/EVAL.md: quality, latency, memory and the long-context gates)."""
    p.add_argument(
        "--max-nll-delta", type=float, default=None, help=f"gate (default {_gate('max_nll_delta')})"
    )
    p.add_argument(
        "--min-topk-overlap", type=float, default=None, help=f"gate (default {_gate('min_topk_overlap')})"
    )
    p.add_argument(
        "--max-latency-ratio", type=float, default=None, help=f"gate (default {_gate('max_latency_ratio')})"
    )
    p.add_argument(
        "--max-recall-drop",
        type=float,
        default=None,
        help=f"gate: copy accuracy lost vs DynamicCache at the worst distance (default {_gate('max_recall_drop')})",
    )
    p.add_argument(
        "--max-passkey-drop",
        type=float,
        default=None,
        help=f"gate: passkey accuracy lost vs DynamicCache, mean over depths (default {_gate('max_passkey_drop')})",
    )
    p.add_argument(
        "--max-kl-mean",
        type=float,
        default=None,
        help=f"gate: mean KL(DynamicCache || candidate) on the continuation, nats (default {_gate('max_kl_mean')})",
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
        help=f"passkey trials per (depth, context) point (default {_default('passkey_trials')})",
    )
    p.add_argument(
        "--passkey-depths",
        type=_floats,
        default=None,
        help=f"needle depths as fractions (default {_default('passkey_depths')})",
    )
    p.add_argument(
        "--recall-rows",
        type=int,
        default=None,
        help=f"recall prompts per distance (default {_default('recall_rows')})",
    )
    p.add_argument(
        "--recall-fractions",
        type=_floats,
        default=None,
        help=f"copy distances as fractions of the context (default {_default('recall_fractions')})",
    )
    p.add_argument(
        "--recall-span",
        type=int,
        default=None,
        help=f"copy span length L in tokens (default {_default('recall_span_tokens')})",
    )


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
    p.add_argument(
        "--batch", type=int, default=None, help=f"prompts per generate() call (default {_default('batch')})"
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help=f"random seed: torch and the held-out text offsets (default {_default('seed')})",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"small matrix: contexts {_quick('contexts')}, {_quick('new_tokens')} new tokens, residual windows "
        f"{_quick('window_residuals')}, {_quick('quality_tokens')} scored continuation tokens (NLL delta and KL), "
        f"{_rounds(QUICK_SETTINGS['repeat'])} (--repeat {_quick('repeat')}), {_quick('passkey_trials')} passkey "
        "trials a depth; about half a minute on the bundled "
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
