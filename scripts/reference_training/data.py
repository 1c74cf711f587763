"""The training data of the reference model: the corpus (Debian's Python documentation, split by file), its
byte-level BPE tokenizer, the token streams, and the curriculum of window shapes the loop samples from."""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch
import transformers

SOURCES_SUBDIR = "html/_sources"  # Sphinx copies every page's reST source here as <page>.rst.txt
EOS_TOKEN = "<|endoftext|>"  # separates documents; also used as bos and pad


@dataclass(frozen=True)
class Phase:
    seq_len: int  # tokens per window
    batch_size: int  # windows per optimizer step
    fraction: float  # share of the schedule's progress


def parse_curriculum(text: str) -> list[Phase]:
    """``"256x8:0.3,4352x1:0.7"`` -> phases; fractions must be positive and sum to 1 (ValueError otherwise)."""
    phases = []
    for part in text.split(","):
        try:
            shape, frac = part.strip().split(":")
            seq, batch = shape.lower().split("x")
            phase = Phase(int(seq), int(batch), float(frac))
        except ValueError:
            raise ValueError(f"--curriculum part {part!r} is not SEQ_LENxBATCH:FRACTION") from None
        if phase.seq_len < 64 or phase.batch_size < 1 or not phase.fraction > 0:
            raise ValueError(f"--curriculum part {part!r}: need seq_len >= 64, batch >= 1, fraction > 0")
        phases.append(phase)
    if abs(sum(ph.fraction for ph in phases) - 1.0) > 1e-6:
        raise ValueError(f"--curriculum fractions sum to {sum(ph.fraction for ph in phases)}, not 1")
    return phases


def phase_at(phases: list[Phase], progress: float) -> int:
    """Index of the phase that holds ``progress`` in [0, 1)."""
    edge = 0.0
    for i, ph in enumerate(phases):
        edge += ph.fraction
        if progress < edge:
            return i
    return len(phases) - 1


@dataclass(frozen=True)
class Corpus:
    deb_path: Path  # the .deb the documents came from
    deb_sha256: str  # hex digest of the .deb
    package: str  # Debian package name, from the .deb's control file
    version: str  # Debian package version, from the .deb's control file
    root: Path  # extraction root (the .deb's filesystem tree)
    sources_dir: Path  # <root>/usr/share/doc/<python>/html/_sources
    copyright_path: Path  # <root>/usr/share/doc/<package>/copyright


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_corpus(args: argparse.Namespace) -> Corpus:
    """Download (unless ``--deb``) and extract the documentation package; return where its parts are."""
    data_dir = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    if args.deb is not None:
        deb = args.deb.resolve()
        if not deb.is_file():
            raise FileNotFoundError(f"--deb {deb} does not exist")
    else:
        spec = args.package if args.package_version is None else f"{args.package}={args.package_version}"
        found = sorted(data_dir.glob(f"{args.package}_*.deb"))
        if args.package_version is not None:
            found = [d for d in found if _deb_field(d, "Version") == args.package_version]
        if found:
            deb = found[-1]
            print(f"corpus: using {deb.name} already in {data_dir}", flush=True)
        else:
            print(f"corpus: apt-get download {spec}", flush=True)
            subprocess.run(["apt-get", "download", spec], cwd=data_dir, check=True)
            found = sorted(data_dir.glob(f"{args.package}_*.deb"))
            if not found:
                raise FileNotFoundError(f"apt-get download {spec} left no {args.package}_*.deb in {data_dir}")
            deb = found[-1]
    digest = sha256_file(deb)
    if args.expect_sha256 is not None and digest != args.expect_sha256.lower():
        raise ValueError(f"{deb} has sha256 {digest}, expected {args.expect_sha256}")
    package, version = _deb_field(deb, "Package"), _deb_field(deb, "Version")
    root = data_dir / f"{package}_{version}"
    if not (root / ".extracted").exists():
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        (root / ".extracted").write_text(digest + "\n")
    # usr/share/doc/<package>/html is a symlink to the real tree: resolve and deduplicate.
    sources = sorted({p.resolve() for p in root.glob(f"usr/share/doc/*/{SOURCES_SUBDIR}")})
    if len(sources) != 1:
        raise FileNotFoundError(f"expected one usr/share/doc/*/{SOURCES_SUBDIR} in {root}, found {sources}")
    copyright_path = root / "usr" / "share" / "doc" / package / "copyright"
    if not copyright_path.is_file():
        raise FileNotFoundError(f"{copyright_path} missing from {deb}")
    return Corpus(deb, digest, package, version, root, sources[0], copyright_path)


def _deb_field(deb: Path, field: str) -> str:
    out = subprocess.run(["dpkg-deb", "-f", str(deb), field], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def is_heldout(relpath: str, fraction: float) -> bool:
    """A file is held out when sha256 of its relative path, as a fraction of 2**64, is below ``fraction``."""
    head = hashlib.sha256(relpath.encode("utf-8")).digest()[:8]
    return int.from_bytes(head, "big") / 2**64 < fraction


def read_documents(sources_dir: Path) -> list[tuple[str, str]]:
    """``(relative path, text)`` of every ``*.rst.txt`` under ``sources_dir``, sorted by path; CRLF -> LF."""
    docs = []
    for path in sorted(sources_dir.rglob("*.rst.txt")):
        rel = path.relative_to(sources_dir).as_posix()
        text = path.read_bytes().decode("utf-8").replace("\r\n", "\n")
        if text.strip():
            docs.append((rel, text))
    return docs


def license_summary(copyright_path: Path) -> str:
    """The corpus license, checked against the package's Debian copyright file (fails if it is not there)."""
    text = copyright_path.read_text(encoding="utf-8", errors="replace").upper()
    if "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" not in text:
        raise ValueError(
            f"{copyright_path} does not contain the PSF License Version 2; check the corpus license"
        )
    return (
        "Python Software Foundation License Version 2 (the Debian copyright file reproduces it); the "
        "documentation's license page adds that code examples are dual licensed under the Zero-Clause BSD license"
    )


def train_tokenizer(texts: list[str], vocab_size: int) -> transformers.PreTrainedTokenizerBase:
    """Byte-level BPE trained on ``texts`` only, with Qwen2's normalizer (NFC) and pre-tokenizer.

    ``AutoTokenizer`` loads every ``model_type: qwen2`` directory as ``Qwen2Tokenizer``, which rebuilds the
    normalizer and pre-tokenizer from its own definition and keeps only the vocabulary and merges. Training with
    exactly that pipeline makes the trained tokenizer and the loaded one the same function (checked in ``main``).
    """
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    probe = Qwen2Tokenizer()  # the pipeline AutoTokenizer will rebuild
    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = probe.backend_tokenizer.normalizer
    tok.pre_tokenizer = probe.backend_tokenizer.pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],  # id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: any text encodes
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    bpe = json.loads(tok.to_str())["model"]
    return Qwen2Tokenizer(
        vocab=bpe["vocab"],
        merges=[tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in bpe["merges"]],
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        unk_token=None,
        clean_up_tokenization_spaces=False,
    )


def _drop_load_time_keys(path: Path) -> None:
    """Remove what transformers records about how a tokenizer was loaded (``is_local``, ``local_files_only``)
    from a saved ``tokenizer_config.json``: they describe the training machine, not the tokenizer."""
    config = json.loads(path.read_text(encoding="utf-8"))
    if any(k in config for k in ("is_local", "local_files_only")):
        config.pop("is_local", None)
        config.pop("local_files_only", None)
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def check_tokenizer_reloads(saved_dir: Path, tokenizer, text: str) -> None:
    """Fail unless ``AutoTokenizer.from_pretrained(saved_dir)`` encodes ``text`` exactly as ``tokenizer`` does."""
    loaded = transformers.AutoTokenizer.from_pretrained(saved_dir)
    a = loaded(text, add_special_tokens=False, verbose=False)["input_ids"]
    b = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
    if a != b:
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        raise RuntimeError(
            f"reloaded tokenizer ({type(loaded).__name__}) differs from the trained one at {first}"
        )
    if loaded.eos_token != EOS_TOKEN or loaded.bos_token != EOS_TOKEN:
        raise RuntimeError(f"reloaded tokenizer has eos {loaded.eos_token!r}, bos {loaded.bos_token!r}")


def encode_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """Documents joined as ``doc_0 <eos> doc_1 <eos> ...``: `[tokens]` int64."""
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    ids: list[int] = []
    for enc in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)


def sample_windows(stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """``batch`` windows at uniform random offsets: `[batch, seq_len]`."""
    starts = torch.randint(0, stream.numel() - seq_len, (batch,), generator=gen)
    return torch.stack([stream[s : s + seq_len] for s in starts.tolist()])
