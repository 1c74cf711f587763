"""What the lab's real-model runs (``kvlab lab --real``, ``kvlab lab eviction``) and ``kvlab inspect`` check before
their work starts, and how they cut long loops into reported steps.

* **positions**: a ``--tokens`` past the model's ``max_position_embeddings`` describes positions the model was
  never trained on (a RoPE model still runs there). ``kvlab lab --real`` refuses it unless ``--allow-past-limit``
  (:func:`position_refusal`), then warns; ``kvlab lab eviction`` and ``kvlab inspect`` warn
  (:func:`position_warning`). :func:`max_positions` reads the limit from a loaded model's config,
  :func:`configured_max_positions` from the files, before loading.
* **memory**: :func:`kvlab.runtime.provenance.available_memory_bytes` (``MemAvailable`` of ``/proc/meminfo``) against a run's estimate
  (built from :func:`activation_bytes` and :func:`kv_bytes`); :func:`memory_refusal` words the refusal.
* **steps**: :func:`spans` cuts a loop of ``n`` forwards into spans of :data:`STEP_TOKENS`, each reported as one
  progress step (``kvlab.commands.progress``), so no step of a long run is silent for more than seconds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvlab.runtime.checks import echoed_value, is_int

STEP_TOKENS = 128  # forwards (decoded tokens, scored windows) per reported progress step

# Step names stay under ~60 characters: off a terminal a progress line is "[k/total] <elapsed> s  <step>" and
# rich wraps what passes 80 columns onto a second line.

Progress = Callable[[str], None]  # called with a step's name as it starts


def spans(start: int, stop: int, size: int = STEP_TOKENS) -> list[tuple[int, int]]:
    """``[start, stop)`` cut into consecutive ``(a, b)`` of at most ``size`` items; ``[(start, start)]`` when the
    range is empty (a loop with nothing to do is still one step, so step counts never reach zero).

    Raises:
        ValueError: ``size`` < 1.
    """
    if size < 1:
        raise ValueError(f"`size` must be >= 1, got {size!r}")
    if stop <= start:
        return [(start, start)]
    return [(a, min(a + size, stop)) for a in range(start, stop, size)]


def model_label(model: str | os.PathLike | None) -> str:
    """A short name of a ``--model`` value for a progress step: ``the bundled model``, else its last path part
    (a directory's or GGUF file's name, a hub id's repository name, a named model as given)."""
    if model is None:
        return "the bundled model"
    text = os.fspath(model).rstrip("/")
    return os.path.basename(text) or text


def text_config(config: Any) -> Any:
    """The text part of a transformers config (``get_text_config()`` of a multimodal one), else ``config``."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def forward_shape(config: Any) -> dict[str, int]:
    """The sizes a memory estimate needs, from a transformers config (its text part): ``vocab``, ``hidden``,
    ``intermediate``, ``layers``, ``kv_heads``, ``head_dim`` (missing fields from the usual defaults)."""
    cfg = text_config(config)
    hidden, layers = int(cfg.hidden_size), int(cfg.num_hidden_layers)
    heads = int(getattr(cfg, "num_attention_heads", None) or 1)
    return {
        "vocab": int(cfg.vocab_size),
        "hidden": hidden,
        "intermediate": int(getattr(cfg, "intermediate_size", None) or 4 * hidden),
        "layers": layers,
        "kv_heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(cfg, "head_dim", None) or hidden // heads),
    }


def activation_bytes(config: Any, rows: int) -> int:
    """Peak activations of one forward over ``rows`` token positions (all batch rows together): ``rows x (32
    hidden + 8 intermediate)`` float32, measured ~110 KB per token on SmolLM2-135M."""
    shape = forward_shape(config)
    return rows * (32 * shape["hidden"] + 8 * shape["intermediate"]) * 4


def kv_bytes(config: Any, rows: int, itemsize: int) -> int:
    """K and V of ``rows`` token positions, every layer, in a dtype of ``itemsize`` bytes."""
    shape = forward_shape(config)
    return 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * rows * itemsize


def max_positions(config: Any) -> int | None:
    """A loaded model's ``max_position_embeddings`` (of its text config), or None when it states none."""
    limit = getattr(text_config(config), "max_position_embeddings", None)
    return limit if is_int(limit) and limit > 0 else None


def configured_max_positions(model: str | os.PathLike | None) -> int | None:
    """``max_position_embeddings`` of ``model`` (a ``--model`` value; None: the bundled model) read from its files,
    without loading it (:func:`configured_spec`); None when no file says.

    Raises:
        as :func:`kvlab.models.model_source` (a missing path, a named model not installed, a file not GGUF).
    """
    spec = configured_spec(model)
    return None if spec is None else spec.max_position_embeddings


def configured_spec(model: str | os.PathLike | None):
    """The planner's :class:`~kvlab.plan.spec.ModelSpec` of ``model`` (a ``--model`` value; None: the bundled model)
    read from its files, without loading it: the ``config.json`` of a local or converted directory or of the local
    Hugging Face cache, or the header of a GGUF not yet converted (:func:`kvlab.plan.gguf_config.read_gguf_config`).
    None when no file says (a hub id not cached, a config the planner cannot read: the command's own load reports
    those).

    Raises:
        as :func:`kvlab.models.model_source` (a missing path, a named model not installed, a file not GGUF).
    """
    import json

    from kvlab.models import model_source
    from kvlab.plan.gguf_config import read_gguf_config
    from kvlab.plan.spec import spec_from_config

    source = model_source(model)
    try:
        if source.gguf is not None and not source.ready:
            config = read_gguf_config(source.gguf)
        else:
            path = _config_file(source.load_from)
            if path is None:
                return None
            config = json.loads(path.read_text(encoding="utf-8"))
        return spec_from_config(config, name=str(model))
    except (OSError, ValueError, TypeError, KeyError):  # unreadable: the command's load reports the problem
        return None


def _config_file(load_from: str) -> Path | None:
    """``config.json`` of a local directory, else of a hub id in the local Hugging Face cache (no network), else
    None."""
    local = Path(load_from).expanduser() / "config.json"
    if local.is_file():
        return local
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(load_from, "config.json")
    except (ImportError, ValueError):  # not a hub id either
        return None
    return Path(cached) if isinstance(cached, str) else None


def position_warning(
    flag: str, tokens: int, limit: int | None, consequence: str, *, list_flag: bool = False
) -> str | None:
    """``"<flag> <tokens> passes the model's max_position_embeddings (<limit>): <consequence>"``, or None when
    ``tokens`` is within ``limit`` or the model states no limit. ``list_flag``: ``flag`` is a comma-separated list
    (``--contexts``), so ``tokens`` is printed plain (:func:`kvlab.runtime.checks.echoed_value`)."""
    if limit is None or tokens <= limit:
        return None
    return f"{flag} {echoed_value(tokens, list_flag=list_flag)} passes the model's max_position_embeddings ({limit:,}): {consequence}"


def position_refusal(
    flag: str, tokens: int, limit: int | None, consequence: str, allow: str, *, list_flag: bool = False
) -> str | None:
    """The refusal of a run whose ``tokens`` pass the model's ``max_position_embeddings`` (``limit``; None: it states
    none): :func:`position_warning`'s words, then what to pass instead (``flag`` at the limit, or ``allow``, the
    switch that runs it anyway: ``--allow-past-limit``, the one flag name of ``kvlab lab --real`` and ``kvlab
    eval``); None within the limit. A run there is minutes to hours of numbers on positions the model was never
    trained on, so it is asked for, not started by a typo'd size. ``list_flag``: as :func:`position_warning`'s."""
    warning = position_warning(flag, tokens, limit, consequence, list_flag=list_flag)
    if warning is None:
        return None
    return f"{warning}; pass {flag} {limit} or less, or {allow} to run past it"


def gib(n: float) -> str:
    """Bytes as GiB with two decimals (``"13.60 GiB"``)."""
    return f"{n / 2**30:.2f} GiB"


def memory_refusal(what: str, need: int, available: int | None, hint: str = "") -> str | None:
    """Why ``what`` cannot run (``None`` when it fits, or when the available memory is unknown): it needs about
    ``need`` bytes above what is loaded and the machine has ``available``; ``hint`` says what would fit."""
    if available is None or need <= available:
        return None
    more = f"; {hint}" if hint else ""
    return f"{what} needs about {gib(need)} of memory, the machine has {gib(available)} available{more}"
