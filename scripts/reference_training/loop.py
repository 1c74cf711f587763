"""The model and its training loop: the Qwen2 config, block expansion, the learning-rate schedule, the weighted
loss, the loop itself, and the held-out NLL the package is evaluated with."""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import transformers

from .abilities import monitor_abilities
from .data import phase_at, sample_windows
from .mixture import IGNORE, TaskMixer


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
    Pro, arXiv:2401.02415 section 2): after each chosen layer ``i`` (evenly spaced, the last layer always among them) a
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


def make_mixer(
    tokenizer, train_stream: torch.Tensor, gen: torch.Generator, args: argparse.Namespace
) -> TaskMixer:
    """The run's :class:`TaskMixer`, from its ``--task-*``, ``--copies-per-tokens``, ... flags."""
    return TaskMixer(
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


def make_optimizer(model, args: argparse.Namespace) -> torch.optim.AdamW:
    """AdamW (betas 0.9/0.95), weight decay on matrices only (norms and biases excluded)."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]  # norms and biases
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def _step(model, opt, ids, labels, weights, lr: float, args: argparse.Namespace) -> tuple[float, float]:
    """One optimizer step on a batch ``[B, T]`` (ids, labels, loss weights); returns (loss, gradient norm)."""
    device = torch.device(args.device)
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
    return loss.item(), float(grad_norm)


def _monitor(model, tokenizer, heldout_stream, heldout_ids, seq_len: int, step: int, args) -> dict:
    """Held-out loss and abilities for the log only: no checkpoint selection, no early stopping."""
    device = torch.device(args.device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast_bf16):
        mon = window_nll(model, heldout_stream, 512, max_windows=8).mean().item()
        abilities = monitor_abilities(model, tokenizer, heldout_ids, max(512, seq_len), step)
    print(f"  monitor: held-out loss {mon:.3f} (ppl {math.exp(mon):.1f}) {abilities}", flush=True)
    return {"step": step, "heldout_loss": round(mon, 4), **abilities}


def _checkpoint(model, tokenizer, step: int, tokens_seen: int, args: argparse.Namespace) -> None:
    ckpt = args.data_dir / "checkpoint"
    model.save_pretrained(ckpt, safe_serialization=True)
    tokenizer.save_pretrained(ckpt)
    (ckpt / "step.json").write_text(json.dumps({"step": step, "tokens_seen": tokens_seen}) + "\n")
    print(f"  checkpoint: {ckpt} at step {step}", flush=True)


def _run_record(args: argparse.Namespace, mixer: TaskMixer, phase_steps: list[int], state: dict) -> dict:
    """What provenance records of the loop: its settings, the steps per phase and the curves in ``state``."""
    return {
        "steps_planned": args.steps,
        "steps_done": state["step"],
        "time_bound": state["time_bound"],
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
        "max_position_trained": state["max_position_trained"],
        "tokens_seen": state["tokens_seen"],
        "train_wall_s": round(time.perf_counter() - state["t0"], 1),
        "final_train_loss_ema": round(state["smoothed"], 4) if state["smoothed"] is not None else None,
        "loss_curve": state["loss_curve"],
        "heldout_monitor_curve": state["monitor_curve"],
    }


def train(model, tokenizer, train_stream, heldout_stream, args) -> dict:
    """The training loop on ``args.device`` (the model is already there); returns what provenance records.

    Progress drives the schedule: ``max(step / --steps, elapsed / --max-minutes)``. When the step budget binds (the
    machine is fast enough), the run is a pure function of the seed; when the wall clock binds, the schedule still
    warms up, walks through the curriculum's phases and anneals, at steps that depend on the machine's speed, and
    provenance records it (``time_bound``).
    """
    gen = torch.Generator().manual_seed(args.seed)
    mixer = make_mixer(tokenizer, train_stream, gen, args)
    opt = make_optimizer(model, args)
    heldout_ids = heldout_stream.tolist() if args.monitor_every else []
    budget_s = args.max_minutes * 60.0
    t0 = time.perf_counter()
    state = {"t0": t0, "step": 0, "time_bound": False, "tokens_seen": 0, "max_position_trained": 0}
    state.update(smoothed=None, loss_curve=[], monitor_curve=[])
    phase_steps = [0] * len(args.phases)
    last_ckpt = t0
    while True:
        step, elapsed = state["step"], time.perf_counter() - t0
        progress = max(step / args.steps, elapsed / budget_s)
        if progress >= 1.0:
            break
        state["time_bound"] = state["time_bound"] or (step > 0 and elapsed / budget_s > step / args.steps)
        k = phase_at(args.phases, progress)
        batch, seq_len = args.phases[k].batch_size, args.phases[k].seq_len
        lr = lr_at(step, progress, args)
        ids, labels, weights = mixer.batch(sample_windows(train_stream, batch, seq_len, gen))  # [B, T] each
        value, grad_norm = _step(model, opt, ids, labels, weights, lr, args)
        state["tokens_seen"] += ids.numel()
        state["max_position_trained"] = max(state["max_position_trained"], seq_len - 1)
        state["smoothed"] = value if state["smoothed"] is None else 0.9 * state["smoothed"] + 0.1 * value
        phase_steps[k] += 1
        if step % args.log_every == 0:
            elapsed, seen = time.perf_counter() - t0, state["tokens_seen"]
            state["loss_curve"].append({"step": step, "loss": round(value, 4), "seq_len": seq_len, "lr": lr})
            print(
                f"step {step:5d}/{args.steps} loss {value:.3f} (ema {state['smoothed']:.3f}) lr {lr:.2e} "
                f"gnorm {grad_norm:.2f} T={seq_len} tokens {seen:,} {elapsed / 60:.1f} min {seen / elapsed:.0f} tok/s",
                flush=True,
            )
        if args.monitor_every and step > 0 and step % args.monitor_every == 0:
            state["monitor_curve"].append(
                _monitor(model, tokenizer, heldout_stream, heldout_ids, seq_len, step, args)
            )
        if args.checkpoint_every_min and time.perf_counter() - last_ckpt > 60 * args.checkpoint_every_min:
            _checkpoint(model, tokenizer, step, state["tokens_seen"], args)
            last_ckpt = time.perf_counter()
        state["step"] = step + 1
    return _run_record(args, mixer, phase_steps, state)
