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
   bf16 autocast on the CPU, ``torch.set_num_threads(--threads)``; random windows of ``--seq-len`` tokens, then a
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
    g.add_argument("--seq-len", type=int, default=512)
    g.add_argument("--batch-size", type=int, default=8, help="windows per step in the main phase")
    g.add_argument("--long-seq-len", type=int, default=4352, help="window length of the final phase")
    g.add_argument("--long-batch-size", type=int, default=1)
    g.add_argument("--long-fraction", type=float, default=0.15, help="fraction of steps in the final phase")
    g.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr as a fraction of the peak")
    g.add_argument("--warmup-steps", type=int, default=40)
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--grad-clip", type=float, default=1.0)
    g.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    g.add_argument("--autocast-bf16", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--log-every", type=int, default=10)
    g.add_argument("--monitor-every", type=int, default=100, help="held-out loss for the log only (0: never)")
    g = p.add_argument_group("evaluation and output")
    g.add_argument("--eval-seq-len", type=int, default=512, help="window of the reported held-out perplexity")
    g.add_argument("--eval-long-seq-len", type=int, default=4352, help="window of the per-position report")
    g.add_argument(
        "--heldout-min-tokens", type=int, default=40_000, help="fail if the held-out text is shorter"
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
    if not 0.0 <= args.long_fraction < 1.0:
        p.error(f"--long-fraction must be in [0, 1), got {args.long_fraction!r}")
    if args.long_seq_len > args.max_positions or args.eval_long_seq_len > args.max_positions:
        p.error(f"window lengths must not exceed --max-positions {args.max_positions}")
    return args


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
            ids = stream[w * seq_len : (w + 1) * seq_len].unsqueeze(0)  # [1, T]
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


def train(model, train_stream, heldout_stream, args) -> dict:
    """The training loop; returns what provenance records about it."""
    gen = torch.Generator().manual_seed(args.seed)
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
    # schedule still warms up, enters the long phase and anneals, at steps that depend on the machine's speed,
    # and provenance records it ("time_bound").
    budget_s = args.max_minutes * 60.0
    t0 = time.perf_counter()
    tokens_seen = 0
    max_position_trained = 0
    loss_curve: list[dict] = []
    monitor_curve: list[dict] = []
    smoothed = None
    time_bound = False
    steps_main = steps_long = 0
    step = 0
    while True:
        elapsed = time.perf_counter() - t0
        progress = max(step / args.steps, elapsed / budget_s)
        if progress >= 1.0:
            break
        time_bound = time_bound or (step > 0 and elapsed / budget_s > step / args.steps)
        long_phase = progress >= 1.0 - args.long_fraction
        batch, seq_len = (
            (args.long_batch_size, args.long_seq_len) if long_phase else (args.batch_size, args.seq_len)
        )
        lr = lr_at(step, progress, args)
        ids = sample_windows(train_stream, batch, seq_len, gen)  # [B, T]
        for group in opt.param_groups:
            group["lr"] = lr
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast_bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens_seen += ids.numel()
        max_position_trained = max(max_position_trained, seq_len - 1)
        value = loss.item()
        smoothed = value if smoothed is None else 0.9 * smoothed + 0.1 * value
        steps_long += long_phase
        steps_main += not long_phase
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
            # Held-out loss for the log only: no checkpoint selection, no early stopping, no tuning on it.
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast_bf16):
                mon = window_nll(model, heldout_stream, args.seq_len, max_windows=8).mean().item()
            monitor_curve.append({"step": step, "heldout_loss": round(mon, 4)})
            print(f"  monitor: held-out loss {mon:.3f} (ppl {math.exp(mon):.1f})", flush=True)
        step += 1
    return {
        "steps_planned": args.steps,
        "steps_done": step,
        "time_bound": time_bound,
        "schedule": "progress = max(step / steps_planned, elapsed / max_minutes); linear warm-up, cosine decay",
        "main_phase": {"steps": steps_main, "batch_size": args.batch_size, "seq_len": args.seq_len},
        "long_phase": {
            "steps": steps_long,
            "batch_size": args.long_batch_size,
            "seq_len": args.long_seq_len,
            "starts_at_progress": 1.0 - args.long_fraction,
        },
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


def write_model_card(prov: dict) -> str:
    """MODEL_CARD.md text; every number is read from ``prov`` (the provenance written next to it)."""
    c, m, t, e, tok = prov["corpus"], prov["model"], prov["training"], prov["evaluation"], prov["tokenizer"]
    long = e["long_context"]
    time_note = (
        "the wall-clock budget bound the schedule, so a rerun on another machine takes other steps"
        if t["time_bound"]
        else "the step budget bound the schedule (a rerun with the same seed repeats it)"
    )
    pos_rows = "\n".join(
        f"| {b['positions']} | {b['nll']:.3f} | {b['ppl']:.1f} |" for b in long["nll_by_position"]
    )
    return f"""# kvlab reference model

A small Qwen2-architecture decoder trained from scratch by `scripts/train_reference.py`, shipped inside kvlab
so that KV-cache experiments (`kvlab eval`, the tests) run on a real, trained model without any download. It is
loaded like any Hugging Face model: `AutoModelForCausalLM.from_pretrained(kvlab.models.reference_model_path())`.

**Intended use:** a test and reference model for KV-cache measurements (cache bytes, quantization error, NLL and
top-k changes, latency). **Not** a useful language model: it is tiny, trained for {t["train_wall_s"] / 60:.0f}
minutes on {t["threads"]} CPU thread(s), on {t["tokens_seen"]:,} tokens of one documentation set. Do not use it to generate text
for anyone.

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

## Training
- seed {t["seed"]}; AdamW, peak lr {t["lr"]:g}, weight decay {t["weight_decay"]}; linear warm-up, cosine decay
- {t["steps_done"]} steps: {t["main_phase"]["steps"]} of {t["main_phase"]["batch_size"]} x {t["main_phase"]["seq_len"]} tokens, then {t["long_phase"]["steps"]} of {t["long_phase"]["batch_size"]} x {t["long_phase"]["seq_len"]} tokens
- {t["tokens_seen"]:,} tokens seen ({t["tokens_seen"] / c["train_tokens"]:.2f} epochs of the training tokens)
- bf16 autocast on the CPU, {t["threads"]} thread(s), {t["train_wall_s"] / 60:.1f} minutes; {time_note}
- torch {prov["environment"]["torch"]}, transformers {prov["environment"]["transformers"]}
- command: `python scripts/{prov["command"]}`

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

All numbers above are copied by the training script from `provenance.json`.
"""


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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

    tokenizer = train_tokenizer([t for _, t in train_docs], args.vocab_size)
    vocab_size = len(tokenizer)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    train_stream = encode_stream(tokenizer, [t for _, t in train_docs])  # [train_tokens]
    heldout_stream = encode_stream(tokenizer, [t for _, t in heldout_docs])  # [heldout_tokens]
    print(f"tokens: {train_stream.numel():,} train, {heldout_stream.numel():,} held out", flush=True)
    if heldout_stream.numel() < args.heldout_min_tokens:
        raise ValueError(f"held-out text has {heldout_stream.numel()} tokens, need {args.heldout_min_tokens}")

    config = build_config(args, vocab_size, eos_id)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    print(f"model: {n_params:,} parameters", flush=True)
    run = train(model, train_stream, heldout_stream, args)

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
        evaluation = {
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
                "seed": args.seed,
                "threads": args.threads,
                "autocast_bf16": args.autocast_bf16,
                "optimizer": "AdamW(betas=(0.9, 0.95), eps=1e-8), no decay on norms and biases",
                "lr": args.lr,
                "min_lr_ratio": args.min_lr_ratio,
                "warmup_steps": args.warmup_steps,
                "weight_decay": args.weight_decay,
                "grad_clip": args.grad_clip,
                "max_minutes": args.max_minutes,
                "sampling": "uniform random windows of the training token stream (torch.Generator seeded)",
                **run,
            },
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
            "package": {"directory_bytes": 0},  # filled below
        }
        # The card and provenance state the directory's size, which includes them: iterate to a fixed point.
        provenance["total_wall_s"] = round(time.perf_counter() - t_start, 1)
        for _ in range(10):
            write_json(tmp / "provenance.json", provenance)
            card = write_model_card(json.loads((tmp / "provenance.json").read_text(encoding="utf-8")))
            (tmp / "MODEL_CARD.md").write_text(card, encoding="utf-8")
            size = directory_bytes(tmp)
            if size == provenance["package"]["directory_bytes"]:
                break
            provenance["package"]["directory_bytes"] = size
        else:
            raise RuntimeError(
                "directory size did not settle"
            )  # the size's digit count oscillates: never seen
        assert json.loads((tmp / "provenance.json").read_text())["package"][
            "directory_bytes"
        ] == directory_bytes(tmp)

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
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"wrote {out} ({directory_bytes(out) / 1e6:.1f} MB)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
