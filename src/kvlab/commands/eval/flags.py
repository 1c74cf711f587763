"""The ``kvlab eval`` flags and the parsers of their values (comma lists, ``all``/``none``); docs/EVAL.md."""

from __future__ import annotations

import argparse
from dataclasses import fields

from kvlab.eval.config import PREFERENCES, QUICK_SETTINGS, EvalConfig, Gates
from kvlab.runtime.checks import float_list, int_flag, int_list, parse_list
from kvlab.runtime.dtype_names import MODEL_DTYPES

_FIELD_DEFAULTS = {f.name: f.default for f in fields(EvalConfig)}
_GATE_DEFAULTS = {f.name: f.default for f in fields(Gates)}


def _ints(text: str) -> tuple[int, ...]:
    """Comma-separated token counts (:func:`kvlab.runtime.checks.int_list`; the settings check their range and
    refuse a value given twice, naming the setting)."""
    return tuple(int_list(text, minimum=0, unique=False))


def _residuals(text: str) -> tuple[int, ...]:
    """``--window-residuals``: comma-separated residual windows, or ``none``: no residual-window matrix. ``""`` is
    refused as ``--contexts ''`` is (an empty value is no choice: it would silently drop the matrix)."""
    if text.strip().lower() == "none":
        return ()
    if not text.replace(",", " ").strip():  # "" or "," is not 'none': say which the user meant
        raise argparse.ArgumentTypeError(f"expected 'none' or comma-separated residual windows, got {text!r}")
    return _ints(text)


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


def _setting_flag(p, flag: str, kind, setting: str, text: str) -> None:
    """A flag of the :class:`~kvlab.eval.config.EvalConfig` field ``setting``: ``None`` when not given, its help
    ``text`` ending in the field's default (:func:`_default`)."""
    p.add_argument(flag, type=kind, default=None, help=f"{text} (default {_default(setting)})")


def _gate_flag(p, flag: str, text: str) -> None:
    """A float flag of the :class:`~kvlab.eval.config.Gates` field the flag names (``--max-kl-mean``:
    ``max_kl_mean``): ``None`` when not given, its help ``text`` ending in the gate's default (:func:`_gate`)."""
    gate = flag.removeprefix("--").replace("-", "_")
    p.add_argument(flag, type=float, default=None, help=f"{text} (default {_gate(gate)})")


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
    others = [d for d in MODEL_DTYPES if d != dtype]
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
        "kivi-k8v4 and kivi-k4v2 always run dequantized; kivi-N:dot=int8 runs the CPU kernel's integer path "
        "(beside kivi-N, the result adds its KL to that exact twin); dynamic-ckernel: the float cache through "
        "kvlab's float C kernel; settings other than an evicting cache's and dot are the run's flags "
        "(--group-size, --residual, --hqq-group-size)",
    )
    _setting_flag(p, "--contexts", _ints, "contexts", "capacity matrix contexts")
    _setting_flag(p, "--new-tokens", int_flag(), "new_tokens", "tokens generated per capacity run")
    p.add_argument(
        "--allow-past-limit",
        action="store_true",
        help="measure cells whose prompt + new tokens pass the model's max_position_embeddings (refused without "
        "it: quality there describes positions the model was not trained on); the decision then carries a caveat",
    )
    _setting_flag(p, "--residual", int_flag(), "residual_length", "residual window R of the capacity matrix")
    _setting_flag(p, "--group-size", int_flag(), "group_size", "KIVI group size G")
    _setting_flag(p, "--hqq-group-size", int_flag(), "hqq_group_size", "HQQ/quanto group size")
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
    _setting_flag(p, "--window-context", int_flag(), "window_context", "residual-window matrix context")
    _setting_flag(p, "--window-new-tokens", int_flag(), "window_new_tokens", "tokens generated per window run")
    _setting_flag(
        p, "--window-residuals", _residuals, "window_residuals", "window residuals; 'none': no residual-window matrix"
    )
    _setting_flag(p, "--window-group-size", int_flag(), "window_group_size", "KIVI G in the window matrix")
    _setting_flag(
        p,
        "--warmup",
        int_flag(),
        "warmup",
        "untimed generate() calls per cache before the timed rounds, counting the one that records its outputs "
        "and bytes, which always runs",
    )
    _setting_flag(
        p, "--repeat", int_flag(), "repeat", "timed generate() rounds per cell, every cache of the cell interleaved"
    )
    p.add_argument(
        "--threads",
        type=int_flag(),
        default=None,
        help="torch threads (default: OMP_NUM_THREADS, else usable CPUs minus one; recorded in the result)",
    )
    p.add_argument(
        "--workers",
        type=int_flag(),
        default=None,
        help="processes for the untimed long-context probes: this one plus forked helpers on spare CPUs, all done "
        "before any timed round; 1 = no helper (default: 2 on a Linux CPU run with a spare CPU, else 1; the probe "
        "results do not depend on it, only the run time)",
    )
    _setting_flag(p, "--quality-tokens", int_flag(), "quality_tokens", "fixed-continuation length")
    _setting_flag(p, "--top-k", int_flag(), "top_k", "k of the top-k overlap")


def _add_gate_flags(p) -> None:
    """Acceptance gates (docs/EVAL.md: quality, latency, memory and the long-context gates) and the rule that selects
    among the rows passing them (--prefer)."""
    _gate_flag(p, "--max-nll-delta", "gate")
    _gate_flag(p, "--min-topk-overlap", "gate")
    _gate_flag(p, "--max-latency-ratio", "gate")
    _gate_flag(p, "--max-recall-drop", "gate: copy accuracy lost vs DynamicCache at the worst distance")
    _gate_flag(p, "--max-passkey-drop", "gate: passkey accuracy lost vs DynamicCache, mean over depths")
    _gate_flag(p, "--max-kl-mean", "gate: mean KL(DynamicCache || candidate) on the continuation, nats")
    p.add_argument(
        "--prefer",
        choices=PREFERENCES,
        default=None,
        help="how the decision selects among the capacity rows that pass every gate: memory, the one saving the "
        "most cache bytes; latency, the lowest latency ratio (time per output token vs DynamicCache) among those "
        "at the context memory selects, a tie going to the more bytes saved (default "
        f"{_default('prefer')}; recorded in the result's settings, which kvlab report reads)",
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
    _setting_flag(p, "--passkey-trials", int_flag(), "passkey_trials", "passkey trials per (depth, context) point")
    _setting_flag(p, "--passkey-depths", _floats, "passkey_depths", "needle depths as fractions")
    _setting_flag(p, "--recall-rows", int_flag(), "recall_rows", "recall prompts per distance")
    _setting_flag(
        p, "--recall-fractions", _floats, "recall_fractions", "copy distances as fractions of the context"
    )
    _setting_flag(p, "--recall-span", int_flag(), "recall_span_tokens", "copy span length L in tokens")


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
    _setting_flag(p, "--batch", int_flag(), "batch", "prompts per generate() call")
    _setting_flag(p, "--seed", int_flag(), "seed", "random seed: torch and the held-out text offsets")
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
    p.add_argument(
        "--out-dir",
        default="results",
        help="directory for <label>.json (default results/, made on a first run); a new folder is made only in a "
        "folder that exists",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing result with the same label")
    p.add_argument("--dry-run", action="store_true", help="write the plan only; load no model")
    p.add_argument(
        "--resume",
        metavar="RESULT",
        default=None,
        help="continue the interrupted run whose result file is RESULT (status stopped: Ctrl-C or SIGTERM; "
        "running: killed; failed: an error) and rewrite that file: its settings come from the file (no other flag but --json; same model, "
        "device, software and thread count), the cells it finished (timed, rows written) are kept, so are the cells "
        "and probes it measured but did not time yet (they are only timed), every other cell is measured and timed "
        "from the start, and the summary covers all rows. Stop a run still running before resuming it",
    )
    p.add_argument("--json", action="store_true", help="print the result JSON instead of tables")
