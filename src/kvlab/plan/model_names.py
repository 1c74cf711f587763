"""Whether a model named in a vLLM log is the model kvlab plans: the names each goes by, compared loosely.

``kvlab plan MODEL --from-log FILE`` explains the log's figures with MODEL's config; a log of another model gives
errors of hundreds of percent that look like kvlab's. MODEL goes by its own text, a preset's name and hub id
(:func:`kvlab.plan.presets.find`), a config file's folder or stem and the config's ``_name_or_path``; the log's
model by what it states (a hub id, a local path) and, where that is a preset's hub id, the preset's names. Two
names are compared on their last path part, case-insensitively, with trailing variant tags dropped
(``-Instruct``, ``-it``, ``-hf``, ``-AWQ``, ``-FP8``, ``.Q4_1``, ...: a quantized or instruction-tuned copy has the
base model's KV geometry), so ``Qwen/Qwen2.5-7B-Instruct-AWQ`` is the preset ``qwen2.5-7b`` and
``llava-hf/llava-v1.6-mistral-7b-hf`` is not ``gemma-3-1b``. Pure Python; no torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from kvlab.plan import presets

# trailing tags of a checkpoint's name that do not change its architecture (instruction tuning, packaging,
# weight quantization), each after a '-', '_' or '.'
_VARIANT = re.compile(
    r"[-_.](?:instruct|chat|it|pt|hf|base|awq|gptq|gguf|bnb|fp8|fp16|bf16|int4|int8|4bit|8bit|w4a16|w8a8|"
    r"dynamic|q[0-9]+(?:_[a-z0-9]+)*)$"
)


def base_name(name: str) -> str:
    """``name``'s last path part, lower-case, without a ``.json`` / ``.gguf`` suffix or trailing variant tags
    (``"Qwen/Qwen2.5-7B-Instruct-AWQ"`` -> ``"qwen2.5-7b"``; ``"~/m/SmolLM2-135M-Instruct.Q4_1.gguf"`` ->
    ``"smollm2-135m"``)."""
    last = re.split(r"[\\/]", name.strip().rstrip("/\\"))[-1].lower()
    for suffix in (".json", ".gguf"):
        last = last.removesuffix(suffix)
    while (shorter := _VARIANT.sub("", last)) != last and shorter:
        last = shorter
    return last


def _preset_names(name: str) -> set[str]:
    preset = presets.find(name)
    return set() if preset is None else {preset.name, preset.hub_id}


# a Hugging Face hub cache folder: models--ORG--NAME (huggingface_hub's repo_folder_name: "models--" and the repo id
# with "/" as "--"), holding snapshots/<commit>/config.json
_HUB_CACHE_FOLDER = re.compile(r"models--(.+?)--(.+)")


def hub_cache_repo_id(path: Path) -> str | None:
    """The repo id (``llava-hf/llava-v1.6-mistral-7b-hf``) of the hub cache folder ``models--ORG--NAME`` that
    ``path`` (a snapshot folder or a file in it) lies in, or None: a snapshot's own folder is a commit hash, which
    names no model."""
    for part in reversed(path.parts):
        m = _HUB_CACHE_FOLDER.fullmatch(part)
        if m:
            return f"{m.group(1)}/{m.group(2)}"
    return None


def model_names(model: str | os.PathLike, config: Mapping | None = None) -> set[str]:
    """The base names (:func:`base_name`) MODEL goes by: its text, a preset's name and hub id, a ``config.json``'s
    folder (another file's stem is its text), the repo id of a hub cache snapshot it lies in
    (:func:`hub_cache_repo_id`: ``.../models--ORG--NAME/snapshots/<hash>/config.json`` went by the hash and was
    refused against its own model's log), and ``config``'s ``_name_or_path`` where stated."""
    text = os.fspath(model)
    names = {text, *_preset_names(text)}
    path = Path(text).expanduser()
    if path.name == "config.json":
        names.add(str(path.resolve().parent))
    repo_id = hub_cache_repo_id(path.absolute()) or hub_cache_repo_id(path.resolve())  # a symlinked snapshot too
    if repo_id is not None:
        names |= {repo_id, *_preset_names(repo_id)}
    stated = (config or {}).get("_name_or_path")
    if isinstance(stated, str) and stated:
        names |= {stated, *_preset_names(stated)}
    return {base_name(n) for n in names if base_name(n)}


def same_model(log_model: str, names: set[str]) -> bool:
    """Whether ``log_model`` (as a log states it) may be the model of ``names`` (:func:`model_names`): one of its
    base names, or a preset's it is the hub id of, is among them."""
    return bool({base_name(n) for n in (log_model, *_preset_names(log_model))} & names)
