#!/usr/bin/env python
"""Train kvlab's bundled reference model: a small Qwen2 decoder on Debian's Python documentation.

kvlab cannot download weights (no model hub here or in CI), so it ships its own small, trained decoder for
KV-cache experiments (issue 2, point 4). This script is the whole recipe, end to end:

1. corpus: ``apt-get download python3.11-doc`` into ``--data-dir`` (or ``--deb FILE``), ``dpkg-deb -x``; the
   documents are the Sphinx reST sources ``html/_sources/**/*.rst.txt`` (English prose and Python code);
2. split by file: a file is held out when the first 8 bytes of ``sha256(relative path)``, read as a fraction of
   2**64, fall below ``--heldout-fraction``; held-out files are seen by neither the tokenizer nor the model;
3. tokenizer: byte-level BPE trained with ``tokenizers`` on the training files only;
4. model: ``transformers.Qwen2Config`` (GQA, RoPE, tied embeddings), AdamW with linear warm-up and cosine decay,
   bf16 autocast on the CPU (``torch.set_num_threads(--threads)``) or on ``--device cuda``; random windows of ``--seq-len`` tokens, then a
   final phase of ``--long-seq-len`` windows so that every position the evaluation uses has been trained;
5. evaluation of the saved bf16 model, reloaded with ``AutoModelForCausalLM.from_pretrained``: held-out
   perplexity next to the add-one-smoothed unigram perplexity (estimated on the training tokens) of the same
   held-out target tokens;
6. output (written to a temporary directory, then moved into place; an existing model is replaced only with
   ``--force``): config, weights (bf16 safetensors), tokenizer, ``heldout.txt``, ``provenance.json`` and a
   ``MODEL_CARD.md`` whose numbers are read from ``provenance.json``.

Example (the bundled model)::

    python scripts/train_reference.py --force

Smoke test (a minute or two, written under data/)::

    python scripts/train_reference.py --steps 20 --long-fraction 0.1 --out data/smoke-reference --force
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # tokenizers' thread pool; the machine is shared
os.environ.setdefault("RAYON_RS_NUM_CPUS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "src" / "kvlab" / "models" / "reference"
SOURCES_SUBDIR = "html/_sources"  # Sphinx copies every page's reST source here as <page>.rst.txt
EOS_TOKEN = "<|endoftext|>"  # separates documents; also used as bos and pad


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    g = p.add_argument_group("corpus")
    g.add_argument(
        "--data-dir", type=Path, default=REPO_ROOT / "data", help="downloads and extraction (git-ignored)"
    )
    g.add_argument("--package", default="python3.11-doc", help="Debian package holding the corpus")
    g.add_argument("--package-version", default=None, help="pin a package version (default: apt's candidate)")
    g.add_argument("--deb", type=Path, default=None, help="use this .deb instead of downloading one")
    g.add_argument("--expect-sha256", default=None, help="fail unless the .deb has this sha256")
    g.add_argument(
        "--heldout-fraction", type=float, default=0.05, help="fraction of files held out (by path hash)"
    )
    g = p.add_argument_group("tokenizer")
    g.add_argument("--vocab-size", type=int, default=8192)
    g = p.add_argument_group("model")
    g.add_argument("--hidden-size", type=int, default=256)
    g.add_argument("--intermediate-size", type=int, default=768)
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--heads", type=int, default=4, help="query heads")
    g.add_argument("--kv-heads", type=int, default=2, help="key/value heads (GQA)")
    g.add_argument("--head-dim", type=int, default=64)
    g.add_argument("--max-positions", type=int, default=8192)
    g.add_argument("--rope-theta", type=float, default=10000.0)
    g = p.add_argument_group("training")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--steps", type=int, default=900, help="optimizer steps (the schedule's length)")
    g.add_argument("--max-minutes", type=float, default=32.0, help="wall-clock budget for the training loop")
    g.add_argument(
        "--curriculum",
        default="512x8:0.85,4352x1:0.15",
        help="phases as SEQ_LENxBATCH:FRACTION,... (fractions of the schedule's progress, summing to 1)",
    )
    g.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="continue from this model directory (its tokenizer and weights; a committed checkpoint)",
    )
    g.add_argument(
        "--task-fraction",
        type=float,
        default=0.0,
        help="fraction of windows that carry long-range tasks (copy spans, passkeys); 0: plain text only",
    )
    g.add_argument(
        "--package-only",
        type=Path,
        default=None,
        help="skip training: evaluate and package the final checkpoint a run left (DIR/train_run.json)",
    )
    g.add_argument(
        "--grow-layers",
        type=int,
        default=0,
        help="with --init-from: insert this many new decoder layers (block expansion: copies of existing layers whose "
        "output projections start at zero, so the grown model computes exactly what the old one did)",
    )
    g.add_argument("--task-weight", type=float, default=1.0, help="loss weight of task answer tokens")
    g.add_argument("--copies-per-tokens", type=int, default=768, help="one copy task per this many tokens")
    g.add_argument("--random-span-p", type=float, default=0.5, help="share of copy spans of random tokens")
    g.add_argument("--min-copies", type=int, default=1, help="copy tasks in every task window, at least")
    g.add_argument(
        "--span-tokens",
        default="8:48",
        help="MIN:MAX tokens of a copy span (drawn uniformly); longer spans give more copy targets per task",
    )
    g.add_argument(
        "--far-passkey-p",
        type=float,
        default=0.0,
        help="share of passkeys stated in the first 10%% of the window and asked in its last 10%% "
        "(the longest retrievals, which uniform placement makes rare)",
    )
    g.add_argument(
        "--near-copy-p",
        type=float,
        default=0.0,
        help="share of copy tasks whose distance is drawn from [span, NEAR_COPY_TOKENS] instead of the whole window "
        "(short distances, which uniform placement over a long window makes rare)",
    )
    g.add_argument(
        "--mid-copy-p",
        type=float,
        default=0.0,
        help="share of copy tasks whose distance is drawn from [MID_COPY_RANGE[0] x T, MID_COPY_RANGE[1] x T] of the "
        "window T (the middle distances, where kvlab eval's copy probes were weakest); with --near-copy-p, at most 1",
    )
    g.add_argument("--checkpoint-every-min", type=float, default=10.0, help="save to --data-dir/checkpoint")
    g.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr as a fraction of the peak")
    g.add_argument("--warmup-steps", type=int, default=40)
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--grad-clip", type=float, default=1.0)
    g.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    g.add_argument("--autocast-bf16", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument(
        "--device",
        default="cpu",
        help="where the training loop runs (cpu, cuda, cuda:N); the packaged bf16 model is evaluated on the CPU",
    )
    g.add_argument("--log-every", type=int, default=10)
    g.add_argument("--monitor-every", type=int, default=100, help="held-out loss for the log only (0: never)")
    g = p.add_argument_group("evaluation and output")
    g.add_argument("--eval-seq-len", type=int, default=512, help="window of the reported held-out perplexity")
    g.add_argument("--eval-long-seq-len", type=int, default=4352, help="window of the per-position report")
    g.add_argument(
        "--ability-copy-rows",
        type=int,
        default=24,
        help="rows (copied spans) per distance in the model card's copy probe; each row scores up to 31 tokens",
    )
    g.add_argument(
        "--heldout-min-tokens", type=int, default=40_000, help="fail if the held-out text is shorter"
    )
    g.add_argument(
        "--remeasure-abilities",
        type=Path,
        default=None,
        metavar="DIR",
        help="skip training: measure the abilities of the packaged model in DIR again (its weights unchanged; with "
        "--ability-copy-rows) and rewrite DIR's provenance.json and MODEL_CARD.md; needs no corpus",
    )
    g.add_argument(
        "--remeasure-parts",
        default="copy,passkey",
        help="with --remeasure-abilities: which probes to run again, a comma list of copy and passkey (the others "
        "keep their recorded figures)",
    )
    g.add_argument("--out", type=Path, default=DEFAULT_OUT)
    g.add_argument("--force", action="store_true", help="replace an existing model in --out")
    args = p.parse_args(argv)
    if not 0.0 < args.heldout_fraction < 0.5:
        p.error(f"--heldout-fraction must be in (0, 0.5), got {args.heldout_fraction!r}")
    if args.head_dim % 32:
        p.error(f"--head-dim must be divisible by 32 (KIVI group size), got {args.head_dim!r}")
    if args.heads % args.kv_heads:
        p.error(f"--heads must be a multiple of --kv-heads, got {args.heads!r} and {args.kv_heads!r}")
    try:
        args.phases = parse_curriculum(args.curriculum)
    except ValueError as exc:
        p.error(str(exc))
    if (
        max(ph.seq_len for ph in args.phases) > args.max_positions
        or args.eval_long_seq_len > args.max_positions
    ):
        p.error(f"window lengths must not exceed --max-positions {args.max_positions}")
    if not 0.0 <= args.task_fraction <= 1.0:
        p.error(f"--task-fraction must be in [0, 1], got {args.task_fraction!r}")
    if not 0.0 <= args.far_passkey_p <= 1.0:
        p.error(f"--far-passkey-p must be in [0, 1], got {args.far_passkey_p!r}")
    if not 0.0 <= args.near_copy_p <= 1.0:
        p.error(f"--near-copy-p must be in [0, 1], got {args.near_copy_p!r}")
    if not 0.0 <= args.mid_copy_p <= 1.0 - args.near_copy_p:
        p.error(
            f"--mid-copy-p must be in [0, 1 - --near-copy-p], got {args.mid_copy_p!r} with --near-copy-p {args.near_copy_p!r}"
        )
    try:
        lo, hi = (int(x) for x in args.span_tokens.split(":"))
    except ValueError:
        p.error(f"--span-tokens must be MIN:MAX integers, got {args.span_tokens!r}")
    if not 2 <= lo <= hi:
        p.error(f"--span-tokens must satisfy 2 <= MIN <= MAX, got {args.span_tokens!r}")
    args.span_range = (lo, hi)
    if args.init_from is not None and not (args.init_from / "config.json").is_file():
        p.error(f"--init-from {args.init_from} holds no config.json")
    try:
        dev = torch.device(args.device)
    except RuntimeError:
        p.error(f"--device must be a torch device such as cpu or cuda:0, got {args.device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: this torch build or machine has no CUDA device")
    if args.grow_layers < 0 or (args.grow_layers and args.init_from is None):
        p.error(f"--grow-layers must be >= 0 and needs --init-from, got {args.grow_layers!r}")
    if args.ability_copy_rows < 1:
        p.error(f"--ability-copy-rows must be >= 1, got {args.ability_copy_rows!r}")
    parts = tuple(x.strip() for x in args.remeasure_parts.split(","))
    if not parts or len(set(parts)) != len(parts) or not set(parts) <= set(ABILITY_PARTS):
        p.error(
            f"--remeasure-parts must be a comma list of {', '.join(ABILITY_PARTS)}, got {args.remeasure_parts!r}"
        )
    args.remeasure_parts = parts
    if args.remeasure_abilities is not None:
        missing = [
            f
            for f in ("model.safetensors", "provenance.json", "heldout.txt")
            if not (args.remeasure_abilities / f).is_file()
        ]
        if missing:
            p.error(
                f"--remeasure-abilities {args.remeasure_abilities} is not a packaged model: no {', '.join(missing)}"
            )
    return args


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


# ----------------------------------------------------------------------------------------------------------------
# corpus
# ----------------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------------
# tokenizer
# ----------------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------------
# model and training
# ----------------------------------------------------------------------------------------------------------------


def build_config(args: argparse.Namespace, vocab_size: int, eos_id: int) -> transformers.Qwen2Config:
    return transformers.Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=args.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": args.rope_theta},
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )


def expand_layers(model, n_new: int) -> list[int]:
    """Grow a Qwen2-style decoder by ``n_new`` layers without changing what it computes (block expansion, LLaMA
    Pro, arXiv:2401.02415 §2): after each chosen layer ``i`` (evenly spaced, the last layer always among them) a
    deep copy of it is inserted with its attention output projection and MLP down projection set to zero, so the
    new block adds exactly 0 to the residual stream until training moves those weights. Layer indices (the cache
    slots) and ``config.num_hidden_layers`` / ``layer_types`` are updated in place.

    Returns:
        The indices (in the old numbering) of the layers that were copied, ascending.

    Raises:
        ValueError: ``n_new`` < 1 or more than the model's layer count, or a model without
            ``model.model.layers`` / ``self_attn.o_proj`` / ``mlp.down_proj``.
    """
    import copy

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no model.layers to grow")
    n_old = len(layers)
    if not 1 <= n_new <= n_old:
        raise ValueError(f"can insert 1..{n_old} layers into a {n_old}-layer model, got {n_new!r}")
    copied = sorted({round((i + 1) * n_old / n_new) - 1 for i in range(n_new)})
    config = model.config
    old_types = getattr(config, "layer_types", None)
    grown, types = [], []
    for i, layer in enumerate(layers):
        grown.append(layer)
        types.append(old_types[i] if old_types is not None else None)
        if i in copied:
            types.append(types[-1])
            new = copy.deepcopy(layer)
            try:
                torch.nn.init.zeros_(new.self_attn.o_proj.weight)
                torch.nn.init.zeros_(new.mlp.down_proj.weight)
            except AttributeError as e:
                raise ValueError(f"layer {i} has no self_attn.o_proj / mlp.down_proj to zero: {e}") from None
            for bias in (new.self_attn.o_proj.bias, new.mlp.down_proj.bias):
                if bias is not None:
                    torch.nn.init.zeros_(bias)
            grown.append(new)
    model.model.layers = torch.nn.ModuleList(grown)
    for idx, layer in enumerate(grown):
        layer.self_attn.layer_idx = idx
    config.num_hidden_layers = len(grown)
    if old_types is not None:
        config.layer_types = types
    return copied


def lr_at(step: int, progress: float, args: argparse.Namespace) -> float:
    """Linear warm-up over ``--warmup-steps``, then cosine decay to ``--lr * --min-lr-ratio`` at progress 1."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    warm = args.warmup_steps / args.steps
    q = min(1.0, max(0.0, (progress - warm) / max(1e-9, 1.0 - warm)))
    return args.lr * (args.min_lr_ratio + (1.0 - args.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * q)))


def sample_windows(stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """``batch`` windows at uniform random offsets: `[batch, seq_len]`."""
    starts = torch.randint(0, stream.numel() - seq_len, (batch,), generator=gen)
    return torch.stack([stream[s : s + seq_len] for s in starts.tolist()])


# Long-range tasks mixed into the documentation text, so that the model learns to read its whole context
# (in-context copying, i.e. induction, and passkey retrieval), in the templates `kvlab eval` measures with.
from kvlab.eval.longctx import PASSKEY_ANSWER, PASSKEY_NEEDLE, PASSKEY_QUERY  # noqa: E402

IGNORE = -100  # label of a position that carries no loss


# --near-copy-p draws copy distances up to this (kvlab eval's near probes: 192-471 tokens at a 512-token context)
NEAR_COPY_TOKENS = 512
# --mid-copy-p draws copy distances in this share of the window (eval probes at 25 %-50 % of 4,352 and 2,048 tokens)
MID_COPY_RANGE = (0.2, 0.6)


class TaskMixer:
    """Overwrite parts of natural-text windows with long-range tasks; return ids and labels.

    Per task window (probability ``task_fraction``): ``max(min_copies, T // copies_per_tokens)`` copy tasks (a span
    of ``span_range`` tokens (default 8-48), random tokens with probability ``random_span_p``, else natural text from elsewhere in the
    stream, written twice at a distance drawn uniformly up to the window) and, with probability 0.5, a passkey (a random 5-digit
    key stated once at a random depth, queried at a random later point; with probability ``far_passkey_p`` stated in
    the window's first 10 % and asked in its last 10 %; with probability ``near_copy_p`` a copy's distance is drawn
    up to :data:`NEAR_COPY_TOKENS` only, with probability ``mid_copy_p`` from :data:`MID_COPY_RANGE` of the window). The unpredictable first copy of a random
    span and the key digits of the needle carry no loss; the text around them keeps its ordinary loss, so most
    tokens of every step stay natural text.
    """

    def __init__(
        self,
        tokenizer,
        stream: torch.Tensor,
        task_fraction: float,
        gen: torch.Generator,
        task_weight: float = 1.0,
        copies_per_tokens: int = 768,
        random_span_p: float = 0.5,
        min_copies: int = 1,
        span_range: tuple[int, int] = (8, 48),
        far_passkey_p: float = 0.0,
        near_copy_p: float = 0.0,
        mid_copy_p: float = 0.0,
    ):
        self.encode = lambda text: tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
        self.stream, self.task_fraction, self.gen = stream, task_fraction, gen
        self.min_copies = min_copies
        self.span_range, self.far_passkey_p, self.near_copy_p = span_range, far_passkey_p, near_copy_p
        self.mid_copy_p = mid_copy_p
        self.task_weight, self.copies_per_tokens, self.random_span_p = (
            task_weight,
            copies_per_tokens,
            random_span_p,
        )
        self.vocab = len(tokenizer)
        self.counts = {"windows": 0, "task_windows": 0, "copy": 0, "passkey": 0}

    def _randint(self, lo: int, hi: int) -> int:
        """Uniform integer in [lo, hi] (inclusive)."""
        return int(torch.randint(lo, hi + 1, (1,), generator=self.gen))

    def _place(self, free: torch.Tensor, length: int, lo: int, hi: int) -> int | None:
        """A start in [lo, hi] whose ``length`` positions are all free; None after 20 tries."""
        for _ in range(20):
            if hi < lo:
                return None
            a = self._randint(lo, hi)
            if bool(free[a : a + length].all()):
                free[a : a + length] = False
                return a
        return None

    def _place_pair(self, free: torch.Tensor, length: int, T: int) -> tuple[int, int] | None:
        """Two free spans of ``length`` whose distance ``b - a`` is uniform over [length, T - length - 1]
        (then ``a`` uniform where it fits): every distance up to the window is trained equally often, where
        two independent starts would make far copies rare. None after 20 tries."""
        u = float(torch.rand((), generator=self.gen)) if (self.near_copy_p or self.mid_copy_p) else 1.0
        shortest, longest = length, T - length - 1
        if u < self.near_copy_p:
            longest = min(longest, NEAR_COPY_TOKENS)
        elif u < self.near_copy_p + self.mid_copy_p:
            shortest = max(length, int(MID_COPY_RANGE[0] * T))
            longest = max(shortest, min(longest, int(MID_COPY_RANGE[1] * T)))
        for _ in range(20):
            d = self._randint(shortest, max(shortest, longest))
            a = self._randint(1, T - length - d)
            b = a + d
            if bool(free[a : a + length].all()) and bool(free[b : b + length].all()):
                free[a : a + length] = False
                free[b : b + length] = False
                return a, b
        return None

    def window(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``ids`` `[T]` natural text -> (ids, labels, loss weights), each `[T]`, with tasks written in."""
        ids = ids.clone()
        labels = ids.clone()
        weights = torch.ones(ids.shape, dtype=torch.float32)
        T = ids.numel()
        self.counts["windows"] += 1
        if float(torch.rand((), generator=self.gen)) >= self.task_fraction:
            return ids, labels, weights
        self.counts["task_windows"] += 1
        free = torch.ones(T, dtype=torch.bool)
        free[:1] = False
        if float(torch.rand((), generator=self.gen)) < 0.5:
            key = f"{self._randint(10000, 99999)}"
            needle = torch.tensor(self.encode(PASSKEY_NEEDLE.format(key=key)))
            ask = torch.tensor(self.encode(PASSKEY_QUERY + PASSKEY_ANSWER.format(key=key)))
            far = float(torch.rand((), generator=self.gen)) < self.far_passkey_p
            hi = T // 10 if far else T - needle.numel() - ask.numel() - 1
            a = self._place(free, needle.numel(), 1, hi)
            if a is not None:
                lo_b = max(a + needle.numel(), T - T // 10 - ask.numel()) if far else a + needle.numel()
                b = self._place(free, ask.numel(), lo_b, T - ask.numel())
                if b is None:
                    free[a : a + needle.numel()] = True
                else:
                    ids[a : a + needle.numel()] = needle
                    labels[a : a + needle.numel()] = needle
                    digits = torch.tensor([t for t in self.encode(" " + key)])[1:]  # the 5 digit tokens
                    for i in range(
                        a, a + needle.numel()
                    ):  # the first statement of the key is not predictable
                        if int(ids[i]) in digits.tolist() and i < a + needle.numel() // 2:
                            labels[i] = IGNORE
                    ids[b : b + ask.numel()] = ask
                    labels[b : b + ask.numel()] = ask
                    weights[b : b + ask.numel()] = self.task_weight
                    self.counts["passkey"] += 1
        for _ in range(max(self.min_copies, T // self.copies_per_tokens)):
            L = self._randint(*self.span_range)
            if float(torch.rand((), generator=self.gen)) < self.random_span_p:
                span, random_span = torch.randint(1, self.vocab, (L,), generator=self.gen), True
            else:
                s0 = self._randint(0, self.stream.numel() - L - 1)
                span, random_span = self.stream[s0 : s0 + L], False
            placed = self._place_pair(free, L, T)
            if placed is None:
                continue
            a, b = placed
            ids[a : a + L] = span
            labels[a : a + L] = IGNORE if random_span else span
            ids[b : b + L] = span
            labels[b : b + L] = span
            weights[b : b + L] = self.task_weight
            self.counts["copy"] += 1
        return ids, labels, weights

    def batch(self, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`[B, T]` natural windows -> (ids, labels, loss weights), each `[B, T]`."""
        rows = [self.window(w) for w in windows]
        return tuple(torch.stack([r[i] for r in rows]) for i in range(3))


def weighted_lm_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, weighted per target: ``sum(w * ce) / sum(w)`` over targets not ``IGNORE``.

    ``logits`` `[B, T, V]` predict ``labels[:, 1:]`` from positions ``0..T-2`` (the usual shift); ``weights``
    `[B, T]` weigh the target tokens. With all weights 1 it is the model's own mean loss.
    """
    target = labels[:, 1:].reshape(-1)
    w = weights[:, 1:].reshape(-1) * (target != IGNORE)
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]), target.clamp_min(0), reduction="none"
    )
    return (ce * w).sum() / w.sum().clamp_min(1e-9)


def probe_abilities(model, tokenizer, heldout: torch.Tensor, seq_len: int, gen: torch.Generator) -> dict:
    """Log-only probe: copy accuracy of a 32-token held-out span at distance ~seq_len/8 and ~7/8 seq_len, and
    passkey accuracy at depth 50 %, teacher-forced in one forward (8 trials each)."""
    encode = lambda text: tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    model.eval()
    out = {}
    with torch.inference_mode():
        for name, dist in (("copy_near", seq_len // 8), ("copy_far", seq_len * 7 // 8)):
            rows, L = [], 32
            for _ in range(8):
                s = int(torch.randint(0, heldout.numel() - 2 * seq_len, (1,), generator=gen))
                w = heldout[s : s + seq_len].clone()
                span = heldout[s + seq_len : s + seq_len + L]
                w[seq_len - L - dist : seq_len - dist] = span
                w[seq_len - L :] = span
                rows.append(w)
            ids = torch.stack(rows).to(model.device)
            pred = model(input_ids=ids).logits.argmax(-1)  # [8, T]
            out[name] = round(
                float((pred[:, seq_len - L : -1] == ids[:, seq_len - L + 1 :]).float().mean()), 3
            )
        ok = 0
        for _ in range(8):
            key = f"{int(torch.randint(10000, 99999, (1,), generator=gen))}"
            needle, ask = encode(PASSKEY_NEEDLE.format(key=key)), encode(PASSKEY_QUERY)
            ans = encode(PASSKEY_ANSWER.format(key=key))
            n_fill = seq_len - len(needle) - len(ask) - len(ans)
            s = int(torch.randint(0, heldout.numel() - n_fill, (1,), generator=gen))
            fill = heldout[s : s + n_fill].tolist()
            ids = torch.tensor(fill[: n_fill // 2] + needle + fill[n_fill // 2 :] + ask + ans)[None].to(
                model.device
            )
            pred = model(input_ids=ids).logits.argmax(-1)[0]
            ok += bool((pred[-len(ans) - 1 : -1] == ids[0, -len(ans) :]).all())
        out["passkey_mid"] = ok / 8
    return out


ABILITY_COPY_CONTEXTS = (512, 2048, 4352)
ABILITY_COPY_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.92)  # at 4352 tokens the far distance is 4004
ABILITY_PASSKEY_CONTEXTS = (512, 2048, 4096)
ABILITY_PARTS = ("copy", "passkey")  # the probes of measure_abilities, in its order
ABILITY_PROTECTED_TAIL = 160  # what kvlab eval keeps probes out of by default: R = 128 plus G = 32


def measure_abilities(
    model,
    tokenizer,
    heldout_text: str,
    passkey_trials: int = 20,
    copy_rows: int = 24,
    parts: tuple[str, ...] = ABILITY_PARTS,
) -> dict:
    """Copy and passkey abilities of ``model`` through a float ``DynamicCache``, with kvlab eval's own probes.

    The probes are :mod:`kvlab.eval.longctx`'s (the same code and templates ``kvlab eval`` measures caches
    with), on the held-out text; placement keeps what is probed out of the newest 160 tokens, as the eval does.
    ``parts`` (a subset of :data:`ABILITY_PARTS`) names the probes run; a probe left out gets an empty list.
    Returns the ``abilities`` block of provenance (read by the model card).
    """
    from transformers import DynamicCache

    from kvlab.eval.longctx import (
        RECALL_SPAN_TOKENS,
        build_passkey_probe,
        build_recall_probe,
        encode_heldout,
        measure_long_context,
    )

    ids = encode_heldout(tokenizer, heldout_text)
    copy, passkey = [], []
    for ctx in ABILITY_COPY_CONTEXTS if "copy" in parts else ():
        probe = build_recall_probe(
            ids,
            ctx,
            protected_tail=ABILITY_PROTECTED_TAIL,
            rows_per_distance=copy_rows,
            fractions=ABILITY_COPY_FRACTIONS,
            seed=f"model-card-copy-{ctx}",
        )
        rec = measure_long_context(model, DynamicCache, {"recall": probe})["recall"]
        for d in rec["distances"]:
            copy.append(
                {
                    "context": ctx,
                    "distance": d["distance_tokens"],
                    "accuracy": round(d["accuracy"], 4),
                    "nll": round(d["mean_nll"], 4),
                    "trials": d["rows"],
                    "scored_tokens": d["scored_tokens"],
                }
            )
        print(f"abilities: copy at {ctx}: {[(c['distance'], c['accuracy']) for c in copy[-5:]]}", flush=True)
    for ctx in ABILITY_PASSKEY_CONTEXTS if "passkey" in parts else ():
        probe = build_passkey_probe(
            tokenizer,
            ids,
            ctx,
            protected_tail=ABILITY_PROTECTED_TAIL,
            trials=passkey_trials,
            seed=f"model-card-passkey-{ctx}",
        )
        pk = measure_long_context(model, DynamicCache, {"passkey": probe})["passkey"]
        for d in pk["depths"]:
            passkey.append(
                {
                    "context": ctx,
                    "depth": d["depth"],
                    "accuracy": d["accuracy"],
                    "correct": d["correct"],
                    "trials": d["trials"],
                    "ci95": [round(x, 4) for x in d["ci95"]],
                }
            )
        print(
            f"abilities: passkey at {ctx}: {[(p['depth'], p['accuracy']) for p in passkey[-5:]]}", flush=True
        )
    return {
        "method": "kvlab.eval.longctx (recall and passkey probes, decoded through the cache)",
        "cache": "DynamicCache",
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "protected_tail": ABILITY_PROTECTED_TAIL,
        "copy_span_tokens": RECALL_SPAN_TOKENS,
        "passkey_trials": passkey_trials,
        "copy_rows": copy_rows,
        "copy": copy,
        "passkey": passkey,
    }


def window_nll(model, stream: torch.Tensor, seq_len: int, max_windows: int | None = None) -> torch.Tensor:
    """Token NLL (nats) over non-overlapping windows, each a fresh context: `[windows, seq_len - 1]` float64.

    Column ``j`` is the NLL of window token ``j + 1`` given tokens ``0..j`` of the same window.
    """
    n_windows = stream.numel() // seq_len
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    if n_windows == 0:
        raise ValueError(f"need at least {seq_len} tokens, got {stream.numel()}")
    rows = []
    model.eval()
    with torch.inference_mode():
        for w in range(n_windows):
            ids = stream[w * seq_len : (w + 1) * seq_len].unsqueeze(0).to(model.device)  # [1, T]
            logits = model(input_ids=ids).logits.float()  # [1, T, vocab]
            logp = torch.log_softmax(logits[0, :-1], dim=-1)  # [T-1, vocab]
            nll = -logp.gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1)  # [T-1]
            rows.append(nll.double())
    return torch.stack(rows)


def heldout_targets(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The tokens ``window_nll`` scores, in the same order: `[windows, seq_len - 1]`."""
    n_windows = stream.numel() // seq_len
    return stream[: n_windows * seq_len].view(n_windows, seq_len)[:, 1:]


def unigram_nll(train_stream: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Add-one-smoothed unigram NLL of ``targets``: ``p(v) = (count_train(v) + 1) / (N + V)``; same shape."""
    counts = torch.bincount(train_stream, minlength=vocab_size).double()
    logp = torch.log((counts + 1.0) / (counts.sum() + vocab_size))  # [vocab]
    return -logp[targets]


def train(model, tokenizer, train_stream, heldout_stream, args) -> dict:
    """The training loop on ``args.device`` (the model is already there); returns what provenance records."""
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(args.seed)
    probe_gen = torch.Generator().manual_seed(args.seed + 1)
    mixer = TaskMixer(
        tokenizer,
        train_stream,
        args.task_fraction,
        gen,
        task_weight=args.task_weight,
        copies_per_tokens=args.copies_per_tokens,
        random_span_p=args.random_span_p,
        min_copies=args.min_copies,
        span_range=args.span_range,
        far_passkey_p=args.far_passkey_p,
        near_copy_p=args.near_copy_p,
        mid_copy_p=args.mid_copy_p,
    )
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]  # norms and biases
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    # Progress drives the schedule: max(step / --steps, elapsed / --max-minutes). When the step budget binds
    # (the machine is fast enough), the run is a pure function of the seed; when the wall clock binds, the
    # schedule still warms up, walks through the curriculum's phases and anneals, at steps that depend on the
    # machine's speed, and provenance records it ("time_bound").
    budget_s = args.max_minutes * 60.0
    t0 = time.perf_counter()
    last_ckpt = t0
    tokens_seen = 0
    max_position_trained = 0
    loss_curve: list[dict] = []
    monitor_curve: list[dict] = []
    smoothed = None
    time_bound = False
    phase_steps = [0] * len(args.phases)
    step = 0
    while True:
        elapsed = time.perf_counter() - t0
        progress = max(step / args.steps, elapsed / budget_s)
        if progress >= 1.0:
            break
        time_bound = time_bound or (step > 0 and elapsed / budget_s > step / args.steps)
        k = phase_at(args.phases, progress)
        batch, seq_len = args.phases[k].batch_size, args.phases[k].seq_len
        lr = lr_at(step, progress, args)
        ids, labels, weights = mixer.batch(sample_windows(train_stream, batch, seq_len, gen))  # [B, T] each
        for group in opt.param_groups:
            group["lr"] = lr
        model.train()
        ids, labels, weights = ids.to(device), labels.to(device), weights.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast_bf16):
            loss = weighted_lm_loss(model(input_ids=ids).logits, labels, weights)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens_seen += ids.numel()
        max_position_trained = max(max_position_trained, seq_len - 1)
        value = loss.item()
        smoothed = value if smoothed is None else 0.9 * smoothed + 0.1 * value
        phase_steps[k] += 1
        if step % args.log_every == 0:
            elapsed = time.perf_counter() - t0
            loss_curve.append({"step": step, "loss": round(value, 4), "seq_len": seq_len, "lr": lr})
            print(
                f"step {step:5d}/{args.steps} loss {value:.3f} (ema {smoothed:.3f}) lr {lr:.2e} "
                f"gnorm {grad_norm:.2f} T={seq_len} tokens {tokens_seen:,} {elapsed / 60:.1f} min "
                f"{tokens_seen / elapsed:.0f} tok/s",
                flush=True,
            )
        if args.monitor_every and step > 0 and step % args.monitor_every == 0:
            # Held-out loss and abilities for the log only: no checkpoint selection, no early stopping.
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast_bf16):
                mon = window_nll(model, heldout_stream, 512, max_windows=8).mean().item()
                abilities = probe_abilities(model, tokenizer, heldout_stream, max(512, seq_len), probe_gen)
            monitor_curve.append({"step": step, "heldout_loss": round(mon, 4), **abilities})
            print(f"  monitor: held-out loss {mon:.3f} (ppl {math.exp(mon):.1f}) {abilities}", flush=True)
        if args.checkpoint_every_min and time.perf_counter() - last_ckpt > 60 * args.checkpoint_every_min:
            ckpt = args.data_dir / "checkpoint"
            model.save_pretrained(ckpt, safe_serialization=True)
            tokenizer.save_pretrained(ckpt)
            (ckpt / "step.json").write_text(json.dumps({"step": step, "tokens_seen": tokens_seen}) + "\n")
            last_ckpt = time.perf_counter()
            print(f"  checkpoint: {ckpt} at step {step}", flush=True)
        step += 1
    return {
        "steps_planned": args.steps,
        "steps_done": step,
        "time_bound": time_bound,
        "schedule": "progress = max(step / steps_planned, elapsed / max_minutes); linear warm-up, cosine decay",
        "phases": [
            {
                "seq_len": ph.seq_len,
                "batch_size": ph.batch_size,
                "fraction": ph.fraction,
                "steps": phase_steps[i],
            }
            for i, ph in enumerate(args.phases)
        ],
        "task_fraction": args.task_fraction,
        "task_weight": args.task_weight,
        "copies_per_tokens": args.copies_per_tokens,
        "random_span_p": args.random_span_p,
        "span_tokens": list(args.span_range),
        "far_passkey_p": args.far_passkey_p,
        "near_copy_p": args.near_copy_p,
        "mid_copy_p": args.mid_copy_p,
        "min_copies": args.min_copies,
        "task_counts": mixer.counts,
        "max_position_trained": max_position_trained,
        "tokens_seen": tokens_seen,
        "train_wall_s": round(time.perf_counter() - t0, 1),
        "final_train_loss_ema": round(smoothed, 4) if smoothed is not None else None,
        "loss_curve": loss_curve,
        "heldout_monitor_curve": monitor_curve,
    }


# ----------------------------------------------------------------------------------------------------------------
# output
# ----------------------------------------------------------------------------------------------------------------


def _stage_line(i: int, t: dict) -> str:
    """One training stage of the card: phases, tokens, time, threads, command."""
    if "phases" in t:
        shape = ", then ".join(f"{ph['steps']} of {ph['batch_size']} x {ph['seq_len']}" for ph in t["phases"])
    else:  # a stage written before curricula existed: a main and a long phase
        mp, lp = t["main_phase"], t["long_phase"]
        shape = (
            f"{mp['steps']} of {mp['batch_size']} x {mp['seq_len']}, then {lp['steps']} of "
            f"{lp['batch_size']} x {lp['seq_len']}"
        )
    if t.get("task_fraction"):
        counts = t.get("task_counts")
        what = f" ({counts['copy']:,} copy spans, {counts['passkey']:,} passkeys)" if counts else ""
        tasks = (
            f"; {t['task_fraction']:.0%} of windows carry long-range tasks{what}, answer tokens weighted "
            f"{t.get('task_weight', 1.0):g}x, {t.get('random_span_p', 0.5):.0%} of copy spans random tokens"
        )
    else:
        tasks = "; documentation text only"
    note = f" ({t['note']})" if t.get("note") else ""
    start = "from scratch" if i == 1 else f"continued from stage {i - 1}"
    device = t.get("device", "cpu")
    where = f"{t['threads']} CPU thread(s)" if device == "cpu" else f"on {device}"
    grown = t.get("grown")
    if grown:
        start += (
            f", grown from {grown['layers_before']} to {grown['layers_after']} layers (copies of layers "
            f"{', '.join(map(str, grown['copied_layers']))} with zeroed output projections: block expansion)"
        )
    return (
        f"{i}. {start}: {t['steps_done']} steps ({shape} tokens), {t['tokens_seen']:,} tokens{tasks}; peak lr "
        f"{t['lr']:g}, seed {t['seed']}; {where}, {t['train_wall_s'] / 60:.1f} minutes"
        f"{' (wall-clock bound)' if t['time_bound'] else ''}{note}; `python scripts/{t.get('command', '?')}`"
    )


def _ability_tables(ab: dict) -> str:
    """Markdown tables of the copy and passkey abilities recorded in provenance."""
    copy_rows = "\n".join(
        f"| {r['context']} | {r['distance']} | {r['accuracy']:.3f} | {r['nll']:.3f} | {r['trials']} |"
        for r in ab["copy"]
    )
    contexts = sorted({r["context"] for r in ab["passkey"]})
    depths = sorted({r["depth"] for r in ab["passkey"]})
    cell = {(r["context"], r["depth"]): r for r in ab["passkey"]}
    head = "| context | " + " | ".join(f"depth {d:.0%}" for d in depths) + " |"
    rule = "|---:|" + "---:|" * len(depths)
    pk_rows = "\n".join(
        f"| {c} | "
        + " | ".join(
            f"{cell[c, d]['accuracy']:.2f} [{cell[c, d]['ci95'][0]:.2f}, {cell[c, d]['ci95'][1]:.2f}]"
            for d in depths
        )
        + " |"
        for c in contexts
    )
    again = ab.get("remeasured")
    remeasured = (
        f"\n{' and '.join(again['parts']).capitalize()} figures measured again on {again['utc'][:10]} with the "
        f"weights unchanged (`{again['command']}`); the figures they replaced are kept in `provenance.json` "
        f"(`evaluation.abilities_history`).\n"
        if again
        else ""
    )
    return f"""Measured with `{ab["method"]}` ({ab["cache"]}, {ab["dtype"]} weights), on held-out text.
{remeasured}
Copy (induction): a {ab["copy_span_tokens"]}-token held-out span written once at `distance` tokens before the
end of the prompt and repeated as the continuation, decoded through the cache; accuracy of the greedy (argmax)
token on span tokens 2..{ab["copy_span_tokens"]}, and their mean NLL.

| context | distance | accuracy | NLL (nats) | trials |
|---:|---:|---:|---:|---:|
{copy_rows}

Passkey retrieval: a 5-digit key stated once at a depth of the context, asked for after it; a trial counts when
every answer token is the argmax. Accuracy with its 95 % Wilson interval, {ab["passkey_trials"]} trials a point.

{head}
{rule}
{pk_rows}
"""


def write_model_card(prov: dict) -> str:
    """MODEL_CARD.md text; every number is read from ``prov`` (the provenance written next to it)."""
    c, m, t, e, tok = prov["corpus"], prov["model"], prov["training"], prov["evaluation"], prov["tokenizer"]
    long = e["long_context"]
    stages = [*prov.get("previous_stages", []), t]
    total_min = sum(st["train_wall_s"] for st in stages) / 60
    total_tokens = sum(st["tokens_seen"] for st in stages)
    stage_lines = "\n".join(_stage_line(i + 1, st) for i, st in enumerate(stages))
    mixture = "\n".join(
        f"- {mx['component']}: {mx['source']} License: {mx['license']}" for mx in prov.get("data_mixture", [])
    )
    pos_rows = "\n".join(
        f"| {b['positions']} | {b['nll']:.3f} | {b['ppl']:.1f} |" for b in long["nll_by_position"]
    )
    abilities = _ability_tables(e["abilities"]) if e.get("abilities") else "Not measured for this model."
    return f"""# kvlab reference model

A small Qwen2-architecture decoder trained by `scripts/train_reference.py`, shipped inside kvlab so that KV-cache
experiments (`kvlab eval`, the tests) run on a real, trained model without any download. It is loaded like any
Hugging Face model: `AutoModelForCausalLM.from_pretrained(kvlab.models.reference_model_path())`. It is trained to
read its context (in-context copying and passkey retrieval at distances up to its window; how well, by distance
and depth, is under Abilities), so that what a cache does to distant tokens shows in the eval's quality columns.

**Intended use:** a test and reference model for KV-cache measurements (cache bytes, quantization error, NLL,
top-k, copy and retrieval changes, latency). **Not** a useful language model: it is tiny, trained for
{total_min:.0f} minutes on a CPU, on {total_tokens:,} tokens of one documentation set and synthetic tasks. Do not
use it to generate text for anyone.

## Architecture
| | |
|---|---|
| architecture | `{m["architecture"]}` (`model_type` `{m["model_type"]}`) |
| parameters | {m["parameters"]:,} (tied input/output embeddings) |
| layers / hidden / intermediate | {m["num_hidden_layers"]} / {m["hidden_size"]} / {m["intermediate_size"]} |
| attention | GQA: {m["num_attention_heads"]} query heads, {m["num_key_value_heads"]} KV heads, head_dim {m["head_dim"]} |
| positions | RoPE (theta {m["rope_theta"]:g}), `max_position_embeddings` {m["max_position_embeddings"]}; trained up to position {t["max_position_trained"]} |
| weights | {m["weights_dtype"]} safetensors, {prov["package"]["directory_bytes"] / 1e6:.1f} MB for this whole directory |
| tokenizer | byte-level BPE (`tokenizers`), vocabulary {tok["vocab_size"]}, `{tok["eos_token"]}` = eos = bos = pad |

## Data
- Source: the reST sources (`html/_sources/**/*.rst.txt`) of Debian's `{c["package"]}` package, version
  `{c["version"]}` (sha256 of the .deb: `{c["deb_sha256"]}`): {c["files_total"]} files, {c["bytes_total"]:,} bytes.
- License: {c["license"]}. See `{c["license_file"]}` in the package.
- Split by file: a file is held out when sha256 of its relative path, as a fraction of 2**64, is below
  {c["heldout_fraction"]}. {c["files_heldout"]} held-out files ({c["heldout_tokens"]:,} tokens), never seen by
  the tokenizer or the model; {c["files_train"]} training files ({c["train_tokens"]:,} tokens). The held-out text
  ships as `heldout.txt` for prompts.

Mixture of the last stage:
{mixture}

## Training
AdamW (betas 0.9/0.95, weight decay {t["weight_decay"]}), linear warm-up and cosine decay, bf16 autocast on the
CPU; torch {prov["environment"]["torch"]}, transformers {prov["environment"]["transformers"]}. Stages:

{stage_lines}

## Evaluation (held-out files, the saved {m["weights_dtype"]} weights)
| measure | held-out perplexity |
|---|---|
| this model, windows of {e["seq_len"]} tokens | **{e["heldout_ppl"]:.2f}** |
| add-one unigram (estimated on the training tokens), same {e["target_tokens"]:,} target tokens | {e["unigram_ppl"]:.2f} |

The unigram perplexity is {e["unigram_ppl"] / e["heldout_ppl"]:.1f}x the model's.
By position, windows of {long["seq_len"]} tokens ({long["windows"]} windows):

| positions | mean NLL (nats) | perplexity |
|---|---|---|
{pos_rows}

## Abilities
{abilities}
All numbers above are copied by the training script from `provenance.json`.
"""


def previous_stages(prior: dict | None) -> list[dict]:
    """The training stages of the model a run continued from (its own earlier stages first), curves dropped."""
    if prior is None:
        return []
    last = {k: v for k, v in prior["training"].items() if k not in ("loss_curve", "heldout_monitor_curve")}
    last.setdefault("command", prior.get("command"))
    return [*prior.get("previous_stages", []), last]


def data_mixture(corpus: Corpus, license_text: str, run: dict) -> list[dict]:
    """What the last stage trained on, with licences."""
    mix = [
        {
            "component": "documentation text",
            "source": f"windows of the training files of Debian's {corpus.package} {corpus.version}.",
            "license": license_text + ".",
        }
    ]
    if run.get("task_fraction"):
        mix.append(
            {
                "component": f"long-range tasks in {run['task_fraction']:.0%} of windows",
                "source": "generated on the fly by the training script (TaskMixer): spans of random tokens or of "
                "the training text written twice at any distance up to the window (copy / induction), and "
                "passkeys (a random 5-digit number stated once and asked for later, in kvlab eval's templates) "
                "written over the documentation text.",
                "license": "generated data; the text spans are under the documentation's license above.",
            }
        )
    return mix


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def finish_package(tmp: Path, provenance: dict, out: Path) -> None:
    """Write ``provenance.json`` and ``MODEL_CARD.md`` into the package folder ``tmp``, then move it to ``out``
    (replacing a model there; ``tmp`` must be a sibling of ``out`` so that the moves are renames).

    The card and provenance state the folder's size, which includes them, so both are written until the size
    settles (``provenance["package"]["directory_bytes"]`` is updated in place).

    Raises:
        RuntimeError: the size did not settle in 10 rounds.
    """
    for _ in range(10):
        write_json(tmp / "provenance.json", provenance)
        card = write_model_card(json.loads((tmp / "provenance.json").read_text(encoding="utf-8")))
        (tmp / "MODEL_CARD.md").write_text(card, encoding="utf-8")
        size = directory_bytes(tmp)
        if size == provenance["package"]["directory_bytes"]:
            break
        provenance["package"]["directory_bytes"] = size
    else:
        raise RuntimeError("directory size did not settle")  # the size's digit count oscillates: never seen
    os.chmod(tmp, 0o755)  # mkdtemp makes 0700 and safetensors writes 0600: make the package readable
    for f in tmp.iterdir():
        os.chmod(f, 0o644)
    if out.exists():
        old = out.with_name(f".{out.name}-old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old)
    else:
        os.replace(tmp, out)


def remeasure_abilities(model_dir: Path, copy_rows: int, parts: tuple[str, ...], argv: list[str]) -> dict:
    """Measure the abilities of the packaged model in ``model_dir`` again and rewrite its provenance and card.

    The weights are not touched: they must be the ones provenance names (``package.weights_sha256``). The probes
    in ``parts`` are run (:func:`measure_abilities`, bf16 weights, on the package's own ``heldout.txt``) and
    replace their figures; the others keep theirs. The replaced block is kept under
    ``evaluation.abilities_history`` with when and by which command it was replaced, so no figure is lost. The
    package is rewritten in a sibling folder and swapped in (:func:`finish_package`).

    Returns:
        The new ``abilities`` block.

    Raises:
        ValueError: the weights differ from those provenance names, or provenance has no abilities to keep for
            a probe not re-measured.
    """
    prov = json.loads((model_dir / "provenance.json").read_text(encoding="utf-8"))
    digest = sha256_file(model_dir / "model.safetensors")
    if digest != prov["package"]["weights_sha256"]:
        raise ValueError(
            f"{model_dir}/model.safetensors has sha256 {digest}, provenance names {prov['package']['weights_sha256']}"
        )
    old = prov["evaluation"].get("abilities")
    kept = [part for part in ABILITY_PARTS if part not in parts]
    if kept and not (old and all(old.get(part) for part in kept)):
        raise ValueError(f"provenance holds no {' / '.join(kept)} figures to keep: re-measure all parts")
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    heldout_text = (model_dir / "heldout.txt").read_text(encoding="utf-8")
    t0 = time.perf_counter()
    new = measure_abilities(model, tokenizer, heldout_text, copy_rows=copy_rows, parts=parts)
    for part in kept:
        new[part] = old[part]
        for key in ("copy_rows",) if part == "copy" else ("passkey_trials",):
            if key in old:
                new[key] = old[key]
            else:
                new.pop(key, None)
    new["remeasured"] = {
        "parts": list(parts),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": round(time.perf_counter() - t0, 1),
        "command": " ".join([Path(sys.argv[0]).name, *argv]),
        "environment": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    if old is not None:
        replaced = {
            k: v for k, v in old.items() if k in ("copy_rows", "passkey_trials", "remeasured", *parts)
        }
        prov["evaluation"].setdefault("abilities_history", []).append(
            {"replaced_utc": new["remeasured"]["utc"], **replaced}
        )
    prov["evaluation"]["abilities"] = new
    tmp = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}-", dir=model_dir.parent))
    try:
        for f in model_dir.iterdir():
            if f.is_file() and f.name not in ("provenance.json", "MODEL_CARD.md"):
                shutil.copy2(f, tmp / f.name)
        finish_package(tmp, prov, model_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return new


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if (
        args.remeasure_abilities is not None
    ):  # a packaged model's card, measured again: no corpus, no training
        torch.set_num_threads(args.threads)
        ab = remeasure_abilities(
            args.remeasure_abilities.resolve(),
            args.ability_copy_rows,
            args.remeasure_parts,
            argv if argv is not None else sys.argv[1:],
        )
        print(
            f"rewrote {args.remeasure_abilities}: abilities re-measured ({ab['remeasured']['wall_s']} s)",
            flush=True,
        )
        return 0
    out = args.out.resolve()
    if (out / "model.safetensors").exists() and not args.force:
        print(f"error: {out} already holds a model; pass --force to replace it", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()

    corpus = fetch_corpus(args)
    docs = read_documents(corpus.sources_dir)
    train_docs = [(r, t) for r, t in docs if not is_heldout(r, args.heldout_fraction)]
    heldout_docs = [(r, t) for r, t in docs if is_heldout(r, args.heldout_fraction)]
    print(f"corpus: {len(docs)} files, {len(train_docs)} train, {len(heldout_docs)} held out", flush=True)
    if not heldout_docs or not train_docs:
        raise ValueError(f"split is degenerate: {len(train_docs)} train / {len(heldout_docs)} held-out files")

    if args.init_from is not None or args.package_only is not None:  # continue a model: its tokenizer
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.package_only or args.init_from)
        print(f"init: tokenizer and weights from {args.init_from}", flush=True)
    else:
        tokenizer = train_tokenizer([t for _, t in train_docs], args.vocab_size)
    vocab_size = len(tokenizer)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    train_stream = encode_stream(tokenizer, [t for _, t in train_docs])  # [train_tokens]
    heldout_stream = encode_stream(tokenizer, [t for _, t in heldout_docs])  # [heldout_tokens]
    print(f"tokens: {train_stream.numel():,} train, {heldout_stream.numel():,} held out", flush=True)
    if heldout_stream.numel() < args.heldout_min_tokens:
        raise ValueError(f"held-out text has {heldout_stream.numel()} tokens, need {args.heldout_min_tokens}")

    if args.package_only is not None:  # a finished run: evaluate and package what it left
        model = transformers.AutoModelForCausalLM.from_pretrained(
            args.package_only, dtype=torch.float32, attn_implementation="sdpa"
        )
        config = model.config
        saved_run = json.loads((args.package_only / "train_run.json").read_text(encoding="utf-8"))
        run, prior, saved_argv = saved_run["run"], saved_run["prior"], saved_run["argv"]
        targs = parse_args(saved_argv)  # the training run's own settings, for its provenance
        n_params = sum(p.numel() for p in model.parameters())
    else:
        if args.init_from is not None:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                args.init_from, dtype=torch.float32, attn_implementation="sdpa"
            )
            config = model.config
            prior = json.loads((args.init_from / "provenance.json").read_text(encoding="utf-8"))
            grown = expand_layers(model, args.grow_layers) if args.grow_layers else None
            if grown:
                print(f"grown: copies of layers {grown} inserted after them (block expansion)", flush=True)
        else:
            config = build_config(args, vocab_size, eos_id)
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
            prior = None
        n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
        print(f"model: {n_params:,} parameters", flush=True)
        model.to(args.device)
        run = train(model, tokenizer, train_stream, heldout_stream, args)
        if args.init_from is not None and args.grow_layers:
            run["grown"] = {
                "method": "block expansion (LLaMA Pro, arXiv:2401.02415 §2): a copy of layer i inserted after it, "
                "o_proj and down_proj zeroed",
                "copied_layers": grown,
                "layers_before": config.num_hidden_layers - len(grown),
                "layers_after": config.num_hidden_layers,
            }
        model.to("cpu")  # what ships is saved, reloaded and evaluated on the CPU
        saved_argv = argv
        targs = args
        final = args.data_dir / "final"  # the trained weights survive a failure while packaging
        model.save_pretrained(final, safe_serialization=True)
        tokenizer.save_pretrained(final)
        write_json(final / "train_run.json", {"run": run, "prior": prior, "argv": sys.argv[1:]})
        print(f"final checkpoint: {final}", flush=True)

    # Write everything into a temporary sibling directory, then move it into place.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.to(torch.bfloat16)
        model.generation_config = transformers.GenerationConfig(
            bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id
        )
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.model_max_length = args.max_positions
        tokenizer.save_pretrained(tmp)
        _drop_load_time_keys(tmp / "tokenizer_config.json")
        check_tokenizer_reloads(tmp, tokenizer, "\n".join(t for _, t in train_docs[:20] + heldout_docs))
        heldout_text = "\n\n".join(t.rstrip("\n") for _, t in heldout_docs) + "\n"
        (tmp / "heldout.txt").write_text(heldout_text, encoding="utf-8")

        # Evaluate what ships: reload the saved bf16 directory the way users load it.
        saved = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16)
        nll = window_nll(saved, heldout_stream, args.eval_seq_len)  # [windows, T-1]
        targets = heldout_targets(heldout_stream, args.eval_seq_len)  # [windows, T-1]
        uni = unigram_nll(train_stream, targets, vocab_size)
        long_nll = window_nll(saved, heldout_stream, args.eval_long_seq_len)  # [windows, T_long-1]
        edges = [0, 512, 2048, args.eval_long_seq_len - 1]
        by_pos = []
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            if hi > lo:  # column j scores window token j + 1
                value = long_nll[:, lo:hi].mean().item()
                by_pos.append(
                    {"positions": f"{lo + 1}-{hi}", "nll": round(value, 4), "ppl": round(math.exp(value), 2)}
                )
        abilities = measure_abilities(saved, tokenizer, heldout_text, copy_rows=args.ability_copy_rows)
        evaluation = {
            "abilities": abilities,
            "seq_len": args.eval_seq_len,
            "windows": nll.shape[0],
            "target_tokens": nll.numel(),
            "heldout_nll": round(nll.mean().item(), 5),
            "heldout_ppl": round(math.exp(nll.mean().item()), 3),
            "unigram_nll": round(uni.mean().item(), 5),
            "unigram_ppl": round(math.exp(uni.mean().item()), 3),
            "unigram_method": "add-one smoothing over the vocabulary, counts from the training token stream",
            "model_dtype": "bfloat16",
            "long_context": {
                "seq_len": args.eval_long_seq_len,
                "windows": long_nll.shape[0],
                "nll_by_position": by_pos,
            },
        }
        print(
            f"eval: held-out ppl {evaluation['heldout_ppl']}, unigram ppl {evaluation['unigram_ppl']}",
            flush=True,
        )

        provenance = {
            "schema": "kvlab.reference_model.provenance/1",
            "corpus": {
                "package": corpus.package,
                "version": corpus.version,
                "deb_file": corpus.deb_path.name,
                "deb_sha256": corpus.deb_sha256,
                "obtained_with": f"apt-get download {args.package} (Debian archive); dpkg-deb -x",
                "documents": f"usr/share/doc/*/{SOURCES_SUBDIR}/**/*.rst.txt",
                "license": license_summary(corpus.copyright_path),
                "license_file": "/" + corpus.copyright_path.relative_to(corpus.root).as_posix(),
                "files_total": len(docs),
                "bytes_total": sum(len(t.encode("utf-8")) for _, t in docs),
                "heldout_fraction": args.heldout_fraction,
                "split_rule": "held out iff int(sha256(relative_path)[:8 bytes]) / 2**64 < heldout_fraction",
                "files_train": len(train_docs),
                "files_heldout": len(heldout_docs),
                "heldout_files": [r for r, _ in heldout_docs],
                "train_tokens": train_stream.numel(),
                "heldout_tokens": heldout_stream.numel(),
                "document_separator": EOS_TOKEN,
            },
            "tokenizer": {
                "type": "byte-level BPE (tokenizers), trained on the training files only",
                "vocab_size": vocab_size,
                "vocab_size_requested": args.vocab_size,
                "eos_token": EOS_TOKEN,
                "eos_token_id": eos_id,
            },
            "model": {
                "architecture": type(model).__name__,
                "model_type": config.model_type,
                "parameters": n_params,
                "hidden_size": config.hidden_size,
                "intermediate_size": config.intermediate_size,
                "num_hidden_layers": config.num_hidden_layers,
                "num_attention_heads": config.num_attention_heads,
                "num_key_value_heads": config.num_key_value_heads,
                "head_dim": args.head_dim,
                "max_position_embeddings": config.max_position_embeddings,
                "rope_theta": args.rope_theta,
                "tie_word_embeddings": True,
                "weights_dtype": "bfloat16",
            },
            "training": {
                "seed": targs.seed,
                "threads": targs.threads,
                "device": getattr(targs, "device", "cpu"),
                "autocast_bf16": targs.autocast_bf16,
                "optimizer": "AdamW(betas=(0.9, 0.95), eps=1e-8), no decay on norms and biases",
                "lr": targs.lr,
                "min_lr_ratio": targs.min_lr_ratio,
                "warmup_steps": targs.warmup_steps,
                "weight_decay": targs.weight_decay,
                "grad_clip": targs.grad_clip,
                "max_minutes": targs.max_minutes,
                "sampling": "uniform random windows of the training token stream (torch.Generator seeded)",
                **run,
                "command": " ".join(
                    [Path(sys.argv[0]).name, *(saved_argv if saved_argv is not None else sys.argv[1:])]
                ),
            },
            "previous_stages": previous_stages(prior),
            "data_mixture": data_mixture(corpus, license_summary(corpus.copyright_path), run),
            "evaluation": evaluation,
            "environment": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__,
                "platform": platform.platform(),
                "processor": platform.processor() or platform.machine(),
            },
            "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            "total_wall_s": None,  # filled below
            "package": {
                "directory_bytes": 0,  # filled below
                # ties the abilities above to these weights (tests compare it with the shipped file)
                "weights_sha256": sha256_file(tmp / "model.safetensors"),
            },
        }
        provenance["total_wall_s"] = round(time.perf_counter() - t_start, 1)
        finish_package(tmp, provenance, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"wrote {out} ({directory_bytes(out) / 1e6:.1f} MB)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
