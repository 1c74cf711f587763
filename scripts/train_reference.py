#!/usr/bin/env python
"""Train kvlab's bundled reference model: a small Qwen2 decoder on Debian's Python documentation.

kvlab cannot download weights (no model hub here or in CI), so it ships its own small, trained decoder for
KV-cache experiments. This script is the whole recipe, end to end (its parts are in ``reference_training/``:
``data`` the corpus, split and tokenizer; ``mixture`` the long-range tasks; ``loop`` the model and the training
loop; ``abilities`` kvlab eval's probes; ``card`` the model card and the package):

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

    python scripts/train_reference.py --steps 20 --curriculum 512x2:1.0 --out data/smoke-reference --force
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # tokenizers' thread pool; the machine is shared
os.environ.setdefault("RAYON_RS_NUM_CPUS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reference_training/ next to this file

from reference_training import abilities  # noqa: E402
from reference_training.abilities import ABILITY_PARTS  # noqa: E402
from reference_training.card import directory_bytes, finish_package, previous_stages, write_json  # noqa: E402
from reference_training.data import (  # noqa: E402
    EOS_TOKEN,
    SOURCES_SUBDIR,
    _drop_load_time_keys,
    check_tokenizer_reloads,
    encode_stream,
    fetch_corpus,
    is_heldout,
    license_summary,
    parse_curriculum,
    read_documents,
    sha256_file,
    train_tokenizer,
)
from reference_training.loop import (  # noqa: E402
    build_config,
    expand_layers,
    heldout_targets,
    train,
    unigram_nll,
    window_nll,
)
from reference_training.mixture import MID_COPY_RANGE, NEAR_COPY_TOKENS, TaskMixer, data_mixture  # noqa: E402

# what the tests and other scripts use of this script, besides main and parse_args
__all__ = [
    "MID_COPY_RANGE",
    "NEAR_COPY_TOKENS",
    "TaskMixer",
    "abilities",
    "expand_layers",
    "main",
    "parse_args",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "src" / "kvlab" / "models" / "reference"


def _corpus_and_model_args(p: argparse.ArgumentParser) -> None:
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


def _training_args(p: argparse.ArgumentParser) -> None:
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


def _task_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("long-range tasks")
    g.add_argument(
        "--task-fraction",
        type=float,
        default=0.0,
        help="fraction of windows that carry long-range tasks (copy spans, passkeys); 0: plain text only",
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


def _output_args(p: argparse.ArgumentParser) -> None:
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


def _check_mixture(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, through ``p.error`` (exit 2, the flag named), shares and spans the task mixer cannot use."""
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    _corpus_and_model_args(p)
    _training_args(p)
    _task_args(p)
    _output_args(p)
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
    _check_mixture(p, args)
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


def _remeasure(args: argparse.Namespace, argv: list[str] | None) -> int:
    """A packaged model's card, measured again: no corpus, no training."""
    torch.set_num_threads(args.threads)
    ab = abilities.remeasure_abilities(
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


def _data(args: argparse.Namespace) -> dict:
    """The corpus split by file, the tokenizer (trained, or the continued model's) and both token streams."""
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
    train_stream = encode_stream(tokenizer, [t for _, t in train_docs])  # [train_tokens]
    heldout_stream = encode_stream(tokenizer, [t for _, t in heldout_docs])  # [heldout_tokens]
    print(f"tokens: {train_stream.numel():,} train, {heldout_stream.numel():,} held out", flush=True)
    if heldout_stream.numel() < args.heldout_min_tokens:
        raise ValueError(f"held-out text has {heldout_stream.numel()} tokens, need {args.heldout_min_tokens}")
    return {
        "corpus": corpus,
        "docs": docs,
        "train_docs": train_docs,
        "heldout_docs": heldout_docs,
        "tokenizer": tokenizer,
        "eos_id": tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        "train_stream": train_stream,
        "heldout_stream": heldout_stream,
    }


def _packaged_run(args: argparse.Namespace) -> dict:
    """``--package-only``: the model and run a finished training left (its ``train_run.json``)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.package_only, dtype=torch.float32, attn_implementation="sdpa"
    )
    saved_run = json.loads((args.package_only / "train_run.json").read_text(encoding="utf-8"))
    return {
        "model": model,
        "run": saved_run["run"],
        "prior": saved_run["prior"],
        "saved_argv": saved_run["argv"],
        "targs": parse_args(saved_run["argv"]),  # the training run's own settings, for its provenance
    }


def _trained_run(args: argparse.Namespace, argv: list[str] | None, data: dict) -> dict:
    """Build (or continue, or grow) the model, train it, and keep its float weights in ``--data-dir/final``."""
    tokenizer, grown = data["tokenizer"], None
    if args.init_from is not None:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            args.init_from, dtype=torch.float32, attn_implementation="sdpa"
        )
        prior = json.loads((args.init_from / "provenance.json").read_text(encoding="utf-8"))
        grown = expand_layers(model, args.grow_layers) if args.grow_layers else None
        if grown:
            print(f"grown: copies of layers {grown} inserted after them (block expansion)", flush=True)
    else:
        config = build_config(args, len(tokenizer), data["eos_id"])
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        prior = None
    print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters", flush=True)
    model.to(args.device)
    run = train(model, tokenizer, data["train_stream"], data["heldout_stream"], args)
    if grown:
        layers = model.config.num_hidden_layers
        run["grown"] = {
            "method": "block expansion (LLaMA Pro, arXiv:2401.02415 section 2): a copy of layer i inserted after "
            "it, o_proj and down_proj zeroed",
            "copied_layers": grown,
            "layers_before": layers - len(grown),
            "layers_after": layers,
        }
    model.to("cpu")  # what ships is saved, reloaded and evaluated on the CPU
    final = args.data_dir / "final"  # the trained weights survive a failure while packaging
    model.save_pretrained(final, safe_serialization=True)
    tokenizer.save_pretrained(final)
    write_json(final / "train_run.json", {"run": run, "prior": prior, "argv": sys.argv[1:]})
    print(f"final checkpoint: {final}", flush=True)
    return {"model": model, "run": run, "prior": prior, "saved_argv": argv, "targs": args}


def _evaluate(saved, data: dict, heldout_text: str, args: argparse.Namespace) -> dict:
    """Held-out perplexity against the unigram baseline, NLL by position and the abilities of ``saved`` (the
    package's bf16 model, reloaded as users load it): the ``evaluation`` block of provenance."""
    heldout_stream = data["heldout_stream"]
    nll = window_nll(saved, heldout_stream, args.eval_seq_len)  # [windows, T-1]
    targets = heldout_targets(heldout_stream, args.eval_seq_len)  # [windows, T-1]
    uni = unigram_nll(data["train_stream"], targets, len(data["tokenizer"]))
    long_nll = window_nll(saved, heldout_stream, args.eval_long_seq_len)  # [windows, T_long-1]
    edges = [0, 512, 2048, args.eval_long_seq_len - 1]
    by_pos = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        if hi > lo:  # column j scores window token j + 1
            value = long_nll[:, lo:hi].mean().item()
            by_pos.append(
                {"positions": f"{lo + 1}-{hi}", "nll": round(value, 4), "ppl": round(math.exp(value), 2)}
            )
    ab = abilities.measure_abilities(saved, data["tokenizer"], heldout_text, copy_rows=args.ability_copy_rows)
    evaluation = {
        "abilities": ab,
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
        f"eval: held-out ppl {evaluation['heldout_ppl']}, unigram ppl {evaluation['unigram_ppl']}", flush=True
    )
    return evaluation


def _corpus_record(data: dict, args: argparse.Namespace) -> dict:
    corpus, docs, train_docs, heldout_docs = (
        data["corpus"],
        data["docs"],
        data["train_docs"],
        data["heldout_docs"],
    )
    return {
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
        "train_tokens": data["train_stream"].numel(),
        "heldout_tokens": data["heldout_stream"].numel(),
        "document_separator": EOS_TOKEN,
    }


def _model_record(model, args: argparse.Namespace) -> dict:
    config = model.config
    return {
        "architecture": type(model).__name__,
        "model_type": config.model_type,
        "parameters": sum(p.numel() for p in model.parameters()),  # tied weights counted once
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
    }


def _training_record(job: dict) -> dict:
    targs, saved_argv = job["targs"], job["saved_argv"]
    return {
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
        **job["run"],
        "command": " ".join(
            [Path(sys.argv[0]).name, *(saved_argv if saved_argv is not None else sys.argv[1:])]
        ),
    }


def _provenance(job: dict, data: dict, evaluation: dict, tmp: Path, args, argv) -> dict:
    """``provenance.json``: where every number of the model card comes from (``directory_bytes`` filled later)."""
    tokenizer, corpus = data["tokenizer"], data["corpus"]
    return {
        "schema": "kvlab.reference_model.provenance/1",
        "corpus": _corpus_record(data, args),
        "tokenizer": {
            "type": "byte-level BPE (tokenizers), trained on the training files only",
            "vocab_size": len(tokenizer),
            "vocab_size_requested": args.vocab_size,
            "eos_token": EOS_TOKEN,
            "eos_token_id": data["eos_id"],
        },
        "model": _model_record(job["model"], args),
        "training": _training_record(job),
        "previous_stages": previous_stages(job["prior"]),
        "data_mixture": data_mixture(corpus, license_summary(corpus.copyright_path), job["run"]),
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
        "total_wall_s": None,  # filled by the caller
        "package": {
            "directory_bytes": 0,  # filled by finish_package
            # ties the abilities above to these weights (tests compare it with the shipped file)
            "weights_sha256": sha256_file(tmp / "model.safetensors"),
        },
    }


def _save_model(job: dict, data: dict, tmp: Path, args: argparse.Namespace) -> str:
    """Write the bf16 weights, the tokenizer (checked to reload identically) and ``heldout.txt`` into ``tmp``;
    returns the held-out text."""
    model, tokenizer, eos_id = job["model"], data["tokenizer"], data["eos_id"]
    model.to(torch.bfloat16)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id
    )
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.model_max_length = args.max_positions
    tokenizer.save_pretrained(tmp)
    _drop_load_time_keys(tmp / "tokenizer_config.json")
    sample = data["train_docs"][:20] + data["heldout_docs"]
    check_tokenizer_reloads(tmp, tokenizer, "\n".join(t for _, t in sample))
    heldout_text = "\n\n".join(t.rstrip("\n") for _, t in data["heldout_docs"]) + "\n"
    (tmp / "heldout.txt").write_text(heldout_text, encoding="utf-8")
    return heldout_text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.remeasure_abilities is not None:
        return _remeasure(args, argv)
    out = args.out.resolve()
    if (out / "model.safetensors").exists() and not args.force:
        print(f"error: {out} already holds a model; pass --force to replace it", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    data = _data(args)
    job = _packaged_run(args) if args.package_only is not None else _trained_run(args, argv, data)
    # Write everything into a temporary sibling directory, then move it into place.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        heldout_text = _save_model(job, data, tmp, args)
        # Evaluate what ships: reload the saved bf16 directory the way users load it.
        saved = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16)
        evaluation = _evaluate(saved, data, heldout_text, args)
        provenance = _provenance(job, data, evaluation, tmp, args, argv)
        provenance["total_wall_s"] = round(time.perf_counter() - t_start, 1)
        finish_package(tmp, provenance, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"wrote {out} ({directory_bytes(out) / 1e6:.1f} MB)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
