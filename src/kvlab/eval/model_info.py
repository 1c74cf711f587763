"""What a ``kvlab eval`` run records and checks about its loaded model before any cell: its provenance, the
settings only the model can refute, the cells past its trained positions, and the attention it runs."""

from __future__ import annotations

from typing import Any

from kvlab.eval.candidates import Candidate, check_model_shape
from kvlab.eval.config import EvalConfig
from kvlab.eval.decision_words import BUNDLED_ID
from kvlab.runtime.checks import echoed_value
from kvlab.runtime.dtypes import float32_attention


def describe_model(model: Any, model_arg: str | None, dtype: str, device: str) -> dict:
    """Provenance of the model: id or path, content fingerprint (or resolved commit), source (kind; for a GGUF or
    named model the package, its version, the GGUF sha256 and what the weights are), architecture summary and
    ``max_position_embeddings`` (tokens; None when its config states none)."""
    from kvlab.models import model_fingerprint, model_source, reference_model_path

    path = str(reference_model_path()) if model_arg is None else model_arg
    text = model.config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    source = model_source(model_arg)
    return {
        "id_or_path": BUNDLED_ID if model_arg is None else model_arg,
        "path": path,
        "fingerprint": model_fingerprint(path),
        "source": {"kind": source.kind, **source.provenance},
        "dtype": dtype,
        "device": device,
        "architecture": type(model).__name__,
        "num_layers": text.num_hidden_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(text, "num_key_value_heads", None) or heads,
        "head_dim": getattr(text, "head_dim", None) or text.hidden_size // heads,
        "parameters": sum(p.numel() for p in model.parameters()),
        # the positions it was trained on (None: its config states none); the summary's positions_warning reads it
        "max_position_embeddings": model_max_positions(model),
    }


def check_against_model(cfg: EvalConfig, model: Any) -> None:
    """Settings only the loaded model can refute, checked before any cell runs.

    Raises:
        ValueError: ``top_k`` (--top-k) larger than the model's vocabulary (the top-k overlap would fail in the
            first cell, after the model load, as ``selected index k out of range``); a KIVI group size
            (--group-size, --window-group-size) or HQQ/quanto group size (--hqq-group-size) the model's head_dim
            and KV heads refute (:func:`kvlab.eval.candidates.check_model_shape`: every cell of those candidates
            would fail at generate); a candidate whose cache cannot be built for the model (a ``mixed-<plan>`` for
            another layer count: every cell would fail at construct), named with the reason, as ``kvlab tasks``
            refuses it.
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and cfg.top_k > vocab:
        raise ValueError(f"`top_k` (--top-k) {cfg.top_k} exceeds the model's vocabulary ({vocab:,} tokens)")
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None)
    if not isinstance(head_dim, int) and isinstance(heads, int) and heads > 0:
        head_dim = getattr(config, "hidden_size", 0) // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not (isinstance(head_dim, int) and isinstance(kv_heads, int) and head_dim > 0 and kv_heads > 0):
        return  # not a decoder config this check can read: the cells say what fails
    groups = [("group_size", cfg.group_size, (cfg.residual_length,))]
    prompts = tuple(cfg.contexts)
    if cfg.window_residuals:
        groups.append(("window_group_size", cfg.window_group_size, tuple(cfg.window_residuals)))
        prompts += (cfg.window_context,)
    check_model_shape(cfg.candidates, head_dim, kv_heads, groups, cfg.hqq_group_size, prompts)
    for name in cfg.candidates:  # one cache of each, at the capacity matrix's settings
        candidate = Candidate.parse(name)
        if candidate.unavailable_reason():
            continue  # skipped by the run, the reason recorded
        try:
            candidate.make(
                model.config, cfg.residual_length, cfg.group_size, cfg.hqq_group_size, cfg.kivi_attention
            )
        except (ValueError, TypeError) as exc:
            raise ValueError(f"cache candidate {name!r} does not fit this model: {exc}") from None
        except Exception:  # not a setting the model refutes: each cell records it (stage construct)
            continue


def check_heldout_length(cfg: EvalConfig, tokenizer: Any) -> None:
    """Refuse a context longer than the held-out text under ``tokenizer``, before any cell: prompts of held-out text
    (``prompt_mode`` ``heldout``) and the long-context probes (every capacity and window cell) are cut from it, so
    such a context failed the run in its first cell, after the model load, naming no flag.

    Raises:
        ValueError: a capacity context (--contexts) or the window context (--window-context) above the held-out
            text's token count, naming the setting, its flag, the count and why the text is needed.
    """
    from kvlab.eval.longctx.prompts import encode_heldout
    from kvlab.models import heldout_text

    uses = []
    if cfg.prompt_mode == "heldout":
        uses.append("held-out prompts")
    if cfg.long_context:
        uses.append("the long-context probes")
    if not uses:  # repeated prompts and no probes: the text is not read
        return
    asked = [("contexts", "--contexts", max(cfg.contexts))]
    if cfg.window_residuals:
        asked.append(("window_context", "--window-context", cfg.window_context))
    try:
        total = len(encode_heldout(tokenizer, heldout_text()))
    except FileNotFoundError:  # no held-out text here: the cells that need it record that
        return
    for setting, flag, context in asked:
        if context > total:
            shown = echoed_value(context, list_flag=flag == "--contexts")  # pastes back as one item
            raise ValueError(
                f"`{setting}` ({flag}) {shown} is longer than the held-out text, {total:,} tokens under this "
                f"model's tokenizer, from which {' and '.join(uses)} are cut: pass at most {total} (--prompt-mode "
                f"repeat with --no-long-context reads no held-out text)"
            )


def context_limit_problem(cfg: EvalConfig, limit: int | None) -> str | None:
    """The refusal of cells whose prompt + new tokens pass the model's ``max_position_embeddings`` (``limit``, tokens;
    None: the model states none), unless ``cfg.allow_past_limit``: a RoPE model still runs there, but its quality
    numbers describe positions it was never trained on, which is not what a user choosing a cache for it asks about.
    It names each flag past the limit with its cell length, the longest value that fits, and ``--allow-past-limit``;
    None when every cell fits or the flag allows it (then :func:`context_limit_warnings` warns)."""
    if cfg.allow_past_limit or not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        return None
    cells = [("--contexts", max(cfg.contexts), cfg.new_tokens, "--new-tokens")]
    if cfg.window_residuals:
        cells.append(("--window-context", cfg.window_context, cfg.window_new_tokens, "--window-new-tokens"))
    past, fixes = [], []
    for flag, context, new, new_flag in cells:
        if context + new > limit:
            shown = echoed_value(context, list_flag=flag == "--contexts")  # a list flag's item pastes back plain
            past.append(f"{flag} {shown} + {new:,} new tokens = {context + new:,}")
            fit = limit - new
            fixes.append(f"{flag} {fit} or less" if fit >= 1 else f"fewer {new_flag} ({new:,} alone pass it)")
    if not past:
        return None
    return (
        f"{'; '.join(past)} tokens pass the model's max_position_embeddings ({limit:,}): quality measured there "
        f"describes positions the model was not trained on; pass {' and '.join(fixes)}, or --allow-past-limit to "
        f"measure them anyway (the decision then carries a caveat)"
    )


def context_limit_warnings(cfg: EvalConfig, limit: int | None) -> list[str]:
    """Warnings for cells whose prompt + new tokens pass the model's ``max_position_embeddings`` (``limit``, tokens;
    None: the model states none), in a run that allows them (``cfg.allow_past_limit``; else
    :func:`context_limit_problem` refuses them first): a RoPE model extrapolates, but its quality numbers there
    describe positions it was never trained on. ``limit`` comes from the loaded model (:func:`model_max_positions`)
    or, before loading it, from its files (:func:`kvlab.lab.longrun.configured_max_positions`)."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        return []
    cells = [(c, cfg.new_tokens) for c in cfg.contexts]
    if cfg.window_residuals:
        cells.append((cfg.window_context, cfg.window_new_tokens))
    over = sorted({c + n for c, n in cells if c + n > limit})
    if not over:
        return []
    return [
        f"{len(over)} cell length(s) (prompt + new tokens: {', '.join(f'{t:,}' for t in over)}) pass the model's "
        f"max_position_embeddings ({limit:,}): those rows measure positions it was not trained on, and a decision "
        f"made on them carries that caveat"
    ]


def model_max_positions(model: Any) -> int | None:
    """The loaded ``model``'s ``max_position_embeddings`` (of its text config, tokens), or None when it states none."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    limit = getattr(config, "max_position_embeddings", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


def enable_attention(cfg: EvalConfig, model: Any, result: dict) -> None:
    """kvlab attention on ``model`` where a candidate or float32 attention needs it (recorded in provenance)."""
    # fused KIVI reads packed codes, SnapKV the prefill's queries; every other cache falls back to SDPA, unchanged
    # except that with float32 GEMMs it runs in float32 too (kvlab.runtime.dtypes.float32_attention)
    needed = any(Candidate.parse(n).uses_kvlab_attention(cfg.kivi_attention) for n in cfg.candidates)
    if needed or float32_attention():
        from kvlab.attention import enable

        try:
            enable(model)
        except Exception as exc:  # only float32 attention wanted it: the model keeps its own attention
            if needed:
                raise
            result["provenance"]["hardware"]["float32_attention"] = False
            result["provenance"]["hardware"]["float32_attention_note"] = (
                f"kvlab attention could not be enabled on this model ({type(exc).__name__}: {exc}): its attention "
                f"ran in the model dtype"
            )
    result["provenance"]["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
