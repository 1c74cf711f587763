"""Model loading for kvlab: the bundled reference model, any Hugging Face decoder, a GGUF file and the named real
models of :mod:`kvlab.models.sources`, one code path.

The bundled model (``reference/``, trained by ``scripts/train_reference.py``) is a plain Hugging Face
directory, so it loads with ``AutoModelForCausalLM.from_pretrained`` exactly like a hub id or a local checkpoint.
Its held-out text (files the model and tokenizer never saw) supplies real-text prompts of exact token lengths.
"""

from __future__ import annotations

import hashlib
import os
import re
import weakref
from pathlib import Path

import torch

from kvlab.runtime.checks import check_int
from kvlab.runtime.device import resolve_device
from kvlab.runtime.dtypes import parse_dtype

__all__ = [
    "ModelLoadError",
    "check_local_model",
    "heldout_text",
    "heldout_token_ids",
    "load_model",
    "model_fingerprint",
    "model_source",
    "reference_model_path",
]

# What a local model directory needs besides config.json (any one name or pattern of each tuple): torch weights in
# either format transformers loads (sharded or not), and the files of some tokenizer (fast tokenizer.json,
# sentencepiece, BPE vocab + merges, WordPiece vocab, tiktoken).
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
    "*.tiktoken",
)

# A hub id is "name" or "owner/name" (huggingface_hub's rule: letters, digits, "-", "_", "."; no "--" or "..").
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")


def reference_model_path() -> Path:
    """Directory of the bundled reference model (``config.json``, ``model.safetensors``, tokenizer files, ...).

    The directory ships inside the package; it may be absent only in a checkout where the training script has not
    been run, which ``load_model`` and ``heldout_text`` report with a ``FileNotFoundError``.
    """
    return Path(__file__).resolve().parent / "reference"


def _local_model_dir(model: str | os.PathLike) -> Path | None:
    """The local directory ``model`` names, or None when it is a hub id; raises when a path is wrong."""
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise NotADirectoryError(f"model path {str(model)!r} is a file, expected a model directory")
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model directory {str(model)!r} has no config.json")
        return path
    text = os.fspath(model)
    if isinstance(model, os.PathLike) or not _HUB_ID.match(text) or "--" in text or ".." in text:
        raise FileNotFoundError(f"model directory {text!r} does not exist (and it is not a hub id)")
    return None


def _check_model_files(path: Path, model: str | os.PathLike) -> None:
    """Raise ``FileNotFoundError`` naming ``model`` when its directory lacks weights or tokenizer files."""
    missing = []
    if not any(any(path.glob(pattern)) for pattern in WEIGHT_FILES):
        missing.append("no weights (*.safetensors or pytorch_model.bin)")
    if not any(any(path.glob(pattern)) for pattern in TOKENIZER_FILES):
        missing.append("no tokenizer files (tokenizer.json, tokenizer.model, vocab.json, vocab.txt, ...)")
    if missing:
        raise FileNotFoundError(f"model directory {str(model)!r} has config.json but {' and '.join(missing)}")


def check_local_model(model: str | os.PathLike | None, revision: str | None = None) -> None:
    """Refuse a ``--model`` that ``load_model`` would refuse, without loading anything (no torch work; for a hub id
    one look in the local cache and, on a miss, one short TCP connect): commands call it to report a bad
    ``--model`` as bad input (exit 2) before any work starts.

    Args:
        model: None (the bundled model: passes), a local directory, a GGUF file, a named model
            (:data:`kvlab.model_names.NAMED_MODELS`) or a hub id (passes when the local Hugging Face cache
            holds it or the hub can be reached).
        revision: the hub revision a hub id is loaded at (its cache entry is looked for).

    Raises:
        FileNotFoundError: a path that does not exist (and is not a hub id), or a directory without
            ``config.json``, weights or tokenizer files (the path named); a named model not installed (the
            message names the command that gets it).
        NotADirectoryError: a file where a model directory was expected.
        OSError: a hub id that is not in the local cache while the hub cannot be reached (offline).
        ValueError: an empty ``model``, a file that is not GGUF, a named model's file that fails its sha256
            check.
    """
    if model is None:
        return
    found = model_source(model)
    if found.gguf is not None:  # found, its sha256 checked; converted when loaded
        if not found.ready:  # a truncated or corrupt file: refused now, not mid-load
            from kvlab.models.sources import check_gguf_file

            check_gguf_file(found.gguf)  # corrupt, or its layers lack tensors
        return
    name = found.load_from if found.kind == "named" else model  # a named model without a GGUF: its hub id
    source = _local_model_dir(name)
    if source is not None:
        _check_model_files(source, name)
    else:  # a hub id: in the local cache, or the hub reachable
        _check_hub_or_cache(os.fspath(name), revision)


def _check_hub_or_cache(name: str, revision: str | None) -> None:
    """A hub id must be in the local cache or the hub must be reachable; else an ``OSError`` at once (instead of
    ~25 s of ``huggingface_hub`` retries before the same failure)."""
    from huggingface_hub import try_to_load_from_cache

    from kvlab.runtime.hub import hub_offline_reason

    cached = try_to_load_from_cache(name, "config.json", revision=revision)
    if isinstance(cached, str) or _in_hub_cache(name):  # a snapshot at another revision: the loader decides
        return
    offline = hub_offline_reason()
    if offline is not None:
        raise OSError(
            f"{name!r} is not a local directory, not in the local Hugging Face cache, and the hub cannot be "
            f"reached ({offline}); {_offline_alternatives(name)}"
        )


def _offline_alternatives(name: str) -> str:
    """What a model name could have been without the hub: a local directory, a GGUF file or a named model, the
    closest named model first (``smollm2`` for ``smollm2-135m``: the hub was asked only because no name matched)."""
    import difflib

    from kvlab.model_names import NAMED_MODELS

    close = difflib.get_close_matches(name.lower(), list(NAMED_MODELS), n=1, cutoff=0.6)
    hint = f"did you mean --model {close[0]}? " if close else ""
    return (
        f"{hint}pass a local model directory, a GGUF file or a named model ({', '.join(NAMED_MODELS)}; "
        "`kvlab models` lists them)"
    )


def _in_hub_cache(name: str) -> bool:
    """Whether the local Hugging Face cache holds any snapshot of the model ``name`` (``owner/name``)."""
    from huggingface_hub import constants

    return any((Path(constants.HF_HUB_CACHE) / f"models--{name.replace('/', '--')}" / "snapshots").glob("*"))


def _resolve_for_loading(model: str | os.PathLike | None) -> tuple[str | os.PathLike | None, Path | None]:
    """``(model, local directory or None for a hub id)``: a GGUF file or named model converted (once) and replaced
    by its directory or the hub id it stands for; a local directory's files checked before transformers sees them
    (its messages for these are obscure)."""
    if model is None:
        source = reference_model_path()
        if not (source / "config.json").is_file():
            raise FileNotFoundError(
                f"the bundled reference model is missing from {source}; run scripts/train_reference.py"
            )
        return model, source
    from kvlab.models.sources import prepare_source

    resolved = prepare_source(model)
    if resolved.kind != "directory":
        model = resolved.load_from
    source = _local_model_dir(model)
    if source is not None:
        _check_model_files(source, model)
    return model, source


class ModelLoadError(OSError, ValueError):
    """A local model folder whose files transformers cannot read (damaged or truncated weights, a config that does
    not match them, a tokenizer file that is not JSON): the folder, the files and transformers' error named.
    ``model`` is the value the caller passed; a command names its flag (:func:`kvlab.commands.fail`)."""

    def __init__(self, model: object, reason: str):
        super().__init__(f"model folder {model} cannot be loaded: {reason}")
        self.model, self.reason = model, reason


def _from_pretrained(auto, name: str, source: Path | None, revision: str | None, files: str, **kwargs):
    """``auto.from_pretrained(name, ...)``; for a local folder any failure becomes a :class:`ModelLoadError`
    naming the folder and ``files`` (transformers' own messages name neither, e.g. "header too large")."""
    try:
        return auto.from_pretrained(name, revision=revision, **kwargs)
    except AssertionError:  # a broken invariant (or a test's sentinel), not a damaged file
        raise
    except Exception as e:
        if source is None:
            raise
        detail = " ".join(str(e).split())
        detail = detail if len(detail) <= 300 else detail[:300] + " ..."
        raise ModelLoadError(
            name, f"{files} are damaged or do not match ({type(e).__name__}: {detail})"
        ) from e


def load_model(
    model: str | os.PathLike | None = None,
    dtype: str | torch.dtype = "bfloat16",
    device: str | torch.device = "cpu",
    revision: str | None = None,
):
    """Load a causal LM and its tokenizer with ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``.

    Args:
        model: None for the bundled reference model; otherwise a local model directory, a GGUF file or a named
            model (both converted once to a bf16 directory, :func:`kvlab.models.sources.prepare_source`), or a
            Hugging Face hub id (``owner/name``), resolved by transformers (its cache when offline).
        dtype: ``"bfloat16"`` (default, the quantization chapter's dtype), ``"float16"`` or ``"float32"``.
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (CUDA when available; :func:`kvlab.runtime.device.resolve_device`).
        revision: hub branch, tag or commit; only for hub ids.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode on ``device``. A tokenizer without a pad token gets
        its eos token as pad token (batched prompts need one).

    Raises:
        ValueError: unknown ``dtype`` or ``device``, CUDA requested without CUDA, ``revision`` for a local path.
        ModelLoadError: a local folder whose files transformers cannot read (an ``OSError`` and a ``ValueError``).
        FileNotFoundError: a local path that does not exist, or lacks ``config.json``, weights
            (:data:`WEIGHT_FILES`) or tokenizer files (:data:`TOKENIZER_FILES`), or a bundled model that was never
            trained; no hub lookup is attempted and transformers is not called for these.
        OSError: a hub id that neither the hub nor the local cache can provide.
        ValueError: a GGUF file that is not GGUF, truncated, fails its pinned sha256, or holds an architecture
            transformers cannot load (the file named).
    """
    torch_dtype = parse_dtype(dtype)
    torch_device = resolve_device(device)

    model, source = _resolve_for_loading(model)
    if source is not None and revision is not None:
        raise ValueError(
            f"`revision` applies to hub ids only, got {revision!r} for local directory {str(source)!r}"
        )
    name = str(source) if source is not None else os.fspath(model)

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # a local load takes well under a second: its "Loading weights" bar is noise in every kvlab command's output
    # (a hub download keeps its progress bars)
    bar_was_on = hf_logging.is_progress_bar_enabled()
    if source is not None:
        hf_logging.disable_progress_bar()
    if source is None:
        _check_hub_or_cache(name, revision)
    try:
        tokenizer = _from_pretrained(
            AutoTokenizer, name, source, revision, "its tokenizer files or config.json"
        )
        lm = _from_pretrained(
            AutoModelForCausalLM, name, source, revision, "its config.json or weights", dtype=torch_dtype
        )
    except OSError as e:
        if source is not None:
            raise
        raise OSError(
            f"{name!r} is not a local directory, and neither the Hugging Face hub nor its local cache could "
            f"provide it (revision {revision!r}): {e}"
        ) from e
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    lm.to(torch_device)
    lm.eval()
    return lm, tokenizer


def heldout_text() -> str:
    """The bundled model's held-out text: whole documentation files it never saw in training, joined by blank lines.

    Raises:
        FileNotFoundError: the bundled model directory has no ``heldout.txt``.
    """
    path = reference_model_path() / "heldout.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run scripts/train_reference.py")
    return path.read_text(encoding="utf-8")


def heldout_token_ids(tokenizer, n_tokens: int, offset: int = 0) -> list[int]:
    """Exactly ``n_tokens`` token ids of the held-out text, starting at token ``offset``: `[n_tokens]` ints.

    The whole held-out text is tokenized by ``tokenizer`` (any Hugging Face tokenizer; no special tokens added)
    and the slice ``[offset, offset + n_tokens)`` is returned, so prompts of exact lengths can be cut from
    several places; ``torch.tensor([cut_a, cut_b])`` makes a `[batch, n_tokens]` batch. Consecutive cuts
    concatenate: ``cut(n, o) + cut(m, o + n) == cut(n + m, o)``.

    Raises:
        ValueError: ``n_tokens`` < 1, ``offset`` < 0, or the text has fewer than ``offset + n_tokens`` tokens.
    """
    check_int("n_tokens", n_tokens, 1)
    check_int("offset", offset, 0)
    ids = _heldout_ids(tokenizer)
    if offset + n_tokens > len(ids):
        raise ValueError(
            f"held-out text has {len(ids):,} tokens under this tokenizer; `offset` {offset} + `n_tokens` {n_tokens} "
            f"= {offset + n_tokens} exceeds it"
        )
    return list(ids[offset : offset + n_tokens])


# tokenizer -> (vocabulary size, held-out token ids): tokenizing the held-out text takes about a second on a busy
# CPU and a run cuts many prompts; a tokenizer that grew new tokens is re-tokenized.
_HELDOUT_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _heldout_ids(tokenizer) -> list[int]:
    try:
        cached = _HELDOUT_IDS.get(tokenizer)
    except TypeError:  # not weak-referenceable or not hashable: no cache
        cached = None
    if cached is not None and cached[0] == len(tokenizer):
        return cached[1]
    ids = list(tokenizer(heldout_text(), add_special_tokens=False, verbose=False)["input_ids"])
    try:
        _HELDOUT_IDS[tokenizer] = (len(tokenizer), ids)
    except TypeError:
        pass
    return ids


def model_fingerprint(model: str | os.PathLike | None = None, revision: str | None = None) -> str:
    """A content identity of a model for result provenance.

    - a local directory (None = the bundled model): ``"sha256:<hex>"`` over its files in sorted relative-path
      order, each contributing its path and the sha256 of its bytes (hidden files and ``__pycache__`` skipped);
    - a hub id: ``"hf:<id>@<commit>"`` with the commit the local Hugging Face cache resolves ``revision``
      (default ``main``) to, or ``"hf:<id>@<revision> (unresolved)"`` when the cache cannot say.

    - a GGUF file or a named model shipped as one: ``"gguf-sha256:<hex>"`` of the file.

    Raises:
        FileNotFoundError: a local path that does not exist, a named model not installed.
    """
    if model is not None:
        found = model_source(model)
        if found.fingerprint is not None:
            return found.fingerprint
        if found.kind == "named":
            model = found.load_from
    source = reference_model_path() if model is None else _local_model_dir(model)
    if source is None:
        repo_id = os.fspath(model)
        commit = _cached_commit(repo_id, revision)
        return f"hf:{repo_id}@{commit}" if commit else f"hf:{repo_id}@{revision or 'main'} (unresolved)"
    if not source.is_dir():
        raise FileNotFoundError(f"model directory {str(source)!r} does not exist")
    digest = hashlib.sha256()
    files = sorted(
        p
        for p in source.rglob("*")
        if p.is_file()
        and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(source).parts)
    )
    from kvlab.models.sources import file_sha256

    for path in files:
        digest.update(path.relative_to(source).as_posix().encode("utf-8") + b"\0")
        digest.update(bytes.fromhex(file_sha256(path)))
    return f"sha256:{digest.hexdigest()}"


def model_source(model: str | os.PathLike | None):
    """What ``model`` names (:class:`kvlab.models.sources.ModelSource`), without converting or loading it: its
    kind, what it loads from, and its provenance (package, version, GGUF sha256, weights) for results.

    Raises:
        as :func:`kvlab.models.sources.find_source`.
    """
    from kvlab.models.sources import find_source

    return find_source(model)


def _cached_commit(repo_id: str, revision: str | None) -> str | None:
    """Commit hash the local Hugging Face cache maps ``revision`` to, or None; never touches the network."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub ships with transformers
        return None
    cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    if isinstance(cached, str):  # .../models--owner--name/snapshots/<commit>/config.json
        return Path(cached).parent.name
    return None
