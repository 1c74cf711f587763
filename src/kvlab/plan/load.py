"""Finding a model's config: :func:`load_spec` turns a preset name, a config dict or file, a model directory, a GGUF
file or a hub id into a :class:`~kvlab.plan.spec.ModelSpec` (the hub only through ``huggingface_hub``'s cache, or
online when allowed). Pure Python; no torch.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from kvlab.plan.config_fields import check_rope_scaling, decoder_config
from kvlab.plan.gguf import is_gguf_file
from kvlab.plan.gguf_config import GGUF_DTYPE, read_gguf_config
from kvlab.plan.spec import QUANTIZED_WEIGHTS_HINT, ModelSpec, spec_from_config
from kvlab.plan.weights import read_safetensors_bytes


def _read_json(path: Path) -> dict:
    """The config in the JSON file ``path``.

    Raises:
        ValueError: not valid JSON, or a ``rope_scaling.factor`` that is not a finite number > 0 (JSON's
            ``Infinity``, ``NaN``, 0, -2), named with ``path`` (:func:`kvlab.plan.config_fields.check_rope_scaling`).
    """
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if isinstance(config, Mapping):  # the spec reader names any other shape
        check_rope_scaling(decoder_config(config)[0], str(path))
    return config


def _config_spec(config_path: Path, name: str) -> ModelSpec:
    """The spec of the ``config.json`` at ``config_path``, with the ``tokenizer_config.json`` beside it where there is
    one (vLLM reads a model folder's tokenizer from the same folder; :func:`kvlab.plan.spec.spec_from_config` takes
    its ``model_max_length`` where vLLM does).

    Raises:
        ValueError: either file is not valid JSON, ``tokenizer_config.json`` is not a JSON object, or a field is
            refused (named with its file).
    """
    config = _read_json(config_path)
    tokenizer_path = config_path.with_name("tokenizer_config.json")
    if config_path.name != "config.json" or not tokenizer_path.is_file() or not isinstance(config, Mapping):
        return spec_from_config(config, name=name)
    try:
        with open(tokenizer_path, encoding="utf-8") as f:
            tokenizer = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{tokenizer_path} is not valid JSON: {e}") from e
    if not isinstance(tokenizer, Mapping):
        raise ValueError(f"{tokenizer_path} must be a JSON object, got {type(tokenizer).__name__}")
    return spec_from_config(config, name=name, tokenizer_config=tokenizer, tokenizer_source=str(tokenizer_path))


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _looks_like_path(text: str) -> bool:
    """``./x``, ``../x``, ``/x``, ``~/x``, ``x/``, ``*.json`` or ``*.gguf``: meant as a local path, never a preset or
    hub id."""
    return text.startswith(("./", "../", "/", "~", ".\\", "..\\")) or text.lower().endswith(
        ("/", "\\", ".json", ".gguf")
    )


# GGUF file types whose weights are plain floats (the rest are quantized)
_GGUF_PLAIN_TYPES = ("F32", "F16", "BF16", "F64")


def _gguf_spec(path: Path) -> ModelSpec:
    """The :class:`ModelSpec` of a GGUF file: its header read by :func:`kvlab.plan.gguf_config.read_gguf_config`, then
    :func:`spec_from_config`; ``checkpoint_bytes`` is the file's tensor data (the weights as llama.cpp holds
    them, quantized or not; None for a shard of a split GGUF), with notes on the KV dtype assumed and on the
    quantized weights.

    Raises:
        ValueError: see :func:`kvlab.plan.gguf_config.read_gguf_config` (each names the file); a config field the spec
            refuses is named with the file.
    """
    cfg = read_gguf_config(path)
    info = cfg["_gguf"]
    try:
        spec = spec_from_config(cfg, name=str(path))
    except ValueError as e:
        raise ValueError(f"{path} (GGUF header read as a config): {e}") from None
    notes = list(spec.notes)
    notes.append(
        f"GGUF states no torch dtype: the KV cache is sized in {GGUF_DTYPE}, the dtype of the dequantized model "
        "(llama.cpp's default f16 KV cache takes the same 2 B per value; pass --kv-dtype for another)"
    )
    if info["split_count"] > 1 or info["tensor_bytes"] is None:
        why = (
            f"shard of a {info['split_count']}-file split GGUF"
            if info["split_count"] > 1
            else f"its tensor types include one unknown to this gguf package ({info['tensor_types']})"
        )
        notes.append(
            f"GGUF weights are {info['file_type']}; the file's tensor bytes are not the model's ({why}), so weight "
            f"bytes come from the parameter count{QUANTIZED_WEIGHTS_HINT}"
        )
        return replace(spec, notes=tuple(notes))
    if info["file_type"] not in _GGUF_PLAIN_TYPES:
        notes.append(
            f"GGUF weights are {info['file_type']}: weight bytes default to the file's {info['tensor_bytes']:,} B "
            f"of tensor data (quantized, as llama.cpp holds them), not a dequantized copy{QUANTIZED_WEIGHTS_HINT}"
        )
    return replace(
        spec,
        checkpoint_bytes=info["tensor_bytes"],
        checkpoint_source=f"{path.name} ({info['file_type']})",
        checkpoint_format="GGUF",
        notes=tuple(notes),
    )


def load_spec(model: str | os.PathLike | Mapping | ModelSpec) -> ModelSpec:
    """Resolve ``model`` to a :class:`ModelSpec`.

    ``model`` may be a :class:`ModelSpec`, a config dict, a preset name or its hub id (case-insensitive, see
    :mod:`kvlab.plan.presets`), a ``config.json`` path, a GGUF file (a ``.gguf`` path, or any file that starts
    with the GGUF magic: its header is read by :func:`kvlab.plan.gguf_config.read_gguf_config`, torch-free, and its
    tensor data bytes set :attr:`ModelSpec.checkpoint_bytes`), a model directory (its safetensors weights, when
    present, set :attr:`ModelSpec.checkpoint_bytes`; the ``tokenizer_config.json`` beside a ``config.json``, when
    present, gives its ``model_max_length``: :func:`_config_spec`), or a hub id (``org/name``) whose ``config.json`` is fetched
    with ``huggingface_hub`` when that package is importable (cached copy first; online only when allowed).

    Raises:
        ValueError: ``model`` of another type (None, a number), nothing matches ``model`` (a path-like ``model``, see :func:`_looks_like_path`, that does not
            exist is reported as a missing directory, config or GGUF file, never looked up on the hub), the config
            is malformed (the message names the field), or a GGUF file that is not one, is cut short, lacks a key
            or needs the ``gguf`` package (the message names the file).
    """
    from kvlab.plan import presets

    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return spec_from_config(model, name=str(model.get("_name_or_path") or "config"))
    if not isinstance(model, (str, os.PathLike)):  # os.fspath's TypeError named neither the argument nor the value
        raise ValueError(
            "`model` must be a preset name, a path, a hub id, a config dict or a ModelSpec, got "
            f"{type(model).__name__} {model!r}"
        )
    text = os.fspath(model)
    if not text.strip():
        raise ValueError(
            f"`model` must name a preset, a config.json, a GGUF file, a directory or a hub id, got {text!r}"
        )
    preset = presets.find(text)
    if preset is not None:
        return spec_from_config(preset.config, name=preset.name)
    path = Path(text).expanduser()
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = (
                f" (it holds {', '.join(ggufs[:3])}{', ...' if len(ggufs) > 3 else ''}: pass the file)"
                if ggufs
                else ""
            )
            raise ValueError(f"directory {path} has no config.json{hint}")
        spec = _config_spec(config_path, str(path))
        found = read_safetensors_bytes(path)
        if found is not None:
            spec = replace(spec, checkpoint_bytes=found[0], checkpoint_source=found[1])
        return spec
    if path.is_file():
        if path.suffix.lower() == ".gguf" or is_gguf_file(path):
            return _gguf_spec(path)
        return _config_spec(path, str(path))
    if _looks_like_path(text):
        kinds = {".json": "config file", ".gguf": "GGUF file"}
        kind = next((k for end, k in kinds.items() if text.lower().endswith(end)), "model directory")
        raise ValueError(f"{kind} {text!r} does not exist (looked for {path.resolve()})")
    if _HUB_ID.match(text):
        return spec_from_config(_hub_config(text), name=text)
    close = difflib.get_close_matches(text.lower(), presets.names(), n=1, cutoff=0.8)  # llama3-8b: llama-3-8b
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ValueError(
        f"model {text!r} is not a preset, a config.json, a GGUF file, a directory or a hub id{hint}; presets: "
        f"{', '.join(presets.names())}"
    )


def _hub_config(repo_id: str) -> dict:
    """``config.json`` of a hub model via ``huggingface_hub`` (never required: a clear error without it)."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as e:
        raise ValueError(
            f"{repo_id!r} looks like a hub id but huggingface_hub is not installed; pass a config.json path"
        ) from e
    try:
        path = hf_hub_download(repo_id, "config.json", local_files_only=True)
    except Exception:
        from kvlab.runtime.hub import hub_offline_reason

        offline = hub_offline_reason()
        if offline is not None:  # fail now, not after huggingface_hub's ~25 s of retries
            raise ValueError(
                f"{repo_id!r} is not in the local Hugging Face cache and the hub cannot be reached ({offline}); "
                f"pass a config.json path or a preset"
            ) from None
        try:
            path = hf_hub_download(repo_id, "config.json")
        except Exception as e:
            raise ValueError(f"could not fetch config.json of {repo_id!r} from the hub: {e}") from e
    return _read_json(Path(path))


def load_config(model: str | os.PathLike | Mapping) -> dict:
    """The config dict behind ``model`` (what :func:`load_spec` reads): a preset's fields, a ``config.json``
    (a file or a directory's), a GGUF header read as config keys, or a hub id's config.

    Raises:
        ValueError: as :func:`load_spec` for a ``model`` that names nothing readable.
    """
    from kvlab.plan import presets

    if isinstance(model, Mapping):
        return dict(model)
    text = os.fspath(model)
    preset = presets.find(text) if text.strip() else None
    if preset is not None:
        return dict(preset.config)
    path = Path(text).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return _read_json(path / "config.json")
    if path.is_file():
        if path.suffix.lower() == ".gguf" or is_gguf_file(path):
            return read_gguf_config(path)
        return _read_json(path)
    load_spec(text)  # raises the error load_spec gives for this text
    return _hub_config(text)
