"""The ``EvalConfig`` a ``kvlab eval`` command line asks for: flag -> field, the checks across flags, and the flag
named beside the field in a config error."""

from __future__ import annotations

import argparse
from dataclasses import replace

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
    "prefer": "prefer",
}


def _gate_flags() -> tuple[str, ...]:
    """The gate settings, each also the name of its flag (``max_kl_mean`` is ``--max-kl-mean``)."""
    from dataclasses import fields

    from kvlab.eval.config import Gates

    return tuple(f.name for f in fields(Gates))


def with_flags(message: str) -> str:
    """A config error names the flag beside the field: "`threads` must ..." -> "`threads` (--threads) must ..."."""
    flags = {field: flag.replace("_", "-") for flag, field in _FIELDS.items()}
    flags["retrieval_contexts"] = "retrieval-contexts"  # set outside _FIELDS ('all' / 'none')
    flags["label"] = "label"  # checked where the result file is named
    flags["allow_past_limit"] = "allow-past-limit"  # a switch, set outside _FIELDS
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
        if value in (None, ()) or setting in taken:  # unset, or --window-residuals none (no window matrix)
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
                f"(--contexts up to {longest}): it would evict nothing and measure DynamicCache; give it a "
                f"smaller budget or window, or longer --contexts"
            )


def config_from_args(args: argparse.Namespace):
    """Build the EvalConfig (``--quick`` base, then every explicit flag; ``--candidates`` without the float baseline
    gets it first, :func:`kvlab.eval.candidates.with_baseline`, as ``kvlab tasks`` does)."""
    from kvlab.eval.candidates import with_baseline
    from kvlab.eval.config import EvalConfig, Gates, quick_config

    overrides = {
        field: getattr(args, flag) for flag, field in _FIELDS.items() if getattr(args, flag) is not None
    }
    if args.candidates is not None:  # the float baseline added where missing (run() prints baseline_note)
        overrides["candidates"] = with_baseline(args.candidates)
    gates = {k: getattr(args, k) for k in _gate_flags() if getattr(args, k) is not None}
    if gates:
        overrides["gates"] = Gates(**gates)
    if args.no_long_context:
        overrides["long_context"] = False
    if args.allow_past_limit:
        overrides["allow_past_limit"] = True
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
